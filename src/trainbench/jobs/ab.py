"""A/B of two Python environments in one run: is the head (a PyTorch upgrade, a branch) slower or hungrier?

Each side is a long-lived worker process (``trainbench.core.processes.ab_worker``) started with that side's
Python, so each imports its own torch; the process and its pipe are ``trainbench.core.processes.ab_transport``'s, and here
is what both sides build (``plan_case``), the order of their rounds and the comparison. For a case, both
sides build the same setup (same recipe, spec, seeds and data), warm up, and then their timed rounds
alternate on the same device in ABBA order (base, head, head, base, ...), so a slow spell of the machine
falls on both sides. Round i of each side forms a pair; the per-pair ratios head/base are the sample.
Their median, its exact 95% interval and one-sided signed-rank tests decide the timed verdict by the gate's
rule (``stats.judge_change``: *unchanged* only when the interval lies inside the threshold), and an
inconclusive one is measured again with more pairs, up to a time budget;
deterministic metrics (memory breakdown, FLOPs, bytes, ops, syncs) compare exactly, and any other
metric the thresholds name as a value; the loss guard compares both sides' losses over the seeded
steps. The verdict is the gate's (``trainbench.verdicts.gate.Verdict``), with both environments' identities.

After the timed rounds both sides profile a few steps in the same ABBA order (``ATTRIBUTION_PAIRS``), so a
regressed or improved timed metric is explained pair by pair: the ops (and kernels) whose self time changed,
each with an exact interval over the pairs, and none whose change is within noise
(``trainbench.verdicts.explain``); a deterministic change is explained from both sides' whole tables.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from trainbench.core.records.metrics import METRICS, is_timed, parse_thresholds, per_round, rounds_of, timed_metrics
from trainbench.core.records.outcome import case_id
from trainbench.core.records.result import CaseRecord, Result, case_record
from trainbench.core.records.stats import (
    MAX_PAIRS_FACTOR,
    change_interval,
    judge_change,
    level,
    look_alpha,
    median_change,
    signed_rank_tests,
    too_few_rounds,
)
from trainbench.devices.environment import environment_differences
from trainbench.core.processes.ab_transport import Side, SideError, start
from trainbench.verdicts.compare import DEFAULT_ALPHA, compare_case
from trainbench.verdicts.gate import MetricComparison, Verdict, is_worse

# What is compared pair by pair when the thresholds name no timed metric.
DEFAULT_PAIRED = parse_thresholds("step_time_ms:5%,samples_per_s:5%", "the A/B default")
# An inconclusive case gets more pairs, up to this many times the pairs asked for (and the time budget).
# Untimed steps before each timed round: the side that just waited for the other starts with its caches evicted
# and its threads asleep. Without them, in A/A runs of a 20 ms/step transformer the side running its second
# round in a row was up to 15% faster than the other, and per-run median ratios spread 0.89-1.06.
REWARM_STEPS = 1
# Profiled steps per side after the timed rounds, one per pair in ABBA order like the rounds: a timed change is
# attributed to ops (and kernels) pair by pair, each row's change with an exact interval over the pairs.
ATTRIBUTION_PAIRS = 6


@dataclass
class ABCase:
    """What both sides build: a training config (``TrainConfig`` as a dict) on a spec (``distributed.spec_reference``)."""

    case: str
    recipe: str
    config: dict
    spec: str
    profile: str
    settings: dict
    extra_warmup_steps: int = 0
    threads: int | None = None
    paths: list[str] = field(default_factory=list)  # the project's folders a user's spec imports from
    root: str = ""  # the project's root those folders lie in (the session's)


AB_LOSS_RTOL = 1e-5  # an A/B case's loss guard where its recipe sets none: numerics that moved, reported


@dataclass(frozen=True)
class ABPlan:
    """A case as an A/B run takes it: what both sides build, or why it cannot be compared between environments."""

    case: ABCase | None
    skipped: str | None
    loss_rtol: float


def plan_case(recipe, spec, overrides: dict, runner, rootpath: str | Path) -> ABPlan:
    """``recipe`` (a name or a Recipe) on ``spec`` (a TrainingSpec or a built-in workload's name) as both sides will
    build it on ``runner``'s device and profile. A config or spec that cannot be trained raises its own error."""
    # Lazy, as compare_trajectories below: torch and what imports it load where a case is planned, not where the
    # plugin's options read this module (every pytest session).
    import torch

    from trainbench.core.method.distributed import spec_reference
    from trainbench.core.setups import eligibility, recipes, workloads

    recipe = recipes.get_recipe(recipe) if isinstance(recipe, str) else recipe
    spec = workloads.resolve_spec(spec, runner.profile)
    config = recipe.config(runner.profile, **overrides)
    loss_rtol = recipe.loss_rtol if recipe.loss_rtol is not None else AB_LOSS_RTOL
    skipped = eligibility.why_not(recipe, runner.caps, runner.profile, spec, config,
                                  eligibility.Context(ab=True, fresh_process=runner.backend.fresh_process_reason,
                                                      memory=runner.planner.memory_limit()))
    if skipped:
        return ABPlan(None, skipped, loss_rtol)
    case = ABCase(case_id(spec.name, recipe.name), recipe.name, config.record(), spec_reference(spec),
                  runner.profile.name, asdict(runner.settings), recipe.extra_warmup_steps, torch.get_num_threads(),
                  project_paths(rootpath), str(Path(rootpath).resolve()))
    return ABPlan(case, None, loss_rtol)


def rerooted(paths: list[str], root: str, other_root: Path | None) -> list[str]:
    """``paths`` inside ``root`` taken from ``other_root`` instead (another checkout of the project: the base side of
    two commits compared in one environment); the others, and all of them without ``other_root``, as they are."""
    if other_root is None or not root:
        return list(paths)
    moved = []
    for path in paths:
        inside = Path(path) == Path(root) or Path(root) in Path(path).parents
        moved.append(str(Path(other_root) / Path(path).relative_to(root)) if inside else path)
    return moved


def project_paths(root: str | Path) -> list[str]:
    """The entries of ``sys.path`` inside ``root`` (test folders, the project's source): what a spec defined in a
    test module needs on either side. Never a site-packages or standard library folder: each side keeps its own."""
    root = Path(root).resolve()
    found = []
    for entry in sys.path:
        path = Path(entry or ".").resolve()
        if (path == root or root in path.parents) and "site-packages" not in path.parts:
            found.append(str(path))
    return found


@dataclass
class ABOutcome:
    case: str
    base: Result
    head: Result
    pairs: list[tuple[float, float]]  # (base, head) step seconds of each ABBA pair
    comparisons: list[MetricComparison]
    guard: object = None  # trainbench.core.records.outcome.GuardCheck: both sides' losses over the seeded steps
    not_measured: tuple[str, ...] = ()  # timed metrics the thresholds name that neither side measured (this device)


def run_case(base: Side, head: Side, case: ABCase, pairs: int, thresholds: dict[str, float],
             head_slowdown: float = 0.0, alpha: float = DEFAULT_ALPHA, loss_rtol: float | None = None,
             remeasure_s: float = 0.0, base_root: Path | None = None) -> ABOutcome:
    """Build ``case`` on both sides, alternate ``pairs`` ABBA pairs of timed rounds, and compare; while a timed
    verdict is inconclusive, add ``pairs`` more at a time for up to ``remeasure_s`` seconds (``MAX_PAIRS_FACTOR``).
    ``base_root``: the base side imports the project from this checkout of it (``rerooted``)."""
    attributed = case.settings.get("attribution", True)
    # The work pass's profiled time is replaced by the pairs' (below): one profiled step gives its call counts.
    settings = {**case.settings, "profiled_steps": 1} if attributed else case.settings
    build = {"config": case.config, "recipe": case.recipe, "extra_warmup_steps": case.extra_warmup_steps,
             "spec": case.spec, "profile": case.profile, "settings": settings, "case": case.case,
             "threads": case.threads, "paths": case.paths}
    base.call("build", **{**build, "paths": rerooted(case.paths, case.root, base_root)})
    head.call("build", **build, slowdown=head_slowdown)
    # The metrics read per round that the thresholds name (DEFAULT_PAIRED when they name none), pair by pair;
    # deterministic ones always, exactly unless a threshold says otherwise; any other metric they name, as a value.
    paired = {m: thresholds[m] for m in timed_metrics() if m in thresholds} or DEFAULT_PAIRED
    rounds = _alternate(base, head, pairs, [])
    # Each look at the pairs spends its share of the error (stats.look_alpha): as many looks as may be made
    looks = MAX_PAIRS_FACTOR if remeasure_s > 0 else 1
    started = time.monotonic()
    verdicts = None  # the timed verdicts over the rounds so far, once asked for
    while remeasure_s > 0 and len(rounds) < MAX_PAIRS_FACTOR * pairs and time.monotonic() - started < remeasure_s:
        verdicts = _timed_verdicts(base, head, case.case, rounds, paired, alpha, pairs, looks)
        if "inconclusive" not in verdicts:
            break
        rounds, verdicts = _alternate(base, head, pairs, rounds), None
    # Never between the timed rounds: a profiled step is slower than the step it watches. Only where a timed
    # verdict changed: the pairs explain a change, and an unchanged case (most of a nightly) needs none.
    if attributed and verdicts is None:
        verdicts = _timed_verdicts(base, head, case.case, rounds, paired, alpha, pairs, looks)
    changed = attributed and {"regressed", "improved"} & set(verdicts)
    profiled = _profile_pairs(base, head, ATTRIBUTION_PAIRS) if changed else None
    results = {side.label: _paired(Result.from_dict(side.call("finish")["result"]), side.label, rounds, pairs, looks)
               for side in (base, head)}  # one at a time
    for side in (base, head):  # a side whose training diverged measured nothing worth comparing
        loss = results[side.label].final_loss
        if loss is not None and not math.isfinite(loss):
            raise SideError(f"{side.label} side ({side.python}): {case.case}: the loss of training spec "
                            f"{results[side.label].workload!r} is {loss} after the timed rounds: the training diverged")
    if len(rounds) > pairs:
        results["head"] = results["head"].with_note(f"{len(rounds)} ABBA pairs: {len(rounds) - pairs} more were "
                                                    f"measured while a timed verdict was inconclusive")
    guard = None
    if loss_rtol is not None:  # an upgrade that changes numerics beyond the recipe's tolerance is reported
        from trainbench.core.setups.guards import compare_trajectories  # lazy: it imports torch (see plan_case)

        guard = compare_trajectories(head.call("losses")["losses"], base.call("losses")["losses"], loss_rtol)
    comparisons, not_measured = _compare_sides(case.case, results, paired, thresholds, alpha)
    # Where each change comes from: both sides' whole tables (a record keeps only their top rows), timed ones from
    # the steps profiled pair by pair.
    tables = {label: _attribution(results[label], profiled and profiled[label]) for label in ("base", "head")}
    rounds_s = (results["base"].round_step_times_s, results["head"].round_step_times_s)  # the pairs' (``_paired``)
    comparisons = [c.explained(tables["base"], tables["head"], paired=profiled is not None, rounds_s=rounds_s)
                   for c in comparisons]
    times = [(r["base"]["step_time_s"], r["head"]["step_time_s"]) for r in rounds]
    return ABOutcome(case.case, results["base"], results["head"], times, comparisons, guard, not_measured)


def _compare_sides(case: str, results: dict[str, Result], paired: dict[str, float], thresholds: dict[str, float],
                   alpha: float) -> tuple[list[MetricComparison], tuple[str, ...]]:
    """The pair-by-pair comparisons, then the values; and the paired metrics neither side measured.

    As the saved-run gate (compare.compare_case): a metric neither side measured (CPU time on CUDA) is not
    measured here, said once in the verdict; one measured on one side only stays "missing"."""
    measured = {m: t for m, t in paired.items() if any(r.metrics().get(m) is not None for r in results.values())}
    comparisons = [paired_comparison(case, metric, results["base"], results["head"], limit, alpha)
                   for metric, limit in measured.items()]
    as_values = {m: thresholds.get(m, 0.0) for m, spec in METRICS.items()
                 if spec.deterministic or (m in thresholds and m not in paired)}
    comparisons += compare_case(CaseRecord.read(case_record(results["head"]), "head"),
                                CaseRecord.read(case_record(results["base"]), "base"), as_values, alpha)
    return comparisons, tuple(m for m in paired if m not in measured)


def _alternate(base: Side, head: Side, pairs: int, rounds: list[dict]) -> list[dict]:
    """``rounds`` and ``pairs`` more, each a timed round of both sides in ABBA order (neither always goes first)."""
    rounds = list(rounds)
    for _ in range(pairs):
        order = (base, head) if len(rounds) % 2 == 0 else (head, base)
        rounds.append({side.label: side.call("round", rewarm_steps=REWARM_STEPS) for side in order})
    return rounds


def _timed_verdicts(base: Side, head: Side, case: str, rounds: list[dict], paired: dict[str, float], alpha: float,
                    pairs: int, looks: int) -> list[str]:
    """The verdicts of the pair-by-pair metrics over the rounds so far (each side's result as it stands)."""
    provisional = {side.label: _paired(Result.from_dict(side.call("snapshot")["result"]), side.label, rounds, pairs,
                                       looks)
                   for side in (base, head)}
    return [paired_comparison(case, m, provisional["base"], provisional["head"], t, alpha).verdict
            for m, t in paired.items()]


def _profile_pairs(base: Side, head: Side, pairs: int) -> dict[str, list[dict]] | None:
    """Each side's profiled steps (``attribution.profile_steps``' tables), one per side per pair in ABBA order,
    each after ``REWARM_STEPS`` untimed steps as a round is; None where a side profiles nothing (a profiler of
    the case's own is running)."""
    profiled: dict[str, list[dict]] = {"base": [], "head": []}
    for i in range(pairs):
        for side in ((base, head) if i % 2 == 0 else (head, base)):
            answer = side.call("profile", rewarm_steps=REWARM_STEPS).get("profile")
            if answer is None:
                return None
            profiled[side.label].append(answer)
    return profiled


def _attribution(result: Result, profiled: list[dict] | None) -> dict | None:
    """A side's attribution tables as A/B explains a change from them: whole, with the profiled time per step
    (op self time, kernel time, wall time) that of the steps profiled pair by pair."""
    if not profiled:
        return result.attribution
    time_table = {**(result.attribution or {}).get("time", {}), "steps": len(profiled),
                  "wall_ms": [ms for p in profiled for ms in p["wall_ms"]], "ops_ms": _steps(profiled, "ops_ms")}
    if all("kernels_ms" in p for p in profiled):
        time_table["kernels_ms"] = _steps(profiled, "kernels_ms")
    else:  # never the unpaired steps of the work pass beside paired op times
        time_table.pop("kernels_ms", None)
    return {**(result.attribution or {}), "time": time_table}


def _steps(profiled: list[dict], key: str) -> dict[str, list[float]]:
    """The per-step rows of several profiles, one after another (0 in a step that lacks the row)."""
    rows = sorted({row for p in profiled for row in p[key]})
    return {row: [ms for p in profiled for ms in p[key].get(row, [0.0] * len(p["wall_ms"]))] for row in rows}


def _paired(result: Result, label: str, rounds: list[dict], pairs: int, planned_looks: int) -> Result:
    """A side's result with its rounds as the pairs ran (its own list may hold rounds no pair has), and the look
    they are: ``pairs`` more at each look, of ``planned_looks``."""
    cpu = [r[label].get("cpu_time_s") for r in rounds]
    return result.replace(round_step_times_s=[r[label]["step_time_s"] for r in rounds],
                          round_cpu_times_s=cpu if all(t is not None for t in cpu) else [],
                          looks=max(1, -(-len(rounds) // pairs)), planned_looks=planned_looks)


def ab_thresholds(command_line: dict[str, float] | None, budgets_file: dict[str, float]) -> dict[str, float]:
    """The thresholds of an A/B case: the command line's over the budgets file's, and none of the file's timed ones.

    A budgets file's timed thresholds are set for comparing separate sessions, whose drift on a shared runner
    is tens of percent (benchmarks/budgets.toml gates CPU step time at 50%); paired rounds resolve a few percent,
    so timed metrics take the command line's threshold or ``DEFAULT_PAIRED``. The others (deterministic ones,
    allocator peaks) mean the same in both and are kept."""
    kept = {metric: t for metric, t in budgets_file.items() if not is_timed(metric)}
    return {**kept, **(command_line or {})}


def paired_comparison(case: str, metric: str, base: Result, head: Result, threshold: float,
                      alpha: float = DEFAULT_ALPHA) -> MetricComparison:
    """A timed metric compared pair by pair: the median of head/base over the ABBA pairs, its exact interval and
    one-sided signed-rank tests (``stats.change_interval``, at the share of the error ``head``'s look may spend:
    more pairs measured while a verdict was inconclusive are a later look), judged by the gate's rule
    (``stats.judge_change``)."""
    base_values = per_round(metric, base.metrics()[metric], rounds_of(metric, base))
    head_values = per_round(metric, head.metrics()[metric], rounds_of(metric, head))
    if not base_values or not head_values:  # not measured on a side (MFU off a known GPU): nothing to compare
        return MetricComparison(case, metric, base.metrics()[metric], head.metrics()[metric], None, threshold,
                                "missing")
    ratios = [h / b for h, b in zip(head_values, base_values)]
    if not all(math.isfinite(r) and r > 0 for r in ratios):
        return MetricComparison(case, metric, statistics.median(base_values), statistics.median(head_values), None,
                                threshold, "missing", reason=f"a non-finite or non-positive {metric} in a round of a side")
    change = median_change(head_values, base_values, paired=True) - 1.0
    higher_is_better = METRICS[metric].higher_is_better
    alpha_side = look_alpha(head.looks, head.planned_looks)
    few = too_few_rounds(head_values, base_values, True, alpha_side)
    if few:
        return MetricComparison(case, metric, statistics.median(base_values), statistics.median(head_values), change,
                                threshold, "inconclusive", reason=few.replace("--trainbench-rounds", "--pairs"))
    ci = change_interval(head_values, base_values, paired=True, alpha_side=alpha_side)
    p_worse, p_better = signed_rank_tests(ratios, higher_is_better)
    verdict, reason = judge_change(ci, p_worse, p_better, threshold, higher_is_better, alpha, alpha_side=alpha_side)
    p = p_worse if is_worse(change, higher_is_better) else p_better  # the test in the direction of the change
    return MetricComparison(case, metric, statistics.median(base_values), statistics.median(head_values), change,
                            threshold, verdict, p, ci, reason, ci_level=level(alpha_side))


def verdict(outcomes: list[ABOutcome], identities: dict, gated: bool, allow_inconclusive: bool = False) -> Verdict:
    """The A/B verdict: the gate's, with both environments' identities (``allow_inconclusive``: a pair-by-pair
    verdict that stayed inconclusive is reported, not failed)."""
    base, head = identities.get("base", {}), identities.get("head", {})
    return Verdict(
        "A/B: base vs head", head.get("identity", {}),
        tuple(c for o in outcomes for c in o.comparisons), gated=gated, allow_inconclusive=allow_inconclusive,
        sides={label: {"python": h["python"], "trainbench": h["trainbench"], "identity": h["identity"]}
               for label, h in identities.items()},
        pairs={o.case: o.pairs for o in outcomes},
        not_measured=tuple(dict.fromkeys(m for o in outcomes for m in o.not_measured)),
        # Both sides' losses over the seeded steps, per case: an upgrade that moved the numerics
        numerics={o.case: {"ok": o.guard.ok, "max_rel_diff": o.guard.max_rel_diff, "message": o.guard.message}
                  for o in outcomes if o.guard is not None},
        # what differs between the sides' software: the device's libraries, then every installed package
        environment=tuple(environment_differences(base.get("identity"), head.get("identity"), base.get("packages"),
                                                  head.get("packages"))))


class ABSession:
    """Both sides for a whole session: started at the first case, closed at the end, every case's outcome kept."""

    def __init__(self, base_python: str, head_python: str, pairs: int, device_spec: str = "auto",
                 remeasure_s: float = 0.0, base_root: Path | None = None):
        self.base_python, self.head_python, self.pairs = base_python, head_python, pairs
        self.remeasure_s = remeasure_s
        self.base_root = base_root  # the base side's checkout of the project (None: the session's)
        self.env = {"TRAINBENCH_AB_DEVICE": device_spec}
        self.sides: tuple[Side, Side] | None = None
        self.identities: dict = {}
        self.outcomes: list[ABOutcome] = []
        self.start_failed: str | None = None  # why the sides could not start

    def run(self, case: ABCase, thresholds: dict[str, float], head_slowdown: float = 0.0,
            alpha: float = DEFAULT_ALPHA, loss_rtol: float | None = None) -> ABOutcome:
        self.start(case.settings.get("no_progress_s"))
        outcome = run_case(*self.sides, case, self.pairs, thresholds, head_slowdown, alpha, loss_rtol, self.remeasure_s,
                           self.base_root)
        self.outcomes.append(outcome)
        return outcome

    def start(self, limit_s: float | None) -> None:
        """Both sides started and their handshake checked (``ab_transport.start``), once: the session does it before
        its first case, so a side without trainbench, or with another protocol, stops it in one line. A side silent
        past ``limit_s`` (the no-progress limit) is stopped, naming its Python."""
        if self.start_failed is not None:  # once: a side that could not start is not waited for again each case
            raise SideError(self.start_failed)
        if self.sides is not None:
            return
        try:
            base, head, self.identities = start(self.base_python, self.head_python, self.env, self.env, limit_s=limit_s)
        except SideError as e:
            self.start_failed = str(e)
            raise
        self.sides = (base, head)

    def verdict(self, gated: bool, allow_inconclusive: bool = False) -> Verdict:
        return verdict(self.outcomes, self.identities, gated, allow_inconclusive)

    def close(self, force: bool = False) -> None:
        for side in self.sides or ():
            side.close(force)
        self.sides = None
