"""Runs one case: the decisions behind every number, free of pytest so that pytest and asv judge alike.

``Runner.run`` takes a recipe and a training spec, and

1. plans the case (``trainbench.core.analyses.plan``): its baseline recipe, whether it can run here
   (``eligibility.why_not``), its budget, and whether its baseline is measured interleaved with it
   (ABBA rounds, both setups alive), right after it, in fresh processes, or not at all;
2. executes the plan (``trainbench.core.method.execute``): measures the two, dispatching DDP cases to rank
   processes (``trainbench.core.method.distributed``), runs the correctness guards against the baseline and
   predicts the GPU profile's memory (what only the built model tells skips the case);
3. judges the case by its budget (``trainbench.core.method.judge``), measuring it again while a timed bound
   is inconclusive, then takes a profile trace where one is asked for;

and returns a ``CaseOutcome`` whose ``record()`` is the one serialized form of the case.
"""

from __future__ import annotations

import functools
from dataclasses import replace

from trainbench.core.records.budgets import Budgets
from trainbench.core.setups.cases import Case
from trainbench.core.harness.costs import case_ledger
from trainbench.core.setups.eligibility import why_not
from trainbench.core.method.execute import Executor
from trainbench.core.method.judge import InconclusiveComparisons, Judge
from trainbench.core.setups.ladders import LADDERS
from trainbench.core.method.measure import MeasureSettings
from trainbench.core.records.outcome import CaseOutcome
from trainbench.core.analyses.plan import CasePlan, Planner
from trainbench.core.analyses.predict import NOMINAL_GPU, PredictionCache
from trainbench.core.method.predict_ahead import PredictedAhead, predict_ahead
from trainbench.core.setups.recipes import Recipe
from trainbench.core.records.result import Result
from trainbench.core.method.trace import TraceRequest
from trainbench.core.setups.training import InjectedFault
from trainbench.core.setups.workloads import PROFILES, Profile, SpecSource
from trainbench.devices.device import Backend


class Runner:
    """Runs cases on one device and profile: plan, execute, judge."""

    def __init__(self, backend: Backend, profile: Profile, settings: MeasureSettings, fault: InjectedFault | None = None,
                 require_budgets: bool = False, predict: bool = False, strict_timing: bool = False,
                 remeasure_inconclusive: int = 1, trace: TraceRequest | None = None, remeasure_s: float = 0.0,
                 predictions: PredictionCache | None = None, pair_baselines: bool = False, quick: bool = False):
        self.backend = backend
        self.caps = backend.caps()
        self.profile = profile
        self.settings = settings
        # Why this session's timing means nothing (e.g. parallel workers sharing the device): timed budgets are
        # then not judged, deterministic ones are.
        self.untimed: str | None = None
        # The memory check before a case and the prediction after it share one cache (several runners may, too).
        predictions = predictions or PredictionCache(backend)
        self.planner = Planner(backend, self.caps, profile, predictions, pair_baselines)
        self.executor = Executor(backend, self.caps, profile, settings, predictions, fault, predict, trace, quick)
        self.judge = Judge(require_budgets, strict_timing, remeasure_inconclusive, remeasure_s)

    @property
    def results(self) -> dict[tuple, Result]:
        """The session's measured setups, by (spec, recipe, knobs): later cases' baselines."""
        return self.executor.results

    def run(self, recipe: Recipe | str, spec: SpecSource, *, baseline: Recipe | str | None = None,
            budgets: Budgets | None = None, case: str | None = None, overrides: dict | None = None,
            ladder: dict | None = None, gpu_recipe: Recipe | None = None,
            inconclusive_comparisons: InconclusiveComparisons | None = None) -> CaseOutcome:
        """Measure ``recipe`` on ``spec`` against ``baseline`` (default: the recipe's own), check it, and say how it went.

        ``gpu_recipe``: what the case runs on a GPU where that differs from ``recipe`` (a ladder rung that
        leaves out a GPU-only step here); its memory is the one predicted for the GPU profile. ``inconclusive_comparisons``:
        a gate's timed comparisons that cannot be judged yet (the case is measured again while there are any).
        An override that contradicts the recipe raises ``recipes.ConfigError``.
        """
        with case_ledger() as ledger:
            plan = self.planner.plan(recipe, spec, baseline=baseline, budgets=budgets, case=case, overrides=overrides,
                                     ladder=ladder, gpu_recipe=gpu_recipe, measured=self.results.__contains__)
            outcome = plan.outcome()
            if plan.skipped:
                return outcome
            outcome = self._executed(plan, outcome, inconclusive_comparisons)
            if outcome.result is None:
                return outcome
            # where the case's wall time went (trainbench.core.harness.costs), its baseline's share included
            return replace(outcome, result=outcome.result.replace(phase_seconds=ledger.closed()))

    def _executed(self, plan: CasePlan, outcome: CaseOutcome,
                  inconclusive_comparisons: InconclusiveComparisons | None) -> CaseOutcome:
        outcome = self.executor.execute(plan, outcome)
        if outcome.skipped or outcome.error:
            return outcome
        outcome = self.judge.judge(outcome, functools.partial(self.executor.measure_again, plan), self.untimed,
                                   inconclusive_comparisons)
        if outcome.error:
            return outcome
        return self.executor.trace(plan, outcome)

    def run_case(self, case: Case, budgets: Budgets | None = None, inconclusive_comparisons: InconclusiveComparisons | None = None,
                 **overrides) -> CaseOutcome:
        """A suite case (``trainbench.core.setups.cases``): a recipe on a built-in workload, or a ladder rung against rung 0."""
        reason, recipe, arguments = self._suite_case(case)
        if reason:
            return CaseOutcome(case.id, case.own_recipe(), skipped=reason)
        return self.run(recipe, case.workload, **arguments, budgets=budgets, overrides=overrides,
                        inconclusive_comparisons=inconclusive_comparisons)

    def plan_case(self, case: Case, budgets: Budgets | None = None, **overrides) -> CasePlan | str:
        """What ``run_case`` would measure for ``case``, decided and not run; or why a rung cannot run here."""
        reason, recipe, arguments = self._suite_case(case)
        return reason or self.planner.plan(recipe, case.workload, **arguments, budgets=budgets, overrides=overrides)

    def predict_ahead(self, cases: list[Case], processes: int) -> PredictedAhead | None:
        """The memory predictions ``cases`` will ask for, made now on ``processes`` cores (``core.method.predict_ahead``):
        None where none is made (nothing to predict, or forking is unsafe here)."""
        def setups():
            for case in cases:
                try:
                    plan = self.plan_case(case)
                except Exception:  # noqa: BLE001 - the case says what is wrong with it when it runs
                    continue
                if isinstance(plan, str) or plan.skipped or not self.executor.predicts(plan):
                    continue
                asked = self.executor.predicted_setups(plan)
                if not isinstance(asked, str):
                    yield from asked

        return predict_ahead(self.executor.predictions, setups(), processes, self.settings.no_progress_s)

    def _suite_case(self, case: Case) -> tuple[str | None, Recipe | str | None, dict]:
        """Why a suite case cannot run here before it is planned (a rung needs what its own step needs), else the
        recipe and the other arguments ``run`` and ``Planner.plan`` take for it (on ``case.workload``)."""
        if case.ladder is None:
            return None, case.recipe_name, {"case": case.id}
        reason = why_not(case, self.caps, self.profile)
        if reason:
            return reason, None, {}
        ladder = LADDERS[case.ladder]
        return None, ladder.rung_recipe(case.rung, self.caps, self.profile), {
            "baseline": ladder.rung_recipe(0, self.caps, self.profile), "case": case.id,
            "ladder": ladder.rung_info(case.rung, self.caps, self.profile),
            "gpu_recipe": ladder.rung_recipe(case.rung, NOMINAL_GPU, PROFILES["gpu"])}
