"""pytest plugin: options, markers, the ``train_bench`` fixture, budget checks, summary.

Thin by design: measuring is ``trainbench.measure``, budgets are ``trainbench.budgets``,
this module wires them into pytest and pytest-benchmark.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from .budgets import BudgetError, Budgets, evaluate
from .result import Result

MARKERS = {
    "gpu": "gpu: needs a CUDA device; skipped with the reason elsewhere",
    "cuda": "cuda: alias of gpu",
    "min_gpus": "min_gpus(n): needs at least n CUDA devices",
    "min_capability": "min_capability(major, minor): needs a CUDA device of at least this compute capability",
    "slow": "slow: long case (e.g. torch.compile on CPU); runs only with --trainbench-slow",
}


class NoBudgetWarning(UserWarning):
    """A case ran with no budget for this device: nothing was checked."""


@dataclass
class SessionState:
    device_spec: str
    profile_name: str
    budgets: Budgets
    run_slow: bool
    require_budgets: bool
    settings_overrides: dict
    compare_fail: dict | None = None  # the regression gate (trainbench.compare.parse_spec)
    fault: object = None  # trainbench.step.InjectedFault planted by --trainbench-inject-*
    comparison: dict | None = None  # the verdict (JSON-ready), filled at session end when --benchmark-compare ran
    comparisons: list = field(default_factory=list)  # its trainbench.compare.MetricComparison objects
    # (workload, recipe, overrides) -> Result, for same-session baselines
    results: dict[tuple, Result] = field(default_factory=dict)
    trajectories: dict[tuple, list[float]] = field(default_factory=dict)  # baseline losses for the guard
    rows: list[dict] = field(default_factory=list)
    _backend: object = None

    @property
    def backend(self):
        if self._backend is None:  # lazy: importing torch costs seconds in unrelated pytest runs
            from .device import get_backend

            self._backend = get_backend(self.device_spec)
        return self._backend

    @property
    def profile(self):
        from .workloads import PROFILES, profile_for

        return PROFILES[self.profile_name] if self.profile_name != "auto" else profile_for(self.backend.kind)

    def settings(self):
        from .measure import DEFAULT_SETTINGS, with_overrides

        return with_overrides(DEFAULT_SETTINGS[self.profile.name], **self.settings_overrides)


_STATE = pytest.StashKey[SessionState]()


def pytest_addoption(parser):
    group = parser.getgroup("trainbench", "trainbench: measured PyTorch training steps")
    group.addoption("--trainbench-device", default="auto",
                    help="device to train on: auto (CUDA if available, else cpu), cpu, cuda, cuda:N")
    group.addoption("--trainbench-profile", default="auto", choices=["auto", "cpu", "gpu"],
                    help="size profile of the workloads (default: from the device)")
    group.addoption("--trainbench-budgets", default=None,
                    help="budgets TOML file (default: the trainbench_budgets ini value, if set)")
    group.addoption("--trainbench-require-budgets", action="store_true",
                    help="fail a case that has no budget for this device instead of warning")
    group.addoption("--trainbench-slow", action="store_true", help="also run cases marked slow")
    group.addoption("--trainbench-rounds", type=int, default=None, help="timed rounds per case")
    group.addoption("--trainbench-steps-per-round", type=int, default=None, help="training steps per timed round")
    group.addoption("--trainbench-min-warmup", type=int, default=None, help="minimum warm-up steps")
    group.addoption("--trainbench-compare-fail", default=None, metavar="SPEC",
                    help="with --benchmark-compare: fail the session when a case regressed beyond METRIC:THRESHOLD "
                         "(e.g. samples_per_s:5%%,peak_memory:2%%,deterministic:0%%); timed metrics must also be "
                         "significant over the rounds of both runs")
    group.addoption("--trainbench-compare-alpha", type=float, default=0.05,
                    help="significance level of the one-sided rank test on timed metrics (default 0.05)")
    group.addoption("--trainbench-compare-json", default=None, metavar="PATH",
                    help="write the compare verdict of every case and metric as JSON")
    group.addoption("--trainbench-allow-cross-device", action="store_true",
                    help="allow --benchmark-compare against a run made on another device")
    group.addoption("--trainbench-inject-slowdown", default=None, metavar="FRACTION",
                    help="plant a regression to prove the gate: wait this fraction (e.g. 20%%) of every timed step")
    group.addoption("--trainbench-inject-leak-mib", type=float, default=0.0, metavar="MIB",
                    help="plant a memory regression to prove the gate: keep this many MiB per step, never freed")
    parser.addini("trainbench_budgets", "budgets TOML file, relative to the rootdir", default="")


def pytest_configure(config):
    for line in MARKERS.values():
        config.addinivalue_line("markers", line)
    budgets_path = config.getoption("--trainbench-budgets") or config.getini("trainbench_budgets")
    budgets = Budgets.empty()
    if budgets_path:
        path = Path(budgets_path)
        if not path.is_absolute() and not config.getoption("--trainbench-budgets"):
            path = Path(config.rootpath) / path
        try:
            budgets = Budgets.load(path)
        except BudgetError as e:
            raise pytest.UsageError(f"trainbench: {e}") from None
    overrides = {
        "rounds": config.getoption("--trainbench-rounds"),
        "steps_per_round": config.getoption("--trainbench-steps-per-round"),
        "min_warmup_steps": config.getoption("--trainbench-min-warmup"),
    }
    for name, value in overrides.items():
        if value is not None and value < 1:
            raise pytest.UsageError(f"trainbench: --trainbench-{name.replace('_', '-')} must be >= 1, got {value}")
    device_spec = config.getoption("--trainbench-device")
    if device_spec not in ("", "auto"):
        from .device import get_backend

        try:  # an explicit device that is not there is a set-up error, not a skip
            get_backend(device_spec)
        except (RuntimeError, ValueError) as e:
            raise pytest.UsageError(f"trainbench: {e}") from None
    state = config.stash[_STATE] = SessionState(
        device_spec=device_spec,
        profile_name=config.getoption("--trainbench-profile"),
        budgets=budgets,
        run_slow=config.getoption("--trainbench-slow"),
        require_budgets=config.getoption("--trainbench-require-budgets"),
        settings_overrides=overrides,
    )
    state.compare_fail, state.fault = _gate_options(config)
    _storage_per_device(config, state)


def _gate_options(config):
    from .compare import CompareError, parse_fraction, parse_spec

    spec = config.getoption("--trainbench-compare-fail")
    try:
        gate = parse_spec(spec) if spec else None
        slowdown = config.getoption("--trainbench-inject-slowdown")
        slowdown = parse_fraction(slowdown, "--trainbench-inject-slowdown") if slowdown else 0.0
    except CompareError as e:
        raise pytest.UsageError(f"trainbench: {e}") from None
    leak = config.getoption("--trainbench-inject-leak-mib")
    if leak < 0:
        raise pytest.UsageError(f"trainbench: --trainbench-inject-leak-mib must be >= 0, got {leak}")
    fault = None
    if slowdown or leak:
        from .step import InjectedFault

        fault = InjectedFault(slowdown=slowdown, leak_mib=leak)
    return gate, fault


def _storage_per_device(config, state: SessionState) -> None:
    """Key pytest-benchmark's storage by device: <storage>/<device>/<its own machine folder>.

    pytest-benchmark keys folders by OS and Python only, so an H100 run and a CPU run
    would share a folder and ``--benchmark-compare`` would pick whichever came last.
    Runs before pytest-benchmark's own (trylast) configure, which opens the storage.
    """
    uses_storage = any(config.getoption(name, None) for name in ("benchmark_save", "benchmark_autosave", "benchmark_compare"))
    storage = config.getoption("benchmark_storage", None)
    if not uses_storage or not storage or "://" in storage and not storage.startswith("file://"):
        return  # nothing stored, or a non-file storage (elasticsearch) that keys by machine_info itself
    from .report import device_slug

    try:
        slug = device_slug(state.backend.identity())
    except RuntimeError as e:
        raise pytest.UsageError(f"trainbench: {e}") from None
    prefix = "file://" if storage.startswith("file://") else ""
    config.option.benchmark_storage = prefix + str(Path(storage[len(prefix):]) / slug)


def _skip_reason(item, state: SessionState) -> str | None:
    """Why ``item``'s markers rule it out on this session's device, or None."""
    if item.get_closest_marker("slow") and not state.run_slow:
        return "slow case: run with --trainbench-slow"
    names = {m.name for m in item.iter_markers()}
    if not names & {"gpu", "cuda", "min_gpus", "min_capability"}:
        return None
    try:
        backend = state.backend
    except RuntimeError as e:
        return str(e)
    # A marker may say what the case is, e.g. gpu(what="pinned_memory"), so -rs tells cases apart.
    what = next((m.kwargs["what"] for m in item.iter_markers() if "what" in m.kwargs), None)
    prefix = f"{what}: " if what else ""
    if backend.kind != "cuda":
        return f"{prefix}needs a CUDA device; this run uses {backend.kind} ({backend.name})"
    mark = item.get_closest_marker("min_gpus")
    if mark and backend.device_count() < mark.args[0]:
        return f"{prefix}needs {mark.args[0]} GPUs; {backend.device_count()} present"
    mark = item.get_closest_marker("min_capability")
    if mark and backend.capability() < tuple(mark.args):
        have = ".".join(map(str, backend.capability()))
        return f"{prefix}needs compute capability >= {'.'.join(map(str, mark.args))}; {backend.name} has {have}"
    return None


def pytest_collection_modifyitems(config, items):
    state = config.stash[_STATE]
    for item in items:
        reason = _skip_reason(item, state)
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))


def pytest_benchmark_update_machine_info(config, machine_info):
    state = config.stash.get(_STATE, None)
    if state is not None:
        try:
            machine_info["trainbench"] = state.backend.identity()
        except RuntimeError as e:
            machine_info["trainbench"] = {"error": str(e)}


def _marks_for(recipe) -> list:
    """pytest marks from a recipe's requirements, so GPU-only cases are collected and skipped with a reason."""
    req, marks = recipe.requires, []
    if req.cuda or req.min_capability or req.min_gpus:
        marks.append(pytest.mark.gpu(what=f"{recipe.name} ({recipe.description})"))
    if req.min_capability:
        marks.append(pytest.mark.min_capability(*req.min_capability))
    if req.min_gpus:
        marks.append(pytest.mark.min_gpus(req.min_gpus))
    if recipe.slow:
        marks.append(pytest.mark.slow)
    return marks


def _device_of(machine_info: dict | None) -> tuple | None:
    info = (machine_info or {}).get("trainbench")
    return (info.get("kind"), info.get("name")) if info else None


def pytest_benchmark_compare_machine_info(config, benchmarksession, machine_info, compared_benchmark):
    """Refuse to compare runs of different devices: their timings and memory say nothing about each other."""
    if config.getoption("--trainbench-allow-cross-device"):
        return
    mine, theirs = _device_of(machine_info), _device_of(compared_benchmark.get("machine_info"))
    if mine != theirs:
        what = f"{theirs[1]} ({theirs[0]})" if theirs else "a run without trainbench device information"
        raise pytest.UsageError(
            f"trainbench: --benchmark-compare would compare this {mine[1] if mine else 'device'} with {what}; "
            "numbers from different devices are not comparable. Compare with a run of this device "
            "(saved runs are kept per device under the storage folder), or pass --trainbench-allow-cross-device.")


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    """With --benchmark-compare: compare every case with the baseline run; fail on a gated regression."""
    config = session.config
    state = config.stash.get(_STATE, None)
    bench_session = getattr(config, "_benchmarksession", None)
    if state is None or bench_session is None or not bench_session.compare or not bench_session.compared_mapping:
        return
    from .compare import DISPLAY_THRESHOLDS, CaseRun, CompareError, compare_case, verdict_json

    path, baseline = list(bench_session.compared_mapping.items())[-1]
    comparisons, errors, new_cases = [], [], []
    alpha = config.getoption("--trainbench-compare-alpha")
    for row in state.rows:
        base_bench = baseline.get(row["fullname"])
        if base_bench is None:
            new_cases.append(row["case"])
            continue
        try:
            base_run = CaseRun.from_extra_info(base_bench.get("extra_info") or {}, f"{path}: {row['fullname']}")
        except CompareError as e:
            errors.append(str(e))
            continue
        thresholds = dict(state.compare_fail or DISPLAY_THRESHOLDS)
        thresholds.update(row.get("compare_fail") or {})
        comparisons += compare_case(row["run"], base_run, thresholds, alpha)
    verdict = verdict_json(comparisons, str(path), state.backend.identity())
    verdict.update(gated=state.compare_fail is not None, new_cases=new_cases, errors=errors)
    state.comparison, state.comparisons = verdict, comparisons
    json_path = config.getoption("--trainbench-compare-json")
    if json_path:
        from .files import write_json_atomic

        write_json_atomic(Path(json_path), verdict)
    if errors or (state.compare_fail is not None and verdict["failed"]):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def recipe_params(*names: str):
    """``pytest.param`` per recipe, with markers derived from its requirements.

    Use with ``@pytest.mark.parametrize("recipe", recipe_params(...))`` so that GPU-only
    recipes are collected everywhere and skipped with a reason on CPU runners.
    """
    from .recipes import RECIPES, get_recipe

    return [pytest.param(name, id=name, marks=_marks_for(get_recipe(name))) for name in names or tuple(RECIPES)]


def case_params(cases):
    """``pytest.param`` per ``trainbench.cases.Case``, id = the case id (the budgets key)."""
    return [pytest.param(case, id=case.id, marks=_marks_for(case.own_recipe())) for case in cases]


def _setup_key(workload: str, recipe, overrides: dict) -> tuple:
    """Identifies a measured setup within the session (same-session baselines, guard trajectories)."""
    return (workload, recipe.name, tuple(sorted(overrides.items())))


class TrainBench:
    """Callable behind the ``train_bench`` fixture: measure one recipe, check its budget."""

    def __init__(self, benchmark, state: SessionState):
        self.benchmark = benchmark
        self.state = state
        self._ddp_grads: dict[str, dict] = {}  # case -> first-step gradients recorded by rank 0

    def __call__(self, recipe, workload: str = "resnet18", baseline=None, **overrides) -> Result:
        """Measure ``recipe`` on ``workload`` against ``baseline`` (default: the recipe's own)."""
        from .recipes import Recipe, get_recipe

        state = self.state
        recipe = recipe if isinstance(recipe, Recipe) else get_recipe(recipe)
        backend = state.backend
        unmet = recipe.unmet(backend, state.profile)
        if unmet:
            pytest.skip(f"{recipe.name}: {unmet}")
        case = f"{workload}-{recipe.name}"
        budget = state.budgets.for_case(backend, case)
        baseline = recipe.baseline if baseline is None else baseline
        base_recipe = baseline if isinstance(baseline, Recipe) else get_recipe(baseline)
        if base_recipe.name == recipe.name:
            base_recipe = None

        if self._can_interleave(recipe, base_recipe, budget, workload, overrides):
            result, baseline_result = self._measure_interleaved(recipe, base_recipe, workload, overrides, case)
            state.results[_setup_key(workload, recipe, overrides)] = result
            state.results.setdefault(_setup_key(workload, base_recipe, overrides), baseline_result)
        else:
            result = self._measure(recipe, workload, overrides, case, timed_by_benchmark=True)
            state.results[_setup_key(workload, recipe, overrides)] = result
            baseline_result = self._sequential_baseline(base_recipe, budget, workload, overrides)
        guard_failures = self._guard(case, recipe, base_recipe, workload, overrides) if base_recipe else []
        self._report(case, result, baseline_result, base_recipe, budget, guard_failures)
        return result

    def _can_interleave(self, recipe, base_recipe, budget, workload, overrides) -> bool:
        """Ratio budgets are judged on interleaved rounds, where both setups can live side by side.

        Not for DDP (its ranks are other processes) nor for knobs that flip process-wide
        state (cuDNN autotuning, deterministic algorithms, debug modes): the baseline's
        rounds would run under the case's setting.
        """
        if base_recipe is None or budget is None or not budget.needs_baseline:
            return False
        configs = (self._config(recipe, workload, overrides), self._config(base_recipe, workload, overrides))
        return not any(c.parallel == "ddp" or c.cudnn_benchmark or c.deterministic or c.debug or c.empty_cache
                       for c in configs)

    def _measure_interleaved(self, recipe, base_recipe, workload, overrides, case):
        from .measure import Measurement, measure_interleaved
        from .step import Training

        state = self.state
        settings = state.settings()
        with Training(self._config(recipe, workload, overrides), state.backend, state.profile, state.fault) as tc, \
                Training(self._config(base_recipe, workload, overrides), state.backend, state.profile) as tb:
            mc = Measurement(tc, case, recipe.name, settings, recipe.extra_warmup_steps)
            mb = Measurement(tb, f"{workload}-{base_recipe.name}", base_recipe.name, settings, base_recipe.extra_warmup_steps)
            result, baseline_result = measure_interleaved(mc, mb)
        result.notes.append(f"rounds interleaved with {base_recipe.name}'s (ABBA) for its ratio budgets")
        self._replay_rounds(result.round_step_times_s, result.steps_per_round)
        return result, baseline_result

    def _sequential_baseline(self, base_recipe, budget, workload, overrides):
        """The baseline for a case that cannot be interleaved with it.

        A ratio budget gets a fresh baseline measured right after the case: one from
        minutes earlier carries the machine's drift since then (the first case of a
        session runs up to 2x slower here). Without a ratio budget an earlier result serves.
        """
        if base_recipe is None:
            return None
        state = self.state
        key = _setup_key(workload, base_recipe, overrides)
        if budget is None or not budget.needs_baseline:
            return state.results.get(key)
        # Relative budgets compare within this session: measure the baseline now.
        baseline_result = self._measure(base_recipe, workload, overrides, f"{workload}-{base_recipe.name}",
                                        timed_by_benchmark=False)
        state.results[key] = baseline_result
        return baseline_result

    def case(self, case, **overrides) -> Result:
        """Measure a ``trainbench.cases.Case``: a recipe on a workload, or a ladder rung."""
        if case.ladder is None:
            return self(case.recipe_name, workload=case.workload, **overrides)
        from .ladders import LADDERS

        state, ladder = self.state, LADDERS[case.ladder]
        own = case.own_recipe()
        unmet = own.unmet(state.backend, state.profile)
        if unmet:
            pytest.skip(f"{own.name}: {unmet}")
        recipe = case.recipe(state.backend, state.profile)
        base = ladder.rung_recipe(0, state.backend, state.profile)
        step = ladder.steps[case.rung]
        self.benchmark.extra_info["ladder"] = {
            "name": ladder.name, "title": ladder.title, "source": ladder.source, "rung": case.rung,
            "label": step.label, "applied": recipe.description, "article": dataclasses.asdict(step.article),
            "article_summary": ladder.article_summary, "rungs": [s.label for s in ladder.steps],
        }
        return self(recipe, workload=case.workload, baseline=base, **overrides)

    def _guard(self, case, recipe, base_recipe, workload, overrides) -> list[str]:
        """Fail the case if the recipe trains something else than its baseline (trainbench.guards)."""
        from .guards import compare_gradients, compare_trajectories, first_step_gradients, loss_trajectory

        state = self.state
        key = _setup_key(workload, base_recipe, overrides)
        base_config, config = self._config(base_recipe, workload, overrides), self._config(recipe, workload, overrides)
        verdicts = []
        if recipe.loss_rtol is not None:
            if key not in state.trajectories:
                state.trajectories[key] = loss_trajectory(base_config, state.backend, state.profile)
            losses = loss_trajectory(config, state.backend, state.profile)
            verdicts.append(compare_trajectories(losses, state.trajectories[key], recipe.loss_rtol))
        if recipe.grad_rtol is not None:
            base_grads = first_step_gradients(base_config, state.backend, state.profile)
            if config.parallel == "ddp":  # recorded by rank 0 while the case was measured
                grads = self._ddp_grads[case]
            else:
                grads = first_step_gradients(config, state.backend, state.profile)
            verdicts.append(compare_gradients(grads, base_grads, recipe.grad_rtol))
        if verdicts:
            self.benchmark.extra_info["guard"] = {
                "baseline": base_recipe.name,
                "checks": [{"kind": v.kind, "ok": v.ok, "max_rel_diff": v.max_rel_diff, "message": v.message,
                            "rtol": recipe.loss_rtol if v.kind == "loss" else recipe.grad_rtol,
                            "losses": v.losses, "baseline_losses": v.baseline_losses} for v in verdicts],
            }
        return [f"{case}: correctness guard ({v.kind}): {v.message}" for v in verdicts if not v.ok]

    def _measure(self, recipe, workload, overrides, case, timed_by_benchmark: bool) -> Result:
        from .measure import Measurement, run_rounds
        from .step import Training

        state = self.state
        config = self._config(recipe, workload, overrides)
        if config.parallel == "ddp":
            return self._measure_ddp(recipe, config, case, timed_by_benchmark)
        runner = self._benchmark_runner if timed_by_benchmark else run_rounds
        fault = state.fault if timed_by_benchmark else None  # planted in the measured case, not its baseline
        with Training(config, state.backend, state.profile, fault) as training:
            m = Measurement(training, case, recipe.name, state.settings(), recipe.extra_warmup_steps)
            return m.run(runner)

    def _measure_ddp(self, recipe, config, case, timed_by_benchmark: bool) -> Result:
        """Rank processes measure; their rank-0 rounds are handed to pytest-benchmark as recorded."""
        from .distributed import measure_ddp

        state = self.state
        result, grads = measure_ddp(config, state.backend.kind, state.profile.name, state.settings(), case, recipe.name,
                                    recipe.extra_warmup_steps, want_grads=recipe.grad_rtol is not None)
        if grads is not None:
            self._ddp_grads[case] = grads
        if timed_by_benchmark:
            self._replay_rounds(result.round_step_times_s, result.steps_per_round)
        return result

    def _replay_rounds(self, round_step_times: list[float], steps_per_round: int) -> None:
        """Give pytest-benchmark rounds timed elsewhere: its timer reads back their start and end stamps."""
        bench = self.benchmark
        if bench.disabled:
            bench.pedantic(lambda: None)
            return
        stamps, t = [], 0.0
        for per_step in round_step_times:
            stamps += [t, t + per_step * steps_per_round]
            t += per_step * steps_per_round
        clock = iter(stamps)
        bench._timer = lambda: next(clock)
        bench.pedantic(lambda: None, rounds=len(round_step_times), iterations=steps_per_round, warmup_rounds=0)

    def _config(self, recipe, workload, overrides):
        return recipe.config(self.state.profile, workload=workload, **overrides)

    def _benchmark_runner(self, step, rounds, steps_per_round, timer):
        """Time rounds through pytest-benchmark so its table, --benchmark-save/compare/json work.

        Its runner reads the timer once before and once after each round; handing it the
        backend's synchronizing timer puts the device sync exactly at round boundaries.
        """
        from .measure import run_rounds

        bench = self.benchmark
        if bench.disabled:  # --benchmark-disable: pedantic calls its target once; time the rounds ourselves
            times: list[float] = []
            bench.pedantic(lambda: times.extend(run_rounds(step, rounds, steps_per_round, timer)))
            return times
        if not hasattr(bench, "_timer"):
            raise RuntimeError("unsupported pytest-benchmark version: BenchmarkFixture has no _timer")
        bench._timer = timer
        bench.pedantic(step, rounds=rounds, iterations=steps_per_round, warmup_rounds=0)
        return list(bench.stats.stats.data)

    def _report(self, case, result: Result, baseline: Result | None, base_recipe, budget, guard_failures: list[str]) -> None:
        state, backend = self.state, self.state.backend
        metrics = result.metrics()
        info = self.benchmark.extra_info
        info.update(metrics)
        info.update(
            case=case,
            workload=result.workload,
            recipe=result.recipe,
            profile=result.profile,
            batch_size=result.batch_size,
            config=result.config,
            memory_breakdown_bytes=result.memory_breakdown_bytes,
            memory_growth_bytes_per_step=result.memory_growth_bytes_per_step,
            top_ops=result.top_ops,
            flops_per_step=result.flops_per_step,
            warmup={"steps": result.warmup_steps, "steady": result.warmup_steady, "seconds": result.warmup_s,
                    "first_step_s": result.first_step_s},
            round_step_times_s=result.round_step_times_s,
            samples_per_step=result.batch_size * result.world_size,
            device=result.device,
            notes=result.notes,
        )
        speedup = None
        if base_recipe is not None:
            info["baseline"] = base_recipe.name
        if baseline is not None and baseline.samples_per_s and result.samples_per_s:
            speedup = result.samples_per_s / baseline.samples_per_s
            info["speedup_vs_baseline"] = speedup

        from .compare import CaseRun

        run = CaseRun(case, metrics, list(result.round_step_times_s), result.batch_size * result.world_size)
        row = {"case": case, "metrics": metrics, "speedup": speedup, "budget": "none", "run": run,
               "fullname": self.benchmark.fullname, "compare_fail": state.budgets.compare_thresholds(backend, case)}
        state.rows.append(row)
        failures = list(guard_failures)
        if budget is None:
            device_key = state.budgets.device_key(backend)
            what = f"no budget for {backend.name}" if device_key is None else f"no budget for {case} on [{device_key}]"
            info["budget"] = {"status": "none", "reason": what}
            if state.require_budgets:
                row["budget"] = "FAIL"
                failures.append(f"{case}: {what} (--trainbench-require-budgets)")
            else:
                warnings.warn(NoBudgetWarning(f"{case}: {what}; nothing was checked"), stacklevel=2)
        else:
            verdicts = evaluate(budget, result, baseline)
            failed = [v for v in verdicts if not v.ok]
            info["budget"] = {
                "status": "fail" if failed else "pass",
                "device_key": budget.device_key,
                "checks": [{"key": v.bound.key, "measured": v.measured, "limit": v.bound.limit, "ok": v.ok,
                            "message": v.message} for v in verdicts],
            }
            row["budget"] = f"FAIL {len(failed)}/{len(verdicts)}" if failed else f"ok {len(verdicts)}"
            failures += [f"{case} [{budget.device_key}]: {v.message}" for v in failed]
        if guard_failures:
            row["budget"] += " +guard FAIL"
        if failures:
            pytest.fail("trainbench checks failed:\n" + "\n".join(failures), pytrace=False)


@pytest.fixture
def train_bench(request, benchmark) -> TrainBench:
    """Measure a recipe: ``result = train_bench("amp_bf16", workload="resnet18")``."""
    return TrainBench(benchmark, request.config.stash[_STATE])


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    state = config.stash.get(_STATE, None)
    if state is None or not state.rows:
        return
    from .report import summary_table

    terminalreporter.write_sep("=", "trainbench summary")
    backend = state.backend
    terminalreporter.write_line(f"device: {backend.name} ({backend.kind}), profile {state.profile.name}")
    for line in summary_table(state.rows):
        terminalreporter.write_line(line)
    if state.comparison is not None:
        _write_comparison(terminalreporter, state)


def _write_comparison(terminalreporter, state: SessionState) -> None:
    from .compare import verdict_table

    verdict, comparisons = state.comparison, state.comparisons
    gate = "gate: --trainbench-compare-fail" if verdict["gated"] else "no gate (--trainbench-compare-fail not given)"
    terminalreporter.write_sep("=", f"trainbench compare vs {verdict['baseline']}")
    terminalreporter.write_line(gate + "; " + ", ".join(f"{n} {v}" for v, n in verdict["counts"].items() if n))
    for line in verdict_table(comparisons):
        terminalreporter.write_line(line)
    for case in verdict["new_cases"]:
        terminalreporter.write_line(f"{case}: not in the baseline run (new case)")
    for error in verdict["errors"]:
        terminalreporter.write_line(f"ERROR {error}", red=True)
    for c in comparisons:
        if c.verdict == "regressed":
            terminalreporter.write_line(("REGRESSION " if verdict["gated"] else "regressed (not gated): ") + c.describe(),
                                        red=verdict["gated"])
