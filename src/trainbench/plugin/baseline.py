"""The run a session compares with: chosen at start-up (``store.choose_baseline``), and refused where it can never
be a baseline or was measured on another device or with other settings."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from trainbench.plugin import benchmark_adapter
from trainbench.plugin.options import Options, usage_error
from trainbench.verdicts.store import (
    Baseline, NoBaselineError, SavedRun, UnusableBaselineError, choose_baseline, describe_device, unusable_as_baseline,
    why_no_baseline)

# Settings recorded with a run's device identity that change what is measured as much as the device does.
SETUP_KEYS = ("cpu_threads", "float32_matmul_precision", "cuda_matmul_allow_tf32", "cudnn_allow_tf32")


@dataclass(frozen=True)
class BaselineChoice:
    """The run chosen to compare with and why (None: pytest-benchmark's choice), or why the run to compare with
    cannot be used (``unusable``: it stops a session with trainbench cases at collection)."""

    baseline: Baseline | None = None
    unusable: str | None = None


def choose(options: Options, config, device_here: Callable[[], tuple]) -> BaselineChoice:
    """Runs before pytest-benchmark's own (trylast) configure, which loads the run to compare with. A run that
    cannot be used stops a gated session now, and any other at collection if it has trainbench cases (a plain
    pytest-benchmark session is left to pytest-benchmark's own warning)."""
    gated = options.compare_fail is not None
    try:
        baseline = choose_baseline(options.benchmark.storage, options.benchmark.compare, device_here, gated=gated)
    except UnusableBaselineError as e:
        if gated:
            raise usage_error(f"--trainbench-compare-fail: no baseline run to compare with: {e}") from None
        return BaselineChoice(unusable=f"--benchmark-compare: {e}")
    except NoBaselineError as e:
        if gated:
            raise usage_error(f"--trainbench-compare-fail: {e}") from None
        return BaselineChoice()
    if baseline is not None:
        benchmark_adapter.compare_with(config, baseline.path)
    return BaselineChoice(baseline)


def check_loaded(options: Options, config, ab: bool) -> None:
    """A gated comparison with no baseline pytest-benchmark could load stops before any case runs: pytest-benchmark
    only warns ("Can't compare", "Failed to load") and the gate would pass unchecked."""
    compare = benchmark_adapter.compare_requested(config)
    if options.compare_fail is None or not compare or ab or benchmark_adapter.loaded_baseline(config) is not None:
        return
    raise usage_error("--trainbench-compare-fail: no baseline run to compare with: "
                      + why_no_baseline(options.benchmark.storage, compare))


def refusal(options: Options, compared: SavedRun) -> str | None:
    """Why a run pytest-benchmark loaded can never be a baseline (``store.unusable_as_baseline``: its own choice is
    not checked before, e.g. a run whose device or interrupted mark only its records hold), or None. It stops a
    gated session now, any other with trainbench cases at collection, as ``choose`` does."""
    problem = unusable_as_baseline(compared)
    if problem is None:
        return None
    if options.compare_fail is not None:
        raise usage_error(f"--trainbench-compare-fail: no baseline run to compare with: {problem}")
    return f"--benchmark-compare: {problem}"


def device_record(options: Options, compared: SavedRun, identity: Callable[[], dict],
                  device_here: Callable[[], tuple]) -> dict | None:
    """This session's device record for pytest-benchmark's machine-info check of a compared trainbench run (None:
    the compared run has none, and pytest-benchmark compares as without trainbench); a run of another device or
    setup is refused (``check_same_device``)."""
    theirs = compared.comparable
    if theirs is None:
        return None
    mine = identity()
    check_same_device(options, compared.device, theirs, device_here(), mine)
    # The doctor's record tells how this run's machine was set up (free /dev/shm, warnings), not which device it is:
    # the compared run's own record stands in, so pytest-benchmark compares device identities only.
    return {**mine, "doctor": compared.doctor}


def check_same_device(options: Options, stored: dict, theirs: tuple, mine: tuple, identity: dict) -> None:
    """Refuse to compare trainbench runs of different devices (``theirs``, ``mine``) or setups (the compared run's
    device record ``stored``, this session's ``identity``): their numbers say nothing about each other."""
    if options.allow_cross_device:
        return
    if mine != theirs:
        raise usage_error(
            f"--benchmark-compare would compare this {describe_device(mine)} with {describe_device(theirs)}; "
            "numbers from different devices are not comparable. Compare with a run of this device "
            "(a bare --benchmark-compare picks the latest one), or pass --trainbench-allow-cross-device.")
    differ = [f"{key} {stored[key]!r} there, {value!r} here" for key, value in identity.items()
              if key in SETUP_KEYS and key in stored and stored[key] != value]
    if differ:
        raise usage_error(
            "--benchmark-compare would compare runs made with other settings (" + "; ".join(differ)
            + "): thread counts and float precision change every number (e.g. OMP_NUM_THREADS=1 halves CPU "
            "throughput). Rerun with the baseline's settings, or pass --trainbench-allow-cross-device.")
