"""``python -m trainbench explain RUN_A RUN_B [CASE]``: two saved runs compared, and each change said where."""

import json

import pytest

from trainbench.__main__ import main
from trainbench.core.records.result import Result, case_record

IDENTITY = {"kind": "cpu", "name": "AMD EPYC", "cpu_capability": "AVX512", "torch": "2.14.1", "cpu_threads": 2}
OPS_MS = {"aten::convolution_backward": 3.0, "aten::mm": 2.0, "aten::add_": 1.0, "(outside ops)": 0.5}
JITTER = (1.0, 1.02, 0.99, 1.01, 0.98, 1.03, 0.97)  # the same small scatter in every series


def _result(case: str, ops_ms: dict, ops_per_step: int = 500) -> Result:
    """A measured case whose step time is the sum of its ops' self times, over 7 rounds and 5 profiled steps."""
    step_ms = sum(ops_ms.values())
    time = {"steps": 5, "wall_ms": [step_ms * j for j in JITTER[:5]], "calls": {op: 10 for op in ops_ms},
            "ops_ms": {op: [ms * j for j in JITTER[:5]] for op, ms in ops_ms.items()}}
    attribution = {"ops": {"aten.mm": 200.0, "aten.add_": ops_per_step - 200.0}, "time": time}
    return Result(case, "mlp", "baseline", "cpu", batch_size=16, config={}, device=IDENTITY, rounds=7,
                  steps_per_round=5, round_step_times_s=[step_ms / 1e3 * j for j in JITTER],
                  ops_per_step=ops_per_step, attribution=attribution)


def _write_run(path, results: list[Result], packages: dict | None = None):
    """A run as ``pytest --benchmark-save`` writes it: the device in machine_info, each case's record in extra_info."""
    run = {"machine_info": {"trainbench": IDENTITY}, "benchmarks": [
        {"name": f"test_case[{r.case}]", "fullname": f"tests/test_case.py::test_case[{r.case}]", "stats": {},
         "extra_info": case_record(r)} for r in results]}
    if packages is not None:
        run["trainbench_environment"] = {"packages": packages}
    path.write_text(json.dumps(run))
    return str(path)


@pytest.fixture
def runs(tmp_path):
    """Run A, and run B where one op (convolution backward) takes 6 ms more per step and a package moved; a second
    case whose step time stayed put while one op got 1.6 ms slower and another 1.5 ms faster."""
    slower = {**OPS_MS, "aten::convolution_backward": 9.0}
    traded = {**OPS_MS, "aten::mm": 3.6, "aten::convolution_backward": 1.5, "(outside ops)": 0.4}
    a = _write_run(tmp_path / "0001_a.json", [_result("mlp-baseline", OPS_MS), _result("mlp-steady", OPS_MS)],
                   {"numpy": "2.0.1", "torch": "2.14.1"})
    b = _write_run(tmp_path / "0002_b.json", [_result("mlp-baseline", slower), _result("mlp-steady", traded)],
                   {"numpy": "2.1.0", "torch": "2.14.1"})
    return a, b


def test_the_op_whose_self_time_grew_is_named_first_under_the_regression(runs, capsys, tmp_path):
    assert main(["explain", *runs, "--json", str(tmp_path / "explained.json")]) == 0
    out = capsys.readouterr().out.splitlines()
    regression = next(i for i, line in enumerate(out) if line.startswith("REGRESSION mlp-baseline step_time_ms"))
    assert out[regression + 1].startswith("    op self time: aten::convolution_backward +6 ms/step")
    assert "of the change" in out[regression + 1]
    assert out[regression + 2] == "    environment: package numpy 2.0.1 there, 2.1.0 here"
    assert "environment differs from the baseline: package numpy 2.0.1 there, 2.1.0 here" in " ".join(out)
    assert not any(line.startswith(("REGRESSION mlp-steady", "IMPROVED mlp-steady")) for line in out)
    saved = json.loads((tmp_path / "explained.json").read_text())
    [step] = [c for c in saved["comparisons"] if c["case"] == "mlp-baseline" and c["metric"] == "step_time_ms"]
    assert step["verdict"] == "regressed" and step["explanation"][0].startswith("op self time: aten::convolution_backward")
    assert saved["environment_differs"] == ["package numpy 2.0.1 there, 2.1.0 here"]


def test_the_markdown_names_the_op_under_where(runs, capsys):
    assert main(["explain", *runs, "--markdown"]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"### trainbench explain: `{runs[0]}")
    where = text.split("- **REGRESSION** mlp-baseline step_time_ms", 1)[1]
    assert where.split("\n")[1].startswith("  - op self time: aten::convolution_backward +6 ms/step")


def test_a_case_asked_about_shows_what_moved_though_its_step_time_did_not(runs, capsys):
    assert main(["explain", *runs, "mlp-steady"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "mlp-baseline" not in "\n".join(out)  # only the case asked about
    assert "nothing changed beyond the thresholds" in out
    moved = out[out.index(next(line for line in out if line.startswith("moved in mlp-steady"))) + 1:]
    assert moved[0].startswith("    op self time: aten::mm +1.6 ms/step (95% CI")
    assert moved[1].startswith("    op self time: aten::convolution_backward -1.5 ms/step (95% CI")
    assert moved[2].startswith("    op self time: (outside ops) -0.1 ms/step (95% CI")
    assert not moved[0].endswith("(within noise)") and len(moved) == 3


def test_a_case_can_be_named_by_its_fullname(runs, capsys):
    assert main(["explain", *runs, "tests/test_case.py::test_case[mlp-steady]"]) == 0
    assert "moved in tests/test_case.py::test_case[mlp-steady]" in capsys.readouterr().out


@pytest.mark.parametrize("args, named", [
    (["{a}", "{b}", "mlp-nope"], "mlp-nope: no such case in {a} or {b}; the cases both runs have: mlp-baseline, "
                                 "mlp-steady"),
    (["{a}", "{missing}"], "{missing}: no such file; expected a pytest-benchmark JSON run"),
    (["{a}", "{notarun}"], "{notarun}: no 'benchmarks' list"),
    (["{a}", "{plain}"], "{plain}: no trainbench case among its 1 benchmark(s)"),
    (["{a}", "{b}", "--threshold", "step_time_ms:fast"], "--threshold: 'step_time_ms:fast': threshold 'fast' is not"),
])
def test_bad_input_is_one_line_naming_the_file_or_entry(runs, tmp_path, capsys, args, named):
    paths = {"a": runs[0], "b": runs[1], "missing": str(tmp_path / "0003_gone.json"),
             "notarun": str(tmp_path / "verdict.json"), "plain": str(tmp_path / "plain.json")}
    (tmp_path / "verdict.json").write_text(json.dumps({"comparisons": []}))
    (tmp_path / "plain.json").write_text(json.dumps({"benchmarks": [{"name": "test_sum", "stats": {}, "extra_info": {}}]}))
    assert main(["explain", *(arg.format(**paths) for arg in args)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith("trainbench explain: " + named.format(**paths)), captured.err


def test_a_case_one_run_lacks_names_that_run(runs, tmp_path, capsys):
    other = _write_run(tmp_path / "0003_c.json", [_result("mlp-other", OPS_MS)])
    assert main(["explain", runs[0], other, "mlp-steady"]) == 2
    assert capsys.readouterr().err == f"trainbench explain: mlp-steady: not in {other}; the runs have no case in common\n"


def test_a_broken_record_is_named_by_file_and_entry(runs, capsys):
    data = json.loads(open(runs[1]).read())
    data["benchmarks"][1]["extra_info"]["step_time_ms"] = "fast"
    open(runs[1], "w").write(json.dumps(data))
    assert main(["explain", *runs]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"trainbench explain: {runs[1]}: tests/test_case.py::test_case[mlp-steady]: step_time_ms")


def test_moved_rows_mark_a_change_within_noise_and_compare_folded_rows_inside_other():
    from trainbench.verdicts.explain import moved_rows

    def tables(ops_ms):
        return {"time": {"steps": 5, "ops_ms": ops_ms}}

    base = tables({"aten::mm": [5.0, 5.1, 4.9, 5.0, 5.05], "aten::add_": [1.0, 3.0, 1.2, 2.8, 2.0],
                   "aten::relu": [0.5] * 5})
    # aten::relu fell into "(other)" in the newer run's saved top rows: compared there, never as -0.5 ms
    cur = tables({"aten::mm": [8.0, 8.1, 7.9, 8.0, 8.05], "aten::add_": [2.9, 1.1, 2.7, 1.3, 2.2],
                  "(other)": [0.5] * 5})
    lines = moved_rows(base, cur)
    assert lines[0].startswith("op self time: aten::mm +3 ms/step (95% CI +2.9") and "noise" not in lines[0]
    assert lines[1].startswith("op self time: aten::add_ +0.2 ms/step") and lines[1].endswith("(within noise)")
    assert len(lines) == 2  # relu and "(other)" are the same 0.5 ms on both sides
    assert moved_rows(None, cur) == ["no attribution recorded by the baseline (attribution off, or a run saved "
                                     "before it was recorded)"]
