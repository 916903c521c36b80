"""Executing a plan: each way of measuring a case and its baseline, the session's baselines, the guard's inputs."""

import pytest
import torch

from trainbench.budgets import Budgets
from trainbench.device import CpuBackend
from trainbench.measure import Measurer
from trainbench.result import CaseRecord
from trainbench.runner import Runner
from trainbench.training import InjectedFault


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
    real = Measurer.measure_after_timing

    def logged(self):
        entries.append(f"passes {self.result.recipe}")
        real(self)

    monkeypatch.setattr(Measurer, "measure_after_timing", logged)
    return entries


@pytest.fixture
def ratio_budgets(tmp_path):
    path = tmp_path / "budgets.toml"
    path.write_text('[cpu."mlp-set_to_none"]\nmax_ops_per_step_ratio = 0.99\n'
                    '[cpu."mlp-deterministic"]\nmax_ops_per_step_ratio = 1.5\n')
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


def test_a_baseline_that_cannot_share_the_process_is_measured_right_after_and_kept(cpu, ratio_budgets, profile, quick):
    runner = Runner(cpu, profile, quick)
    outcome = runner.run("deterministic", "mlp", budgets=ratio_budgets)
    assert not outcome.paired and outcome.baseline is not None and not outcome.failures
    assert ("baseline baseline measured right after, not interleaved (deterministic changes process-wide state)"
            in outcome.result.notes)
    assert runner.results[("mlp", "baseline", ())] is outcome.baseline  # a later case's unpaired reference


def test_a_planted_regression_never_becomes_another_cases_baseline(profile, quick):
    runner = Runner(CpuBackend(torch.device("cpu")), profile, quick, fault=InjectedFault(slowdown=0.1))
    outcome = runner.run("baseline", "mlp")
    assert outcome.result is not None and runner.results == {}
