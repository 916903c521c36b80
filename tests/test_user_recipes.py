"""A user's own recipe is one entry, as a built-in one: a knob with its effect, a recipe with its guard, found by name,
run on the suite's specs, gone with the session that registered it."""

import pytest

from trainbench.core.setups.recipes import RECIPES, ConfigError, TrainConfig, get_recipe, register_knob

# The test module a user writes: a knob of their own and a recipe turning it, run on a spec of the suite. The
# planted one perturbs the model it is given: its guard must fail it, as a built-in recipe's would.
USER_MODULE = '''
import pytest
import torch

import trainbench

trainbench.knob("offload_activations", False, forward=lambda setup, on: torch.autograd.graph.save_on_cpu())
trainbench.recipe("activation_offload", "activations saved for backward kept in host memory",
                  {"offload_activations": True}, loss_rtol=1e-6, grad_rtol=1e-6)


def scaled(setup, model, factor):
    with torch.no_grad():
        next(model.parameters()).mul_(factor)
    return model


trainbench.knob("first_weight_scale", 1.0, model=scaled)
trainbench.recipe("scaled_weights", "the first weight scaled: trains another model", {"first_weight_scale": 1.5},
                  loss_rtol=1e-6)
trainbench.recipe("offload_on_gpus", "as activation_offload, where a GPU holds the activations",
                  {"offload_activations": True}, requires=trainbench.Requirements(cuda=True))


@pytest.mark.parametrize("recipe", ["activation_offload", "scaled_weights", "offload_on_gpus"])
def test_own_recipe(train_bench, recipe):
    train_bench(recipe, "gelu_mlp", batch_size=8)  # a small batch: what is checked is the guard, not the speed
'''


def test_a_users_recipe_with_a_new_knob_runs_with_its_guard_on_a_suite_spec(pytester, quick_options):
    pytester.makepyfile(test_own=USER_MODULE)
    result = pytester.runpytest(*quick_options, "-rsf", "--benchmark-json=run.json")
    result.assert_outcomes(passed=1, failed=1, skipped=1)
    out = result.stdout.str()
    # the planted effect changed what is trained: its loss guard says so and fails the case
    assert "test_own_recipe[scaled_weights]" in out and "loss vs baseline" in out
    assert "SKIPPED" in out and "offload_on_gpus" in out and "CUDA" in out
    import json

    [offloaded] = [b for b in json.loads((pytester.path / "run.json").read_text())["benchmarks"]
                   if b["name"] == "test_own_recipe[activation_offload]"]
    guard = offloaded["extra_info"]["guard"]
    assert guard["baseline"] == "baseline"
    assert {(c["kind"], c["ok"]) for c in guard["checks"]} == {("loss", True), ("gradients", True)}
    assert offloaded["extra_info"]["config"]["offload_activations"] is True  # the knob is in the record
    # The session's registrations ended with it: nothing of them is left in this process
    with pytest.raises(KeyError, match="unknown recipe 'activation_offload'"):
        get_recipe("activation_offload")
    with pytest.raises(ConfigError, match="unknown knobs"):
        TrainConfig.of(offload_activations=True)


def test_a_users_knob_is_read_as_a_built_in_one_and_records_only_when_turned():
    from trainbench.core.setups import recipes

    saved = recipes.user_entries()
    try:
        register_knob("fancy", 0, choices=(0, 1, 2), model=lambda setup, model, value: model)
        register_knob("fancy", 0, choices=(0, 1, 2), model=lambda setup, model, value: model)  # imported again
        config = TrainConfig.of(fancy=2)
        assert config.value("fancy") == 2 and config.record()["fancy"] == 2
        assert [name for name, _, _ in config.effects("model")] == ["fancy"]
        assert "fancy" not in TrainConfig().record() and TrainConfig.of(fancy=0) == TrainConfig()
        with pytest.raises(ConfigError, match="fancy must be one of"):
            TrainConfig.of(fancy=3).validate()
        assert TrainConfig.of(**config.record()) == config  # as a child process reads it back
    finally:
        recipes.restore_user_entries(saved)


@pytest.mark.parametrize("name, entries, says", [
    ("amp", {}, "expected a new identifier"),  # a built-in knob's name
    ("not a name", {}, "expected a new identifier"),
    ("odd", {"stage": lambda *a: None}, "unknown entries ['stage']"),
])
def test_a_users_knob_that_cannot_be_one_is_refused_in_one_line(name, entries, says):
    with pytest.raises(ConfigError, match=says.replace("[", r"\[").replace("]", r"\]")):
        register_knob(name, False, **entries)


def test_a_users_recipe_cannot_take_a_built_in_name():
    from trainbench.core.setups.recipes import new_recipe

    with pytest.raises(ConfigError, match="is a built-in recipe"):
        new_recipe("amp_bf16", "mine", {"amp": "bf16"})
    assert "amp_bf16" in RECIPES


def test_a_users_knob_acts_at_each_stage_it_names_in_the_stated_order(cpu, profile):
    import contextlib

    from trainbench.core.setups import recipes
    from trainbench.core.setups.training import TrainingSetup
    from trainbench.core.setups.workloads import resolve_spec

    seen = []

    @contextlib.contextmanager
    def for_its_life(setup, value):
        seen.append(("process", value))
        yield "held"
        seen.append(("closed", value))

    saved = recipes.user_entries()
    try:
        register_knob("traced", 0, process=for_its_life,
                      model=lambda setup, model, value: seen.append(("model", setup.entered["traced"])) or model,
                      batch=lambda setup, batch, value: seen.append(("batch", value)) or batch,
                      forward=lambda setup, value: seen.append(("forward", value)) or contextlib.nullcontext(),
                      after_step=lambda setup, loss, value: seen.append(("after_step", value)))
        with TrainingSetup(TrainConfig.of(traced=3), resolve_spec("mlp", profile), cpu) as training:
            training.step(training.fetch(training.batches()))
        assert seen == [("process", 3), ("model", "held"), ("batch", 3), ("forward", 3), ("after_step", 3),
                        ("closed", 3)]
        seen.clear()
        with TrainingSetup(TrainConfig(), resolve_spec("mlp", profile), cpu) as training:  # at its default: no effect
            training.step(training.fetch(training.batches()))
        assert seen == []
    finally:
        recipes.restore_user_entries(saved)
