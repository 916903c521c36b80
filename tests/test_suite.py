"""The suite is complete and consistent: every optimization is a case with a budget and a guard (or a reason)."""

from pathlib import Path

import pytest

from trainbench.core.records.budgets import Budgets
from trainbench.core.setups.cases import SUITE, all_cases, ladder_cases
from trainbench.core.setups.eligibility import why_not
from trainbench.core.setups.ladders import LADDERS
from trainbench.core.setups.recipes import RECIPES
from trainbench.core.setups.workloads import PROFILES
from trainbench.devices.device import DeviceCaps

BUDGETS = Budgets.load(Path(__file__).parents[1] / "benchmarks" / "budgets.toml")
# A V100 (sm_70 has its own section) and an H100 (only [cuda] applies), each with 8 GPUs.
GPUS = (DeviceCaps("cuda", "Tesla V100-SXM2-16GB", cuda=True, capability=(7, 0), gpu_count=8, bf16=False),
        DeviceCaps("cuda", "NVIDIA H100 80GB HBM3", cuda=True, capability=(9, 0), gpu_count=8, bf16=True))
CPU = DeviceCaps("cpu", "a CPU", bf16=True)


def _needs_gpu(case) -> bool:
    return case.own_recipe().requires.needs_cuda


def test_case_ids_are_unique():
    ids = [c.id for c in all_cases()]
    assert len(ids) == len(set(ids))


def test_every_optimization_is_a_case_somewhere():
    in_suite = {name for names in SUITE.values() for name in names}
    optimizations = {name for name, r in RECIPES.items() if not r.reference}
    assert optimizations - in_suite == set()


def test_the_suite_is_read_from_each_recipes_entry_and_a_workload_no_one_knows_is_refused(monkeypatch):
    from trainbench.core.setups import cases
    from trainbench.core.setups.recipes import Recipe

    assert {(w, r.name) for r in RECIPES.values() for w in r.suite} == {(c.workload, c.recipe_name) for c in
                                                                       cases.recipe_cases()}
    monkeypatch.setitem(RECIPES, "planted", Recipe("planted", "a recipe on two workloads", suite=("gpt", "convnet")))
    assert cases._suite()["gpt"][-1] == cases._suite()["convnet"][-1] == "planted"  # the entry alone adds its cases
    monkeypatch.setitem(RECIPES, "planted", Recipe("planted", "a recipe on no known workload", suite=("gtp",)))
    with pytest.raises(ValueError, match=r"recipes name workloads that are not built in: \[\('planted', 'gtp'\)\]"):
        cases._suite()


@pytest.mark.parametrize("case", all_cases(), ids=lambda c: c.id)
def test_every_case_has_a_budget_for_the_devices_it_runs_on(case):
    if _needs_gpu(case):
        for gpu in GPUS:  # the merged view each GPU sees: its own sections, then [cuda]
            if why_not(case, gpu, PROFILES["gpu"]) is None:
                assert BUDGETS.for_case(gpu, case.id) is not None, f"{case.id}: no budget on {gpu.name}"
    elif case.id not in {f"{w}-baseline" for w in SUITE}:
        budget = BUDGETS.for_case(CPU, case.id)
        assert budget is not None and budget.bounds, f"{case.id}: no CPU budget"


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_recipe_is_guarded_or_says_why_not(name):
    r = RECIPES[name]
    assert r.baseline in RECIPES, f"{name}: baseline {r.baseline!r} is not a recipe"
    if not r.reference:
        assert r.loss_rtol is not None or r.grad_rtol is not None or "Unguarded" in r.description


def test_ladders_are_cumulative_and_carry_the_articles_figures():
    ladder = LADDERS["ladder003"]
    last = ladder.rung_recipe(len(ladder.steps) - 1)
    assert last.changes["compile"] and last.changes["zero_grad"] == "set_to_none" and last.changes["uint8_transfer"]
    assert ladder.steps[0].article.step_time_ms == 80.0 and ladder.steps[-1].article.samples_per_s == 3268.0
    ladder000 = LADDERS["ladder000"]
    assert ladder000.steps[0].article.samples_per_s == 273.5 and ladder000.steps[-1].article.samples_per_s == 1381.6
    assert [c.rung for c in ladder_cases() if c.ladder == "ladder000"] == list(range(6))


def test_a_rung_the_device_cannot_run_is_left_out_of_later_rungs(cpu, profile):
    ladder = LADDERS["ladder000"]
    rung = ladder.rung_recipe(4, cpu.caps(), profile)  # multi-process loading, after AMP, batch and uint8
    assert rung.changes["num_workers"] and rung.changes["uint8_transfer"]
    full = ladder.rung_recipe(5)  # pinned memory needs a GPU: on the CPU rung 5 is skipped
    assert full.requires.cuda and not rung.requires.cuda
    assert "left out" not in rung.description
