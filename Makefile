# make bench: run the benchmark suite on this machine (CUDA if present, else the CPU profile)
# make test:  run the library and plugin tests
# make gpu-smoke: one case per CUDA path and self-checks of the measurement on this GPU (skips without CUDA)
# make doctor: check this machine before a run (CUDA, driver, /dev/shm, device memory, timing distortions)
# make baseline: run the suite and save it as this machine's baseline (results/benchmarks/<machine>/NNNN_baseline.json) to commit
# make gate: run the suite gated against the newest committed baseline of this device (fails closed without one)
# make report: run the seeds' two ladders (torch.compile included) and render results/report/<device>/
# All create .venv and install the project on first use.

PYTHON ?= python3
VENV ?= .venv
# The PyTorch build to install; override e.g. TORCH_PKGS="torch==2.9.1 torchvision==0.24.1".
TORCH_PKGS ?= torch==2.14.1 torchvision==0.29.1
BENCH_ARGS ?=
# make gate's thresholds over the command line (benchmarks/budgets.toml's compare_fail entries override them per device)
GATE_FAIL ?= deterministic:0%
GATE_OUT ?= results/ci
TEST_ARGS ?=
BIN := $(VENV)/bin

.PHONY: install bench baseline gate test report gpu-smoke doctor clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet $(TORCH_PKGS)
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

bench: install
	$(BIN)/python -m pytest benchmarks -rs $(BENCH_ARGS)

baseline: install
	$(BIN)/python -m pytest benchmarks -rs --benchmark-save=baseline $(BENCH_ARGS)

gate: install
	mkdir -p $(GATE_OUT)
	$(BIN)/python -m pytest benchmarks -rs --benchmark-compare='*_baseline' --trainbench-compare-fail=$(GATE_FAIL) \
		--trainbench-compare-json=$(GATE_OUT)/verdict.json --benchmark-json=$(GATE_OUT)/run.json $(BENCH_ARGS)

test: install
	$(BIN)/python -m pytest tests -rs $(TEST_ARGS)

gpu-smoke: install
	$(BIN)/python -m trainbench doctor
	$(BIN)/python -m pytest smoke -rs $(BENCH_ARGS)

doctor: install
	$(BIN)/python -m trainbench doctor

report: install
	$(BIN)/python -m pytest benchmarks -k test_ladder --trainbench-slow -rs --benchmark-save=ladders $(BENCH_ARGS)
	$(BIN)/python -m trainbench report

clean:
	rm -rf $(VENV) .pytest_cache
