"""The training step: each knob of a config taking effect on a spec's model, loader and optimizer, what the step
leaves behind, and the setups that cannot apply saying what is missing."""

import dataclasses
import functools

import pytest
import torch
import torch._dynamo
from torch import nn

from trainbench.core.setups import training as training_module
from trainbench.core.setups.recipes import NotApplicable, TrainConfig, get_recipe
from trainbench.core.method.runner import Runner
from trainbench.core.setups.spec import SpecError, TrainingSpec, classification_loss
from trainbench.core.setups import data as data_module
from trainbench.core.setups import effects as effects_module
from trainbench.core.setups.effects import module_to
from trainbench.core.setups.training import TrainingSetup
from trainbench.core.setups.workloads import resolve_spec
from trainbench.devices.device import CpuBackend


def test_endless_loader_survives_epoch_boundaries(training, profile):
    with training(batch_size=512) as setup:
        it = setup.batches()
        steps = profile.dataset_size // 512 * 3  # three epochs on one iterator
        for _ in range(steps):
            inputs, _ = next(it)
            assert inputs.shape[0] == 512


def test_conv_bias_before_batchnorm_adds_one_bias_per_convolution(profile):
    from trainbench.core.setups.effects import add_conv_bias
    from trainbench.core.setups.workloads import resolve_spec

    model = resolve_spec("resnet18", profile).model()
    before = sum(p.numel() for p in model.parameters())
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert add_conv_bias(model).changed == len(convs) == 20  # every ResNet-18 convolution feeds a BatchNorm
    assert sum(p.numel() for p in model.parameters()) - before == sum(c.out_channels for c in convs)


# -- knobs of the step that matter on a GPU -------------------------------------------------------

@pytest.mark.parametrize(("recipe", "workload", "resets"), [
    ("compile", "mlp", 1),
    ("fuse_pointwise_compile", "gelu_mlp", 1),
    ("baseline", "mlp", 0),
])
def test_closing_a_compiled_setup_resets_dynamo(recipe, workload, resets, cpu, profile, monkeypatch):
    calls = []
    monkeypatch.setattr(torch._dynamo, "reset", lambda: calls.append("reset"))
    training = training_module.TrainingSetup(get_recipe(recipe).config(profile), resolve_spec(workload, profile), cpu)
    assert calls == []  # building compiles nothing yet
    training.close()  # without a step: nothing compiled, the caches are reset all the same
    assert len(calls) == resets


@pytest.mark.parametrize("warn_only", [True, False])
def test_deterministic_algorithms_fail_rather_than_warn_and_restore_the_previous_state(warn_only):
    saved = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.backends.cudnn.deterministic)
    try:
        torch.use_deterministic_algorithms(warn_only, warn_only=warn_only)  # (True, warn) or all off
        torch.backends.cudnn.deterministic = False
        with effects_module._deterministic_algorithms():
            assert torch.are_deterministic_algorithms_enabled()
            assert not torch.is_deterministic_algorithms_warn_only_enabled()
            assert torch.backends.cudnn.deterministic
        assert torch.are_deterministic_algorithms_enabled() is warn_only
        assert torch.is_deterministic_algorithms_warn_only_enabled() is warn_only
        assert torch.backends.cudnn.deterministic is False
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        torch.backends.cudnn.deterministic = saved[2]


def _loss_without_deterministic_kernel(model, batch):
    if torch.are_deterministic_algorithms_enabled():
        raise RuntimeError("fake_op_backward does not have a deterministic implementation, but you set "
                           "'torch.use_deterministic_algorithms(True)'")
    return classification_loss(model, batch)


def _random_features(batch_size, gen):
    return (torch.randn(batch_size, 8, generator=gen, device=gen.device),
            torch.randint(0, 2, (batch_size,), generator=gen, device=gen.device))


NONDETERMINISTIC = TrainingSpec(
    name="nondeterministic", model=lambda: nn.Linear(8, 2), loss_fn=_loss_without_deterministic_kernel,
    optimizer=functools.partial(torch.optim.SGD, lr=0.01), batch_size=4, batches=_random_features)


def test_a_model_without_deterministic_kernels_skips_the_deterministic_case(cpu, profile, quick):
    runner = Runner(cpu, profile, quick, predict=False)
    outcome = runner.run("deterministic", NONDETERMINISTIC)
    assert outcome.result is None
    assert outcome.skipped.startswith("deterministic: an op of the model has no deterministic kernel here: "
                                      "fake_op_backward does not have a deterministic implementation")
    assert not torch.are_deterministic_algorithms_enabled()  # the failed setup restored the flag
    assert runner.run("baseline", NONDETERMINISTIC).skipped is None  # the same spec trains without the flag


class _ClockLog(CpuBackend):
    """A CPU backend whose clock is a counter (10 s a read) and whose waits and syncs are logged, not waited."""

    def __init__(self, log):
        super().__init__(torch.device("cpu"))
        self.log, self.now = log, 0.0

    def clock(self):
        self.log.append(("clock", self.now))
        self.now += 10.0
        return self.now - 10.0

    def synchronize(self):
        self.log.append("synchronize")

    def busy_wait(self, seconds):
        self.log.append(("busy_wait", seconds))


@pytest.mark.parametrize(("fault", "after_the_update"), [
    (training_module.InjectedFault(slowdown=0.5), ["synchronize", ("clock", 10.0), ("busy_wait", 5.0)]),
    (None, []),
])
def test_the_injected_slowdown_waits_for_the_device_after_the_step(fault, after_the_update, profile):
    log = []
    with training_module.TrainingSetup(get_recipe("baseline").config(profile), resolve_spec("mlp", profile), _ClockLog(log),
                       fault) as training:
        training.optimizers["0"].register_step_post_hook(lambda *args: log.append("optimizer step"))
        micro_batches = training.fetch(training.batches())
        log.clear()
        training.backend.now = 0.0
        training.step(micro_batches)
    # the step's start, its work, then (with the fault) the device drained before the elapsed time is read:
    # a fraction of the whole step, not of the host's share of it
    assert log == [("clock", 0.0), "optimizer step", *after_the_update]


# -- moving a model, fake tensors included (trainbench.core.analyses.predict builds models under FakeTensorMode) ----------

class _Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(16, 4)
        self.head = nn.Linear(4, 16, bias=False)
        self.head.weight = self.embed.weight


def test_a_fake_model_moved_keeps_its_tied_weights_tied():
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True):
        model = _Tied()
        before = model.embed.weight
        assert isinstance(before, FakeTensor)
        moved = module_to(model, "cpu", dtype=torch.float64)
    assert moved is model
    assert model.head.weight is model.embed.weight and model.embed.weight is not before  # one new Parameter
    assert isinstance(model.embed.weight, nn.Parameter) and isinstance(model.embed.weight, FakeTensor)
    assert model.embed.weight.dtype == torch.float64 and model.embed.weight.requires_grad
    assert len(list(model.parameters())) == 1


def test_a_fake_model_in_channels_last_converts_4d_tensors_only():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True):
        model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8))
        module_to(model, memory_format=torch.channels_last)  # BatchNorm's 1-D buffers and biases stay as they are
    conv, bn = model
    assert conv.weight.is_contiguous(memory_format=torch.channels_last) and not conv.weight.is_contiguous()
    assert conv.bias.shape == (8,) and bn.running_mean.shape == (8,) and bn.num_batches_tracked.dim() == 0


def test_a_real_model_is_moved_by_module_to_itself():
    model = _Tied()
    weight = model.embed.weight
    assert module_to(model, "cpu") is model and model.embed.weight is weight  # Module.to: nothing to move


# -- the data a step trains on ----------------------------------------------------------------------------

def test_the_ranks_samplers_together_serve_each_global_batch_of_the_one_process_sampler():
    one_process = data_module.EndlessSampler(40, seed=3)
    ranks = [data_module.RankSampler(40, batch_size=4, rank=r, world_size=2, seed=3) for r in range(2)]
    streams = [iter(one_process)] + [iter(r) for r in ranks]
    for _ in range(25):  # past the end of the first permutation
        global_batch = [next(streams[0]) for _ in range(8)]
        assert [next(streams[1]) for _ in range(4)] + [next(streams[2]) for _ in range(4)] == global_batch


def test_synthetic_batches_are_seeded_and_made_where_the_config_asks(cpu, profile):
    mlp = resolve_spec("mlp", profile)
    with TrainingSetup(TrainConfig(synthetic="host"), mlp, cpu) as first, \
            TrainingSetup(TrainConfig(synthetic="host"), mlp, cpu) as second:
        assert first.loader is None
        a, b = next(first.batches()), next(second.batches())
        assert torch.equal(a[0], b[0]) and a[0].shape == (profile.batch_size, 3, 32, 32)
        assert first.h2d_bytes([a]) > 0
    with TrainingSetup(TrainConfig(synthetic="device"), mlp, cpu) as on_device:
        assert on_device.h2d_bytes(on_device.fetch(on_device.batches())) == 0  # made where it trains: nothing copied


def test_a_step_fetches_one_loader_batch_per_micro_batch(training, profile):
    with training("grad_accumulation") as setup:
        micro_batches = setup.fetch(setup.batches())
        # 4x the spec's batch per step, as 4 loader batches of the spec's size
        assert len(micro_batches) == setup.config.accumulation_steps == 4
        assert [len(labels) for _, labels in micro_batches] == [profile.batch_size] * 4
        assert setup.samples_per_step == 4 * setup.batch_size == 4 * profile.batch_size


# -- what each knob does to the model and the step ----------------------------------------------------------

@pytest.mark.parametrize(("knobs", "missing"), [
    ({"channels_last": True}, "the model has no 2-D convolution"),
    ({"conv_bias": "add"}, "the model has no convolution"),
    ({"conv_bias": "remove"}, "the model has no convolution"),
    ({"fuse_pointwise": "script"}, "the model has no module with a `pointwise` function to fuse"),
    ({"checkpointing": True}, "the spec names no checkpoint_blocks"),
])
def test_a_knob_the_mlp_has_nothing_for_is_not_applicable(knobs, missing, cpu, profile):
    with pytest.raises(NotApplicable, match=missing):
        TrainingSetup(TrainConfig(**knobs), resolve_spec("mlp", profile), cpu)


def test_a_spec_whose_model_or_optimizer_is_not_what_torch_expects_is_a_clear_error(cpu, profile):
    mlp = resolve_spec("mlp", profile)
    with pytest.raises(SpecError, match="model\\(\\) returned function, expected an nn.Module"):
        TrainingSetup(TrainConfig(), dataclasses.replace(mlp, model=lambda: (lambda x: x)), cpu)
    with pytest.raises(SpecError, match="optimizer returned list, expected a torch.optim.Optimizer"):
        TrainingSetup(TrainConfig(), dataclasses.replace(mlp, optimizer=lambda params: list(params)), cpu)
    transformer = resolve_spec("transformer", profile)
    with pytest.raises(SpecError, match="checkpoint block 'encoder.nope' is not a submodule of the model"):
        TrainingSetup(TrainConfig(checkpointing=True), dataclasses.replace(transformer, checkpoint_blocks=("encoder.nope",)),
                      cpu)


def _first_step(setup: TrainingSetup) -> torch.Tensor:
    return setup.step(setup.fetch(setup.batches()))


def test_a_spec_that_cannot_train_says_so_in_one_line_naming_it(cpu, profile):
    mlp = resolve_spec("mlp", profile)
    with pytest.raises(SpecError, match="^training spec 'mlp': the model has no parameters to train$"):
        TrainingSetup(TrainConfig(), dataclasses.replace(mlp, model=nn.Flatten), cpu)
    empty = dataclasses.replace(mlp, dataset=lambda: torch.utils.data.TensorDataset(torch.zeros(0, 3), torch.zeros(0)))
    with pytest.raises(SpecError, match="^the dataset of training spec 'mlp' yields no batches \\(its length is 0\\)$"):
        TrainingSetup(TrainConfig(), empty, cpu)  # the endless sampler used to look for a first index forever
    detached = dataclasses.replace(mlp, loss_fn=lambda model, batch: classification_loss(model, batch).detach())
    with TrainingSetup(TrainConfig(), detached, cpu) as setup, pytest.raises(SpecError, match="does not require grad"):
        _first_step(setup)
    with TrainingSetup(TrainConfig(eval_mode="no_grad"), detached, cpu) as setup:
        _first_step(setup)  # an evaluation step has no backward: its loss needs no graph
    dry = dataclasses.replace(mlp, dataset=None, batches=lambda batch_size, generator: next(iter([])))
    with TrainingSetup(TrainConfig(), dry, cpu) as setup, \
            pytest.raises(SpecError, match="^the data of training spec 'mlp' yields no more batches$"):
        _first_step(setup)


def test_the_loss_check_names_the_step_it_found_non_finite_and_the_last_finite_one(cpu, profile):
    mlp = resolve_spec("mlp", profile)
    steps = []

    def diverging(model, batch):
        steps.append(1)
        return classification_loss(model, batch) * (float("nan") if len(steps) > 3 else 1.0)

    with TrainingSetup(TrainConfig(), dataclasses.replace(mlp, loss_fn=diverging), cpu) as setup:
        for _ in range(2):
            _first_step(setup)
        setup.check_loss("the end of warm-up")  # finite: no sync inside the steps, one here
        for _ in range(3):
            _first_step(setup)
        with pytest.raises(training_module.NonFiniteLoss,
                           match=r"^the loss of training spec 'mlp' is nan at step 5 \(the last timed step; finite "
                                 r"when checked at step 2\): the training diverged"):
            setup.check_loss("the last timed step")


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")
def test_fusing_swaps_each_pointwise_function_for_its_scripted_version(profile):
    model = resolve_spec("gelu_mlp", profile).model()
    assert effects_module.fuse_pointwise(model, "script") == 1
    assert isinstance(model.pointwise, torch.jit.ScriptFunction)
    x = torch.randn(2, 3, 32, 32)
    assert torch.allclose(model(x), model.head(model.pointwise(model.fc2(model.pointwise(model.fc1(x.flatten(1)))))))


@pytest.mark.parametrize(("mode", "grad_after_zero"), [("zeros", "zeros"), ("set_to_none", None), ("param_none", None)])
def test_each_zero_grad_mode_leaves_the_gradients_as_it_says(mode, grad_after_zero, cpu, profile):
    with TrainingSetup(TrainConfig(zero_grad=mode), resolve_spec("mlp", profile), cpu) as setup:
        setup.step(setup.fetch(setup.batches()))
        setup.zero_grad()
        grads = [p.grad for p in setup.model.parameters()]
    if grad_after_zero is None:
        assert all(g is None for g in grads)
    else:
        assert all(g is not None and not g.any() for g in grads)


def test_a_running_loss_kept_as_a_tensor_keeps_every_steps_graph_and_a_detached_one_none(cpu, profile):
    mlp = resolve_spec("mlp", profile)
    kept = {}
    for history in ("tensor", "detach"):
        with TrainingSetup(TrainConfig(loss_history=history), mlp, cpu) as setup:
            batches = setup.batches()
            nodes = []
            for _ in range(3):
                setup.step(setup.fetch(batches))
                nodes.append(setup.retained_graph_nodes())
            kept[history] = nodes
    assert kept["detach"] == [0, 0, 0]
    assert kept["tensor"][0] > 0 and kept["tensor"][2] - kept["tensor"][1] == kept["tensor"][1] - kept["tensor"][0] > 0


def test_the_step_returns_a_detached_loss_and_counts_itself(cpu, profile):
    with TrainingSetup(TrainConfig(), resolve_spec("mlp", profile), cpu) as setup:
        loss = setup.step(setup.fetch(setup.batches()))
        assert loss.requires_grad is False and loss.dim() == 0 and setup.steps_done == 1


def test_each_rank_makes_its_slice_of_the_global_synthetic_batch(profile):
    # As RankSampler shards a Dataset: the ranks together train on the batch one process of the global batch would.
    from trainbench.core.setups.data import SyntheticBatches

    spec = resolve_spec("mlp", profile)
    cpu = torch.device("cpu")
    whole = next(SyntheticBatches(spec, 8, cpu, False, seed=3))
    ranks = [next(SyntheticBatches(spec, 4, cpu, False, seed=3, rank=r, world_size=2)) for r in (0, 1)]
    for i, part in enumerate(whole):
        assert torch.equal(torch.cat([rank[i] for rank in ranks]), part)
    assert ranks[0][0].shape[0] == 4 and ranks[0][0].untyped_storage().nbytes() == ranks[0][0].nbytes


@pytest.mark.parametrize("recipe", ["baseline", "set_to_none", "param_grad_none", "optimizer_foreach"])
def test_a_loss_fn_spec_with_several_optimizers_clears_and_steps_each(recipe, cpu, profile):
    # e.g. a backbone with SGD and a head with Adam: one loss, one backward, every optimizer steps once
    spec = TrainingSpec(name="two_optimizers", model=lambda: nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)),
                        loss_fn=lambda model, batch: model(batch).pow(2).mean(),
                        optimizers=lambda model: [torch.optim.SGD(model[0].parameters(), lr=0.1),
                                                  torch.optim.Adam(model[2].parameters(), lr=0.1)],
                        batch_size=4, batches=lambda n, gen: torch.randn(n, 4, generator=gen))
    with TrainingSetup(get_recipe(recipe).config(profile), spec, cpu) as training:
        stepped = []
        for name, optimizer in training.optimizers.items():
            optimizer.register_step_post_hook(lambda *args, name=name: stepped.append(name))
        assert training.context is None  # trainbench's own step around the loss
        batches = training.batches()
        before = [p.detach().clone() for p in training.model.parameters()]
        training.step(training.fetch(batches))
        assert stepped == ["0", "1"]
        assert all(not torch.equal(b, p) for b, p in zip(before, training.model.parameters(), strict=True))
        training.zero_grad()  # the config's zero_grad, for every optimizer's parameters
        grads = [p.grad for p in training.model.parameters()]
        assert all(g is None for g in grads) if recipe in ("set_to_none", "param_grad_none") else \
            all(not g.any() for g in grads)
        if recipe == "optimizer_foreach":
            assert [type(o).__name__ for o in training.optimizers.values()] == ["SGD", "Adam"]
            assert all(o.defaults["foreach"] is True for o in training.optimizers.values())


# -- convolution biases before a norm, and checkpoint block names ---------------------------------------------------------

class _ConvsBeforeNorms(nn.Module):
    """A convolution before each kind of norm, and convolutions whose bias a norm does not cancel."""

    def __init__(self):
        super().__init__()
        self.bn = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8))  # cancelled (batch statistics)
        self.in_conv, self.inorm = nn.Conv2d(8, 8, 1), nn.InstanceNorm2d(8, affine=True)  # cancelled (a sample's)
        self.gn1_conv, self.gn1 = nn.Conv2d(8, 8, 1), nn.GroupNorm(8, 8)  # cancelled: one channel per group
        self.gn2_conv, self.gn2 = nn.Conv2d(8, 8, 1), nn.GroupNorm(4, 8)  # not: two channels share a group's mean
        self.skip_conv, self.skip_bn = nn.Conv2d(8, 8, 1), nn.BatchNorm2d(8)  # not: the skip reads it before the norm
        self.act_conv, self.act_bn = nn.Conv2d(8, 8, 1), nn.BatchNorm2d(8)  # not: a ReLU between them
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        x = self.gn2(self.gn2_conv(self.gn1(self.gn1_conv(self.inorm(self.in_conv(self.bn(x)))))))
        y = self.skip_conv(x)
        x = self.skip_bn(y) + y
        return self.head(self.act_bn(torch.relu(self.act_conv(x))).mean((2, 3)))


CANCELLED = {"bn.0", "in_conv", "gn1_conv"}


def _bias_free(model: nn.Module) -> set[str]:
    return {name for name, m in model.named_modules() if isinstance(m, nn.Conv2d) and m.bias is None}


def test_the_biases_a_norm_cancels_go_and_the_outputs_in_training_stay(cpu):
    from trainbench.core.setups.effects import remove_conv_bias_before_norm

    torch.manual_seed(0)
    model, x = _ConvsBeforeNorms(), torch.randn(4, 3, 8, 8)
    before = model(x)
    change = remove_conv_bias_before_norm(model)
    assert (change.changed, change.before_norms, change.found_by) == (3, 3, "by tracing the model with torch.fx")
    assert _bias_free(model) == CANCELLED
    torch.testing.assert_close(model(x), before, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kept", ["gn2_conv", "skip_conv", "act_conv"])
def test_each_bias_the_trace_keeps_changes_the_outputs_when_removed(kept):
    torch.manual_seed(0)
    model, x = _ConvsBeforeNorms(), torch.randn(4, 3, 8, 8)
    before = model(x)
    model.get_submodule(kept).bias = None  # what a removal by module order alone would do
    assert not torch.allclose(model(x), before, rtol=1e-3, atol=1e-3)


def test_in_evaluation_batchnorm_uses_running_statistics_and_cancels_no_bias():
    from trainbench.core.setups.effects import convs_before_norms

    model = _ConvsBeforeNorms()
    names = {id(m): name for name, m in model.named_modules()}
    assert {names[id(c)] for c in convs_before_norms(model, training=False)[0]} == {"in_conv", "gn1_conv"}
    no_running_stats = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4, track_running_stats=False))
    assert convs_before_norms(no_running_stats, training=False)[0] == [no_running_stats[0]]  # batch statistics always


class _Untraceable(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU())
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        if x.sum() > 0:  # control flow on a value: torch.fx cannot trace it
            x = -x
        return self.head(self.stem(x).mean((2, 3)))


def test_a_model_fx_cannot_trace_is_read_in_registration_order_and_says_so(profile, monkeypatch):
    from trainbench.core.setups.effects import _ConvNormTracer, convs_before_norms

    model = _Untraceable()
    convs, found_by = convs_before_norms(model)
    assert convs == [model.stem[0]]
    assert found_by.startswith("by registration order: torch.fx could not trace the model (TraceError: ")
    # On ResNet-18 (each convolution registered right before its BatchNorm) the fallback finds what the trace finds.
    resnet = resolve_spec("resnet18", profile).model()
    traced, how = convs_before_norms(resnet)
    assert how == "by tracing the model with torch.fx" and len(traced) == 20

    def fail(self, root, concrete_args=None):
        raise RuntimeError("untraceable")

    monkeypatch.setattr(_ConvNormTracer, "trace", fail)
    by_order, how = convs_before_norms(resnet)
    assert by_order == traced and how.endswith("(RuntimeError: untraceable)")


def _conv_spec(model):
    def batches(n, gen):
        return torch.randn(n, 3, 8, 8, generator=gen), torch.randint(0, 2, (n,), generator=gen)

    return TrainingSpec(name="convs", model=model, loss_fn=classification_loss, batch_size=8, batches=batches,
                        optimizer=functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9))


def test_removing_the_cancelled_biases_trains_the_same_and_a_wrong_removal_fails_the_loss_guard(cpu, monkeypatch):
    from trainbench.core.setups.guards import compare_trajectories, loss_trajectory
    from trainbench.core.setups.effects import _ConvNormTracer

    spec, rtol = _conv_spec(_ConvsBeforeNorms), get_recipe("no_conv_bias").loss_rtol
    as_given = loss_trajectory(TrainConfig(), spec, cpu)
    with TrainingSetup(TrainConfig(conv_bias="remove"), spec, cpu) as setup:
        assert _bias_free(setup.model) == CANCELLED and "by tracing the model with torch.fx" in setup.notes[0]
    assert compare_trajectories(loss_trajectory(TrainConfig(conv_bias="remove"), spec, cpu), as_given, rtol).ok

    def fail(self, root, concrete_args=None):
        raise RuntimeError("untraceable")

    monkeypatch.setattr(_ConvNormTracer, "trace", fail)  # registration order also takes skip_conv and act_conv
    with TrainingSetup(TrainConfig(conv_bias="remove"), spec, cpu) as setup:
        assert _bias_free(setup.model) == CANCELLED | {"skip_conv", "act_conv"}
    verdict = compare_trajectories(loss_trajectory(TrainConfig(conv_bias="remove"), spec, cpu), as_given, rtol)
    assert not verdict.ok and verdict.max_rel_diff > 10 * rtol


def test_a_misspelled_checkpoint_block_names_the_closest_submodules(cpu, profile):
    resnet18 = resolve_spec("resnet18", profile)
    with pytest.raises(SpecError, match=r"checkpoint block 'layr2' is not a submodule of the model; did you mean 'layer2'"):
        TrainingSetup(TrainConfig(checkpointing=True), dataclasses.replace(resnet18, checkpoint_blocks=("layr2",)), cpu)
    transformer = resolve_spec("transformer", profile)
    with pytest.raises(SpecError, match=r"'encoder\.layer\.1' is not a submodule of the model; did you mean 'encoder\.layers\.1'"):
        TrainingSetup(TrainConfig(checkpointing=True),
                      dataclasses.replace(transformer, checkpoint_blocks=("encoder.layer.1",)), cpu)
    with pytest.raises(SpecError, match=r"checkpoint block 'zzz' is not a submodule of the model$"):  # nothing close
        TrainingSetup(TrainConfig(checkpointing=True), dataclasses.replace(resnet18, checkpoint_blocks=("zzz",)), cpu)


def test_what_building_the_setup_changed_is_a_note_of_its_measured_result(cpu, quick):
    from trainbench.core.method.measure import Measurer

    with TrainingSetup(TrainConfig(conv_bias="remove"), _conv_spec(_ConvsBeforeNorms), cpu) as setup:
        assert setup.notes[0].startswith("conv_bias=remove: removed the bias of 3 of the 3 convolutions")
        assert Measurer(setup, "convs-no_conv_bias", "no_conv_bias", quick).result.notes == list(setup.notes)
    with TrainingSetup(TrainConfig(), _conv_spec(_ConvsBeforeNorms), cpu) as setup:
        assert setup.notes == ()


def test_the_window_of_batches_is_the_seeds_whatever_drew_from_the_global_generators_before(cpu, profile):
    # A collate that draws each batch's length from torch's and Python's global generators, which the model's
    # initialization, dropout and the steps before also draw from.
    import random

    def truncated(samples):
        keep = int(torch.randint(2, 9, ())) + random.randrange(2)
        return torch.stack(samples)[:, :keep]

    spec = TrainingSpec(name="truncated", model=lambda: nn.Linear(1, 1),
                        loss_fn=lambda model, batch: model(batch.unsqueeze(-1)).mean(),
                        optimizer=functools.partial(torch.optim.SGD, lr=0.1), batch_size=2,
                        dataset=lambda: torch.arange(160.0).reshape(20, 8), collate_fn=truncated)

    def window(setup, steps_before):
        for _ in range(steps_before):  # the live stream moves on; the window starts again at batch 0
            setup.step(setup.fetch(setup.batches()))
        batches, stream = [], setup.batches_from_start()
        for _ in range(4):
            torch.rand(7), random.random()  # what ran between two batches (a step's dropout) drew from both
            batches.append(setup.fetch(stream)[0])
        return batches

    with TrainingSetup(get_recipe("baseline").config(profile), spec, cpu) as setup:
        first = window(setup, steps_before=0)
    with TrainingSetup(get_recipe("set_to_none").config(profile), spec, cpu) as setup:
        again = window(setup, steps_before=3)
    assert len({b.shape for b in first}) > 1  # the lengths do vary
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
