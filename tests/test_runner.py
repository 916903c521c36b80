"""The pytest-free runner: which baseline, paired or not, each setup's memory measured alone, skips with reasons."""

import pytest
import torch

from trainbench.budgets import Budgets
from trainbench.device import CpuBackend
from trainbench.measure import Measurement
from trainbench.result import CaseRecord
from trainbench.runner import Runner


class LoggingBackend(CpuBackend):
    def __init__(self, log):
        super().__init__(torch.device("cpu"))
        self.log = log

    def release_memory(self):
        self.log.append("release")
        super().release_memory()


@pytest.fixture
def log(monkeypatch):
    entries = []
    real = Measurement.measure_after_timing

    def logged(self):
        entries.append(f"passes {self.result.recipe}")
        real(self)

    monkeypatch.setattr(Measurement, "measure_after_timing", logged)
    return entries


@pytest.fixture
def ratio_budgets(tmp_path):
    path = tmp_path / "budgets.toml"
    path.write_text('[cpu."mlp-set_to_none"]\nmax_ops_per_step_ratio = 0.99\n'
                    '[cpu."mlp-optimizer_fused"]\nmax_ops_per_step_ratio = 0.99\n')
    return Budgets.load(path)


def test_a_ratio_budget_pairs_the_rounds_and_measures_each_setups_memory_alone(log, ratio_budgets, profile, quick):
    runner = Runner(LoggingBackend(log), profile, quick)
    outcome = runner.run("set_to_none", "mlp", budgets=ratio_budgets)
    assert outcome.paired and outcome.speedup is not None and not outcome.failures
    assert len(outcome.result.round_step_times_s) == len(outcome.baseline.round_step_times_s) == quick.rounds
    # the baseline's passes before the case is built, the case's after the baseline is freed (each pass set
    # releases cached memory itself before its allocator peaks)
    assert log == ["passes baseline", "release", "release", "passes set_to_none", "release"]
    record = CaseRecord.read(outcome.record(), "mlp-set_to_none")
    assert record.paired and record.speedup_vs_baseline == pytest.approx(outcome.speedup)


def test_a_baseline_measured_earlier_in_the_session_lends_its_memory_and_work(log, ratio_budgets, profile, quick):
    runner = Runner(LoggingBackend(log), profile, quick)
    runner.run("baseline", "mlp")
    log.clear()
    outcome = runner.run("set_to_none", "mlp", budgets=ratio_budgets)
    assert log == ["release", "passes set_to_none", "release"]  # the baseline's own rounds, its earlier passes
    assert outcome.baseline.ops_per_step == runner.results[("mlp", "baseline", ())].ops_per_step
    assert any("earlier measurement" in note for note in outcome.baseline.notes)


def test_without_a_ratio_budget_the_speed_up_is_unpaired(log, profile, quick):
    runner = Runner(LoggingBackend(log), profile, quick)
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
QUIET = {"cpus": 2, "seconds": 3.0, "other_cpus": 0.02, "load_average_1m": [1.9, 2.0]}


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


def test_strict_timing_fails_what_a_busy_machine_leaves_inconclusive(monkeypatch, profile, quick, impossible_speedup):
    _machine(monkeypatch, HOG)
    runner = Runner(CpuBackend(torch.device("cpu")), profile, quick, strict_timing=True)
    outcome = runner.run("set_to_none", "mlp", budgets=impossible_speedup)
    [failure] = outcome.failures
    assert "samples_per_s ratio vs baseline" in failure and not outcome.inconclusive


def test_a_speed_budget_missed_on_a_quiet_machine_by_every_pair_fails_at_once(monkeypatch, profile, quick,
                                                                              impossible_speedup):
    _machine(monkeypatch, QUIET)
    outcome = Runner(CpuBackend(torch.device("cpu")), profile, quick).run("set_to_none", "mlp",
                                                                          budgets=impossible_speedup)
    [failure] = outcome.failures  # 100x is outside any interval of the pairs: conclusive, not measured again
    assert "short by" in failure and not outcome.inconclusive
    assert not any(n.startswith("measured again") for n in outcome.result.notes)
