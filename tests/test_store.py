"""Saved runs: reading one, matching names as pytest-benchmark does, the newest run, the baseline's choice."""

import json
import os

import pytest
from pytest_benchmark.utils import get_machine_id

from trainbench.store import (
    INCOMPLETE_KEY,
    NoBaselineError,
    RunFileError,
    choose_baseline,
    latest_run,
    load_run,
    matching_runs,
    why_no_baseline,
)

CPU_A = {"kind": "cpu", "name": "CPU A", "cpu_capability": "AVX512"}
CPU_B = {"kind": "cpu", "name": "CPU B", "cpu_capability": "AVX2"}
HERE = ("cpu", "CPU A", "AVX512")


def _run(device: dict | None = None, incomplete: bool = False) -> str:
    run = {"machine_info": {"trainbench": device} if device else {}, "benchmarks": []}
    if incomplete:
        run[INCOMPLETE_KEY] = True
    return json.dumps(run)


@pytest.fixture
def storage(tmp_path):
    folder = tmp_path / "benchmarks" / get_machine_id()
    folder.mkdir(parents=True)

    def save(name: str, text: str):
        (folder / name).write_text(text)
        return folder / name

    save.root, save.folder = str(tmp_path / "benchmarks"), folder
    return save


@pytest.mark.parametrize(("content", "problem"), [
    (None, "no such file"), ("", "empty file"), ("{not json", "invalid JSON"),
    ('{"machine_info": {}}', "no 'benchmarks' list"), ("[1, 2]", "no 'benchmarks' list")])
def test_a_bad_run_file_is_one_line_naming_the_file(tmp_path, content, problem):
    path = tmp_path / "run.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(RunFileError) as raised:
        load_run(path)
    assert str(raised.value).startswith(f"{path}: {problem}") and "\n" not in str(raised.value)


def test_names_match_as_pytest_benchmark_reads_them(storage):
    for name in ("0001_baseline.json", "0002_pr.json", "0003_baseline.json", "notes.json"):
        storage(name, _run())
    names = lambda pattern: [p.name for p in matching_runs(storage.folder, pattern)]
    assert names(True) == ["0001_baseline.json", "0002_pr.json", "0003_baseline.json"]
    assert names("*_baseline") == ["0001_baseline.json", "0003_baseline.json"]
    assert names("0002") == ["0002_pr.json"]
    assert names("0004") == []
    assert matching_runs(storage.folder / "absent", True) == []


def test_the_newest_run_is_the_highest_number_not_the_newest_file(storage):
    newest = storage("0002_new.json", _run())
    older = storage("0001_old.json", _run())
    os.utime(newest, (1, 1))  # a checkout or copy sets modification times at random
    assert latest_run(storage.root) == newest
    assert older != newest


def test_no_saved_run_is_an_error_naming_the_folder(tmp_path):
    with pytest.raises(RunFileError, match="no \\*.json run found"):
        latest_run(tmp_path)


def test_the_baseline_is_the_newest_complete_run_of_this_device(storage):
    mine = storage("0001_baseline.json", _run(CPU_A))
    storage("0002_baseline.json", _run(CPU_B))
    storage("0003_baseline.json", _run(CPU_A, incomplete=True))
    assert choose_baseline(storage.root, "*_baseline", lambda: HERE) == mine
    assert choose_baseline(storage.root, True, lambda: HERE) == mine


def test_pytest_benchmark_keeps_its_choice_when_it_is_right(storage):
    storage("0001_baseline.json", _run(CPU_B))
    storage("0002_baseline.json", _run(CPU_A))
    asked = []
    assert choose_baseline(storage.root, True, lambda: asked.append(1) or HERE) is None
    assert choose_baseline(storage.root, False, lambda: asked.append(1) or HERE) is None
    storage("0003_plain.json", _run(None))  # a plain pytest-benchmark run: its usual behaviour
    assert choose_baseline(storage.root, True, lambda: HERE) is None


def test_a_named_baseline_of_other_devices_only_says_what_is_there(storage):
    storage("0001_baseline.json", _run(CPU_B))
    with pytest.raises(NoBaselineError) as raised:
        choose_baseline(storage.root, "*_baseline", lambda: HERE)
    message = str(raised.value)
    assert "no complete run of this CPU A (cpu, AVX512)" in message and "runs of: CPU B (cpu, AVX2)" in message


@pytest.mark.parametrize("compare", [True, "*_baseline", "0001"])
def test_why_no_baseline_gives_the_same_reason_whatever_the_name(storage, compare):
    storage("0001_x_baseline.json", '{"benchmarks": [')  # truncated by a crash mid-save
    assert "0001_x_baseline.json: invalid JSON" in why_no_baseline(storage.root, compare)


def test_why_no_baseline_with_nothing_saved(storage):
    assert why_no_baseline(storage.root, True).endswith("no saved runs; save one first with --benchmark-save=NAME "
                                                        "on the baseline code")
    assert "no saved run matching '*_baseline'" in why_no_baseline(storage.root, "*_baseline")
