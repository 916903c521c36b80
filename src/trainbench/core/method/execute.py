"""Runs a planned case (``plan.CasePlan``): measures it and its baseline the way the plan says
(``case_measurement``), runs the correctness guard (``case_guard``), predicts its memory on the GPU profile
(``case_prediction``) and takes a profile trace where asked.

``Executor`` keeps what a session shares between cases through those pieces: the baselines measured so far (an
unpaired reference for later cases, and a paired baseline's memory and work), the baselines' loss trajectories for
the loss guard, and the gradients rank 0 recorded for the gradient guard. Each step takes a ``CaseOutcome`` and
returns a new one; what the session keeps for later cases it keeps by setup key (``CasePlan.setup_key``), stored
again whenever the case's result is revised.
"""

from __future__ import annotations

import traceback
from dataclasses import replace

import torch.utils.checkpoint

from trainbench.core.analyses.plan import CasePlan
from trainbench.core.analyses.predict import PredictionCache
from trainbench.core.analyses.step_memory import heap_frozen
from trainbench.core.harness.costs import spent
from trainbench.core.harness.watchdog import NoProgress, watch
from trainbench.core.method.case_guard import CaseGuard
from trainbench.core.method.case_measurement import CaseMeasurement
from trainbench.core.method.case_prediction import CasePrediction
from trainbench.core.method.distributed import ProcessFailed
from trainbench.core.method.measure import MeasureSettings
from trainbench.core.method.trace import TraceRequest, record_trace
from trainbench.core.records.metrics import passes_measuring
from trainbench.core.records.outcome import CaseOutcome, failed_without_result
from trainbench.core.records.result import Result
from trainbench.core.setups.eligibility import Context, why_not
from trainbench.core.setups.recipes import NotApplicable, TrainConfig
from trainbench.core.setups.spec import TrainingSpec
from trainbench.core.setups.training import InjectedFault, NonFiniteLoss
from trainbench.core.setups.workloads import Profile
from trainbench.devices.device import Backend, DeviceCaps, is_out_of_memory

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
    if not config.turned("recomputes") or not any(frame.f_code.co_filename == torch.utils.checkpoint.__file__
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


class Executor:
    """Measures planned cases on one device and profile, keeping same-session baselines and guard references."""

    def __init__(self, backend: Backend, caps: DeviceCaps, profile: Profile, settings: MeasureSettings,
                 predictions: PredictionCache, fault: InjectedFault | None = None, predict: bool = False,
                 trace: TraceRequest | None = None, quick: bool = False):
        self.backend = backend
        self.caps = caps
        self.profile = profile
        self.settings = settings
        self.fault = fault
        self.predict = predict  # predict each case's GPU-profile memory under FakeTensorMode (trainbench.core.analyses.predict)
        self.trace_request = trace  # profile traces of the cases it wants, taken after their measurement
        # --trainbench-quick: the timed rounds and only the passes the case's budget needs (_passes)
        self.quick = quick
        self.measurement = CaseMeasurement(backend, profile, fault, quick)
        self.guard = CaseGuard(backend)
        self.prediction = CasePrediction(profile, predictions)

    @property
    def results(self) -> dict[tuple, Result]:
        """Same-session baselines, by setup."""
        return self.measurement.results

    @property
    def predictions(self) -> PredictionCache:
        return self.prediction.predictions

    # -- the case ----------------------------------------------------------------------------
    def execute(self, plan: CasePlan, outcome: CaseOutcome) -> CaseOutcome:
        """Measure the case and its baseline and guard it. What only the built model tells (for the case or its
        baseline) skips the case; a hang, a crashed process or too little memory fails this case alone."""
        self.backend.reset_peak_memory()  # an out-of-memory's "peak so far" is this case's, not an earlier one's
        try:
            with watch(self.settings.no_progress_s):
                outcome = self.measurement.measured(plan, outcome, self._settings(plan))
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
                predicted = self.prediction.memory(plan, outcome.result)
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
            return self.measurement.measured(plan, outcome, self._settings(plan), again=True)

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

    def _revised(self, plan: CasePlan, outcome: CaseOutcome, **changes) -> CaseOutcome:
        """``outcome`` whose result has ``changes``, stored again where this session keeps it (``CaseMeasurement``)."""
        outcome = replace(outcome, result=outcome.result.replace(**changes))
        if self.fault is None:
            self.results[plan.setup_key(plan.recipe)] = outcome.result
        return outcome

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

    def _guard(self, plan: CasePlan, outcome: CaseOutcome) -> CaseOutcome:
        """``outcome`` with its guard verdicts: the case must train what its baseline trains, within the recipe's
        tolerance (trainbench.core.setups.guards)."""
        verdicts = self.guard.checks(plan, outcome, self.measurement.ddp_grads)
        outcome = self._revised(plan, replace(outcome, guard_checks=verdicts))
        return outcome.failing(*(f"{outcome.case}: correctness guard ({v.kind}): {v.message}"
                                 for v in verdicts if not v.ok))

    def predicts(self, plan: CasePlan) -> bool:
        """Whether the case's memory is predicted after it is measured (``--trainbench-no-predict``, a quick run)."""
        return self.predict and self._runs(plan, "predict")

    def predicted_setups(self, plan: CasePlan) -> tuple[tuple[str, TrainConfig, TrainingSpec], ...] | str:
        """The setups the case's memory prediction asks ``predictions`` for (``CasePrediction.predicted_setups``)."""
        return self.prediction.predicted_setups(plan)
