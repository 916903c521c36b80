"""Runs one case: the decisions behind every number, free of pytest so that pytest and asv judge alike.

``Runner.run`` takes a recipe and a training spec and

1. says whether the case can run here, and if not why (``recipes.unmet``, then what only the
   built model tells: ``NotApplicable``);
2. resolves the case's baseline recipe, and measures the two **interleaved** (ABBA rounds,
   both setups alive) when a ratio budget will judge them and neither flips process-wide
   state; otherwise measures the case alone and, for a ratio budget, a fresh baseline right
   after it (an earlier result serves only as an *unpaired* reference);
3. dispatches DDP cases to rank processes (``trainbench.distributed``);
4. runs the correctness guards against the baseline;
5. checks the case's budget, and returns a ``CaseOutcome`` whose ``record()`` is the one
   serialized form of the case.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from .budgets import Budgets, CaseBudget, Verdict, evaluate
from .cases import Case
from .device import Backend
from .distributed import ProcessFailed
from .guards import GuardVerdict
from .ladders import LADDERS
from .measure import Measurement, MeasureSettings, interleave_rounds, run_rounds
from .recipes import NotApplicable, Recipe, TrainConfig, get_recipe, judging_overrides, unmet
from .result import Result, case_record
from .spec import TrainingSpec
from .step import InjectedFault, Training
from .trace import TraceRequest
from .watchdog import NoProgress, phase, watch
from .workloads import Profile, SpecSource, resolve_spec


def interleave_blocker(config: TrainConfig) -> str | None:
    """Why a setup cannot be timed side by side with another in one process, or None.

    DDP ranks are other processes; these knobs flip process-wide state, so the other
    setup's rounds would run under them too.
    """
    if config.rank_processes:
        return f"{config.parallel.upper()} ranks run in other processes"
    for knob in ("cudnn_benchmark", "deterministic", "debug", "empty_cache"):
        if getattr(config, knob):
            return f"{knob} changes process-wide state"
    return None


@dataclass
class CaseOutcome:
    """What running a case gave: its result, its baseline, the checks and their failures."""

    case: str
    recipe: Recipe
    result: Result | None = None
    skipped: str | None = None
    baseline_recipe: Recipe | None = None
    baseline: Result | None = None
    paired: bool = False  # the baseline's rounds were interleaved with the case's
    budget: CaseBudget | None = None
    budget_missing: str | None = None  # why no budget applies ("no budgets file ...", "no section ...")
    budget_required: bool = False  # a missing budget fails the case (--trainbench-require-budgets)
    budget_verdicts: list[Verdict] = field(default_factory=list)
    guard_verdicts: list[GuardVerdict] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    ladder: dict | None = None
    error: str | None = None  # the case failed before it had a result (out of memory)
    fresh_losses: tuple[list[float], list[float]] | None = None  # the loss guard's inputs, run in the fresh processes
    trace: dict | None = None  # a profile trace asked for: {"files": [...]} or {"skipped": why} (trainbench.trace)

    @property
    def speedup(self) -> float | None:
        if self.baseline is None or not self.baseline.samples_per_s or not self.result or not self.result.samples_per_s:
            return None
        return self.result.samples_per_s / self.baseline.samples_per_s

    @property
    def budget_status(self) -> str:
        if self.budget is None:
            return "FAIL" if self.budget_required else "none"
        failed = sum(not v.ok and v.inconclusive is None for v in self.budget_verdicts)
        unsure = sum(v.inconclusive is not None for v in self.budget_verdicts)
        n = len(self.budget_verdicts)
        if failed:
            return f"FAIL {failed}/{n}"
        return f"ok {n - unsure}, {unsure} inconclusive" if unsure else f"ok {n}"

    def budget_failures(self) -> list[str]:
        """One line per budget bound this case failed (inconclusive ones are not failures)."""
        return [f"{self.case} [{self.budget.device_key}]: {v.message}" for v in self.budget_verdicts
                if not v.ok and v.inconclusive is None]

    @property
    def inconclusive(self) -> list[str]:
        """One line per timed budget the rounds could not judge (noise, a busy machine)."""
        return [f"{self.case} [{self.budget.device_key}]: inconclusive: {v.message}: {v.inconclusive}"
                for v in self.budget_verdicts if v.inconclusive is not None]

    def record(self) -> dict:
        """The case's serialized form (pytest-benchmark extra_info, asv, the gate, the report)."""
        fields: dict = {"baseline": self.baseline_recipe.name if self.baseline_recipe else None,
                        "speedup_vs_baseline": self.speedup, "paired": self.paired}
        if self.budget is None:
            fields["budget"] = {"status": "none", "reason": self.budget_missing}
        else:
            fields["budget"] = {
                "status": ("fail" if any(not v.ok and v.inconclusive is None for v in self.budget_verdicts) else
                           "inconclusive" if any(v.inconclusive for v in self.budget_verdicts) else "pass"),
                "device_key": self.budget.device_key, "file": str(self.budget.path) if self.budget.path else None,
                "checks": [{"key": v.bound.key, "measured": v.measured, "limit": v.bound.limit, "ok": v.ok,
                            "message": v.message, "inconclusive": v.inconclusive} for v in self.budget_verdicts],
            }
        if self.guard_verdicts:
            fields["guard"] = {
                "baseline": self.baseline_recipe.name,
                "checks": [{"kind": v.kind, "ok": v.ok, "max_rel_diff": v.max_rel_diff, "message": v.message,
                            "rtol": self.recipe.loss_rtol if v.kind == "loss" else self.recipe.grad_rtol,
                            "losses": v.losses, "baseline_losses": v.baseline_losses} for v in self.guard_verdicts],
            }
        if self.ladder is not None:
            fields["ladder"] = self.ladder
        if self.trace is not None:
            fields["trace"] = self.trace
        record = case_record(self.result, **fields)
        if record["ranks"] and self.speedup is not None:
            ranks = record["ranks"] = {**record["ranks"], "speedup_vs": self.baseline_recipe.name}
            if not self.baseline.ranks:
                # vs one process training the same global batch: the speed-up over what perfect scaling would give
                ranks["scaling_efficiency"] = self.speedup / ranks["ideal_speedup"]
        return record


def _rank_failures(outcome: CaseOutcome) -> list[str]:
    """Data-parallel ranks must hold identical gradients after the all-reduce; one line when they do not."""
    spread = (outcome.result.ranks or {}).get("max_grad_difference_between_ranks")
    if not spread:
        return []
    return [(f"{outcome.case}: the ranks' first-step gradients differ after DDP's all-reduce (largest difference "
            f"{spread:.3g}); every rank must hold the same gradients")]


def _failed_without_result(outcome: CaseOutcome, error: str) -> CaseOutcome:
    """A case that ended before it had a result: no numbers, one line saying why."""
    outcome.result = outcome.baseline = None
    outcome.error = error
    outcome.failures.append(error)
    return outcome


class Runner:
    """Runs cases on one device and profile, keeping same-session baselines and guard references."""

    def __init__(self, backend: Backend, profile: Profile, settings: MeasureSettings, fault: InjectedFault | None = None,
                 require_budgets: bool = False, predict: bool = False, strict_timing: bool = False,
                 remeasure_inconclusive: int = 1, trace: TraceRequest | None = None):
        self.backend = backend
        self.trace = trace  # profile traces of the cases it wants, taken after their measurement
        # Why this session's timing means nothing (e.g. parallel workers sharing the device): timed budgets are
        # then not judged, deterministic ones are.
        self.untimed: str | None = None
        # A timed budget the rounds cannot judge is measured again (at most this many times), then reported as
        # inconclusive; ``strict_timing`` fails it instead.
        self.strict_timing = strict_timing
        self.remeasure_inconclusive = remeasure_inconclusive
        self.predict = predict  # predict each case's GPU-profile memory under FakeTensorMode (trainbench.predict)
        self._predictions: dict[tuple, dict] = {}  # by (profile, spec, config): ladders and the GPU memory gate repeat
        self.caps = backend.caps()
        self.profile = profile
        self.settings = settings
        self.fault = fault
        self.require_budgets = require_budgets
        self.results: dict[tuple, Result] = {}  # same-session baselines, by setup
        self._trajectories: dict[tuple, list[float]] = {}  # baseline losses for the loss guard
        self._ddp_grads: dict | None = None  # first-step gradients rank 0 recorded for the guard

    # -- can it run? -------------------------------------------------------------------
    def skip_reason(self, recipe: Recipe, spec: TrainingSpec, overrides: dict | None = None) -> str | None:
        """Why this case cannot run here (device, spec), or None. An override that contradicts the recipe raises."""
        config = recipe.config(self.profile, **(overrides or {}))
        return unmet(recipe, self.caps, self.profile, spec, config)

    # -- one case ------------------------------------------------------------------------
    def run(self, recipe: Recipe | str, spec: SpecSource, *, baseline: Recipe | str | None = None,
            budgets: Budgets | None = None, case: str | None = None, overrides: dict | None = None,
            ladder: dict | None = None, gpu_recipe: Recipe | None = None) -> CaseOutcome:
        """Measure ``recipe`` on ``spec`` against ``baseline`` (default: the recipe's own), check it, and say how it went.

        ``gpu_recipe``: what the case runs on a GPU where that differs from ``recipe`` (a ladder rung that
        leaves out a GPU-only step here); its memory is the one predicted for the GPU profile.
        """
        recipe = recipe if isinstance(recipe, Recipe) else get_recipe(recipe)
        source, user_overrides = spec, dict(overrides or {})
        spec = resolve_spec(spec, self.profile)
        overrides = dict(user_overrides)
        case = case or f"{spec.name}-{recipe.name}"
        outcome = CaseOutcome(case, recipe, ladder=ladder)
        base = baseline if baseline is not None else recipe.baseline
        base = base if isinstance(base, Recipe) else get_recipe(base)
        outcome.baseline_recipe = None if base.name == recipe.name else base
        judged_on = {}
        if ladder is None and outcome.baseline_recipe is not None:  # a ladder climbs from its loader-bound rung 0
            judged_on = judging_overrides(recipe, outcome.baseline_recipe, self.profile, spec, overrides)
            overrides = {**judged_on, **overrides}

        outcome.skipped = self.skip_reason(recipe, spec, overrides)
        if outcome.skipped is None and outcome.baseline_recipe is not None:
            reason = self.skip_reason(outcome.baseline_recipe, spec, overrides)
            outcome.skipped = f"{recipe.name}: its baseline {reason}" if reason else None
        for r in (recipe, outcome.baseline_recipe):  # both must fit: they are built side by side
            if outcome.skipped is None and r is not None:
                outcome.skipped = self.memory_skip_reason(r, spec, overrides)
        if outcome.skipped:
            return outcome
        budgets = budgets or Budgets.empty()
        outcome.budget, outcome.budget_missing = budgets.lookup(self.caps, case)
        try:  # what only the built model tells (for the case or its baseline) skips the case
            with watch(self.settings.no_progress_s):
                self._measure_loaded(outcome, spec, overrides)
                outcome.failures += _rank_failures(outcome)
                if outcome.baseline_recipe is not None:
                    started = time.perf_counter()
                    with phase("the correctness guard"):
                        outcome.guard_verdicts = self._guard(outcome, spec, overrides)
                    outcome.result.phase_seconds["guard"] = time.perf_counter() - started
        except NoProgress as e:  # a hung dataset, lock or wait: this case fails alone, the session goes on
            return _failed_without_result(outcome, f"{outcome.case}: {e} (--trainbench-timeout sets the limit)")
        except ProcessFailed as e:  # a rank or fresh process crashed or hung: its traceback, this case alone fails
            return _failed_without_result(outcome, str(e))
        except NotApplicable as e:
            outcome.skipped = f"{recipe.name}: {e}"
            return outcome
        except torch.OutOfMemoryError as e:
            # This case alone fails; what it held goes back before the next case measures its peaks.
            return _failed_without_result(outcome, self._out_of_memory(outcome.case, self._config(recipe, overrides),
                                                                       spec, e))
        except RuntimeError as e:
            if "DataLoader timed out" not in str(e):  # torch's message for a worker batch past `timeout`
                raise
            return _failed_without_result(outcome, (
                f"{outcome.case}: no progress for {self._config(recipe, overrides).loader_timeout_s:g} s in the "
                "DataLoader (a worker did not deliver a batch: a hung dataset or transform); loader_timeout_s sets "
                "the limit"))
        if self.predict:  # DDP and the other setups fake tensors cannot run say why (predict.unpredictable)
            started = time.perf_counter()
            outcome.result.predicted_memory = self._predicted_memory(
                gpu_recipe or recipe, outcome.baseline_recipe if ladder is None else None, source, user_overrides,
                self._config(recipe, overrides), spec, outcome.result)
            outcome.result.phase_seconds["predict"] = time.perf_counter() - started
        if judged_on:
            outcome.result.notes.append(
                f"judged against {base.name} with both on {judged_on['synthetic']}-side synthetic batches: the "
                "loader-bound baseline's data path would hide (or fake) a compute change")
        self._check_budget(outcome)
        for attempt in range(self.remeasure_inconclusive):
            if not outcome.inconclusive:
                break
            try:
                with watch(self.settings.no_progress_s):
                    self._remeasure(outcome, spec, overrides, attempt + 1)
            except NoProgress as e:
                return _failed_without_result(outcome, f"{outcome.case}: {e}, measuring it again "
                                                       "(--trainbench-timeout sets the limit)")
        if self.trace is not None and self.trace.wants(outcome.case):
            try:
                with watch(self.settings.no_progress_s):
                    outcome.trace = self._record_trace(outcome.case, self._config(recipe, overrides), spec)
            except NoProgress as e:
                return _failed_without_result(outcome, f"{outcome.case}: {e} (--trainbench-timeout sets the limit)")
        return outcome

    def _record_trace(self, case: str, config: TrainConfig, spec: TrainingSpec) -> dict:
        """A profile trace of the case, outside its timed rounds (``trainbench.trace``)."""
        from .trace import record_trace, untraceable

        reason = untraceable(config, self.backend.fresh_process_reason(config))
        if reason:
            return {"skipped": reason}
        files = record_trace(config, spec, self.backend, self.trace.folder, case)
        return {"files": [str(f) for f in files]}

    def _measure_loaded(self, outcome: CaseOutcome, spec: TrainingSpec, overrides: dict) -> None:
        """Measure the case and its baseline, recording what other processes used of the machine meanwhile."""
        from .host import LoadMeter

        meter = LoadMeter().start()
        self._measure_with_baseline(outcome, spec, overrides)
        load = meter.stop()
        for result in (outcome.result, outcome.baseline):  # a baseline from earlier in the session keeps its own
            if result is not None and result.machine_load is None:
                result.machine_load = load

    def _remeasure(self, outcome: CaseOutcome, spec: TrainingSpec, overrides: dict, attempt: int) -> None:
        """Measure an inconclusive case again (timing, memory and work) and judge it on the new measurement.

        The guard verdicts and the GPU prediction do not depend on timing and are kept."""
        why = "; ".join(dict.fromkeys(v.inconclusive for v in outcome.budget_verdicts if v.inconclusive))
        first = outcome.result
        judged_before = set(outcome.budget_failures())  # the new measurement is judged afresh
        outcome.failures = [f for f in outcome.failures if f not in judged_before]
        self._measure_loaded(outcome, spec, overrides)
        outcome.result.predicted_memory = first.predicted_memory
        outcome.result.phase_seconds.update({k: v for k, v in first.phase_seconds.items() if k in ("guard", "predict")})
        outcome.result.notes.append(
            f"measured again (attempt {attempt + 1}): the first measurement's timed budgets were inconclusive ({why}; "
            f"{first.samples_per_s or 0:.4g} samples/s, rounds {', '.join(f'{t * 1e3:.1f}' for t in first.round_step_times_s)} ms)")
        self._check_budget(outcome)

    def _out_of_memory(self, case: str, config: TrainConfig, spec: TrainingSpec, error: Exception) -> str:
        """One line for an out-of-memory case, after giving back what it held."""
        peak = self.backend.peak_memory().allocated_bytes
        self.backend.release_memory()
        total = self.backend.total_memory_bytes()
        figures = ", ".join(part for part in (
            f"peak so far {peak / 2**30:.2f} GiB" if peak is not None else "",
            f"device total {total / 2**30:.2f} GiB" if total is not None else "") if part)
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return (f"{case}: out of memory at batch {config.step_batch_size(spec)}"
                + (f" ({figures})" if figures else "") + f": {first[:200]}")

    def memory_skip_reason(self, recipe: Recipe, spec: TrainingSpec, overrides: dict) -> str | None:
        """Why a case would run out of this device's memory, from its predicted tensor peak, or None.

        Compiled and parallel setups are predicted without compilation and as one process of the
        same batch: close enough to tell that a 24 GiB setup will not fit a 16 GiB GPU.
        """
        total = self.backend.total_memory_bytes()
        if total is None:
            return None
        from .predict import HEADROOM, without_unpredictable

        config = without_unpredictable(self._config(recipe, overrides))
        predicted = self._predict(self.profile.name, config, spec).get("breakdown_bytes")
        if predicted and predicted["total"] * HEADROOM > total:
            return (f"{recipe.name}: needs ~{predicted['total'] * HEADROOM / 2**30:.1f} GiB (predicted tensor peak "
                    f"{predicted['total'] / 2**30:.1f} GiB + {HEADROOM - 1:.0%} for the allocator and workspaces); "
                    f"{self.backend.name} has {total / 2**30:.1f} GiB")
        return None

    def _predicted_memory(self, gpu_recipe: Recipe, base: Recipe | None, source: SpecSource, user_overrides: dict,
                          config: TrainConfig, spec: TrainingSpec, result: Result) -> dict:
        """The GPU profile's memory predicted under FakeTensorMode, with a check of the method on this run itself:
        the prediction of the setup just measured against its measured breakdown (and allocator peak)."""
        from .recipes import ConfigError
        from .workloads import PROFILES

        gpu = PROFILES["gpu"]
        try:
            gpu_spec = resolve_spec(source, gpu)
            judged = judging_overrides(gpu_recipe, base, gpu, gpu_spec, user_overrides) if base else {}
            gpu_config = gpu_recipe.config(gpu, **{**judged, **user_overrides})
        except ConfigError as e:
            return {"profile": "gpu", "reason": f"no GPU-profile setup: {e}"}
        predicted = {"profile": "gpu", **self._predict("gpu", gpu_config, gpu_spec)}
        if "breakdown_bytes" not in predicted:
            return predicted
        here = self._predict(self.profile.name, config, spec)
        measured = result.memory_breakdown_bytes
        if "breakdown_bytes" in here and measured:
            differences = {k: [here["breakdown_bytes"].get(k, 0), v] for k, v in measured.items()
                           if here["breakdown_bytes"].get(k, 0) != v}
            predicted["check"] = {"profile": self.profile.name, "predicted_total": here["breakdown_bytes"]["total"],
                                  "measured_total": measured.get("total"), "matches": not differences,
                                  "differences": differences, "peak_allocated_bytes": result.peak_allocated_bytes}
        return predicted

    def _predict(self, profile_name: str, config: TrainConfig, spec: TrainingSpec) -> dict:
        """``predict.predict_memory``, once per setup in a session (a second or more each)."""
        from .predict import predict_memory

        key = (profile_name, spec.name, config)
        if key not in self._predictions:
            self._predictions[key] = predict_memory(config, spec, self.backend)
        return self._predictions[key]

    def case_skip_reason(self, case: Case) -> str | None:
        """Why this device cannot run a suite case, known without building it (a rung needs what its own step needs)."""
        return unmet(case.own_recipe(), self.caps, self.profile)

    def run_case(self, case: Case, budgets: Budgets | None = None, **overrides) -> CaseOutcome:
        """A suite case (``trainbench.cases``): a recipe on a built-in workload, or a ladder rung against rung 0."""
        if case.ladder is None:
            return self.run(case.recipe_name, case.workload, budgets=budgets, case=case.id, overrides=overrides)
        reason = self.case_skip_reason(case)
        if reason:
            return CaseOutcome(case.id, case.own_recipe(), skipped=reason)
        ladder = LADDERS[case.ladder]
        from .predict import NOMINAL_GPU
        from .workloads import PROFILES

        return self.run(ladder.rung_recipe(case.rung, self.caps, self.profile), case.workload,
                        baseline=ladder.rung_recipe(0, self.caps, self.profile), budgets=budgets, case=case.id,
                        overrides=overrides, ladder=ladder.rung_info(case.rung, self.caps, self.profile),
                        gpu_recipe=ladder.rung_recipe(case.rung, NOMINAL_GPU, PROFILES["gpu"]))

    def _config(self, recipe: Recipe, overrides: dict) -> TrainConfig:
        return recipe.config(self.profile, **overrides)

    def _key(self, spec: TrainingSpec, recipe: Recipe, overrides: dict) -> tuple:
        return (spec.name, recipe.name, tuple(sorted(overrides.items())))

    def _measure_with_baseline(self, outcome: CaseOutcome, spec: TrainingSpec, overrides: dict) -> None:
        recipe, base = outcome.recipe, outcome.baseline_recipe
        needs_ratio = outcome.budget is not None and outcome.budget.needs_baseline
        config = self._config(recipe, overrides)
        base_config = self._config(base, overrides) if base else None
        fresh = self.backend.fresh_process_reason(config)
        if fresh:
            self._measure_fresh(outcome, spec, config, base_config, fresh)
        elif base and needs_ratio and not interleave_blocker(config) and not interleave_blocker(base_config):
            outcome.result, outcome.baseline = self._measure_interleaved(outcome, spec, config, base_config, overrides)
            outcome.paired = True
            self.results.setdefault(self._key(spec, base, overrides), outcome.baseline)
        else:
            outcome.result = self._measure(recipe, spec, config, outcome.case, fault=self.fault,
                                           want_grads=recipe.grad_rtol is not None)
            if base and needs_ratio:  # a fresh baseline: one from minutes ago carries the machine's drift since
                outcome.baseline = self._measure(base, spec, base_config, f"{spec.name}-{base.name}")
                self.results[self._key(spec, base, overrides)] = outcome.baseline
                outcome.result.notes.append(f"baseline {base.name} measured right after, not interleaved "
                                            f"({interleave_blocker(config) or interleave_blocker(base_config)})")
            elif base:
                outcome.baseline = self.results.get(self._key(spec, base, overrides))
        if self.fault is None:  # a planted regression must not become another case's baseline
            self.results[self._key(spec, recipe, overrides)] = outcome.result

    def _measure_interleaved(self, outcome: CaseOutcome, spec: TrainingSpec, config: TrainConfig,
                             base_config: TrainConfig, overrides: dict) -> tuple[Result, Result]:
        """Both setups alive while their rounds alternate; each one's memory and work measured with it alone.

        The baseline's passes run before the case is built (or come from its earlier measurement in
        this session), the case's after the baseline is freed: a CUDA allocator peak is one setup's own.
        """
        recipe, base, settings = outcome.recipe, outcome.baseline_recipe, self.settings
        earlier = self.results.get(self._key(spec, base, overrides))
        tb = Training(base_config, spec, self.backend)
        try:
            mb = Measurement(tb, f"{spec.name}-{base.name}", base.name, settings, base.extra_warmup_steps,
                             self.profile.name)
            mb.warm_up(settle=earlier is None)  # one measured earlier already found its steady state
            if earlier is not None:
                mb.reuse_passes(earlier)
            else:
                mb.measure_after_timing()
            with Training(config, spec, self.backend, self.fault) as tc:
                mc = Measurement(tc, outcome.case, recipe.name, settings, recipe.extra_warmup_steps, self.profile.name)
                interleave_rounds(mc, mb)
                baseline = mb.finish()
                tb.close()
                tb = mb = None  # the baseline's tensors go before the case's memory is measured
                self.backend.release_memory()
                mc.measure_after_timing()
                result = mc.finish()
        finally:
            if tb is not None:
                tb.close()
        result.notes.append(f"rounds interleaved with {base.name}'s (ABBA) for its ratio budgets")
        return result, baseline

    def _measure_fresh(self, outcome: CaseOutcome, spec: TrainingSpec, config: TrainConfig,
                       base_config: TrainConfig | None, reason: str) -> None:
        """The case and its baseline, each in a new process (``Backend.fresh_process_reason`` says why)."""
        from .distributed import measure_in_fresh_process

        recipe, base = outcome.recipe, outcome.baseline_recipe
        want_losses = base is not None and recipe.loss_rtol is not None
        outcome.result, losses = measure_in_fresh_process(
            config, spec, self.backend, self.profile, self.settings, outcome.case, recipe.name,
            recipe.extra_warmup_steps, env=self.backend.fresh_process_env(config), want_losses=want_losses)
        outcome.result.notes.append(f"why a fresh process: {reason}")
        if base is not None:
            outcome.baseline, base_losses = measure_in_fresh_process(
                base_config, spec, self.backend, self.profile, self.settings, f"{spec.name}-{base.name}", base.name,
                base.extra_warmup_steps, env=self.backend.fresh_process_env(base_config), want_losses=want_losses)
            if want_losses:
                outcome.fresh_losses = (losses, base_losses)

    def _measure(self, recipe: Recipe, spec: TrainingSpec, config: TrainConfig, case: str,
                 fault: InjectedFault | None = None, want_grads: bool = False) -> Result:
        if config.rank_processes:
            from .distributed import measure_ddp

            result, grads = measure_ddp(config, spec, self.backend, self.profile, self.settings, case, recipe.name,
                                        recipe.extra_warmup_steps, want_grads=want_grads)
            if grads is not None:
                self._ddp_grads = grads
            return result
        with Training(config, spec, self.backend, fault) as training:
            m = Measurement(training, case, recipe.name, self.settings, recipe.extra_warmup_steps, self.profile.name)
            return m.run(run_rounds)

    # -- checks ------------------------------------------------------------------------------
    def _guard(self, outcome: CaseOutcome, spec: TrainingSpec, overrides: dict) -> list[GuardVerdict]:
        """The case must train what its baseline trains, within the recipe's tolerance (trainbench.guards)."""
        from .guards import compare_gradients, compare_trajectories, first_step_gradients, loss_trajectory

        recipe, base = outcome.recipe, outcome.baseline_recipe
        config, base_config = self._config(recipe, overrides), self._config(base, overrides)
        verdicts = []
        if recipe.loss_rtol is not None and outcome.fresh_losses is not None:
            verdicts.append(compare_trajectories(*outcome.fresh_losses, recipe.loss_rtol))
        elif recipe.loss_rtol is not None:
            key = self._key(spec, base, overrides)
            if key not in self._trajectories:
                self._trajectories[key] = loss_trajectory(base_config, spec, self.backend)
            losses = loss_trajectory(config, spec, self.backend)
            verdicts.append(compare_trajectories(losses, self._trajectories[key], recipe.loss_rtol))
        if recipe.grad_rtol is not None:
            # A baseline trained by rank processes (fsdp_gloo's ddp_gloo) has the gradients of its one-process equal.
            base_grads = first_step_gradients(base_config.one_process_equivalent(), spec, self.backend)
            if config.rank_processes:  # recorded by rank 0 while the case was measured
                grads = self._ddp_grads
            else:
                grads = first_step_gradients(config, spec, self.backend)
            verdicts.append(compare_gradients(grads, base_grads, recipe.grad_rtol))
        outcome.failures += [f"{outcome.case}: correctness guard ({v.kind}): {v.message}" for v in verdicts if not v.ok]
        return verdicts

    def _check_budget(self, outcome: CaseOutcome) -> None:
        if outcome.budget is None:
            if self.require_budgets:
                outcome.budget_required = True
                outcome.failures.append(f"{outcome.case}: {outcome.budget_missing} (--trainbench-require-budgets)")
            return
        verdicts = evaluate(outcome.budget, outcome.result, outcome.baseline)
        if self.untimed:
            from .metrics import is_timed

            left_out = [v.bound.key for v in verdicts if is_timed(v.bound.metric)]
            verdicts = [v for v in verdicts if not is_timed(v.bound.metric)]
            if left_out:
                outcome.result.notes.append(f"timed budgets not judged ({', '.join(left_out)}): {self.untimed}")
        outcome.budget_verdicts = [self._judged(v, outcome) for v in verdicts]
        outcome.failures += outcome.budget_failures()

    def _judged(self, verdict: Verdict, outcome: CaseOutcome) -> Verdict:
        """A missed timed bound whose rounds cannot show the miss (``noise.inconclusive_reason``) is inconclusive,
        unless ``strict_timing``; deterministic bounds stand as evaluated."""
        from dataclasses import replace

        from .metrics import per_round
        from .noise import inconclusive_reason

        b = verdict.bound
        if verdict.ok or verdict.measured is None or self.strict_timing:
            return verdict
        result, base = outcome.result, outcome.baseline if b.relative else None
        current = per_round(b.metric, result.metrics().get(b.metric), result.round_step_times_s)
        reference = per_round(b.metric, base.metrics().get(b.metric), base.round_step_times_s) if base else None
        reason = inconclusive_reason(b.metric, b.limit, verdict.measured, current, reference, outcome.paired,
                                     [result.machine_load] + ([base.machine_load] if base else []))
        return replace(verdict, inconclusive=reason) if reason else verdict
