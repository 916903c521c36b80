"""What a comparison concluded: each metric's comparison, and one verdict that says whether it failed.

``trainbench.compare`` (a run against a stored run) and ``trainbench.ab`` (two environments, rounds
alternating) compute their comparisons differently and hand them here; ``Verdict`` decides
failure by one rule for both, and is written as the JSON ``--trainbench-compare-json`` reads
back (``Verdict.to_json``) and printed as a table or as Markdown.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from .metrics import METRICS
from .render import Column, Table, change, interval, listed, number

# Every verdict a comparison can have, in the order the counts list them.
OUTCOMES = ("regressed", "inconclusive", "improved", "unchanged", "missing")
# The exit status of a gated session whose only failures are comparisons it could not judge (pytest's own codes end
# at 5): CI shows the job failed, and a script can tell "could not judge" from "regressed" (1).
EXIT_COULD_NOT_JUDGE = 6


def is_worse(change: float, higher_is_better: bool) -> bool:
    """Whether a signed relative change (+ = a larger value) goes the metric's worse way."""
    return (change < 0) == higher_is_better


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
    # A regressed or improved verdict's "where": the attribution rows that account for the change
    # (``trainbench.explain.explanation``), a line each
    explanation: tuple[str, ...] = ()

    @property
    def unit(self) -> str:
        return METRICS[self.metric].unit

    def fails(self, allow_inconclusive: bool = False) -> bool:
        """Whether this comparison fails a gate: a regression, a metric measured on one side only (nothing was
        compared), and a timed verdict the rounds could not support (unless ``allow_inconclusive``: reported only)."""
        return self.verdict in ("regressed", "missing") or (self.verdict == "inconclusive" and not allow_inconclusive)

    def describe(self) -> str:
        """One line: case, metric, baseline, current, change, statistics, verdict."""
        if self.verdict == "missing":
            side = "the baseline run" if self.baseline is None else "this run"
            return (f"{self.case} {self.metric}: " + (self.reason or f"not measured in {side}") + f" (baseline "
                    f"{number(self.baseline)}, now {number(self.current)}): nothing to compare")
        stats = f", 95% CI {interval(self.ci)}, p={self.p_value:.3g}" if self.ci is not None else ""
        return (f"{self.case} {self.metric}: {number(self.baseline)} -> {number(self.current)} {self.unit} "
                f"({change(self.change)}{stats}) {self.verdict} (threshold {self.threshold:.1%})"
                + (f": {self.reason}" if self.reason else ""))

    def to_json(self) -> dict:
        return {**asdict(self), "ci": list(self.ci) if self.ci else None, "explanation": list(self.explanation),
                "unit": self.unit, "line": self.describe()}

    def explained(self, baseline: dict | None, current: dict | None, paired: bool = False,
                  rounds_s: tuple[list[float], list[float]] | None = None) -> MetricComparison:
        """This comparison with its "where" (a regressed or improved verdict only) from both sides' attribution
        tables (``trainbench.attribution``; ``paired``: their profiled steps alternated, and ``rounds_s``, both
        sides' round step times, their rounds)."""
        if self.verdict not in ("regressed", "improved"):
            return self
        from .explain import explanation

        # A timed metric's regression is a slower step, its improvement a faster one: the profiled steps must agree.
        slower = (self.verdict == "regressed") if METRICS[self.metric].timed else None
        return replace(self, explanation=explanation(self.metric, baseline, current, paired, slower, rounds_s))


@dataclass(frozen=True)
class Verdict:
    """A comparison's outcome: what it compared with, every metric's comparison, and whether it failed."""

    baseline: str  # the stored run compared with, or "A/B: base vs head"
    device: dict  # this run's device identity
    comparisons: tuple[MetricComparison, ...]
    gated: bool  # thresholds were given (--trainbench-compare-fail): without them nothing but an error fails
    allow_inconclusive: bool = False  # an inconclusive timed verdict is reported, not failed (an explicit opt-out)
    new_cases: tuple[str, ...] = ()  # cases the baseline run lacks
    new_cases_allowed: bool = False
    errors: tuple[str, ...] = ()  # baseline cases that could not be read
    not_run: tuple[str, ...] = ()  # baseline cases this session did not run (deselected, skipped): not compared
    nothing_compared: str | None = None  # why no metric was compared (every case skipped): fails a gate
    # The software that differs between the compared runs (``environment.environment_differences``): said, not refused,
    # since a change may be the update's rather than the code's.
    environment: tuple[str, ...] = ()
    # A/B only: both environments' identities, each case's (base, head) step seconds per pair, and each case's
    # loss comparison between the sides.
    sides: dict | None = None
    pairs: dict | None = None
    numerics: dict | None = None
    not_measured: tuple[str, ...] = ()  # metrics the thresholds name that neither side measured on this device

    @property
    def counts(self) -> dict[str, int]:
        return {outcome: sum(c.verdict == outcome for c in self.comparisons) for outcome in OUTCOMES}

    @property
    def failed(self) -> bool:
        """The one rule: an unreadable baseline fails; under a gate, so does a comparison of nothing, any failing
        comparison (``MetricComparison.fails``) and a case the baseline lacks, unless new cases are allowed."""
        if self.errors or (self.gated and self.nothing_compared):
            return True
        unchecked = bool(self.new_cases) and not self.new_cases_allowed
        return self.gated and (unchecked or any(c.fails(self.allow_inconclusive) for c in self.comparisons))

    @property
    def could_not_judge(self) -> bool:
        """It failed only because timed comparisons stayed inconclusive: nothing regressed, nothing was left
        unchecked, and nothing was shown to be fine either (``EXIT_COULD_NOT_JUDGE``)."""
        if not self.failed or self.errors or self.nothing_compared or (self.new_cases and not self.new_cases_allowed):
            return False
        return not any(c.fails(allow_inconclusive=True) for c in self.comparisons)

    @property
    def exit_status(self) -> int:
        """0 passed, 1 failed (a regression, a metric or case left unchecked, an unreadable baseline),
        ``EXIT_COULD_NOT_JUDGE`` could not judge."""
        return EXIT_COULD_NOT_JUDGE if self.could_not_judge else int(self.failed)

    def last_line(self, exit_status: int) -> str:
        """The session's closing line, after pytest's own count of passed tests: what the gate decided, and the
        session's exit status, so a log read from its end never reads green where the gate failed."""
        said = ", ".join(f"{n} {outcome}" for outcome, n in self.counts.items() if n)
        reasons = [said] if said else []
        if self.errors:
            reasons.append(f"{len(self.errors)} unreadable in the baseline")
        if self.nothing_compared:
            reasons.append(f"nothing compared: {self.nothing_compared}")
        if self.new_cases and not self.new_cases_allowed:
            reasons.append(f"{len(self.new_cases)} not in the baseline")
        outcome = ("COULD NOT JUDGE" if self.could_not_judge else "FAILED" if self.failed else
                   "passed" if self.gated else "not gated")
        what = "A/B" if self.sides is not None else "gate"
        return f"trainbench {what}: {outcome}" + (f", {'; '.join(reasons)}" if reasons else "") + f" (exit {exit_status})"

    def to_json(self) -> dict:
        """The machine-readable verdict (for CI: a PR comment, a dashboard)."""
        ab = {} if self.sides is None else {"ab": self.sides, "pairs": self.pairs or {}, "numerics": self.numerics or {}}
        return {"baseline": self.baseline, "device": self.device, "counts": self.counts, "failed": self.failed,
                "could_not_judge": self.could_not_judge, "comparisons": [c.to_json() for c in self.comparisons], **ab,
                "gated": self.gated,
                "new_cases": list(self.new_cases), "new_cases_allowed": self.new_cases_allowed,
                "errors": list(self.errors), "allow_inconclusive": self.allow_inconclusive,
                "not_run": list(self.not_run), "nothing_compared": self.nothing_compared,
                "environment_differs": list(self.environment), "not_measured": list(self.not_measured)}


# -- printing a verdict ----------------------------------------------------------------------------

_COLUMNS = (Column("case", left=True), Column("metric", left=True), Column("baseline"), Column("current"),
            Column("change"), Column("95% CI"), Column("verdict", left=True))


def _table(comparisons: list[dict]) -> Table:
    """A comparison per row, from its JSON form (``MetricComparison.to_json``, or a verdict file's)."""
    return Table(_COLUMNS, tuple((c["case"], c["metric"], number(c.get("baseline")), number(c.get("current")),
                                  change(c.get("change")), interval(c.get("ci")), c["verdict"]) for c in comparisons))


ENVIRONMENT_LISTED = 10  # differences the environment line names (a CUDA upgrade moves a dozen packages)


def environment_line(differences) -> str:
    """The line that says which software differs between the compared runs (the verdict JSON lists them all)."""
    return ("environment differs from the baseline: " + listed(differences, ENVIRONMENT_LISTED, "; ")
            + " (a change may come from these rather than the code)")


def not_measured_line(metrics) -> str:
    """The one line for thresholds on metrics neither side measured (this device cannot): not compared, not failed."""
    return f"not measured here (neither side), not compared: {', '.join(metrics)}"


ENVIRONMENT_SHOWN = 3  # differences named under each changed verdict (the header names ENVIRONMENT_LISTED, the JSON all)


def where_lines(comparison: dict, environment) -> list[str]:
    """The lines under a regressed or improved comparison (its JSON form): what accounts for it, and the software
    that differs between the sides (a likely cause too)."""
    lines = list(comparison.get("explanation") or [])
    if lines and environment:
        lines.append("environment: " + listed(environment, ENVIRONMENT_SHOWN, "; "))
    return lines


def verdict_table(comparisons: list[MetricComparison] | tuple[MetricComparison, ...]) -> list[str]:
    """A fixed-width table: case, metric, baseline, current, change, interval, verdict."""
    return _table([c.to_json() for c in comparisons]).terminal()


def verdict_markdown(verdict: dict, heading: str | None = None) -> str:
    """A verdict's JSON (``Verdict.to_json``, as read from its file) as Markdown (a CI job summary, a PR comment):
    the outcome and counts, a table of every comparison that is not "unchanged", and the whole table folded away.
    ``heading``: the first line, where the verdict is not a gate's (two saved runs explained)."""
    counts = verdict.get("counts") or {}
    outcome = ("COULD NOT JUDGE" if verdict.get("could_not_judge") else "FAILED" if verdict.get("failed")
               else "passed" if verdict.get("gated") else "not gated")
    lines = [heading or f"### trainbench gate {outcome}: vs `{verdict.get('baseline')}`", "",
             ", ".join(f"{n} {v}" for v, n in counts.items() if n) or "nothing compared", ""]
    lines += [f"- **FAIL** {case}: not in the baseline run" for case in verdict.get("new_cases") or []
              if verdict.get("gated") and not verdict.get("new_cases_allowed")]
    lines += [f"- **ERROR** {error}" for error in verdict.get("errors") or []]
    if verdict.get("environment_differs"):
        lines.append("- " + environment_line(verdict["environment_differs"]))
    if verdict.get("not_measured"):
        lines.append(f"- {not_measured_line(verdict['not_measured'])}")
    not_run = verdict.get("not_run") or []
    if not_run:
        lines.append(f"- not compared: {len(not_run)} case(s) of the baseline this run did not run: "
                     + ", ".join(not_run[:10]) + (", ..." if len(not_run) > 10 else ""))
    comparisons = verdict.get("comparisons") or []
    notable = [c for c in comparisons if c.get("verdict") != "unchanged"]
    if notable:
        lines += [""] + _table(notable).markdown()
    explained = [c for c in notable if c.get("explanation")]
    if explained:
        lines += ["", "**Where**", ""]
        for c in explained:
            lines.append(f"- `{c['case']}` {c['metric']} {c['verdict']} ({change(c.get('change'))}):")
            lines += [f"  - {line}" for line in where_lines(c, verdict.get("environment_differs") or [])]
    if comparisons:
        lines += ["", f"<details><summary>all {len(comparisons)} comparisons</summary>", ""]
        lines += _table(comparisons).markdown() + ["", "</details>"]
    return "\n".join(lines) + "\n"
