"""What a session keeps of the cases it ran: each finished case's record for the summary, the gate and the saved run,
in the order they ended."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from trainbench.core.harness.costs import TOTAL, cost_forecast
from trainbench.core.records.result import CaseRecord, MeasuredCase


@dataclass(frozen=True)
class RecordedCase:
    """What a session keeps of one finished case: its record as the summary and the gate read it (None: it ended
    without a result, ``error`` says why), and what the summary lists beside the table."""

    case: str
    fullname: str  # pytest-benchmark's key of the case in a saved run
    measured: MeasuredCase | None = None
    error: str | None = None
    trace: dict | None = None  # what its trace request gave
    attribution: dict | None = None  # its complete attribution tables (--trainbench-attribution-json)
    inconclusive: tuple[str, ...] = ()  # timed budgets the rounds could not judge


@dataclass
class RecordedCases:
    """Every finished case of the session, in order; each kept once and never changed."""

    recorded: list[RecordedCase] = field(default_factory=list)

    def record(self, outcome, fullname: str, thresholds_of: Callable[[str], dict]) -> dict | None:
        """Keep a finished case (a ``CaseOutcome``, not skipped; ``thresholds_of(case)``: its budgets' comparison
        thresholds); its record (what the saved run keeps of it), or None where it ended without a result."""
        if outcome.error is not None:
            self.recorded.append(RecordedCase(outcome.case, fullname, error=outcome.error))
            return None
        record = outcome.record()
        measured = MeasuredCase(CaseRecord.read(record, outcome.case, fullname), fullname,
                                thresholds_of(outcome.case))
        self.recorded.append(RecordedCase(outcome.case, fullname, measured, trace=outcome.trace,
                                          attribution=outcome.result.attribution or None,
                                          inconclusive=tuple(outcome.inconclusive)))
        return record

    def forecast(self, outcome, collected: int) -> str | None:
        """After the first measured case of a long session, what the rest will cost at its pace
        (``costs.cost_forecast``); None otherwise."""
        if len(self.recorded) != 1 or outcome.result is None:
            return None
        return cost_forecast(outcome.case, outcome.result.phase_seconds.get(TOTAL, 0.0), collected - 1)

    @property
    def cases(self) -> list[MeasuredCase]:
        """The ``MeasuredCase`` of each case that has a result, for the summary and the gate."""
        return [r.measured for r in self.recorded if r.measured is not None]

    @property
    def failed_cases(self) -> list[dict]:
        """The cases that ended without a result (out of memory, a hang), as the saved run lists them."""
        return [{"case": r.case, "fullname": r.fullname, "error": r.error} for r in self.recorded if r.error is not None]

    @property
    def traces(self) -> list[tuple[str, dict]]:
        return [(r.case, r.trace) for r in self.recorded if r.trace is not None]

    @property
    def attributions(self) -> dict:
        return {r.case: r.attribution for r in self.recorded if r.attribution is not None}

    @property
    def inconclusive(self) -> list[str]:
        return [line for r in self.recorded for line in r.inconclusive]
