"""What one measured case produced, and the named metrics budgets and reports read from it."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field

MIB = 2**20


@dataclass(frozen=True)
class Metric:
    unit: str
    higher_is_better: bool
    deterministic: bool  # same value on every run of the same code on the same device
    description: str


# Every metric a budget, a comparison or a report may name. Deterministic ones are
# exact functions of the code and shapes, so CPU CI can gate on them without noise.
METRICS: dict[str, Metric] = {
    "samples_per_s": Metric("samples/s", True, False, "samples (all ranks) / total timed seconds"),
    "step_time_ms": Metric("ms", False, False, "median time of a step (per-round means)"),
    "step_time_iqr_ms": Metric("ms", False, False, "inter-quartile range of the per-round step times"),
    "data_wait_fraction": Metric("", False, False, "share of timed wall time blocked in next(loader)"),
    "first_step_s": Metric("s", False, False, "the first step: compilation, autotuning, worker start-up"),
    "warmup_s": Metric("s", False, False, "all warm-up steps until step times settled"),
    "achieved_tflops": Metric("TFLOP/s", True, False, "FLOPs per step / median step time"),
    "mfu": Metric("", True, False, "achieved / peak FLOP/s of a known GPU"),
    "peak_memory_mib": Metric("MiB", False, False, "device allocator peak (CUDA), tracked tensor peak (CPU)"),
    "peak_reserved_mib": Metric("MiB", False, False, "CUDA caching-allocator reserved peak"),
    "alloc_retries": Metric("", False, False, "CUDA allocator retries (cudaFree + retry) during the memory pass"),
    "tracked_peak_mib": Metric("MiB", False, True, "peak of live tensors seen by the memory tracker"),
    "param_mib": Metric("MiB", False, True, "parameters at the tracked peak"),
    "grad_mib": Metric("MiB", False, True, "gradients at the tracked peak"),
    "optimizer_state_mib": Metric("MiB", False, True, "optimizer state at the tracked peak"),
    "activation_mib": Metric("MiB", False, True, "activations saved for backward at the tracked peak"),
    "temporary_mib": Metric("MiB", False, True, "temporaries at the tracked peak"),
    "memory_growth_mib_per_step": Metric("MiB", False, True, "live tensor memory added per step (a leak if > 0)"),
    "graph_nodes_growth_per_step": Metric("", False, True, "autograd nodes kept alive per step by a running loss"),
    "gflops_per_sample": Metric("GFLOP", False, True, "FlopCounterMode FLOPs of one step / batch size"),
    "h2d_bytes_per_sample": Metric("B", False, True, "bytes a step copies to the device per sample"),
    "syncs_per_step": Metric("", False, True, "host-device syncs (aten._local_scalar_dense) per step"),
    "ops_per_step": Metric("", False, True, "aten ops dispatched per step (eager view, below autograd)"),
    "aten_calls_per_step": Metric("", False, True, "aten calls the profiler records per step (compiled code included)"),
    "kernels_per_step": Metric("", False, True, "device kernels launched per step (CUDA profiler)"),
}


@dataclass
class Result:
    case: str
    workload: str
    recipe: str
    profile: str
    batch_size: int  # samples per optimizer step (micro-batch x accumulation steps)
    config: dict
    device: dict
    world_size: int = 1  # processes that each trained batch_size samples per step (DDP)
    # timing
    rounds: int = 0
    steps_per_round: int = 0
    round_step_times_s: list[float] = field(default_factory=list)  # mean step time of each round
    data_wait_s: float = 0.0
    warmup_steps: int = 0
    warmup_steady: bool = False
    warmup_s: float = 0.0
    first_step_s: float = 0.0  # includes compile, autotuning and worker start-up
    # memory
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    alloc_retries: int | None = None
    memory_breakdown_bytes: dict[str, int] = field(default_factory=dict)
    memory_growth_bytes_per_step: float | None = None
    graph_nodes_growth_per_step: float | None = None
    # work
    flops_per_step: int | None = None
    ops_per_step: int | None = None
    syncs_per_step: int | None = None
    h2d_bytes_per_sample: float | None = None
    aten_calls_per_step: int | None = None
    kernels_per_step: int | None = None
    top_ops: dict[str, float] = field(default_factory=dict)
    peak_tflops: float | None = None
    final_loss: float | None = None
    notes: list[str] = field(default_factory=list)

    # -- derived timing -------------------------------------------------------------
    @property
    def timed_seconds(self) -> float:
        return sum(self.round_step_times_s) * self.steps_per_round

    @property
    def timed_samples(self) -> int:
        return self.batch_size * self.world_size * self.steps_per_round * len(self.round_step_times_s)

    @property
    def samples_per_s(self) -> float | None:
        return self.timed_samples / self.timed_seconds if self.timed_seconds > 0 else None

    @property
    def step_time_s(self) -> float | None:
        return statistics.median(self.round_step_times_s) if self.round_step_times_s else None

    @property
    def step_time_iqr_s(self) -> float | None:
        times = self.round_step_times_s
        if len(times) < 2:
            return 0.0 if times else None
        q1, _, q3 = statistics.quantiles(times, n=4, method="inclusive")
        return q3 - q1

    def metrics(self) -> dict[str, float | None]:
        """Every metric in ``METRICS`` (None where this device or run did not produce it)."""
        bd = self.memory_breakdown_bytes
        step = self.step_time_s
        tracked_peak = bd.get("total")
        peak = self.peak_allocated_bytes if self.peak_allocated_bytes is not None else tracked_peak
        achieved = self.flops_per_step / step / 1e12 if self.flops_per_step and step else None

        def mib(value):
            return value / MIB if value is not None else None

        return {
            "samples_per_s": self.samples_per_s,
            "step_time_ms": step * 1e3 if step is not None else None,
            "step_time_iqr_ms": self.step_time_iqr_s * 1e3 if self.step_time_iqr_s is not None else None,
            "data_wait_fraction": self.data_wait_s / self.timed_seconds if self.timed_seconds > 0 else None,
            "first_step_s": self.first_step_s if self.warmup_steps else None,
            "warmup_s": self.warmup_s if self.warmup_steps else None,
            "achieved_tflops": achieved,
            "mfu": achieved / self.peak_tflops if achieved and self.peak_tflops else None,
            "peak_memory_mib": mib(peak),
            "peak_reserved_mib": mib(self.peak_reserved_bytes),
            "alloc_retries": self.alloc_retries,
            "tracked_peak_mib": mib(tracked_peak),
            "param_mib": mib(bd.get("params")),
            "grad_mib": mib(bd.get("grads")),
            "optimizer_state_mib": mib(bd.get("optimizer_state")),
            "activation_mib": mib(bd.get("activations")),
            "temporary_mib": mib(bd.get("temporaries")),
            "memory_growth_mib_per_step": mib(self.memory_growth_bytes_per_step),
            "graph_nodes_growth_per_step": self.graph_nodes_growth_per_step,
            "gflops_per_sample": self.flops_per_step / self.batch_size / 1e9 if self.flops_per_step is not None else None,
            "h2d_bytes_per_sample": self.h2d_bytes_per_sample,
            "syncs_per_step": self.syncs_per_step,
            "ops_per_step": self.ops_per_step,
            "aten_calls_per_step": self.aten_calls_per_step,
            "kernels_per_step": self.kernels_per_step,
        }

    def to_dict(self) -> dict:
        """JSON-ready: the raw record plus every derived metric."""
        return {**asdict(self), "metrics": self.metrics()}
