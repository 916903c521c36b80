"""A custom training step: a GAN's alternating discriminator and generator updates with two optimizers, as users
write them, under the recipes that apply; and the memory breakdown of any loss or step function."""

import fnmatch
import functools

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from trainbench import StepContext, TrainingSpec
from trainbench.core.setups.eligibility import why_not
from trainbench.core.setups.guards import GUARD_STEPS, compare_gradients, compare_trajectories, first_step_gradients, loss_trajectory
from trainbench.core.method.measure import Measurer, MeasureSettings
from trainbench.core.setups.recipes import NotApplicable, TrainConfig, get_recipe, spec_unmet
from trainbench.core.setups.spec import SpecError
from trainbench.core.setups.training import TrainingSetup
from trainbench.devices.device import CpuBackend

NOISE, DIM = 8, 16
BF16 = CpuBackend(torch.device("cpu")).supports_bf16()


class MLP(nn.Module):
    def __init__(self, inputs: int, outputs: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(inputs, 32), nn.LeakyReLU(0.2), nn.Linear(32, outputs))

    def forward(self, x):
        return self.net(x)


class GAN(nn.Module):
    def __init__(self):
        super().__init__()
        self.G, self.D = MLP(NOISE, DIM), MLP(DIM, 1)


def bce(logits, target: float):
    return F.binary_cross_entropy_with_logits(logits, torch.full_like(logits, target))


def gan_step(model, real, ctx, update_d=True, g_scale=1.0):
    z = torch.randn(real.shape[0], NOISE, device=real.device, generator=ctx.generator)
    d, g = ctx.optimizer("D"), ctx.optimizer("G")
    with ctx.autocast():
        fake = model.G(z)
        d_loss = bce(model.D(real), 1.0) + bce(model.D(fake.detach()), 0.0)
    if update_d:
        ctx.zero_grad(d)
        ctx.backward(d_loss)
        ctx.step(d)
    with ctx.autocast():
        g_loss = bce(model.D(fake), 1.0) * g_scale
    ctx.zero_grad(g)
    ctx.backward(g_loss)
    ctx.step(g)
    return g_loss.detach()


def two_adams(model):
    return {"D": torch.optim.Adam(model.D.parameters(), lr=2e-3, betas=(0.5, 0.999)),
            "G": torch.optim.Adam(model.G.parameters(), lr=2e-3, betas=(0.5, 0.999))}


def gan_spec(step=gan_step, name="gan", optimizers=two_adams, **fields) -> TrainingSpec:
    return TrainingSpec(name=name, model=GAN, step=step, optimizers=optimizers, batch_size=16,
                        batches=lambda n, gen: torch.randn(n, DIM, generator=gen, device=gen.device) * 0.5 + 1.0,
                        checkpoint_blocks=["G.net"], **fields)


GAN_SPEC = gan_spec()
PARAM_BYTES = sum(p.numel() for p in GAN().parameters()) * 4


@pytest.fixture
def config(profile):
    return lambda recipe="baseline", **overrides: get_recipe(recipe).config(profile, **overrides)


def trained(config: TrainConfig, cpu, spec=GAN_SPEC, steps: int = 3):
    """(parameters before, parameters after ``steps`` steps, the losses)"""
    with TrainingSetup(config, spec, cpu) as training:
        before = {n: p.detach().clone() for n, p in training.model.named_parameters()}
        batches = training.batches()
        losses = [float(training.step(training.fetch(batches))) for _ in range(steps)]
        after = {n: p.detach().clone() for n, p in training.model.named_parameters()}
    return before, after, losses


# -- the spec -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("fields", "message"), [
    ({"loss_fn": lambda m, b: m(b).sum()}, "give exactly one of loss_fn and step (*); got both"),
    ({"step": None}, "give exactly one of loss_fn and step (*); got neither"),
    ({"optimizer": functools.partial(torch.optim.SGD, lr=0.1)}, "give exactly one of optimizer and optimizers (*); got both"),
    ({"optimizers": None}, "give exactly one of optimizer and optimizers (*); got neither"),
    ({"step": "gan_step"}, "step must be callable, got 'gan_step'"),
])
def test_a_spec_states_one_loss_or_step_and_one_optimizer_or_optimizers(fields, message):
    with pytest.raises(SpecError) as error:
        gan_spec(**fields)
    text = str(error.value)
    assert "\n" not in text and text.startswith("training spec 'gan': ")
    assert fnmatch.fnmatch(text, f"training spec 'gan': {message}"), text


# -- the plain step -------------------------------------------------------------------------------------------

def test_the_gan_trains_both_players_and_reports_the_generators_loss(config, cpu):
    before, after, losses = trained(config(), cpu)
    assert all(not torch.equal(before[n], after[n]) for n in before)  # D and G both updated
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))
    # the loss reported is the one the step returns (the generator's)
    returned = []

    def recording(model, batch, ctx):
        returned.append(gan_step(model, batch, ctx))
        return returned[-1]

    with TrainingSetup(config(), gan_spec(recording), cpu) as training:
        loss = training.step(training.fetch(training.batches()))
        assert isinstance(training.context, StepContext) and training.context.optimizers.keys() == {"D", "G"}
    assert not loss.requires_grad and float(loss) == float(returned[0]) == losses[0]


def test_a_step_that_skips_one_optimizer_leaves_its_parameters_alone(config, cpu):
    before, after, _ = trained(config(), cpu, gan_spec(functools.partial(gan_step, update_d=False)))
    assert all(torch.equal(before[n], after[n]) for n in before if n.startswith("D."))
    assert all(not torch.equal(before[n], after[n]) for n in before if n.startswith("G."))


def test_optimizers_may_be_one_a_list_or_a_dict(config, cpu):
    def single_step(model, batch, ctx):
        with ctx.autocast():
            loss = bce(model.D(batch), 1.0)
        ctx.zero_grad()  # no name: the only one
        ctx.backward(loss)
        ctx.step()
        return loss

    for optimizers in (lambda m: torch.optim.SGD(m.D.parameters(), lr=0.1),
                       lambda m: [torch.optim.SGD(m.D.parameters(), lr=0.1)]):
        with TrainingSetup(config(), gan_spec(single_step, optimizers=optimizers), cpu) as training:
            assert list(training.optimizers) == ["0"]
            training.step(training.fetch(training.batches()))
    # a spec's optimizer factory of parameters serves a custom step too
    spec = TrainingSpec(name="one", model=GAN, step=single_step, optimizer=functools.partial(torch.optim.SGD, lr=0.1),
                        batch_size=4, batches=lambda n, gen: torch.randn(n, DIM, generator=gen))
    with TrainingSetup(config(), spec, cpu) as training:
        training.step(training.fetch(training.batches()))


def test_a_step_that_asks_for_an_unknown_optimizer_or_returns_no_loss_says_so(config, cpu):
    def asks_for_c(model, batch, ctx):
        ctx.optimizer("C")

    with TrainingSetup(config(), gan_spec(asks_for_c), cpu) as training, pytest.raises(SpecError) as error:
        training.step(training.fetch(training.batches()))
    assert "the step asked for optimizer 'C'; its optimizers are ['D', 'G']" in str(error.value)
    for unnamed in (lambda ctx: ctx.step(), lambda ctx: ctx.zero_grad(), lambda ctx: ctx.optimizer()):
        with TrainingSetup(config(), gan_spec(lambda m, b, ctx, call=unnamed: call(ctx)), cpu) as training:
            with pytest.raises(SpecError) as error:
                training.step(training.fetch(training.batches()))
        assert str(error.value) == ("training spec 'gan': the step named no optimizer and it has 2, ['D', 'G']: name one "
                                    '(ctx.step("name"))')

    with TrainingSetup(config(), gan_spec(lambda m, b, ctx: None), cpu) as training, pytest.raises(SpecError) as error:
        training.step(training.fetch(training.batches()))
    assert "step returned NoneType, expected a scalar floating-point tensor" in str(error.value)

    with pytest.raises(SpecError, match="optimizers returned int, expected an optimizer, a list of them or a dict"):
        TrainingSetup(config(), gan_spec(optimizers=lambda m: 3), cpu)
    with pytest.raises(SpecError, match="optimizers returned list as optimizer '0', expected a torch.optim.Optimizer"):
        TrainingSetup(config(), gan_spec(optimizers=lambda m: ([torch.optim.SGD(m.parameters(), lr=0.1)], [])), cpu)


def around_ctx(model, real, ctx, how):
    """The GAN's generator update gone around the recipe: ``how`` is "own_step" (g.step()), "own_backward"
    (g_loss.backward()) or "no_step" (no update at all)."""
    z = torch.randn(real.shape[0], NOISE, device=real.device, generator=ctx.generator)
    g = ctx.optimizer("G")
    with ctx.autocast():
        g_loss = bce(model.D(model.G(z)), 1.0)
    ctx.zero_grad(g)
    g_loss.backward() if how == "own_backward" else ctx.backward(g_loss)
    if how == "own_step":
        g.step()
    elif how != "no_step":
        ctx.step(g)
    return g_loss.detach()


@pytest.mark.parametrize(("how", "recipe", "message"), [
    ("own_step", {}, "the step called optimizer 'G''s step() itself, outside ctx.step: the recipe's optimizer step (its "
                     "GradScaler, the guards' view of the update) never applied to it; call ctx.step('G') instead"),
    ("own_backward", {"amp": "fp16", "grad_scaler": True},
     "the step ran a backward outside ctx.backward (loss.backward()?) under a recipe with a GradScaler: that loss was "
     "never scaled, yet ctx.step unscales its gradients; call ctx.backward(loss) instead"),
    ("no_step", {}, "the step never called ctx.step: no optimizer was updated through the recipe, so what it measures "
                    "is no training step; update each optimizer with ctx.step(optimizer)"),
])
def test_a_step_that_goes_around_ctx_fails_at_its_first_step_saying_what_it_must_do(config, cpu, how, recipe, message):
    with TrainingSetup(config(**recipe), gan_spec(functools.partial(around_ctx, how=how)), cpu) as training, \
            pytest.raises(SpecError) as error:
        training.step(training.fetch(training.batches()))
    assert str(error.value) == f"training spec 'gan': {message}"


def test_a_step_through_ctx_is_watched_at_its_first_step_only(config, cpu):
    # its own backward is the recipe's where no GradScaler scales it: the baseline takes it
    with TrainingSetup(config(), gan_spec(functools.partial(around_ctx, how="own_backward")), cpu) as training:
        training.step(training.fetch(training.batches()))
    with TrainingSetup(config(amp="fp16", grad_scaler=True), GAN_SPEC, cpu) as training:
        hooked = [p for p in training.model.parameters() if p._post_accumulate_grad_hooks]
        assert hooked and all(o._optimizer_step_pre_hooks for o in training.optimizers.values())
        batches = training.batches()
        training.step(training.fetch(batches))
        # the timed steps pay for no hook
        assert not any(p._post_accumulate_grad_hooks for p in training.model.parameters())
        assert not any(o._optimizer_step_pre_hooks for o in training.optimizers.values())
        training.step(training.fetch(batches))


def test_the_loss_guard_of_the_gan_against_itself_is_exact(config, cpu):
    # torch.manual_seed at setup, the batches' generator and ctx.generator: both sides draw the same numbers
    first = loss_trajectory(config(), GAN_SPEC, cpu)
    assert loss_trajectory(config(), GAN_SPEC, cpu) == first
    assert compare_trajectories(first, first, 0.0).ok


# -- recipes --------------------------------------------------------------------------------------------------

GUARDED = ["set_to_none", "param_grad_none", "checkpointing", "anomaly_detection", "loss_detach"]


@pytest.mark.parametrize("recipe", GUARDED + ["amp_bf16", "optimizer_foreach", "optimizer_fused"])
def test_a_recipe_that_applies_trains_the_gan_as_its_baseline_does(config, cpu, recipe):
    r = get_recipe(recipe)
    if r.changes.get("amp") == "bf16" and not BF16:
        pytest.skip("this CPU has no bfloat16")
    losses = loss_trajectory(config(recipe), GAN_SPEC, cpu)
    verdict = compare_trajectories(losses, loss_trajectory(config(r.baseline), GAN_SPEC, cpu), r.loss_rtol)
    assert verdict.ok, verdict.message


def test_foreach_and_fused_rebuild_each_optimizer_and_check_it_took(config, cpu):
    for recipe, key in (("optimizer_foreach", "foreach"), ("optimizer_fused", "fused"), ("optimizer_loop", "foreach")):
        with TrainingSetup(config(recipe), GAN_SPEC, cpu) as training:
            for name, optimizer in training.optimizers.items():
                assert optimizer.defaults[key] is (recipe != "optimizer_loop"), (recipe, name)
                assert optimizer.defaults["betas"] == (0.5, 0.999) and optimizer.defaults["lr"] == 2e-3
            assert training.context.optimizers == training.optimizers  # the step gets the rebuilt ones
            training.step(training.fetch(training.batches()))

    class Plain(torch.optim.SGD):
        def __init__(self, params, lr):  # takes no foreach=/fused=
            super().__init__(params, lr=lr)

    spec = gan_spec(optimizers=lambda m: {"D": Plain(m.D.parameters(), 0.1), "G": Plain(m.G.parameters(), 0.1)})
    assert spec_unmet(spec, config("optimizer_foreach")) is None  # only the built optimizers tell
    with pytest.raises(NotApplicable, match="Plain could not be built again with foreach=True, fused=False: TypeError"):
        TrainingSetup(config("optimizer_foreach"), spec, cpu)


def test_amp_bf16_autocasts_inside_the_step(config, cpu):
    if not BF16:
        pytest.skip("this CPU has no bfloat16")
    dtypes = []

    def recording(model, batch, ctx):
        with ctx.autocast():
            dtypes.append(model.D(batch).dtype)
        return gan_step(model, batch, ctx)

    with TrainingSetup(config("amp_bf16"), gan_spec(recording), cpu) as training:
        training.step(training.fetch(training.batches()))
    with TrainingSetup(config(), gan_spec(recording), cpu) as training:
        training.step(training.fetch(training.batches()))
    assert dtypes == [torch.bfloat16, torch.float32]


def test_fp16_with_a_grad_scaler_scales_every_loss_and_updates_once(config, cpu, monkeypatch):
    updates = []
    original = torch.amp.GradScaler.update
    monkeypatch.setattr(torch.amp.GradScaler, "update", lambda self, *a: (updates.append(1), original(self, *a))[1])
    fp16 = config(amp="fp16", grad_scaler=True)
    before, after, losses = trained(fp16, cpu, steps=2)
    assert updates == [1, 1]  # one update per step, after both optimizers stepped
    assert all(not torch.equal(before[n], after[n]) for n in before)
    # the gradients each optimizer stepped on, unscaled, are fp32's within fp16's precision
    verdict = compare_gradients(first_step_gradients(fp16, GAN_SPEC, cpu), first_step_gradients(config(), GAN_SPEC, cpu),
                                0.05)
    assert verdict.ok, verdict.message



def critic_step(model, real, ctx, n_critic=2, clear=True):
    """A critic updated ``n_critic`` times per generator update (WGAN's), clearing its gradients through ctx or not."""
    d, g = ctx.optimizer("D"), ctx.optimizer("G")
    for _ in range(n_critic):
        z = torch.randn(real.shape[0], NOISE, device=real.device, generator=ctx.generator)
        with ctx.autocast():
            d_loss = bce(model.D(real), 1.0) + bce(model.D(model.G(z).detach()), 0.0)
        ctx.zero_grad(d) if clear else d.zero_grad()
        ctx.backward(d_loss)
        ctx.step(d)
    return gan_step(model, real, ctx, update_d=False)


def _scales_seen(training: TrainingSetup, monkeypatch) -> list[tuple[str, float]]:
    """("scale"/"unscale", the GradScaler's scale then) as the step scales losses and unscales gradients."""
    seen = []
    for method in ("scale", "unscale_"):
        original = getattr(torch.amp.GradScaler, method)

        def recording(self, *args, _original=original, _method=method):
            seen.append((_method.rstrip("_"), self.get_scale()))
            return _original(self, *args)

        monkeypatch.setattr(torch.amp.GradScaler, method, recording)
    return seen


@pytest.mark.parametrize("clear", [True, False])
def test_a_critic_stepped_twice_under_a_grad_scaler_gets_an_update_between(config, cpu, monkeypatch, clear):
    # GradScaler.step refuses an optimizer stepped since the last update; this scaler doubles its scale at every
    # update, so an update placed between a backward and the unscaling of its gradients shows
    fp16 = config(amp="fp16", grad_scaler=True)
    with TrainingSetup(fp16, gan_spec(functools.partial(critic_step, clear=clear)), cpu) as training:
        training.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=1)
        before = {n: p.detach().clone() for n, p in training.model.named_parameters()}
        seen = _scales_seen(training, monkeypatch)
        training.updates.stepped_gradients = {}
        training.step(training.fetch(training.batches()))
        assert {n.split(":")[0] for n in training.updates.stepped_gradients} == {"D", "D#2", "G"}
        assert all(torch.isfinite(g).all() for g in training.updates.stepped_gradients.values())
        assert all(not torch.equal(before[n], p) for n, p in training.model.named_parameters())
        assert training.scaler.get_scale() == 2.0**12  # the critic's second update, then the step's end
    if clear:  # each update's gradients unscaled at the scale they were scaled with
        assert seen == [("scale", 2.0**10), ("unscale", 2.0**10), ("scale", 2.0**11), ("unscale", 2.0**11),
                        ("scale", 2.0**11), ("unscale", 2.0**11)]
    else:  # cleared behind trainbench's back: the update can only come at the second step
        assert [what for what, _ in seen] == ["scale", "unscale", "scale", "unscale", "scale", "unscale"]


def test_compile_compiles_the_modules_the_step_calls(config, cpu, monkeypatch):
    # Dynamo with its eager backend: what is compiled and what the step calls, without a minute of inductor's C++
    # code generation on two cores (the recipe itself compiles with inductor).
    in_place = nn.Module.compile
    monkeypatch.setattr(nn.Module, "compile", lambda self, **kwargs: in_place(self, **{**kwargs, "backend": "eager"}))
    from torch._dynamo.utils import counters

    counters.clear()
    with TrainingSetup(config("compile"), GAN_SPEC, cpu) as training:
        assert training.forward is training.model  # the step gets the model itself, its children compiled in place
        assert all(child._compiled_call_impl is not None for child in (training.model.G, training.model.D))
        assert [n for n, _ in training.model.named_parameters()] == [n for n, _ in GAN().named_parameters()]
        batches = training.batches()
        losses = [float(training.step(training.fetch(batches))) for _ in range(GUARD_STEPS)]
    assert counters["frames"]["ok"] >= 2  # G's and D's forwards, run through dynamo
    verdict = compare_trajectories(losses, loss_trajectory(config(), GAN_SPEC, cpu), get_recipe("compile").loss_rtol)
    assert verdict.ok, verdict.message


def test_a_larger_batch_trains_more_samples_per_step(config, cpu):
    with TrainingSetup(config("larger_batch"), GAN_SPEC, cpu) as training:
        assert training.samples_per_step == 4 * GAN_SPEC.batch_size
        [batch] = training.fetch(training.batches())
        assert batch.shape[0] == 4 * GAN_SPEC.batch_size
        training.step([batch])


@pytest.mark.parametrize(("recipe", "reason"), [
    ("grad_accumulation", "a custom step interleaves its updates with its forwards: accumulating micro-batches would "
                          "reorder them"),
    ("eval_no_grad", "a custom step is a training step: evaluation measures a loss_fn's forward, which the spec does "
                     "not state"),
    ("ddp_gloo", "a custom step calls its modules and optimizers itself; DistributedDataParallel wraps the root "
                 "module's forward, which the step need not call"),
    ("channels_last", None),  # applies to a custom step; this model has no convolution (told once built)
])
def test_recipes_that_cannot_apply_to_a_custom_step_say_why(config, cpu, profile, recipe, reason):
    from trainbench.devices.device import DeviceCaps

    caps = DeviceCaps("cpu", "a CPU", cuda=False, capability=None, gpu_count=0, bf16=True)
    r = get_recipe(recipe)
    assert why_not(r, caps, profile, GAN_SPEC) == (f"{recipe}: {reason}" if reason else None)
    if reason:
        with pytest.raises(NotApplicable, match=reason[:40]):
            TrainingSetup(config(recipe), GAN_SPEC, cpu)
    else:
        with pytest.raises(NotApplicable, match="the model has no 2-D convolution"):
            TrainingSetup(config(recipe), GAN_SPEC, cpu)


# -- guards ---------------------------------------------------------------------------------------------------

def test_the_gradient_guard_compares_what_each_optimizer_steps_on(config, cpu):
    grads = first_step_gradients(config(), GAN_SPEC, cpu)
    names = {n for n, _ in GAN().named_parameters()}
    assert set(grads) == {f"D:{n}" for n in names if n.startswith("D.")} | {f"G:{n}" for n in names if n.startswith("G.")}
    checkpointed = first_step_gradients(config("checkpointing"), GAN_SPEC, cpu)
    verdict = compare_gradients(checkpointed, grads, get_recipe("checkpointing").grad_rtol)
    assert verdict.ok, verdict.message


def test_the_guards_fail_a_step_that_trains_otherwise_under_a_recipe(config, cpu):
    r = get_recipe("checkpointing")
    base_losses, base_grads = loss_trajectory(config(), GAN_SPEC, cpu), first_step_gradients(config(), GAN_SPEC, cpu)
    # the discriminator's update lost under the recipe: its gradients are missing, the losses drift
    skips_d = gan_spec(functools.partial(gan_step, update_d=False))
    verdict = compare_gradients(first_step_gradients(config("checkpointing"), skips_d, cpu), base_grads, r.grad_rtol)
    assert not verdict.ok and "no gradient for D:D.net.0.bias" in verdict.message
    assert not compare_trajectories(loss_trajectory(config("checkpointing"), skips_d, cpu), base_losses, r.loss_rtol).ok
    # the generator's loss 1% off: its gradients are, and so is the reported loss
    off = gan_spec(functools.partial(gan_step, g_scale=1.01))
    verdict = compare_gradients(first_step_gradients(config("checkpointing"), off, cpu), base_grads, r.grad_rtol)
    assert not verdict.ok and verdict.max_rel_diff == pytest.approx(0.01, rel=0.01) and "(G:G.net." in verdict.message
    assert not compare_trajectories(loss_trajectory(config("checkpointing"), off, cpu), base_losses, r.loss_rtol).ok


# -- memory ---------------------------------------------------------------------------------------------------

def breakdown(config: TrainConfig, spec: TrainingSpec, cpu, warm_steps: int = 2) -> tuple[dict, list[str]]:
    with TrainingSetup(config, spec, cpu) as training:
        measurer = Measurer(training, "case", "recipe", MeasureSettings())
        batches = training.batches()
        for _ in range(warm_steps):
            training.step(training.fetch(batches))
        return measurer.tracked_breakdown(), measurer.result.notes


def test_the_gan_step_has_a_memory_breakdown(config, cpu):
    small, _ = breakdown(config(), GAN_SPEC, cpu)
    assert small["params"] == small["grads"] == PARAM_BYTES  # zero_grad writing zeros keeps every gradient
    assert small["optimizer_state"] >= 2 * PARAM_BYTES  # Adam's two moments (and its step counts)
    assert small["activations"] > 0
    assert small["total"] == sum(v for k, v in small.items() if k != "total")
    large, _ = breakdown(config(batch_size=64), GAN_SPEC, cpu)
    assert large["activations"] > small["activations"] and large["params"] == small["params"]
    none, _ = breakdown(config("set_to_none"), GAN_SPEC, cpu)
    assert none["total"] < small["total"]


class Direct(GAN):
    """A GAN whose root forward runs the same loss as ``direct_loss``: MemTracker can follow that one."""

    def forward(self, real):
        return direct_loss(self, real)


def direct_loss(model, real):
    """Written naturally: submodules called directly, the discriminator twice, no root forward."""
    fake = model.G(real[:, :NOISE])
    return bce(model.D(real), 1.0) + bce(model.D(fake), 0.0)


def _loss_spec(name, loss_fn):
    return TrainingSpec(name=name, model=Direct, loss_fn=loss_fn, optimizer=functools.partial(torch.optim.Adam, lr=1e-3),
                        batch_size=32, batches=lambda n, gen: torch.randn(n, DIM, generator=gen))


def test_a_loss_calling_submodules_directly_gets_the_breakdown_memtracker_gives_its_root_forward(config, cpu):
    # MemTracker alone raises "does not support memory tracking for multiple iterative calls" at the second model.D
    direct, notes = breakdown(config(), _loss_spec("direct", direct_loss), cpu)
    assert any("tracked by storage identity" in note for note in notes)
    through_root, root_notes = breakdown(config(), _loss_spec("root", lambda model, batch: model(batch)), cpu)
    assert not root_notes  # MemTracker's
    assert direct == {k: v for k, v in through_root.items() if k != "other"}
    assert direct["params"] == direct["grads"] == sum(p.numel() for p in Direct().parameters()) * 4


@pytest.mark.parametrize("overrides", [{}, {"amp": "fp16", "grad_scaler": True}])
def test_the_gan_step_memory_is_predicted_as_measured(config, cpu, overrides):
    from trainbench.core.analyses.predict import PREDICTED_STEPS, predict_memory

    predicted = predict_memory(config(**overrides), GAN_SPEC, cpu)
    assert predicted["breakdown_bytes"] == breakdown(config(**overrides), GAN_SPEC, cpu, PREDICTED_STEPS)[0]


# -- the plugin, end to end -----------------------------------------------------------------------------------

USERS_GAN = '''
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from trainbench import TrainingSpec


class GAN(nn.Module):
    def __init__(self):
        super().__init__()
        self.G = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 16))
        self.D = nn.Sequential(nn.Linear(16, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))


def bce(logits, target):
    return F.binary_cross_entropy_with_logits(logits, torch.full_like(logits, target))


def gan_step(model, real, ctx):
    z = torch.randn(real.shape[0], 8, device=real.device, generator=ctx.generator)
    d, g = ctx.optimizer("D"), ctx.optimizer("G")
    with ctx.autocast():
        fake = model.G(z)
        d_loss = bce(model.D(real), 1.0) + bce(model.D(fake.detach()), 0.0)
    ctx.zero_grad(d); ctx.backward(d_loss); ctx.step(d)
    with ctx.autocast():
        g_loss = bce(model.D(fake), 1.0)
    ctx.zero_grad(g); ctx.backward(g_loss); ctx.step(g)
    return g_loss


SPEC = TrainingSpec(
    name="gan", model=GAN, step=gan_step, batch_size=32,
    optimizers=lambda m: {"D": torch.optim.Adam(m.D.parameters(), lr=2e-4, betas=(0.5, 0.999)),
                          "G": torch.optim.Adam(m.G.parameters(), lr=2e-4, betas=(0.5, 0.999))},
    batches=lambda n, gen: torch.randn(n, 16, generator=gen, device=gen.device),
)


@pytest.mark.parametrize("recipe", ["baseline", "amp_bf16", "set_to_none", "optimizer_foreach", "grad_accumulation"])
def test_gan(train_bench, recipe):
    train_bench(recipe, SPEC)
'''


def test_a_users_gan_runs_through_the_plugin(pytester, quick_options):
    import json

    pytester.makepyfile(test_gan=USERS_GAN)
    result = pytester.runpytest(*quick_options, "-rs", "--benchmark-json=out.json")
    result.assert_outcomes(passed=4 if BF16 else 3, skipped=1 if BF16 else 2)
    result.stdout.fnmatch_lines(["SKIPPED*grad_accumulation: a custom step interleaves its updates with its forwards: "
                                 "accumulating micro-batches would reorder them*"])
    records = {b["extra_info"]["case"]: b["extra_info"] for b in json.loads((pytester.path / "out.json").read_text())
               ["benchmarks"]}
    guarded = {"gan-set_to_none", "gan-optimizer_foreach"} | ({"gan-amp_bf16"} if BF16 else set())
    assert set(records) == {"gan-baseline"} | guarded
    for case in guarded:  # each guard ran on the step's own losses, and passed
        [check] = records[case]["guard"]["checks"]
        assert check["kind"] == "loss" and check["ok"] and len(check["losses"]) == 4, (case, check)
    memory = records["gan-baseline"]["memory_breakdown_bytes"]
    assert memory["params"] == memory["grads"] > 0 and memory["activations"] > 0
