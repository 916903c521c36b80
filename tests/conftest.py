import gc
import os

import pytest

# The plugin's inner sessions skip the FakeTensorMode memory prediction (seconds per case); the tests
# of the prediction turn it on themselves.
os.environ.setdefault("TRAINBENCH_PREDICT_MEMORY", "0")


def _load_what_the_tests_share():
    """Torch and what the tests' inner sessions would otherwise import again, in a process that runs tests."""
    import copy
    import functools

    import pytest_benchmark.plugin
    import torch

    # pytester's in-process runs restore sys.modules afterwards; torch modules that register
    # operator libraries cannot be imported twice, so import what the plugin loads lazily now.
    import torch._dynamo  # torch.compile's, first imported inside an inner run, registered its caches twice after
    import torch._inductor.compile_fx
    import torch.distributed._tools.mem_tracker
    import torch.utils.flop_counter
    import torchvision
    import torchvision.transforms  # noqa: F401

    # torch.compile's backends (the minifier's among them) are imported once per process, on the first compile: done
    # in an inner run, pytester drops their modules afterwards, and the next import registers
    # "dynamo_minifier_backend" twice.
    torch._dynamo.list_backends()

    # pytest-benchmark asks py-cpuinfo for the machine's CPU in each session that saves or compares a run: ~0.2 s and
    # a Python process each time (cpuinfo runs CPUID in a child), ~80 times in this suite's inner sessions. The answer
    # cannot change within a test process: asked once, each session gets its own copy.
    cpu_info = functools.lru_cache(maxsize=1)(pytest_benchmark.plugin.get_cpu_info)
    pytest_benchmark.plugin.get_cpu_info = lambda: copy.deepcopy(cpu_info())

    # Keep the CPU tests on the two cores the CI runner has, and deterministic. Under xdist (make test: two workers)
    # each worker takes one: two OpenMP threads per worker on two cores stall each parallel region on the other
    # worker's threads.
    torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else min(2, torch.get_num_threads()))


def pytest_configure(config):
    # make test's xdist controller runs no test: torch (~3 s of CPU) would only delay the start of its workers.
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        return
    _load_what_the_tests_share()


@pytest.fixture(autouse=True)
def _collections_walk_only_this_tests_objects():
    """The measurement collects garbage several times a case (``gc.collect`` before allocator peaks and growth).
    With torch, torchvision and pytest loaded a full collection walks ~350k objects, 0.3 s each on two cores:
    most of a small case's time. Freezing what is alive when a test starts (after collecting what earlier
    tests left) keeps those objects out of every later collection; the code under test collects its own
    garbage as ever, and refcounting still frees frozen objects."""
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def _inner_sessions_are_not_xdist_workers(monkeypatch):
    """Under ``pytest tests -n auto`` each worker's environment says so; an inner pytester session would inherit
    it and pytest-benchmark there would disable itself as if it were a worker."""
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
        monkeypatch.delenv(name, raising=False)
    # No inner session runs a hypothesis test, and its plugin costs ~0.1 s of each one's start (hundreds of them).
    monkeypatch.setenv("PYTEST_ADDOPTS", "-p no:hypothesispytest")


@pytest.fixture
def cpu():
    import torch

    from trainbench.devices.device import CpuBackend

    return CpuBackend(torch.device("cpu"))


@pytest.fixture(scope="session")
def profile():
    from trainbench.core.setups.workloads import PROFILES

    return PROFILES["cpu"]


@pytest.fixture(scope="session")
def quick():
    """Just enough measurement to exercise every path (frozen: a module's shared measurement may use it too), without
    the attribution pass (its profiled steps and tables are most of a small case's passes): ``attributed`` has it."""
    from trainbench.core.method.measure import MeasureSettings

    return MeasureSettings(min_warmup_steps=1, max_warmup_steps=4, steady_window=1, rounds=3, steps_per_round=2,
                           memory_steps=1, attribution=False)


@pytest.fixture(scope="session")
def attributed(quick):
    """``quick`` with the attribution tables: for the tests that read where a step's time, ops or memory go."""
    import dataclasses

    return dataclasses.replace(quick, attribution=True)


@pytest.fixture
def impossible_speedup(tmp_path):
    """A speed budget no run can meet (100x its baseline) beside a deterministic one every run meets."""
    from trainbench.core.records.budgets import Budgets

    path = tmp_path / "budgets.toml"
    path.write_text('[cpu."mlp-set_to_none"]\nmin_speedup = 100\nmax_ops_per_step_ratio = 1.5\n')
    return Budgets.load(path)


@pytest.fixture
def one_thread():
    """One intra-op thread for the test (and the A/B sides it starts, which take the caller's thread count): with
    two OpenMP threads on a loaded 2-core machine (a parallel test run, a CPU hog), a parallel region waits for its
    descheduled second thread for a scheduler slice, stalling a step of a few ms by tens of ms and flipping pairs."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def machine_load(monkeypatch):
    """``machine_load(load)``: every case measured from now on saw ``load`` (what other processes used)."""
    return lambda load: monkeypatch.setattr("trainbench.devices.host.LoadMeter.stop", lambda self: dict(load))


@pytest.fixture
def device_of_memory():
    """``device_of_memory(total_bytes)``: the CPU backend, reporting a device memory of ``total_bytes``."""
    import torch

    from trainbench.devices.device import CpuBackend

    class DeviceOfMemory(CpuBackend):
        def __init__(self, total_bytes):
            super().__init__(torch.device("cpu"))
            self.total_bytes = total_bytes

        def total_memory_bytes(self):
            return self.total_bytes

    return DeviceOfMemory


# An inner pytest session (pytester) that measures on the CPU with just enough rounds and steps to exercise every
# path. A test that needs other numbers appends its own options: the last one given wins.
INNER_OPTIONS = ("--trainbench-device=cpu", "--trainbench-rounds=2", "--trainbench-steps-per-round=2",
                 "--trainbench-min-warmup=1", "-p", "no:cacheprovider")


@pytest.fixture
def quick_options():
    """``INNER_OPTIONS`` without the attribution pass: like the memory prediction (off above), the profiler's
    per-step op tables are seconds of a small case that only the tests reading them need."""
    return [*INNER_OPTIONS, "--trainbench-no-attribution"]


@pytest.fixture
def attributed_options():
    """``INNER_OPTIONS`` with the attribution taken (a plain run leaves it out)."""
    return [*INNER_OPTIONS, "--trainbench-attribution"]


@pytest.fixture
def mlp(profile):
    """The built-in two-layer MLP spec on the CPU profile."""
    from trainbench.core.setups.workloads import resolve_spec

    return resolve_spec("mlp", profile)


@pytest.fixture
def training(cpu, profile):
    """``training(recipe, workload="mlp", **overrides)``: the built setup of a recipe on a built-in workload."""
    from trainbench.core.setups.recipes import get_recipe
    from trainbench.core.setups.training import TrainingSetup
    from trainbench.core.setups.workloads import resolve_spec

    def build(recipe="baseline", workload="mlp", backend=None, **overrides):
        config = get_recipe(recipe).config(profile, **overrides)
        return TrainingSetup(config, resolve_spec(workload, profile), backend or cpu)

    return build


@pytest.fixture
def measured(training, profile, quick):
    """``measured(recipe, workload="mlp", settings=quick, **overrides)``: the Result of the whole method."""
    from trainbench.core.method.measure import measure
    from trainbench.core.setups.recipes import get_recipe

    def run(recipe="baseline", workload="mlp", settings=None, **overrides):
        with training(recipe, workload, **overrides) as setup:
            return measure(setup, f"{workload}-{recipe}", recipe, settings or quick,
                           get_recipe(recipe).extra_warmup_steps, profile.name)

    return run
