"""The correctness guard catches an optimization that changes what is trained."""

import pytest

from trainbench import step as step_module
from trainbench.guards import compare_trajectories, loss_trajectory
from trainbench.recipes import get_recipe


def test_compare_trajectories_reports_the_worst_step():
    verdict = compare_trajectories([2.0, 1.5, 1.2], [2.0, 1.5, 1.0], rtol=0.1)
    assert not verdict.ok
    assert verdict.max_rel_diff == pytest.approx(0.2)
    assert "worst relative difference 0.2 at step 2 (1.2 vs 1), tolerance 0.1" in verdict.message
    assert compare_trajectories([1.0, 1.0], [1.0, 1.0], rtol=0).ok


@pytest.mark.parametrize("recipe", ["uint8_transfer", "set_to_none", "multiprocess_loading", "amp_bf16"])
def test_sound_recipes_train_the_same_model(cpu, profile, recipe):
    r = get_recipe(recipe)
    base = loss_trajectory(get_recipe("baseline").config(profile, workload="mlp"), cpu, profile)
    mine = loss_trajectory(r.config(profile, workload="mlp"), cpu, profile)
    assert compare_trajectories(mine, base, r.loss_rtol).ok


def test_uint8_transfer_that_forgets_to_scale_fails_the_guard(cpu, profile, monkeypatch):
    monkeypatch.setattr(step_module, "normalize_uint8", lambda images: (images.float() - 0.5) / 0.5)  # no /255
    r = get_recipe("uint8_transfer")
    base = loss_trajectory(get_recipe("baseline").config(profile, workload="mlp"), cpu, profile)
    broken = loss_trajectory(r.config(profile, workload="mlp"), cpu, profile)
    verdict = compare_trajectories(broken, base, r.loss_rtol)
    assert not verdict.ok and verdict.max_rel_diff > 0.01


def test_loader_that_reorders_batches_fails_the_guard(cpu, profile, monkeypatch):
    original = step_module.EndlessSampler.__init__

    def shifted_seed(self, length, seed=0):
        original(self, length, seed + 1)  # workers that read other samples than the baseline

    base = loss_trajectory(get_recipe("baseline").config(profile, workload="mlp"), cpu, profile)
    monkeypatch.setattr(step_module.EndlessSampler, "__init__", shifted_seed)
    r = get_recipe("multiprocess_loading")
    broken = loss_trajectory(r.config(profile, workload="mlp"), cpu, profile)
    assert not compare_trajectories(broken, base, r.loss_rtol).ok


def test_plugin_fails_a_case_whose_guard_fails(pytester):
    pytester.makepyfile(test_broken="""
from trainbench import step as step_module

def test_broken_uint8(train_bench, monkeypatch):
    monkeypatch.setattr(step_module, "normalize_uint8", lambda images: images.float())
    train_bench("uint8_transfer", workload="mlp")
""")
    result = pytester.runpytest("--trainbench-device=cpu", "--trainbench-rounds=2", "--trainbench-steps-per-round=2",
                                "--trainbench-min-warmup=1", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*mlp-uint8_transfer: correctness guard (loss): loss vs baseline over 4 seeded steps: "
                                 "worst relative difference * tolerance 1e-06*"])
