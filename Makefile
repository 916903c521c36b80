# make bench: run the benchmark suite on this machine (CUDA if present, else the CPU profile)
# make test:  run the library and plugin tests
# make gpu-smoke: one case per CUDA path and self-checks of the measurement on this GPU (skips without CUDA)
# make doctor: check this machine before a run (CUDA, driver, /dev/shm, device memory, timing distortions)
# make baseline: run the suite and save it as this machine's baseline (results/benchmarks/<machine>/NNNN_baseline.json) to commit
# make gate: run the suite gated against the newest committed baseline of this device (fails closed without one)
# make ab-base: A/B of this checkout against a base commit (BASE=<git ref>; default the merge base with origin/main),
#               the base in a git worktree with its own venv under .trainbench-base/, timing judged pair by pair
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
# make ab-base: the base commit (empty: the merge base with UPSTREAM, else HEAD~1), the timed thresholds, extra
# pytest arguments, where the verdict goes (ab-verdict.json), and the base's torch (default: the head's, TORCH_PKGS)
BASE ?=
UPSTREAM ?= origin/main
AB_FAIL ?= step_time_ms:5%,cpu_time_ms:5%
AB_ARGS ?=
AB_OUT ?= $(GATE_OUT)
AB_BASE_TORCH_PKGS ?= $(TORCH_PKGS)
export BASE UPSTREAM AB_FAIL AB_ARGS AB_OUT AB_BASE_TORCH_PKGS TORCH_PKGS PYTHON
BIN := $(VENV)/bin

.PHONY: install bench baseline gate ab-base ab-base-key test report gpu-smoke doctor clean

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

ab-base: install
	HEAD_PYTHON=$(BIN)/python .ci/ab-base run

# The base venv's key (CI caches .trainbench-base/venv under it)
ab-base-key: install
	@HEAD_PYTHON=$(BIN)/python .ci/ab-base key

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
	rm -rf $(VENV) .pytest_cache .trainbench-base
	git worktree prune
