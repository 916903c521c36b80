"""Judging a measured case by its budget: deterministic bounds stand, a timed bound the rounds cannot judge is
measured again then inconclusive (or failed under strict timing), an untimed session judges no timed bound."""

import dataclasses
from pathlib import Path

import pytest
import torch

from trainbench.core.records.budgets import Bound, CaseBudget
from trainbench.core.method.judge import MAX_REMEASURES, Judge
from trainbench.core.method.measure import measure
from trainbench.core.records.outcome import CaseOutcome
from trainbench.core.setups.recipes import get_recipe
from trainbench.core.method.runner import Runner
from trainbench.core.setups.training import TrainingSetup
from trainbench.core.harness.watchdog import NoProgress
from trainbench.core.setups.workloads import resolve_spec
from trainbench.devices.device import CpuBackend

HOG = {"cpus": 2, "seconds": 3.0, "other_cpus": 1.05, "load_average_1m": [3.8, 4.1]}
QUIET = {"cpus": 2, "seconds": 3.0, "other_cpus": 0.02, "load_average_1m": [1.9, 2.0]}
# No run reaches 10^12 samples/s; every run of the MLP stays under 10^9 ops per step.
SPEED = Bound("samples_per_s", "min", False, 1e12, "min_samples_per_s")
OPS = Bound("ops_per_step", "max", False, 1e9, "max_ops_per_step")


@pytest.fixture(scope="module")
def result(profile, quick):
    """One measured MLP baseline, shared: the judge reads it and never changes what it measured."""
    with TrainingSetup(get_recipe("baseline").config(profile), resolve_spec("mlp", profile),
                       CpuBackend(torch.device("cpu"))) as setup:
        # 8 rounds: as the CPU profile, enough for a first look of two to judge a timed bound (stats.least_rounds)
        return measure(setup, "mlp-baseline", "baseline", dataclasses.replace(quick, rounds=8), 0, profile.name)


def _outcome(result, *bounds, load=None):
    budget = CaseBudget("cpu", "mlp-baseline", bounds) if bounds else None
    measured = dataclasses.replace(result, notes=[], machine_load=load)
    return CaseOutcome("mlp-baseline", get_recipe("baseline"), result=measured, budget=budget,
                       budget_missing=None if bounds else "no budget: no budgets file configured")


def _never(given):
    pytest.fail("measured again")


def test_a_case_without_a_budget_fails_only_where_budgets_are_required(result):
    outcome = Judge().judge(_outcome(result), _never)
    assert outcome.failures == () and outcome.budget_status == "none"
    required = Judge(require_budgets=True).judge(_outcome(result), _never)
    assert required.failures == ("mlp-baseline: no budget: no budgets file configured (--trainbench-require-budgets)",)
    assert required.budget_status == "FAIL"
    # an entry two edits from its id (Budgets.misspelling): it fails without --trainbench-require-budgets
    typo = dataclasses.replace(_outcome(result), budget_required=True, budget_missing="no budget for mlp-baseline, and ...")
    assert Judge().judge(typo, _never).failures == ("mlp-baseline: no budget for mlp-baseline, and ...",)


def test_a_budget_entry_with_no_bound_is_no_budget_where_budgets_are_required(result):
    """An entry with a note only passed --trainbench-require-budgets as "ok 0" (an empty file is refused)."""
    noted = dataclasses.replace(_outcome(result), budget=CaseBudget("cpu", "mlp-baseline", (), note="to do",
                                                                    path=Path("budgets.toml")), budget_missing=None)
    assert Judge().judge(noted, _never).failures == ()  # not required: shown as it is
    required = Judge(require_budgets=True).judge(noted, _never)
    assert required.failures == ('mlp-baseline: its budget entry [cpu."mlp-baseline"] in budgets.toml has no bound (a '
                                 'note or gate thresholds only): nothing is checked (--trainbench-require-budgets)',)
    assert required.budget_status == "FAIL"


def test_a_missed_timed_bound_on_a_busy_machine_is_measured_again_as_often_as_allowed_then_inconclusive(result):
    outcome = _outcome(result, SPEED, OPS, load=HOG)
    again = []

    def measure_again(given):
        again.append(given.result)
        return dataclasses.replace(given, result=dataclasses.replace(result, notes=[], machine_load=HOG))

    judged = Judge(remeasure_inconclusive=2).judge(outcome, measure_again)
    assert len(again) == 2 and judged.failures == () and judged.budget_status == "ok 1, 1 inconclusive"
    [note] = judged.result.notes
    rounds = len(result.round_step_times_s)
    assert judged.result.round_step_times_s == result.round_step_times_s * 3  # each measurement adds its rounds
    assert note.startswith(f"measured again (attempt 3, rounds now {3 * rounds}): timed checks were inconclusive "
                           "(busy machine: other processes used 1.05 of 2 CPUs")


def test_a_gates_undecided_comparison_is_measured_again_within_the_time_budget(result):
    outcome = _outcome(result, OPS, load=QUIET)  # its budget alone is judged at once
    again, asked = [], []

    def measure_again(given):
        again.append(1)
        return dataclasses.replace(given, result=dataclasses.replace(result, notes=[]))

    def inconclusive_comparisons(o):
        asked.append(len(o.result.round_step_times_s))
        return ["mlp-baseline step_time_ms: the 95% interval reaches the threshold"] if len(asked) < 3 else []

    judged = Judge(remeasure_inconclusive=1, remeasure_s=3600).judge(outcome, measure_again,
                                                                     inconclusive_comparisons=inconclusive_comparisons)
    rounds = len(result.round_step_times_s)
    assert len(again) == 2 and asked == [rounds, 2 * rounds, 3 * rounds]  # judged afresh on the added rounds
    assert "the 95% interval reaches the threshold" in judged.result.notes[-1]
    # Without seconds to spend, only the first measurement again: then the gate says it could not judge.
    outcome = _outcome(result, OPS, load=QUIET)
    again.clear()
    Judge(remeasure_inconclusive=1, remeasure_s=0).judge(outcome, measure_again, inconclusive_comparisons=lambda o: ["unsure"])
    assert len(again) == 1
    again.clear()
    Judge(remeasure_inconclusive=1, remeasure_s=3600).judge(outcome, measure_again, inconclusive_comparisons=lambda o: ["unsure"])
    assert len(again) == MAX_REMEASURES


# Rounds whose median step time (11.5 ms) keeps a 12 ms budget while their 95% interval reaches past it: the gate's
# rule could not judge them, so neither does the budget (it read "ok" on the median alone before).
STRADDLING_S = [0.0100, 0.0150, 0.0115, 0.0130, 0.0104, 0.0118, 0.0112]
STEP = Bound("step_time_ms", "max", False, 12.0, "max_step_time_ms")


def test_rounds_the_gates_rule_cannot_judge_never_read_budget_ok(result):
    outcome = _outcome(result, STEP, OPS, load=QUIET)
    outcome = dataclasses.replace(outcome, result=dataclasses.replace(outcome.result, round_step_times_s=STRADDLING_S))
    again = []

    def measure_again(given):
        again.append(given.result)
        return dataclasses.replace(given, result=dataclasses.replace(result, notes=[], machine_load=QUIET,
                                                                     round_step_times_s=STRADDLING_S))

    judged = Judge(remeasure_inconclusive=1).judge(outcome, measure_again)
    step = judged.bound_checks[0]
    assert len(again) == 1 and judged.failures == () and not step.ok
    # measured twice: the interval of both measurements' rounds still reaches the limit
    assert step.inconclusive.startswith("rounds too noisy to judge: 97.5% interval 10.4..13 includes the limit 12")
    assert judged.budget_status == "ok 1, 1 inconclusive"
    steady = _outcome(result, STEP, load=QUIET)
    steady = dataclasses.replace(steady, result=dataclasses.replace(steady.result, round_step_times_s=[0.0115] * 7))
    assert Judge().judge(steady, _never).bound_checks[0].ok  # the same median, rounds that clear the limit: ok


def test_strict_timing_fails_a_budget_its_rounds_cannot_judge_even_where_the_median_keeps_it(result):
    outcome = _outcome(result, STEP, load=QUIET)
    outcome = dataclasses.replace(outcome, result=dataclasses.replace(outcome.result, round_step_times_s=STRADDLING_S))
    [failure] = Judge(strict_timing=True).judge(outcome, _never).failures
    assert "(margin -4.2%): inconclusive (rounds too noisy to judge" in failure
    assert failure.endswith("a failure under --trainbench-strict-timing")


def test_strict_timing_fails_a_missed_timed_bound_at_once(result):
    judged = Judge(strict_timing=True).judge(_outcome(result, SPEED, OPS, load=HOG), _never)
    [failure] = judged.failures
    assert failure.startswith("mlp-baseline [cpu]: samples_per_s: measured ") and "short by" in failure
    assert judged.budget_status == "FAIL 1/2" and not judged.inconclusive


def test_a_session_without_meaningful_timing_judges_its_deterministic_bounds_only(result):
    judged = Judge().judge(_outcome(result, SPEED, OPS, load=QUIET), _never, untimed="2 workers share the CPU")
    assert [v.bound.key for v in judged.bound_checks] == ["max_ops_per_step"] and judged.failures == ()
    assert judged.result.notes == ["timed budgets not judged (min_samples_per_s): 2 workers share the CPU"]


def test_a_measurement_again_that_makes_no_progress_fails_the_case_alone(result):
    def hangs(given):
        raise NoProgress(5, "the timed rounds")

    judged = Judge().judge(_outcome(result, SPEED, load=HOG), hangs)
    assert judged.result is None and judged.error == (
        "mlp-baseline: no progress for 5 s in the timed rounds, measuring it again (--trainbench-timeout sets the limit)")
    assert judged.failures == (judged.error,)


def test_a_loss_that_diverges_while_measured_again_fails_the_case_alone(result):
    from trainbench.core.setups.training import NonFiniteLoss

    def diverges(given):
        raise NonFiniteLoss("the loss of training spec 'mlp' is nan at step 12")

    judged = Judge().judge(_outcome(result, SPEED, load=HOG), diverges)
    assert judged.result is None and judged.failures == (judged.error,)
    assert judged.error == "mlp-baseline: the loss of training spec 'mlp' is nan at step 12, measuring it again"


# -- through a run: a ratio budget on paired rounds ---------------------------------------------------



def test_strict_timing_fails_what_a_busy_machine_leaves_inconclusive(machine_load, profile, quick, impossible_speedup):
    machine_load(HOG)
    runner = Runner(CpuBackend(torch.device("cpu")), profile, quick, strict_timing=True)
    outcome = runner.run("set_to_none", "mlp", budgets=impossible_speedup)
    [failure] = outcome.failures
    assert "samples_per_s ratio vs baseline" in failure and not outcome.inconclusive


def test_a_speed_budget_missed_on_a_quiet_machine_by_every_pair_fails_at_once(machine_load, profile, quick,
                                                                              impossible_speedup):
    machine_load(QUIET)
    # 8 pairs: as many as a first look of two needs to place anything (3 cannot, however they fall)
    settings = dataclasses.replace(quick, rounds=8)
    outcome = Runner(CpuBackend(torch.device("cpu")), profile, settings).run("set_to_none", "mlp",
                                                                             budgets=impossible_speedup)
    [failure] = outcome.failures  # 100x is outside any interval of the pairs: conclusive, not measured again
    assert "short by" in failure and not outcome.inconclusive
    assert not any(n.startswith("measured again") for n in outcome.result.notes)


def test_a_budget_alone_gets_its_one_measurement_again_whatever_the_time_budget(result):
    outcome = _outcome(result, SPEED, OPS, load=HOG)  # inconclusive on every measurement
    again = []

    def measure_again(given):
        again.append(1)
        return dataclasses.replace(given, result=dataclasses.replace(result, notes=[], machine_load=HOG))

    Judge(remeasure_inconclusive=1, remeasure_s=3600).judge(outcome, measure_again)
    assert len(again) == 1  # a budget's inconclusive bound is reported, not failed: no time spent chasing it
