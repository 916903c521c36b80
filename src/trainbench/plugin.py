"""pytest plugin: options, markers, the ``train_bench`` fixture, storage and compare hooks, the summary.

Glue only: how a case is measured and judged is ``trainbench.runner`` (which asv uses
too), the gate is ``trainbench.compare``. Everything here touches trainbench cases only:
its markers are namespaced (``trainbench_*``), a session that runs no trainbench case
imports no torch and stores its pytest-benchmark runs exactly as without the plugin.
"""

from __future__ import annotations

import fnmatch
import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pytest

MARKERS = {
    "trainbench_gpu": "trainbench_gpu(what=...): a trainbench case that needs a CUDA device; skipped with the reason "
                      "elsewhere",
    "trainbench_min_gpus": "trainbench_min_gpus(n): a trainbench case that needs at least n CUDA devices",
    "trainbench_min_capability": "trainbench_min_capability(major, minor): a trainbench case that needs a CUDA device "
                                 "of at least this compute capability",
    "trainbench_slow": "trainbench_slow: a long trainbench case (e.g. torch.compile on CPU); runs only with "
                       "--trainbench-slow",
}
BUDGETS_FILE = "budgets.toml"  # found beside a test file or in a folder above it, up to the rootdir


class NoBudgetWarning(UserWarning):
    """A case ran with no budget for this device: nothing was checked."""


class InconclusiveTimingWarning(UserWarning):
    """A timed budget missed on rounds that cannot show the miss (noise, a busy machine), measured twice:
    reported, not failed (``--trainbench-strict-timing`` fails it)."""


@dataclass
class SessionState:
    device_spec: str
    profile_name: str
    run_slow: bool
    predict_memory: bool
    require_budgets: bool
    strict_timing: bool
    settings_overrides: dict
    budgets_override: Path | None  # --trainbench-budgets or the ini value: one file for every case
    compare_fail: dict | None = None  # the regression gate (trainbench.compare.parse_spec)
    fault: object = None  # trainbench.step.InjectedFault planted by --trainbench-inject-*
    comparison: dict | None = None  # the verdict (JSON-ready), filled at session end when --benchmark-compare ran
    comparisons: list = field(default_factory=list)  # its trainbench.compare.MetricComparison objects
    rows: list[dict] = field(default_factory=list)  # one per measured case, for the summary and the gate
    failed_cases: list[dict] = field(default_factory=list)  # cases that ended without a result (out of memory)
    inconclusive: list[str] = field(default_factory=list)  # timed budgets the rounds could not judge
    budget_files: dict = field(default_factory=dict)  # path (or None) -> trainbench.budgets.Budgets
    expect_cuda: bool = False
    interrupted: bool = False  # Ctrl-C or SIGTERM: the saved run is marked incomplete
    previous_sigterm: object = None  # the SIGTERM handler to restore at the end
    doctor: dict | None = None  # trainbench.doctor.doctor_record of the checks run before the first case
    trace: object = None  # trainbench.trace.TraceRequest from --trainbench-profile-trace
    xdist_workers: int = 1  # pytest-xdist workers in this run (1: none, or this is the only one)
    xdist_index: int = 0  # this worker's number (gw<N>)
    pinned_gpu: str | None = None  # the one GPU this worker sees (CUDA_VISIBLE_DEVICES), one worker per GPU
    benchmark_disabled: bool = False  # --benchmark-disable given: nothing is timed or stored
    traces: list = field(default_factory=list)  # (case, what its trace request gave), for the summary
    ab: object = None  # trainbench.ab.ABSession from --trainbench-ab: cases compared between two environments
    rootpath: Path = Path()  # pytest's rootdir: where a user's specs are imported from in other processes
    _backend: object = None
    _runner: object = None

    @property
    def backend(self):
        if self._backend is None:  # lazy: importing torch costs seconds in unrelated pytest runs
            from .device import get_backend, pin_to_one_gpu

            if self.xdist_workers > 1 and self.device_spec in ("auto", "cuda"):  # before CUDA starts here
                self.pinned_gpu = pin_to_one_gpu(self.xdist_index, self.xdist_workers)
            self._backend = get_backend(self.device_spec)
        return self._backend

    def parallel_timing_reason(self) -> str | None:
        """Why this session cannot time cases, or None: pytest-xdist workers that share one device measure each
        other (one worker per GPU, each pinned to its own, is fine)."""
        if self.xdist_workers < 2 or self.pinned_gpu is not None:
            return None
        return (f"{self.xdist_workers} pytest-xdist workers share {self.backend.name} ({self.backend.kind}), and "
                "cases timed side by side measure each other")

    @property
    def runner(self):
        if self._runner is None:
            from .measure import DEFAULT_SETTINGS, with_overrides
            from .runner import Runner
            from .workloads import PROFILES

            name = self.backend.profile_name if self.profile_name == "auto" else self.profile_name
            settings = with_overrides(DEFAULT_SETTINGS[name], **self.settings_overrides)
            self._runner = Runner(self.backend, PROFILES[name], settings, self.fault, self.require_budgets,
                                  predict=self.predict_memory, strict_timing=self.strict_timing, trace=self.trace)
        return self._runner

    def budgets(self, path: Path | None):
        """The budgets file at ``path`` (None: none configured), loaded once; a malformed one is a usage error."""
        if path not in self.budget_files:
            from .budgets import BudgetError, Budgets

            try:
                self.budget_files[path] = Budgets.load(path) if path is not None else Budgets.empty()
            except BudgetError as e:
                raise pytest.UsageError(f"trainbench: {e}") from None
        return self.budget_files[path]


_STATE = pytest.StashKey[SessionState]()
# pytest_keyboard_interrupt gets no config: the state of the session running now.
_SESSION_STATE: list[SessionState] = []
INCOMPLETE_KEY = "trainbench_incomplete"
AB_LOSS_RTOL = 1e-5  # an A/B case's loss guard where its recipe sets none: numerics that moved, reported
_BUDGETS_PATH = pytest.StashKey[Path | None]()


def pytest_addoption(parser):
    group = parser.getgroup("trainbench", "trainbench: measured PyTorch training steps")
    group.addoption("--trainbench-device", default="auto",
                    help="device to train on: auto (CUDA if available, else cpu), cpu, cuda, cuda:N")
    group.addoption("--trainbench-expect-cuda", action="store_true",
                    help="fail before any case unless a usable CUDA GPU is there (also TRAINBENCH_EXPECT_CUDA=1): a GPU "
                         "job never measures the CPU profile by mistake")
    group.addoption("--trainbench-profile", default="auto", choices=["auto", "cpu", "gpu"],
                    help="size profile of the built-in workloads (default: from the device)")
    group.addoption("--trainbench-budgets", default=None,
                    help="budgets TOML file for every case (default: the trainbench_budgets ini value, else the "
                         f"{BUDGETS_FILE} nearest to each test file)")
    group.addoption("--trainbench-require-budgets", action="store_true",
                    help="fail a case that has no budget for this device instead of warning")
    group.addoption("--trainbench-strict-timing", action="store_true",
                    help="fail timed checks that are inconclusive (rounds too noisy to judge, or other processes "
                         "loading the machine) instead of reporting them: for dedicated benchmark machines")
    group.addoption("--trainbench-slow", action="store_true", help="also run cases marked trainbench_slow")
    group.addoption("--trainbench-no-predict", action="store_true",
                    help="do not predict each case's GPU-profile memory under FakeTensorMode (also "
                         "TRAINBENCH_PREDICT_MEMORY=0); its budgets then fail as missing metrics")
    group.addoption("--trainbench-rounds", type=int, default=None, help="timed rounds per case")
    group.addoption("--trainbench-steps-per-round", type=int, default=None, help="training steps per timed round")
    group.addoption("--trainbench-min-warmup", type=int, default=None, help="minimum warm-up steps")
    group.addoption("--trainbench-timeout", type=float, default=None, metavar="SECONDS",
                    help="fail a case that makes no progress (no training step, no batch) for this long, and go on "
                         "with the next (default: 600 on the cpu profile, 1200 on gpu; 0: no limit)")
    group.addoption("--trainbench-compare-fail", default=None, metavar="SPEC",
                    help="with --benchmark-compare: fail the session when a case regressed beyond METRIC:THRESHOLD "
                         "(e.g. samples_per_s:5%%,peak_memory:2%%,deterministic:0%%); timed metrics must also be "
                         "significant over the rounds of both runs")
    group.addoption("--trainbench-compare-alpha", type=float, default=0.05,
                    help="significance level of the one-sided rank test on timed metrics (default 0.05)")
    group.addoption("--trainbench-compare-json", default=None, metavar="PATH",
                    help="write the compare verdict of every case and metric as JSON")
    group.addoption("--trainbench-allow-new-cases", action="store_true",
                    help="with --trainbench-compare-fail: a case the baseline run does not have passes the gate "
                         "(default: it fails, since nothing was compared)")
    group.addoption("--trainbench-allow-cross-device", action="store_true",
                    help="allow --benchmark-compare against a run made on another device, or with other thread "
                         "or float-precision settings")
    group.addoption("--trainbench-profile-trace", default=None, metavar="DIR",
                    help="after each case's measurement, write a PyTorch Profiler trace of a few steps (TensorBoard "
                         "plugin format and a Chrome trace; on CUDA also a memory snapshot) to DIR/<case>/, "
                         "e.g. results/traces")
    group.addoption("--trainbench-profile-trace-cases", default=None, metavar="EXPR",
                    help="with --trainbench-profile-trace: only cases whose id matches this -k style expression "
                         "(e.g. 'resnet18 and not amp'); default every case that runs")
    group.addoption("--trainbench-ab", default=None, metavar="PYTHON",
                    help="A/B: run each case in this Python's environment (the head: another venv's python, or a "
                         "wrapper script that sets variables and execs one) and in the base environment, their timed "
                         "rounds alternating, and compare pair by pair; --trainbench-compare-fail gates the verdict")
    group.addoption("--trainbench-ab-base", default=None, metavar="PYTHON",
                    help="with --trainbench-ab: the base environment's Python (default: the one running pytest)")
    group.addoption("--trainbench-ab-pairs", type=int, default=12, metavar="N",
                    help="with --trainbench-ab: ABBA pairs of timed rounds per case (default 12)")
    group.addoption("--trainbench-inject-slowdown", default=None, metavar="FRACTION",
                    help="plant a regression to prove the gate: wait this fraction (e.g. 20%%) of every timed step")
    group.addoption("--trainbench-inject-leak-mib", type=float, default=0.0, metavar="MIB",
                    help="plant a memory regression to prove the gate: keep this many MiB per step, never freed")
    parser.addini("trainbench_budgets", "budgets TOML file for every case, relative to the rootdir", default="")


def pytest_configure(config):
    for line in MARKERS.values():
        config.addinivalue_line("markers", line)
    overrides = {
        "rounds": config.getoption("--trainbench-rounds"),
        "steps_per_round": config.getoption("--trainbench-steps-per-round"),
        "min_warmup_steps": config.getoption("--trainbench-min-warmup"),
    }
    for name, value in overrides.items():
        if value is not None and value < 1:
            raise pytest.UsageError(f"trainbench: --trainbench-{name.replace('_', '-')} must be >= 1, got {value}")
    timeout = config.getoption("--trainbench-timeout")
    if timeout is not None and not (timeout >= 0 and timeout != float("inf")):
        raise pytest.UsageError(f"trainbench: --trainbench-timeout must be a number of seconds >= 0 (0: no limit), "
                                f"got {timeout}")
    overrides["no_progress_s"] = timeout
    device_spec = config.getoption("--trainbench-device")
    state = config.stash[_STATE] = SessionState(
        device_spec=device_spec,
        profile_name=config.getoption("--trainbench-profile"),
        run_slow=config.getoption("--trainbench-slow"),
        predict_memory=not (config.getoption("--trainbench-no-predict")
                            or os.environ.get("TRAINBENCH_PREDICT_MEMORY", "").strip() == "0"),
        require_budgets=config.getoption("--trainbench-require-budgets"),
        strict_timing=config.getoption("--trainbench-strict-timing"),
        settings_overrides=overrides,
        budgets_override=_budgets_override(config),
        expect_cuda=config.getoption("--trainbench-expect-cuda"),
    )
    state.trace = _trace_request(config)
    state.benchmark_disabled = bool(config.getoption("benchmark_disable", False))
    workerinput = getattr(config, "workerinput", None)  # set on a pytest-xdist worker
    if workerinput:
        state.xdist_workers = int(workerinput.get("workercount", 1))
        state.xdist_index = int(str(workerinput.get("workerid", "gw0")).removeprefix("gw") or 0)
    _SESSION_STATE[:] = [state]
    if device_spec not in ("", "auto"):
        try:  # an explicit device that is not there is a set-up error, not a skip
            state.backend  # noqa: B018
        except (RuntimeError, ValueError) as e:
            raise pytest.UsageError(f"trainbench: {e}") from None
    if state.budgets_override is not None:
        state.budgets(state.budgets_override)  # a malformed file stops the session here
    state.rootpath = Path(config.rootpath)
    state.ab = _ab_session(config, device_spec)
    state.compare_fail, state.fault = _gate_options(config, ab=state.ab is not None)
    _compare_with_this_device(config, state)


def _ab_session(config, device_spec: str):
    """--trainbench-ab's two environments, or None; options that contradict an A/B run are usage errors."""
    head = config.getoption("--trainbench-ab")
    base = config.getoption("--trainbench-ab-base")
    pairs = config.getoption("--trainbench-ab-pairs")
    if head is None:
        if base is not None:
            raise pytest.UsageError("trainbench: --trainbench-ab-base needs --trainbench-ab=PYTHON (the head)")
        return None
    for option in ("benchmark_save", "benchmark_autosave", "benchmark_compare"):
        if config.getoption(option, None):
            raise pytest.UsageError(f"trainbench: --{option.replace('_', '-')} with --trainbench-ab: an A/B run compares "
                                    "two environments within itself and is neither saved as a baseline nor compared "
                                    "with one (--trainbench-compare-json writes its verdict)")
    if pairs < 3:
        raise pytest.UsageError(f"trainbench: --trainbench-ab-pairs must be >= 3 (a sign test needs pairs), got {pairs}")
    import shutil
    import sys

    for name, python in (("--trainbench-ab", head), ("--trainbench-ab-base", base)):
        if python is not None and shutil.which(python) is None:
            raise pytest.UsageError(f"trainbench: {name}={python}: no such executable")
    from .ab import ABSession

    return ABSession(base or sys.executable, head, pairs, device_spec)


def _trace_request(config):
    """--trainbench-profile-trace and its case filter, or None; a filter that does not parse is a usage error."""
    folder = config.getoption("--trainbench-profile-trace")
    expression = config.getoption("--trainbench-profile-trace-cases")
    if folder is None:
        if expression is not None:
            raise pytest.UsageError("trainbench: --trainbench-profile-trace-cases needs --trainbench-profile-trace=DIR")
        return None
    from .trace import TraceRequest

    if expression is None:
        return TraceRequest(Path(folder))
    # pytest's own -k grammar (and, or, not, parentheses; case-insensitive substrings of the case id).
    from _pytest.mark import expression as k_grammar

    try:
        compiled = k_grammar.Expression.compile(expression)
    except getattr(k_grammar, "ParseError", SyntaxError) as e:  # pytest < 8.3 raised its own ParseError
        raise pytest.UsageError(f"trainbench: --trainbench-profile-trace-cases={expression!r}: {e}") from None
    return TraceRequest(Path(folder), lambda case: compiled.evaluate(
        lambda name, **kwargs: not kwargs and name.lower() in case.lower()))


def _budgets_override(config) -> Path | None:
    """The one budgets file the command line or the ini names, or None (then each test file finds its own)."""
    given = config.getoption("--trainbench-budgets")
    if given:
        return Path(given)
    ini = config.getini("trainbench_budgets")
    return Path(config.rootpath) / ini if ini else None


def _discover_budgets(test_path: Path, rootpath: Path) -> Path | None:
    """The ``budgets.toml`` nearest to a test file: its folder, then each folder above, up to the rootdir."""
    folder = test_path.parent
    while True:
        candidate = folder / BUDGETS_FILE
        if candidate.is_file():
            return candidate
        if folder == rootpath or folder.parent == folder or rootpath not in folder.parents:
            return None
        folder = folder.parent


def _gate_options(config, ab: bool = False):
    from .compare import CompareError, parse_fraction, parse_spec

    spec = config.getoption("--trainbench-compare-fail")
    try:
        gate = parse_spec(spec) if spec else None
        slowdown = config.getoption("--trainbench-inject-slowdown")
        slowdown = parse_fraction(slowdown, "--trainbench-inject-slowdown") if slowdown else 0.0
    except CompareError as e:
        raise pytest.UsageError(f"trainbench: {e}") from None
    alpha = config.getoption("--trainbench-compare-alpha")
    if not 0 < alpha < 1:
        raise pytest.UsageError(f"trainbench: --trainbench-compare-alpha must be between 0 and 1 (a significance "
                                f"level, e.g. 0.05), got {alpha}")
    if gate is not None and not ab and not config.getoption("benchmark_compare", None):
        raise pytest.UsageError("trainbench: --trainbench-compare-fail gates a comparison, but no --benchmark-compare "
                                "was given: add --benchmark-compare (the latest saved run of this device) or "
                                "--benchmark-compare=NNNN")
    leak = config.getoption("--trainbench-inject-leak-mib")
    if leak < 0:
        raise pytest.UsageError(f"trainbench: --trainbench-inject-leak-mib must be >= 0, got {leak}")
    fault = None
    if slowdown or leak:
        from .step import InjectedFault

        fault = InjectedFault(slowdown=slowdown, leak_mib=leak)
    return gate, fault


# Settings recorded with a run's device identity that change what is measured as much as the device does.
SETUP_KEYS = ("cpu_threads", "float32_matmul_precision", "cuda_matmul_allow_tf32", "cudnn_allow_tf32")


def _device_of(machine_info: dict | None) -> tuple | None:
    from .device import comparable_device

    return comparable_device((machine_info or {}).get("trainbench"))


def _describe_device(device: tuple) -> str:
    return f"{device[1]} ({', '.join(str(part) for part in (device[0], *device[2:]) if part)})"


def _compare_with_this_device(config, state: SessionState) -> None:
    """Pick the run to compare with among several: a bare ``--benchmark-compare`` takes the latest saved run,
    ``--benchmark-compare=GLOB`` (e.g. ``*_baseline``) every run whose file name matches. When trainbench
    made those runs, take the latest complete one made on this device (runs of all devices share
    pytest-benchmark's storage folder, told apart by their machine_info). Runs before pytest-benchmark's
    own (trylast) configure, which loads the run to compare with.
    """
    storage = config.getoption("benchmark_storage", None)
    compare = config.getoption("benchmark_compare", None)
    if not compare or not storage or (compare is not True and ("/" in str(compare) or Path(str(compare)).is_file())):
        return  # no comparison, or one named file: compared as named
    saved = _saved_runs(storage)
    if saved is None:
        return  # elasticsearch keys runs by machine_info itself
    folder, runs = saved
    if compare is not True:
        pattern = str(compare).rstrip("*") + "*.json"  # pytest-benchmark's own reading of the value
        runs = [run for run in runs if fnmatch.fnmatch(run.name, pattern)]
    devices, incomplete = {}, set()
    for run in runs:
        try:
            data = json.loads(run.read_text(encoding="utf-8"))
            devices[run] = _device_of(data.get("machine_info"))
            if data.get(INCOMPLETE_KEY):
                incomplete.add(run)
        except (OSError, ValueError, AttributeError):
            devices[run] = None  # pytest-benchmark reports an unreadable run itself
    if not runs or devices[runs[-1]] is None:
        return  # a plain pytest-benchmark run (or none): its usual behaviour
    mine = _device_here(state.backend)
    if devices[runs[-1]] != mine or runs[-1] in incomplete or compare is not True:
        # An interrupted run is never the baseline of a bare compare (name it to compare with it anyway).
        same_device = [run for run in runs if devices[run] == mine and run not in incomplete]
        if same_device:
            config.option.benchmark_compare = str(same_device[-1])
        elif compare is not True and state.compare_fail is not None:
            others = sorted({_describe_device(d) for d in devices.values() if d})
            raise pytest.UsageError(
                f"trainbench: --trainbench-compare-fail: no complete run of this {_describe_device(mine)} among the "
                f"{len(runs)} in {folder} matching {str(compare)!r} (runs of: {'; '.join(others)}); save one on this "
                "machine with --benchmark-save (make baseline) and commit it")


def _device_here(backend) -> tuple:
    from .device import comparable_device

    return comparable_device(backend.identity())


def pytest_collection_modifyitems(config, items):
    state = config.stash[_STATE]
    if any("train_bench" in getattr(item, "fixturenames", ()) for item in items):
        _check_runner(state)
        _stop_cleanly_on_sigterm(state)
    paths = set()
    for item in items:
        reason = _marker_skip_reason(item, state)
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))
        elif "train_bench" in getattr(item, "fixturenames", ()):
            path = state.budgets_override or _discover_budgets(Path(item.path), Path(config.rootpath))
            state.budgets(path)  # loaded (and checked) at collection: a broken file stops the run before any case
            item.stash[_BUDGETS_PATH] = path
            paths.add(path)
    if any(path is not None for path in paths):
        _check_budget_case_ids(state, paths, items)


def _check_budget_case_ids(state: SessionState, paths: set, items) -> None:
    """A budgets entry one typo away from a case id fails the session at start-up, not silently at the end."""
    from .budgets import BudgetError
    from .cases import known_case_ids

    known = known_case_ids() | {item.callspec.id for item in items if hasattr(item, "callspec")}
    for path in paths:
        try:
            state.budgets(path).check_case_ids(known)
        except BudgetError as e:
            raise pytest.UsageError(f"trainbench: {e}") from None


def _stop_cleanly_on_sigterm(state: SessionState) -> None:
    """SIGTERM (a CI job cancelled, a timeout) ends the session as Ctrl-C does: the case running stops, its
    setup closes (loader workers end), and the cases already measured are saved, marked incomplete.
    Without this, the default action kills the process with nothing written."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum} (SIGTERM)")

    state.previous_sigterm = signal.signal(signal.SIGTERM, interrupt)


def pytest_keyboard_interrupt(excinfo):
    state = _SESSION_STATE[0] if _SESSION_STATE else None
    if state is not None:
        state.interrupted = True


def pytest_unconfigure(config):
    state = config.stash.get(_STATE, None)
    if state is not None and state.ab is not None:
        state.ab.close(force=state.interrupted)  # both environments' workers end with the session
    if state is not None and state.previous_sigterm is not None:
        import signal

        signal.signal(signal.SIGTERM, state.previous_sigterm)
    if _SESSION_STATE and _SESSION_STATE[0] is state:
        _SESSION_STATE.clear()


def _check_runner(state: SessionState) -> None:
    """``python -m trainbench doctor``'s checks, once, before the first trainbench case: a blocker (CUDA expected
    and missing, a GPU the build has no kernels for, too little /dev/shm...) stops the session; every check is
    recorded in the saved run's machine info."""
    from .doctor import doctor_record, format_checks, run_checks

    checks = run_checks(state.device_spec, expect_cuda=state.expect_cuda)
    state.doctor = doctor_record(checks)
    if hasattr(os, "getloadavg"):  # a busy machine is the first suspect when numbers move; the end is added at save
        state.doctor["load_average"] = {"start": list(os.getloadavg())}
    blockers = [line for check, line in zip(checks, format_checks(checks)) if check.status == "FAIL"]
    if blockers and not os.environ.get("TRAINBENCH_IGNORE_DOCTOR"):
        raise pytest.UsageError("trainbench: the runner is not ready (python -m trainbench doctor shows every "
                                "check; TRAINBENCH_IGNORE_DOCTOR=1 runs anyway):\n" + "\n".join(blockers))


def _marker_skip_reason(item, state: SessionState) -> str | None:
    """Why the trainbench markers on ``item`` rule it out on this session's device, or None."""
    if item.get_closest_marker("trainbench_slow") and not state.run_slow:
        return "slow case: run with --trainbench-slow"
    gpu = item.get_closest_marker("trainbench_gpu")
    gpus = item.get_closest_marker("trainbench_min_gpus")
    capability = item.get_closest_marker("trainbench_min_capability")
    if not (gpu or gpus or capability):
        return None
    from .recipes import Requirements

    try:
        caps = state.backend.caps()
    except RuntimeError as e:
        return str(e)
    requirements = Requirements(cuda=True, min_gpus=gpus.args[0] if gpus else 0,
                                min_capability=tuple(capability.args) if capability else None)
    reason = requirements.unmet(caps)
    what = gpu.kwargs.get("what") if gpu else None  # e.g. trainbench_gpu(what="pinned_memory (...)"): -rs tells cases apart
    return f"{what}: {reason}" if what and reason else reason


def pytest_benchmark_update_json(config, benchmarks, output_json):
    """Cases that failed before they had a result are in the saved run too, with why (they have no timing)."""
    state = config.stash.get(_STATE, None)
    if state is not None and state.failed_cases:
        output_json["trainbench_failed_cases"] = list(state.failed_cases)
    if state is not None and state.interrupted:
        output_json[INCOMPLETE_KEY] = True  # kept, but a bare --benchmark-compare never takes it as the baseline


def pytest_benchmark_update_machine_info(config, machine_info):
    """A session that ran trainbench cases records its device (plain pytest-benchmark runs stay as they are)."""
    state = config.stash.get(_STATE, None)
    if state is not None and state.rows:
        if state.doctor and "load_average" in state.doctor:
            state.doctor["load_average"]["end"] = list(os.getloadavg())
        machine_info["trainbench"] = {**state.backend.identity(), "doctor": state.doctor}


@pytest.hookimpl(tryfirst=True)
def pytest_benchmark_compare_machine_info(config, benchmarksession, machine_info, compared_benchmark):
    """Refuse to compare trainbench runs of different devices: their numbers say nothing about each other.

    First, so that pytest-benchmark's own check compares like with like: this session's device
    identity is in ``machine_info`` exactly when the compared run has one.
    """
    theirs = _device_of(compared_benchmark.get("machine_info"))
    if theirs is None:
        machine_info.pop("trainbench", None)
        return
    state = config.stash[_STATE]
    # The doctor's record tells how this run's machine was set up (free /dev/shm, warnings), not which device
    # it is: the compared run's own record stands in, so pytest-benchmark compares device identities only.
    machine_info["trainbench"] = {**state.backend.identity(), "doctor": compared_benchmark["machine_info"]["trainbench"]
                                  .get("doctor")}
    mine = _device_of(machine_info)
    if mine != theirs and not config.getoption("--trainbench-allow-cross-device"):
        raise pytest.UsageError(
            f"trainbench: --benchmark-compare would compare this {_describe_device(mine)} with "
            f"{_describe_device(theirs)}; "
            "numbers from different devices are not comparable. Compare with a run of this device "
            "(a bare --benchmark-compare picks the latest one), or pass --trainbench-allow-cross-device.")
    stored = compared_benchmark["machine_info"]["trainbench"]
    differ = [f"{key} {stored[key]!r} there, {value!r} here" for key, value in machine_info["trainbench"].items()
              if key in SETUP_KEYS and key in stored and stored[key] != value]
    if differ and not config.getoption("--trainbench-allow-cross-device"):
        raise pytest.UsageError(
            "trainbench: --benchmark-compare would compare runs made with other settings (" + "; ".join(differ)
            + "): thread counts and float precision change every number (e.g. OMP_NUM_THREADS=1 halves CPU "
            "throughput). Rerun with the baseline's settings, or pass --trainbench-allow-cross-device.")


def pytest_sessionstart(session):
    """A gated comparison with no baseline pytest-benchmark could load stops here, before any case runs:
    pytest-benchmark only warns ("Can't compare", "Failed to load") and the gate would pass unchecked."""
    config = session.config
    state = config.stash.get(_STATE, None)
    bench_session = getattr(config, "_benchmarksession", None)
    if state is None or state.compare_fail is None or bench_session is None or bench_session.compared_mapping \
            or state.ab is not None:
        return
    raise pytest.UsageError("trainbench: --trainbench-compare-fail: no baseline run to compare with: "
                            + _why_no_baseline(config.getoption("benchmark_storage"), bench_session.compare))


def _saved_runs(storage: str) -> tuple[Path, list[Path]] | None:
    """pytest-benchmark's folder of runs for this machine and its runs, oldest first (None: not file storage)."""
    if "://" in storage and not storage.startswith("file://"):
        return None
    from pytest_benchmark.utils import get_machine_id

    folder = Path(storage.removeprefix("file://")) / get_machine_id()
    return folder, sorted(folder.glob("[0-9][0-9][0-9][0-9]_*.json"), key=lambda p: p.name)


def _why_no_baseline(storage: str, compare) -> str:
    """What is wrong with the runs ``--benchmark-compare`` would have loaded, one line."""
    saved = _saved_runs(storage)
    if saved is None:
        return f"{storage} returned no run{'' if compare is True else f' matching {compare!r}'}"
    folder, runs = saved
    if compare is not True:
        runs = [r for r in runs if r.name.startswith(str(compare)) or r.stem == str(compare)]
    else:
        runs = runs[-1:]
    if not runs:
        what = "no saved runs" if compare is True else f"no saved run matching {compare!r}"
        return f"{folder}: {what}; save one first with --benchmark-save=NAME on the baseline code"
    problems = []
    for run in runs:
        try:
            text = run.read_text(encoding="utf-8")
            data = json.loads(text) if text.strip() else None
            if not isinstance(data, dict) or not isinstance(data.get("benchmarks"), list):
                problems.append(f"{run}: {'empty file' if data is None else 'no benchmarks list'}; expected a "
                                "pytest-benchmark run (--benchmark-save)")
        except (OSError, UnicodeDecodeError) as e:
            problems.append(f"{run}: cannot read it ({e})")
        except ValueError as e:
            problems.append(f"{run}: not valid JSON ({e}; truncated?)")
    return "; ".join(problems) or f"{runs[-1]}: pytest-benchmark could not load it"


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    """With --benchmark-compare: compare every case with the baseline run; fail on a gated regression."""
    config = session.config
    state = config.stash.get(_STATE, None)
    if state is not None and state.ab is not None and state.ab.outcomes:
        _finish_ab(session, state)
        return
    bench_session = getattr(config, "_benchmarksession", None)
    if state is None or not state.rows or bench_session is None or not bench_session.compare \
            or not bench_session.compared_mapping:
        return
    from .compare import gate

    path, baseline = list(bench_session.compared_mapping.items())[-1]
    state.comparison, state.comparisons = gate(state.rows, baseline, str(path), state.backend.identity(),
                                               state.compare_fail, config.getoption("--trainbench-compare-alpha"),
                                               allow_new_cases=config.getoption("--trainbench-allow-new-cases"),
                                               strict=state.strict_timing)
    json_path = config.getoption("--trainbench-compare-json")
    if json_path:
        from .files import write_json_atomic

        write_json_atomic(Path(json_path), state.comparison)
    if state.comparison["failed"]:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _finish_ab(session, state: SessionState) -> None:
    """The A/B verdict of every case: written for CI, and the session fails on a gated regression."""
    state.comparison = state.ab.verdict(gated=state.compare_fail is not None)
    state.comparisons = [c for o in state.ab.outcomes for c in o.comparisons]
    json_path = session.config.getoption("--trainbench-compare-json")
    if json_path:
        from .files import write_json_atomic

        write_json_atomic(Path(json_path), state.comparison)
    if state.comparison["failed"]:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def marks_for(recipe) -> list:
    """pytest marks from a recipe's requirements, so GPU-only cases are collected and skipped with a reason."""
    req, marks = recipe.requires, []
    if req.needs_cuda:
        marks.append(pytest.mark.trainbench_gpu(what=f"{recipe.name} ({recipe.description})"))
    if req.min_capability:
        marks.append(pytest.mark.trainbench_min_capability(*req.min_capability))
    if req.min_gpus:
        marks.append(pytest.mark.trainbench_min_gpus(req.min_gpus))
    if recipe.slow:
        marks.append(pytest.mark.trainbench_slow)
    return marks


def recipe_params(*names: str):
    """``pytest.param`` per recipe, with markers derived from its requirements.

    Use with ``@pytest.mark.parametrize("recipe", recipe_params(...))`` so that GPU-only
    recipes are collected everywhere and skipped with a reason on CPU runners.
    """
    from .recipes import RECIPES, get_recipe

    return [pytest.param(name, id=name, marks=marks_for(get_recipe(name))) for name in names or tuple(RECIPES)]


def case_params(cases):
    """``pytest.param`` per ``trainbench.cases.Case``, id = the case id (the budgets key)."""
    return [pytest.param(case, id=case.id, marks=marks_for(case.own_recipe())) for case in cases]


class TrainBench:
    """Callable behind the ``train_bench`` fixture: run one case, hand its rounds to pytest-benchmark, check it."""

    def __init__(self, benchmark, state: SessionState, budgets):
        self.benchmark = benchmark
        self.state = state
        self.budgets = budgets

    def __call__(self, recipe, spec, baseline=None, **overrides):
        """Measure ``recipe`` (a name or a ``Recipe``) on ``spec`` (a ``TrainingSpec`` or a built-in workload's name)
        against ``baseline`` (default: the recipe's own); ``overrides`` set config knobs (e.g. ``batch_size=8``)."""
        from .recipes import ConfigError
        from .spec import SpecError

        self._refuse_parallel_timing()
        if self.state.ab is not None:
            return self._ab(recipe, spec, overrides)
        try:
            outcome = self.state.runner.run(recipe, spec, baseline=baseline, budgets=self.budgets, overrides=overrides)
        except (ConfigError, SpecError) as e:  # an override that cancels the recipe, a spec that cannot be trained
            self.benchmark._mode = "trainbench: failed before measuring"  # not pytest-benchmark's "fixture not used"
            pytest.fail(f"trainbench: {e}", pytrace=False)
        return self._finish(outcome)

    def case(self, case, **overrides):
        """Measure a ``trainbench.cases.Case``: a recipe on a workload, or a ladder rung."""
        self._refuse_parallel_timing()
        if self.state.ab is not None:
            if case.ladder is not None:
                pytest.skip("A/B compares recipe cases; a ladder rung is compared through its recipe's own case")
            return self._ab(case.recipe_name, case.workload, overrides)
        return self._finish(self.state.runner.run_case(case, self.budgets, **overrides))

    def _ab(self, recipe, spec, overrides: dict):
        """Measure the case in both environments, rounds alternating, and compare them (``trainbench.ab``)."""
        from dataclasses import asdict

        from .ab import ABCase, SideError, ab_thresholds, project_paths
        from .distributed import spec_reference
        from .recipes import ConfigError, get_recipe
        from .spec import SpecError
        from .workloads import resolve_spec

        runner = self.state.runner
        try:
            recipe = recipe if not isinstance(recipe, str) else get_recipe(recipe)
            spec = resolve_spec(spec, runner.profile)
            config = recipe.config(runner.profile, **overrides)
            skipped = runner.skip_reason(recipe, spec, overrides)
            reference = spec_reference(spec)
        except (ConfigError, SpecError) as e:
            self.benchmark._mode = "trainbench: failed before measuring"
            pytest.fail(f"trainbench: {e}", pytrace=False)
        elsewhere = "its ranks run in other processes" if config.rank_processes else \
            runner.backend.fresh_process_reason(config)
        if skipped or elsewhere:
            pytest.skip(skipped or f"{recipe.name}: not in an A/B run: {elsewhere}")
        import torch

        case = f"{spec.name}-{recipe.name}"
        thresholds = ab_thresholds(self.state.compare_fail, self.budgets.compare_thresholds(runner.caps, case))
        try:
            outcome = self.state.ab.run(
                ABCase(case, recipe.name, asdict(config), reference, runner.profile.name, asdict(runner.settings),
                       recipe.extra_warmup_steps, torch.get_num_threads(), project_paths(self.state.rootpath)),
                thresholds, head_slowdown=self.state.fault.slowdown if self.state.fault else 0.0,
                loss_rtol=recipe.loss_rtol if recipe.loss_rtol is not None else AB_LOSS_RTOL)
        except SideError as e:
            self.benchmark._mode = "trainbench: failed before measuring"
            pytest.fail(f"trainbench A/B: {e}", pytrace=False)
        self._replay_rounds([head for _, head in outcome.pairs], outcome.head.steps_per_round)
        self.benchmark.extra_info.update({"case": case, "ab": {
            "pairs": outcome.pairs, "comparisons": [c.describe() for c in outcome.comparisons],
            "guard": outcome.guard.message if outcome.guard else None}})
        regressed = [c.describe() for c in outcome.comparisons if c.verdict in ("regressed", "missing")]
        if regressed and self.state.compare_fail is not None:
            pytest.fail("trainbench A/B: head regressed:\n" + "\n".join(regressed), pytrace=False)
        return outcome.head

    def _refuse_parallel_timing(self) -> None:
        """Under pytest-xdist workers sharing the device, a timed case is refused; with --benchmark-disable the
        case runs untimed (its deterministic budgets are judged, its timed ones are not)."""
        reason = self.state.parallel_timing_reason()
        if reason is None:
            return
        if not self.state.benchmark_disabled:
            self.benchmark._mode = "trainbench: refused"  # not pytest-benchmark's "fixture not used"
            pytest.fail(f"trainbench: timed case refused: {reason}. Run it without -n (or with one worker per GPU), "
                        "or add --benchmark-disable to check only its deterministic signals in parallel",
                        pytrace=False)
        self.state.runner.untimed = f"untimed run: {reason} (--benchmark-disable)"

    def _finish(self, outcome):
        if outcome.skipped:
            pytest.skip(outcome.skipped)
        if outcome.error is not None:  # no result to time or store: listed in the summary and the saved run
            self.state.failed_cases.append({"case": outcome.case, "fullname": self.benchmark.fullname,
                                            "error": outcome.error})
            self.benchmark._mode = "trainbench: failed before measuring"  # not pytest-benchmark's "fixture not used"
            pytest.fail(f"trainbench: {outcome.error}", pytrace=False)
        self._replay_rounds(outcome.result.round_step_times_s, outcome.result.steps_per_round)
        record = outcome.record()
        self.benchmark.extra_info.update(record)
        from .result import RELAUNCH_NOTE, CaseRecord

        self.state.rows.append({
            "case": outcome.case, "metrics": outcome.result.metrics(), "speedup": outcome.speedup,
            "paired": outcome.paired,
            "prediction_checked": ((outcome.result.predicted_memory or {}).get("check") or {}).get("matches"),
            "budget": outcome.budget_status + (" +guard FAIL" if any(
                not v.ok for v in outcome.guard_verdicts) else ""),
            "record": CaseRecord.read(record, outcome.case), "fullname": self.benchmark.fullname,
            "ranks": record.get("ranks"),
            "relaunches": [n for n in outcome.result.notes if n.startswith(RELAUNCH_NOTE)],
            "compare_fail": self.budgets.compare_thresholds(self.state.runner.caps, outcome.case)})
        if outcome.trace is not None:
            self.state.traces.append((outcome.case, outcome.trace))
        for line in outcome.inconclusive:
            self.state.inconclusive.append(line)
            warnings.warn(InconclusiveTimingWarning(line), stacklevel=3)
        if outcome.budget is None and not self.state.require_budgets:
            warnings.warn(NoBudgetWarning(f"{outcome.case}: {outcome.budget_missing}; nothing was checked"),
                          stacklevel=3)
        if outcome.failures:
            pytest.fail("trainbench checks failed:\n" + "\n".join(outcome.failures), pytrace=False)
        return outcome.result

    def _replay_rounds(self, round_step_times: list[float], steps_per_round: int) -> None:
        """Give pytest-benchmark the rounds the runner timed: its timer reads back their start and end stamps,
        so its table, --benchmark-save/compare/json show exactly the synchronized rounds."""
        bench = self.benchmark
        if bench.disabled:
            bench.pedantic(lambda: None)
            return
        if not hasattr(bench, "_timer"):
            raise RuntimeError("unsupported pytest-benchmark version: BenchmarkFixture has no _timer")
        stamps, t = [], 0.0
        for per_step in round_step_times:
            stamps += [t, t + per_step * steps_per_round]
            t += per_step * steps_per_round
        clock = iter(stamps)
        bench._timer = lambda: next(clock)
        bench.pedantic(lambda: None, rounds=len(round_step_times), iterations=steps_per_round, warmup_rounds=0)


@pytest.fixture
def train_bench(request, benchmark) -> TrainBench:
    """Measure a recipe on a training spec: ``result = train_bench("amp_bf16", SPEC)``."""
    state = request.config.stash[_STATE]
    return TrainBench(benchmark, state, state.budgets(request.node.stash.get(_BUDGETS_PATH, state.budgets_override)))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    state = config.stash.get(_STATE, None)
    if state is not None and state.ab is not None and state.comparison is not None:
        _write_ab(terminalreporter, state)
        return
    if state is None or not (state.rows or state.failed_cases):
        return
    from .report import summary_table

    terminalreporter.write_sep("=", "trainbench summary")
    backend = state.backend
    terminalreporter.write_line(f"device: {backend.name} ({backend.kind}), profile {state.runner.profile.name}")
    load = (state.doctor or {}).get("load_average")
    if load:
        terminalreporter.write_line(f"load average (1 min): {load['start'][0]:.2f} at start, "
                                    f"{os.getloadavg()[0]:.2f} now, on {os.cpu_count()} CPUs")
    for check in (state.doctor or {}).get("checks", []):
        if check["status"] in ("warn", "FAIL"):
            terminalreporter.write_line(f"doctor {check['status']}: {check['name']}: {check['message']}", yellow=True)
    for line in summary_table(state.rows):
        terminalreporter.write_line(line)
    for failed in state.failed_cases:
        terminalreporter.write_line(f"FAILED {failed['error']}", red=True)
    for line in state.inconclusive:
        terminalreporter.write_line(f"INCONCLUSIVE {line} (measured twice; not failed: --trainbench-strict-timing "
                                    "fails it)", yellow=True)
    if any(row["speedup"] is not None and not row["paired"] for row in state.rows):
        terminalreporter.write_line("~ vs base unpaired: the baseline's rounds were timed apart from the case's "
                                    "(no ratio budget asked for interleaving), so machine drift is in the ratio")
    mismatched = [row["case"] for row in state.rows if row.get("prediction_checked") is False]
    if any(row["metrics"].get("predicted_gpu_peak_mib") is not None for row in state.rows):
        terminalreporter.write_line(
            "GPU pred: the GPU profile's tracked tensor peak predicted under FakeTensorMode (no allocator cache, "
            "workspaces or CUDA context)" + (f"; ! prediction of this run's own setup differs from its measured "
                                             f"breakdown: {', '.join(mismatched)}" if mismatched else
                                             "; each case's own setup predicted exactly as measured"))
    for row in state.rows:
        if row.get("ranks"):
            terminalreporter.write_line(_ranks_line(row["case"], row["ranks"]))
        for note in row.get("relaunches", ()):  # measured whole by the relaunch; the crash is shown, not hidden
            terminalreporter.write_line(f"{row['case']}: {note}", yellow=True)
    for case, trace in state.traces:
        terminalreporter.write_line(f"profile trace {case}: " + (
            ", ".join(trace["files"]) if "files" in trace else f"not taken: {trace['skipped']}"))
    if state.comparison is not None:
        _write_comparison(terminalreporter, state)


def _write_ab(terminalreporter, state: SessionState) -> None:
    """The A/B verdict: both environments, the table, and one line per regression and numerics change."""
    from .compare import verdict_table

    verdict = state.comparison
    terminalreporter.write_sep("=", "trainbench A/B: base vs head, rounds alternating ABBA, compared pair by pair")
    for label, side in verdict["ab"].items():
        ident = side["identity"]
        extras = ", ".join(f"{k} {ident[k]}" for k in ("cuda", "cudnn", "driver") if ident.get(k))
        terminalreporter.write_line(f"{label}: {side['python']}: torch {ident.get('torch')}"
                                    + (f", {extras}" if extras else "") + f", {ident.get('name')}")
    gate = "gate: --trainbench-compare-fail" if verdict["gated"] else "no gate (--trainbench-compare-fail not given)"
    terminalreporter.write_line(gate + "; " + ", ".join(f"{n} {v}" for v, n in verdict["counts"].items() if n))
    for line in verdict_table(state.comparisons):
        terminalreporter.write_line(line)
    for outcome in state.ab.outcomes:
        if outcome.guard is not None and not outcome.guard.ok:
            terminalreporter.write_line(f"NUMERICS {outcome.case}: head vs base: {outcome.guard.message}", yellow=True)
    for c in state.comparisons:
        if c.verdict in ("regressed", "inconclusive", "missing"):
            label = {"regressed": "REGRESSION ", "inconclusive": "INCONCLUSIVE ", "missing": "FAIL "}[c.verdict]
            terminalreporter.write_line((label if verdict["gated"] or c.verdict != "regressed"
                                         else "regressed (not gated): ") + c.describe(),
                                        red=c.verdict != "inconclusive" and verdict["gated"])


def _ranks_line(case: str, ranks: dict) -> str:
    """One line per distributed case: launcher, ranks, scaling, gradients, each rank's median step."""
    import statistics

    medians = ", ".join(f"{statistics.median(r['round_step_times_s']) * 1e3:.1f}" for r in ranks["per_rank"])
    if "scaling_efficiency" in ranks:
        scaling = (f"scaling efficiency {ranks['scaling_efficiency']:.2f} vs {ranks['speedup_vs']} (ideal speed-up "
                   f"{ranks['ideal_speedup']:g}x)")
    elif "speedup_vs" in ranks:
        scaling = f"compared with {ranks['speedup_vs']}, itself distributed (scaling efficiency is vs one process)"
    else:
        scaling = "no scaling efficiency (no ratio budget asked for its one-process baseline)"
    spread = ranks["max_grad_difference_between_ranks"]
    return (f"ranks {case}: {ranks['world_size']} under {ranks['launcher']}, {ranks['dist_backend']}; {scaling}; "
            f"gradients {'identical on every rank' if not spread else f'DIFFER by {spread:.3g}'}; "
            f"median step per rank {medians} ms")


def _write_comparison(terminalreporter, state: SessionState) -> None:
    from .compare import verdict_table

    verdict, comparisons = state.comparison, state.comparisons
    gate = "gate: --trainbench-compare-fail" if verdict["gated"] else "no gate (--trainbench-compare-fail not given)"
    terminalreporter.write_sep("=", f"trainbench compare vs {verdict['baseline']}")
    terminalreporter.write_line(gate + "; " + ", ".join(f"{n} {v}" for v, n in verdict["counts"].items() if n))
    for line in verdict_table(comparisons):
        terminalreporter.write_line(line)
    for case in verdict["new_cases"]:
        failing = verdict["gated"] and not verdict["new_cases_allowed"]
        terminalreporter.write_line(f"{'FAIL ' if failing else ''}{case}: not in the baseline run (new case"
                                    + ("; nothing compared: --trainbench-allow-new-cases lets it pass)" if failing
                                       else ")"), red=failing)
    for error in verdict["errors"]:
        terminalreporter.write_line(f"ERROR {error}", red=True)
    for c in comparisons:
        if c.verdict == "inconclusive":
            strict = verdict["gated"] and verdict.get("strict")
            terminalreporter.write_line(("FAIL (strict) " if strict else "INCONCLUSIVE ") + c.describe(),
                                        red=strict, yellow=not strict)
        if c.verdict == "missing" and verdict["gated"]:
            terminalreporter.write_line("FAIL " + c.describe(), red=True)
        if c.verdict == "regressed":
            terminalreporter.write_line(("REGRESSION " if verdict["gated"] else "regressed (not gated): ") + c.describe(),
                                        red=verdict["gated"])
