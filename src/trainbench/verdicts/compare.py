"""Compare a run with a stored baseline run of the same device: what regressed, with what confidence.

A gate is a set of thresholds, e.g. ``samples_per_s:5%,peak_memory:2%``. For each case
present in both runs and each gated metric:

- **timed metrics** read round by round (samples/s, step time, CPU time, TFLOP/s, MFU: ``metrics.per_round``)
  are compared over the rounds of both runs: the change of the medians, a one-sided Mann-Whitney U test
  that the current rounds are worse (better), and the exact interval of the ratio that test gives
  (``stats.change_interval``, at the share of the error the current run's look may spend), judged by
  ``stats.judge_change`` (the rule A/B and timed budgets use too): *unchanged* only when the interval lies inside the
  threshold, *regressed*/*improved* when it lies beyond it, the test is significant and neither run was
  measured on a busy machine (``trainbench.core.records.stats``); otherwise *inconclusive*, with the reason;
- **every other metric** (deterministic ones: memory breakdown, FLOPs, bytes, ops, syncs; allocator
  peaks; single-value timings) is compared as a value against the threshold (0% = exactly).

Verdicts: improved / unchanged / regressed / inconclusive (with its reason) / missing; whether they
fail the session is ``trainbench.verdicts.gate.Verdict``'s one rule, shared with A/B.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainbench.core.records.metrics import METRICS, TIMED, deterministic_metrics, parse_thresholds
from trainbench.core.records.result import CaseRecord, MeasuredCase, RecordError
from trainbench.core.records.stats import busy_reason, change_interval, judge_change, level, rank_tests, too_few_rounds
from trainbench.devices.environment import environment_differences
from trainbench.verdicts.explain import moved_rows
from trainbench.verdicts.gate import MetricComparison, Verdict, is_worse
from trainbench.verdicts.present import Line, Section, markdown, terminal_lines, verdict_sections
from trainbench.verdicts.render import Column, Table, listed, number
from trainbench.verdicts.store import SavedRun, describe_device

EXACT = 1e-9  # relative slack for "0%": float formatting of identical values
DEFAULT_ALPHA = 0.05


class CompareError(ValueError):
    """A malformed baseline; the message names where and what was expected (a malformed gate specification is a
    ``metrics.ThresholdError``)."""


# Shown (not gated) when --benchmark-compare runs without --trainbench-compare-fail.
DISPLAY_THRESHOLDS = parse_thresholds("samples_per_s:5%,peak_memory:2%", "display thresholds")


def compare_case(current: CaseRecord, baseline: CaseRecord, thresholds: dict[str, float],
                 alpha: float = DEFAULT_ALPHA) -> list[MetricComparison]:
    """Every gated metric either run measured (one this device never measures, e.g. CUDA kernels on a CPU, is left out)."""
    rounds_s = (baseline.round_step_times_s, current.round_step_times_s)
    return [_compare_metric(current, baseline, metric, limit, alpha).explained(baseline.attribution, current.attribution,
                                                                               rounds_s=rounds_s)
            for metric, limit in thresholds.items()
            if current.metrics.get(metric) is not None or baseline.metrics.get(metric) is not None]


def _compare_metric(current: CaseRecord, baseline: CaseRecord, metric: str, threshold: float, alpha: float) -> MetricComparison:
    cur, base = current.metrics.get(metric), baseline.metrics.get(metric)
    if cur is None or base is None:
        return MetricComparison(current.case, metric, base, cur, None, threshold, "missing")
    higher_is_better = METRICS[metric].higher_is_better
    change = (cur - base) / abs(base) if base else (0.0 if cur == base else math.copysign(math.inf, cur - base))
    if METRICS[metric].kind == TIMED:  # read round by round, judged by the interval of the change
        cur_rounds, base_rounds = current.per_round(metric), baseline.per_round(metric)
        alpha_side = current.look_alpha  # this look's share of the error (measured again: a smaller one)
        few = too_few_rounds(cur_rounds, base_rounds, False, alpha_side)
        if few:
            return MetricComparison(current.case, metric, base, cur, change, threshold, "inconclusive",
                                    reason=f"{len(base_rounds)} baseline and {len(cur_rounds)} current rounds: {few}")
        p_worse, p_better = rank_tests(cur_rounds, base_rounds, higher_is_better)
        ci = change_interval(cur_rounds, base_rounds, paired=False, alpha_side=alpha_side)
        # A busy run is slower than its code: a loaded current run cannot show a regression, a loaded baseline
        # cannot show an improvement.
        worse = is_worse(change, higher_is_better)
        busy = busy_reason((current if worse else baseline).machine_load)
        doubts = (busy,) if busy else ()
        verdict, reason = judge_change(ci, p_worse, p_better, threshold, higher_is_better, alpha, doubts,
                                       alpha_side=alpha_side)
        p = p_worse if worse else p_better  # the test in the direction of the change
        return MetricComparison(current.case, metric, base, cur, change, threshold, verdict, p, ci, reason,
                                ci_level=level(alpha_side))
    worse = -change if higher_is_better else change  # > 0: worse
    slack = max(threshold, EXACT)
    verdict = "regressed" if worse > slack else "improved" if -worse > slack else "unchanged"
    return MetricComparison(current.case, metric, base, cur, change, threshold, verdict)


def inconclusive_comparisons(current: CaseRecord, baseline: CaseRecord, thresholds: dict[str, float],
              alpha: float = DEFAULT_ALPHA) -> list[str]:
    """The timed comparisons of ``current`` with ``baseline`` that are inconclusive, one line each: what measuring
    the case again (more rounds) may decide."""
    timed = {metric: limit for metric, limit in thresholds.items() if METRICS[metric].kind == TIMED}
    return [c.describe() for c in compare_case(current, baseline, timed, alpha) if c.verdict == "inconclusive"]


def case_thresholds(thresholds: dict[str, float] | None, compare_fail: dict[str, float] | None) -> dict[str, float]:
    """The thresholds one case is compared at: the gate's (the display thresholds where there is no gate), with
    the budgets file's for that case over them."""
    return {**(thresholds or DISPLAY_THRESHOLDS), **(compare_fail or {})}


def compare_runs(cases: list[MeasuredCase], baseline: SavedRun, thresholds: dict[str, float] | None,
                 alpha: float = DEFAULT_ALPHA) -> tuple[list[MetricComparison], list[str], list[str]]:
    """This session's cases against a stored run: the comparisons, the cases the run lacks, and its records that
    could not be read.

    ``cases``: a ``result.MeasuredCase`` per measured case (``compare_fail``: the budgets file's thresholds for it,
    over ``thresholds``). ``thresholds`` None (no gate): the display thresholds are shown.
    """
    comparisons, new_cases, errors = [], [], []
    for measured in cases:
        current = measured.record
        try:
            base = baseline.case(measured.fullname)
        except RecordError as e:
            errors.append(str(e))
            continue
        if base is None:
            new_cases.append(current.case)
            continue
        comparisons += compare_case(current, base, case_thresholds(thresholds, measured.compare_fail), alpha)
    return comparisons, new_cases, errors


def compare_with_baseline(cases: list[MeasuredCase], baseline: dict | SavedRun, baseline_path: str, device: dict,
         thresholds: dict[str, float] | None, alpha: float = DEFAULT_ALPHA, allow_new_cases: bool = False,
         allow_inconclusive: bool = False, packages: tuple[dict | None, dict | None] = (None, None)) -> Verdict:
    """The verdict of this session against a stored run (``compare_runs``: a ``SavedRun``, or the benchmarks
    pytest-benchmark loaded by fullname); ``thresholds`` None means no gate; ``packages``: the installed packages of
    the stored run and of this one (None: not recorded), named where they differ, with the device identities'
    versions (``environment.environment_differences``).

    A gate fails closed (``Verdict.failed``): a gated metric measured on one side only, and a case the baseline
    lacks (unless ``allow_new_cases``), fail it, since nothing was compared; so does an inconclusive timed verdict
    (noise, a busy machine: "could not judge"), unless ``allow_inconclusive``.
    """
    if not isinstance(baseline, SavedRun):
        baseline = SavedRun.compared(baseline_path, baseline)
    comparisons, new_cases, errors = compare_runs(cases, baseline, thresholds, alpha)
    ran = {measured.fullname for measured in cases}
    not_run = tuple(case for name, case in baseline.case_ids().items() if name not in ran)
    return Verdict(baseline_path, device, tuple(comparisons), gated=thresholds is not None,
                   allow_inconclusive=allow_inconclusive,
                   new_cases=tuple(new_cases), new_cases_allowed=allow_new_cases, errors=tuple(errors),
                   not_run=not_run,
                   environment=tuple(environment_differences(baseline.device, device, *packages)))


def noise_study(runs: list[SavedRun], thresholds: list[float], metric: str = "samples_per_s",
                alpha: float = DEFAULT_ALPHA) -> list[dict]:
    """A/A noise of a gate: every pair of runs of the same code, per case, at each threshold.

    ``runs`` are repeated runs of one commit on one machine; any "regressed" verdict between
    them is a false alarm of that threshold.
    """
    by_case: dict[str, list[CaseRecord]] = {}
    for run in runs:
        for record in _cases(run):
            by_case.setdefault(record.case, []).append(record)
    rows = []
    for case, case_runs in by_case.items():
        pairs = [(a, b) for i, a in enumerate(case_runs) for b in case_runs[i + 1:]]
        if not pairs:
            continue
        changes, alarms = [], dict.fromkeys(thresholds, 0)
        for base, current in pairs:
            for threshold in thresholds:
                c = _compare_metric(current, base, metric, threshold, alpha)
                alarms[threshold] += c.verdict == "regressed"
            if c.change is not None:  # None: a run without the metric (MFU off a known GPU)
                changes.append(abs(c.change))
        if not changes:
            continue
        changes.sort()
        rows.append({"case": case, "pairs": len(changes), "median_abs_change": changes[len(changes) // 2],
                     "max_abs_change": changes[-1], "false_alarms": alarms})
    return rows


def noise_table(rows: list[dict], thresholds: list[float]) -> list[str]:
    """``noise_study``'s rows: pairs, median and largest change, and the false alarms at each threshold."""
    columns = (Column("case", left=True), Column("pairs"), Column("median |chg|"), Column("max |chg|"),
               *(Column(f"alarms@{t:.0%}") for t in thresholds))
    return Table(columns, tuple((row["case"], str(row["pairs"]), number(row["median_abs_change"], ".1%"),
                                 number(row["max_abs_change"], ".1%"), *(str(row["false_alarms"][t]) for t in thresholds))
                                for row in rows)).terminal()


# -- two saved runs: what changed between them, and where -----------------------------------------------------------

# ``explain``'s thresholds where none are given: every deterministic metric exactly (any change of one is real), and
# step time beyond 5%, judged over both sessions' rounds by the gate's test.
EXPLAIN_THRESHOLDS = "deterministic:0%,step_time_ms:5%"
LISTED = 20  # case names a line lists before "and N more"


@dataclass(frozen=True)
class RunsExplained:
    """Two saved runs compared: the verdict, each changed comparison with its "where", and for a case asked about
    (``case``) the timed rows that moved most between the runs, whatever its verdict."""

    verdict: Verdict
    runs: tuple[str, str]  # each run, described: its path and its device
    thresholds: dict[str, float]
    case: str | None = None
    moved: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {**self.verdict.to_json(), "explain": {"runs": list(self.runs), "case": self.case,
                                                      "moved": list(self.moved)}}

    def sections(self) -> list:
        """The verdict as ``trainbench.verdicts.present`` reads it, under a title naming both runs (baseline first): the thresholds,
        every comparison that is not unchanged, each change with where it comes from, and the case's moved rows."""
        title = Section("trainbench explain: {} vs {}", (self.runs[0], self.runs[1]))
        preface = (Line("thresholds: " + _described(self.thresholds)),)
        sections = verdict_sections(self.to_json(), title, preface, judged=False, current="the current run")
        if self.case is not None:
            sections.append(Section(lines=(Line(f"moved in {self.case}, between the runs' profiled steps (largest "
                                                "first, either way):", under=self.moved),)))
        return sections

    def lines(self) -> list[str]:
        """The terminal form (``sections``)."""
        return terminal_lines(self.sections())

    def markdown(self) -> str:
        """The Markdown form (``sections``)."""
        return markdown(self.sections())


def _described(thresholds: dict[str, float]) -> str:
    exact = [m for m, t in thresholds.items() if METRICS[m].deterministic and t == 0]
    rest = [f"{m} {t:.1%}" for m, t in thresholds.items() if m not in exact]
    if len(exact) == len(deterministic_metrics()):
        return ", ".join(["every deterministic metric exactly", *rest])
    return ", ".join([*(f"{m} exactly" for m in exact), *rest])


def explain_runs(baseline_path: str, current_path: str, case: str | None = None,
                 thresholds: dict[str, float] | None = None, alpha: float = DEFAULT_ALPHA) -> RunsExplained:
    """Every case both saved runs have (or only ``case``: a case id or pytest-benchmark fullname) compared at
    ``thresholds`` (default ``EXPLAIN_THRESHOLDS``) by the gate's rules, the run at ``current_path`` against the one at
    ``baseline_path``, each changed comparison explained from the runs' attribution, and the environment differences
    from their device identities and installed packages. Raises ``store.RunFileError`` for a file that is not a
    saved run, ``CompareError`` for a run without trainbench cases, a record that cannot be read or an unknown case."""
    thresholds = thresholds or parse_thresholds(EXPLAIN_THRESHOLDS, "explain")
    runs = (SavedRun.load(baseline_path).check(), SavedRun.load(current_path).check())  # read whole: one line, not a crash
    base, cur = (_trainbench_cases(run) for run in runs)
    if case is not None:
        base, cur = _the_case(case, base, baseline_path, cur, current_path)
    # every record read first: a bad one in either run is named, as bad input (the gate would list the baseline's)
    base_records, cur_records = ({name: _read(run, name) for name in cases} for run, cases in zip(runs, (base, cur)))
    measured = [MeasuredCase(record, name, {}) for name, record in cur_records.items()]
    verdict = compare_with_baseline(measured, runs[0].only(base), str(baseline_path), runs[1].device or {}, thresholds, alpha,
                   allow_new_cases=True, allow_inconclusive=True, packages=(runs[0].packages, runs[1].packages))
    described = tuple(f"{path} ({describe_device(run.comparable) if run.comparable else 'no device recorded'})"
                      for path, run in zip((baseline_path, current_path), runs))
    moved: tuple[str, ...] = ()
    if case is not None:
        name = next(name for name in cur if name in base)
        moved = tuple(moved_rows(base_records[name].attribution, cur_records[name].attribution))
    return RunsExplained(verdict, described, thresholds, case, moved)


def _read(run: SavedRun, fullname: str) -> CaseRecord:
    """The case ``fullname`` of ``run``, read (``CompareError`` naming the run and the case where it cannot be)."""
    try:
        return run.case(fullname)
    except RecordError as e:
        raise CompareError(str(e)) from None


def _cases(run: SavedRun) -> list[CaseRecord]:
    try:
        return run.cases()
    except RecordError as e:
        raise CompareError(str(e)) from None


def _trainbench_cases(run: SavedRun) -> dict[str, str]:
    """A saved run's trainbench cases, pytest-benchmark fullname -> case id (others are not compared)."""
    cases = run.case_ids()
    if not cases:
        raise CompareError(f"{run.path}: no trainbench case among its {run.benchmark_count} benchmark(s); expected a "
                           "run saved by pytest --benchmark-save of trainbench cases")
    return cases


def _the_case(case: str, base: dict, base_path: str, cur: dict, cur_path: str) -> tuple[dict, dict]:
    """Each run's cases (fullname -> case id) that are ``case`` (its case id or fullname); an error naming the run
    that lacks it."""
    def of(cases: dict) -> dict:
        return {name: case_id for name, case_id in cases.items() if case in (name, case_id)}

    mine, theirs = of(base), of(cur)
    both = sorted({case_id for name, case_id in cur.items() if name in base})
    known = f"the cases both runs have: {listed(both, LISTED)}" if both else "the runs have no case in common"
    if not mine and not theirs:
        raise CompareError(f"{case}: no such case in {base_path} or {cur_path}; {known}")
    for path, found in ((base_path, mine), (cur_path, theirs)):
        if not found:
            raise CompareError(f"{case}: not in {path}; {known}")
    if not set(mine) & set(theirs):
        raise CompareError(f"{case}: measured by other tests in the two runs ({', '.join(mine)} in {base_path}; "
                           f"{', '.join(theirs)} in {cur_path}); name one of them")
    return mine, theirs
