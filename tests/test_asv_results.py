"""Comparing the asv environments (torch releases) of one commit: exact differences, speed spread, bad input."""

import json
import math

import pytest

from trainbench.__main__ import main
from trainbench.verdicts.asv_results import AsvResultsError, diff_environments, environments_of_commit, format_diff

COLUMNS = ["result", "params", "version", "started_at", "duration"]
CASES = ["'resnet18-baseline'", "'resnet18-set_to_none'", "'resnet18-pinned_memory'"]


def _write(folder, commit, torch_version, ops, step_times, date):
    """An asv result file as asv 0.6 writes it (NaN for a skipped case)."""
    env = f"existing-py_work_.venv-torch{torch_version}_bin_python"
    results = {
        "asv_bench.Work.track_ops_per_step": [ops, [CASES], "v", 0, 1.0],
        "asv_bench.Speed.track_step_time": [step_times, [CASES], "v", 0, 1.0],
        "asv_bench.Memory.track_peak_memory": [[100.0, 90.0, math.nan], [CASES], "v", 0, 1.0],
    }
    data = {"commit_hash": commit, "env_name": env, "date": date, "params": {}, "python": "3.11",
            "requirements": {}, "env_vars": {}, "result_columns": COLUMNS, "results": results, "durations": {},
            "version": 2}
    path = folder / f"{commit[:8]}-{env}.json"
    path.write_text(json.dumps(data))  # json writes NaN as asv does
    return path


@pytest.fixture
def machine(tmp_path):
    folder = tmp_path / "cpu-test"
    folder.mkdir()
    (folder / "machine.json").write_text("{}")
    _write(folder, "a" * 40, "2.14.1", [543.0, 481.0, math.nan], [0.090, 0.080, math.nan], date=2)
    _write(folder, "a" * 40, "2.9.1", [544.0, 544.0, math.nan], [0.100, 0.080, math.nan], date=1)
    _write(folder, "b" * 40, "2.14.1", [543.0, 481.0, math.nan], [0.090, 0.080, math.nan], date=3)  # one env only
    return folder


def test_releases_are_ordered_by_version_and_exact_differences_listed(machine):
    before, after = environments_of_commit(machine)  # commit b has one environment: a is the newest pair
    assert (before.torch, after.torch) == ("2.9.1", "2.14.1")  # by version, not by name or file order
    diff = diff_environments(before, after)
    assert diff.exact_changed == [("Work.track_ops_per_step", "resnet18-baseline", 544.0, 543.0),
                                  ("Work.track_ops_per_step", "resnet18-set_to_none", 544.0, 481.0)]
    assert diff.exact_equal == 2  # the peaks; the skipped (NaN) case is left out, not "changed"
    assert diff.step_time_ratios == pytest.approx({"resnet18-baseline": 0.9, "resnet18-set_to_none": 1.0})
    text = format_diff(diff)
    assert "torch 2.9.1" in text and "2 values equal, 2 differ" in text
    assert "544 -> 481 (-11.6%)" in text
    assert "median 0.950, 0.90 (resnet18-baseline) to 1.00 (resnet18-set_to_none) over 2 cases" in text


def test_the_command_prints_the_comparison_and_names_bad_input(machine, capsys):
    assert main(["releases", "--results", str(machine.parent), "--machine", machine.name, "--commit", "aaaa"]) == 0
    assert "-> torch 2.14.1" in capsys.readouterr().out
    assert main(["releases", "--results", str(machine.parent), "--machine", machine.name, "--commit", "bbbb"]) == 2
    assert "has one environment" in capsys.readouterr().err
    assert main(["releases", "--results", str(machine.parent), "--machine", machine.name, "--commit", "cccc"]) == 2
    assert "matches 0 recorded commits (recorded: aaaaaaaa, bbbbbbbb)" in capsys.readouterr().err


def test_a_file_that_is_not_an_asv_result_is_named(machine):
    broken = machine / "cccccccc-broken.json"
    broken.write_text('{"results": {}}')
    with pytest.raises(AsvResultsError, match="cccccccc-broken.json: not an asv result file"):
        environments_of_commit(machine)
    broken.write_text("{not json")
    with pytest.raises(AsvResultsError, match="cccccccc-broken.json: not valid JSON"):
        environments_of_commit(machine)


def test_the_committed_results_hold_two_releases_of_one_commit():
    # the dashboard's version comparison rests on these files
    from pathlib import Path

    folder = Path(__file__).parents[1] / "results" / "asv" / "cpu-amd-epyc"
    before, after = environments_of_commit(folder)
    assert before.commit == after.commit
    assert {before.torch, after.torch} == {"2.9.1", "2.14.1"}
    assert len(before.values) > 500 and len(after.values) > 500


def test_existing_environments_are_keyed_by_their_torch_release_for_the_dashboards_legend(machine, capsys):
    """asv keys an `-E existing:PYTHON` environment's results by the interpreter's path: the dashboard's legend read
    ".../.venv-torch2.9.1/bin/python" where a reader wants "torch 2.9.1"."""
    for path in machine.glob("*-existing-*.json"):  # as asv writes them for such an environment
        data = json.loads(path.read_text())
        path.write_text(json.dumps({**data, "params": {"machine": "cpu-test", "python": "/work/.venv/bin/python"}}))
    assert main(["releases", "--results", str(machine.parent), "--machine", "cpu-test", "--label"]) == 0
    assert capsys.readouterr().out.count("python /work/.venv/bin/python -> torch ") == 3
    params = {json.loads(p.read_text())["params"]["torch"] for p in machine.glob("*-existing-*.json")}
    assert params == {"2.14.1", "2.9.1"}
    assert all(json.loads(p.read_text())["params"]["machine"] == "cpu-test" for p in machine.glob("*-existing-*.json"))
    assert main(["releases", "--results", str(machine.parent), "--machine", "cpu-test", "--label"]) == 0
    assert "keyed by its torch release already" in capsys.readouterr().out
    assert main(["releases", "--results", str(machine.parent), "--machine", "cpu-test"]) == 0  # still compared


def test_an_existing_environment_that_names_no_torch_release_is_refused_before_any_file_changes(machine, capsys):
    nameless = _write(machine, "c" * 40, "X", [1.0, 1.0, 1.0], [0.1, 0.1, 0.1], date=4)
    renamed = nameless.with_name(nameless.name.replace("torchX", "custom"))
    data = json.loads(nameless.read_text())
    nameless.unlink()
    renamed.write_text(json.dumps({**data, "env_name": "existing-py_work_.venv-custom_bin_python"}))
    before = {p.name: p.read_text() for p in machine.glob("*.json")}
    assert main(["releases", "--results", str(machine.parent), "--machine", "cpu-test", "--label"]) == 2
    assert "names no torch release" in capsys.readouterr().err
    assert {p.name: p.read_text() for p in machine.glob("*.json")} == before
