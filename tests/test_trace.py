"""Profiles on demand: a case's PyTorch Profiler trace, read back with TensorBoard's profiler plugin."""

import json
from pathlib import Path

import pytest

from trainbench.core.method.runner import Runner
from trainbench.core.method.trace import ACTIVE_STEPS, TraceRequest, case_folder_name


def _load_with_tensorboard_plugin(path: Path, tmp_path: Path):
    """What TensorBoard's PyTorch Profiler plugin does with each file of a run folder."""
    from torch_tb_profiler import consts
    from torch_tb_profiler.profiler.data import RunProfileData
    from torch_tb_profiler.profiler.run_generator import RunGenerator

    match = consts.WORKER_PATTERN.match(path.name)
    assert match, f"{path.name}: TensorBoard's plugin would not list this file as a worker's trace"
    data = RunProfileData.parse(match.group(1), None, str(path), str(tmp_path))
    return data, RunGenerator(match.group(1), None, data).generate_run_profile()


def test_a_case_trace_records_the_steps_after_the_measurement_and_loads_in_tensorboard(cpu, profile, quick, tmp_path):
    runner = Runner(cpu, profile, quick, trace=TraceRequest(tmp_path / "traces"))
    outcome = runner.run("baseline", "mlp")

    assert outcome.failures == () and len(outcome.result.round_step_times_s) == quick.rounds  # timed as ever
    files = [Path(f) for f in outcome.trace["files"]]
    assert {f.parent for f in files} == {tmp_path / "traces" / "mlp-baseline"}
    trace_file = next(f for f in files if f.name.endswith(".pt.trace.json"))
    assert "traceEvents" in json.loads(trace_file.read_text())  # a Chrome trace: Perfetto opens it as it is
    data, run_profile = _load_with_tensorboard_plugin(trace_file, tmp_path)
    assert len(data.steps_names) == ACTIVE_STEPS  # the profiler's warm-up steps are not in the trace
    assert {"overall", "operator", "trace", "memory"} <= {view.name for view in run_profile.views}
    ops = next(f for f in files if f.name == "ops.txt").read_text()
    assert "aten::addmm" in ops and f"{ACTIVE_STEPS} training steps" in ops
    assert outcome.record()["trace"] == outcome.trace


def test_only_the_cases_asked_for_are_traced_and_one_that_cannot_be_says_why(cpu, profile, quick, tmp_path):
    runner = Runner(cpu, profile, quick, trace=TraceRequest(tmp_path, wants=lambda case: "amp" in case))
    assert runner.run("baseline", "mlp").trace is None
    assert not any(tmp_path.iterdir())

    # which cases cannot be traced is eligibility.why_not's (tests/test_eligibility.py); the record says why
    runner = Runner(cpu, profile, quick, trace=TraceRequest(tmp_path))
    plan = runner.planner.plan("profiler_left_on", "mlp")
    outcome = runner.executor.trace(plan, plan.outcome())
    assert outcome.trace == {"skipped": "the case runs a profiler of its own (debug='profiler')"}
    assert not any(tmp_path.iterdir())
    assert case_folder_name("test_mlp[resnet18-amp_bf16]/x y").startswith("test_mlp_resnet18-amp_bf16_x_y-")
    assert case_folder_name("mlp-baseline") == "mlp-baseline"  # a safe id keeps its name


def test_two_case_ids_that_sanitize_to_the_same_text_get_their_own_folders():
    # CJK names were all "_": the second case's tables overwrote the first's while its summary line pointed at them
    first, second = case_folder_name("模型-baseline"), case_folder_name("网络-baseline")
    assert first != second and first.startswith("-baseline-") and second.startswith("-baseline-")
    assert case_folder_name("a b") != case_folder_name("a_b") == "a_b"
    assert case_folder_name("模型-baseline") == first  # the same id, the same folder


def test_a_trace_that_cannot_be_written_keeps_the_measurement_and_says_why(cpu, profile, quick, tmp_path):
    (tmp_path / "mlp-baseline").write_text("a file where the case's trace folder goes")
    runner = Runner(cpu, profile, quick, trace=TraceRequest(tmp_path))
    outcome = runner.run("baseline", "mlp")
    assert outcome.error is None and outcome.failures == () and len(outcome.result.round_step_times_s) == quick.rounds
    assert outcome.trace["error"].startswith("FileExistsError: ") and "mlp-baseline" in outcome.trace["error"]
    assert outcome.record()["trace"] == outcome.trace


def test_a_trace_file_the_profiler_failed_to_write_is_an_error_not_a_silent_gap(cpu, profile, quick, tmp_path,
                                                                               monkeypatch):
    # kineto logs a failed write of the trace file and raises nothing: a handler that writes nothing stands in
    monkeypatch.setattr("torch.profiler.tensorboard_trace_handler", lambda folder, worker_name: lambda prof: None)
    outcome = Runner(cpu, profile, quick, trace=TraceRequest(tmp_path)).run("baseline", "mlp")
    assert outcome.failures == () and outcome.result is not None
    assert outcome.trace == {"error": f"OSError: the profiler wrote no trace file into {tmp_path / 'mlp-baseline'}"}


def test_a_long_case_id_gets_a_short_name_of_its_own(cpu, profile, quick, tmp_path):
    long_a, long_b = "mlp-baseline[" + "a" * 300 + "-1]", "mlp-baseline[" + "a" * 300 + "-2]"
    assert len(case_folder_name(long_a)) <= 120 and case_folder_name(long_a) != case_folder_name(long_b)
    assert case_folder_name(long_a).startswith("mlp-baseline_aaa")
    outcome = Runner(cpu, profile, quick, trace=TraceRequest(tmp_path)).run("baseline", "mlp", case=long_a)
    assert outcome.failures == () and "files" in outcome.trace  # not ENAMETOOLONG
    assert {Path(f).parent.name for f in outcome.trace["files"]} == {case_folder_name(long_a)}


CASES = """
import pytest
from trainbench.plugin import recipe_params

@pytest.mark.parametrize("recipe", recipe_params("baseline", "set_to_none"))
def test_mlp(train_bench, recipe):
    train_bench(recipe, "mlp")
"""


def test_the_option_traces_the_cases_its_expression_selects(pytester, quick_options):
    pytester.makepyfile(test_cases=CASES)
    result = pytester.runpytest("--trainbench-profile-trace=traces",
                                "--trainbench-profile-trace-cases=mlp and not set_to_none", *quick_options)
    result.assert_outcomes(passed=2, warnings=1)  # one NoBudgetWarning for the file
    result.stdout.fnmatch_lines(["*profile trace mlp-baseline: *traces/mlp-baseline/mlp-baseline.*.pt.trace.json*"])
    assert [p.name for p in (pytester.path / "traces").iterdir()] == ["mlp-baseline"]


def test_a_trace_filter_that_does_not_parse_or_has_no_folder_is_a_usage_error(pytester, quick_options):
    pytester.makepyfile(test_cases=CASES)
    bad = pytester.runpytest("--trainbench-profile-trace=traces", "--trainbench-profile-trace-cases=mlp and (", *quick_options)
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*--trainbench-profile-trace-cases='mlp and (': *"])
    alone = pytester.runpytest("--trainbench-profile-trace-cases=mlp", *quick_options)
    assert alone.ret == pytest.ExitCode.USAGE_ERROR
    alone.stderr.fnmatch_lines(["*--trainbench-profile-trace-cases needs --trainbench-profile-trace=DIR*"])


BLOCKED = """
from pathlib import Path

def test_mlp(train_bench):
    Path("traces/mlp-baseline").write_text("the folder became unusable after start-up")
    train_bench("baseline", "mlp")

def test_next(train_bench):
    train_bench("baseline", "mlp", batch_size=8)
"""


def test_a_trace_lost_after_start_up_fails_no_case_and_the_summary_says_why(pytester, quick_options):
    pytester.makepyfile(test_cases=BLOCKED)
    result = pytester.runpytest("--trainbench-profile-trace=traces", "--benchmark-json=out.json", *quick_options)
    result.assert_outcomes(passed=2, warnings=1)  # one NoBudgetWarning for the file
    result.stdout.fnmatch_lines(["*profile trace mlp-baseline: not written: FileExistsError: *traces/mlp-baseline*"])
    data = json.loads((pytester.path / "out.json").read_text())
    assert [b["name"] for b in data["benchmarks"]] == ["test_mlp", "test_next"]  # both measurements kept
    assert data["benchmarks"][0]["extra_info"]["trace"]["error"].startswith("FileExistsError")
