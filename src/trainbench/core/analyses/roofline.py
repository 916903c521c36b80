"""What bounds a training step on a GPU, and how fast it can be at best: a roofline of its work.

A step does ``flops`` of arithmetic, moves ``bytes`` through device memory and launches ``launches``
kernels. On a GPU with peak ``P`` FLOP/s (in the precision the step computes in), bandwidth ``B`` and a
cost ``LAUNCH_S`` per launch, it cannot take less than any of ``flops / P``, ``bytes / B`` and
``launches x LAUNCH_S``; the largest of the three names what it is bound by (compute, memory,
launch) and is the step's lower bound. The pure functions here take plain numbers; ``StepCounts``
comes from one step under ``FakeTensorMode`` (``count_step``, cached by ``CountCache``), the way
``predict.predict_memory`` predicts memory, so any GPU's roofline is drawn on a CPU.

How each count is estimated:

- FLOPs: ``FlopCounterMode`` (matmuls, convolutions, attention; elementwise ops count none). Convolution
  FLOPs are priced at the peak of the precision cuDNN computes them in, the rest at the matmuls'
  (``Backend.mfu_peak`` by convolution share), so a TF32 convolution is not priced at the fp32 peak.
- bytes: every op that launches a kernel reads its tensor inputs and writes its outputs once
  (views move nothing). An estimate, not a bound: the L2 cache spares some re-reads of small
  tensors between ops, and tiled matmuls re-read their operands.
- launches: one per dispatched op that launches a kernel (views and ``empty`` launch none), as
  eager PyTorch runs it; a foreach op launching several counts one, so this under-counts. A
  compiled setup fuses its ops: it has no launch count (``None``) and no launch term.
The loader is not part of the roofline: a step waiting on its data is slower than its bound.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode

from trainbench.core.harness.failures import failure_line
from trainbench.core.analyses.predict import (
    NotPredictable,
    SharedPredictions,
    fake_training,
    unpredictable,
)
from trainbench.core.setups.recipes import TrainConfig, without_unpredictable
from trainbench.core.setups.spec import TrainingSpec, code_fingerprint
from trainbench.devices.device import Backend
from trainbench.devices.caps import convolution_share

# The host's cost to dispatch one eager op and launch its kernel: ~5 us through PyTorch's eager dispatcher on a
# fast host (the CUDA launch alone is 2-3 us). One figure, so every launch term in a plan prices launches alike.
LAUNCH_S = 5e-6

# A min_speedup above the roofline's allowed speed-up by more than this is flagged: the counts are estimates.
SPEEDUP_MARGIN = 0.10

COMPUTE, MEMORY, LAUNCH = "compute", "memory", "launch"


@dataclass(frozen=True)
class StepCounts:
    """One training step's work, as ``count_step`` counts it under fake tensors."""

    flops: int
    convolution_flops: int
    bytes_moved: int
    launches: int | None  # None: compiled code fuses kernels, eager dispatch says nothing of its launches
    samples: int  # samples per step (the speed-up of a case whose batch differs is in samples/s)


@dataclass(frozen=True)
class Bound:
    """A step's lower bound: the seconds of each term (None: unknown) and the largest, what the step is bound by."""

    terms: tuple[tuple[str, float | None], ...]

    @property
    def by(self) -> str | None:
        known = [(s, term) for term, s in self.terms if s is not None]
        return max(known)[1] if known else None

    @property
    def seconds(self) -> float | None:
        known = [s for _, s in self.terms if s is not None]
        return max(known) if known else None

    def phrase(self) -> str:
        """E.g. "launch-bound, >= 3.1 ms/step"; the unknown terms are named."""
        if self.seconds is None:
            return "roofline unknown (no peak, bandwidth or launch count for it)"
        unknown = [term for term, s in self.terms if s is None]
        return (f"{self.by}-bound, >= {_ms(self.seconds)} ms/step"
                + (f" (no {' or '.join(unknown)} term)" if unknown else ""))


def _ms(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:.2g}" if ms < 1 else f"{ms:.1f}" if ms < 100 else f"{ms:.0f}"


def compute_seconds(flops_at: Iterable[tuple[float, float | None]]) -> float | None:
    """Seconds to do each ``(flops, peak TFLOP/s)`` part at its peak; None where a part with FLOPs has no peak."""
    total = 0.0
    for flops, tflops in flops_at:
        if flops:
            if not tflops:
                return None
            total += flops / (tflops * 1e12)
    return total


def step_bound(compute_s: float | None, bytes_moved: float, bandwidth_gbs: float | None, launches: float | None,
               launch_s: float = LAUNCH_S) -> Bound:
    """The roofline of a step: its compute seconds, ``bytes_moved`` at ``bandwidth_gbs`` GB/s and ``launches`` at
    ``launch_s`` each (None: that term is unknown)."""
    memory = bytes_moved / (bandwidth_gbs * 1e9) if bandwidth_gbs else None
    return Bound(((COMPUTE, compute_s), (MEMORY, memory), (LAUNCH, launches * launch_s if launches is not None else None)))


def allowed_speedup(case: Bound, case_samples: float, baseline: Bound, baseline_samples: float) -> float | None:
    """The samples/s speed-up over the baseline the two bounds allow, if the baseline runs at its bound (the case can
    only be slower than its own): (case samples / case bound) / (baseline samples / baseline bound)."""
    if not (case.seconds and baseline.seconds):
        return None
    return (case_samples / case.seconds) / (baseline_samples / baseline.seconds)


def speedup_flag(min_speedup: float, case: Bound, case_samples: float, baseline: Bound,
                 baseline_samples: float) -> str | None:
    """Why ``min_speedup`` cannot hold by the roofline (it exceeds the allowed speed-up by more than
    ``SPEEDUP_MARGIN``), or None. A case doing its baseline's very work is never flagged: its speed-up, if any,
    comes from what the roofline leaves out (the loader, host copies, syncs, the kernels' algorithms)."""
    if case.terms == baseline.terms and case_samples == baseline_samples:
        return None
    allowed = allowed_speedup(case, case_samples, baseline, baseline_samples)
    if allowed is None or min_speedup <= allowed * (1 + SPEEDUP_MARGIN):
        return None
    both = f"both {case.by}-bound" if case.by == baseline.by else f"the case {case.by}-bound, its baseline {baseline.by}-bound"
    return (f"min_speedup {min_speedup:g} cannot hold by the roofline: {both} "
            f"(>= {_ms(case.seconds)} vs >= {_ms(baseline.seconds)} ms/step), the speed-up it allows is "
            f"~{allowed:.2f}x even with the baseline at its bound")


def versus_measured(bound_s: float, measured_s: float) -> str:
    """A measured step time against the roofline's lower bound for it, in words."""
    ratio = measured_s / bound_s
    said = f"measured {_ms(measured_s)} ms/step, roofline >= {_ms(bound_s)} ms/step ({ratio:.2f}x)"
    if ratio < 0.9:  # the counts are estimates: a little below is noise, well below is a wrong count or peak
        return said + ": below the bound; a count, peak or bandwidth of the roofline is wrong for this step"
    if ratio <= 1.5:
        return said + ": near the bound; only less work (or fewer launches) makes it faster"
    return said + ": well above the bound; the step waits on what the roofline leaves out (data, syncs, small kernels)"


def case_bound(counts: StepCounts, config: TrainConfig, backend: Backend, bandwidth_gbs: float | None) -> Bound:
    """The bound of a step with ``counts`` on ``backend`` (a GPU, live or simulated): convolution FLOPs at the peak
    of cuDNN's precision, the rest at the matmuls' (``Backend.mfu_peak``)."""
    conv = counts.convolution_flops
    compute = compute_seconds([(conv, backend.mfu_peak(config.amp, 1.0)[1]),
                               (counts.flops - conv, backend.mfu_peak(config.amp, 0.0)[1])])
    return step_bound(compute, counts.bytes_moved, bandwidth_gbs, counts.launches)


# -- the counts, under fake tensors ---------------------------------------------------------------------------------
def _launches_kernel(func) -> bool:
    """Whether an aten op runs a kernel: not a view (it aliases its input, moving nothing) nor an allocation."""
    return not func.is_view and func.overloadpacket.__name__ not in _NO_KERNEL


_NO_KERNEL = {"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided", "resize_", "set_",
              "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "is_same_size"}


def _traffic_mode():
    """A dispatch mode counting kernel launches and the bytes their tensor inputs and outputs hold."""
    class Traffic(TorchDispatchMode):
        launches = 0
        bytes_moved = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if _launches_kernel(func):
                self.launches += 1
                self.bytes_moved += sum(t.numel() * t.element_size() for t in tree_leaves((args, kwargs, out))
                                        if isinstance(t, torch.Tensor))
            return out

    return Traffic()


def count_step(config: TrainConfig, spec: TrainingSpec, backend: Backend) -> StepCounts | str:
    """One step of ``config`` on ``spec`` (after one that creates its gradients and optimizer state) counted under
    fake tensors on ``backend``'s device; or why it cannot be. ``config`` as the memory gate predicts it
    (``recipes.without_unpredictable``)."""

    reason = unpredictable(config)
    if reason:
        return reason
    try:
        with fake_training(config, spec, backend) as training:
            batches = training.batches()
            training.step(training.fetch(batches))
            step = training.fetch(batches)
            flops, traffic = FlopCounterMode(display=False), _traffic_mode()
            with flops, traffic:
                training.step(step)
    except NotPredictable as e:
        return str(e)
    except Exception as e:  # noqa: BLE001 - any op fake tensors cannot run: say which
        return f"FakeTensorMode could not run the step: {failure_line(e)}"
    total = int(flops.get_total_flops())
    share = convolution_share(flops.get_flop_counts().get("Global", {}))
    return StepCounts(total, int(total * share), traffic.bytes_moved, traffic.launches, training.samples_per_step)


def _read_counts(stored: dict | None) -> StepCounts | None:
    """Counts another process stored (None: none, or of another shape: counted again)."""
    try:
        return StepCounts(**stored) if stored else None
    except TypeError:
        return None


class CountCache:
    """``count_step`` once per setup and spec: a case and every case sharing its baseline ask for the same counts."""

    def __init__(self, backend: Backend):
        self.backend = backend
        self._counts: dict[tuple, StepCounts | str] = {}
        self._shared = SharedPredictions.from_environment(backend, "counts")  # a job's other processes' counts

    def __call__(self, profile_name: str, config: TrainConfig, spec: TrainingSpec) -> StepCounts | str:
        counted = without_unpredictable(config)
        fingerprint = code_fingerprint(spec)  # another process's counts of other code are not this one's
        key = (profile_name, spec.name, fingerprint, counted)
        if key not in self._counts:
            shared = _read_counts(self._shared.get(key)) if fingerprint else None
            self._counts[key] = shared or count_step(counted, spec, self.backend)
            if fingerprint and isinstance(self._counts[key], StepCounts):
                self._shared.put(key, asdict(self._counts[key]))
        counts = self._counts[key]
        fused = config.runs_compiled_code  # compiled code's launches are not eager dispatch's
        return replace(counts, launches=None) if fused and isinstance(counts, StepCounts) else counts
