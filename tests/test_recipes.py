"""Recipes: the knobs a configuration accepts, what a spec lacks for them, how recipes compose and take overrides,
and which batches a case and its baseline are judged on (whether a case can run on a device: test_eligibility)."""

import dataclasses
import functools

import pytest
import torch

from trainbench.core.setups.recipes import (
    ByProfile,
    ConfigError,
    Recipe,
    Requirements,
    TrainConfig,
    compose,
    get_recipe,
    judging_overrides,
    spec_unmet,
)
from trainbench.core.setups.workloads import PROFILES, resolve_spec


def test_config_rejects_knob_combinations_that_make_no_sense():
    with pytest.raises(ValueError, match="world_size > 1 goes with parallel='ddp'"):
        TrainConfig(world_size=2).validate()
    with pytest.raises(ValueError, match="channels_last_input needs uint8_transfer"):
        TrainConfig(channels_last_input=True).validate()
    with pytest.raises(ValueError, match="zero_grad must be one of"):
        TrainConfig(zero_grad="nothing").validate()


def test_replicas_go_with_data_parallel_only(profile):
    with pytest.raises(ConfigError, match="replicas > 1 goes with parallel='dp'"):
        TrainConfig(replicas=2).validate()
    with pytest.raises(ConfigError, match="replicas > 1 goes with parallel='dp'"):
        TrainConfig(parallel="dp").validate()  # DataParallel over one GPU is no data parallelism
    config = get_recipe("data_parallel").config(profile)
    assert (config.parallel, config.replicas, config.world_size) == ("dp", 2, 1)


# -- which batches a case and its baseline are judged on ----------------------------------------------

GPU = PROFILES["gpu"]


@pytest.fixture(scope="module")
def gpu_resnet18():
    return resolve_spec("resnet18", GPU)  # a spec only: no model is built


def _judging(recipe, spec, profile=GPU, overrides=None):
    recipe = get_recipe(recipe)
    return judging_overrides(recipe, get_recipe(recipe.baseline), profile, spec, overrides or {})


@pytest.mark.parametrize("recipe", ["amp_fp16", "channels_last", "cudnn_benchmark", "set_to_none"])
def test_compute_recipes_are_judged_on_device_side_batches_on_the_gpu_profile(recipe, gpu_resnet18):
    assert GPU.compute_data == "device"
    assert _judging(recipe, gpu_resnet18) == {"synthetic": "device"}


@pytest.mark.parametrize("recipe", ["pinned_memory", "multiprocess_loading", "uint8_transfer", "device_tensors",
                                    "channels_last_input"])
def test_data_path_recipes_keep_the_loader(recipe, gpu_resnet18):
    assert _judging(recipe, gpu_resnet18) == {}


@pytest.mark.parametrize("recipe", ["ddp", "fsdp"])
def test_ddp_and_fsdp_are_judged_on_the_same_device_side_batches_as_their_baseline(recipe, gpu_resnet18):
    # On the loader DataParallel's one process would decode the global batch while each rank decodes its half
    # in parallel: the ratio would measure image decoding, not the parallelism.
    judged = _judging(recipe, gpu_resnet18)
    assert judged == {"synthetic": "device"}
    case, base = get_recipe(recipe), get_recipe(get_recipe(recipe).baseline)
    sides = [r.config(GPU, **judged) for r in (case, base)]
    assert {(c.synthetic, c.num_workers, c.pin_memory) for c in sides} == {("device", 0, False)}
    assert spec_unmet(gpu_resnet18, sides[0]) is None  # each rank makes its slice of the global batch


@pytest.mark.parametrize("recipe", ["amp_fp16", "channels_last", "set_to_none", "pinned_memory"])
def test_the_cpu_profile_keeps_the_loader_for_every_recipe(recipe):
    cpu_profile = PROFILES["cpu"]
    assert cpu_profile.compute_data is None
    assert _judging(recipe, resolve_spec("resnet18", cpu_profile), cpu_profile) == {}


def test_an_explicit_synthetic_override_is_left_as_given(gpu_resnet18):
    assert _judging("amp_fp16", gpu_resnet18, overrides={"synthetic": "host"}) == {}
    assert _judging("amp_fp16", gpu_resnet18, overrides={"synthetic": "device"}) == {}


def test_a_spec_without_a_batch_factory_keeps_its_loader(gpu_resnet18):
    loader_only = dataclasses.replace(gpu_resnet18, name="resnet18_loader_only", batches=None)
    assert _judging("amp_fp16", loader_only) == {}


@pytest.mark.parametrize("overrides", [{"num_workers": 4}, {"pin_memory": True}])
def test_a_users_loader_override_keeps_the_loader(overrides, gpu_resnet18):
    assert _judging("amp_fp16", gpu_resnet18, overrides=overrides) == {}


def test_merged_requirements_keep_the_strictest_of_each():
    merged = Requirements(min_capability=(7, 0), min_gpus=2).merge(Requirements(min_capability=(8, 0), bf16=True))
    assert merged == Requirements(min_capability=(8, 0), min_gpus=2, bf16=True)
    assert merged.needs_cuda and not Requirements(bf16=True, gpu_capability=(8, 0)).needs_cuda


def test_spec_unmet_names_what_the_spec_lacks_for_the_knobs(profile):
    transformer = resolve_spec("transformer", profile)
    assert spec_unmet(transformer, TrainConfig(uint8_transfer=True)).startswith(
        "the spec's dataset serves no uint8 pixels")
    assert spec_unmet(transformer, TrainConfig(checkpointing=True)) is None
    without_dataset = dataclasses.replace(transformer, dataset=None)
    assert spec_unmet(without_dataset, TrainConfig(num_workers=2)).startswith("the spec has no dataset")
    plain_sgd = dataclasses.replace(transformer, optimizer=lambda params: torch.optim.SGD(params, lr=0.1))
    assert "takes no fused= argument" in spec_unmet(plain_sgd, TrainConfig(optimizer_impl="fused"))


@pytest.mark.parametrize(("knobs", "message"), [
    ({"batch_size": 0}, "batch_size must be a positive int, got 0"),
    ({"batch_size": True}, "batch_size must be a positive int, got True"),
    ({"num_workers": -1}, "num_workers must be an int >= 0, got -1"),
    ({"accumulation_steps": 0}, "accumulation_steps must be an int >= 1, got 0"),
    ({"loader_timeout_s": 0}, "loader_timeout_s must be a number of seconds > 0, got 0"),
    ({"amp": "fp8"}, "amp must be one of (None, 'fp16', 'bf16'), got 'fp8'"),
    ({"grad_scaler": True}, "grad_scaler=True needs amp set"),
    ({"eval_mode": "no_grad", "accumulation_steps": 2}, "eval_mode runs forward only"),
    ({"synthetic": "host", "num_workers": 2}, "synthetic batches bypass the DataLoader"),
    ({"conv_bias": True}, "conv_bias must be one of (None, 'add', 'remove'), got True"),
])
def test_config_rejects_values_out_of_range_naming_the_knob(knobs, message):
    with pytest.raises(ConfigError) as raised:
        TrainConfig(**knobs).validate()
    assert str(raised.value).startswith(message)


def test_a_rank_config_is_the_global_batch_in_one_process():
    ddp = TrainConfig(parallel="ddp", world_size=2, dist_backend="gloo", batch_multiplier=2)
    assert ddp.rank_processes and not TrainConfig(parallel="dp", replicas=2).rank_processes
    # each rank's share a micro-batch of its own: DDP averages the ranks' gradients, each over its own samples
    assert ddp.one_process_equivalent() == TrainConfig(batch_multiplier=4, accumulation_steps=2)
    assert TrainConfig().one_process_equivalent() == TrainConfig()
    # a one-process baseline judged against two ranks is split as they split it; DataParallel's replicas likewise
    assert TrainConfig(batch_multiplier=2).one_process_equivalent(2) == TrainConfig(batch_multiplier=2,
                                                                                    accumulation_steps=2)
    dp = TrainConfig(parallel="dp", replicas=2, batch_multiplier=2)
    assert dp.one_process_equivalent() == TrainConfig(batch_multiplier=2, accumulation_steps=2)


def test_a_recipe_changes_only_known_knobs_and_picks_values_by_profile():
    with pytest.raises(ConfigError, match=r"recipe 'typo' changes unknown knobs \['zero_grads'\]"):
        Recipe("typo", "a misspelt knob", {"zero_grads": "set_to_none"})
    workers = Recipe("workers", "per profile", {"num_workers": ByProfile(cpu=2, gpu=8)})
    assert workers.config(PROFILES["cpu"]).num_workers == 2 and workers.config(PROFILES["gpu"]).num_workers == 8


def test_an_override_composes_with_a_recipe_and_one_that_would_cancel_it_is_refused(profile):
    larger = get_recipe("larger_batch")
    config = larger.config(profile, batch_size=8)
    assert (config.batch_size, config.batch_multiplier) == (8, 4)  # 4x the overridden batch
    assert larger.config(profile, batch_multiplier=4).batch_multiplier == 4  # the recipe's own value: no conflict
    with pytest.raises(ConfigError, match="the override batch_multiplier=1 would cancel recipe 'larger_batch'"):
        larger.config(profile, batch_multiplier=1)
    with pytest.raises(ConfigError, match=r"unknown override \['batch'\]"):
        larger.config(profile, batch=8)


def test_composed_recipes_apply_in_order_and_need_all_their_parts_need():
    amp, larger, fp16 = get_recipe("amp_bf16"), get_recipe("larger_batch"), get_recipe("amp_fp16")
    rung = compose("rung", amp, larger, fp16)
    assert rung.changes["amp"] == "fp16" and rung.changes["grad_scaler"] is True  # the later recipe wins
    assert rung.changes["batch_multiplier"] == larger.changes["batch_multiplier"]
    assert rung.requires == amp.requires.merge(fp16.requires) and rung.description == "amp_bf16 + larger_batch + amp_fp16"
    assert rung.loss_rtol is None  # larger_batch is unguarded: so is the whole rung
    assert compose("guarded", amp, fp16).loss_rtol == max(amp.loss_rtol, fp16.loss_rtol)
    slow = compose("slow", amp, get_recipe("compile"))
    assert slow.slow and slow.extra_warmup_steps == get_recipe("compile").extra_warmup_steps


def test_an_unknown_recipe_name_lists_the_known_ones():
    with pytest.raises(KeyError, match="unknown recipe 'no_such_recipe': expected one of .*'baseline'"):
        get_recipe("no_such_recipe")


# -- the convolution-bias recipes: removal on a model with biases, the seeds' comparison on one without --------------------

def _conv_spec(bias: bool):
    from trainbench.core.setups.spec import TrainingSpec, classification_loss

    def model():
        return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, bias=bias), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                   torch.nn.Conv2d(8, 8, 3, bias=bias), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                   torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 2))

    def batches(n, gen):
        return torch.randn(n, 3, 12, 12, generator=gen), torch.randint(0, 2, (n,), generator=gen)

    return TrainingSpec(name=f"convs_bias_{bias}", model=model, loss_fn=classification_loss, batch_size=8,
                        batches=batches, optimizer=functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9))


def _sides(name, spec, cpu, profile):
    """The numbers of parameters of the recipe's model and of its baseline's, and the loss guard's verdict."""
    from trainbench.core.setups.guards import compare_trajectories, loss_trajectory
    from trainbench.core.setups.training import TrainingSetup

    recipe = get_recipe(name)
    configs = [recipe.config(profile), get_recipe(recipe.baseline).config(profile)]
    sizes = []
    for config in configs:
        with TrainingSetup(config, spec, cpu) as setup:
            sizes.append(sum(p.numel() for p in setup.model.parameters()))
    mine, base = (loss_trajectory(config, spec, cpu) for config in configs)
    return sizes, compare_trajectories(mine, base, recipe.loss_rtol)


def test_no_conv_bias_removes_a_models_biases_before_its_norms_against_the_model_as_given(cpu, profile):
    spec = _conv_spec(bias=True)
    as_given = sum(p.numel() for p in spec.model().parameters())
    (removed, base), guard = _sides("no_conv_bias", spec, cpu, profile)
    assert get_recipe("no_conv_bias").baseline == "baseline" and base == as_given and removed == as_given - 16
    assert guard.ok  # the BatchNorms cancel the biases: the same training


def test_conv_bias_free_compares_a_bias_free_model_with_the_seeds_redundant_biases(cpu, profile):
    spec = _conv_spec(bias=False)
    as_given = sum(p.numel() for p in spec.model().parameters())
    (mine, with_biases), guard = _sides("conv_bias_free", spec, cpu, profile)
    assert mine == as_given and with_biases == as_given + 16 and guard.ok


@pytest.mark.parametrize(("recipe", "bias", "reason"), [
    # Neither recipe measures a model against itself: each says what the other one measures.
    ("no_conv_bias", False, "the model's convolutions have no bias already: nothing to remove (recipe conv_bias_free "
                            "measures them as they are against conv_bias's added biases)"),
    ("conv_bias_free", True, "every convolution of the model has a bias already: nothing to add"),
])
def test_the_conv_bias_recipe_that_would_compare_a_model_with_itself_is_not_applicable(recipe, bias, reason, cpu, profile):
    from trainbench.core.setups.recipes import NotApplicable
    from trainbench.core.setups.training import TrainingSetup

    r = get_recipe(recipe)
    with pytest.raises(NotApplicable) as raised:
        for config in (r.config(profile), get_recipe(r.baseline).config(profile)):
            TrainingSetup(config, _conv_spec(bias), cpu).close()
    assert str(raised.value) == reason
