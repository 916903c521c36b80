"""What running a case gave and its one serialized form: the budget's status, the guard, and a case that failed."""

import dataclasses

import pytest
import torch

from trainbench.core.records.budgets import Bound, BoundCheck, CaseBudget
from trainbench.core.records.outcome import GuardCheck
from trainbench.core.method.measure import measure
from trainbench.core.records.outcome import CaseOutcome, failed_without_result
from trainbench.core.setups.recipes import get_recipe
from trainbench.core.records.result import CaseRecord
from trainbench.core.setups.training import TrainingSetup
from trainbench.core.setups.workloads import resolve_spec
from trainbench.devices.device import CpuBackend

OPS = Bound("ops_per_step", "max", True, 1.5, "max_ops_per_step_ratio")
SPEED = Bound("samples_per_s", "min", True, 2.0, "min_speedup")


@pytest.fixture(scope="module")
def measured(profile, quick):
    """An MLP baseline and set_to_none, each measured once for the module."""
    results = {}
    for name in ("baseline", "set_to_none"):
        with TrainingSetup(get_recipe(name).config(profile), resolve_spec("mlp", profile),
                           CpuBackend(torch.device("cpu"))) as setup:
            results[name] = measure(setup, f"mlp-{name}", name, quick, 0, profile.name)
    return results


def _outcome(measured, *verdicts) -> CaseOutcome:
    return CaseOutcome("mlp-set_to_none", get_recipe("set_to_none"), result=measured["set_to_none"],
                       baseline_recipe=get_recipe("baseline"), baseline=measured["baseline"], paired=True,
                       budget=CaseBudget("cpu", "mlp-set_to_none", (OPS, SPEED)), bound_checks=verdicts)


def test_the_budget_status_counts_failed_and_inconclusive_bounds(measured):
    ok, missed = BoundCheck(OPS, 1.0, True, "ops ok"), BoundCheck(SPEED, 1.1, False, "short by 45%")
    unsure = dataclasses.replace(missed, inconclusive="busy machine")
    assert _outcome(measured, ok).budget_status == "ok 1"
    assert _outcome(measured, ok, unsure).budget_status == "ok 1, 1 inconclusive"
    failing = _outcome(measured, ok, missed)
    assert failing.budget_status == "FAIL 1/2" and failing.budget_failures() == ["mlp-set_to_none [cpu]: short by 45%"]
    assert _outcome(measured, ok, unsure).inconclusive == ["mlp-set_to_none [cpu]: inconclusive: short by 45%: busy machine"]
    assert CaseOutcome("x", get_recipe("baseline"), budget_required=True).budget_status == "FAIL"


def test_the_record_reads_back_with_its_baseline_budget_and_guard(measured):
    outcome = _outcome(measured, BoundCheck(OPS, 1.0, True, "ops ok"), BoundCheck(SPEED, 1.1, False, "short by 45%",
                                                                             inconclusive="busy machine"))
    outcome = dataclasses.replace(outcome, guard_checks=(GuardCheck(True, "loss", 0.0, "same losses", [1.0], [1.0]),))
    record = outcome.record()
    assert record["baseline"] == "baseline" and record["paired"] is True
    assert record["speedup_vs_baseline"] == pytest.approx(outcome.speedup)
    assert record["budget"]["status"] == "inconclusive" and record["budget"]["device_key"] == "cpu"
    assert [c["key"] for c in record["budget"]["checks"]] == ["max_ops_per_step_ratio", "min_speedup"]
    assert record["guard"]["checks"][0]["rtol"] == get_recipe("set_to_none").loss_rtol
    read = CaseRecord.read(record, "mlp-set_to_none")
    assert read.paired and read.speedup_vs_baseline == pytest.approx(outcome.speedup)


def test_a_case_without_a_budget_records_why(measured):
    outcome = CaseOutcome("mlp-baseline", get_recipe("baseline"), result=measured["baseline"],
                          budget_missing="no budget: no budgets file configured")
    assert outcome.speedup is None
    assert outcome.record()["budget"] == {"status": "none", "reason": "no budget: no budgets file configured",
                                          "required": False}


def test_a_case_that_failed_before_its_result_keeps_no_numbers(measured):
    outcome = failed_without_result(_outcome(measured), "mlp-set_to_none: out of memory at batch 16")
    assert outcome.result is None and outcome.baseline is None and outcome.speedup is None
    assert outcome.error == "mlp-set_to_none: out of memory at batch 16" and outcome.failures == (outcome.error,)


def test_scaling_efficiency_is_n_ranks_over_n_times_one_rank_at_the_per_rank_batch():
    from trainbench.core.records.outcome import scaling_efficiency
    from trainbench.core.records.result import Result

    def run(recipe, batch, step_s, parallel=None, world=1, ideal=None):
        return Result(f"resnet18-{recipe}", "resnet18", recipe, "gpu", batch_size=batch, config={"parallel": parallel},
                      device={}, world_size=world, rounds=1, steps_per_round=1, round_step_times_s=[step_s],
                      ranks={"ideal_speedup": ideal} if ideal else None)

    ddp = run("ddp", 32, 0.125, "ddp", world=2, ideal=2.0)  # 2 GPUs x 32 samples in 0.125 s: 512 samples/s
    one_rank = run("baseline", 32, 0.1)  # one GPU at the per-rank batch: 320 samples/s
    assert scaling_efficiency(ddp, one_rank) == pytest.approx(512 / (2 * 320))
    # DataParallel already uses both GPUs at the global batch: against it the figure would be halved, so none
    assert scaling_efficiency(ddp, run("data_parallel", 64, 0.15, "dp")) is None
    assert scaling_efficiency(ddp, run("one_process", 64, 0.2)) is None  # another batch per device
    assert scaling_efficiency(ddp, run("ddp_other", 32, 0.1, "ddp", world=2, ideal=2.0)) is None  # ranks itself
    assert scaling_efficiency(one_rank, one_rank) is None  # not a rank case
