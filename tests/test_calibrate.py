"""Calibration writes this device's budgets from a run, shows the diff, and leaves other devices alone."""

import json
import re

import pytest

from trainbench.__main__ import main
from trainbench.core.records.budgets import Budgets
from trainbench.verdicts.calibrate import CalibrationError, calibrate, write

EXISTING = """# budgets of two devices
[cpu."mlp-baseline"]
note = "hand-written"
max_ops_per_step = 40   # too tight: calibration raises it
compare_fail = "samples_per_s:30%"

[sm_70."mlp-baseline"]
min_speedup = 1.3   # a GPU's entry: never touched
"""


def make_run(tmp_path, kind="cpu", name="AMD EPYC", **baseline_metrics):
    def bench(case, **metrics):
        info = {"case": case, "batch_size": 16, "samples_per_s": 1000.0, "round_step_times_s": [0.016] * 3,
                "activation_mib": 0.75, "ops_per_step": 55,
                "syncs_per_step": 0, "gflops_per_sample": 0.0189, "memory_growth_mib_per_step": -1e-6,
                "peak_memory_mib": 12.5, **metrics}
        return {"name": case, "fullname": case, "extra_info": info}

    run = {"machine_info": {"trainbench": {"kind": kind, "name": name, "torch": "2.14.1"}},
           "benchmarks": [bench("mlp-baseline", **baseline_metrics),
                          bench("mlp-set_to_none", ops_per_step=49, speedup_vs_baseline=1.4)]}
    path = tmp_path / "0001_run.json"
    path.write_text(json.dumps(run))
    return path


def test_calibration_updates_only_this_devices_section_with_the_margin(tmp_path):
    budgets = tmp_path / "budgets.toml"
    budgets.write_text(EXISTING)
    result = calibrate(make_run(tmp_path), budgets, margin=0.10, speed_margin=0.30)
    assert result.device_key == "cpu" and result.cases == 2
    assert budgets.read_text() == EXISTING  # nothing written without write()
    assert "-max_ops_per_step = 40" in result.diff and "+max_ops_per_step = 61" in result.diff  # 60.5 ops: 61
    write(result)
    text = budgets.read_text()
    assert '[sm_70."mlp-baseline"]\nmin_speedup = 1.3   # a GPU\'s entry: never touched' in text
    assert "# budgets of two devices" in text and 'note = "hand-written"' in text
    loaded = Budgets.load(budgets).sections["cpu"]
    base = {b.key: b.limit for b in loaded["mlp-baseline"].bounds}
    assert base["max_activation_mib"] == pytest.approx(0.825) and base["max_syncs_per_step"] == 0
    assert base["max_memory_growth_mib_per_step"] == 0  # a measured value <= 0 budgets 0, not a negative bound
    assert "max_peak_memory_mib" not in base  # on the CPU the allocator peak is not a calibrated signal
    assert loaded["mlp-baseline"].compare_fail == {"samples_per_s": pytest.approx(0.3)}  # kept
    new = {b.key: b.limit for b in loaded["mlp-set_to_none"].bounds}
    assert new["min_speedup"] == pytest.approx(0.98) and new["max_ops_per_step"] == 54  # 53.9, a whole count up
    assert calibrate(make_run(tmp_path), budgets, margin=0.10).diff == ""  # idempotent


def test_a_gpu_run_gets_its_own_section_by_name_with_allocator_peaks(tmp_path):
    budgets = tmp_path / "budgets.toml"
    budgets.write_text(EXISTING)
    result = calibrate(make_run(tmp_path, "cuda", "NVIDIA H100 80GB HBM3"), budgets)
    write(result)
    loaded = Budgets.load(budgets).sections
    assert {b.key for b in loaded["NVIDIA H100 80GB HBM3"]["mlp-baseline"].bounds} >= {"max_peak_memory_mib"}
    assert {b.key for b in loaded["cpu"]["mlp-baseline"].bounds} == {"max_ops_per_step"}  # untouched


def test_without_tomlkit_a_gpus_first_section_is_appended_and_an_existing_one_refused(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "tomlkit", None)  # a bare GPU box: import tomlkit raises ImportError
    budgets = tmp_path / "budgets.toml"
    budgets.write_text(EXISTING)
    result = calibrate(make_run(tmp_path, "cuda", "NVIDIA H100 80GB HBM3"), budgets)
    write(result)
    text = budgets.read_text()
    assert text.startswith(EXISTING)  # every line and comment kept
    assert '["NVIDIA H100 80GB HBM3"."mlp-baseline"]' in text
    with_tomlkit = Budgets.load(budgets).sections["NVIDIA H100 80GB HBM3"]
    assert {b.key for b in with_tomlkit["mlp-baseline"].bounds} >= {"max_peak_memory_mib", "max_ops_per_step"}
    with pytest.raises(CalibrationError, match=r"\[cpu\] exists and tomlkit is not installed"):
        calibrate(make_run(tmp_path), budgets)


def test_cli_shows_the_diff_and_writes_only_when_asked(tmp_path, capsys):
    budgets = tmp_path / "budgets.toml"
    budgets.write_text(EXISTING)
    run = str(make_run(tmp_path))
    assert main(["calibrate", run, "--budgets", str(budgets)]) == 0
    out = capsys.readouterr().out
    assert "+max_activation_mib = 0.75" in out and "dry run: [cpu] would be calibrated" in out  # exact by default
    assert ("margins: deterministic 0% (bounds at what was measured), allocator 10%, device_choice 10%"
            in out.splitlines())
    assert budgets.read_text() == EXISTING
    assert main(["calibrate", run, "--budgets", str(budgets), "--write", "--margin", "20%"]) == 0
    assert "max_activation_mib = 0.9" in budgets.read_text()


def test_counted_signals_get_exact_whole_bounds_and_only_the_kinds_that_vary_a_margin(tmp_path):
    budgets = tmp_path / "budgets.toml"
    run = make_run(tmp_path, ops_per_step=122, gflops_per_sample=0.018874368)
    cpu = calibrate(run, budgets)
    assert "+max_ops_per_step = 122\n" in cpu.diff and "+max_gflops_per_sample = 0.018874368\n" in cpu.diff
    assert "+max_activation_mib = 0.75\n" in cpu.diff and "+max_syncs_per_step = 0\n" in cpu.diff
    assert "+max_ops_per_step = 135\n" in calibrate(run, budgets, margin=0.10).diff  # 134.2 ops: a whole count up
    gpu = calibrate(make_run(tmp_path, "cuda", "NVIDIA H100 80GB HBM3", ops_per_step=122, kernels_per_step=40),
                    budgets)
    assert "+max_peak_memory_mib = 13.75\n" in gpu.diff  # the allocator's 10%
    assert "+max_kernels_per_step = 44\n" in gpu.diff and "+max_ops_per_step = 122\n" in gpu.diff


def test_calibrated_budgets_fail_a_layer_added_to_the_model(cpu, profile, quick, tmp_path):
    # The promise of a calibrated budget: what the model computes and holds cannot grow past what was measured (a
    # 10% margin let an added layer's +6.8% parameters pass).
    import functools

    import torch

    from trainbench.core.records.budgets import evaluate
    from trainbench.core.method.measure import measure
    from trainbench.core.setups.recipes import get_recipe
    from trainbench.core.records.result import case_record
    from trainbench.core.setups.spec import TrainingSpec
    from trainbench.core.setups.training import TrainingSetup

    def measured(extra_layer: bool):
        def model():  # the added layer: +6.3% parameters
            extra = [torch.nn.Linear(64, 64), torch.nn.ReLU()] if extra_layer else []
            return torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 64),
                                       torch.nn.ReLU(), *extra, torch.nn.Linear(64, 1))

        spec = TrainingSpec("tiny", model, loss_fn=lambda m, b: m(b).pow(2).mean(), batch_size=8,
                            optimizer=functools.partial(torch.optim.SGD, lr=0.01),
                            batches=lambda n, gen: torch.randn(n, 64, generator=gen))
        with TrainingSetup(get_recipe("baseline").config(profile), spec, cpu) as training:
            return measure(training, "tiny-baseline", "baseline", quick, profile_name=profile.name)

    as_calibrated = measured(extra_layer=False)
    run = tmp_path / "run.json"
    run.write_text(json.dumps({"machine_info": {"trainbench": cpu.identity()}, "benchmarks": [
        {"name": "tiny-baseline", "fullname": "tiny-baseline", "extra_info": case_record(as_calibrated)}]}))
    write(calibrate(run, tmp_path / "budgets.toml"))  # each kind its margin: none for these
    budget = Budgets.load(tmp_path / "budgets.toml").sections["cpu"]["tiny-baseline"]
    assert all(check.ok for check in evaluate(budget, as_calibrated, None))
    grown = {check.bound.metric for check in evaluate(budget, measured(extra_layer=True), None) if not check.ok}
    assert {"param_mib", "grad_mib", "gflops_per_sample", "ops_per_step"} <= grown


def test_bad_inputs_name_the_file(tmp_path, capsys):
    budgets = tmp_path / "budgets.toml"
    budgets.write_text("[cpu\n")
    assert main(["calibrate", str(make_run(tmp_path)), "--budgets", str(budgets)]) == 2
    assert f"trainbench calibrate: {budgets}: not valid TOML" in capsys.readouterr().err
    assert main(["calibrate", str(tmp_path / "missing.json"), "--budgets", str(budgets)]) == 2
    assert "missing.json" in capsys.readouterr().err
    with pytest.raises(CalibrationError, match="no device recorded: machine_info has no .trainbench. entry"):
        run = tmp_path / "r.json"
        run.write_text(json.dumps({"machine_info": {}, "benchmarks": [{"extra_info": {"case": "x"}}]}))
        calibrate(run, tmp_path / "new.toml")


def test_only_a_paired_speed_up_is_calibrated():
    from trainbench.core.records.result import CaseRecord
    from trainbench.verdicts.calibrate import bounds_for

    def record(paired):
        return CaseRecord.read({"case": "c", "samples_per_step": 16, "speedup_vs_baseline": 1.4, "paired": paired}, "c")

    paired = bounds_for(record(True), gpu=False, margin=0.1, speed_margin=0.3)
    unpaired = bounds_for(record(False), gpu=False, margin=0.1, speed_margin=0.3)
    assert paired["min_speedup"] == pytest.approx(0.98) and "min_speedup" not in unpaired


def test_calibration_can_be_limited_to_named_metrics(tmp_path):
    budgets = tmp_path / "budgets.toml"
    budgets.write_text(EXISTING)
    run = make_run(tmp_path)
    result = calibrate(run, budgets, margin=0.02, only=("activation_mib",))
    assert "+max_activation_mib = 0.765" in result.diff
    keys = [line for line in result.diff.splitlines() if line[:5] in ("+max_", "-max_", "+min_", "-min_")]
    assert keys == ["+max_activation_mib = 0.765"] * 2  # both cases, nothing else
    with pytest.raises(CalibrationError, match="samples_per_s: not calibrated"):
        calibrate(run, budgets, only=("samples_per_s",))


# -- what a run's records give: never a budget from a case whose guard failed --------------------------------------

def _guarded_run(tmp_path):
    """A run with a case whose loss guard failed, a case that ended without a result, an unpaired speed-up and a
    paired one."""
    run = json.loads(make_run(tmp_path).read_text())
    good, unpaired = run["benchmarks"]
    unpaired["extra_info"]["paired"] = False
    bad = json.loads(json.dumps(good))
    bad["name"] = bad["fullname"] = bad["extra_info"]["case"] = "mlp-wrong"
    bad["extra_info"]["guard"] = {"baseline": "baseline", "checks": [
        {"kind": "loss", "ok": False, "message": "worst relative loss difference 0.3 at step 2, tolerance 1e-05"}]}
    paired = json.loads(json.dumps(good))
    paired["name"] = paired["fullname"] = paired["extra_info"]["case"] = "mlp-paired"
    paired["extra_info"].update(speedup_vs_baseline=1.5, paired=True)
    run["benchmarks"] += [bad, paired]
    run["trainbench_failed_cases"] = [{"case": "mlp-oom", "fullname": "t::oom", "error": "mlp-oom: out of memory"}]
    path = tmp_path / "0002_guarded.json"
    path.write_text(json.dumps(run))
    return path


def test_a_run_whose_every_case_failed_is_refused_not_calibrated_from(tmp_path):
    run = json.loads(make_run(tmp_path).read_text())
    run["benchmarks"] = []
    run["trainbench_failed_cases"] = [{"case": "mlp-oom", "fullname": "t::oom", "error": "mlp-oom: out of memory"}]
    path = tmp_path / "0002_failed.json"
    path.write_text(json.dumps(run))
    with pytest.raises(CalibrationError, match=r"0002_failed.json: every case failed \(mlp-oom: out of memory\): "
                                               "nothing to calibrate from"):
        calibrate(path, tmp_path / "budgets.toml")


def test_a_case_whose_guard_failed_or_that_has_no_result_gives_no_budget_and_is_named(tmp_path):
    budgets = tmp_path / "budgets.toml"
    result = calibrate(_guarded_run(tmp_path), budgets)
    assert result.left_out == (
        "mlp-oom: no result (mlp-oom: out of memory)",
        "mlp-wrong: correctness guard (loss): worst relative loss difference 0.3 at step 2, tolerance 1e-05 (no budget "
        "from a case whose guard failed)")
    assert result.unpaired == ("mlp-set_to_none",)
    write(result)
    cases = Budgets.load(budgets).sections["cpu"]
    assert set(cases) == {"mlp-baseline", "mlp-set_to_none", "mlp-paired"}
    assert "min_speedup" not in {b.key for b in cases["mlp-set_to_none"].bounds}
    assert {b.key: b.limit for b in cases["mlp-paired"].bounds}["min_speedup"] == pytest.approx(1.05)


def test_each_case_goes_to_the_budgets_file_its_test_file_gets(tmp_path):
    run = json.loads(make_run(tmp_path).read_text())
    run["benchmarks"][0]["fullname"] = "a/test_a.py::test_base"
    run["benchmarks"][1]["fullname"] = "b/test_b.py::test_new"
    path = tmp_path / "0003_two.json"
    path.write_text(json.dumps(run))
    asked = []

    def targets(fullnames):
        asked.append(fullnames)
        return {name: tmp_path / name.split("/")[0] / "budgets.toml" for name in fullnames}

    result = calibrate(path, targets)
    assert asked == [["a/test_a.py::test_base", "b/test_b.py::test_new"]]
    assert [(change.path, change.cases) for change in result.files] == [
        (tmp_path / "a" / "budgets.toml", ("mlp-baseline",)), (tmp_path / "b" / "budgets.toml", ("mlp-set_to_none",))]
    assert sorted(write(result)) == [tmp_path / "a" / "budgets.toml", tmp_path / "b" / "budgets.toml"]


def test_the_budgets_file_of_a_test_file_is_the_plugins_or_a_new_one_it_will_find(tmp_path):
    from trainbench.plugin.options import discover_budgets
    from trainbench.plugin.project import Project

    root = tmp_path
    for folder in ("tests/unit/fast", "tests/perf", "tests/own"):
        (root / folder).mkdir(parents=True)
    (root / "tests/own/budgets.toml").write_text('[cpu.x]\nmax_ops_per_step = 1\n')
    files = [root / "tests/unit/fast/test_a.py", root / "tests/perf/test_b.py", root / "tests/own/test_c.py"]
    project = Project(root, None, "file://./.benchmarks", None)
    chosen = project.budgets_files(files)
    assert chosen[files[2]] == (root / "tests/own/budgets.toml", "found by the plugin")
    new = root / "tests/budgets.toml"  # the deepest folder above both test files that have none
    assert chosen[files[0]] == chosen[files[1]] == (new, "new: the plugin will find it")
    new.write_text('[cpu.x]\nmax_ops_per_step = 1\n')
    assert [discover_budgets(f, root) for f in files] == [new, new, root / "tests/own/budgets.toml"]  # it does
    named = Project(root, None, "file://./.benchmarks", root / "perf.toml").budgets_files(files)
    assert set(named.values()) == {(root / "perf.toml", "named by the project's pytest configuration")}


# -- in a user's project: its storage, its budgets file, and a fresh project's speed budgets -----------------------

USER_TESTS = """
import functools

import pytest
import torch
from torch import nn
from trainbench.core.setups.recipes import Recipe
from trainbench.core.setups.spec import TrainingSpec, classification_loss
from trainbench.core.setups.workloads import FakeTokens

SPEC = TrainingSpec(name="tiny", model=lambda: nn.Sequential(nn.EmbeddingBag(100, 8), nn.Linear(8, 10)),
                    loss_fn=classification_loss, optimizer=functools.partial(torch.optim.SGD, lr=0.01),
                    dataset=lambda: FakeTokens(256, 8, 100), batch_size=16)
# Claims to train what the baseline trains, but on twice the batch: its loss guard fails.
WRONG = Recipe("wrong", "twice the batch, claimed equivalent", {"batch_multiplier": 2}, loss_rtol=1e-6)


@pytest.mark.parametrize("recipe", [RECIPES])
def test_tiny(train_bench, recipe):
    train_bench(WRONG if recipe == "wrong" else recipe, SPEC)
"""


def _user_project(pytester, recipes, ini=None, budgets_at=None):
    """A project of a user: tests/ with its own conftest, an optional pytest.ini and budgets file."""
    tests = pytester.mkdir("tests")
    (tests / "conftest.py").write_text("# the project's own fixtures\n")
    (tests / "test_train.py").write_text(USER_TESTS.replace("RECIPES", ", ".join(map(repr, recipes))))
    if ini is not None:
        (pytester.path / "pytest.ini").write_text(ini)
    if budgets_at is not None:
        (pytester.path / budgets_at).write_text('# kept\n[cpu."tiny-other"]\nmax_ops_per_step = 1000\n')
    return tests


@pytest.mark.parametrize("layout", ["storage from addopts, no budgets file", "default storage, a budgets file above"])
def test_calibrate_reads_the_projects_storage_and_writes_the_budgets_file_the_plugin_finds(pytester, quick_options,
                                                                                         capsys, layout):
    configured = layout.startswith("storage from")
    tests = _user_project(pytester, ["baseline", "wrong"],
                          ini="[pytest]\naddopts = --benchmark-storage=perf_runs\n" if configured else None,
                          budgets_at=None if configured else "budgets.toml")
    pytester.runpytest("--benchmark-save=first", *quick_options).assert_outcomes(passed=1, failed=1)
    capsys.readouterr()  # the inner session's own output
    assert main(["calibrate", "--write"]) == 0
    out = capsys.readouterr().out
    storage, budgets = ("perf_runs", tests / "budgets.toml") if configured else (".benchmarks", pytester.path / "budgets.toml")
    [run] = (pytester.path / storage).rglob("0001_first.json")
    assert f"storage: {run.parent.relative_to(pytester.path)} (" + (
        "--benchmark-storage=perf_runs from pytest.ini)" if configured else "pytest-benchmark's default)") in out
    assert f"run: {run.relative_to(pytester.path)}\n" in out
    how = "new: the plugin will find it" if configured else "found by the plugin"
    assert f"budgets: {budgets.relative_to(pytester.path)} ({how} for tests/test_train.py): 1 case\n" in out
    assert "left out: tiny-wrong: correctness guard (loss): " in out
    sections = Budgets.load(budgets).sections["cpu"]
    assert "tiny-wrong" not in sections and {b.key for b in sections["tiny-baseline"].bounds} >= {"max_ops_per_step"}
    assert [p.name for p in pytester.path.rglob("budgets.toml")] == ["budgets.toml"]  # one file, not a second one
    if not configured:
        assert budgets.read_text().startswith("# kept\n") and "tiny-other" in sections
    # the plugin checks the case against what was written, with no option naming the file
    again = pytester.runpytest("-k", "baseline", *quick_options)
    again.assert_outcomes(passed=1, deselected=1)
    again.stdout.fnmatch_lines(["tiny-baseline * ok [0-9]*"])


def test_calibrate_measure_writes_paired_speed_budgets_for_a_fresh_project(pytester, quick_options, capsys):
    # No ratio budget anywhere, and the baseline is measured first: only --measure pairs set_to_none with it.
    tests = _user_project(pytester, ["baseline", "set_to_none"])
    assert main(["calibrate", "--measure", "--pytest-args", " ".join(quick_options), "--write"]) == 0
    out = capsys.readouterr().out
    assert "--trainbench-pair-baselines --benchmark-save=calibrate" in out
    [run] = pytester.path.joinpath(".benchmarks").rglob("0001_calibrate.json")
    assert f"run: {run.relative_to(pytester.path)}\n" in out
    records = {b["extra_info"]["case"]: b["extra_info"] for b in json.loads(run.read_text())["benchmarks"]}
    assert records["tiny-set_to_none"]["paired"] and records["tiny-set_to_none"]["baseline"] == "baseline"
    cases = Budgets.load(tests / "budgets.toml").sections["cpu"]
    speedup = {b.key: b.limit for b in cases["tiny-set_to_none"].bounds}["min_speedup"]
    assert speedup == pytest.approx(records["tiny-set_to_none"]["speedup_vs_baseline"] * 0.7, abs=0.011)
    assert "min_speedup" not in {b.key for b in cases["tiny-baseline"].bounds}  # its own baseline


def test_calibrate_says_what_it_could_not_read(pytester, capsys):
    pytester.makeini("[pytest]\naddopts = --no-such-option\n")
    assert main(["calibrate"]) == 2
    assert "trainbench calibrate: pytest could not read the project's configuration" in capsys.readouterr().err
    pytester.makeini("[pytest]\n")
    assert main(["calibrate"]) == 2
    assert "trainbench calibrate: .benchmarks: no *.json run found" in capsys.readouterr().err


@pytest.mark.parametrize(("metrics", "problem"), [
    ({"ops_per_step": -120}, "mlp-set_to_none: ops_per_step = -120: expected a value >= 0"),
    ({"samples_per_s": 0.0}, "mlp-set_to_none: samples_per_s = 0.0: expected a samples/s above 0"),
    ({"round_step_times_s": [-0.016, 1e300]}, "mlp-set_to_none: round_step_times_s holds -0.016: expected seconds"),
])
def test_a_run_with_values_no_measurement_gives_is_refused_and_never_calibrates_a_zero_bound(tmp_path, metrics,
                                                                                           problem):
    # a negative count calibrated max_ops_per_step = 0: every later run would fail its budget
    run = make_run(tmp_path)
    data = json.loads(run.read_text())
    data["benchmarks"][1]["extra_info"].update(metrics)
    run.write_text(json.dumps(data))
    with pytest.raises(CalibrationError) as raised:
        calibrate(run, tmp_path / "budgets.toml")
    assert str(raised.value).startswith(f"{run}: {problem}") and "\n" not in str(raised.value)
    assert not (tmp_path / "budgets.toml").exists()


def test_a_run_whose_device_only_its_records_hold_is_calibrated_for_that_device(tmp_path):
    run = make_run(tmp_path)
    data = json.loads(run.read_text())
    device = data["machine_info"].pop("trainbench")
    for bench in data["benchmarks"]:
        bench["extra_info"]["device"] = device
    run.write_text(json.dumps(data))
    assert calibrate(run, tmp_path / "budgets.toml").device_key == "cpu"
    data["benchmarks"][1]["extra_info"]["device"] = {**device, "name": "Intel Xeon"}
    run.write_text(json.dumps(data))
    with pytest.raises(CalibrationError, match="its cases name 2 devices"):
        calibrate(run, tmp_path / "budgets.toml")


@pytest.mark.parametrize("mark, said", [
    ({"trainbench_planted_fault": {"leak_mib": 1.0}}, "a fault planted on purpose (trainbench_planted_fault: leak_mib 1.0), "
                                                      "never calibrated from"),
    ({"trainbench_quick": True}, "a quick run (trainbench_quick: --trainbench-quick measured only what its budgets "
                                 "named), never calibrated from"),
])
def test_a_run_with_a_planted_fault_or_a_quick_run_is_never_calibrated_from(tmp_path, capsys, mark, said):
    """calibrate took the newest run, planted: a 1 MiB/step leak wrote max_memory_growth_mib_per_step = 1, and a later
    0.5 MiB/step leak passed; a quick run's JSON carried no mark and was calibrated."""
    path = make_run(tmp_path)
    path.write_text(json.dumps({**json.loads(path.read_text()), **mark}))
    with pytest.raises(CalibrationError, match=re.escape(said)):
        calibrate(path, tmp_path / "budgets.toml")
    assert main(["calibrate", str(path), "--budgets", str(tmp_path / "budgets.toml"), "--write"]) == 2
    assert said in capsys.readouterr().err and not (tmp_path / "budgets.toml").exists()


def test_a_run_stopped_before_its_end_is_calibrated_from_what_it_finished_and_says_so(tmp_path, capsys):
    path = make_run(tmp_path)
    path.write_text(json.dumps({**json.loads(path.read_text()), "trainbench_incomplete": True}))
    assert main(["calibrate", str(path), "--budgets", str(tmp_path / "budgets.toml")]) == 0
    assert (f"run: {path}: stopped before the end (trainbench_incomplete): calibrated from the 2 case(s) it "
            "finished; the others have no figures") in capsys.readouterr().out


def test_a_quick_run_is_marked_and_never_a_baseline(pytester, quick_options):
    pytester.makepyfile(test_train=USER_TESTS.replace("RECIPES", "'baseline'"))
    pytester.runpytest("--trainbench-quick", "--benchmark-json=quick.json", *quick_options).assert_outcomes(passed=1)
    assert json.loads((pytester.path / "quick.json").read_text())["trainbench_quick"] is True
    named = pytester.runpytest(f"--benchmark-compare={pytester.path / 'quick.json'}",
                               "--trainbench-compare-fail=deterministic:0%", *quick_options)
    assert named.ret == pytest.ExitCode.USAGE_ERROR
    assert "a quick run (trainbench_quick" in named.stderr.str() + named.stdout.str()


def test_calibrate_takes_the_newest_run_of_this_device_not_the_newest_number(pytester, quick_options, capsys):
    """A CPU run 0001 and a GPU run 0002 in one machine's storage: calibrate took 0002 by its number and would
    write the H100's section on a CPU machine."""
    _user_project(pytester, ["baseline"])
    pytester.runpytest("--benchmark-save=cpu", *quick_options).assert_outcomes(passed=1)
    [cpu_run] = pytester.path.rglob("0001_cpu.json")
    gpu = json.loads(cpu_run.read_text())
    gpu["machine_info"]["trainbench"] = {**gpu["machine_info"]["trainbench"], "kind": "cuda",
                                         "name": "NVIDIA H100 80GB HBM3"}
    for bench in gpu["benchmarks"]:
        bench["extra_info"]["device"] = gpu["machine_info"]["trainbench"]
    (cpu_run.parent / "0002_gpu.json").write_text(json.dumps(gpu))
    capsys.readouterr()
    assert main(["calibrate"]) == 0
    out = capsys.readouterr().out
    assert f"run: {cpu_run.relative_to(pytester.path)}\n" in out and "[cpu]" in out
    (cpu_run).unlink()  # only another device's run left
    assert main(["calibrate"]) == 2
    assert "(cpu, " in (err := capsys.readouterr().err) and "the newest, 0002_gpu.json, is of another device" in err
