"""Measures a planned case and its baseline the way its plan says (``plan.CasePlan.measuring``): alone, the baseline
measured right after it, both interleaved in one process, or each in a fresh process; a DDP/FSDP case in its rank
processes. What the session keeps of them for later cases (same-session baselines) it keeps by setup key
(``CasePlan.setup_key``)."""

from __future__ import annotations

from dataclasses import replace

from trainbench.core.analyses.plan import BASELINE_AFTER, FRESH_PROCESSES, PAIRED, CasePlan
from trainbench.core.harness.costs import in_child_process, spent
from trainbench.core.method.case_guard import dropout_in_the_way
from trainbench.core.method.distributed import measure_ddp, measure_in_fresh_process
from trainbench.core.method.measure import Measurer, MeasureSettings, interleave_rounds, run_rounds
from trainbench.core.records.outcome import CaseOutcome, case_id
from trainbench.core.records.result import Result
from trainbench.core.setups.recipes import Recipe, TrainConfig
from trainbench.core.setups.spec import TrainingSpec
from trainbench.core.setups.training import InjectedFault, TrainingSetup, check_finite_loss
from trainbench.core.setups.workloads import Profile
from trainbench.devices.device import Backend
from trainbench.devices.host import LoadMeter


def _rounds_checking_loss(training: TrainingSetup):
    """The plain round runner, the loss checked finite at the end of warm-up and after the last timed step (each
    check a sync, outside the timing)."""
    warm_up_checked = False

    def rounds(step, count: int, steps_per_round: int, timer) -> list[float]:
        nonlocal warm_up_checked
        if not warm_up_checked:  # a round found to be warm-up is replaced by a further call
            training.check_loss("the end of warm-up")
            warm_up_checked = True
        times = run_rounds(step, count, steps_per_round, timer)
        training.check_loss("the last timed step")
        return times

    return rounds


def _check_final_losses(outcome: CaseOutcome) -> None:
    """The last loss of each side's whole measurement (rank and fresh processes' too) must be finite."""
    for result in (outcome.result, outcome.baseline):
        if result is not None and result.final_loss is not None:
            check_finite_loss(result.final_loss, result.workload,
                              f"at the end of {result.recipe}'s measurement ({result.warmup_steps} warm-up steps, "
                              f"{result.rounds} rounds of {result.steps_per_round})")


class CaseMeasurement:
    """Measures planned cases and their baselines on one device and profile, keeping the session's baselines (an
    unpaired reference for later cases, and a paired baseline's memory and work) and the first-step gradients rank 0
    recorded for the gradient guard."""

    def __init__(self, backend: Backend, profile: Profile, fault: InjectedFault | None = None, quick: bool = False):
        self._backend = backend
        self._profile = profile
        self._fault = fault  # a planted regression: the case's setup only
        self._quick = quick  # a quick run's passes are each case's own choice: no baseline's are reused for it
        self.results: dict[tuple, Result] = {}  # same-session baselines, by setup
        self.ddp_grads: dict | None = None  # first-step gradients rank 0 recorded for the guard

    def measured(self, plan: CasePlan, outcome: CaseOutcome, settings: MeasureSettings, again: bool = False
                 ) -> CaseOutcome:
        """``outcome`` with the case and its baseline measured, and what other processes used of the machine
        meanwhile; what this session keeps of them for later cases is stored by setup key."""
        meter = LoadMeter().start()
        outcome, kept = self._measure(plan, outcome, settings, outcome if again else None)
        load = meter.stop()
        loaded = {side: result.replace(machine_load=load) for side, result in
                  (("result", outcome.result), ("baseline", outcome.baseline))
                  if result is not None and result.machine_load is None}  # an earlier baseline keeps its own
        outcome = replace(outcome, **loaded)
        for key, side in kept.items():
            self.results[key] = getattr(outcome, side)
        _check_final_losses(outcome)
        return outcome

    def _measure(self, plan: CasePlan, outcome: CaseOutcome, settings: MeasureSettings,
                 earlier: CaseOutcome | None = None) -> tuple[CaseOutcome, dict[tuple, str]]:
        """The case and its baseline, the way the plan says (``plan`` lists the ways and why each), and which of the
        two this session keeps as later cases' baselines: {setup key: "result" or "baseline"}.

        ``earlier``: this case's first measurement, when it is measured again for its timing: the memory and work
        passes (exact functions of code and shapes) are taken from it, not run again."""
        recipe, base, spec = plan.recipe, plan.baseline, plan.spec
        self._backend.release_cache()  # what earlier cases left cached is not this case's to reserve
        kept: dict[tuple, str] = {}
        if plan.measuring == FRESH_PROCESSES:
            outcome = self._measure_fresh(plan, outcome, settings)
        elif plan.measuring == PAIRED:
            result, baseline = self._measure_paired(plan, settings, earlier)
            outcome = replace(outcome, result=result, baseline=baseline, paired=True)
            if plan.setup_key(base) not in self.results:  # one measured earlier stays the reference
                kept[plan.setup_key(base)] = "baseline"
        else:
            result = self._measure_setup(recipe, spec, plan.config, plan.case, settings, fault=self._fault,
                                         want_grads=recipe.grad_rtol is not None,
                                         passes_from=earlier.result if earlier else None)
            baseline = outcome.baseline
            if plan.measuring == BASELINE_AFTER:  # a fresh baseline: one from minutes ago carries the drift since
                baseline = self._measure_setup(base, spec, plan.baseline_config, case_id(spec.name, base.name), settings,
                                               baseline=True, passes_from=earlier.baseline if earlier else None)
                kept[plan.setup_key(base)] = "baseline"
                result = result.with_note(f"baseline {base.name} measured right after, not interleaved "
                                          f"({plan.why_measuring})")
            elif base:
                baseline = self.results.get(plan.setup_key(base))
            outcome = replace(outcome, result=result, baseline=baseline)
        if self._fault is None:  # a planted regression must not become another case's baseline
            kept[plan.setup_key(recipe)] = "result"
        return outcome, kept

    def _measure_paired(self, plan: CasePlan, settings: MeasureSettings, first: CaseOutcome | None = None
                        ) -> tuple[Result, Result]:
        """Both setups alive while their rounds alternate; each one's memory and work measured with it alone.

        The baseline's passes run before the case is built (or come from its earlier measurement in
        this session), the case's after the baseline is freed: a CUDA allocator peak is one setup's own.
        """
        recipe, base, spec = plan.recipe, plan.baseline, plan.spec
        earlier = self.results.get(plan.setup_key(base))
        with spent("setup", baseline=True):
            tb = TrainingSetup(plan.baseline_config, spec, self._backend)
        try:
            mb = Measurer(tb, case_id(spec.name, base.name), base.name, settings, base.extra_warmup_steps,
                          self._profile.name, baseline=True)
            if earlier is not None and not self._quick:  # a quick run's passes are its case's own choice
                # Its passes stand, and it settled when measured earlier: its minimum warm-up runs right before the
                # rounds (``interleave_rounds``), not here and then again after the case's warm-up.
                mb.reuse_passes(earlier)
            else:
                # Its minimum here, its rounds beside the case's judging when its warm-up ended (interleave_rounds);
                # one measured earlier already found its steady state.
                mb.warm_up(settle=earlier is None, in_rounds=True)
                tb.check_loss("the end of warm-up")
                mb.measure_after_timing()
            with spent("setup"):
                tc = TrainingSetup(plan.config, spec, self._backend, self._fault)
            with tc:
                mc = Measurer(tc, plan.case, recipe.name, settings, recipe.extra_warmup_steps, self._profile.name)
                interleave_rounds(mc, mb)
                tc.check_loss("the last timed step")
                tb.check_loss("the last timed step")  # no loop: its variable would keep the baseline alive below
                baseline = mb.finish()
                tb.close()
                tb = mb = None  # the baseline's tensors go before the case's memory is measured
                # A caching allocator's blocks (and the cycles holding them) go back; on the CPU nothing does: its
                # passes track what the case's own steps make, and a full collection there costs 0.1-0.3 s.
                self._backend.release_cache()
                if first is not None:  # measured again for its timing: the first measurement's passes stand
                    mc.reuse_passes(first.result)
                else:
                    mc.measure_after_timing()
                result = mc.finish()
        finally:
            if tb is not None:
                tb.close()
        why = plan.why_measuring or "for its ratio budgets"
        return result.with_note(f"rounds interleaved with {base.name}'s (ABBA): {why}"), baseline

    def _measure_fresh(self, plan: CasePlan, outcome: CaseOutcome, settings: MeasureSettings) -> CaseOutcome:
        """``outcome`` with the case and its baseline, each measured in a new process (``Backend.fresh_process_reason``
        says why)."""
        recipe, base, spec = plan.recipe, plan.baseline, plan.spec
        want_losses = base is not None and recipe.loss_rtol is not None
        with in_child_process() as child:
            result, losses = measure_in_fresh_process(
                plan.config, spec, self._backend, self._profile, settings, plan.case, recipe.name,
                recipe.extra_warmup_steps, env=self._backend.fresh_process_env(plan.config), want_losses=want_losses)
            child.phase_seconds = result.phase_seconds
        outcome = replace(outcome, result=result.with_note(f"why a fresh process: {plan.why_measuring}"))
        if base is not None:
            with in_child_process(baseline=True) as child:
                baseline, base_losses = measure_in_fresh_process(
                    plan.baseline_config, spec, self._backend, self._profile, settings, case_id(spec.name, base.name),
                    base.name, base.extra_warmup_steps, env=self._backend.fresh_process_env(plan.baseline_config),
                    want_losses=want_losses)
                child.phase_seconds = baseline.phase_seconds
            outcome = replace(outcome, baseline=baseline,
                              fresh_losses=(losses, base_losses) if want_losses else outcome.fresh_losses)
        return outcome

    def _measure_setup(self, recipe: Recipe, spec: TrainingSpec, config: TrainConfig, case: str,
                       settings: MeasureSettings, fault: InjectedFault | None = None, want_grads: bool = False, baseline: bool = False,
                       passes_from: Result | None = None) -> Result:
        """One setup alone: in this process, or in its rank processes (``passes_from``: a measurement of the same
        setup whose memory and work figures stand, ``_measure``)."""
        if config.rank_processes:
            with in_child_process(baseline) as child:
                result, grads = measure_ddp(config, spec, self._backend, self._profile, settings, case, recipe.name,
                                            recipe.extra_warmup_steps, want_grads=want_grads,
                                            grads_dropout_off=want_grads and dropout_in_the_way(config, spec) is not None)
                child.phase_seconds = result.phase_seconds
            if grads is not None:
                self.ddp_grads = grads
            return result
        self._backend.release_cache()  # the setup measured before this one (a baseline after its case) is gone
        with spent("setup", baseline):
            training = TrainingSetup(config, spec, self._backend, fault)
        with training:
            m = Measurer(training, case, recipe.name, settings, recipe.extra_warmup_steps, self._profile.name,
                         baseline=baseline)
            return m.run(_rounds_checking_loss(training), passes_from)
