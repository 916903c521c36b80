"""A/B of two environments: the same interpreter on both sides, a planted slowdown in the head."""

import dataclasses
import os
import sys
from pathlib import Path

import pytest
import torch

import trainbench

from trainbench.core.records.metrics import is_timed
from trainbench.core.setups.recipes import get_recipe
from trainbench.core.records.result import Result
from trainbench.core.setups.workloads import PROFILES, resolve_spec
from trainbench.jobs.ab import ABCase, SideError, ab_thresholds, run_case, start, verdict
from trainbench.core.processes.ab_worker import PROTOCOL
from trainbench.verdicts.present import verdict_table, where_lines

SETTINGS = {"min_warmup_steps": 2, "max_warmup_steps": 6, "steady_window": 2, "rounds": 3, "steps_per_round": 2,
            "memory_steps": 1}
CASE = ABCase("mlp-baseline", "baseline", get_recipe("baseline").config(PROFILES["cpu"]).record(), "builtin:mlp", "cpu",
              SETTINGS, threads=1)


@pytest.fixture(scope="module")
def sides():
    base, head, hello = start(sys.executable, sys.executable)
    yield base, head, hello
    base.close()
    head.close()


def _by_metric(outcome):
    return {c.metric: c for c in outcome.comparisons}


def test_the_same_environment_on_both_sides_is_unchanged(sides):
    base, head, hello = sides
    assert hello["base"]["python"] == hello["head"]["python"] == sys.executable
    outcome = run_case(base, head, CASE, pairs=8, thresholds={"step_time_ms": 1.0, "samples_per_s": 1.0,
                                                              "peak_memory_mib": 0.0}, loss_rtol=0.0)
    compared = _by_metric(outcome)
    assert len(outcome.pairs) == 8
    # 100%: a margin no load on this machine moves a paired median ratio across; its interval may still reach it
    # on a loaded machine, which is "could not judge", never a regression.
    assert compared["step_time_ms"].verdict in ("unchanged", "inconclusive"), compared["step_time_ms"].describe()
    deterministic = [c for c in outcome.comparisons if not is_timed(c.metric)]
    assert deterministic and all(c.verdict == "unchanged" for c in deterministic), verdict_table(deterministic)
    assert compared["peak_memory_mib"].ci is None  # named by the thresholds, not read per round: a value
    assert outcome.guard.ok  # the same seeded losses, exactly
    shape = verdict([outcome], hello, gated=True).to_json()
    assert shape["failed"] == shape["could_not_judge"] and set(shape["ab"]) == {"base", "head"} and shape["pairs"]["mlp-baseline"]
    assert shape["numerics"]["mlp-baseline"]["ok"] and shape["numerics"]["mlp-baseline"]["max_rel_diff"] == 0.0


def test_a_slowdown_planted_in_the_head_is_caught_pair_by_pair(sides):
    base, head, hello = sides
    # Where the time went is test_ab_attribution's: no profiled pairs after the rounds here, only their verdict.
    unexplained = dataclasses.replace(CASE, settings={**SETTINGS, "attribution": False})
    outcome = run_case(base, head, unexplained, pairs=8, thresholds={"step_time_ms": 0.25, "samples_per_s": 0.25},
                       head_slowdown=9.0)  # every head step waits 9x its own time: 10x slower
    step = _by_metric(outcome)["step_time_ms"]
    # "Regressed" needs the whole interval beyond +25%. A planted 4x was not enough margin: beside a 2-process CPU
    # hog its lower bound came out at 1.47 over 8 pairs, and beside another xdist worker at 1.21 (median 1.9x).
    assert step.verdict == "regressed", step.describe()
    assert step.ci[0] > 1.25 and step.p_value < 0.05
    assert verdict([outcome], hello, gated=True).failed


class ScriptedSide:
    """A side whose step times the test decides, round by round: the pair-by-pair logic without a worker."""

    python = "scripted"

    def __init__(self, label: str, step_times, final_loss: float | None = None):
        self.label, self.step_times, self.rounds, self.final_loss = label, iter(step_times), [], final_loss

    def call(self, command: str, **arguments) -> dict:
        if command == "round":
            self.rounds.append(next(self.step_times))
            return {"step_time_s": self.rounds[-1], "cpu_time_s": self.rounds[-1]}
        if command in ("snapshot", "finish"):
            return {"result": Result("mlp-baseline", "mlp", "baseline", "cpu", batch_size=16, config={}, device={},
                                     steps_per_round=2, round_step_times_s=list(self.rounds),
                                     final_loss=self.final_loss).to_dict()}
        return {}


def _scripted(base_times, head_times, pairs, threshold=0.05, remeasure_s=0.0):
    base, head = ScriptedSide("base", base_times), ScriptedSide("head", head_times)
    outcome = run_case(base, head, CASE, pairs=pairs, thresholds={"step_time_ms": threshold}, remeasure_s=remeasure_s)
    return outcome, _by_metric(outcome)["step_time_ms"]


def _planted_loss(model, batch):
    raise RuntimeError("a loss planted to fail")


# A spec whose warm-up fails: a side finds it by this module-level name, as it finds a user's.
FAILS_IN_WARM_UP = dataclasses.replace(resolve_spec("mlp", PROFILES["cpu"]), name="fails_in_warm_up",
                                       loss_fn=_planted_loss)


def test_a_side_closes_a_case_that_failed_before_its_finish_when_it_builds_the_next(monkeypatch):
    """A case whose build or rounds failed never reaches ``finish``: its setup stays open (its loader's worker
    processes, its device memory, its global flags) until the side's next ``build`` closes it, before the next case
    is made."""
    import multiprocessing

    from trainbench.core.processes.ab_side import Worker

    monkeypatch.setenv("TRAINBENCH_AB_DEVICE", "cpu")
    worker = Worker(PROTOCOL)
    worker.hello()
    loading = get_recipe("multiprocess_loading").config(PROFILES["cpu"]).record()  # 2 DataLoader workers
    build = dict(extra_warmup_steps=0, profile="cpu", settings=SETTINGS, threads=1)
    before = set(multiprocessing.active_children())
    try:
        with pytest.raises(RuntimeError, match="a loss planted to fail"):
            worker.build(loading, "multiprocess_loading", spec=f"{__name__}:FAILS_IN_WARM_UP",
                         case="fails_in_warm_up-multiprocess_loading", **build)
        assert len(set(multiprocessing.active_children()) - before) == 2  # the failed case's loader, still running
        worker.build(CASE.config, "baseline", spec="builtin:mlp", case="mlp-baseline", **build)
        assert set(multiprocessing.active_children()) - before == set()  # closed before the next case was made
        assert worker.finish()["result"]["case"] == "mlp-baseline"
    finally:
        worker.close_case()


def test_a_small_median_change_whose_interval_reaches_the_threshold_is_not_unchanged():
    # The run that read "+2.1% [-0.0%..+10.1%] unchanged" at a 5% gate: ~10% planted in the head, a busy runner.
    ratios = [1.0, 1.0, 1.0, 1.01, 1.02, 1.02, 1.03, 1.05, 1.08, 1.1, 1.1, 1.1]
    _, step = _scripted([0.1] * 12, [0.1 * r for r in ratios], pairs=12)
    assert abs(step.change) < 0.05 and step.ci[1] > 1.05
    assert step.verdict == "inconclusive" and "reaches the 5.0% threshold" in step.reason


def test_an_inconclusive_case_gets_more_pairs_until_its_interval_decides():
    noisy = [1.3, 0.8, 1.25, 0.85]  # four pairs that say nothing at 5%, then steady ones
    base_times = [0.1] * 64
    head_times = [0.1 * r for r in noisy] + [0.1] * 60
    outcome, step = _scripted(base_times, head_times, pairs=4, remeasure_s=3600)
    assert step.verdict == "unchanged" and 4 < len(outcome.pairs) <= 32, step.describe()
    assert outcome.head.notes[-1].endswith("more were measured while a timed verdict was inconclusive")
    _, unsure = _scripted(base_times, head_times, pairs=4)  # no time to measure again: it stays unjudged
    assert unsure.verdict == "inconclusive"


def test_a_side_whose_loss_diverged_is_named_not_compared():
    base, head = ScriptedSide("base", [0.1] * 4, 2.3), ScriptedSide("head", [0.1] * 4, float("nan"))
    with pytest.raises(SideError, match=r"head side \(scripted\): mlp-baseline: the loss of training spec 'mlp' is nan"):
        run_case(base, head, CASE, pairs=4, thresholds={"step_time_ms": 0.05})


def _wrapper(tmp_path, body: str) -> str:
    """A 'Python' that is a script, as users wrap an environment (LD_LIBRARY_PATH, modules): it ignores the
    arguments it is given and runs ``body``."""
    script = tmp_path / "python-wrapper"
    script.write_text(f"#!/bin/sh\nexec {sys.executable} -c {body!r}\n")
    script.chmod(0o755)
    return str(script)


def test_another_trainbench_on_one_side_is_a_clear_start_up_error(tmp_path):
    other = _wrapper(tmp_path, "import runpy, trainbench; trainbench.__version__ = '9.9'; "
                               "runpy.run_module('trainbench.core.processes.ab_worker', run_name='__main__')")
    with pytest.raises(SideError, match=r"trainbench differs between the sides: base .* has 0\.1\.0 .*head .* has 9\.9"):
        start(sys.executable, other)


def test_two_environments_that_differ_in_one_package_name_that_package(tmp_path):
    # The head's Python sees one more distribution (a folder on its PYTHONPATH, as a side's extra install would be)
    info = tmp_path / "site" / "fakepkg-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fakepkg\nVersion: 1.0\n")
    inherited = os.environ.get("PYTHONPATH")
    head_path = os.pathsep.join([str(tmp_path / "site"), *([inherited] if inherited else [])])
    base, head, hello = start(sys.executable, sys.executable, head_env={"PYTHONPATH": head_path})
    try:
        assert hello["head"]["packages"] == {**hello["base"]["packages"], "fakepkg": "1.0"}
        decided = verdict([], hello, gated=False)
        assert decided.environment == ("package fakepkg only here (1.0)",)  # that package, and nothing else
        assert decided.to_json()["environment_differs"] == ["package fakepkg only here (1.0)"]
        assert where_lines({"explanation": ["op self time: aten::mm +1 ms/step"]}, decided.environment)[-1] == (
            "environment: package fakepkg only here (1.0)")
    finally:
        base.close()
        head.close()


def _script(tmp_path, name: str, text: str) -> str:
    script = tmp_path / name
    script.write_text(text)
    script.chmod(0o755)
    return str(script)


def _speaking(tmp_path, protocol: int, version: str = trainbench.__version__) -> str:
    """A 'Python' whose worker answers hello as a trainbench speaking ``protocol`` would, and nothing else (no torch:
    it answers at once)."""
    worker = tmp_path / f"worker{protocol}.py"
    worker.write_text("import json, sys\n"
                      "for line in sys.stdin:\n"
                      "    if json.loads(line)['command'] != 'hello':\n"
                      "        break\n"
                      f"    print(json.dumps({{'protocol': {protocol}, 'trainbench': {version!r}, "
                      "'python': sys.executable, 'identity': {}, 'packages': {}}), flush=True)\n")
    return _script(tmp_path, f"python-protocol{protocol}", f"#!/bin/sh\nexec {sys.executable} {worker}\n")


def _without_trainbench(tmp_path) -> str:
    """A Python whose environment has no trainbench (nor torch): -I -S drops site-packages and PYTHONPATH."""
    return _script(tmp_path, "python-without-trainbench", f'#!/bin/sh\nexec {sys.executable} -I -S "$@"\n')


def test_a_side_whose_python_cannot_import_trainbench_is_said_in_one_line(tmp_path):
    bare = _without_trainbench(tmp_path)
    with pytest.raises(SideError) as raised:
        start(_speaking(tmp_path, PROTOCOL), bare)
    assert str(raised.value) == (f"head side ({bare}): cannot import trainbench: ModuleNotFoundError: No module named "
                                 "'trainbench'; expected a Python whose environment has trainbench installed")


def test_a_side_speaking_another_protocol_is_said_in_one_line(tmp_path):
    older = _speaking(tmp_path, PROTOCOL - 1, "0.0.9")
    with pytest.raises(SideError) as raised:
        start(_speaking(tmp_path, PROTOCOL), older)
    assert str(raised.value) == (f"head side ({older}): its trainbench (0.0.9) speaks A/B protocol {PROTOCOL - 1}, "
                                 f"this one ({trainbench.__version__}) speaks {PROTOCOL}; install the same trainbench "
                                 "in both environments")


def test_a_side_that_ends_or_prints_before_its_worker_answers_is_said_in_one_line(tmp_path):
    current = _speaking(tmp_path, PROTOCOL)
    broken = _wrapper(tmp_path, "import sys; print('a', file=sys.stderr); raise SystemExit('libcudart.so.13: cannot open')")
    with pytest.raises(SideError) as raised:
        start(current, broken)
    assert str(raised.value) == (f"head side ({broken}): the worker ended before answering hello: libcudart.so.13: "
                                 "cannot open")
    # a wrapper that prints on stdout before it execs the worker: its line is no answer (it was a JSONDecodeError)
    chatty = _script(tmp_path, "chatty-python", f"#!/bin/sh\necho activating the venv\nexec {current}\n")
    with pytest.raises(SideError) as raised:
        start(current, chatty)
    assert str(raised.value) == (f"head side ({chatty}): answered 'hello' with 'activating the venv', not a line of "
                                 "trainbench's A/B protocol (does a wrapper script print on stdout?); the side was "
                                 "stopped")


CASES = """
import pytest
from trainbench.plugin import recipe_params

@pytest.mark.parametrize("recipe", recipe_params("baseline", "ddp_gloo"))
def test_mlp(train_bench, recipe):
    train_bench(recipe, "mlp")
"""


@pytest.fixture
def ab_options(quick_options):
    """The quick options with two warm-up steps and eight ABBA pairs of rounds."""
    return [*quick_options, "--trainbench-min-warmup=2", "--trainbench-ab-pairs=8"]


@pytest.mark.usefixtures("one_thread")
def test_the_ab_option_compares_each_case_in_both_environments_and_gates_the_verdict(pytester, ab_options):
    import json

    pytester.makepyfile(test_cases=CASES)
    same = pytester.runpytest(f"--trainbench-ab={sys.executable}", "--trainbench-compare-fail=step_time_ms:100%",
                              "--trainbench-compare-json=ab.json", "-rs", *ab_options)
    could_not_judge = json.loads((pytester.path / "ab.json").read_text())["could_not_judge"]
    same.assert_outcomes(passed=1, skipped=1, failed=int(could_not_judge))  # a failed verdict counts in pytest's line
    same.stdout.fnmatch_lines(["*trainbench A/B: base vs head*", f"base: {sys.executable}: torch *",
                               f"head: {sys.executable}: torch *", "*mlp-baseline*step_time_ms*",
                               "*ddp_gloo: not in an A/B run: its ranks run in other processes*"])
    same.stdout.no_fnmatch_line("*samples_per_s*")  # the gate names step time only
    verdict = json.loads((pytester.path / "ab.json").read_text())
    # Never a regression; on a loaded machine possibly "could not judge" after more pairs than the 8 asked for.
    assert verdict["gated"] and verdict["failed"] == verdict["could_not_judge"]
    assert len(verdict["pairs"]["mlp-baseline"]) >= 8
    # Every head step 10x as long, against a 20% threshold: a margin no load on this machine closes. The budgets
    # file's session-to-session timing threshold (950%, which would pass it) is not an A/B run's.
    pytester.makefile(".toml", budgets='[cpu."*"]\ncompare_fail = "step_time_ms:950%,samples_per_s:950%"\n')
    slow = pytester.runpytest(f"--trainbench-ab={sys.executable}", "--trainbench-compare-fail=step_time_ms:20%",
                              "--trainbench-budgets=budgets.toml", "--trainbench-inject-slowdown=900%",
                              "-k", "baseline", *ab_options)
    assert slow.ret == pytest.ExitCode.TESTS_FAILED
    slow.stdout.fnmatch_lines(["*REGRESSION mlp-baseline step_time_ms: * regressed (threshold 20.0%)*"])


def test_an_ab_run_takes_timed_thresholds_from_its_command_line_never_from_the_budgets_file():
    budgets_file = {"step_time_ms": 0.5, "samples_per_s": 0.5, "first_step_s": 0.5, "peak_memory_mib": 0.02}
    assert ab_thresholds(None, budgets_file) == {"peak_memory_mib": 0.02}  # timed: DEFAULT_PAIRED
    assert ab_thresholds({"step_time_ms": 0.05, "peak_memory_mib": 0.0}, budgets_file) == \
        {"step_time_ms": 0.05, "peak_memory_mib": 0.0}


def test_ab_options_that_contradict_each_other_are_usage_errors(pytester, ab_options):
    pytester.makepyfile(test_cases=CASES)
    saved = pytester.runpytest(f"--trainbench-ab={sys.executable}", "--benchmark-save=x", *ab_options)
    assert saved.ret == pytest.ExitCode.USAGE_ERROR
    saved.stderr.fnmatch_lines(["*--benchmark-save with --trainbench-ab: an A/B run compares two environments*"])
    missing = pytester.runpytest("--trainbench-ab=/nonexistent/python", *ab_options)
    assert missing.ret == pytest.ExitCode.USAGE_ERROR
    missing.stderr.fnmatch_lines(["*--trainbench-ab=/nonexistent/python: no such executable*"])


def test_an_ab_head_without_trainbench_stops_the_session_before_its_first_case(pytester, ab_options, tmp_path):
    pytester.makepyfile(test_cases=CASES)
    bare = _without_trainbench(tmp_path)
    result = pytester.runpytest(f"--trainbench-ab={bare}", f"--trainbench-ab-base={_speaking(tmp_path, PROTOCOL)}",
                                *ab_options)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*trainbench: --trainbench-ab: the A/B sides could not start: head side ({bare}): "
                                 "cannot import trainbench: ModuleNotFoundError: No module named 'trainbench'; "
                                 "expected a Python whose environment has trainbench installed"])
    result.stdout.no_fnmatch_line("*test_mlp*")  # no case ran, none failed with it


class _Stuck(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        import time

        time.sleep(3600)


STUCK = dataclasses.replace(resolve_spec("mlp", PROFILES["cpu"]), name="stuck", dataset=_Stuck)


def test_a_side_that_makes_no_progress_fails_the_case_within_its_limit(sides):
    import time

    from trainbench.core.method.distributed import spec_reference
    from trainbench.jobs.ab import project_paths

    base, head, _ = sides  # a session's sides, as its next case finds them
    settings = {**SETTINGS, "no_progress_s": 2}
    case = ABCase("stuck-baseline", "baseline", get_recipe("baseline").config(PROFILES["cpu"]).record(),
                  spec_reference(STUCK), "cpu", settings, threads=1, paths=project_paths(Path(__file__).parents[1]))
    started = time.monotonic()
    with pytest.raises(SideError, match=r"(?s)base side .*build failed.*no progress for 2 s"):
        run_case(base, head, case, pairs=4, thresholds={})
    assert time.monotonic() - started < 120  # the limit, not the hour it sleeps


def test_an_ab_case_must_fit_the_device_twice_both_sides_holding_it(profile, quick, device_of_memory, tmp_path):
    from trainbench.core.method.runner import Runner
    from trainbench.jobs.ab import plan_case

    GiB = 2**30

    def planned_on(total_bytes):
        runner = Runner(device_of_memory(total_bytes), profile, quick)
        runner.planner.predictions = lambda profile_name, config, spec: {"breakdown_bytes": {"total": GiB // 2}}
        return runner, plan_case("set_to_none", "mlp", {}, runner, tmp_path)

    runner, crowded = planned_on(GiB)  # 0.5 GiB + 25% fits once; two processes holding it do not
    assert crowded.case is None
    assert crowded.skipped == ("set_to_none on both A/B sides (a process each): needs ~1.2 GiB (predicted tensor "
                               f"peaks 0.5 + 0.5 GiB + 25% for the allocator and workspaces); {runner.caps.name} has "
                               "1.0 GiB")
    assert runner.planner.plan("set_to_none", "mlp").skipped is None  # a plain run of the same case fits
    _, roomy = planned_on(2 * GiB)
    assert roomy.skipped is None and roomy.case.case == "mlp-set_to_none"


class _NoCpuClockSide(ScriptedSide):
    """A CUDA side: its rounds have no CPU time (no CPU clock there)."""

    def call(self, command: str, **arguments) -> dict:
        answer = super().call(command, **arguments)
        return {**answer, "cpu_time_s": None} if command == "round" else answer


def test_a_threshold_on_a_metric_neither_side_measures_is_said_once_not_failed():
    from trainbench.verdicts.present import verdict_markdown

    base, head = _NoCpuClockSide("base", [0.1] * 8), _NoCpuClockSide("head", [0.1] * 8)
    outcome = run_case(base, head, CASE, pairs=8, thresholds={"step_time_ms": 0.05, "cpu_time_ms": 0.05})
    assert set(_by_metric(outcome)) >= {"step_time_ms"} and "cpu_time_ms" not in _by_metric(outcome)
    assert outcome.not_measured == ("cpu_time_ms",)
    hello = {label: {"python": "scripted", "trainbench": "x", "identity": {}} for label in ("base", "head")}
    judged = verdict([outcome, outcome], hello, gated=True)
    assert not judged.failed and judged.not_measured == ("cpu_time_ms",)
    assert verdict_markdown(judged.to_json()).count("cpu_time_ms: measured by neither side here") == 1


def test_a_metric_one_side_measured_is_still_missing_and_fails():
    base, head = ScriptedSide("base", [0.1] * 8), _NoCpuClockSide("head", [0.1] * 8)

    outcome = run_case(base, head, CASE, pairs=8, thresholds={"step_time_ms": 0.05, "cpu_time_ms": 0.05})
    compared = _by_metric(outcome)
    hello = {label: {"python": "scripted", "trainbench": "x", "identity": {}} for label in ("base", "head")}
    assert compared["cpu_time_ms"].verdict == "missing" and verdict([outcome], hello, gated=True).failed


def test_a_head_that_never_answers_is_stopped_after_its_deadline_naming_its_python(tmp_path):
    import time

    from trainbench.jobs.ab import ABSession

    # a wrapper that never execs a worker (or an interpreter stuck at start): it reads its commands, never answers
    silent = tmp_path / "silent-python"
    silent.write_text(f"#!/bin/sh\nexec {sys.executable} -c 'import sys; sys.stdin.read()'\n")
    silent.chmod(0o755)
    ab = ABSession(str(silent), str(silent), pairs=3)
    case = dataclasses.replace(CASE, settings={**SETTINGS, "no_progress_s": 0.5})
    started = time.monotonic()
    with pytest.raises(SideError, match=r"^base side \(.*silent-python\): no answer to 'hello' for 1 s \(2x the "
                                        r"no-progress limit of 0\.5 s, --trainbench-timeout\); the side was stopped$"):
        ab.run(case, thresholds={})
    with pytest.raises(SideError, match="silent-python"):  # said again at once for the next case: never waited twice
        ab.run(case, thresholds={})
    assert time.monotonic() - started < 30  # the deadline, not for ever
    ab.close()


def test_a_side_making_progress_says_so_and_is_waited_for_past_the_deadline(monkeypatch):
    from trainbench.core.processes import ab_worker
    from trainbench.core.harness.watchdog import Watchdog

    written = []

    class Protocol:
        def write(self, line):
            written.append(line)

    clock = iter(range(1000))
    dog = Watchdog(0.04, clock=lambda: next(clock))  # every read of the clock is a beat later
    import threading

    beaten = threading.Event()
    with ab_worker._progress_lines(Protocol(), dog):
        for _ in range(50):
            dog.beat()
            if written:
                beaten.set()
                break
            beaten.wait(0.01)
    assert written and all(line == '{"progress": true}\n' for line in written)


def test_the_base_side_imports_the_project_from_its_own_checkout(tmp_path):
    from trainbench.jobs.ab import rerooted

    head, base = tmp_path / "head", tmp_path / "base"
    paths = [str(head), str(head / "src"), "/usr/lib/python3/site-packages"]
    assert rerooted(paths, str(head), base) == [str(base), str(base / "src"), "/usr/lib/python3/site-packages"]
    assert rerooted(paths, str(head), None) == paths  # the session's own checkout
    assert rerooted([str(tmp_path / "headless")], str(head), base) == [str(tmp_path / "headless")]  # a prefix only
