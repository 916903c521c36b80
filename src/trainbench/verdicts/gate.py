"""What a comparison concluded: each metric's comparison, and one verdict that says whether it failed.

``trainbench.verdicts.compare`` (a run against a stored run) and ``trainbench.jobs.ab`` (two environments, rounds
alternating) compute their comparisons differently and hand them here; ``Verdict`` decides
failure by one rule for both, and is written as the JSON ``--trainbench-compare-json`` reads
back (``Verdict.to_json``), which ``trainbench.verdicts.present`` prints in the terminal or as Markdown.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from trainbench.core.records.metrics import METRICS
from trainbench.core.records.stats import ALPHA_SIDE, level
from trainbench.verdicts.explain import explained
from trainbench.verdicts.render import change, interval, number

# Every verdict a comparison can have, in the order the counts list them.
OUTCOMES = ("regressed", "inconclusive", "improved", "unchanged", "missing")
# The exit status of a gated session whose only failures are comparisons it could not judge (pytest's own codes end
# at 5): CI shows the job failed, and a script can tell "could not judge" from "regressed" (1).
EXIT_COULD_NOT_JUDGE = 6


def fails_gate(outcome: str, allow_inconclusive: bool = False) -> bool:
    """Whether a comparison of this outcome fails a gate: a regression, a metric measured on one side only (nothing
    was compared), and a timed verdict the rounds could not support (unless ``allow_inconclusive``: reported only)."""
    return outcome in ("regressed", "missing") or (outcome == "inconclusive" and not allow_inconclusive)


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
    ci: tuple[float, float] | None = None  # the exact interval of current / baseline (``stats.change_interval``)
    reason: str | None = None  # why inconclusive
    # A regressed or improved verdict's "where": the attribution rows that account for the change
    # (``trainbench.verdicts.explain.explanation``), a line each, and those rows (``Cause.to_json``), by which the
    # report groups the changes that one cause made
    explanation: tuple[str, ...] = ()
    causes: tuple[dict, ...] = ()
    ci_level: str = level(ALPHA_SIDE)  # the interval's confidence ("95%"): higher at a later look (``stats.level``)

    @property
    def unit(self) -> str:
        return METRICS[self.metric].unit

    def fails(self, allow_inconclusive: bool = False) -> bool:
        """Whether this comparison fails a gate (``fails_gate``)."""
        return fails_gate(self.verdict, allow_inconclusive)

    def describe(self) -> str:
        """One line: case, metric, baseline, current, change, statistics, verdict."""
        if self.verdict == "missing":
            side = "the baseline run" if self.baseline is None else "this run"
            return (f"{self.case} {self.metric}: " + (self.reason or f"not measured in {side}") + f" (baseline "
                    f"{number(self.baseline)}, now {number(self.current)}): nothing to compare")
        stats = f", {self.ci_level} CI {interval(self.ci)}, p={self.p_value:.3g}" if self.ci is not None else ""
        return (f"{self.case} {self.metric}: {number(self.baseline)} -> {number(self.current)} {self.unit} "
                f"({change(self.change)}{stats}) {self.verdict} (threshold {self.threshold:.1%})"
                + (f": {self.reason}" if self.reason else ""))

    def to_json(self) -> dict:
        return {**asdict(self), "ci": list(self.ci) if self.ci else None, "explanation": list(self.explanation),
                "causes": [dict(c) for c in self.causes],
                "unit": self.unit, "line": self.describe()}

    def explained(self, baseline: dict | None, current: dict | None, paired: bool = False,
                  rounds_s: tuple[list[float], list[float]] | None = None) -> MetricComparison:
        """This comparison with its "where" (a regressed or improved verdict only) from both sides' attribution
        tables (``trainbench.core.analyses.attribution``; ``paired``: their profiled steps alternated, and ``rounds_s``, both
        sides' round step times, their rounds)."""
        if self.verdict not in ("regressed", "improved"):
            return self
        # A timed metric's regression is a slower step, its improvement a faster one: the profiled steps must agree.
        slower = (self.verdict == "regressed") if METRICS[self.metric].timed else None
        lines, found = explained(self.metric, baseline, current, paired, slower, rounds_s)
        return replace(self, explanation=lines, causes=tuple(cause.to_json() for cause in found))


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

    def to_json(self) -> dict:
        """The machine-readable verdict (for CI: a PR comment, a dashboard)."""
        ab = {} if self.sides is None else {"ab": self.sides, "pairs": self.pairs or {}, "numerics": self.numerics or {}}
        said = {"failed": self.failed, "could_not_judge": self.could_not_judge, "gated": self.gated}
        # decision: the gate's, one of failed, could_not_judge, passed, not_gated; could_not_judge is true only where
        # that decision is it (a FAILED gate may hold inconclusive comparisons too: counts["inconclusive"])
        return {"baseline": self.baseline, "device": self.device, "counts": self.counts, "decision": decision(said),
                "failed": self.failed, "could_not_judge": self.could_not_judge,
                "comparisons": [c.to_json() for c in self.comparisons], **ab,
                "gated": self.gated,
                "new_cases": list(self.new_cases), "new_cases_allowed": self.new_cases_allowed,
                "errors": list(self.errors), "allow_inconclusive": self.allow_inconclusive,
                "not_run": list(self.not_run), "nothing_compared": self.nothing_compared,
                "environment_differs": list(self.environment), "not_measured": list(self.not_measured)}


DECISIONS = ("failed", "could_not_judge", "passed", "not_gated")


def decision(verdict: dict) -> str:
    """The gate's decision, one of failed, could_not_judge, passed, not_gated (the verdict JSON's ``decision``), from
    its ``failed``, ``could_not_judge`` and ``gated``."""
    return ("could_not_judge" if verdict.get("could_not_judge") else "failed" if verdict.get("failed")
            else "passed" if verdict.get("gated") else "not_gated")


class VerdictFileError(ValueError):
    """A verdict file (``--trainbench-compare-json``'s) that cannot be read as one; the message names the field."""


def _number_or_null(value) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value))


def _strings(value) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


# Each field of a comparison in a verdict file, and what it must be (``MetricComparison.to_json``).
_COMPARISON_FIELDS = (
    ("case", lambda v: isinstance(v, str), "a case id"),
    ("metric", lambda v: v in METRICS, "a trainbench metric"),
    ("verdict", lambda v: v in OUTCOMES, f"one of {', '.join(OUTCOMES)}"),
    ("baseline", _number_or_null, "a number or null"), ("current", _number_or_null, "a number or null"),
    ("change", _number_or_null, "a number or null"), ("p_value", _number_or_null, "a number or null"),
    ("threshold", lambda v: _number_or_null(v) and v is not None and v >= 0, "a number >= 0"),
    ("ci", lambda v: v is None or (isinstance(v, list) and len(v) == 2 and all(map(_number_or_null, v))),
     "[low, high] or null"),
    ("reason", lambda v: v is None or isinstance(v, str), "text or null"),
    ("line", lambda v: v is None or isinstance(v, str), "text or null"),
    ("explanation", lambda v: v is None or _strings(v), "a list of lines or null"),
    ("causes", lambda v: v is None or (isinstance(v, list) and all(
        isinstance(c, dict) and isinstance(c.get("table"), str) and isinstance(c.get("row"), str)
        and _number_or_null(c.get("change")) and _number_or_null(c.get("share")) for c in v)),
     "a list of causes (table, row, change, share) or null"),
)
# The verdict's own fields (``Verdict.to_json``): absent ones are read as a verdict without them.
_VERDICT_FIELDS = (
    ("failed", lambda v: isinstance(v, bool), "true or false"),
    ("could_not_judge", lambda v: v is None or isinstance(v, bool), "true, false or null"),
    ("decision", lambda v: v is None or v in DECISIONS, "one of " + ", ".join(DECISIONS)),
    ("gated", lambda v: v is None or isinstance(v, bool), "true, false or null"),
    ("allow_inconclusive", lambda v: v is None or isinstance(v, bool), "true, false or null"),
    ("new_cases_allowed", lambda v: v is None or isinstance(v, bool), "true, false or null"),
    ("baseline", lambda v: v is None or isinstance(v, str), "a path or null"),
    ("nothing_compared", lambda v: v is None or isinstance(v, str), "text or null"),
    ("counts", lambda v: v is None or (isinstance(v, dict) and all(isinstance(n, int) for n in v.values())),
     "outcome -> count"),
    *((key, lambda v: v is None or _strings(v), "a list of text")
      for key in ("new_cases", "errors", "not_run", "environment_differs", "not_measured")),
    ("numerics", lambda v: v is None or (isinstance(v, dict) and all(isinstance(g, dict) for g in v.values())),
     "case -> guard (a dict)"),
)


def read_verdict(data: object, where: str) -> dict:
    """A verdict file's contents checked whole: every field of the type ``Verdict.to_json`` writes, and its decision
    (failed, could not judge, the counts) the one rule's for its comparisons: a file that says passed beside a
    regression is refused, never shown as passed. Raises ``VerdictFileError`` naming ``where`` and the field."""
    if not isinstance(data, dict) or not isinstance(data.get("comparisons"), list):
        raise VerdictFileError(f"{where}: no comparisons list; expected the file --trainbench-compare-json writes")
    for key, ok, expected in _VERDICT_FIELDS:
        if (key in data or key == "failed") and not ok(data.get(key)):
            raise VerdictFileError(f"{where}: {key} = {data.get(key)!r}: expected {expected}")
    comparisons = []
    for index, c in enumerate(data["comparisons"]):
        if not isinstance(c, dict):
            raise VerdictFileError(f"{where}: comparisons[{index}] = {c!r}: expected a comparison (a dict)")
        for key, ok, expected in _COMPARISON_FIELDS:
            if (key in c or key in ("case", "metric", "verdict")) and not ok(c.get(key)):
                raise VerdictFileError(f"{where}: comparisons[{index}].{key} = {c.get(key)!r}: expected {expected}")
        comparisons.append(MetricComparison(c["case"], c["metric"], None, None, None, 0.0, c["verdict"]))
    rule = Verdict(str(data.get("baseline")), {}, tuple(comparisons), gated=bool(data.get("gated")),
                   allow_inconclusive=bool(data.get("allow_inconclusive")),
                   new_cases=tuple(data.get("new_cases") or ()), new_cases_allowed=bool(data.get("new_cases_allowed")),
                   errors=tuple(data.get("errors") or ()), nothing_compared=data.get("nothing_compared"))
    said = {"failed": data["failed"], "could_not_judge": data.get("could_not_judge", rule.could_not_judge),
            "counts": data.get("counts", rule.counts)}
    ruled = decision({"failed": rule.failed, "could_not_judge": rule.could_not_judge, "gated": rule.gated})
    said["decision"] = data.get("decision") or ruled  # a file written before verdicts named their decision: the rule's
    for key, value in (("failed", rule.failed), ("could_not_judge", rule.could_not_judge), ("counts", rule.counts),
                       ("decision", ruled)):
        if said[key] != value and not (key == "counts" and {k: n for k, n in said[key].items() if n} ==
                                       {k: n for k, n in value.items() if n}):
            raise VerdictFileError(f"{where}: {key} = {said[key]!r} beside its comparisons, which give {value!r} by "
                                   "the gate's rule: an edited or inconsistent verdict file, never read as passed")
    return data
