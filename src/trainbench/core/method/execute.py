"""Runs a planned case (``plan.CasePlan``): measures it and its baseline the way the plan says, runs the
correctness guard, predicts its memory on the GPU profile and takes a profile trace where asked.

``Executor`` keeps what a session shares between cases: the baselines measured so far (an
unpaired reference for later cases, and a paired baseline's memory and work), the baselines'
loss trajectories for the loss guard, and the gradients rank 0 recorded for the gradient guard.
Each step takes a ``CaseOutcome`` and returns a new one; what the session keeps for later cases it
keeps by setup key (``CasePlan.setup_key``), stored again whenever the case's result is revised.
"""

from __future__ import annotations

import traceback
from dataclasses import replace

import torch.utils.checkpoint

from trainbench.core.setups import guards  # by module: tests replace its functions to see what the guard computes
from trainbench.core.harness.costs import in_child_process, spent
from trainbench.core.method.distributed import ProcessFailed, measure_ddp, measure_in_fresh_process
from trainbench.core.setups.eligibility import Context, why_not
from trainbench.core.analyses.step_memory import heap_frozen
from trainbench.core.method.measure import Measurer, MeasureSettings, interleave_rounds, run_rounds
from trainbench.core.records.metrics import passes_measuring
from trainbench.core.records.outcome import CaseOutcome, case_id, failed_without_result
from trainbench.core.analyses.plan import BASELINE_AFTER, FRESH_PROCESSES, PAIRED, CasePlan
from trainbench.core.analyses.predict import PredictionCache
from trainbench.core.setups.recipes import ConfigError, NotApplicable, Recipe, TrainConfig, judging_overrides
from trainbench.core.records.result import Result
from trainbench.core.setups.spec import TrainingSpec
from trainbench.core.method.trace import TraceRequest, record_trace
from trainbench.core.setups.training import InjectedFault, NonFiniteLoss, TrainingSetup, check_finite_loss
from trainbench.core.harness.watchdog import NoProgress, phase, watch
from trainbench.core.setups.workloads import PROFILES, Profile, resolve_spec
from trainbench.devices.device import Backend, DeviceCaps, is_out_of_memory
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


def _drop_frames(error: BaseException) -> None:
    """Let go of the frames ``error`` and the exceptions chained to it keep alive, with every local in them."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        traceback.clear_frames(error.__traceback__)  # frames still running (this one's callers) are left as they are
        error.__traceback__ = None
        error = error.__cause__ or error.__context__


def recomputation_hint(config: TrainConfig, spec: TrainingSpec, error: BaseException) -> str | None:
    """What likely fixes a checkpointing case that failed while a block ran under ``torch.utils.checkpoint``, in a
    model whose ``config.use_cache`` is on (Hugging Face's): the recomputed forward adds its keys and values to the
    cache a second time, and attention then meets twice the keys (``The size of tensor a (128) must match the size
    of tensor b (64)``). None where that is not the case."""
    if not config.checkpointing or not any(frame.f_code.co_filename == torch.utils.checkpoint.__file__
                                           for frame, _ in traceback.walk_tb(error.__traceback__)):
        return None
    try:
        model = spec.model()  # the failed setup's model is gone with it; the spec builds the same
    except Exception:
        return None
    if not getattr(getattr(model, "config", None), "use_cache", False):
        return None
    return ("set use_cache=False in the model's config (Hugging Face models cache keys/values, which recomputation "
            "breaks)")


def _add_hint(plan: CasePlan, error: BaseException) -> None:
    """``error``, re-raised with its own traceback, gains a note of what likely fixes it (pytest prints it after the error)."""
    hint = recomputation_hint(plan.config, plan.spec, error)
    if hint is None:
        return
    note = f"trainbench: {plan.case}: {hint}"
    if hasattr(error, "add_note"):
        error.add_note(note)
    else:  # Python 3.10: the exceptiongroup backport pytest installs prints __notes__ too
        error.__notes__ = [*getattr(error, "__notes__", []), note]


def _rank_failures(outcome: CaseOutcome) -> list[str]:
    """Data-parallel ranks must hold identical gradients after the all-reduce; one line when they do not."""
    spread = (outcome.result.ranks or {}).get("max_grad_difference_between_ranks")
    if not spread:
        return []
    return [(f"{outcome.case}: the ranks' first-step gradients differ after DDP's all-reduce (largest difference "
             f"{spread:.3g}); every rank must hold the same gradients")]


def dropout_in_the_way(config: TrainConfig, spec: TrainingSpec) -> tuple[list[str], str] | None:
    """The model's dropout sites and why its random masks cannot match its baseline's, or None: where the case splits
    the step's batch (accumulation, data-parallel shares, ranks), the parts draw other masks than the whole batch;
    where it compiles, the generated kernels draw them from their own random stream. Its guards then compare with
    dropout off on both sides (a rank case's ranks take their guard gradients so, ``distributed.measure_ddp``)."""
    split = max(config.accumulation_steps, config.shards)
    if split == 1 and not config.compiles:
        return None
    from trainbench.core.setups.training import dropout_sites

    sites = dropout_sites(spec.model())
    if not sites:
        return None
    return sites, (f"draws other random masks for a batch split into {split} than for it whole" if split > 1 else
                   "draws its masks in the compiled kernels from another random stream than eager code")


class Executor:
    """Measures planned cases on one device and profile, keeping same-session baselines and guard references."""

    def __init__(self, backend: Backend, caps: DeviceCaps, profile: Profile, settings: MeasureSettings,
                 predictions: PredictionCache, fault: InjectedFault | None = None, predict: bool = False,
                 trace: TraceRequest | None = None, quick: bool = False):
        self.backend = backend
        self.caps = caps
        self.profile = profile
        self.settings = settings
        self.predictions = predictions
        self.fault = fault
        self.predict = predict  # predict each case's GPU-profile memory under FakeTensorMode (trainbench.core.analyses.predict)
        self.trace_request = trace  # profile traces of the cases it wants, taken after their measurement
        # --trainbench-quick: the timed rounds and only the passes the case's budget needs (_passes)
        self.quick = quick
        self.results: dict[tuple, Result] = {}  # same-session baselines, by setup
        self._trajectories: dict[tuple, list[float]] = {}  # baseline losses for the loss guard
        self._ddp_grads: dict | None = None  # first-step gradients rank 0 recorded for the guard

    # -- the case ----------------------------------------------------------------------------
    def execute(self, plan: CasePlan, outcome: CaseOutcome) -> CaseOutcome:
        """Measure the case and its baseline and guard it. What only the built model tells (for the case or its
        baseline) skips the case; a hang, a crashed process or too little memory fails this case alone."""
        self.backend.reset_peak_memory()  # an out-of-memory's "peak so far" is this case's, not an earlier one's
        try:
            with watch(self.settings.no_progress_s):
                outcome = self._measure_loaded(plan, outcome)
                outcome = outcome.failing(*_rank_failures(outcome))
                if plan.baseline is not None and not self.quick:
                    outcome = self._guard(plan, outcome)
        except NoProgress as e:  # a hung dataset, lock or wait: this case fails alone, the session goes on
            return failed_without_result(outcome, f"{outcome.case}: {e} (--trainbench-timeout sets the limit)")
        except ProcessFailed as e:  # a rank or fresh process crashed or hung: its traceback, this case alone fails
            return failed_without_result(outcome, str(e))
        except NonFiniteLoss as e:  # a diverged training measures nothing worth keeping
            return failed_without_result(outcome, f"{outcome.case}: {e}")
        except NotApplicable as e:
            return replace(outcome, skipped=f"{plan.recipe.name}: {e}")
        except (RuntimeError, MemoryError) as e:
            if is_out_of_memory(e):
                # This case alone fails; what it held goes back before the next case measures its peaks.
                return failed_without_result(outcome, self._out_of_memory(plan, e))
            if "DataLoader timed out" not in str(e):  # torch's message for a worker batch past `timeout`
                _add_hint(plan, e)
                raise
            return failed_without_result(outcome, (
                f"{outcome.case}: no progress for {plan.config.loader_timeout_s:g} s in the DataLoader (a worker "
                "did not deliver a batch: a hung dataset or transform); loader_timeout_s sets the limit"))
        except Exception as e:  # the spec's code or a library it calls: its own traceback, with what likely fixes it
            _add_hint(plan, e)
            raise
        if self.predicts(plan):  # fake tensors' limits are said (predict.unpredictable)
            with spent("predict"), heap_frozen():  # fake tensors' dispatch makes many objects: see heap_frozen
                predicted = self._predicted_memory(plan, outcome.result)
            outcome = self._revised(plan, outcome, predicted_memory=predicted)
        return self._revised(plan, outcome, notes=[*outcome.result.notes, *plan.notes, *self._quick_notes(plan)])

    def _passes(self, plan: CasePlan) -> tuple[str, ...] | None:
        """The passes after the timed rounds this case runs (None: all): a quick run's are those measuring what its
        budget names (``metrics.passes_measuring``), no others."""
        if not self.quick:
            return None
        return tuple(sorted(passes_measuring(b.metric for b in (plan.budget.bounds if plan.budget else ()))))

    def _runs(self, plan: CasePlan, phase: str) -> bool:
        passes = self._passes(plan)
        return passes is None or phase in passes

    def _settings(self, plan: CasePlan) -> MeasureSettings:
        passes = self._passes(plan)
        return self.settings if passes is None else replace(self.settings, passes=passes, attribution=False)

    def _quick_notes(self, plan: CasePlan) -> list[str]:
        if not self.quick:
            return []
        skipped = ["the correctness guard"] if plan.baseline is not None else []
        if self.predict and not self._runs(plan, "predict"):
            skipped.append("the GPU memory prediction")
        return [f"quick run (--trainbench-quick): {' and '.join(skipped)} skipped"] if skipped else []

    def measure_again(self, plan: CasePlan, outcome: CaseOutcome) -> CaseOutcome:
        """``outcome`` with the case and its baseline measured once more (raises ``NoProgress`` on a hang)."""
        with watch(self.settings.no_progress_s):
            return self._measure_loaded(plan, outcome, again=True)

    def trace(self, plan: CasePlan, outcome: CaseOutcome) -> CaseOutcome:
        """A profile trace of the case where one is asked for, outside its timed rounds (``trainbench.core.method.trace``)."""
        if self.trace_request is None or not self.trace_request.wants(outcome.case):
            return outcome
        traced = Context(traced=True, fresh_process=self.backend.fresh_process_reason)
        reason = why_not(plan.recipe, self.caps, self.profile, plan.spec, plan.config, traced)
        if reason:
            return replace(outcome, trace={"skipped": reason})
        try:
            with watch(self.settings.no_progress_s), spent("trace"):
                files = record_trace(plan.config, plan.spec, self.backend, self.trace_request.folder, outcome.case)
        except NoProgress as e:
            return failed_without_result(outcome, f"{outcome.case}: {e} (--trainbench-timeout sets the limit)")
        except OSError as e:  # a full disk, a folder gone or read-only: the trace is lost, not the measurement
            return replace(outcome, trace={"error": f"{type(e).__name__}: {e}"})
        return replace(outcome, trace={"files": [str(f) for f in files]})

    # -- measuring -----------------------------------------------------------------------------
    def _measure_loaded(self, plan: CasePlan, outcome: CaseOutcome, again: bool = False) -> CaseOutcome:
        """``outcome`` with the case and its baseline measured, and what other processes used of the machine
        meanwhile; what this session keeps of them for later cases is stored by setup key."""
        meter = LoadMeter().start()
        outcome, kept = self._measure(plan, outcome, outcome if again else None)
        load = meter.stop()
        loaded = {side: result.replace(machine_load=load) for side, result in
                  (("result", outcome.result), ("baseline", outcome.baseline))
                  if result is not None and result.machine_load is None}  # an earlier baseline keeps its own
        outcome = replace(outcome, **loaded)
        for key, side in kept.items():
            self.results[key] = getattr(outcome, side)
        _check_final_losses(outcome)
        return outcome

    def _revised(self, plan: CasePlan, outcome: CaseOutcome, **changes) -> CaseOutcome:
        """``outcome`` whose result has ``changes``, stored again where this session keeps it (``_measure``)."""
        outcome = replace(outcome, result=outcome.result.replace(**changes))
        if self.fault is None:
            self.results[self._key(plan, plan.recipe)] = outcome.result
        return outcome

    def _measure(self, plan: CasePlan, outcome: CaseOutcome, earlier: CaseOutcome | None = None
                 ) -> tuple[CaseOutcome, dict[tuple, str]]:
        """The case and its baseline, the way the plan says (``plan`` lists the ways and why each), and which of the
        two this session keeps as later cases' baselines: {setup key: "result" or "baseline"}.

        ``earlier``: this case's first measurement, when it is measured again for its timing: the memory and work
        passes (exact functions of code and shapes) are taken from it, not run again."""
        recipe, base, spec, settings = plan.recipe, plan.baseline, plan.spec, self._settings(plan)
        self.backend.release_cache()  # what earlier cases left cached is not this case's to reserve
        kept: dict[tuple, str] = {}
        if plan.measuring == FRESH_PROCESSES:
            outcome = self._measure_fresh(plan, outcome, settings)
        elif plan.measuring == PAIRED:
            result, baseline = self._measure_paired(plan, settings, earlier)
            outcome = replace(outcome, result=result, baseline=baseline, paired=True)
            if self._key(plan, base) not in self.results:  # one measured earlier stays the reference
                kept[self._key(plan, base)] = "baseline"
        else:
            result = self._measure_setup(recipe, spec, plan.config, plan.case, settings, fault=self.fault,
                                         want_grads=recipe.grad_rtol is not None,
                                         passes_from=earlier.result if earlier else None)
            baseline = outcome.baseline
            if plan.measuring == BASELINE_AFTER:  # a fresh baseline: one from minutes ago carries the drift since
                baseline = self._measure_setup(base, spec, plan.baseline_config, case_id(spec.name, base.name), settings,
                                               baseline=True, passes_from=earlier.baseline if earlier else None)
                kept[self._key(plan, base)] = "baseline"
                result = result.with_note(f"baseline {base.name} measured right after, not interleaved "
                                          f"({plan.why_measuring})")
            elif base:
                baseline = self.results.get(self._key(plan, base))
            outcome = replace(outcome, result=result, baseline=baseline)
        if self.fault is None:  # a planted regression must not become another case's baseline
            kept[self._key(plan, recipe)] = "result"
        return outcome, kept

    def _measure_paired(self, plan: CasePlan, settings: MeasureSettings, first: CaseOutcome | None = None
                        ) -> tuple[Result, Result]:
        """Both setups alive while their rounds alternate; each one's memory and work measured with it alone.

        The baseline's passes run before the case is built (or come from its earlier measurement in
        this session), the case's after the baseline is freed: a CUDA allocator peak is one setup's own.
        """
        recipe, base, spec = plan.recipe, plan.baseline, plan.spec
        earlier = self.results.get(self._key(plan, base))
        with spent("setup", baseline=True):
            tb = TrainingSetup(plan.baseline_config, spec, self.backend)
        try:
            mb = Measurer(tb, case_id(spec.name, base.name), base.name, settings, base.extra_warmup_steps,
                          self.profile.name, baseline=True)
            if earlier is not None and not self.quick:  # a quick run's passes are its case's own choice
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
                tc = TrainingSetup(plan.config, spec, self.backend, self.fault)
            with tc:
                mc = Measurer(tc, plan.case, recipe.name, settings, recipe.extra_warmup_steps, self.profile.name)
                interleave_rounds(mc, mb)
                tc.check_loss("the last timed step")
                tb.check_loss("the last timed step")  # no loop: its variable would keep the baseline alive below
                baseline = mb.finish()
                tb.close()
                tb = mb = None  # the baseline's tensors go before the case's memory is measured
                # A caching allocator's blocks (and the cycles holding them) go back; on the CPU nothing does: its
                # passes track what the case's own steps make, and a full collection there costs 0.1-0.3 s.
                self.backend.release_cache()
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
                plan.config, spec, self.backend, self.profile, settings, plan.case, recipe.name,
                recipe.extra_warmup_steps, env=self.backend.fresh_process_env(plan.config), want_losses=want_losses)
            child.phase_seconds = result.phase_seconds
        outcome = replace(outcome, result=result.with_note(f"why a fresh process: {plan.why_measuring}"))
        if base is not None:
            with in_child_process(baseline=True) as child:
                baseline, base_losses = measure_in_fresh_process(
                    plan.baseline_config, spec, self.backend, self.profile, settings, case_id(spec.name, base.name),
                    base.name, base.extra_warmup_steps, env=self.backend.fresh_process_env(plan.baseline_config),
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
                result, grads = measure_ddp(config, spec, self.backend, self.profile, settings, case, recipe.name,
                                            recipe.extra_warmup_steps, want_grads=want_grads,
                                            grads_dropout_off=want_grads and dropout_in_the_way(config, spec) is not None)
                child.phase_seconds = result.phase_seconds
            if grads is not None:
                self._ddp_grads = grads
            return result
        self.backend.release_cache()  # the setup measured before this one (a baseline after its case) is gone
        with spent("setup", baseline):
            training = TrainingSetup(config, spec, self.backend, fault)
        with training:
            m = Measurer(training, case, recipe.name, settings, recipe.extra_warmup_steps, self.profile.name,
                         baseline=baseline)
            return m.run(_rounds_checking_loss(training), passes_from)

    @staticmethod
    def _key(plan: CasePlan, recipe: Recipe) -> tuple:
        return plan.setup_key(recipe)

    def _out_of_memory(self, plan: CasePlan, error: Exception) -> str:
        """One line for an out-of-memory case, after giving back what it held."""
        peak = self.backend.peak_memory().allocated_bytes
        _drop_frames(error)  # the frames hold the dead setup's tensors: released, they free nothing
        self.backend.release_memory()
        total = self.backend.total_memory_bytes()
        figures = ", ".join(part for part in (
            f"peak so far {peak / 2**30:.2f} GiB" if peak is not None else "",
            f"device total {total / 2**30:.2f} GiB" if total is not None else "") if part)
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return (f"{plan.case}: out of memory at batch {plan.config.step_batch_size(plan.spec)}"
                + (f" ({figures})" if figures else "") + f": {first[:200]}")

    # -- checks and predictions ----------------------------------------------------------------------
    def _guard(self, plan: CasePlan, outcome: CaseOutcome) -> CaseOutcome:
        """``outcome`` with its guard verdicts: the case must train what its baseline trains, within the recipe's
        tolerance (trainbench.core.setups.guards)."""
        with phase("the correctness guard"), spent("guard"):
            verdicts = tuple(self._guard_checks(plan, outcome))
        outcome = self._revised(plan, replace(outcome, guard_checks=verdicts))
        return outcome.failing(*(f"{outcome.case}: correctness guard ({v.kind}): {v.message}"
                                 for v in verdicts if not v.ok))

    def _guard_checks(self, plan: CasePlan, outcome: CaseOutcome) -> list[guards.GuardCheck]:
        recipe, spec, config, base_config = plan.recipe, plan.spec, plan.config, plan.baseline_config
        dropout = dropout_in_the_way(plan.config, plan.spec)
        key = (*self._key(plan, plan.baseline), "dropout off") if dropout else self._key(plan, plan.baseline)
        runs = self._seeded_runs(plan, outcome, key, dropout_off=bool(dropout))
        verdicts = self._compared(plan, outcome, runs, key)
        if not dropout:
            return verdicts
        sites, why = dropout
        why = (f" (with dropout off on both sides: the model's dropout ({', '.join(sites[:3])}"
               f"{', ...' if len(sites) > 3 else ''}) {why})")
        return [replace(v, message=v.message + why) for v in verdicts]

    def _compared(self, plan: CasePlan, outcome: CaseOutcome, runs: dict, key: tuple) -> list[guards.GuardCheck]:
        recipe, spec, config, base_config = plan.recipe, plan.spec, plan.config, plan.baseline_config
        verdicts = []
        if recipe.loss_rtol is not None and outcome.fresh_losses is not None:
            verdicts.append(guards.compare_trajectories(*outcome.fresh_losses, recipe.loss_rtol))
        elif recipe.loss_rtol is not None:
            if key not in self._trajectories:
                self._trajectories[key] = runs[base_config].losses
            verdicts.append(guards.compare_trajectories(runs[config].losses, self._trajectories[key], recipe.loss_rtol))
        if recipe.grad_rtol is not None:
            # The baseline in one process, its batch split into the case's shards as its ranks split it (BatchNorm
            # normalizes each rank's samples alone): what DDP's averaged gradients equal.
            base_grads = runs[base_config.one_process_equivalent(config.shards)].gradients
            # A rank case's: recorded by rank 0 while the case was measured.
            grads = self._ddp_grads if config.rank_processes else runs[config].gradients
            verdict = guards.compare_gradients(grads, base_grads, recipe.grad_rtol, recipe.grad_measure)
            verdicts.append(guards.with_likely_cause(verdict, config, spec))
        return verdicts

    def _seeded_runs(self, plan: CasePlan, outcome: CaseOutcome, key: tuple, dropout_off: bool = False) -> dict:
        """What the case's guards need of setups trained from their seeds, each config built once for the case (the
        losses and the first gradients of one config come from one setup: ``guards.seeded_run``), by config.

        A guard's numbers are those of setups trained from their seeds, the same in every session. The setups the
        case and its baseline were measured with were such setups for their first steps: the losses of their warm-up's
        first steps (``Result.seeded_losses``) are the loss guard's trajectory, and no setup is built for them. What
        else the guards need (first-step gradients, a setup the measurement did not start from its seeds) is built
        here and does not outlive the case (the baseline's losses are kept, as numbers, for later cases of the same
        baseline)."""
        recipe, config, base_config = plan.recipe, plan.config, plan.baseline_config
        wants: dict = {}  # config -> what the guards take of it
        if recipe.loss_rtol is not None and outcome.fresh_losses is None:
            if key not in self._trajectories:
                wants.setdefault(base_config, set()).add("losses")
            wants.setdefault(config, set()).add("losses")
        shards_reference = None
        if recipe.grad_rtol is not None:
            reference = base_config.one_process_equivalent(config.shards)
            shards_reference = reference if config.shards > 1 else None
            wants.setdefault(reference, set()).add("gradients")
            if not config.rank_processes:
                wants.setdefault(config, set()).add("gradients")
        measured = {c: r.seeded_losses for c, r in ((base_config, outcome.baseline), (config, outcome.result))
                    if r is not None and r.seeded_losses and c != shards_reference and not dropout_off}
        runs = {}
        for c, want in wants.items():
            losses = measured.get(c) if "losses" in want else None
            build = want - {"losses"} if losses is not None else want
            run = (guards.seeded_run(c, plan.spec, self.backend, losses="losses" in build,
                                     gradients="gradients" in build, micro_batches_are_shards=c == shards_reference,
                                     dropout_off=dropout_off)
                   if build else guards.SeededRun())
            runs[c] = run if losses is None else replace(run, losses=losses)
        return runs

    def predicts(self, plan: CasePlan) -> bool:
        """Whether the case's memory is predicted after it is measured (``--trainbench-no-predict``, a quick run)."""
        return self.predict and self._runs(plan, "predict")

    def predicted_setups(self, plan: CasePlan) -> tuple[tuple[str, TrainConfig, TrainingSpec], ...] | str:
        """The setups the case's memory prediction asks ``predictions`` for, as (profile, config, spec): the GPU
        profile's, then this profile's (the check of the method on the run itself); or why there is no GPU-profile
        setup. A ladder rung runs on a GPU what ``plan.gpu_recipe`` says, judged on rung 0's data path."""
        gpu, gpu_recipe = PROFILES["gpu"], plan.gpu_recipe or plan.recipe
        base = plan.baseline if plan.ladder is None else None
        try:
            gpu_spec = resolve_spec(plan.source, gpu)
            judged = judging_overrides(gpu_recipe, base, gpu, gpu_spec, plan.user_overrides) if base else {}
            gpu_config = gpu_recipe.config(gpu, **{**judged, **plan.user_overrides})
        except ConfigError as e:
            return f"no GPU-profile setup: {e}"
        return ("gpu", gpu_config, gpu_spec), (self.profile.name, plan.config, plan.spec)

    def _predicted_memory(self, plan: CasePlan, result: Result) -> dict:
        """The GPU profile's memory predicted under FakeTensorMode, with a check of the method on this run itself:
        the prediction of the setup just measured against its measured breakdown (and allocator peak)."""
        setups = self.predicted_setups(plan)
        if isinstance(setups, str):
            return {"profile": "gpu", "reason": setups}
        gpu_setup, this_setup = setups
        predicted = {"profile": "gpu", **self.predictions(*gpu_setup)}
        if "breakdown_bytes" not in predicted:
            return predicted
        here = self.predictions(*this_setup)
        measured = result.memory_breakdown_bytes
        if "breakdown_bytes" in here and measured:
            differences = {k: [here["breakdown_bytes"].get(k, 0), v] for k, v in measured.items()
                           if here["breakdown_bytes"].get(k, 0) != v}
            predicted["check"] = {"profile": self.profile.name, "predicted_total": here["breakdown_bytes"]["total"],
                                  "measured_total": measured.get("total"), "matches": not differences,
                                  "differences": differences, "peak_allocated_bytes": result.peak_allocated_bytes}
        return predicted
