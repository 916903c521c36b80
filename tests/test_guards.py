"""The correctness guard catches an optimization that changes what is trained."""

import pytest
import torch

from trainbench.core.setups import spec as spec_module
from trainbench.core.setups import data as data_module
from trainbench.core.setups import effects as effects_module
from trainbench.core.setups import training as training_module
from trainbench.core.setups.guards import compare_trajectories, loss_trajectory
from trainbench.core.setups.recipes import get_recipe


def test_compare_trajectories_reports_the_worst_step():
    verdict = compare_trajectories([2.0, 1.5, 1.2], [2.0, 1.5, 1.0], rtol=0.1)
    assert not verdict.ok
    assert verdict.max_rel_diff == pytest.approx(0.2)
    assert "worst relative difference 0.2 at step 2 (1.2 vs 1), tolerance 0.1" in verdict.message
    assert compare_trajectories([1.0, 1.0], [1.0, 1.0], rtol=0).ok


@pytest.mark.parametrize("recipe", ["uint8_transfer", "set_to_none", "multiprocess_loading", "amp_bf16"])
def test_sound_recipes_train_the_same_model(cpu, profile, mlp, recipe):
    r = get_recipe(recipe)
    base = loss_trajectory(get_recipe("baseline").config(profile), mlp, cpu)
    mine = loss_trajectory(r.config(profile), mlp, cpu)
    assert compare_trajectories(mine, base, r.loss_rtol).ok


def test_uint8_transfer_that_forgets_to_scale_fails_the_guard(cpu, profile, mlp, monkeypatch):
    monkeypatch.setattr(spec_module, "normalize_uint8", lambda images: (images.float() - 0.5) / 0.5)  # no /255
    r = get_recipe("uint8_transfer")
    base = loss_trajectory(get_recipe("baseline").config(profile), mlp, cpu)
    broken = loss_trajectory(r.config(profile), mlp, cpu)
    verdict = compare_trajectories(broken, base, r.loss_rtol)
    assert not verdict.ok and verdict.max_rel_diff > 0.01


def test_loader_that_reorders_batches_fails_the_guard(cpu, profile, mlp, monkeypatch):
    original = data_module.EndlessSampler.__init__

    def shifted_seed(self, length, seed=0):
        original(self, length, seed + 1)  # workers that read other samples than the baseline

    base = loss_trajectory(get_recipe("baseline").config(profile), mlp, cpu)
    monkeypatch.setattr(data_module.EndlessSampler, "__init__", shifted_seed)
    r = get_recipe("multiprocess_loading")
    broken = loss_trajectory(r.config(profile), mlp, cpu)
    assert not compare_trajectories(broken, base, r.loss_rtol).ok


def test_plugin_fails_a_case_whose_guard_fails(pytester, quick_options):
    pytester.makepyfile(test_broken="""
from trainbench.core.setups import spec

def test_broken_uint8(train_bench, monkeypatch):
    monkeypatch.setattr(spec, "normalize_uint8", lambda images: images.float())
    train_bench("uint8_transfer", "mlp")
""")
    result = pytester.runpytest(*quick_options)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([("*mlp-uint8_transfer: correctness guard (loss): loss vs baseline over 4 seeded steps: "
                                  "worst relative difference * tolerance 1e-06*")])


# -- the gradient guard: optimizations that promise the same gradients ------------------

def _grads(recipe_name, workload, cpu, profile, **overrides):
    from trainbench.core.setups.guards import first_step_gradients
    from trainbench.core.setups.workloads import resolve_spec

    return first_step_gradients(get_recipe(recipe_name).config(profile, **overrides), resolve_spec(workload, profile), cpu)


def _grad_verdict(recipe_name, workload, cpu, profile):
    from trainbench.core.setups.guards import compare_gradients

    r = get_recipe(recipe_name)
    return compare_gradients(_grads(recipe_name, workload, cpu, profile), _grads(r.baseline, workload, cpu, profile),
                             r.grad_rtol)


def test_accumulated_micro_batches_give_the_large_batch_gradients(cpu, profile):
    verdict = _grad_verdict("grad_accumulation", "mlp", cpu, profile)
    assert verdict.ok, verdict.message
    assert verdict.max_rel_diff < 1e-5


def test_accumulation_that_forgets_to_divide_the_loss_fails_the_guard(cpu, profile, monkeypatch):
    monkeypatch.setattr(training_module.TrainingSetup, "accumulation_weights", lambda self, micro_batches: None)
    verdict = _grad_verdict("grad_accumulation", "mlp", cpu, profile)
    assert not verdict.ok
    assert verdict.max_rel_diff == pytest.approx(3.0, rel=1e-3)  # 4 micro-batches summed, not averaged: 4x - 1
    assert "worst relative error" in verdict.message


def test_checkpointing_gives_identical_gradients(cpu, profile):
    verdict = _grad_verdict("checkpointing", "transformer", cpu, profile)
    assert verdict.ok, verdict.message


def test_checkpointing_that_drops_a_block_fails_the_guard(cpu, profile, monkeypatch):
    real = effects_module.enable_checkpointing

    def drops_first_block(model, names):
        real(model, names)
        model.get_submodule(names[0]).forward = lambda src, *args, **kwargs: src  # the block's output never computed

    monkeypatch.setattr(effects_module, "enable_checkpointing", drops_first_block)
    verdict = _grad_verdict("checkpointing", "transformer", cpu, profile)
    assert not verdict.ok
    assert "no gradient for encoder.layers.0" in verdict.message


def test_a_missing_all_reduce_fails_the_ddp_gradient_guard(cpu, profile):
    """One rank's gradients without the all-reduce (half the global batch) are not the global batch's."""
    from trainbench.core.setups.guards import compare_gradients

    one_process = _grads("one_process", "mlp", cpu, profile)  # the global batch of 32
    first_half = _grads("baseline", "mlp", cpu, profile)  # rank 0's 16 samples, never averaged with rank 1
    assert not compare_gradients(first_half, one_process, get_recipe("ddp_gloo").grad_rtol).ok


def test_fp16_without_a_scaler_loses_small_gradients_and_the_guard_shows_it(cpu, mlp):
    """The articles' AMP without GradScaler: fine on their loss scale, underflowing gradients on a small one."""
    import dataclasses

    from trainbench.core.setups.guards import compare_gradients, first_step_gradients
    from trainbench.core.setups.recipes import TrainConfig
    from trainbench.core.setups.spec import classification_loss

    tiny = dataclasses.replace(mlp, name="tiny_loss_mlp", loss_fn=lambda model, batch: classification_loss(model, batch) * 1e-6)
    fp32 = first_step_gradients(TrainConfig(), tiny, cpu)
    scaled = first_step_gradients(TrainConfig(amp="fp16", grad_scaler=True), tiny, cpu)
    unscaled = first_step_gradients(TrainConfig(amp="fp16"), tiny, cpu)
    recipe = get_recipe("amp_fp16_no_scaler")
    assert compare_gradients(scaled, fp32, recipe.grad_rtol, recipe.grad_measure).ok
    verdict = compare_gradients(unscaled, fp32, recipe.grad_rtol, recipe.grad_measure)
    assert not verdict.ok, verdict.message


def test_reduced_precision_is_judged_on_the_steps_direction_not_each_parameters_error():
    """fp16 leaves a BatchNorm bias's small, cancelling gradient far off while the step keeps its way; the
    direction measure passes that and fails a step that turned."""
    from trainbench.core.setups.guards import compare_gradients

    recipe = get_recipe("amp_fp16")
    assert recipe.grad_measure == "direction"
    base = {"conv.weight": torch.linspace(-1.0, 1.0, 1000), "bn.bias": torch.full((4,), 1e-3)}
    fp16 = {"conv.weight": base["conv.weight"] * 1.001, "bn.bias": base["bn.bias"] * 1.2}  # 20% off, a tiny tensor
    assert not compare_gradients(fp16, base, recipe.grad_rtol, "parameter").ok
    assert compare_gradients(fp16, base, recipe.grad_rtol, recipe.grad_measure).ok
    turned = {"conv.weight": base["conv.weight"].flip(0).roll(100), "bn.bias": base["bn.bias"]}
    verdict = compare_gradients(turned, base, recipe.grad_rtol, recipe.grad_measure)
    assert not verdict.ok and "1 - cosine" in verdict.message
    nan = {**fp16, "bn.bias": torch.full((4,), float("nan"))}
    assert not compare_gradients(nan, base, recipe.grad_rtol, recipe.grad_measure).ok


def test_a_nan_loss_or_gradient_fails_the_guard():
    import torch

    from trainbench.core.setups.guards import compare_gradients

    assert not compare_trajectories([1.0, float("nan")], [1.0, 1.0], rtol=0.5).ok
    assert not compare_trajectories([float("nan"), 1.0], [1.0, 1.0], rtol=0.5).ok
    base = {"w": torch.ones(3), "b": torch.ones(1)}
    verdict = compare_gradients({"w": torch.tensor([1.0, float("nan"), 1.0]), "b": torch.ones(1)}, base, rtol=1.0)
    assert not verdict.ok and "(w)" in verdict.message


class _Fp16Gradient(torch.autograd.Function):
    """Identity forward; backward passes the incoming gradient through fp16, as an fp16 activation's gradient
    would go (above 65504 it is inf), and records it."""

    seen: list[float] = []

    @staticmethod
    def forward(ctx, t):
        return t.view_as(t)

    @staticmethod
    def backward(ctx, grad):
        _Fp16Gradient.seen.append(float(grad))
        return grad.half().float()


def test_the_gradient_guard_compares_the_step_the_grad_scaler_takes_not_one_it_skips(cpu, mlp):
    import dataclasses

    from trainbench.core.setups.guards import compare_gradients, first_step_gradients
    from trainbench.core.setups.recipes import TrainConfig
    from trainbench.core.setups.spec import classification_loss

    # 4 x the loss scale reaches the fp16 cast: 2**18, 2**17, 2**16 overflow (found_inf: the scaler skips the
    # step and halves its scale), 2**15 does not.
    overflowing = dataclasses.replace(
        mlp, name="overflowing_mlp", loss_fn=lambda model, batch: _Fp16Gradient.apply(classification_loss(model, batch)) * 4)
    fp32 = first_step_gradients(TrainConfig(), overflowing, cpu)
    _Fp16Gradient.seen.clear()
    scaled = first_step_gradients(TrainConfig(amp="fp16", grad_scaler=True), overflowing, cpu)
    assert _Fp16Gradient.seen == [2.0**18, 2.0**17, 2.0**16, 2.0**15]
    recipe = get_recipe("amp_fp16")
    verdict = compare_gradients(scaled, fp32, recipe.grad_rtol, recipe.grad_measure)
    assert verdict.ok, verdict.message


def test_a_step_the_grad_scaler_would_skip_forever_fails_the_gradient_guard(cpu, mlp, monkeypatch):
    import dataclasses

    from trainbench.core.setups import guards
    from trainbench.core.setups.recipes import TrainConfig
    from trainbench.core.setups.spec import classification_loss

    monkeypatch.setattr(guards, "MAX_SKIPPED_STEPS", 2)
    always_inf = dataclasses.replace(
        mlp, name="inf_mlp", loss_fn=lambda model, batch: classification_loss(model, batch) * torch.tensor(float("inf")))
    fp32 = guards.first_step_gradients(TrainConfig(), mlp, cpu)
    scaled = guards.first_step_gradients(TrainConfig(amp="fp16", grad_scaler=True), always_inf, cpu)
    verdict = guards.compare_gradients(scaled, fp32, get_recipe("amp_fp16").grad_rtol, get_recipe("amp_fp16").grad_measure)
    assert not verdict.ok and verdict.max_rel_diff == float("inf")


@pytest.mark.parametrize("zero_grad", ["zeros", "set_to_none"])
def test_one_setup_gives_the_first_gradients_and_losses_each_would_alone(cpu, profile, mlp, zero_grad):
    # The first step's gradients are kept while training goes on: zeroing gradients in place (the baseline's "zeros")
    # must not change what was kept, nor the losses differ from a setup that only trains.
    from trainbench.core.setups.guards import first_step_gradients, seeded_run

    config = get_recipe("baseline").config(profile, zero_grad=zero_grad)
    run = seeded_run(config, mlp, cpu, losses=True, gradients=True)
    alone = first_step_gradients(config, mlp, cpu)
    assert run.gradients.keys() == alone.keys()
    assert all(torch.equal(run.gradients[name], alone[name]) for name in alone)
    assert run.losses == loss_trajectory(config, mlp, cpu)
