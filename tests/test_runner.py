"""The pytest-free runner from end to end: plan, execute, judge (each has its own test file)."""

import pytest
import torch

from trainbench.budgets import Budgets
from trainbench.device import CpuBackend
from trainbench.runner import Runner


def test_without_a_ratio_budget_the_speed_up_is_unpaired(cpu, profile, quick):
    runner = Runner(cpu, profile, quick)
    runner.run("baseline", "mlp")
    outcome = runner.run("set_to_none", "mlp")
    assert not outcome.paired and outcome.speedup is not None
    assert outcome.budget is None and "no budgets file configured" in outcome.budget_missing


def test_a_case_whose_baseline_cannot_apply_is_skipped_with_that_reason(profile, quick):
    runner = Runner(CpuBackend(torch.device("cpu")), profile, quick)
    outcome = runner.run("no_conv_bias", "mlp")  # its baseline adds conv biases: the MLP has no convolution
    assert outcome.skipped == "no_conv_bias: the model has no bias-free convolution to give a bias"
    gpu_only = runner.run("pinned_memory", "mlp")
    assert gpu_only.skipped.startswith("pinned_memory: needs a CUDA device; this run uses cpu")


HOG = {"cpus": 2, "seconds": 3.0, "other_cpus": 1.05, "load_average_1m": [3.8, 4.1]}


@pytest.fixture
def impossible_speedup(tmp_path):
    """A speed budget no run can meet (100x its baseline) beside a deterministic one every run meets."""
    path = tmp_path / "budgets.toml"
    path.write_text('[cpu."mlp-set_to_none"]\nmin_speedup = 100\nmax_ops_per_step_ratio = 1.5\n')
    return Budgets.load(path)


def _machine(monkeypatch, load):
    monkeypatch.setattr("trainbench.host.LoadMeter.stop", lambda self: dict(load))


def test_a_speed_budget_missed_on_a_busy_machine_is_measured_again_then_inconclusive(monkeypatch, profile, quick,
                                                                                       impossible_speedup):
    _machine(monkeypatch, HOG)
    outcome = Runner(CpuBackend(torch.device("cpu")), profile, quick).run("set_to_none", "mlp",
                                                                          budgets=impossible_speedup)
    assert not outcome.failures and outcome.budget_status == "ok 1, 1 inconclusive"
    [line] = outcome.inconclusive
    assert line.startswith("mlp-set_to_none [cpu]: inconclusive: samples_per_s ratio vs baseline: measured ")
    assert line.endswith("busy machine: other processes used 1.05 of 2 CPUs while it ran, load average 3.80 -> 4.10")
    assert any(n.startswith("measured again (attempt 2): the first measurement's timed budgets were inconclusive")
               for n in outcome.result.notes)
    assert outcome.result.machine_load == HOG
    check = next(c for c in outcome.record()["budget"]["checks"] if c["key"] == "min_speedup")
    assert not check["ok"] and check["inconclusive"].startswith("busy machine")
    assert outcome.record()["budget"]["status"] == "inconclusive"
