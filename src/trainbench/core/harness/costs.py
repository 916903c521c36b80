"""Where a case's wall time goes: the harness's phases, each timed into the running case's ledger.

A case costs more than its timed rounds: building its setups, warming up, the memory and work passes,
the correctness guard, the memory prediction, its baseline's share of all of these. ``spent(phase)``
times a stretch of the harness into the ledger ``Runner.run`` opens for the case (nothing when none is
open: asv, the rank processes); nested phases count once, in the innermost (a warm-up inside a fresh
process's setup is the warm-up's). ``PHASES`` is the table every reader takes the names and their
order from: the result's ``phase_seconds``, the summary's ``--trainbench-costs`` table, the docs.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

# phase -> what it is (the order is the summary's column order)
PHASES: dict[str, str] = {
    "setup": "building the model, optimizers and loader (TrainingSetup), a fresh process's or the ranks' start",
    "warm-up": "untimed steps until the step time is steady",
    "rounds": "the timed rounds: what the summary reports",
    "peaks": "allocator peaks over a few steps as timed",
    "calls": "the profiler's aten-call and kernel count (and each op's time with attribution on)",
    "memory": "growth per step and the tracked breakdown of the peak (dispatch modes)",
    "work": "FLOPs, ops and syncs (dispatch modes)",
    "guard": "the correctness guard: seeded setups' losses and gradients against the baseline's",
    "predict": "the GPU profile's memory predicted under FakeTensorMode",
    "trace": "the profile trace asked for by --trainbench-trace",
}
# The baseline's share of a phase is kept apart: ``baseline warm-up``, ``baseline rounds``, ...
BASELINE = "baseline "
# What no phase accounts for: planning, judging, recording, collecting garbage
OTHER = "other"
TOTAL = "total"


class Ledger:
    """Seconds by phase for one case (``phase_seconds``), each phase's own time: nested phases are subtracted."""

    def __init__(self, clock=time.perf_counter):
        self.clock = clock
        self.seconds: dict[str, float] = {}
        self._inner: list[float] = []  # per open phase: the seconds its nested phases took
        self._started = clock()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = self.clock()
        self._inner.append(0.0)
        try:
            yield
        finally:
            took = self.clock() - start
            inner = self._inner.pop()
            self.seconds[name] = self.seconds.get(name, 0.0) + took - inner
            if self._inner:
                self._inner[-1] += took

    def add_nested(self, seconds: dict[str, float]) -> None:
        """Phases timed elsewhere (a child process's ledger) that ran inside the phase open now."""
        for name, took in seconds.items():
            self.seconds[name] = self.seconds.get(name, 0.0) + took
        if self._inner:
            self._inner[-1] += sum(seconds.values())

    def move(self, seconds: float, source: str, target: str) -> None:
        """``seconds`` already timed as ``source`` counted as ``target`` instead (no more than ``source`` holds)."""
        seconds = min(seconds, self.seconds.get(source, 0.0))
        self.seconds[source] = self.seconds.get(source, 0.0) - seconds
        self.seconds[target] = self.seconds.get(target, 0.0) + seconds

    def closed(self) -> dict[str, float]:
        """The phases, what none accounts for (``other``) and the case's whole wall time (``total``)."""
        total = self.clock() - self._started
        return {**self.seconds, OTHER: max(0.0, total - sum(self.seconds.values())), TOTAL: total}


_ledger: Ledger | None = None


@contextmanager
def case_ledger(clock=time.perf_counter) -> Iterator[Ledger]:
    """The ledger of the case run inside (the outermost one wins: a re-measurement adds to its case's)."""
    global _ledger
    if _ledger is not None:
        yield _ledger
        return
    _ledger = Ledger(clock)
    try:
        yield _ledger
    finally:
        _ledger = None


@contextmanager
def spent(phase: str, baseline: bool = False) -> Iterator[None]:
    """Time what runs inside as ``phase`` of the running case (the baseline's share where ``baseline``)."""
    assert phase in PHASES, phase
    if _ledger is None:
        yield
        return
    with _ledger.phase(BASELINE + phase if baseline else phase):
        yield


def recharge(seconds: float, source: str, target: str, baseline: bool = False) -> None:
    """Move ``seconds`` already timed as ``source`` of the running case to ``target`` (a timed round found to be
    warm-up after the fact: ``measure.interleave_rounds``)."""
    assert source in PHASES and target in PHASES, (source, target)
    if _ledger is None:
        return
    prefix = BASELINE if baseline else ""
    _ledger.move(seconds, prefix + source, prefix + target)


class ChildPhases:
    """What a child process measured of its phases (its result's ``phase_seconds``), set by the caller."""
    phase_seconds: dict[str, float] | None = None


@contextmanager
def in_child_process(baseline: bool = False) -> Iterator[ChildPhases]:
    """A fresh process or rank processes measuring the case: their own phases (the caller sets
    ``child.phase_seconds``) count as such; the rest of the wait, their start and end, as ``setup``."""
    child = ChildPhases()
    if _ledger is None:
        yield child
        return
    with _ledger.phase(BASELINE + "setup" if baseline else "setup"):
        yield child
        prefix = BASELINE if baseline else ""
        _ledger.add_nested({prefix + name: took for name, took in (child.phase_seconds or {}).items()
                            if not name.startswith(BASELINE) and name in PHASES})


def timed_rounds_s(phase_seconds: dict[str, float]) -> float:
    """The seconds a case spent in timed rounds, its own and its baseline's."""
    return phase_seconds.get("rounds", 0.0) + phase_seconds.get(BASELINE + "rounds", 0.0)


def by_phase(phase_seconds: dict[str, float]) -> dict[str, float]:
    """Seconds per phase with the baseline's share added in, in the table's order, then ``other``."""
    return {name: phase_seconds.get(name, 0.0) + phase_seconds.get(BASELINE + name, 0.0)
            for name in [*PHASES, OTHER]}


# A session whose cases will take longer than this, at its first case's pace, says so after that case.
FORECAST_AFTER_S = 120.0


def cost_forecast(case: str, seconds: float, remaining: int) -> str | None:
    """After the first case of a long session: what the others will cost at its pace (None: not long)."""
    if remaining < 1 or seconds * remaining < FORECAST_AFTER_S:
        return None
    minutes = seconds * remaining / 60
    return (f"trainbench: {case} took {seconds:.0f} s; the {remaining} other case{'s' if remaining > 1 else ''} "
            f"collected will take about {minutes:.0f} min at that pace (--trainbench-costs: where it goes; "
            "--trainbench-quick: the rounds and what the budgets need only)")
