"""Judges a measured case by its budget (``budgets.evaluate``), and measures it again while the rounds cannot
judge a timed bound (noise, a busy machine) or a timed comparison with a baseline run.

Deterministic bounds (memory, work) stand as evaluated. A timed bound whose rounds cannot show which side
of its limit they lie on (``stats.judge_bound``, the gate's rule), or a gate's timed comparison that is inconclusive
(``inconclusive_comparisons``), is measured again: ``remeasure_inconclusive`` times, then, for a gate's comparison
(which fails the session if it stays inconclusive), again while less than ``remeasure_s`` seconds went
into it (at most ``MAX_REMEASURES``). Each measurement adds its rounds to
the earlier ones, so the interval narrows; each is a look planned before the first (``planned_looks``) whose
verdicts spend only their share of the error (``stats.look_alpha``), so that judging the pooled rounds again does
not claim more often than one look would. A case stops at the first look that decides all its timed checks. Every step returns a new ``CaseOutcome``; the one given
is never changed. A bound still inconclusive is reported; ``strict_timing``
fails it instead. A session whose timing means nothing (``untimed``: parallel workers sharing the
device) judges its deterministic bounds only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from trainbench.core.records.budgets import BoundCheck, evaluate
from trainbench.core.records.metrics import is_timed, per_round, rounds_of
from trainbench.core.records.outcome import CaseOutcome, failed_without_result
from trainbench.core.records.result import Result
from trainbench.core.records.stats import MAX_LOOKS, judge_bound, look_alpha, planned_looks, rounds_needed
from trainbench.core.setups.training import NonFiniteLoss
from trainbench.core.harness.watchdog import NoProgress

MAX_REMEASURES = MAX_LOOKS - 1
# Why a case's timed comparisons with a stored run cannot be judged yet ([]: they can): set by a gate.
InconclusiveComparisons = Callable[[CaseOutcome], list[str]]
# The outcome given, with its case and baseline measured once more (``Executor.measure_again``).
MeasureAgain = Callable[[CaseOutcome], CaseOutcome]


class Judge:
    """The budget rules of a session: a missing budget fails the case or not, timing is strict or not."""

    def __init__(self, require_budgets: bool = False, strict_timing: bool = False, remeasure_inconclusive: int = 1,
                 remeasure_s: float = 0.0):
        self.require_budgets = require_budgets  # a case without a budget fails (--trainbench-require-budgets)
        self.strict_timing = strict_timing
        self.remeasure_inconclusive = remeasure_inconclusive
        self.remeasure_s = remeasure_s

    def judge(self, outcome: CaseOutcome, measure_again: MeasureAgain, untimed: str | None = None,
              inconclusive_comparisons: InconclusiveComparisons | None = None) -> CaseOutcome:
        """``outcome`` with its budget checked, measured again (``measure_again``) while a timed bound, or a timed
        comparison ``inconclusive_comparisons`` names, is inconclusive. ``untimed``: why this session's timing means
        nothing, or None."""
        planned = planned_looks(self.remeasure_inconclusive, self.remeasure_s, inconclusive_comparisons is not None)
        if outcome.result is not None:  # the looks its timed verdicts share the error over, known before the first
            outcome = replace(outcome, result=outcome.result.replace(planned_looks=planned))
        outcome = self.check_budget(outcome, untimed)
        started = time.monotonic()
        for attempt in range(2, planned + 1):
            gate = inconclusive_comparisons(outcome) if inconclusive_comparisons else []
            why = "; ".join(dict.fromkeys([*(v.inconclusive for v in outcome.bound_checks if v.inconclusive), *gate]))
            # A budget gets its re-measurements; a gate's comparison, which fails the session when it stays
            # inconclusive, gets more while the time budget lasts.
            more = attempt - 2 < self.remeasure_inconclusive or (gate and time.monotonic() - started < self.remeasure_s)
            if not why or not more or not _next_look_can_decide(outcome.result):
                break
            judged_before = set(outcome.budget_failures())  # the new measurement is judged afresh
            outcome = replace(outcome, failures=tuple(f for f in outcome.failures if f not in judged_before))
            try:
                outcome = self._measure_again(outcome, measure_again, attempt, why)
            except NoProgress as e:
                return failed_without_result(outcome, f"{outcome.case}: {e}, measuring it again "
                                                      "(--trainbench-timeout sets the limit)")
            except NonFiniteLoss as e:  # diverged this time: what was measured before is no longer the case's
                return failed_without_result(outcome, f"{outcome.case}: {e}, measuring it again")
            outcome = self.check_budget(outcome, untimed)
        return outcome

    def check_budget(self, outcome: CaseOutcome, untimed: str | None = None) -> CaseOutcome:
        """``outcome`` with its budget verdicts, and a failure line for each bound it missed."""
        if outcome.budget is None:
            if outcome.budget_required:  # an entry that nearly names the case (a typo) must not leave it unchecked
                return outcome.failing(f"{outcome.case}: {outcome.budget_missing}")
            if not self.require_budgets:
                return outcome
            return replace(outcome, budget_required=True).failing(
                f"{outcome.case}: {outcome.budget_missing} (--trainbench-require-budgets)")
        if self.require_budgets and not outcome.budget.bounds:  # "ok 0": an entry that checks nothing is no budget
            where = f" in {outcome.budget.path}" if outcome.budget.path else ""
            return replace(outcome, budget_required=True).failing(
                f"{outcome.case}: its budget entry [{outcome.budget.device_key}.\"{outcome.case}\"]{where} has no bound "
                "(a note or gate thresholds only): nothing is checked (--trainbench-require-budgets)")
        verdicts = evaluate(outcome.budget, outcome.result, outcome.baseline)
        if untimed:
            left_out = [v.bound.key for v in verdicts if is_timed(v.bound.metric)]
            verdicts = [v for v in verdicts if not is_timed(v.bound.metric)]
            if left_out:
                outcome = replace(outcome, result=outcome.result.with_note(
                    f"timed budgets not judged ({', '.join(left_out)}): {untimed}"))
        outcome = replace(outcome, bound_checks=tuple(self._judged(v, outcome) for v in verdicts))
        return outcome.failing(*outcome.budget_failures())

    def _judged(self, verdict: BoundCheck, outcome: CaseOutcome) -> BoundCheck:
        """A timed bound kept or missed as its rounds show it (``stats.judge_bound``), inconclusive where they cannot
        (a failure under ``strict_timing``); deterministic bounds stand as evaluated."""
        b = verdict.bound
        if verdict.measured is None or not is_timed(b.metric):
            return verdict
        result, base = outcome.result, outcome.baseline if b.relative else None
        current = per_round(b.metric, result.metrics().get(b.metric), rounds_of(b.metric, result))
        reference = per_round(b.metric, base.metrics().get(b.metric), rounds_of(b.metric, base)) if base else None
        ok, reason = judge_bound(b.metric, b.bound, b.limit, verdict.measured, current, reference, outcome.paired,
                                 [result.machine_load] + ([base.machine_load] if base else []),
                                 alpha_side=look_alpha(result.looks, result.planned_looks))
        if reason and self.strict_timing:
            return replace(verdict, ok=False, message=f"{verdict.message}: inconclusive ({reason}), a failure under "
                                                      "--trainbench-strict-timing")
        return replace(verdict, ok=ok, inconclusive=reason)

    @staticmethod
    def _measure_again(outcome: CaseOutcome, measure_again: MeasureAgain, attempt: int, why: str) -> CaseOutcome:
        """An inconclusive case measured again (timing, memory and work), to be judged afresh with the new rounds
        added to the earlier ones. The guard verdicts and the GPU prediction do not depend on timing and are kept."""
        first, first_baseline = outcome.result, outcome.baseline
        again = measure_again(outcome)
        result = _with_rounds_of(first, again.result).replace(predicted_memory=first.predicted_memory)
        baseline = again.baseline
        if first_baseline is not None and baseline is not first_baseline:  # measured again with the case
            baseline = _with_rounds_of(first_baseline, baseline)
        result = result.with_note(
            f"measured again (attempt {attempt}, rounds now {result.rounds}): timed checks were inconclusive "
            f"({why}; first {first.samples_per_s or 0:.4g} samples/s, rounds "
            f"{', '.join(f'{t * 1e3:.1f}' for t in first.round_step_times_s)} ms)")
        return replace(again, result=result, baseline=baseline)


def _next_look_can_decide(result: Result | None) -> bool:
    """Whether measuring again once more gives rounds that an interval at the next look's share of the error can
    place at all (a one-round smoke run's would not: it is not measured again for nothing)."""
    if result is None or not result.rounds:
        return False
    per_look = result.rounds / max(result.looks, 1)
    need = rounds_needed("paired", look_alpha(result.looks + 1, result.planned_looks))
    return result.rounds + per_look >= need


def _with_rounds_of(earlier: Result, later: Result) -> Result:
    """``later`` with ``earlier``'s timed rounds before its own: more rounds of the same setup, a narrower interval.
    (Rounds stay in measuring order, so the rounds of a case and of its interleaved baseline stay paired.)"""
    times = [*earlier.round_step_times_s, *later.round_step_times_s]
    cpu = [*earlier.round_cpu_times_s, *later.round_cpu_times_s]
    return later.replace(round_step_times_s=times, rounds=len(times), looks=earlier.looks + 1,
                         planned_looks=earlier.planned_looks, round_cpu_times_s=cpu if len(cpu) == len(times) else [])
