"""trainbench's command-line options: declared once, read once into a frozen ``Options``, every check made there.

A value that cannot work (a negative round count, a gate with nothing to compare, an A/B run asked to save
a baseline...) is a usage error before any case runs, naming the option and what was expected.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from _pytest.mark import expression as k_grammar  # pytest's own -k grammar, for --trainbench-profile-trace-cases

from trainbench.core.records.metrics import ThresholdError, is_timed, parse_fraction, parse_thresholds
from trainbench.core.records.stats import MAX_PAIRS_FACTOR, least_rounds, planned_looks
from trainbench.devices.fleet import GpuSpecError, parse_gpu
from trainbench.devices.host import EnvError, env_switch

BUDGETS_FILE = "budgets.toml"  # found beside a test file or in a folder above it, up to the rootdir


def add_options(parser) -> None:
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
                    help="fail timed budget checks that are inconclusive (rounds too noisy to judge, or other processes "
                         "loading the machine) instead of reporting them: for dedicated benchmark machines (an "
                         "inconclusive gate or A/B comparison fails without it: see --trainbench-allow-inconclusive)")
    group.addoption("--trainbench-slow", action="store_true", help="also run cases marked trainbench_slow")
    group.addoption("--trainbench-pair-baselines", action="store_true",
                    help="time every case's rounds interleaved with its baseline's (ABBA), as a ratio budget does, so "
                         "that each 'vs base' is paired: what `python -m trainbench calibrate --measure` runs to write "
                         "min_speedup budgets")
    group.addoption("--trainbench-no-predict", action="store_true",
                    help="do not predict each case's GPU-profile memory under FakeTensorMode (also "
                         "TRAINBENCH_PREDICT_MEMORY=0); its budgets then fail as missing metrics")
    group.addoption("--trainbench-rounds", type=int, default=None, help="timed rounds per case")
    group.addoption("--trainbench-steps-per-round", type=int, default=None, help="training steps per timed round")
    group.addoption("--trainbench-min-warmup", type=int, default=None, help="minimum warm-up steps")
    group.addoption("--trainbench-timeout", type=float, default=None, metavar="SECONDS",
                    help="fail a case that makes no progress (no training step, no batch) for this long, and go on "
                         "with the next (default: 600 on the cpu profile, 1200 on gpu; 0: no limit)")
    group.addoption("--trainbench-no-attribution", action="store_true",
                    help="never record where each case's ops, time, FLOPs and memory go (profiled steps and module "
                         "sites after the rounds): changed verdicts cannot say where. By default it is recorded where "
                         "a verdict may need it (a gate, a comparison, A/B, --benchmark-save/-autosave, "
                         "--trainbench-attribution-json); a plain run leaves it out and says so")
    group.addoption("--trainbench-attribution", action="store_true",
                    help="record the attribution in a plain run too (see --trainbench-no-attribution)")
    group.addoption("--trainbench-quick", action="store_true",
                    help="a smoke run for big models: warm-up, the timed rounds and only the passes the budgets' metrics "
                         "need; the correctness guard, attribution, the GPU prediction and every other pass are skipped "
                         "and each case says so. Not for a gate, an A/B run or a saved baseline")
    group.addoption("--trainbench-costs", action="store_true",
                    help="after the summary, each case's wall seconds by phase (setup, warm-up, timed rounds, the "
                         "memory and work passes, guard, prediction; its baseline's share included) and how much of "
                         "the session the timed rounds were")
    group.addoption("--trainbench-simulate-gpu", default=None, metavar="NAME_OR_SPEC",
                    help="plan every case for a simulated GPU instead of measuring here: a fleet GPU's name or key "
                         "(\"NVIDIA L40S\", 2xh100-sxm) or an explicit spec (name=...,memory_gib=...,capability=8.9,"
                         "sms=...; see docs/ci-and-gpu.md). Cases skip as on that GPU; those that would run there are "
                         "skipped too, saying what they would do (nothing is measured on a simulated GPU)")
    group.addoption("--trainbench-attribution-json", default=None, metavar="PATH",
                    help="write every case's complete attribution tables to PATH (a saved run keeps their top rows)")
    group.addoption("--trainbench-save-progress", default=None, metavar="PATH",
                    help="after every case, write the run so far to PATH (marked incomplete): what a kill of the "
                         "session, even SIGKILL, cannot take from the cases already finished")
    _add_compare_options(group)
    _add_trace_and_ab_options(group)
    parser.addini("trainbench_budgets", "budgets TOML file for every case, relative to the rootdir", default="")


def _add_compare_options(group) -> None:
    group.addoption("--trainbench-compare-fail", action="append", default=None, metavar="SPEC",
                    help="with --benchmark-compare: fail the session when a case regressed beyond METRIC:THRESHOLD "
                         "(e.g. samples_per_s:5%%,peak_memory:2%%,deterministic:0%%); timed metrics must also be "
                         "significant over the rounds of both runs. Given again, its thresholds add up (a metric "
                         "named twice is refused)")
    group.addoption("--trainbench-allow-inconclusive", action="store_true",
                    help="with --trainbench-compare-fail (or --trainbench-ab): a timed comparison that stays "
                         "inconclusive after measuring again is reported and passes (default: the session ends "
                         "'could not judge', exit status 6)")
    group.addoption("--trainbench-remeasure-s", type=float, default=DEFAULT_REMEASURE_S, metavar="SECONDS",
                    help="with a gate or A/B: measure a case whose timed comparison is inconclusive again (more rounds "
                         f"or pairs) for up to this many seconds (default {DEFAULT_REMEASURE_S:g}; 0: never)")
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
    group.addoption("--trainbench-inject-slowdown", default=None, metavar="FRACTION",
                    help="plant a regression to prove the gate: wait this fraction (e.g. 20%%) of every timed step")
    group.addoption("--trainbench-inject-leak-mib", type=float, default=0.0, metavar="MIB",
                    help="plant a memory regression to prove the gate: keep this many MiB per step, never freed")


def _add_trace_and_ab_options(group) -> None:
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
    group.addoption("--trainbench-ab-base-root", default=None, metavar="DIR",
                    help="with --trainbench-ab: the base side imports the project's code (its test modules and "
                         "source folders) from DIR, another checkout of the project (two commits of it in one "
                         "environment: python -m trainbench bisect); default the session's own")
    group.addoption("--trainbench-ab-pairs", type=int, default=None, metavar="N",
                    help=f"with --trainbench-ab: ABBA pairs of timed rounds per case (default {AB_PAIRS})")


AB_PAIRS = 12


DEFAULT_REMEASURE_S = 120.0


def _switch(name: str) -> bool:
    """A ``host.SWITCHES`` environment switch, read once here: a value neither on nor off stops the session."""
    try:
        return env_switch(name)
    except EnvError as e:
        raise usage_error(str(e)) from None


def usage_error(message: str) -> pytest.UsageError:
    return pytest.UsageError(f"trainbench: {message}")


def shown(value) -> str:
    """A value as a one-line message shows it: as given, or quoted where it holds what a line cannot (a newline)."""
    text = str(value)
    return text if text.isprintable() else repr(text)


@dataclass(frozen=True)
class ABOptions:
    base_python: str
    head_python: str
    pairs: int
    base_root: Path | None = None  # the base side's checkout of the project (--trainbench-ab-base-root)


@dataclass(frozen=True)
class BenchmarkOptions:
    """pytest-benchmark's own options as trainbench reads them, once (None: not given, or pytest-benchmark is not
    active). What pytest-benchmark does with them stays its own (``benchmark_adapter``)."""

    save: str | None = None  # --benchmark-save's name
    autosave: bool = False
    storage: str | None = None  # --benchmark-storage (pytest-benchmark's default: file://./.benchmarks)
    compare: object = None  # --benchmark-compare: True (the newest run), a run's number or a path
    json: object = None  # --benchmark-json's file

    @classmethod
    def from_config(cls, config) -> BenchmarkOptions:
        return cls(config.getoption("benchmark_save", None), bool(config.getoption("benchmark_autosave", False)),
                   config.getoption("benchmark_storage", None), config.getoption("benchmark_compare", None),
                   config.getoption("benchmark_json", None))

    @property
    def saving(self) -> bool:
        """The run is saved into the storage (--benchmark-save or --benchmark-autosave)."""
        return bool(self.save or self.autosave)


@dataclass(frozen=True)
class Options:
    """Everything trainbench reads from pytest's command line and ini, checked."""

    device_spec: str
    profile_name: str
    expect_cuda: bool  # --trainbench-expect-cuda (doctor.expects_cuda adds TRAINBENCH_EXPECT_CUDA and a CUDA device)
    run_slow: bool
    predict_memory: bool
    require_budgets: bool
    strict_timing: bool
    settings_overrides: dict  # measurement settings from the command line (None: the profile's default)
    attribution_left_out: str | None  # why this session takes no attribution (``attribution_wanted``), or None
    budgets_override: Path | None  # --trainbench-budgets or the ini value: one file for every case
    compare_fail: dict | None  # the regression gate's thresholds (trainbench.core.records.metrics.parse_thresholds)
    compare_alpha: float
    compare_json: Path | None
    attribution_json: Path | None  # every case's complete attribution tables (--trainbench-attribution-json)
    progress_json: Path | None  # the run so far, rewritten after every case (--trainbench-save-progress)
    allow_inconclusive: bool  # an inconclusive timed comparison passes (reported)
    remeasure_s: float  # seconds per case spent measuring an inconclusive timed comparison again
    allow_new_cases: bool
    allow_cross_device: bool
    fault: object  # trainbench.core.setups.training.InjectedFault planted by --trainbench-inject-*, or None
    trace: object  # trainbench.core.method.trace.TraceRequest from --trainbench-profile-trace, or None
    ab: ABOptions | None
    benchmark_disabled: bool  # --benchmark-disable: nothing is timed or stored
    rootpath: Path  # pytest's rootdir: where a user's specs are imported from in other processes
    xdist_workers: int = 1  # pytest-xdist workers in this run (1: none, or this is the only one)
    xdist_index: int = 0  # this worker's number (gw<N>)
    pair_baselines: bool = False  # every case timed interleaved with its baseline, budget or not
    simulate_gpu: object = None  # trainbench.devices.fleet.Gpu from --trainbench-simulate-gpu: cases planned for it, not run
    ignore_doctor: bool = False  # TRAINBENCH_IGNORE_DOCTOR: run past the doctor's blockers (recorded all the same)
    costs: bool = False  # --trainbench-costs: where each case's wall time went, after the summary
    quick: bool = False  # --trainbench-quick: the timed rounds and the passes the budgets need, nothing else
    # pytest's cache (``config.cache``; None: -p no:cacheprovider): where GPU memory predictions are kept across
    # sessions (``running.Machine.runner``), made only once a case runs
    pytest_cache: object = None
    benchmark: BenchmarkOptions = BenchmarkOptions()  # pytest-benchmark's own options that trainbench reads

    @classmethod
    def from_config(cls, config) -> Options:
        ab = _ab_options(config)
        attribution_left_out = attribution_wanted(config)
        workers, index = _xdist_worker(config)
        compare_fail, fault = _gate_options(config, ab=ab is not None)
        _switch("TRAINBENCH_EXPECT_CUDA")  # checked at start-up; doctor.expects_cuda reads it beside the flag
        return cls(
            device_spec=config.getoption("--trainbench-device"),
            profile_name=config.getoption("--trainbench-profile"),
            expect_cuda=config.getoption("--trainbench-expect-cuda"),
            run_slow=config.getoption("--trainbench-slow"),
            predict_memory=not config.getoption("--trainbench-no-predict") and _switch("TRAINBENCH_PREDICT_MEMORY"),
            ignore_doctor=_switch("TRAINBENCH_IGNORE_DOCTOR"),
            costs=config.getoption("--trainbench-costs"),
            quick=_quick(config),
            require_budgets=config.getoption("--trainbench-require-budgets"),
            strict_timing=config.getoption("--trainbench-strict-timing"),
            settings_overrides=_settings_overrides(config, attribution=attribution_left_out is None),
            attribution_left_out=attribution_left_out,
            budgets_override=_budgets_override(config),
            compare_fail=compare_fail,
            compare_alpha=config.getoption("--trainbench-compare-alpha"),
            compare_json=_optional_path(config.getoption("--trainbench-compare-json")),
            attribution_json=_optional_path(config.getoption("--trainbench-attribution-json")),
            progress_json=_optional_path(config.getoption("--trainbench-save-progress")),
            allow_inconclusive=config.getoption("--trainbench-allow-inconclusive"),
            remeasure_s=_remeasure_s(config),
            allow_new_cases=config.getoption("--trainbench-allow-new-cases"),
            allow_cross_device=config.getoption("--trainbench-allow-cross-device"),
            fault=fault,
            trace=_trace_request(config),
            ab=ab,
            benchmark_disabled=bool(config.getoption("benchmark_disable", False)),
            rootpath=Path(config.rootpath),
            pytest_cache=getattr(config, "cache", None),
            xdist_workers=workers,
            xdist_index=index,
            pair_baselines=config.getoption("--trainbench-pair-baselines"),
            simulate_gpu=_simulated_gpu(config, ab=ab is not None, gated=compare_fail is not None),
            benchmark=BenchmarkOptions.from_config(config),
        )


def _optional_path(value: str | None) -> Path | None:
    return Path(value) if value else None


def _settings_overrides(config, attribution: bool) -> dict:
    options = {"rounds": "--trainbench-rounds", "steps_per_round": "--trainbench-steps-per-round",
               "min_warmup_steps": "--trainbench-min-warmup"}
    overrides = {name: config.getoption(option) for name, option in options.items()}
    for name, value in overrides.items():
        if value is not None and value < 1:
            raise usage_error(f"{options[name]} must be >= 1, got {value}")
    timeout = config.getoption("--trainbench-timeout")
    if timeout is not None and not (timeout >= 0 and timeout != float("inf")):
        raise usage_error(f"--trainbench-timeout must be a number of seconds >= 0 (0: no limit), got {timeout}")
    overrides["no_progress_s"] = timeout
    overrides["attribution"] = attribution  # where a verdict may need it (``attribution_wanted``)
    return overrides


def attribution_wanted(config) -> str | None:
    """Why this session leaves the attribution out, or None where it records it: it explains changed verdicts, so
    it is taken where one may be explained (a gate, a comparison, an A/B run, a run saved to become a baseline, or
    its tables asked for) and where asked, and left out of a plain run (``make bench``), which explains nothing."""
    if config.getoption("--trainbench-no-attribution"):
        if config.getoption("--trainbench-attribution"):
            raise usage_error("--trainbench-attribution and --trainbench-no-attribution contradict each other")
        return "--trainbench-no-attribution"
    explained = ("--trainbench-attribution", "--trainbench-attribution-json", "benchmark_compare",
                 *(key for _, key in GATED_OR_KEPT))
    if any(config.getoption(option, None) for option in explained):
        return None
    return ("a plain run explains no verdict, so the attribution (where ops, time and memory go) was not taken; "
            "--trainbench-attribution, a gate, a comparison, an A/B run or --benchmark-save take it")


def _simulated_gpu(config, ab: bool, gated: bool):
    """The GPU --trainbench-simulate-gpu names or specifies (``fleet.parse_gpu``), or None; it measures nothing, so
    an option that asks for a device or a measurement to compare is a usage error beside it."""
    text = config.getoption("--trainbench-simulate-gpu")
    if text is None:
        return None
    try:
        gpu = parse_gpu(text)
    except GpuSpecError as e:
        raise usage_error(f"--trainbench-simulate-gpu: {e}") from None
    device = config.getoption("--trainbench-device")
    conflicting = ((f"--trainbench-device={shown(device)}" if device not in ("", "auto") else None)
                   or ("--trainbench-ab" if ab else None) or ("--trainbench-compare-fail" if gated else None))
    if conflicting:
        raise usage_error(f"--trainbench-simulate-gpu with {conflicting}: a simulated GPU runs and measures nothing; "
                          "drop one of the two")
    return gpu


def _remeasure_s(config) -> float:
    seconds = config.getoption("--trainbench-remeasure-s")
    if not (0 <= seconds < float("inf")):
        raise usage_error(f"--trainbench-remeasure-s must be a number of seconds >= 0 (0: never), got {seconds}")
    return seconds


def _xdist_worker(config) -> tuple[int, int]:
    workerinput = getattr(config, "workerinput", None)  # set on a pytest-xdist worker
    if not workerinput:
        return 1, 0
    return (int(workerinput.get("workercount", 1)),
            int(str(workerinput.get("workerid", "gw0")).removeprefix("gw") or 0))


# The options under which a run is gated, A/B-compared or kept as a baseline (as said, as pytest keys them): what a
# quick run may not be, and where the attribution is taken to explain a verdict.
GATED_OR_KEPT = (("--trainbench-compare-fail", "--trainbench-compare-fail"), ("--trainbench-ab", "--trainbench-ab"),
                 ("--benchmark-save", "benchmark_save"), ("--benchmark-autosave", "benchmark_autosave"))


def _quick(config) -> bool:
    """--trainbench-quick, refused where what it skips would be compared or kept as a baseline."""
    if not config.getoption("--trainbench-quick"):
        return False
    for option, key in GATED_OR_KEPT:
        if config.getoption(key, None):
            raise usage_error(f"--trainbench-quick with {option}: a quick run measures only what its budgets name, "
                              "so it can be neither gated, nor A/B-compared, nor kept as a baseline")
    return True


def least_ab_pairs() -> int:
    """The fewest ABBA pairs whose first look can claim anything (its pairs measured again while inconclusive)."""
    return least_rounds("paired", MAX_PAIRS_FACTOR)


def _ab_options(config) -> ABOptions | None:
    """--trainbench-ab's two environments, or None; options that contradict an A/B run are usage errors."""
    head = config.getoption("--trainbench-ab")
    base = config.getoption("--trainbench-ab-base")
    pairs = config.getoption("--trainbench-ab-pairs")
    base_root = config.getoption("--trainbench-ab-base-root")
    if head is None:
        if base is not None:
            raise usage_error("--trainbench-ab-base needs --trainbench-ab=PYTHON (the head)")
        if base_root is not None:
            raise usage_error("--trainbench-ab-base-root needs --trainbench-ab=PYTHON (the head)")
        if pairs is not None:  # an A/B option without an A/B run is never silently ignored
            raise usage_error(f"--trainbench-ab-pairs={pairs} needs --trainbench-ab=PYTHON (the head)")
        return None
    for option in ("benchmark_save", "benchmark_autosave", "benchmark_compare"):
        if config.getoption(option, None):
            raise usage_error(f"--{option.replace('_', '-')} with --trainbench-ab: an A/B run compares two environments "
                              "within itself and is neither saved as a baseline nor compared with one "
                              "(--trainbench-compare-json writes its verdict)")
    pairs = AB_PAIRS if pairs is None else pairs
    least = least_ab_pairs()
    if pairs < least:
        raise usage_error(f"--trainbench-ab-pairs must be >= {least} (fewer pairs cannot place a change in a 95% "
                          f"interval at the first look), got {pairs}")
    for name, python in (("--trainbench-ab", head), ("--trainbench-ab-base", base)):
        if python is not None:
            _check_python(name, python)
    if base_root is not None and not Path(base_root).is_dir():
        raise usage_error(f"--trainbench-ab-base-root={base_root}: no such folder; expected another checkout of the "
                          "project for the base side to import it from")
    return ABOptions(base or sys.executable, head, pairs, Path(base_root).resolve() if base_root else None)


def _check_python(option: str, python: str) -> None:
    """An A/B side's Python is an executable file found (a path or on PATH): a file that is not (``/etc/passwd``) is
    named as that, not as missing."""
    if shutil.which(python) is not None:
        return
    path = Path(python)
    if path.is_file() or path.is_dir():
        raise usage_error(f"{option}={shown(python)}: not an executable Python (expected a python interpreter, or a script "
                          "that execs one, with its executable bit set)")
    raise usage_error(f"{option}={shown(python)}: no such executable" + ("" if os.sep in python else " on PATH"))


def _trace_request(config):
    """--trainbench-profile-trace and its case filter, or None; a filter that does not parse is a usage error."""
    folder = config.getoption("--trainbench-profile-trace")
    expression = config.getoption("--trainbench-profile-trace-cases")
    if folder is None:
        if expression is not None:
            raise usage_error("--trainbench-profile-trace-cases needs --trainbench-profile-trace=DIR")
        return None
    from trainbench.core.method.trace import TraceRequest  # torch: only in a session that asks for traces

    if expression is None:
        return TraceRequest(Path(folder))
    # pytest's own -k grammar (and, or, not, parentheses; case-insensitive substrings of the case id).
    try:
        compiled = k_grammar.Expression.compile(expression)
    except getattr(k_grammar, "ParseError", SyntaxError) as e:  # pytest < 8.3 raised its own ParseError
        raise usage_error(f"--trainbench-profile-trace-cases={expression!r}: {e}") from None
    return TraceRequest(Path(folder), lambda case: compiled.evaluate(
        lambda name, **kwargs: not kwargs and name.lower() in case.lower()))


def _budgets_override(config) -> Path | None:
    """The one budgets file the command line or the ini names, or None (then each test file finds its own)."""
    given = config.getoption("--trainbench-budgets")
    if given:
        return Path(given)
    ini = config.getini("trainbench_budgets")
    return Path(config.rootpath) / ini if ini else None


def discover_budgets(test_path: Path, rootpath: Path) -> Path | None:
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
    """The gate's thresholds and the planted fault, checked."""
    given = config.getoption("--trainbench-compare-fail")  # each time it is given: they add up
    try:
        # an empty spec is an error, never an ungated gate; a metric in two of them is refused (parse_thresholds)
        gate = parse_thresholds(",".join(given)) if given is not None else None
        slowdown = config.getoption("--trainbench-inject-slowdown")
        slowdown = parse_fraction(slowdown, "--trainbench-inject-slowdown") if slowdown else 0.0
    except ThresholdError as e:
        raise usage_error(str(e)) from None
    alpha = config.getoption("--trainbench-compare-alpha")
    if not 0 < alpha < 1:
        raise usage_error(f"--trainbench-compare-alpha must be between 0 and 1 (a significance level, e.g. 0.05), "
                          f"got {alpha}")
    rounds = config.getoption("--trainbench-rounds")
    timed = sorted(metric for metric in gate or {} if is_timed(metric))
    # never judged: it read "3 baseline and 2 current rounds" (an A/B run is judged by its pairs, not these rounds);
    # asked only where a timed gate is (the exact null distributions load numpy, which a plain session need not)
    least = least_rounds("unpaired", planned_looks(1, _remeasure_s(config), gated=True)) if timed and not ab else 0
    if timed and not ab and rounds is not None and rounds < least:
        raise usage_error(f"--trainbench-rounds={rounds} with --trainbench-compare-fail on {', '.join(timed)}: a timed "
                          f"comparison's 95% interval cannot place a change with fewer than {least} rounds a side; "
                          f"expected --trainbench-rounds >= {least} (or gate only deterministic metrics)")
    if gate is not None and not ab and not config.getoption("benchmark_compare", None):
        raise usage_error("--trainbench-compare-fail gates a comparison, but no --benchmark-compare was given: add "
                          "--benchmark-compare (the latest saved run of this device) or --benchmark-compare=NNNN")
    leak = config.getoption("--trainbench-inject-leak-mib")
    if not 0 <= leak < float("inf"):  # nan too: it crashed in the first step
        raise usage_error(f"--trainbench-inject-leak-mib must be a finite number of MiB >= 0, got {leak}")
    if not (slowdown or leak):
        return gate, None
    from trainbench.core.setups.training import InjectedFault  # torch: only in a session that plants a fault

    return gate, InjectedFault(slowdown=slowdown, leak_mib=leak)
