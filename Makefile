# make bench: run the benchmark suite on this machine (CUDA if present, else the CPU profile)
# make test:  run the library and plugin tests
# make gpu-smoke: one case per CUDA path and self-checks of the measurement on this GPU (skips without CUDA)
# make doctor: check this machine before a run (CUDA, driver, /dev/shm, device memory, timing distortions)
# make baseline: run the suite and save it as this machine's baseline (results/benchmarks/<machine>/NNNN_baseline.json) to commit
# make gate: run the suite gated against the newest committed baseline of this device (fails closed without one)
# make ab-base: A/B of this checkout against a base commit (BASE=<git ref>; default the merge base with origin/main),
#               the base in a git worktree with its own venv under .trainbench-base/, timing judged pair by pair
# make report: run the seeds' two ladders (torch.compile included) and render results/report/<device>/
# make gpu-night: the GPU night within NIGHT_BUDGET_S seconds into NIGHT_OUT, packed into NIGHT_ARCHIVE (a .tar.gz)
#                 in every ending where it is set (python -m trainbench night; docs/ci-and-gpu.md)
# All create .venv and install the project on first use; with PY=<interpreter> they use that interpreter as it is
# and install nothing (a GPU box's own torch: pip install --no-deps --no-build-isolation -e . first).

PYTHON ?= python3
VENV ?= .venv
# The PyTorch build to install; override e.g. TORCH_PKGS="torch==2.9.1 torchvision==0.24.1".
TORCH_PKGS ?= torch==2.14.1 torchvision==0.29.1
BENCH_ARGS ?=
# make gate's thresholds over the command line (benchmarks/budgets.toml's compare_fail entries override them per device)
GATE_FAIL ?= deterministic:0%
GATE_OUT ?= results/ci
# make test: two xdist workers, one per core (each with one intra-op thread: tests/conftest.py); worksteal hands
# each worker half the tests in order (a module's shared session or measurement mostly runs once) and lets the
# first one done take over the rest of the other's (tests/test_examples.py took ~40% of a loaded run's time)
TEST_ARGS ?= -n 2 --dist worksteal
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
# PY set: run with it, install nothing; else the project's .venv, installed on first use.
PY ?=
ifeq ($(strip $(PY)),)
RUN := $(BIN)/python
SETUP := install
else
RUN := $(PY)
SETUP :=
endif
NIGHT_BUDGET_S ?= 480
# a new folder each night (an earlier night's is refused); results/nightly is not tracked by git
NIGHT_OUT ?= results/nightly/gpu-night-$(shell date +%Y%m%d-%H%M%S)
NIGHT_ARCHIVE ?=
NIGHT_ARGS ?=

.PHONY: install bench baseline gate ab-base ab-base-key test report gpu-smoke gpu-night doctor clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet $(TORCH_PKGS)
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

bench: $(SETUP)
	$(RUN) -m pytest benchmarks -rs $(BENCH_ARGS)

baseline: $(SETUP)
	$(RUN) -m pytest benchmarks -rs --benchmark-save=baseline $(BENCH_ARGS)

gate: $(SETUP)
	mkdir -p $(GATE_OUT)
	$(RUN) -m pytest benchmarks -rs --benchmark-compare='*_baseline' --trainbench-compare-fail=$(GATE_FAIL) \
		--trainbench-compare-json=$(GATE_OUT)/verdict.json --benchmark-json=$(GATE_OUT)/run.json $(BENCH_ARGS)

ab-base: $(SETUP)
	HEAD_PYTHON=$(RUN) .ci/ab-base run

# The base venv's key (CI caches .trainbench-base/venv under it)
ab-base-key: $(SETUP)
	@HEAD_PYTHON=$(RUN) .ci/ab-base key

# PYTHONDONTWRITEBYTECODE is cleared for make test: pytest keeps its rewritten test modules (and the plugin's,
# which it rewrites too) as bytecode, and each of the suite's own pytest, torchrun and A/B processes reads them
# instead of compiling them again (~35 s of a 2-core run where the variable is set)
test: $(SETUP)
	env -u PYTHONDONTWRITEBYTECODE $(RUN) -m pytest tests -rs $(TEST_ARGS)

gpu-smoke: $(SETUP)
	$(RUN) -m trainbench doctor
	$(RUN) -m pytest smoke -rs $(BENCH_ARGS)

doctor: $(SETUP)
	$(RUN) -m trainbench doctor

gpu-night: $(SETUP)
	$(RUN) -m trainbench night --budget-s $(NIGHT_BUDGET_S) --out $(NIGHT_OUT) \
		$(if $(NIGHT_ARCHIVE),--archive $(NIGHT_ARCHIVE)) $(NIGHT_ARGS)

report: $(SETUP)
	$(RUN) -m pytest benchmarks -k test_ladder --trainbench-slow -rs --benchmark-save=ladders $(BENCH_ARGS)
	$(RUN) -m trainbench report

clean:
	rm -rf $(VENV) .pytest_cache .trainbench-base
	git worktree prune
