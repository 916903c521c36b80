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
