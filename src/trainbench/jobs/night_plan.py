"""The night's plan for a GPU of the fleet, made on any machine: what each suite case would do on it.

The same code decides as on the GPU itself: the doctor's CUDA checks on what the driver would
report (``simulated.simulated_runtime``), then for every suite case ``Runner.plan_case`` on a
``SimulatedGpu``: whether it can run (``eligibility.why_not``, the memory gate with
predictions at the GPU profile's sizes), its budget section and how it is measured; and what
bounds its step there (``trainbench.core.analyses.roofline``), with every ``min_speedup`` budget the roofline
says cannot hold. A plan has problems where the night would crash or refuse a case for a reason a
GPU cannot have. ``pytest --trainbench-simulate-gpu`` plans each collected case the same way
(``planned``) and skips it with what it would do there (``would_run``).
"""

from __future__ import annotations

import functools
import json
import math
import statistics
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from trainbench.core.records.budgets import Budgets, parse_key
from trainbench.core.setups.cases import Case, all_cases
from trainbench.core.harness.costs import TOTAL, timed_rounds_s
from trainbench.core.method.measure import DEFAULT_SETTINGS
from trainbench.core.analyses.plan import CasePlan
from trainbench.core.analyses.predict import PredictionCache
from trainbench.core.setups.eligibility import HEADROOM
from trainbench.core.setups.recipes import without_unpredictable
from trainbench.core.analyses.roofline import CountCache, StepCounts, case_bound, speedup_flag
from trainbench.core.method.runner import Runner
from trainbench.core.setups.workloads import PROFILES
from trainbench.devices.fleet import Gpu
from trainbench.devices.simulated import SimulatedGpu, prediction_backend, simulated_runtime
from trainbench.jobs.doctor import Check, check_cuda, check_device_memory, compile_cases, doctor_record, format_checks, heaviest_cases
from trainbench.verdicts.store import RunFileError, SavedRun

GiB = 2**30
# What no case may be refused for on a GPU: a device it is. (A prediction that fails here is no problem: the memory
# gate then lets the case run, and a CPU cannot fake some GPU-only ops, e.g. NVTX ranges or the efficient SDPA kernel.)
WRONG_ON_A_GPU = ("needs a CUDA device",)


@dataclass(frozen=True)
class PlannedCase:
    case: str
    skipped: str | None = None
    section: str | None = None  # the budgets-file section that judges it
    needed_bytes: int | None = None  # the larger predicted tensor peak of it and its baseline x headroom: what it needs
    peak_bytes: int | None = None  # its own predicted tensor peak (no headroom): what its measured peak compares with
    unpredicted: str | None = None  # why the memory gate had no prediction for it here
    measuring: str | None = None
    why_measuring: str | None = None
    # The precisions its MFU may be judged in, with the GPU's peak for each: without autocast, the step's measured
    # share of convolution FLOPs picks cuDNN's TF32 flag or the matmul one.
    mfu_peaks: tuple[tuple[str, float | None], ...] = ()
    problem: str | None = None  # why the night would crash on it, or refuses it wrongly
    roofline: str | None = None  # what bounds its step there and its lower bound, e.g. "launch-bound, >= 3.1 ms/step"
    bound_s: float | None = None  # that lower bound (roofline.versus_measured compares a measured step with it)
    speedup_flag: str | None = None  # why its min_speedup budget cannot hold by the roofline
    predicted_s: float | None = None  # its wall seconds in the night's session, as ``predict_seconds`` tells them
    predicted_from: str | None = None  # where that figure comes from, or why there is none


@dataclass
class NightPlan:
    gpu: Gpu
    checks: list[Check]
    cases: list[PlannedCase] = field(default_factory=list)

    @property
    def refused(self) -> bool:
        return any(check.status == "FAIL" for check in self.checks)

    @property
    def runs(self) -> list[PlannedCase]:
        return [c for c in self.cases if c.skipped is None and c.problem is None]

    @property
    def skips(self) -> list[PlannedCase]:
        return [c for c in self.cases if c.skipped is not None]

    @property
    def flagged(self) -> list[PlannedCase]:
        """Cases whose min_speedup budget the roofline says cannot hold."""
        return [c for c in self.runs if c.speedup_flag]

    @property
    def problems(self) -> list[PlannedCase]:
        return [c for c in self.cases if c.problem is not None]

    def largest_run(self) -> PlannedCase | None:
        """The case that will run needing the most memory (None: none predicted)."""
        predicted = [c for c in self.runs if c.needed_bytes]
        return max(predicted, key=lambda c: c.needed_bytes) if predicted else None

    @property
    def ok(self) -> bool:
        return not self.refused and not self.problems


def simulated_checks(gpu: Gpu, arch_list: list[str] | None = None) -> list[Check]:
    """The doctor's CUDA checks on what the driver of a machine with ``gpu`` would report (this torch's archs)."""
    return check_cuda(simulated_runtime(gpu, arch_list), expect_cuda=True)


def plan_night(gpu: Gpu, budgets_path: Path | None = None, predictions: PredictionCache | None = None,
               arch_list: list[str] | None = None, counts: CountCache | None = None,
               seconds_from: SavedRun | list[SavedRun] | None = None) -> NightPlan:
    """Every suite case on ``gpu`` (GPU 0 of its machine), against ``budgets_path``; ``predictions`` and ``counts``:
    caches shared across GPUs (the GPU profile's predictions and step counts do not depend on the GPU);
    ``seconds_from``: earlier nights' runs of the same GPU (``seconds_source``), which each case's predicted seconds
    come from."""
    night = NightPlan(gpu, simulated_checks(gpu, arch_list))
    if night.refused:
        return night
    backend = SimulatedGpu(gpu, arch_list=arch_list)
    profile = PROFILES["gpu"]
    runner = Runner(backend, profile, DEFAULT_SETTINGS[profile.name],
                    predictions=predictions or PredictionCache(prediction_backend()))
    budgets = Budgets.load(budgets_path) if budgets_path else None
    counts = counts or CountCache(prediction_backend())
    night.cases = [plan_suite_case(runner, case, budgets, counts) for case in all_cases()]
    if seconds_from:
        night.cases = predict_seconds(night.cases, seconds_from)
    return night


def seconds_source(path: Path, gpu: Gpu) -> SavedRun:
    """The run a plan's predicted seconds come from: a saved run of ``gpu`` with no fault planted in it (a
    ``RunFileError`` says what else). One stopped at a night's deadline is taken: its finished cases' seconds are
    their own."""
    run = SavedRun.load(path)
    if run.marks_problem or run.planted:
        raise RunFileError(path, run.marks_problem or f"measured with a fault planted on purpose ({run.planted}); "
                                                      "expected a run whose seconds are its cases' own")
    name = (run.device or {}).get("name")
    if name != gpu.name:
        raise RunFileError(path, f"measured on {name or 'an unknown device'}, not {gpu.name}; expected a run of "
                                 "the GPU planned for")
    return run


# Steps a case runs beside its timed rounds: the memory pass's, the growth pass's and the work pass's, about.
PASS_STEPS = 8


def predict_seconds(cases: list[PlannedCase], runs: SavedRun | list[SavedRun]) -> list[PlannedCase]:
    """Each case's wall seconds in a night, from ``runs``, earlier nights of the same GPU (a case measured in more
    than one: the last's figure): a case they measured costs what it cost then; another costs what the cases
    measured as it is (alone, paired, ...) cost beside their timed rounds (their median), plus its steps at the
    roofline's bound (a lower bound: the first night on the H200 measured steps 1.3-18x theirs). A case that compiles
    and was not measured, or that nothing measured as it is, is not predicted: its warm-up is minutes that no
    roofline tells."""
    runs = [runs] if isinstance(runs, SavedRun) else list(runs)
    cost, measured_in = {}, {}
    for run in runs:
        for record in run.cases(errors=[]):
            if record.phase_seconds.get(TOTAL):
                cost[record.case] = record.phase_seconds
                measured_in[record.case] = Path(str(run.path)).parent.name or str(run.path)
    kinds: dict[str, list[float]] = {}
    for case in cases:
        if case.case in cost:
            kinds.setdefault(case.measuring or "", []).append(cost[case.case][TOTAL] - timed_rounds_s(cost[case.case]))
    overhead = {kind: statistics.median(values) for kind, values in kinds.items()}
    compiling = set(compile_cases("gpu"))
    settings = DEFAULT_SETTINGS["gpu"]
    source = " and ".join(dict.fromkeys(Path(str(run.path)).parent.name or str(run.path) for run in runs))
    predicted = []
    for case in cases:
        if case.skipped or case.problem:
            predicted.append(case)
        elif case.case in cost:
            predicted.append(replace(case, predicted_s=round(cost[case.case][TOTAL], 1),
                                     predicted_from=f"measured in {measured_in[case.case]}"))
        elif case.case in compiling or case.measuring not in overhead or case.bound_s is None:
            why = ("it compiles: its warm-up is what no roofline tells" if case.case in compiling else
                   f"no case measured {case.measuring} in {source}" if case.measuring not in overhead else
                   "no roofline bound")
            predicted.append(replace(case, predicted_s=None, predicted_from=f"not predicted: {why}"))
        else:
            steps = (settings.min_warmup_steps + settings.rounds * settings.steps_per_round
                     * (2 if case.measuring == "paired" else 1) + PASS_STEPS)
            predicted.append(replace(case, predicted_s=round(overhead[case.measuring] + steps * case.bound_s, 1),
                                     predicted_from=f"{case.measuring} cases' overhead in {source} + {steps} steps at "
                                                    "the roofline's bound"))
    return predicted


def plan_suite_case(runner: Runner, case: Case, budgets: Budgets | None,
                    counts: CountCache | None = None) -> PlannedCase:
    """What the night does with a suite case on ``runner``'s device (``Runner.plan_case``); ``counts``: the step
    counts its roofline is drawn from (None: no roofline)."""
    try:
        plan = runner.plan_case(case, budgets)
    except Exception as e:  # noqa: BLE001 - the night would stop here: report it as the plan's problem
        return PlannedCase(case.id, problem=f"planning raised {type(e).__name__}: {e}")
    return planned(runner, plan, case.id, counts)


def planned(runner: Runner, plan: CasePlan | str, case_id: str, counts: CountCache | None = None) -> PlannedCase:
    """A case's plan (or why it cannot run, as ``Runner.plan_case`` gives it) as the night shows it."""
    if isinstance(plan, str):
        return PlannedCase(case_id, skipped=plan, problem=_wrong_reason(plan))
    needed, own, unpredicted = _needed_bytes(runner, plan)
    if plan.skipped:
        return PlannedCase(plan.case, skipped=plan.skipped, needed_bytes=needed, peak_bytes=own,
                           problem=_wrong_reason(plan.skipped))
    return PlannedCase(plan.case, section=plan.budget.device_key if plan.budget else None, needed_bytes=needed,
                       peak_bytes=own,
                       unpredicted=unpredicted, measuring=plan.measuring, why_measuring=plan.why_measuring,
                       mfu_peaks=_mfu_peaks(runner, plan), **(_roofline(runner, plan, counts) if counts else {}))


def _roofline(runner: Runner, plan: CasePlan, counts: CountCache) -> dict:
    """The case's roofline phrase and bound, and its min_speedup budget's flag where the roofline rules it out."""
    counted = counts(plan.profile.name, plan.config, plan.spec)
    if not isinstance(counted, StepCounts):
        return {"roofline": f"roofline not drawn ({counted})"}
    bandwidth = runner.backend.memory_bandwidth_gbs()
    bound = case_bound(counted, plan.config, runner.backend, bandwidth)
    drawn = {"roofline": bound.phrase(), "bound_s": bound.seconds}
    min_speedup = _min_speedup(plan)
    if min_speedup is None or plan.baseline_config is None:
        return drawn
    base = counts(plan.profile.name, plan.baseline_config, plan.spec)
    if isinstance(base, StepCounts):
        base_bound = case_bound(base, plan.baseline_config, runner.backend, bandwidth)
        drawn["speedup_flag"] = speedup_flag(min_speedup, bound, counted.samples, base_bound, base.samples)
    return drawn


def _min_speedup(plan: CasePlan) -> float | None:
    """The case's min_speedup budget (a minimum samples/s ratio to its baseline), or None."""
    speedup = parse_key("min_speedup")
    bounds = [b.limit for b in (plan.budget.bounds if plan.budget else ())
              if (b.metric, b.bound, b.relative) == speedup]
    return max(bounds) if bounds else None


def _mfu_peaks(runner: Runner, plan: CasePlan) -> tuple[tuple[str, float | None], ...]:
    """The precision and peak for a step without convolutions and for one of only convolutions (one where they agree)."""
    return tuple(dict.fromkeys(runner.backend.mfu_peak(plan.config.amp, share) for share in (0.0, 1.0)))


def _needed_bytes(runner: Runner, plan: CasePlan) -> tuple[int | None, int | None, str | None]:
    """What the memory gate predicted for the case and its baseline (the larger, with headroom), from its cache;
    the case's own predicted tensor peak; and why a prediction failed, where one did."""
    needed, own, unpredicted = None, None, None
    for config in (plan.config, plan.baseline_config):
        if config is None:
            continue
        predicted = runner.planner.predictions(plan.profile.name, without_unpredictable(config), plan.spec)
        total = (predicted.get("breakdown_bytes") or {}).get("total")
        if total is not None:
            needed = max(needed or 0, int(total * HEADROOM))
            own = total if config is plan.config else own
        else:
            unpredicted = unpredicted or predicted.get("reason")
    return needed, own, unpredicted


def _wrong_reason(reason: str | None) -> str | None:
    return f"refused for a reason a GPU cannot have: {reason}" if reason and any(
        text in reason for text in WRONG_ON_A_GPU) else None


def format_night(night: NightPlan) -> list[str]:
    """The plan as printed: the doctor's CUDA checks, one line per case, a summary."""
    gpu = night.gpu
    lines = [f"night plan for {gpu.count} x {gpu.name} ({gpu.sm}, {gpu.memory_bytes / GiB:.1f} GiB), simulated"]
    lines += format_checks(night.checks)
    if night.refused:
        return lines + ["refused: this torch build cannot run on this GPU (see the FAIL above)"]
    for c in night.cases:
        if c.problem:
            lines.append(f"PROBLEM  {c.case}: {c.problem}")
        elif c.skipped:
            lines.append(f"skip  {c.case}: {c.skipped}")
        else:
            lines.append(f"run   {c.case}: {would_run(c, gpu)}")
            if c.speedup_flag:
                lines.append(f"flag  {c.case}: {c.speedup_flag}")
    flagged = f", {len(night.flagged)} min_speedup budget(s) the roofline says cannot hold" if night.flagged else ""
    timed = [c.predicted_s for c in night.runs if c.predicted_s is not None]
    if timed:
        lines.append(f"time: {len(timed)} of the {len(night.runs)} cases that run predicted, {sum(timed):.0f} s in "
                     f"all; the other {len(night.runs) - len(timed)} not (see each case's predicted_from)")
    return lines + [_memory_line(night),
                    f"{len(night.runs)} run, {len(night.skips)} skip, {len(night.problems)} problem(s){flagged}"]


def would_run(c: PlannedCase, gpu: Gpu) -> str:
    """What a case that runs on ``gpu`` does there: its budget section, memory, how it is measured, the peaks its MFU
    is judged against, and its roofline where drawn."""
    memory = f"needs ~{c.needed_bytes / GiB:.1f} of {gpu.memory_bytes / GiB:.1f} GiB" if c.needed_bytes else \
        f"memory not predicted ({c.unpredicted or 'not asked'})"
    how = c.measuring + (f" ({c.why_measuring})" if c.why_measuring else "")
    mfu = "MFU against " + " or ".join(f"{precision} {peak:g}" if peak else f"{precision} (peak unknown)"
                                       for precision, peak in c.mfu_peaks) + " TFLOP/s"
    seconds = f"; ~{c.predicted_s:g} s in a night ({c.predicted_from})" if c.predicted_s is not None else ""
    return (f"[{c.section or 'no budget'}] {memory}; {how}; {mfu}" + (f"; {c.roofline}" if c.roofline else "")
            + seconds)


def _memory_line(night: NightPlan) -> str:
    """What the largest case that will run needs against the GPU's memory (the others do not fit and are skipped)."""
    have = f"{night.gpu.memory_bytes / GiB:.1f} GiB"
    largest = night.largest_run()
    if largest is None:
        return f"memory: no case that runs was predicted; {night.gpu.name} has {have}"
    return (f"memory: the largest case that runs, {largest.case}, needs ~{largest.needed_bytes / GiB:.1f} GiB of "
            f"{have}; cases that would not fit are skipped with their figures (python -m trainbench plan lists "
            "every case)")


def simulated_doctor(gpu: Gpu, arch_list: list[str] | None = None) -> list[Check]:
    """The doctor's checks of a machine with ``gpu``, as on it: its CUDA checks, and its memory against the suite's
    heaviest cases (the few the doctor predicts, not every case: ``plan_night`` does that)."""
    checks = simulated_checks(gpu, arch_list)
    if any(check.status == "FAIL" for check in checks):
        return checks
    caps = SimulatedGpu(gpu, arch_list=arch_list).caps()
    predict = functools.partial(PredictionCache(prediction_backend()), "gpu")
    for device in simulated_runtime(gpu, arch_list)["devices"]:
        checks += check_device_memory(device, heaviest_cases(caps, device["total_memory_bytes"], predict))
    return checks


class PlanFileError(ValueError):
    """A file that is not a plan ``plan_record`` wrote; the message names it, the row and the field."""


# Each row's fields a reader takes, and what each must be: the plan's JSON as plan_record writes it.
_PLAN_ROW_NUMBERS = ("needed_mib", "peak_mib", "predicted_s", "bound_s")
_PLAN_ROW_TEXTS = ("skipped", "problem", "roofline", "predicted_from", "section", "measuring")


def read_plan(path: Path) -> dict:
    """The plan at ``path`` (``plan --json``), checked whole: its GPU and every row of the fields a summary or a
    comparison reads; raises ``PlanFileError`` naming the file, row and field of the first that is not."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise PlanFileError(f"{path}: not readable as JSON ({e}); expected the JSON of python -m trainbench plan "
                            "--simulate-gpu GPU --json PATH") from None
    if not isinstance(data, dict) or not isinstance(data.get("gpu"), dict) or not isinstance(data.get("cases"), list):
        raise PlanFileError(f"{path}: not a plan (a gpu and a list of cases); expected the JSON of python -m "
                            "trainbench plan --simulate-gpu GPU --json PATH")
    if not isinstance(data["gpu"].get("name"), str):
        raise PlanFileError(f"{path}: gpu.name = {data['gpu'].get('name')!r}: expected the GPU's name")
    for index, row in enumerate(data["cases"]):
        where = f"{path}: cases[{index}]"
        if not isinstance(row, dict) or not isinstance(row.get("case"), str):
            raise PlanFileError(f"{where} = {row!r:.80}: expected a row with its case id")
        for key in _PLAN_ROW_NUMBERS:
            value = row.get(key)
            if value is not None and not (isinstance(value, (int, float)) and not isinstance(value, bool)
                                          and math.isfinite(value)):
                raise PlanFileError(f"{where}.{key} = {value!r}: expected a finite number or null")
        for key in _PLAN_ROW_TEXTS:
            if row.get(key) is not None and not isinstance(row.get(key), str):
                raise PlanFileError(f"{where}.{key} = {row.get(key)!r}: expected text or null")
    return data


def planned_peak_mib(row: dict) -> float | None:
    """A case's own predicted tensor peak (MiB) from a row of ``plan_record``'s cases, what its measured peak compares
    with; None where it was not predicted, or in a plan saved before rows carried it (their ``needed_mib`` is the
    larger of the case and its baseline, with headroom: not the case's own)."""
    peak = row.get("peak_mib")
    return float(peak) if isinstance(peak, (int, float)) and not isinstance(peak, bool) else None


def plan_record(night: NightPlan) -> dict:
    """The plan as JSON (``plan --json``; the night's summary reads it): the GPU, the checks, every case."""
    gpu = night.gpu
    return {"gpu": {"name": gpu.name, "count": gpu.count, "sm": gpu.sm, "memory_bytes": gpu.memory_bytes},
            "checks": doctor_record(night.checks)["checks"], "refused": night.refused,
            "cases": [dict(asdict(c), needed_mib=round(c.needed_bytes / 2**20, 1) if c.needed_bytes else None,
                           peak_mib=round(c.peak_bytes / 2**20, 1) if c.peak_bytes else None)
                      for c in night.cases]}
