"""Every metric a budget, a comparison or a report may name, and how it is read.

Each metric has one ``kind``, the one answer to "what moves it, and how is it judged":

- ``timed``: the machine's speed moves it and it follows each timed round's step time (throughput,
  step time, TFLOP/s, MFU), so the gate, A/B, noise checks and budgets read it round by round
  (``per_round``);
- ``timed_once``: the machine's speed moves it, but a run has one value of it (the first step, the
  warm-up, the rounds' spread, the share spent waiting for data): judged as a value, never calibrated;
- ``allocator``: a CUDA caching-allocator peak; not an exact function of the code, but repeatable on
  one GPU, so calibrated there (on a CPU ``peak_memory_mib`` is the tracked tensor peak);
- ``allocator_events``: allocator retries, which depend on fragmentation and on what else holds the
  GPU: reported and compared where a gate names them, never calibrated;
- ``device_choice``: which kernels the device's libraries pick (cuDNN autotuning, cuBLAS heuristics, and
  whatever a driver, CUDA, cuDNN, cuBLAS or torch update changes): repeatable on one GPU with one software
  stack, so calibrated there, but not a function of the code alone; compared where a gate names it, never
  part of ``deterministic``;
- ``deterministic``: an exact function of the code and the shapes; a CPU runner gates on it without noise.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from trainbench.core.harness.costs import PHASES

TIMED = "timed"
TIMED_ONCE = "timed_once"
ALLOCATOR = "allocator"
ALLOCATOR_EVENTS = "allocator_events"
DEVICE_CHOICE = "device_choice"
DETERMINISTIC = "deterministic"
KINDS = (TIMED, TIMED_ONCE, ALLOCATOR, ALLOCATOR_EVENTS, DEVICE_CHOICE, DETERMINISTIC)
GROUPS = ("speed", "memory", "work")  # what a metric tells; asv's Speed, Memory and Work classes follow it
# The headroom calibration gives a metric of each kind it calibrates over what was measured (``calibrated_metrics``).
# 0 for a deterministic metric: an exact function of the code and the shapes, so any change of it is a change of
# the code or the data, and its bound is what was measured (a 10% margin let an added layer's +6.8% parameters
# through). An allocator peak moves with the caching allocator's rounding and fragmentation, a kernel count with the
# libraries' heuristics, between runs of the same code on one GPU.
CALIBRATION_MARGINS = {DETERMINISTIC: 0.0, ALLOCATOR: 0.10, DEVICE_CHOICE: 0.10}


@dataclass(frozen=True)
class Metric:
    unit: str
    higher_is_better: bool
    kind: str  # one of KINDS
    description: str
    group: str = "speed"  # one of GROUPS: "speed" exactly for the timed kinds
    rounds: str = "round_step_times_s"  # the per-round series a timed metric follows (a Result's, a CaseRecord's)
    # The attribution tables that explain a change of it (trainbench.verdicts.explain.TABLES): "where" under its verdict
    where: tuple[str, ...] = ()
    signed: bool = False  # may be below zero (a growth per step: memory freed); every other metric is >= 0
    # The phases of the method that measure it (trainbench.core.harness.costs.PHASES; default: its group's, _GROUP_PASSES):
    # what --trainbench-quick runs for a budget that names it
    passes: tuple[str, ...] | None = None
    count: bool = False  # a whole number of things per step (ops, syncs, calls, kernels): a bound of it is a whole number
    cuda_only: bool = False  # measured on CUDA devices only (the caching allocator, kernels): a [cpu] bound checks nothing

    def __post_init__(self) -> None:
        if self.kind not in KINDS or self.group not in GROUPS:
            raise ValueError(f"metric kind {self.kind!r} / group {self.group!r}: expected one of {KINDS} / {GROUPS}")
        if (self.group == "speed") != self.timed:
            raise ValueError(f"a {self.kind} metric in group {self.group!r}: speed metrics are the timed ones")
        if not set(self.measured_by) <= set(PHASES):
            raise ValueError(f"metric passes {self.passes}: expected phases of {tuple(PHASES)}")

    @property
    def measured_by(self) -> tuple[str, ...]:
        """The phases of the method that measure it."""
        return self.passes if self.passes is not None else _GROUP_PASSES[self.group]

    @property
    def timed(self) -> bool:
        """The machine's speed moves it, not the code alone."""
        return self.kind in (TIMED, TIMED_ONCE)

    @property
    def deterministic(self) -> bool:
        return self.kind == DETERMINISTIC

    @property
    def calibration_margin(self) -> float | None:
        """The headroom calibration gives it over what was measured (``CALIBRATION_MARGINS``), None: not calibrated."""
        return CALIBRATION_MARGINS.get(self.kind)

    @property
    def stable_on_gpu(self) -> bool:
        """Repeatable on one GPU with one software stack: calibrated there."""
        return self.kind in (ALLOCATOR, DEVICE_CHOICE)


_GROUP_PASSES = {"speed": ("rounds",), "memory": ("memory",), "work": ("work",)}

# The attribution tables (trainbench.verdicts.explain.TABLES) that say where each kind of change comes from.
TIME = ("time.ops_ms", "time.kernels_ms")
FLOPS = ("flops",)
OPS = ("ops", "ops_by_site")
SYNCS = ("syncs",)  # each sync by its op and the Python line that made it
PEAK = ("memory.peak_bytes",)
KEPT = ("memory.kept_bytes_per_step",)
PARAMS = ("memory.param_bytes", *PEAK)
ALLOCATOR_PEAK = ("allocator_peak_bytes", *PEAK)

METRICS: dict[str, Metric] = {
    "samples_per_s": Metric("samples/s", True, TIMED, "samples per step (all ranks) / median step time", where=TIME),
    "items_per_s": Metric("items/s", True, TIMED, "items per step (TrainingSpec.items: tokens...; all ranks) / median "
                          "step time", where=TIME),
    "step_time_ms": Metric("ms", False, TIMED, "median time of a step (per-round means)", where=TIME),
    "cpu_time_ms": Metric("ms", False, TIMED, "CPU seconds the process used per step (median of per-round means; CPU "
                          "devices): what other processes' load moves least", rounds="round_cpu_times_s", where=TIME),
    "step_time_iqr_ms": Metric("ms", False, TIMED_ONCE, "inter-quartile range of the per-round step times"),
    "data_wait_fraction": Metric("", False, TIMED_ONCE, "share of timed wall time blocked in next(loader)"),
    "first_step_s": Metric("s", False, TIMED_ONCE, "the first step: compilation, autotuning, worker start-up"),
    "warmup_s": Metric("s", False, TIMED_ONCE, "all warm-up steps until step times settled"),
    "achieved_tflops": Metric("TFLOP/s", True, TIMED, "FLOPs per step / median step time", where=TIME + FLOPS,
                                passes=("rounds", "work")),
    "mfu": Metric("", True, TIMED, "achieved / peak FLOP/s of a known GPU", where=TIME + FLOPS,
                    passes=("rounds", "work")),
    "peak_memory_mib": Metric("MiB", False, ALLOCATOR, "device allocator peak (CUDA), tracked tensor peak (CPU)",
                              group="memory", where=ALLOCATOR_PEAK, passes=("peaks", "memory")),
    "peak_reserved_mib": Metric("MiB", False, ALLOCATOR, "CUDA caching-allocator reserved peak", group="memory",
                                where=ALLOCATOR_PEAK, passes=("peaks",), cuda_only=True),
    "reserved_between_steps_mib": Metric("MiB", False, ALLOCATOR, "CUDA allocator reserved memory after a step (what "
                                         "other processes cannot use between steps)", group="memory", where=ALLOCATOR_PEAK,
                                         passes=("peaks",), cuda_only=True),
    "alloc_retries": Metric("", False, ALLOCATOR_EVENTS, "CUDA allocator retries (cudaFree + retry) during the memory "
                            "pass", group="memory", where=ALLOCATOR_PEAK, passes=("peaks",), count=True, cuda_only=True),
    "tracked_peak_mib": Metric("MiB", False, DETERMINISTIC, "peak of live tensors seen by the memory tracker",
                               group="memory", where=PEAK),
    "param_mib": Metric("MiB", False, DETERMINISTIC, "parameters at the tracked peak", group="memory", where=PARAMS),
    "grad_mib": Metric("MiB", False, DETERMINISTIC, "gradients at the tracked peak", group="memory", where=PARAMS),
    "optimizer_state_mib": Metric("MiB", False, DETERMINISTIC, "optimizer state at the tracked peak", group="memory",
                                   where=PARAMS),
    "activation_mib": Metric("MiB", False, DETERMINISTIC, "activations saved for backward at the tracked peak",
                             group="memory", where=PEAK),
    "temporary_mib": Metric("MiB", False, DETERMINISTIC, "temporaries at the tracked peak", group="memory", where=PEAK),
    "predicted_gpu_peak_mib": Metric("MiB", False, DETERMINISTIC, "tracked tensor peak of the GPU profile's setup, "
                                     "predicted under FakeTensorMode (no compute)", group="memory",
                                     passes=("predict",)),
    "predicted_gpu_activation_mib": Metric("MiB", False, DETERMINISTIC, "activations at the predicted GPU-profile peak",
                                           group="memory", passes=("predict",)),
    "memory_growth_mib_per_step": Metric("MiB", False, DETERMINISTIC, "live tensor memory added per step (a leak if "
                                         "> 0)", group="memory", where=KEPT, signed=True),
    "graph_nodes_growth_per_step": Metric("", False, DETERMINISTIC, "autograd nodes kept alive per step by a running "
                                          "loss", group="memory", where=KEPT, signed=True),
    "gflops_per_sample": Metric("GFLOP", False, DETERMINISTIC, "FlopCounterMode FLOPs of one step / batch size",
                                group="work", where=FLOPS),
    "h2d_bytes_per_sample": Metric("B", False, DETERMINISTIC, "bytes a step copies to the device per sample",
                                   group="work", where=OPS),
    "syncs_per_step": Metric("", False, DETERMINISTIC, "host-device syncs (aten._local_scalar_dense) per step",
                             group="work", where=SYNCS, count=True),
    "ops_per_step": Metric("", False, DETERMINISTIC, "aten ops dispatched per step (eager view, below autograd)",
                           group="work", where=OPS, count=True),
    "aten_calls_per_step": Metric("", False, DETERMINISTIC, "aten calls the profiler records per step (compiled code "
                                  "included)", group="work", where=("time.calls",), passes=("calls",), count=True),
    "kernels_per_step": Metric("", False, DEVICE_CHOICE, "device kernels launched per step (CUDA profiler): "
                               "cuDNN autotuning and library updates change which kernels run", group="work",
                               where=("time.kernel_calls",), passes=("calls",), count=True, cuda_only=True),
}


def passes_measuring(metrics) -> frozenset[str]:
    """The phases of the method that measure ``metrics`` (names in ``METRICS``): what a quick run keeps."""
    return frozenset(phase for name in metrics for phase in METRICS[name].measured_by)


# Short names a gate specification or a budget key may use. "memory" is the device's peak, as in the summary's
# "peak MiB", asv's track_peak_memory and the budget key max_memory_ratio.
ALIASES = {"peak_memory": "peak_memory_mib", "memory": "peak_memory_mib", "step_time": "step_time_ms"}


def resolve(name: str) -> str:
    """A metric's name from itself or its alias (an unknown name comes back as it is, for the caller to refuse)."""
    return ALIASES.get(name, name)


def _of_kind(*kinds: str) -> list[str]:
    return [name for name, metric in METRICS.items() if metric.kind in kinds]


def timed_metrics() -> list[str]:
    """The metrics read round by round (``per_round``): what the gate and A/B compare over the rounds."""
    return _of_kind(TIMED)


def deterministic_metrics() -> list[str]:
    """The metrics that are exact functions of the code and shapes: what a CPU runner can gate on."""
    return _of_kind(DETERMINISTIC)


def allocator_metrics() -> list[str]:
    """The CUDA allocator peaks: repeatable on one GPU."""
    return _of_kind(ALLOCATOR)


def device_choice_metrics() -> list[str]:
    """The metrics the device's libraries move (kernel choice): compared only where a gate names them."""
    return _of_kind(DEVICE_CHOICE)


def calibrated_metrics(gpu: bool) -> list[str]:
    """The metrics calibration writes budgets for: the deterministic ones, and on a GPU the allocator peaks and
    the libraries' kernel choice (repeatable on that GPU and software stack); each with its kind's margin
    (``Metric.calibration_margin``)."""
    return deterministic_metrics() + (allocator_metrics() + device_choice_metrics() if gpu else [])


def metrics_in(group: str) -> list[str]:
    """The metrics of one group (speed, memory, work): an asv class each."""
    return [name for name, metric in METRICS.items() if metric.group == group]


def is_timed(metric: str) -> bool:
    """The machine's speed moves ``metric`` (throughput, step time, warm-up...), not the code alone."""
    return METRICS[metric].timed


def rounds_of(metric: str, holder: object) -> list[float]:
    """The per-round series ``metric`` follows (``Metric.rounds``), from a ``Result`` or a ``CaseRecord``."""
    return list(getattr(holder, METRICS[metric].rounds, None) or [])


def per_round(metric: str, value: float | None, round_times_s: list[float]) -> list[float]:
    """``metric`` round by round, from each round's mean step time (or CPU time: ``rounds_of``): a throughput scales
    as 1 / step time, a time as the step time, around ``value`` at the median round. [] where the metric is not read per round, or
    ``value`` or the rounds were not measured."""
    spec = METRICS[metric]
    times = [t for t in round_times_s if t > 0]
    if spec.kind != TIMED or value is None or not times:
        return []
    power = -1 if spec.higher_is_better else 1
    median = statistics.median(times)
    return [value * (t / median) ** power for t in times]


class ThresholdError(ValueError):
    """A malformed threshold or gate specification; the message names where and what was expected."""


def parse_thresholds(spec: str, where: str = "--trainbench-compare-fail") -> dict[str, float]:
    """``"samples_per_s:5%,peak_memory:2%,deterministic:0%"`` -> {metric: threshold fraction}.

    ``deterministic`` stands for every deterministic metric of ``trainbench.core.records.metrics.METRICS``; a metric may be
    named by its alias there (``peak_memory``, ``memory``, ``step_time``). A metric named twice is refused; one
    named beside ``deterministic`` keeps its own threshold.
    """
    thresholds: dict[str, float] = {}
    named: set[str] = set()  # each metric (and ``deterministic``) once
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            continue
        name, sep, value = item.partition(":")
        if not sep:
            raise ThresholdError(f"{where}: {item!r}: expected METRIC:THRESHOLD, e.g. samples_per_s:5%")
        name = resolve(name.strip())
        names = deterministic_metrics() if name == "deterministic" else [name]
        if names[0] not in METRICS:
            raise ThresholdError(f"{where}: {item!r}: unknown metric {name!r}; expected one of "
                               f"{sorted(METRICS) + sorted(ALIASES) + ['deterministic']}")
        if name in named:  # the later silently won
            raise ThresholdError(f"{where}: {item!r}: {name} has a threshold already in {spec!r}; expected one "
                                 "threshold per metric")
        named.add(name)
        fraction = parse_fraction(value.strip(), where, item)
        if name == "deterministic":  # a deterministic metric named on its own keeps its threshold, in either order
            thresholds.update({n: fraction for n in names if n not in named})
        else:
            thresholds[name] = fraction
    if not thresholds:
        raise ThresholdError(f"{where}: empty gate; expected METRIC:THRESHOLD[,METRIC:THRESHOLD...]")
    return thresholds


def parse_fraction(text: str, where: str, item: str | None = None) -> float:
    """``"20%"`` or ``"0.2"`` -> 0.2; an error names ``where`` and ``item`` (default: the text itself). A bare
    number of 1 or more is refused: ``5`` is far likelier to mean 5% than 500%, and read as 500% it would call a
    94% throughput loss unchanged."""
    item = text if item is None else item
    percent = text.strip().endswith("%")
    try:
        value = float(text.strip()[:-1]) / 100 if percent else float(text)
    except ValueError:
        raise ThresholdError(f"{where}: {item!r}: threshold {text!r} is not a number or a percentage") from None
    if not math.isfinite(value) or value < 0:
        raise ThresholdError(f"{where}: {item!r}: threshold must be a finite value >= 0, got {text!r}")
    if not percent and value >= 1:
        raise ThresholdError(f"{where}: {item!r}: threshold {text!r} without %: write {text.strip()}% (a fraction below "
                           f"1 reads as one, e.g. 0.05 for 5%)")
    return value
