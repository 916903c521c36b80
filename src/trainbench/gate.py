"""What a comparison concluded: each metric's comparison, and one verdict that says whether it failed.

``trainbench.compare`` (a run against a stored run) and ``trainbench.ab`` (two environments, rounds
alternating) compute their comparisons differently and hand them here; ``Verdict`` decides
failure by one rule for both, and is written as the JSON ``--trainbench-compare-json`` reads
back (``Verdict.to_json``) and printed as a table or as Markdown.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .metrics import METRICS
from .render import Column, Table, change, interval, number

# Every verdict a comparison can have, in the order the counts list them.
OUTCOMES = ("regressed", "inconclusive", "improved", "unchanged", "missing")


@dataclass(frozen=True)
class MetricComparison:
    case: str
    metric: str
    baseline: float | None
    current: float | None
    change: float | None  # relative change, signed as measured (+ = larger value)
    threshold: float
    verdict: str  # one of OUTCOMES
    p_value: float | None = None  # one-sided test in the direction of the change
    ci: tuple[float, float] | None = None  # 95% bootstrap interval of current / baseline
    reason: str | None = None  # why inconclusive

    @property
    def unit(self) -> str:
        return METRICS[self.metric].unit

    def fails(self, strict: bool) -> bool:
        """Whether this comparison fails a gate: a regression, a metric measured on one side only (nothing was
        compared), and under ``strict`` a timed verdict the rounds could not support."""
        return self.verdict in ("regressed", "missing") or (strict and self.verdict == "inconclusive")

    def describe(self) -> str:
        """One line: case, metric, baseline, current, change, statistics, verdict."""
        if self.verdict == "missing":
            side = "the baseline run" if self.baseline is None else "this run"
            return (f"{self.case} {self.metric}: not measured in {side} (baseline {number(self.baseline)}, now "
                    f"{number(self.current)}): nothing to compare")
        stats = f", 95% CI {interval(self.ci)}, p={self.p_value:.3g}" if self.ci is not None else ""
        return (f"{self.case} {self.metric}: {number(self.baseline)} -> {number(self.current)} {self.unit} "
                f"({change(self.change)}{stats}) {self.verdict} (threshold {self.threshold:.1%})"
                + (f": {self.reason}" if self.reason else ""))

    def to_json(self) -> dict:
        return {**asdict(self), "ci": list(self.ci) if self.ci else None, "unit": self.unit, "line": self.describe()}


@dataclass(frozen=True)
class Verdict:
    """A comparison's outcome: what it compared with, every metric's comparison, and whether it failed."""

    baseline: str  # the stored run compared with, or "A/B: base vs head"
    device: dict  # this run's device identity
    comparisons: tuple[MetricComparison, ...]
    gated: bool  # thresholds were given (--trainbench-compare-fail): without them nothing but an error fails
    strict: bool = False  # an inconclusive timed verdict fails too
    new_cases: tuple[str, ...] = ()  # cases the baseline run lacks
    new_cases_allowed: bool = False
    errors: tuple[str, ...] = ()  # baseline cases that could not be read
    # A/B only: both environments' identities, each case's (base, head) step seconds per pair, and each case's
    # loss comparison between the sides.
    sides: dict | None = None
    pairs: dict | None = None
    numerics: dict | None = None

    @property
    def counts(self) -> dict[str, int]:
        return {outcome: sum(c.verdict == outcome for c in self.comparisons) for outcome in OUTCOMES}

    @property
    def failed(self) -> bool:
        """The one rule: an unreadable baseline fails; under a gate, so does any failing comparison
        (``MetricComparison.fails``) and a case the baseline lacks, unless new cases are allowed."""
        if self.errors:
            return True
        unchecked = bool(self.new_cases) and not self.new_cases_allowed
        return self.gated and (unchecked or any(c.fails(self.strict) for c in self.comparisons))

    def to_json(self) -> dict:
        """The machine-readable verdict (for CI: a PR comment, a dashboard)."""
        ab = {} if self.sides is None else {"ab": self.sides, "pairs": self.pairs or {}, "numerics": self.numerics or {}}
        return {"baseline": self.baseline, "device": self.device, "counts": self.counts, "failed": self.failed,
                "comparisons": [c.to_json() for c in self.comparisons], **ab, "gated": self.gated,
                "new_cases": list(self.new_cases), "new_cases_allowed": self.new_cases_allowed,
                "errors": list(self.errors), "strict": self.strict}


# -- printing a verdict ----------------------------------------------------------------------------

_COLUMNS = (Column("case", left=True), Column("metric", left=True), Column("baseline"), Column("current"),
            Column("change"), Column("95% CI"), Column("verdict", left=True))


def _table(comparisons: list[dict]) -> Table:
    """A comparison per row, from its JSON form (``MetricComparison.to_json``, or a verdict file's)."""
    return Table(_COLUMNS, tuple((c["case"], c["metric"], number(c.get("baseline")), number(c.get("current")),
                                  change(c.get("change")), interval(c.get("ci")), c["verdict"]) for c in comparisons))


def verdict_table(comparisons: list[MetricComparison] | tuple[MetricComparison, ...]) -> list[str]:
    """A fixed-width table: case, metric, baseline, current, change, interval, verdict."""
    return _table([c.to_json() for c in comparisons]).terminal()


def verdict_markdown(verdict: dict) -> str:
    """A verdict's JSON (``Verdict.to_json``, as read from its file) as Markdown (a CI job summary, a PR comment):
    the outcome and counts, a table of every comparison that is not "unchanged", and the whole table folded away."""
    counts = verdict.get("counts") or {}
    outcome = "FAILED" if verdict.get("failed") else "passed" if verdict.get("gated") else "not gated"
    lines = [f"### trainbench gate {outcome}: vs `{verdict.get('baseline')}`", "",
             ", ".join(f"{n} {v}" for v, n in counts.items() if n) or "nothing compared", ""]
    lines += [f"- **FAIL** {case}: not in the baseline run" for case in verdict.get("new_cases") or []
              if verdict.get("gated") and not verdict.get("new_cases_allowed")]
    lines += [f"- **ERROR** {error}" for error in verdict.get("errors") or []]
    comparisons = verdict.get("comparisons") or []
    notable = [c for c in comparisons if c.get("verdict") != "unchanged"]
    if notable:
        lines += [""] + _table(notable).markdown()
    if comparisons:
        lines += ["", f"<details><summary>all {len(comparisons)} comparisons</summary>", ""]
        lines += _table(comparisons).markdown() + ["", "</details>"]
    return "\n".join(lines) + "\n"
