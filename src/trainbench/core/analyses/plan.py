"""What a case will run, decided before anything is built.

``Planner.plan`` resolves the case's recipe and baseline recipe, the knobs both are judged on
(``recipes.judging_overrides``), whether it can run here (``eligibility.why_not``: the case,
then its baseline, then whether both fit the device's memory), its budget, and how the two are
measured (``CasePlan.measuring``):

- ``FRESH_PROCESSES``: the device must start a new process for the setup
  (``Backend.fresh_process_reason``): the case and its baseline each in one;
- ``PAIRED``: a ratio budget judges them (or every case is paired: ``--trainbench-pair-baselines``)
  and neither flips process-wide state: ABBA rounds, both setups alive (``measure.interleave_rounds``);
- ``BASELINE_AFTER``: the same, but one setup cannot share the process with the other (it
  flips process-wide state, or the two together would not fit the device's memory though each
  alone does): the case alone, then a fresh baseline right after it. Also a case whose baseline
  the session has not measured (``optimizer_fused`` run without ``optimizer_loop``): every case
  with a baseline has its "vs base", unpaired where nothing asks for pairing;
- ``ALONE``: no ratio budget and a baseline the session measured earlier: the case alone; that
  baseline serves only as an *unpaired* reference.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace

from trainbench.core.records.budgets import Budgets, CaseBudget
from trainbench.core.setups.cases import known_case_ids
from trainbench.core.setups.eligibility import Context, MemoryLimit, does_not_fit, why_not
from trainbench.core.records.outcome import CaseOutcome, case_id
from trainbench.core.analyses.predict import PredictionCache
from trainbench.core.setups.recipes import Recipe, TrainConfig, get_recipe, judging_overrides
from trainbench.core.setups.spec import TrainingSpec
from trainbench.core.setups.workloads import Profile, SpecSource, resolve_spec
from trainbench.devices.device import Backend, DeviceCaps

FRESH_PROCESSES = "fresh processes"
PAIRED = "paired"
BASELINE_AFTER = "baseline after"
ALONE = "alone"


def interleave_blocker(config: TrainConfig) -> str | None:
    """Why a setup cannot be timed side by side with another in one process, or None.

    DDP ranks are other processes; knobs that flip process-wide state (``Knob.process_wide``) would
    have the other setup's rounds run under them too.
    """
    if config.rank_processes:
        return f"{config.parallel.upper()} ranks run in other processes"
    for knob, _ in config.turned("process_wide"):
        return f"{knob} changes process-wide state"
    return None


@dataclass(frozen=True)
class CasePlan:
    """One case as it will be measured: what runs, against what, judged by which budget, and how."""

    case: str
    recipe: Recipe
    baseline: Recipe | None  # None: the recipe is its own baseline (nothing to compare or guard)
    profile: Profile
    spec: TrainingSpec
    source: SpecSource  # the spec as the caller gave it: the GPU-profile prediction resolves it again
    user_overrides: dict  # the knobs the caller set
    judged_on: dict  # knobs both sides get so that their ratio measures the recipe (recipes.judging_overrides)
    ladder: dict | None = None  # what a ladder rung records about its ladder
    gpu_recipe: Recipe | None = None  # what the case runs on a GPU, where that differs from ``recipe``
    skipped: str | None = None  # why the case cannot run here (eligibility.why_not)
    budget: CaseBudget | None = None
    budget_missing: str | None = None  # why no budget applies
    budget_required: bool = False  # a missing budget fails the case: an entry nearly names it (Budgets.misspelling)
    measuring: str = ALONE  # FRESH_PROCESSES, PAIRED, BASELINE_AFTER or ALONE
    # Why a fresh process, why the baseline is not interleaved, or why it is where no ratio budget asks for it.
    why_measuring: str | None = None
    notes: tuple[str, ...] = ()  # what the plan changed that the result must say

    def setup_key(self, recipe: Recipe) -> tuple:
        """A setup of the session (the case's or its baseline's): the spec, the recipe and the knobs it is built with;
        a baseline measured once serves every later case of the same key."""
        return (self.spec.name, recipe.name, tuple(sorted(self.overrides.items())))

    @property
    def overrides(self) -> dict:
        """The knobs both setups are built with: the judging ones, then the caller's."""
        return {**self.judged_on, **self.user_overrides}

    @functools.cached_property
    def config(self) -> TrainConfig:
        return self.recipe.config(self.profile, **self.overrides)

    @functools.cached_property
    def baseline_config(self) -> TrainConfig | None:
        return self.baseline.config(self.profile, **self.overrides) if self.baseline else None

    def outcome(self) -> CaseOutcome:
        """The outcome a measurement starts from (only the skip reason, for a case that cannot run)."""
        return CaseOutcome(self.case, self.recipe, skipped=self.skipped, baseline_recipe=self.baseline,
                           budget=self.budget, budget_missing=self.budget_missing,
                           budget_required=self.budget_required, ladder=self.ladder)


class Planner:
    """Plans cases for one device and profile."""

    def __init__(self, backend: Backend, caps: DeviceCaps, profile: Profile, predictions: PredictionCache,
                 pair_baselines: bool = False):
        self.backend = backend
        self.caps = caps
        self.profile = profile
        self.predictions = predictions
        self.pair_baselines = pair_baselines  # every case interleaved with its baseline (--trainbench-pair-baselines)

    def plan(self, recipe: Recipe | str, source: SpecSource, *, baseline: Recipe | str | None = None,
             budgets: Budgets | None = None, case: str | None = None, overrides: dict | None = None,
             ladder: dict | None = None, gpu_recipe: Recipe | None = None,
             measured: Callable[[tuple], bool] | None = None) -> CasePlan:
        """Plan ``recipe`` on ``source`` against ``baseline`` (default: the recipe's own); see ``Runner.run``.

        ``measured``: whether the session already holds a setup's result (by ``CasePlan.setup_key``); a baseline it
        does not hold is measured right after the case. None: a plan made ahead of running (``trainbench plan``),
        where the suite measures each baseline before its cases."""
        recipe = recipe if isinstance(recipe, Recipe) else get_recipe(recipe)
        spec = resolve_spec(source, self.profile)
        user_overrides = dict(overrides or {})
        base = baseline if baseline is not None else recipe.baseline
        base = base if isinstance(base, Recipe) else get_recipe(base)
        base = None if base.name == recipe.name else base
        judged_on = {}
        if ladder is None and base is not None:  # a ladder climbs from its loader-bound rung 0
            judged_on = judging_overrides(recipe, base, self.profile, spec, user_overrides)
        plan = CasePlan(case or case_id(spec.name, recipe.name), recipe, base, self.profile, spec, source,
                        user_overrides, judged_on, ladder, gpu_recipe)
        skipped = self.why_skipped(plan)
        if skipped:
            return replace(plan, skipped=skipped)
        budget, missing = (budgets or Budgets.empty()).lookup(self.caps, plan.case)
        misspelt = budgets.misspelling(self.caps, plan.case, known_case_ids()) if budget is None and budgets else None
        measuring, why = self._measuring(plan, budget, measured)
        notes = ()
        if judged_on:
            note = (f"judged against {base.name} with both on {judged_on['synthetic']}-side synthetic batches: the "
                    "loader-bound baseline's data path would hide (or fake) a compute change")
            notes = (note,)
        return replace(plan, budget=budget, budget_missing=misspelt or missing, budget_required=misspelt is not None,
                       measuring=measuring, why_measuring=why, notes=notes)

    def why_skipped(self, plan: CasePlan) -> str | None:
        """Why the case cannot run here: the case, then its baseline, then whether each fits the device's memory
        (where only both together do not, they are not interleaved: ``_measuring``). An override that contradicts
        a recipe raises ``ConfigError``."""
        reason = why_not(plan.recipe, self.caps, self.profile, plan.spec, plan.config)
        if reason is None and plan.baseline is not None:
            base = why_not(plan.baseline, self.caps, self.profile, plan.spec, plan.baseline_config)
            reason = f"{plan.recipe.name}: its baseline {base}" if base else None
        memory = self.memory_limit()
        if reason is not None or memory is None:
            return reason
        limit = Context(memory=memory)
        for recipe, config in ((plan.recipe, plan.config), (plan.baseline, plan.baseline_config)):
            if reason is None and recipe is not None:
                reason = why_not(recipe, self.caps, self.profile, plan.spec, config, limit)
        return reason

    def memory_limit(self) -> MemoryLimit | None:
        """The device's memory and this profile's predictions, or None where the device sets no limit (the host)."""
        total = self.backend.total_memory_bytes()
        return None if total is None else MemoryLimit(total, functools.partial(self.predictions, self.profile.name))

    def _measuring(self, plan: CasePlan, budget: CaseBudget | None,
                   measured: Callable[[tuple], bool] | None) -> tuple[str, str | None]:
        """How the case and its baseline are measured, and why where it is not the plain way (a ratio budget)."""
        fresh = self.backend.fresh_process_reason(plan.config)
        if fresh:
            return FRESH_PROCESSES, fresh
        if plan.baseline is None:
            return ALONE, None
        if budget is not None and budget.needs_baseline:
            why = None
        elif self.pair_baselines:
            why = "every case is paired with its baseline (--trainbench-pair-baselines)"
        elif measured is not None and not measured(plan.setup_key(plan.baseline)):
            # Only for "vs base": the case is measured first, as it would be alone (its own failure is its own),
            # and the baseline right after it, once for every later case of the session.
            return BASELINE_AFTER, (f"the session had not measured {plan.baseline.name}, and no ratio budget asks "
                                    "for interleaving")
        else:
            return ALONE, None
        blocker = (interleave_blocker(plan.config) or interleave_blocker(plan.baseline_config)
                   or self._too_big_together(plan))
        return (BASELINE_AFTER, blocker) if blocker else (PAIRED, why)

    def _too_big_together(self, plan: CasePlan) -> str | None:
        """Why the case and its baseline, both alive while their rounds interleave, would not fit the device's memory
        (each alone does: ``why_skipped`` checked), or None."""
        memory = self.memory_limit()
        if memory is None:
            return None
        label = f"{plan.recipe.name} and its baseline {plan.baseline.name} alive together"
        return does_not_fit(label, [plan.config, plan.baseline_config], self.caps, plan.spec, memory)
