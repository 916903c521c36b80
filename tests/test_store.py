"""Saved runs: reading one, matching names as pytest-benchmark does, the newest run, the baseline's choice."""

import json
import os

import pytest
from pytest_benchmark.utils import get_machine_id

from trainbench.verdicts.store import (
    INCOMPLETE_KEY,
    NoBaselineError,
    RunFileError,
    UnusableBaselineError,
    choose_baseline,
    latest_run,
    load_run,
    matching_runs,
    why_no_baseline,
)

CPU_A = {"kind": "cpu", "name": "CPU A", "cpu_capability": "AVX512"}
CPU_B = {"kind": "cpu", "name": "CPU B", "cpu_capability": "AVX2"}
HERE = ("cpu", "CPU A", "AVX512")


def _run(device: dict | None = None, incomplete: bool = False, records: tuple = (), planted: dict | None = None) -> str:
    benchmarks = [{"name": f"test_{i}", "fullname": f"test_x.py::test_{i}", "stats": {}, "extra_info": info}
                  for i, info in enumerate(records)]
    run = {"machine_info": {"trainbench": device} if device else {}, "benchmarks": benchmarks}
    if incomplete:
        run[INCOMPLETE_KEY] = True
    if planted:
        run["trainbench_planted_fault"] = planted
    return json.dumps(run)


def _record(**changes) -> dict:
    """A trainbench case record as the gate reads it, with ``changes``."""
    return {"case": "mlp-baseline", "samples_per_step": 16, "samples_per_s": 100.0, "ops_per_step": 42,
            "round_step_times_s": [0.16, 0.15, 0.17], **changes}


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


def test_another_machines_higher_numbered_run_is_never_taken_for_this_ones(storage, tmp_path):
    # a committed CPU run numbered 0008 beside tonight's first run on a GPU box (another machine folder)
    other = tmp_path / "benchmarks" / "Linux-CPython-3.11-64bit-other" / "0008_baseline.json"
    other.parent.mkdir()
    other.write_text(_run(CPU_B))
    with pytest.raises(RunFileError, match=f"no run saved on this machine .*{other}: pass it as RUN_JSON"):
        latest_run(storage.root)
    mine = storage("0001_night.json", _run(CPU_A))
    assert latest_run(storage.root) == mine


def test_a_run_with_a_planted_fault_is_passed_over_and_never_the_only_choice(storage):
    mine = storage("0001_baseline.json", _run(CPU_A))
    storage("0002_baseline.json", _run(CPU_A, planted={"slowdown": 0.2}))
    chosen = choose_baseline(storage.root, True, lambda: HERE)
    assert chosen.path == mine and "passed over newer runs: with a planted fault 0002_baseline.json" in chosen.why
    mine.unlink()
    with pytest.raises(UnusableBaselineError, match="0002_baseline.json: a run measured with a fault planted on "
                                                    "purpose .*slowdown 0.2.*so is every complete run of this"):
        choose_baseline(storage.root, True, lambda: HERE)
    with pytest.raises(UnusableBaselineError, match="planted on purpose"):
        choose_baseline(storage.root, str(storage.folder / "0002_baseline.json"), lambda: HERE)


def test_no_saved_run_is_an_error_naming_the_folder(tmp_path):
    with pytest.raises(RunFileError, match="no \\*.json run found"):
        latest_run(tmp_path)


def test_the_baseline_is_the_newest_complete_run_of_this_device_and_says_why(storage):
    mine = storage("0001_baseline.json", _run(CPU_A))
    storage("0002_baseline.json", _run(CPU_B))
    storage("0003_other.json", _run(CPU_A))
    storage("0004_baseline.json", _run(CPU_A, incomplete=True))
    chosen = choose_baseline(storage.root, "*_baseline", lambda: HERE)
    assert chosen.path == mine
    assert chosen.why == (f"the newest complete run of this CPU A (cpu, AVX512) matching '*_baseline' in "
                          f"{storage.folder} (passed over newer runs: interrupted 0004_baseline.json; "
                          "of another device 0002_baseline.json)")
    storage("0004_baseline.json", _run(CPU_A, incomplete=True))
    assert choose_baseline(storage.root, True, lambda: HERE).path == storage.folder / "0003_other.json"


def test_pytest_benchmark_keeps_its_choice_for_plain_runs_and_no_comparison(storage):
    storage("0001_baseline.json", _run(CPU_B))
    newest = storage("0002_baseline.json", _run(CPU_A))
    asked = []
    assert choose_baseline(storage.root, True, lambda: asked.append(1) or HERE).path == newest
    assert choose_baseline(storage.root, False, lambda: asked.append(1) or HERE) is None
    assert asked == [1]  # the device is asked for only when a run of some device must be chosen
    storage("0003_plain.json", _run(None))  # a plain pytest-benchmark run: its usual behaviour
    assert choose_baseline(storage.root, True, lambda: HERE) is None
    assert choose_baseline(storage.root, "0002", lambda: HERE).why.startswith("the newest complete run of this CPU A")


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


# -- a run that cannot be the baseline is never passed over for an older one --------------------------

UNREADABLE = [("", "empty file"), ('{"benchmarks": [', "invalid JSON"), ("[1, 2]", "no 'benchmarks' list"),
              ('{"benchmarks": [{"name": "t"}]}', "t: no 'stats'")]


@pytest.mark.parametrize(("content", "problem"), UNREADABLE)
@pytest.mark.parametrize("compare", [True, "*_baseline", "0002"])
def test_an_unreadable_newest_run_is_an_error_naming_it_not_a_fallback_to_an_older_one(storage, content, problem,
                                                                                        compare):
    storage("0001_baseline.json", _run(CPU_A))  # complete and readable, but older
    storage("0002_baseline.json", content)  # a save killed mid-write
    with pytest.raises(UnusableBaselineError) as raised:
        choose_baseline(storage.root, compare, lambda: HERE)
    message = str(raised.value)
    assert message.startswith(f"{storage.folder / '0002_baseline.json'}: {problem}") and "\n" not in message
    assert "expected a pytest-benchmark JSON run" in message


def test_a_glob_matching_only_a_truncated_run_says_it_is_unreadable(storage):
    storage("0001_x_baseline.json", '{"benchmarks": [')
    with pytest.raises(UnusableBaselineError, match="0001_x_baseline.json: invalid JSON"):
        choose_baseline(storage.root, "*_baseline", lambda: HERE)


def test_an_unreadable_run_newer_than_this_devices_newest_stops_the_choice(storage):
    storage("0001_baseline.json", _run(CPU_A))
    storage("0002_baseline.json", "{")  # maybe this device's newest run
    storage("0003_baseline.json", _run(CPU_B))
    with pytest.raises(UnusableBaselineError, match="0002_baseline.json: invalid JSON.*newer than every complete run"):
        choose_baseline(storage.root, True, lambda: HERE)


@pytest.mark.parametrize("how", ["bare", "glob", "number", "path"])
def test_an_interrupted_run_is_never_the_baseline_by_any_path(storage, how):
    storage("0001_baseline.json", _run(CPU_B))
    interrupted = storage("0002_baseline.json", _run(CPU_A, incomplete=True, records=(_record(),)))
    compare = {"bare": True, "glob": "*_baseline", "number": "0002", "path": str(interrupted)}[how]
    with pytest.raises(UnusableBaselineError) as raised:
        choose_baseline(storage.root, compare, lambda: HERE)
    message = str(raised.value)
    assert message.startswith(f"{interrupted}: ") and "\n" not in message
    assert "interrupted" in message and INCOMPLETE_KEY in message and "never a baseline" in message
    assert "compare with a complete run (--benchmark-compare=NNNN of one)" in message


def test_a_run_named_by_its_path_is_used_as_it_is(storage):
    older = storage("0001_baseline.json", _run(CPU_A))
    storage("0002_baseline.json", _run(CPU_A))
    chosen = choose_baseline(storage.root, str(older), lambda: HERE)
    assert chosen.path == older and chosen.why == "named by --benchmark-compare"


@pytest.mark.parametrize(("field", "value", "expected"), [
    ("samples_per_s", "fast", "samples_per_s = 'fast': expected a finite number or null"),
    ("ops_per_step", [1, 2], "ops_per_step = [1, 2]: expected a finite number or null"),
    ("round_step_times_s", "0.1", "round_step_times_s: expected a list of finite seconds"),
    ("round_step_times_s", [0.1, "x"], "round_step_times_s: expected a list of finite seconds"),
    ("samples_per_step", 1.5, "samples_per_step = 1.5: expected a positive int")])
@pytest.mark.parametrize("compare", [True, "*_baseline"])
def test_a_wrong_typed_record_of_the_chosen_run_is_found_when_it_is_chosen(storage, field, value, expected, compare):
    storage("0001_baseline.json", _run(CPU_A, records=(_record(),)))
    chosen = storage("0002_baseline.json", _run(CPU_A, records=(_record(case="mlp-amp"), _record(**{field: value}))))
    with pytest.raises(UnusableBaselineError) as raised:
        choose_baseline(storage.root, compare, lambda: HERE)
    assert str(raised.value) == f"{chosen}: test_x.py::test_1: {expected}"


def test_a_plain_benchmark_beside_trainbench_records_is_not_read_as_one(storage):
    plain = {"name": "test_sum", "fullname": "test_p.py::test_sum", "stats": {}, "extra_info": {"note": "mine"}}
    run = json.loads(_run(CPU_A, records=(_record(),)))
    run["benchmarks"].append(plain)
    saved = storage("0001_baseline.json", json.dumps(run))
    assert choose_baseline(storage.root, True, lambda: HERE).path == saved


# -- a run read whole: its device, its marks, each benchmark once ---------------------------------------------------

def _saved(run: dict):
    from trainbench.verdicts.store import SavedRun

    return SavedRun("run.json", run)


@pytest.mark.parametrize(("devices", "machine", "problem"), [
    # machine_info lost its identity: the records' own device stands in, where each case recorded the same one
    ((CPU_A, CPU_A), None, None),
    ((CPU_A, None), None, "no device recorded: machine_info has no 'trainbench' entry and test_x.py::test_1 has no "
                          "device in its record"),
    ((CPU_B, CPU_A), None, "no device in machine_info, and its cases name 2 devices"),
    ((CPU_B, CPU_B), CPU_A, None),  # machine_info's identity is the run's
    ((None, None), CPU_A, None),
])
def test_a_runs_device_is_read_from_its_records_where_machine_info_lacks_it_and_refused_where_it_cannot_be(
        devices, machine, problem):
    records = tuple(_record(**({"device": d} if d else {})) for d in devices)
    run = _saved(json.loads(_run(machine, records=records)))
    assert run.device_problem == problem or problem in (run.device_problem or "")
    if problem is None:
        assert run.device == (machine or devices[0]) and run.check() is run
    else:
        with pytest.raises(RunFileError, match="^run.json: ") as raised:
            run.check()
        assert "\n" not in str(raised.value)


def test_an_interrupted_or_other_devices_run_without_machine_info_is_never_the_baseline(storage):
    mine = storage("0001_baseline.json", _run(None, records=(_record(device=CPU_A),)))
    storage("0002_baseline.json", _run(None, incomplete=True, records=(_record(device=CPU_A),)))
    storage("0003_baseline.json", _run(None, records=(_record(device=CPU_B),)))
    chosen = choose_baseline(storage.root, True, lambda: HERE)
    assert chosen.path == mine and "interrupted 0002_baseline.json" in chosen.why and "of another device" in chosen.why
    storage("0004_baseline.json", _run(None, records=(_record(),)))  # a trainbench run with no device anywhere
    with pytest.raises(UnusableBaselineError, match="0004_baseline.json: no device recorded"):
        choose_baseline(storage.root, True, lambda: HERE)


@pytest.mark.parametrize(("marks", "problem"), [
    ({INCOMPLETE_KEY: "no"}, "trainbench_incomplete = 'no': expected true or false"),
    ({"trainbench_planted_fault": "slowdown"}, "trainbench_planted_fault = 'slowdown': expected the planted fault"),
])
def test_a_mark_that_cannot_be_read_is_refused_never_read_as_complete_or_honest(storage, marks, problem):
    run = json.loads(_run(CPU_A, records=(_record(),)))
    storage("0001_baseline.json", json.dumps({**run, **marks}))
    with pytest.raises(UnusableBaselineError, match=f"0001_baseline.json: {problem}"):
        choose_baseline(storage.root, True, lambda: HERE)


def test_a_case_twice_in_a_run_is_refused_naming_both_never_the_last_silently(storage):
    run = json.loads(_run(CPU_A, records=(_record(), _record(ops_per_step=7))))
    run["benchmarks"][1]["fullname"] = run["benchmarks"][0]["fullname"]
    path = storage("0001_baseline.json", json.dumps(run))
    with pytest.raises(UnusableBaselineError) as raised:
        choose_baseline(storage.root, True, lambda: HERE)
    assert str(raised.value) == (f"{path}: test_x.py::test_0: in the run twice (its case records 0 and 1); expected "
                                 "each benchmark once: remove one")


def test_a_run_pytest_benchmark_chose_itself_is_checked_as_trainbenchs_own_choice():
    from trainbench.verdicts.store import unusable_as_baseline

    assert unusable_as_baseline(_saved(json.loads(_run(CPU_A, records=(_record(),))))) is None
    assert "an interrupted run" in unusable_as_baseline(_saved(json.loads(_run(None, True, (_record(device=CPU_A),)))))
    assert "no device recorded" in unusable_as_baseline(_saved(json.loads(_run(None, records=(_record(),)))))
    assert "ops_per_step = -1: expected a value >= 0" in unusable_as_baseline(
        _saved(json.loads(_run(CPU_A, records=(_record(ops_per_step=-1),)))))
