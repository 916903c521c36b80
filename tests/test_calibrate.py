"""Calibration writes this device's budgets from a run, shows the diff, and leaves other devices alone."""

import json

import pytest

from trainbench.__main__ import main
from trainbench.budgets import Budgets
from trainbench.calibrate import CalibrationError, calibrate, write

EXISTING = """# budgets of two devices
[cpu."mlp-baseline"]
note = "hand-written"
max_ops_per_step = 40   # too tight: calibration raises it
compare_fail = "samples_per_s:30%"

[sm_70."mlp-baseline"]
min_speedup = 1.3   # a GPU's entry: never touched
"""


def make_run(tmp_path, kind="cpu", name="AMD EPYC"):
    def bench(case, **metrics):
        info = {"case": case, "batch_size": 16, "samples_per_s": 1000.0, "round_step_times_s": [0.016] * 3,
                "activation_mib": 0.75, "ops_per_step": 55,
                "syncs_per_step": 0, "gflops_per_sample": 0.0189, "memory_growth_mib_per_step": -1e-6,
                "peak_memory_mib": 12.5, **metrics}
        return {"name": case, "fullname": case, "extra_info": info}

    run = {"machine_info": {"trainbench": {"kind": kind, "name": name, "torch": "2.14.1"}},
           "benchmarks": [bench("mlp-baseline"), bench("mlp-set_to_none", ops_per_step=49, speedup_vs_baseline=1.4)]}
    path = tmp_path / "0001_run.json"
    path.write_text(json.dumps(run))
    return path


def test_calibration_updates_only_this_devices_section_with_the_margin(tmp_path):
    budgets = tmp_path / "budgets.toml"
    budgets.write_text(EXISTING)
    result = calibrate(make_run(tmp_path), budgets, margin=0.10, speed_margin=0.30)
    assert result.device_key == "cpu" and result.cases == 2
    assert budgets.read_text() == EXISTING  # nothing written without write()
    assert "-max_ops_per_step = 40" in result.diff and "+max_ops_per_step = 60.5" in result.diff
    write(result, budgets)
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
    assert new["min_speedup"] == pytest.approx(0.98) and new["max_ops_per_step"] == pytest.approx(53.9)
    assert calibrate(make_run(tmp_path), budgets).diff == ""  # idempotent


def test_a_gpu_run_gets_its_own_section_by_name_with_allocator_peaks(tmp_path):
    budgets = tmp_path / "budgets.toml"
    budgets.write_text(EXISTING)
    result = calibrate(make_run(tmp_path, "cuda", "NVIDIA H100 80GB HBM3"), budgets)
    write(result, budgets)
    loaded = Budgets.load(budgets).sections
    assert {b.key for b in loaded["NVIDIA H100 80GB HBM3"]["mlp-baseline"].bounds} >= {"max_peak_memory_mib"}
    assert {b.key for b in loaded["cpu"]["mlp-baseline"].bounds} == {"max_ops_per_step"}  # untouched


def test_cli_shows_the_diff_and_writes_only_when_asked(tmp_path, capsys):
    budgets = tmp_path / "budgets.toml"
    budgets.write_text(EXISTING)
    run = str(make_run(tmp_path))
    assert main(["calibrate", run, "--budgets", str(budgets)]) == 0
    out = capsys.readouterr().out
    assert "+max_activation_mib = 0.825" in out and "dry run: [cpu] would be calibrated" in out
    assert budgets.read_text() == EXISTING
    assert main(["calibrate", run, "--budgets", str(budgets), "--write", "--margin", "20%"]) == 0
    assert "max_activation_mib = 0.9" in budgets.read_text()


def test_bad_inputs_name_the_file(tmp_path, capsys):
    budgets = tmp_path / "budgets.toml"
    budgets.write_text("[cpu\n")
    assert main(["calibrate", str(make_run(tmp_path)), "--budgets", str(budgets)]) == 2
    assert f"trainbench calibrate: {budgets}: not valid TOML" in capsys.readouterr().err
    assert main(["calibrate", str(tmp_path / "missing.json"), "--budgets", str(budgets)]) == 2
    assert "missing.json" in capsys.readouterr().err
    with pytest.raises(CalibrationError, match="names no device"):
        run = tmp_path / "r.json"
        run.write_text(json.dumps({"machine_info": {}, "benchmarks": [{"extra_info": {"case": "x"}}]}))
        calibrate(run, tmp_path / "new.toml")


def test_only_a_paired_speed_up_is_calibrated():
    from trainbench.calibrate import bounds_for
    from trainbench.result import CaseRecord

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
