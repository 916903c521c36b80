"""What one measured case produced, the named metrics budgets and reports read from it, and its one
serialized form (``case_record`` writes it; ``store.SavedRun`` keeps it in a saved run and reads it back as
``CaseRecord``s for the gate, the report and calibration). Nothing here imports torch: reading runs needs none."""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass, field

from trainbench.core.records.tables import attribution_problem, compact
from trainbench.core.records.metrics import METRICS, TIMED, per_round, rounds_of, timed_metrics
from trainbench.core.records.stats import look_alpha

# The note of a Result measured by a job run again after a process of it crashed below Python (distributed.py);
# the summary shows it beside the case.
RELAUNCH_NOTE = "relaunched from the start after a crash below Python"

# The note of a Result whose spec's batch shapes vary across the batches the memory and work passes read
# (measure.Measurer.window_shapes_note); the summary shows it beside the case.
VARYING_SHAPES_NOTE = "batch shapes vary"

MIB = 2**20


@dataclass(frozen=True)
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
    # Mean CPU seconds per step of each round, the whole process (CPU devices; [] elsewhere): other processes'
    # load moves it far less than wall time.
    round_cpu_times_s: list[float] = field(default_factory=list)
    # The looks at the rounds (a measurement's rounds, then each measuring again adds its own) and how many this
    # case could get: each look's timed verdicts spend their share of the error (``stats.look_alpha``).
    looks: int = 1
    planned_looks: int = 1
    data_wait_s: float = 0.0
    # Items (TrainingSpec.items: tokens...) per timed step in one process, and what they are (None: not counted)
    items_per_step: float | None = None
    items_unit: str | None = None
    warmup_steps: int = 0
    warmup_steady: bool = False
    warmup_s: float = 0.0
    first_step_s: float = 0.0  # includes compile, autotuning and worker start-up
    # memory
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    alloc_retries: int | None = None
    reserved_between_steps_bytes: int | None = None
    memory_breakdown_bytes: dict[str, int] = field(default_factory=dict)
    # The GPU profile's breakdown predicted under FakeTensorMode (trainbench.core.analyses.predict): profile, device,
    # breakdown_bytes, and a reason where it could not be predicted.
    predicted_memory: dict | None = None
    memory_growth_bytes_per_step: float | None = None
    graph_nodes_growth_per_step: float | None = None
    # work
    flops_per_step: int | None = None
    ops_per_step: int | None = None
    syncs_per_step: int | None = None
    h2d_bytes_per_sample: float | None = None
    aten_calls_per_step: int | None = None
    kernels_per_step: int | None = None
    # Where the step's ops, time, FLOPs and memory go (trainbench.core.analyses.attribution): whole here, its top rows in a record
    attribution: dict | None = None
    peak_tflops: float | None = None
    peak_precision: str | None = None  # the precision whose peak MFU divides by (tf32 where fp32 may use it)
    final_loss: float | None = None
    # The losses of the setup's first steps from its seeds (its warm-up's first guards.GUARD_STEPS), where the
    # measurement started on a setup fresh from its seeds: the loss guard's trajectory, with no setup built for it
    seeded_losses: list[float] | None = None
    notes: list[str] = field(default_factory=list)
    # Other processes' CPU use and the load average while the case was measured (trainbench.devices.host.LoadMeter).
    machine_load: dict | None = None
    # Where the case's wall time went, by phase (trainbench.core.harness.costs.PHASES; "baseline <phase>": its baseline's share)
    phase_seconds: dict[str, float] = field(default_factory=dict)
    # DDP: world size, launcher, each rank's rounds and memory, the gradients' spread between ranks, the ideal speed-up
    ranks: dict | None = None

    def replace(self, **changes) -> Result:
        """This result with ``changes``: a measured result is never edited in place."""
        return dataclasses.replace(self, **changes)

    def with_note(self, note: str) -> Result:
        return self.replace(notes=[*self.notes, note])

    def to_dict(self) -> dict:
        """Every field, JSON-ready: how a Result crosses a process boundary (ranks, fresh processes, A/B workers)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Result:
        return cls(**data)

    # -- derived timing -------------------------------------------------------------
    @property
    def timed_seconds(self) -> float:
        return sum(self.round_step_times_s) * self.steps_per_round

    @property
    def samples_per_step(self) -> int:
        """Samples one optimizer step trains, all ranks together."""
        return self.batch_size * self.world_size

    @property
    def samples_per_s(self) -> float | None:
        """From the median step time, like ``step_time_ms``: the two always tell the same story."""
        step = self.step_time_s
        return self.samples_per_step / step if step else None

    @property
    def items_per_s(self) -> float | None:
        """Items (tokens...) per second, all ranks together (each rank's count taken as this process's), from the
        median step time as ``samples_per_s`` is."""
        step = self.step_time_s
        return self.items_per_step * self.world_size / step if step and self.items_per_step is not None else None

    @property
    def step_time_s(self) -> float | None:
        return statistics.median(self.round_step_times_s) if self.round_step_times_s else None

    @property
    def cpu_time_s(self) -> float | None:
        return statistics.median(self.round_cpu_times_s) if self.round_cpu_times_s else None

    @property
    def step_time_iqr_s(self) -> float | None:
        times = self.round_step_times_s
        if len(times) < 2:
            return 0.0 if times else None
        q1, _, q3 = statistics.quantiles(times, n=4, method="inclusive")
        return q3 - q1

    def metrics(self) -> dict[str, float | None]:
        """Every metric in ``trainbench.core.records.metrics.METRICS`` (None where this device or run did not produce it)."""
        bd = self.memory_breakdown_bytes
        predicted = (self.predicted_memory or {}).get("breakdown_bytes") or {}
        step = self.step_time_s
        tracked_peak = bd.get("total")
        peak = self.peak_allocated_bytes if self.peak_allocated_bytes is not None else tracked_peak
        achieved = self.flops_per_step / step / 1e12 if self.flops_per_step and step else None

        def mib(value):
            return value / MIB if value is not None else None

        return {
            "samples_per_s": self.samples_per_s,
            "items_per_s": self.items_per_s,
            "step_time_ms": step * 1e3 if step is not None else None,
            "cpu_time_ms": self.cpu_time_s * 1e3 if self.cpu_time_s is not None else None,
            "step_time_iqr_ms": self.step_time_iqr_s * 1e3 if self.step_time_iqr_s is not None else None,
            "data_wait_fraction": self.data_wait_s / self.timed_seconds if self.timed_seconds > 0 else None,
            "first_step_s": self.first_step_s if self.warmup_steps else None,
            "warmup_s": self.warmup_s if self.warmup_steps else None,
            "achieved_tflops": achieved,
            "mfu": achieved / self.peak_tflops if achieved and self.peak_tflops else None,
            "peak_memory_mib": mib(peak),
            "peak_reserved_mib": mib(self.peak_reserved_bytes),
            "reserved_between_steps_mib": mib(self.reserved_between_steps_bytes),
            "alloc_retries": self.alloc_retries,
            "tracked_peak_mib": mib(tracked_peak),
            "param_mib": mib(bd.get("params")),
            "grad_mib": mib(bd.get("grads")),
            "optimizer_state_mib": mib(bd.get("optimizer_state")),
            "activation_mib": mib(bd.get("activations")),
            "temporary_mib": mib(bd.get("temporaries")),
            "predicted_gpu_peak_mib": mib(predicted.get("total")),
            "predicted_gpu_activation_mib": mib(predicted.get("activations")),
            "memory_growth_mib_per_step": mib(self.memory_growth_bytes_per_step),
            "graph_nodes_growth_per_step": self.graph_nodes_growth_per_step,
            "gflops_per_sample": self.flops_per_step / self.batch_size / 1e9 if self.flops_per_step is not None else None,
            "h2d_bytes_per_sample": self.h2d_bytes_per_sample,
            "syncs_per_step": self.syncs_per_step,
            "ops_per_step": self.ops_per_step,
            "aten_calls_per_step": self.aten_calls_per_step,
            "kernels_per_step": self.kernels_per_step,
        }


# -- the serialized form of a measured case ------------------------------------------------------

class RecordError(ValueError):
    """A stored case record that cannot be read; the message names where and what was expected."""


def case_record(result: Result, **case_fields) -> dict:
    """The one serialized form of a measured case (JSON-ready).

    Every metric of ``METRICS`` at the top level (None where not measured), the raw
    measurement, and what the runner adds (``case_fields``: baseline, speed-up, budget,
    guard, ladder). ``store.record_case`` saves it with the run; ``CaseRecord.read`` reads it.
    """
    return {
        **result.metrics(),
        "case": result.case,
        "workload": result.workload,
        "recipe": result.recipe,
        "profile": result.profile,
        "batch_size": result.batch_size,
        "world_size": result.world_size,
        "samples_per_step": result.samples_per_step,
        "items_per_step": result.items_per_step,
        "items_unit": result.items_unit,
        "config": result.config,
        "memory_breakdown_bytes": result.memory_breakdown_bytes,
        "predicted_memory": result.predicted_memory,
        "memory_growth_bytes_per_step": result.memory_growth_bytes_per_step,
        # the attribution's top rows (trainbench.core.analyses.attribution): what a changed verdict is explained from
        "attribution": compact(result.attribution) if result.attribution else None,
        "flops_per_step": result.flops_per_step,
        "warmup": {"steps": result.warmup_steps, "steady": result.warmup_steady, "seconds": result.warmup_s,
                   "first_step_s": result.first_step_s},
        "steps_per_round": result.steps_per_round,
        "round_step_times_s": result.round_step_times_s,
        "round_cpu_times_s": result.round_cpu_times_s,
        "looks": result.looks,
        "planned_looks": result.planned_looks,
        "final_loss": result.final_loss,
        "device": result.device,
        "notes": result.notes,
        "machine_load": result.machine_load,
        "ranks": result.ranks,
        "phase_seconds": result.phase_seconds,
        **case_fields,
    }


def budget_status(budget: dict) -> str:
    """A record's ``budget`` field in a word or two: ``ok N``, ``ok N, M inconclusive``, ``FAIL F/N``, ``none``, or
    ``FAIL`` when no budget applied but one was required."""
    checks = budget.get("checks") or []
    if budget.get("status", "none") == "none":
        return "FAIL" if budget.get("required") else "none"
    failed = sum(not c.get("ok") and c.get("inconclusive") is None for c in checks)
    unsure = sum(c.get("inconclusive") is not None for c in checks)
    if failed:
        return f"FAIL {failed}/{len(checks)}"
    if budget.get("status") == "fail":  # an entry with no bound where one was required
        return "FAIL"
    return f"ok {len(checks) - unsure}, {unsure} inconclusive" if unsure else f"ok {len(checks)}"


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# A round's mean step time beyond a day is no measurement (``1e300`` would overflow the gate's arithmetic).
MAX_STEP_S = 86400.0
# A metric derived from the rounds (``Result.metrics``) that disagrees with them by more than this is corrupt.
DERIVED_SLACK = 1e-6


def _seconds(info: dict, key: str, where: str) -> list[float]:
    """A record's per-round seconds under ``key`` ([] where absent), checked: a round's step time is above zero (its
    CPU time at least zero) and below ``MAX_STEP_S``."""
    values = info.get(key)
    values = [] if values is None else values
    if not isinstance(values, list) or not all(_finite(t) for t in values):
        raise RecordError(f"{where}: {key}: expected a list of finite seconds")
    low_ok = (lambda t: t > 0) if key == "round_step_times_s" else (lambda t: t >= 0)
    wrong = next((t for t in values if not low_ok(t) or t > MAX_STEP_S), None)
    if wrong is not None:
        raise RecordError(f"{where}: {key} holds {wrong!r}: expected seconds per step "
                          f"{'above 0' if key == 'round_step_times_s' else '>= 0'} and at most {MAX_STEP_S:.0f}")
    return [float(t) for t in values]


def _check_metric_values(metrics: dict[str, float | None], where: str) -> None:
    """Values a measurement cannot give: a timed metric (throughput, step time) of zero or less, a negative count,
    size or share (only a growth per step may be negative)."""
    for name, value in metrics.items():
        if value is None:
            continue
        spec = METRICS[name]
        if spec.kind == TIMED and value <= 0:
            raise RecordError(f"{where}: {name} = {value!r}: expected a {spec.unit or 'value'} above 0 (a timed "
                              "metric of zero or less was not measured)")
        if not spec.signed and value < 0:
            raise RecordError(f"{where}: {name} = {value!r}: expected a value >= 0")


def _check_derived(metrics: dict[str, float | None], series: dict[str, list[float]], samples: int | None,
                   where: str) -> None:
    """The metrics a record derives from its rounds agree with them (``Result.metrics``): zero throughput beside
    normal rounds is a corrupt record, not a measurement."""
    step = statistics.median(series["round_step_times_s"]) if series["round_step_times_s"] else None
    cpu = statistics.median(series["round_cpu_times_s"]) if series["round_cpu_times_s"] else None
    derived = {"step_time_ms": step * 1e3 if step else None, "cpu_time_ms": cpu * 1e3 if cpu else None,
               "samples_per_s": samples / step if step and samples else None}
    for name, expected in derived.items():
        value = metrics.get(name)
        if value is not None and expected is not None and not math.isclose(value, expected, rel_tol=DERIVED_SLACK):
            raise RecordError(f"{where}: {name} = {value!r}: expected {expected:.6g}, as its rounds give it")


def _check_rounds(metrics: dict[str, float | None], series: dict[str, list[float]], where: str) -> None:
    """A metric read round by round needs its rounds, or the gate would judge it as a bare value (a record that
    lost them is corrupt: a measured one always has them)."""
    for name in timed_metrics():
        key = METRICS[name].rounds
        if metrics[name] is not None and not any(t > 0 for t in series[key]):
            raise RecordError(f"{where}: {name} = {metrics[name]!r} without {key}: expected the rounds it was "
                              "measured in")


def _check_machine_load(load: object, where: str) -> None:
    """A ``host.LoadMeter`` record or null: the gate reads it to tell a busy machine, so a corrupt one must not
    pass for a quiet (or a busy) machine."""
    if load is None:
        return
    if not isinstance(load, dict):
        raise RecordError(f"{where}: machine_load = {load!r}: expected a dict (cpus, other_cpus, load_average_1m) "
                          "or null")
    cpus, other, average = load.get("cpus"), load.get("other_cpus"), load.get("load_average_1m")
    problems = [
        (cpus is None or (isinstance(cpus, int) and not isinstance(cpus, bool) and cpus >= 0), "cpus",
         "a count or null"),
        (other is None or (_finite(other) and other >= 0), "other_cpus", "a finite number >= 0 or null"),
        (average is None or (isinstance(average, list) and len(average) == 2 and all(map(_finite, average))),
         "load_average_1m", "[start, end] or null"),
    ]
    for ok, key, expected in problems:
        if not ok:
            raise RecordError(f"{where}: machine_load.{key} = {load[key]!r}: expected {expected}")


def _rows_of(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(row, dict) for row in value)


# What the readers of a record (the summary, report, calibration, explain) take from its other fields: each
# is null or of this shape, so a wrong type is found when the run is read, never in the middle of a verdict.
_FIELDS = (
    ("profile", lambda v: isinstance(v, str), "a profile name"),
    ("items_unit", lambda v: isinstance(v, str), "a unit"),
    ("items_per_step", lambda v: _finite(v) and v >= 0, "a finite count >= 0"),
    ("world_size", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1, "a positive int"),
    ("paired", lambda v: isinstance(v, bool), "true or false"),
    ("speedup_doubt", lambda v: isinstance(v, str), "why the speed-up is no finding"),
    ("baseline_samples_per_s", lambda v: _finite(v) and v > 0, "a finite number above 0"),
    ("device", lambda v: isinstance(v, dict), "a device identity (dict)"),
    ("ladder", lambda v: isinstance(v, dict), "a dict"),
    ("ranks", lambda v: isinstance(v, dict), "a dict"),
    ("notes", lambda v: isinstance(v, list), "a list of notes"),
    ("looks", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1, "an int >= 1"),
    ("planned_looks", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1, "an int >= 1"),
    ("phase_seconds", lambda v: isinstance(v, dict) and all(_finite(x) and x >= 0 for x in v.values()),
     "a dict of seconds >= 0 by phase"),
    ("budget", lambda v: isinstance(v, dict) and (v.get("checks") is None or _rows_of(v.get("checks"))),
     "a dict whose checks are a list of dicts"),
    ("guard", lambda v: isinstance(v, dict) and (v.get("checks") is None or _rows_of(v.get("checks"))),
     "a dict whose checks are a list of dicts"),
    ("predicted_memory", lambda v: isinstance(v, dict) and all(
        v.get(key) is None or isinstance(v.get(key), dict) for key in ("breakdown_bytes", "check")),
     "a dict (breakdown_bytes, check: dicts)"),
)


def _check_fields(info: dict, where: str) -> None:
    """Every other field a reader takes from the record (``_FIELDS``, the attribution tables) has its shape."""
    for key, ok, expected in _FIELDS:
        value = info.get(key)
        if value is not None and not ok(value):
            raise RecordError(f"{where}: {key} = {value!r}: expected {expected} or null")
    problem = attribution_problem(info.get("attribution"))
    if problem:
        raise RecordError(f"{where}: {problem}")


def case_id(workload: str, recipe: str) -> str:
    """A case's id: the key of its budgets, its pytest id and its name in every record, table and verdict."""
    return f"{workload}-{recipe}"


@dataclass(frozen=True)
class CaseRecord:
    """A case as read back from a stored record: what the gate, the report and calibration use."""

    case: str
    metrics: dict[str, float | None]
    round_step_times_s: list[float]
    samples_per_step: int
    round_cpu_times_s: list[float] = field(default_factory=list)
    speedup_vs_baseline: float | None = None
    paired: bool | None = None  # the speed-up comes from rounds interleaved with the baseline's (None: not recorded)
    profile: str | None = None
    ladder: dict | None = None
    device: dict | None = None
    raw: dict = field(default_factory=dict)
    fullname: str | None = None  # pytest-benchmark's key of the case in a saved run (None: not read from one)

    @classmethod
    def read(cls, info: object, where: str, fullname: str | None = None) -> CaseRecord:
        """Validate and read a record; a wrong shape raises ``RecordError`` naming ``where`` and the key."""
        if not isinstance(info, dict) or not isinstance(info.get("case"), str):
            raise RecordError(f"{where}: not a trainbench case (no 'case' in its record); expected a record with "
                              "case, samples_per_step, the metrics and round_step_times_s")
        metrics = {}
        for name in METRICS:
            value = info.get(name)
            if value is not None and not _finite(value):
                raise RecordError(f"{where}: {name} = {value!r}: expected a finite number or null")
            metrics[name] = value
        _check_metric_values(metrics, where)
        series = {key: _seconds(info, key, where) for key in ("round_step_times_s", "round_cpu_times_s")}
        _check_rounds(metrics, series, where)
        rounds, cpu_rounds = series["round_step_times_s"], series["round_cpu_times_s"]
        samples = info.get("samples_per_step", info.get("batch_size"))
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
            raise RecordError(f"{where}: samples_per_step = {samples!r}: expected a positive int")
        _check_derived(metrics, series, samples if "samples_per_step" in info else None, where)
        speedup = info.get("speedup_vs_baseline")
        if speedup is not None and not (_finite(speedup) and speedup > 0):
            raise RecordError(f"{where}: speedup_vs_baseline = {speedup!r}: expected a finite number above 0 or null")
        _check_machine_load(info.get("machine_load"), where)
        _check_fields(info, where)
        ladder = info.get("ladder")
        paired = info.get("paired")
        return cls(info["case"], metrics, rounds, samples, cpu_rounds, speedup, paired, info.get("profile"), ladder,
                   info.get("device"), info, fullname)

    @property
    def budget_status(self) -> str:
        """The budget column of the summary: ``ok N``, ``ok N, M inconclusive``, ``FAIL F/N``, ``none`` (``FAIL`` when
        a budget was required), and `` +guard FAIL`` when a correctness guard failed."""
        budget = self.raw.get("budget") if isinstance(self.raw.get("budget"), dict) else {}
        return budget_status(budget) + (" +guard FAIL" if self.guard_failures else "")

    @property
    def guard_failures(self) -> list[str]:
        """One line per correctness-guard check this case failed, as the case's failure says it."""
        guard = self.raw.get("guard") if isinstance(self.raw.get("guard"), dict) else {}
        return [f"{self.case}: correctness guard ({c.get('kind')}): {c.get('message')}"
                for c in guard.get("checks") or [] if not c.get("ok")]

    @property
    def prediction_matches(self) -> bool | None:
        """Whether the GPU-profile prediction of this run's own setup matched its measured breakdown (None: not
        checked)."""
        predicted = self.raw.get("predicted_memory") if isinstance(self.raw.get("predicted_memory"), dict) else {}
        return (predicted.get("check") or {}).get("matches")

    @property
    def prediction_failure(self) -> str | None:
        """Why the GPU-profile memory of this case was not predicted (a setup fake tensors cannot run, a step that
        failed under them), or None where it was predicted or not asked for."""
        predicted = self.raw.get("predicted_memory") if isinstance(self.raw.get("predicted_memory"), dict) else {}
        reason = predicted.get("reason")
        return str(reason) if reason and not predicted.get("breakdown_bytes") else None

    @property
    def ranks(self) -> dict | None:
        ranks = self.raw.get("ranks")
        return ranks if isinstance(ranks, dict) else None

    @property
    def relaunches(self) -> list[str]:
        """Notes of a job run again from the start after a crash below Python."""
        return [note for note in self.raw.get("notes") or [] if str(note).startswith(RELAUNCH_NOTE)]

    @property
    def phase_seconds(self) -> dict[str, float]:
        """Where the case's wall time went (``trainbench.core.harness.costs``); {} where not recorded."""
        return self.raw.get("phase_seconds") or {}

    @property
    def baseline_samples_per_s(self) -> float | None:
        """The baseline's samples/s that ``speedup_vs_baseline`` divides by (None: not recorded, or no speed-up)."""
        value = self.raw.get("baseline_samples_per_s")
        return float(value) if value is not None and self.speedup_vs_baseline is not None else None

    @property
    def baseline_case(self) -> str | None:
        """The case id of the baseline its speed-up is against (its spec's), or None."""
        base, workload = self.raw.get("baseline"), self.raw.get("workload")
        return case_id(workload, base) if base and workload and self.speedup_vs_baseline is not None else None

    @property
    def speedup_doubt(self) -> str | None:
        """Why ``speedup_vs_baseline`` is no finding (a busy machine while either side was timed), or None."""
        doubt = self.raw.get("speedup_doubt")
        return str(doubt) if doubt and self.speedup_vs_baseline is not None else None

    @property
    def varying_shapes(self) -> str | None:
        """The note of a spec whose batch shapes vary across the batches work and memory were measured on, or None."""
        return next((str(note) for note in self.raw.get("notes") or [] if str(note).startswith(VARYING_SHAPES_NOTE)),
                    None)

    @property
    def look_alpha(self) -> float:
        """The error a side this record's timed verdicts may spend: its look of its planned looks
        (``stats.look_alpha``; a record saved before looks were recorded: one look of one)."""
        return look_alpha(self.raw.get("looks") or 1, self.raw.get("planned_looks") or 1)

    @property
    def machine_load(self) -> dict | None:
        load = self.raw.get("machine_load")
        return load if isinstance(load, dict) else None

    @property
    def attribution(self) -> dict | None:
        """Where the case's ops, time, FLOPs and memory went (``trainbench.core.analyses.attribution``'s top rows), or None: not
        recorded (attribution off, a run saved before it was recorded)."""
        tables = self.raw.get("attribution")
        return tables if isinstance(tables, dict) else None

    def per_round(self, metric: str) -> list[float]:
        """``metric`` round by round (``trainbench.core.records.metrics.per_round``; [] where it is not read per round)."""
        return per_round(metric, self.metrics.get(metric), rounds_of(metric, self))


@dataclass(frozen=True)
class MeasuredCase:
    """A case as a comparison takes it: its record, where pytest-benchmark keeps it, and the budgets file's gate
    thresholds for it on this device (a pytest session's measured case, or a saved run's)."""

    record: CaseRecord
    fullname: str  # pytest-benchmark's key of the case in a saved run
    compare_fail: dict  # the budgets file's gate thresholds for this case on this device
