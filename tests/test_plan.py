"""Planning a case before anything is built: its baseline, whether it can run here, its budget and how it is measured."""

import dataclasses

import pytest
import torch

from trainbench.core.records.budgets import Budgets
from trainbench.core.analyses.plan import ALONE, BASELINE_AFTER, FRESH_PROCESSES, PAIRED, Planner, interleave_blocker
from trainbench.core.analyses.predict import PredictionCache
from trainbench.core.setups.recipes import ConfigError, TrainConfig
from trainbench.devices.device import CpuBackend

GiB = 2**30


def _planner(backend, profile, predictions=None):
    return Planner(backend, backend.caps(), profile, predictions or PredictionCache(backend))


@pytest.fixture
def budgets(tmp_path):
    """A ratio budget for set_to_none, deterministic and ddp_gloo; an absolute one for optimizer_foreach."""
    path = tmp_path / "budgets.toml"
    path.write_text('[cpu."mlp-set_to_none"]\nmax_ops_per_step_ratio = 0.99\n'
                    '[cpu."mlp-deterministic"]\nmax_ops_per_step_ratio = 1.5\n'
                    '[cpu."mlp-ddp_gloo"]\nmax_ops_per_step_ratio = 1.5\n'
                    '[cpu."mlp-optimizer_foreach"]\nmax_ops_per_step = 1e9\n')
    return Budgets.load(path)


class _FreshForDeterministic(CpuBackend):
    def __init__(self):
        super().__init__(torch.device("cpu"))

    def fresh_process_reason(self, config):
        return "the library reads its setting once" if config.deterministic else None




# -- how the case and its baseline are measured ----------------------------------------------------

def test_without_a_ratio_budget_the_case_is_measured_alone(cpu, profile, budgets):
    plan = _planner(cpu, profile).plan("set_to_none", "mlp")
    assert (plan.case, plan.baseline.name, plan.measuring, plan.skipped) == ("mlp-set_to_none", "baseline", ALONE, None)
    assert plan.budget is None and plan.budget_missing.startswith("no budget: no budgets file configured")
    absolute = _planner(cpu, profile).plan("optimizer_foreach", "mlp", budgets=budgets)
    assert absolute.budget is not None and absolute.measuring == ALONE  # no ratio: its baseline is not needed


def test_a_case_an_entry_nearly_names_must_have_a_budget(cpu, profile, tmp_path):
    path = tmp_path / "budgets.toml"
    path.write_text('[cpu."mlp-set_to_nnoe"]\nmax_ops_per_step = 3\n[cpu."mlp-optimzer_forech"]\nmax_ops_per_step = 3\n')
    planner = _planner(cpu, profile)
    typo = planner.plan("optimizer_foreach", "mlp", budgets=Budgets.load(path))
    assert typo.budget is None and typo.budget_required and typo.outcome().budget_required
    assert typo.budget_missing.startswith('no budget for mlp-optimizer_foreach, and [cpu."mlp-optimzer_forech"] of ')
    unrelated = planner.plan("baseline", "mlp", budgets=Budgets.load(path))  # no entry near its id: it runs unbudgeted
    assert unrelated.budget is None and not unrelated.budget_required


def test_a_ratio_budget_pairs_the_case_with_its_baseline(cpu, profile, budgets):
    plan = _planner(cpu, profile).plan("set_to_none", "mlp", budgets=budgets)
    assert plan.measuring == PAIRED and plan.why_measuring is None
    assert plan.budget.needs_baseline and plan.budget_missing is None


def test_a_setup_that_cannot_share_the_process_has_its_baseline_measured_right_after(cpu, profile, budgets):
    planner = _planner(cpu, profile)
    flips = planner.plan("deterministic", "mlp", budgets=budgets)
    assert (flips.measuring, flips.why_measuring) == (BASELINE_AFTER, "deterministic changes process-wide state")
    ranks = planner.plan("ddp_gloo", "mlp", budgets=budgets)
    assert (ranks.measuring, ranks.why_measuring) == (BASELINE_AFTER, "DDP ranks run in other processes")


def test_a_setup_the_device_must_start_afresh_goes_to_fresh_processes_budget_or_not(profile, budgets):
    planner = _planner(_FreshForDeterministic(), profile)
    for given in (None, budgets):
        plan = planner.plan("deterministic", "mlp", budgets=given)
        assert (plan.measuring, plan.why_measuring) == (FRESH_PROCESSES, "the library reads its setting once")
    assert planner.plan("set_to_none", "mlp", budgets=budgets).measuring == PAIRED


def test_what_keeps_a_setup_from_sharing_the_process_with_another():
    assert interleave_blocker(TrainConfig()) is None
    assert interleave_blocker(TrainConfig(cudnn_benchmark=True)) == "cudnn_benchmark changes process-wide state"
    assert interleave_blocker(TrainConfig(empty_cache=True)) == "empty_cache changes process-wide state"
    assert interleave_blocker(TrainConfig(debug="anomaly")) == "debug changes process-wide state"
    assert interleave_blocker(TrainConfig(parallel="fsdp", world_size=2)) == "FSDP ranks run in other processes"


# -- can it run here ---------------------------------------------------------------------------------

def test_a_case_then_its_baseline_must_be_able_to_run_here(cpu, profile, budgets):
    planner = _planner(cpu, profile)
    own = planner.plan("pinned_memory", "mlp", budgets=budgets)
    assert own.skipped == f"pinned_memory: needs a CUDA device; this run uses cpu ({cpu.name})"
    assert own.budget is None and own.budget_missing is None  # a skipped case looks no budget up
    base = planner.plan("set_to_none", "mlp", baseline="pinned_memory")
    assert base.skipped == f"set_to_none: its baseline pinned_memory: needs a CUDA device; this run uses cpu ({cpu.name})"
    outcome = base.outcome()
    assert outcome.skipped == base.skipped and outcome.result is None and outcome.baseline_recipe.name == "pinned_memory"


def test_both_setups_must_fit_the_devices_memory_the_case_first(profile, device_of_memory):
    asked = []

    def predictions(profile_name, config, spec):
        asked.append(config.zero_grad)
        return {"breakdown_bytes": {"total": 4 * GiB if config.zero_grad == "zeros" else 2**20}}

    backend = device_of_memory(GiB)
    plan = _planner(backend, profile, predictions).plan("set_to_none", "mlp")
    assert plan.skipped == (f"baseline: needs ~5.0 GiB (predicted tensor peak 4.0 GiB + 25% for the allocator and "
                            f"workspaces); {backend.name} has 1.0 GiB")  # built side by side, so both must fit
    assert asked == ["set_to_none", "zeros"]


def test_a_device_without_a_memory_limit_predicts_nothing(cpu, profile):
    plan = _planner(cpu, profile, lambda *args: pytest.fail("predicted without a memory limit")).plan("larger_batch", "mlp")
    assert plan.skipped is None


def test_an_override_that_would_cancel_the_recipe_is_an_error(cpu, profile):
    with pytest.raises(ConfigError, match="would cancel recipe 'set_to_none'"):
        _planner(cpu, profile).plan("set_to_none", "mlp", overrides={"zero_grad": "zeros"})


# -- what the two are judged on ------------------------------------------------------------------------

def test_a_compute_recipe_and_its_baseline_are_judged_on_device_side_batches(cpu, profile):
    device_side = dataclasses.replace(profile, compute_data="device")  # as the GPU profile judges
    plan = _planner(cpu, device_side).plan("set_to_none", "mlp", overrides={"batch_size": 8})
    assert plan.overrides == {"synthetic": "device", "batch_size": 8}
    assert plan.config.synthetic == plan.baseline_config.synthetic == "device"
    assert plan.notes[0].startswith("judged against baseline with both on device-side synthetic batches")
    # a ladder climbs from its loader-bound rung 0; a data-path recipe keeps the loader it changes
    assert _planner(cpu, device_side).plan("set_to_none", "mlp", ladder={"name": "x"}).judged_on == {}
    assert _planner(cpu, device_side).plan("uint8_transfer", "mlp").judged_on == {}


def test_a_case_and_its_baseline_that_fit_only_one_at_a_time_are_not_interleaved(profile, budgets, device_of_memory):
    def predictions(profile_name, config, spec):  # 0.5 GiB each: one fits 1 GiB with headroom, both do not
        return {"breakdown_bytes": {"total": GiB // 2}}

    backend = device_of_memory(GiB)
    plan = _planner(backend, profile, predictions).plan("set_to_none", "mlp", budgets=budgets)
    assert plan.skipped is None and plan.measuring == BASELINE_AFTER
    assert plan.why_measuring == ("set_to_none and its baseline baseline alive together: needs ~1.2 GiB (predicted "
                                  f"tensor peaks 0.5 + 0.5 GiB + 25% for the allocator and workspaces); {backend.name} "
                                  "has 1.0 GiB")
    roomy = _planner(device_of_memory(2 * GiB), profile, predictions).plan("set_to_none", "mlp", budgets=budgets)
    assert roomy.measuring == PAIRED  # the sum fits: interleaved as before


def test_a_case_measured_with_its_baseline_after_says_why_in_its_result(profile, quick, device_of_memory, budgets):
    from trainbench.core.method.runner import Runner

    runner = Runner(device_of_memory(GiB), profile, quick, predict=False)
    runner.planner.predictions = lambda profile_name, config, spec: {"breakdown_bytes": {"total": GiB // 2}}
    outcome = runner.run("set_to_none", "mlp", budgets=budgets)
    assert outcome.error is None and not outcome.paired and outcome.baseline is not None
    [note] = [n for n in outcome.result.notes if n.startswith("baseline baseline measured right after")]
    assert "alive together: needs ~1.2 GiB" in note
