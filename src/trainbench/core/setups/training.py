"""Builds the loader, model, optimizer, GradScaler and the training step from a spec and a config.

The one place where each knob of ``TrainConfig`` takes effect on a ``TrainingSpec``, so a
recipe means the same thing in every benchmark, test and asv run, on built-in and
users' specs alike. What only the built model can tell (no convolution for
channels-last, no convolution before a norm with a bias to add or remove, no ``pointwise``
function, an optimizer that ignores ``fused=``) raises ``NotApplicable`` naming what is missing.

A *step* is one optimizer update: ``step(fetch(batches))``. ``fetch`` takes as many
loader batches as the step consumes (the micro-batches of gradient accumulation), so
the time blocked on the loader can be measured apart from the step itself.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch
import torch._dynamo  # noqa: F401 - the first optimizer built imports it (Optimizer.__init__ is wrapped by
# torch._disable_dynamo): ~1 s of one-time start-up, taken here with the core rather than in the first case's setup
import torch.fx

from trainbench.core.setups.data import BatchSource
from trainbench.core.setups.effects import STAGES, compiled_by_user, module_to
from trainbench.core.setups.recipes import OPTIMIZER_IMPL_KWARGS, TrainConfig, spec_unmet
from trainbench.core.setups.spec import Batch, NotApplicable, SpecError, TrainingSpec, batch_to_device
from trainbench.core.harness.watchdog import beat
from trainbench.devices.device import Backend



def build_optimizer(spec: TrainingSpec, params, impl: str | None) -> torch.optim.Optimizer:
    """The spec's ``optimizer(params)`` with the implementation ``impl`` asks for, checked to have taken effect."""
    params = list(params)
    if not params:  # torch's own "optimizer got an empty parameter list" names neither the spec nor the cause
        raise SpecError(f"training spec {spec.name!r}: the model has no parameters to train")
    return with_implementation(lambda **kwargs: spec.optimizer(params, **kwargs), impl, spec.name, "optimizer")


def build_optimizers(spec: TrainingSpec, model: torch.nn.Module, impl: str | None) -> dict[str, torch.optim.Optimizer]:
    """The optimizers of a spec by name: ``{"0": optimizer}`` for ``optimizer``; for ``optimizers(model)`` what it
    returns (a list's by position: "0", "1", ...), each rebuilt with the implementation ``impl`` asks for."""
    if spec.optimizer is not None:
        return {"0": build_optimizer(spec, model.parameters(), impl)}
    returned = spec.optimizers(model)
    if isinstance(returned, torch.optim.Optimizer):
        named = {"0": returned}
    elif isinstance(returned, Mapping):
        named = {str(name): optimizer for name, optimizer in returned.items()}
    elif isinstance(returned, Sequence) and not isinstance(returned, str):
        named = {str(i): optimizer for i, optimizer in enumerate(returned)}
    else:
        raise SpecError(f"training spec {spec.name!r}: optimizers returned {type(returned).__name__}, expected an "
                        "optimizer, a list of them or a dict of them by name")
    if not named:
        raise SpecError(f"training spec {spec.name!r}: optimizers returned no optimizer")
    for name, optimizer in named.items():
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise SpecError(f"training spec {spec.name!r}: optimizers returned {type(optimizer).__name__} as "
                            f"optimizer {name!r}, expected a torch.optim.Optimizer")
    return {name: with_implementation(functools.partial(_rebuilt, optimizer), impl, spec.name, f"optimizers[{name!r}]")
            for name, optimizer in named.items()}


def with_implementation(build: Callable[..., torch.optim.Optimizer], impl: str | None, spec_name: str,
                        what: str) -> torch.optim.Optimizer:
    """``build(**kwargs)`` with the ``foreach=``/``fused=`` arguments ``impl`` asks for, checked to be an optimizer
    that took them: the one answer to "this optimizer with implementation X", for ``optimizer`` and ``optimizers``."""
    kwargs = OPTIMIZER_IMPL_KWARGS.get(impl, {})
    optimizer = build(**kwargs)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise SpecError(f"training spec {spec_name!r}: {what} returned {type(optimizer).__name__}, "
                        "expected a torch.optim.Optimizer")
    for key, value in kwargs.items():
        if bool(optimizer.defaults.get(key)) != value:
            raise NotApplicable(f"{type(optimizer).__name__} did not take {key}={value} (its defaults say "
                                f"{key}={optimizer.defaults.get(key)!r})")
    return optimizer


def _rebuilt(optimizer: torch.optim.Optimizer, **impl) -> torch.optim.Optimizer:
    """``optimizer`` (not stepped yet) built again by its class with ``impl`` (foreach=/fused=), its parameter groups
    and hyperparameters kept: how the implementation recipes change optimizers the spec built itself."""
    if not impl:
        return optimizer
    cls = type(optimizer)
    unknown = [key for key in impl if key not in optimizer.defaults]
    if unknown:
        raise NotApplicable(f"{cls.__name__} has no {'/'.join(unknown)} option to choose its implementation with")
    try:
        accepted = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        accepted = {}
    # The groups carry every hyperparameter; the constructor's defaults only what it takes by name.
    defaults = {key: value for key, value in optimizer.defaults.items() if key in accepted and key not in impl}
    groups = [{key: value for key, value in group.items() if key not in impl} for group in optimizer.param_groups]
    try:
        return cls(groups, **defaults, **impl)
    except (TypeError, ValueError, RuntimeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise NotApplicable(f"{cls.__name__} could not be built again with "
                            f"{', '.join(f'{k}={v}' for k, v in impl.items())}: {type(e).__name__}: {first}") from e


class NonFiniteLoss(Exception):
    """The training diverged: a loss turned NaN or infinite, so its steps measure no real training."""


def check_finite_loss(value: float, spec_name: str, when: str) -> None:
    """Raise ``NonFiniteLoss`` naming the spec and ``when`` (the step) if ``value`` is NaN or infinite."""
    if not math.isfinite(value):
        raise NonFiniteLoss(f"the loss of training spec {spec_name!r} is {value} {when}: the training diverged "
                            "(a learning rate too high, an fp16 overflow, bad data?)")


@dataclass(frozen=True)
class InjectedFault:
    """A regression planted on purpose, to prove that a regression gate catches it.

    ``slowdown``: after each step, wait for the device, then hold the host that fraction of
    the step's wall time (on a GPU the sync itself costs the overlap of one step with the next,
    so the planted slowdown is at least the fraction asked for).
    ``leak_mib``: keep that many MiB allocated on the device per step, never freed.
    """

    slowdown: float = 0.0
    leak_mib: float = 0.0


class StepContext:
    """What a custom step (``TrainingSpec.step(model, batch, ctx)``) is given besides the model and its batch: the
    optimizers, and the recipe's precision, gradient zeroing and optimizer stepping as calls, so one step states
    the training and every recipe changes how it runs.

    - ``ctx.optimizers``: the optimizers by name (a list's by position "0", "1", ...; a single one "0");
      ``ctx.optimizer(name)`` one of them (no name: the only one);
    - ``with ctx.autocast():`` the recipe's autocast dtype and attention kernel (a no-op without them);
    - ``ctx.backward(loss)``: ``loss.backward()``, through the recipe's GradScaler where it has one (one scaler
      for every loss and optimizer, as PyTorch's AMP examples use it); keyword arguments go to ``backward``;
    - ``ctx.zero_grad(optimizer)``: the recipe's way of clearing that optimizer's gradients (zeros, set_to_none,
      ``param.grad = None``);
    - ``ctx.step(optimizer)``: ``scaler.step(optimizer)`` or ``optimizer.step()`` (trainbench calls
      ``scaler.update()`` once after the whole step, and before an optimizer's second update in one step: see
      ``TrainingSetup.update_scaler``);
    - ``ctx.generator``: a generator on the device, seeded as the setup is, for the step's own random numbers
      (noise): a recipe and its baseline draw the same, whatever else draws from the global generator.

    Optimizers may be given by name wherever one is expected: ``ctx.step("D")``; with one optimizer, no name is
    needed: ``ctx.zero_grad()``, ``ctx.step()``.
    """

    def __init__(self, training: TrainingSetup):
        self._training = training
        self.optimizers = dict(training.optimizers)
        self.device = training.device
        self.generator = torch.Generator(training.device).manual_seed(training.config.seed)
        self._names = {id(optimizer): name for name, optimizer in self.optimizers.items()}

    def optimizer(self, name: str | int | None = None) -> torch.optim.Optimizer:
        if name is None:
            if len(self.optimizers) == 1:
                return next(iter(self.optimizers.values()))
            raise SpecError(f"training spec {self._training.spec.name!r}: the step named no optimizer and it has "
                            f"{len(self.optimizers)}, {sorted(self.optimizers)}: name one (ctx.step(\"name\"))")
        try:
            return self.optimizers[str(name)]
        except KeyError:
            raise SpecError(f"training spec {self._training.spec.name!r}: the step asked for optimizer {name!r}; "
                            f"its optimizers are {sorted(self.optimizers)}") from None

    def _resolve(self, optimizer: torch.optim.Optimizer | str | int | None) -> tuple[str, torch.optim.Optimizer]:
        if not isinstance(optimizer, torch.optim.Optimizer):
            optimizer = self.optimizer(optimizer)
        name = self._names.get(id(optimizer))
        if name is None:
            raise SpecError(f"training spec {self._training.spec.name!r}: the step passed an optimizer that is not "
                            f"one of ctx.optimizers ({sorted(self.optimizers)}); take them from ctx")
        return name, optimizer

    def autocast(self) -> contextlib.AbstractContextManager[None]:
        return self._training.autocast()

    def backward(self, loss: torch.Tensor, **kwargs) -> None:
        scaler = self._training.scaler
        with self._training.custom.through("backward"):
            (scaler.scale(loss) if scaler is not None else loss).backward(**kwargs)

    def zero_grad(self, optimizer: torch.optim.Optimizer | str | int | None = None) -> None:
        self._training.zero_grad(self._resolve(optimizer)[1])

    def step(self, optimizer: torch.optim.Optimizer | str | int | None = None) -> None:
        name, optimizer = self._resolve(optimizer)
        with self._training.custom.through("step"):
            self._training.step_optimizer(optimizer, name)


class FirstStepWatch:
    """What a custom step does beside its ``ctx`` at its first step, where the recipe works through ``ctx.step`` and
    ``ctx.backward``: an optimizer's ``step()`` called outside ``ctx.step`` (optimizer step pre-hooks), a backward
    outside ``ctx.backward`` where the recipe's GradScaler must scale it (hooks after each parameter's gradient
    accumulates), or no ``ctx.step`` at all. ``problem`` says which, once; its hooks are then removed, so no timed
    step pays for them."""

    def __init__(self, spec_name: str, optimizers: Mapping[str, torch.optim.Optimizer], parameters, scaled: bool):
        self.spec_name = spec_name
        self.inside: set[str] = set()  # the ctx calls running now ("step", "backward")
        self.ctx_steps = 0
        self.stray_steps: list[str] = []  # optimizers stepped outside ctx.step, by name
        self.stray_backward = False
        self._handles = [optimizer.register_step_pre_hook(functools.partial(self._stepped, name))
                         for name, optimizer in optimizers.items()]
        if scaled:  # only a GradScaler changes what ctx.backward does
            self._handles += [p.register_post_accumulate_grad_hook(self._accumulated)
                              for p in parameters if p.requires_grad]

    @contextlib.contextmanager
    def through(self, call: str) -> Iterator[None]:
        if call == "step" and self.stray_backward:  # before the GradScaler unscales what it never scaled (or asserts)
            raise SpecError(self.problem())
        self.inside.add(call)
        try:
            yield
        finally:
            self.inside.discard(call)
            self.ctx_steps += call == "step"

    def _stepped(self, name: str, optimizer, args, kwargs) -> None:
        if "step" not in self.inside and name not in self.stray_steps:
            self.stray_steps.append(name)

    def _accumulated(self, parameter: torch.Tensor) -> None:
        if "backward" not in self.inside:
            self.stray_backward = True

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def problem(self) -> str | None:
        """What the first step did beside the recipe, and what it must do instead; None where it went through ctx."""
        where = f"training spec {self.spec_name!r}: the step"
        if self.stray_steps:
            name = self.stray_steps[0]
            return (f"{where} called optimizer {name!r}'s step() itself, outside ctx.step: the recipe's optimizer step "
                    f"(its GradScaler, the guards' view of the update) never applied to it; call ctx.step({name!r}) "
                    "instead")
        if self.stray_backward:
            return (f"{where} ran a backward outside ctx.backward (loss.backward()?) under a recipe with a GradScaler: "
                    "that loss was never scaled, yet ctx.step unscales its gradients; call ctx.backward(loss) instead")
        if not self.ctx_steps:
            return (f"{where} never called ctx.step: no optimizer was updated through the recipe, so what it measures "
                    "is no training step; update each optimizer with ctx.step(optimizer)")
        return None


def graph_nodes(total) -> int:
    """Autograd nodes reachable from ``total`` (a running loss): what ``total_loss += loss`` keeps alive.

    Backward frees the tensors the graph saved, but not the graph: its nodes (and
    their metadata) pile up on the host, one step's backward graph per step.
    """
    root = getattr(total, "grad_fn", None)
    seen, stack = set(), [root] if root is not None else []
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        stack.extend(next_node for next_node, _ in node.next_functions)
    return len(seen)


class Updates:
    """The optimizers' updates of a setup, through its GradScaler where it has one: each optimizer stepped, the scaler
    updated once per step (and between two updates of one optimizer), the gradients an update steps on kept for the
    guards while ``stepped_gradients`` is a dict."""

    def __init__(self, setup: TrainingSetup):
        self.setup = setup
        # While a dict: the gradients each optimizer steps on (unscaled), by "optimizer:parameter" (the guards').
        self.stepped_gradients: dict[str, torch.Tensor] | None = None
        self._times_stepped: Counter[str] = Counter()
        self._scaled_steps: set[int] = set()  # the optimizers (ids) the GradScaler stepped since its last update

    def new_step(self) -> None:
        """A custom step starts: an optimizer stepped again in it is counted from its first update."""
        self._times_stepped.clear()

    def scaled_since_update(self, optimizer) -> bool:
        return id(optimizer) in self._scaled_steps

    def optimizer_step(self) -> None:
        """The update of every optimizer, through the GradScaler where there is one (it skips a step whose gradients
        overflowed), whose scale is then updated once."""
        for name, optimizer in self.setup.optimizers.items():
            self.step_optimizer(optimizer, name)
        self.update_scaler()

    def update_scaler(self) -> None:
        """``scaler.update()`` where the GradScaler stepped an optimizer since its last update (it fails where none
        stepped): once per step, after every optimizer stepped, as PyTorch's AMP examples do; and before an optimizer
        is stepped again in the same step, which GradScaler refuses without an update between. That one comes where
        the optimizer's gradients are cleared (``zero_grad``), so the gradients of its next update are scaled and
        unscaled at the same scale; an optimizer stepped again without being cleared through trainbench gets it
        just before the step, whose gradients are then unscaled at the updated scale (the same but after an
        overflow or a growth)."""
        if self.setup.scaler is not None and self._scaled_steps:
            self.setup.scaler.update()
        self._scaled_steps.clear()

    def step_optimizer(self, optimizer: torch.optim.Optimizer, name: str) -> None:
        """One optimizer's update: ``scaler.step(optimizer)`` or ``optimizer.step()``; while ``stepped_gradients`` is
        a dict, the (unscaled) gradients it steps on are kept there first."""
        if id(optimizer) in self._scaled_steps:
            self.update_scaler()
        if self.stepped_gradients is not None:
            self._keep_stepped_gradients(optimizer, name)
        self._apply_step(optimizer)

    def _apply_step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.setup.scaler is not None:
            self.setup.scaler.step(optimizer)
            self._scaled_steps.add(id(optimizer))
        else:
            optimizer.step()

    def _keep_stepped_gradients(self, optimizer: torch.optim.Optimizer, name: str) -> None:
        if self.setup.scaler is not None:
            self.setup.scaler.unscale_(optimizer)  # scaler.step then steps on these, unscaling no further
        names = {id(p): n for n, p in self.setup.model.named_parameters()}
        # An optimizer stepped again in one step (a critic's n updates per generator update) is "D#2", "D#3", ...
        self._times_stepped[name] += 1
        label = name if self._times_stepped[name] == 1 else f"{name}#{self._times_stepped[name]}"
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    # a copy: a later backward of the step adds to this very tensor (the generator's loss reaches D)
                    self.stepped_gradients[f"{label}:{names.get(id(p), '?')}"] = gradient_copy(p.grad)


class CustomStep:
    """A spec's own step (``TrainingSpec.step``) on a setup: the ``StepContext`` it is given, and the watch of its
    first step for what it does beside the context (an optimizer stepped or a backward run around the recipe)."""

    def __init__(self, setup: TrainingSetup):
        self.setup = setup
        self.context = StepContext(setup)
        self._watch: FirstStepWatch | None = FirstStepWatch(setup.spec.name, setup.optimizers, setup.model.parameters(),
                                                            setup.scaler is not None)
        setup._closers.callback(self._watch.remove)

    def step(self, micro_batches: list) -> torch.Tensor:
        """The spec's own step on the step's batch (one: no accumulation for a custom step), then the GradScaler's
        one update. Returns the loss the step reports."""
        setup = self.setup
        [batch] = micro_batches
        setup.updates.new_step()
        loss = setup.spec.step(setup.forward, setup.to_device(batch), self.context)
        if not setup._loss_checked:
            setup.check_loss_returned(loss, "step")
            setup._loss_checked = True
        if self._watch is not None:  # the first step: did the recipe apply?
            watch, self._watch = self._watch, None
            watch.remove()
            problem = watch.problem()
            if problem:
                raise SpecError(problem)
        setup.update_scaler()
        return loss

    def through(self, call: str) -> contextlib.AbstractContextManager[None]:
        """Around ``ctx.step`` and ``ctx.backward``: what the first step's watch counts as done through the recipe."""
        return self._watch.through(call) if self._watch is not None else contextlib.nullcontext()


class TrainingSetup:
    """A ready-to-run training setup: ``step(fetch(batches()))`` trains on one optimizer step's data."""

    notes: tuple[str, ...] = ()  # what building it changed that its results must say (e.g. which conv biases went)

    batch_source = BatchSource  # where its batches come from (a prediction's never reads a real loader)
    updates_class = Updates  # how its optimizers update (a prediction's asks no gradient for a value)

    # Steps (and forward-backward passes) run since the seeds: a measurement that starts at 0 sees the seeded
    # trajectory in its first steps (Measurer.seeded_losses), the loss guard's reference
    steps_run = 0

    def __init__(self, config: TrainConfig, spec: TrainingSpec, backend: Backend, fault: InjectedFault | None = None,
                 micro_batches_are_shards: bool = False, dropout_off: bool = False):
        """``micro_batches_are_shards``: the accumulated micro-batches stand for the shards of data-parallel ranks (the
        one-process reference of a DDP case), which each normalize their own samples as the micro-batches do; any
        other accumulation over a BatchNorm that uses batch statistics trains differently and is ``NotApplicable``.
        ``dropout_off``: the model's dropout draws nothing (``switch_dropout_off``), for a guard that compares a batch
        with its micro-batches."""
        self.config = config = config.validate()
        self.micro_batches_are_shards, self.dropout_off = micro_batches_are_shards, dropout_off
        reason = spec_unmet(spec, config)
        if reason:
            raise NotApplicable(reason)
        self.spec, self.fault, self.backend, self.device = spec, fault, backend, backend.device
        self._leaked: list[torch.Tensor] = []
        self.samples_per_step = config.step_batch_size(spec)
        self._closers = contextlib.ExitStack()
        torch.manual_seed(config.seed)
        self.notes = ()
        self.loss_total: torch.Tensor | float = 0.0  # the running loss a loss_history knob keeps
        self.pending_loss: torch.Tensor | None = None  # summed on the device until the next logged sync
        self.steps_done = 0
        self.normalize_pixels = spec.pixel_normalize()
        # Each stage's knob hooks, asked once: a step applies several stages, and the rounds time the step
        self.hooks = {stage: config.effects(stage) for stage in STAGES}
        # What each knob's process-wide setting yielded, for its later hooks (the left-on profiler to step)
        self.entered = {name: self._closers.enter_context(hook(self, value)) for name, value, hook in self.hooks["process"]}

        self.data = self.batch_source(self)
        self.loader, self.batch_size, self.synthetic = self.data.loader, self.data.batch_size, self.data.synthetic
        # the live stream, the fixed window, what a step's micro-batches hold: the batch source's answers
        self.batches, self.batches_from_start = self.data.batches, self.data.batches_from_start
        self.items_of, self.h2d_bytes = self.data.items_of, self.data.h2d_bytes
        self.model = self._model(spec, config)  # the plain module: parameter names, memory tracking, the optimizers
        module = self.model
        for stage in ("parallel", "compiled"):  # data parallelism first, then compiling what the step calls
            for _, value, hook in self.hooks[stage]:
                module = hook(self, module, value)
        self.forward = module
        self.optimizers = build_optimizers(spec, self.model, config.optimizer_impl)
        self.scaler: torch.amp.GradScaler | None = None  # a GradScaler, where a knob's setup hook makes one
        for _, value, hook in self.hooks["setup"]:
            hook(self, value)
        self.custom = CustomStep(self) if spec.custom_step else None  # the spec's own step, where it has one
        self.context = self.custom.context if self.custom is not None else None
        self.updates = self.updates_class(self)
        self.optimizer_step, self.step_optimizer = self.updates.optimizer_step, self.updates.step_optimizer
        self.update_scaler = self.updates.update_scaler
        self._loss_checked = False

        # Called before every loss computation: the memory tracker follows one forward of the
        # root module at a time, and a step may run several (accumulation, a loss computed twice).
        self.before_forward = None
        self.last_items: torch.Tensor | None = None  # the items of the last fetched step (TrainingSpec.items)
        self._last_loss: torch.Tensor | None = None  # what the last step returned, for check_loss
        self._finite_at = 0  # the last step whose loss check_loss found finite

    def _model(self, spec: TrainingSpec, config: TrainConfig) -> torch.nn.Module:
        """The spec's model on the device in training mode, with each knob's model change (each checked to have had
        an effect: what only the built model tells raises ``NotApplicable``)."""
        model = spec.model()
        if not isinstance(model, torch.nn.Module):
            raise SpecError(f"training spec {spec.name!r}: model() returned {type(model).__name__}, expected an nn.Module")
        model = module_to(model, self.device).train()
        for _, value, hook in self.hooks["model"]:
            model = hook(self, model, value)
        if self.dropout_off:
            switch_dropout_off(model)
        return model

    def fetch(self, batches: Iterator) -> list:
        """The loader batches one optimizer step consumes (``accumulation_steps`` micro-batches)."""
        micro_batches = self.data.step_batches(batches)
        beat()  # progress for the case's watchdog (trainbench.core.harness.watchdog)
        self.last_items = self.items_of(micro_batches)
        return micro_batches

    def to_device(self, batch: Batch) -> Batch:
        """Every tensor of the batch on the device; uint8 images normalized there, channels-last where asked."""
        batch = batch_to_device(batch, self.device, self.config.non_blocking)
        for _, value, hook in self.hooks["batch"]:
            batch = hook(self, batch, value)
        return batch

    # -- the step -------------------------------------------------------------------
    def _loss(self, batch, on_device: bool = False) -> torch.Tensor:
        if not on_device:
            batch = self.to_device(batch)
        if self.before_forward is not None:
            self.before_forward()
        with self.autocast():
            loss = self.spec.loss_fn(self.forward, batch)
        if not self._loss_checked:
            self.check_loss_returned(loss, "loss_fn")
            if self.config.trains and not loss.requires_grad:  # else backward's "element 0 of tensors ..."
                raise SpecError(f"training spec {self.spec.name!r}: loss_fn returned a loss that does not require "
                                "grad (computed under no_grad, detached, or from no trainable parameter)")
            self._loss_checked = True
        return loss

    def check_loss_returned(self, loss, what: str) -> None:
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.is_floating_point():
            got = f"a tensor of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else type(loss).__name__
            raise SpecError(f"training spec {self.spec.name!r}: {what} returned {got}, expected a scalar "
                            "floating-point tensor")

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """The knobs' contexts around a forward and its loss (autocast, an attention kernel, a grad mode)."""
        with contextlib.ExitStack() as around:
            for _, value, hook in self.hooks["forward"]:
                around.enter_context(hook(self, value))
            yield

    def zero_grad(self, optimizer: torch.optim.Optimizer | None = None) -> None:
        """The config's way of clearing gradients: of ``optimizer``'s parameters, or (None) of the whole model's.

        Clearing an optimizer the GradScaler stepped since its last update starts that optimizer's next update in
        the step (a critic's n updates): the scaler is updated first, before the backward that scales its gradients.
        """
        if optimizer is None or self.updates.scaled_since_update(optimizer):
            self.update_scaler()
        for _, value, hook in self.hooks["zero_grad"]:
            hook(self, optimizer, value)

    def forward_backward(self, micro_batches: list) -> torch.Tensor:
        """Gradients of one optimizer step's data, in the seeds' order (forward, zero_grad, backward).

        Under accumulation each micro-batch's loss is weighted by its share of the step (1/k, or its share of the
        step's items where the spec counts them), so the summed gradients equal those of the whole batch.
        Returns the step's (mean) loss with its graph, as a training loop sees it.
        """
        self.steps_run += 1
        items_weighted = len(micro_batches) > 1 and self.spec.items is not None
        if items_weighted:
            # Every micro-batch on the device first and its items counted there: counts made on the host would each
            # be copied to the device inside the step, a host-device sync per micro-batch on a GPU.
            micro_batches = [self.to_device(batch) for batch in micro_batches]
        weights = self.accumulation_weights(micro_batches)
        total = None
        for i, batch in enumerate(micro_batches):
            loss = self._loss(batch, on_device=items_weighted)
            if isinstance(weights, list):
                loss = loss * weights[i].to(dtype=loss.dtype)  # a dtype only: the weight is where its batch is
            elif weights is not None:
                loss = loss / weights
            if i == 0:
                self.zero_grad()
            (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
            total = loss if total is None else total + loss
        return total

    def accumulation_weights(self, micro_batches: list) -> list[torch.Tensor] | int | None:
        """Each micro-batch's share of the step's mean loss: a divisor k, or a weight per micro-batch (None: one
        batch). A mean over samples is divided by k (equal micro-batches); a mean over items whose count differs
        between micro-batches (a padded LM's tokens) gets its share of the step's items, as averaging k means equally
        is not the whole batch's mean. Weights are computed where the counts are (the device for batches moved
        there; an ``items`` returning a number gives a host scalar, which a device op reads as an argument)."""
        k = len(micro_batches)
        if k == 1:
            return None
        counts = [self.spec.count_items(batch) for batch in micro_batches]
        if counts[0] is None:
            return k
        total = sum(counts[1:], counts[0]).clamp(min=1e-12)  # a step without items: weights 0, not NaN
        return [count / total for count in counts]

    def evaluate(self, micro_batches: list) -> torch.Tensor:
        """An evaluation step: forward and loss only (under the grad mode of the evaluation knob's forward hook)."""
        return self._loss(micro_batches[0])

    def step(self, micro_batches: list) -> torch.Tensor:
        """One optimizer step (or one evaluation batch). Returns the detached loss (no host sync)."""
        try:
            self.steps_run += 1
            loss = self._step(micro_batches)
            beat()
            return loss
        except RuntimeError as e:  # a knob may know what the error means for the recipe (no such kernel here)
            for _, value, hook in self.hooks["error"]:
                instead = hook(self, e, value)
                if instead is not None:
                    raise instead from e
            raise

    def _step(self, micro_batches: list) -> torch.Tensor:
        started = self.backend.clock()
        if not self.config.trains:
            loss = self.evaluate(micro_batches)
        elif self.custom is not None:
            loss = self.custom.step(micro_batches)
        else:
            loss = self.forward_backward(micro_batches)
            self.optimizer_step()
        for _, value, hook in self.hooks["after_step"]:
            hook(self, loss, value)
        self.steps_done += 1
        if self.fault is not None and self.fault.slowdown:
            # The whole step, device work included: on a GPU the host's share is only the launches,
            # and a wait of a fraction of that would hide behind the queued kernels.
            self.backend.busy_wait(self.fault.slowdown * self.backend.elapsed_since(started))
        if self.fault is not None and self.fault.leak_mib:
            self._leaked.append(torch.empty(int(self.fault.leak_mib * 2**20), dtype=torch.uint8, device=self.device))
        self._last_loss = loss.detach()
        return self._last_loss

    def check_loss(self, when: str) -> None:
        """``NonFiniteLoss`` if the last step's loss is NaN or infinite, naming that step and the last one found
        finite. It waits for the device: call it outside timed rounds (the steps themselves never sync for it)."""
        if self._last_loss is None:
            return
        since = f"; finite when checked at step {self._finite_at}" if self._finite_at else ""
        check_finite_loss(float(self._last_loss), self.spec.name, f"at step {self.steps_done} ({when}{since})")
        self._finite_at = self.steps_done

    def retained_graph_nodes(self) -> int:
        """Autograd nodes reachable from the running loss: what ``total_loss += loss`` keeps alive."""
        return graph_nodes(self.loss_total)

    @property
    def compiles(self) -> bool:
        """Whether this setup's step runs compiled code: the recipe compiles it, or the spec's model came compiled
        (``compiled_by_user``)."""
        return self.config.compiles or compiled_by_user(self.model)

    def close(self) -> None:
        """Stop loader workers and restore global flags this setup changed."""
        self.data.close()
        self._closers.close()
        if self.compiles:
            # Dynamo's caches and guards outlive the model: a later case would reuse or recompile them
            # (a new batch size recompiles with a dynamic batch dimension). Each compiled case starts clean.
            torch._dynamo.reset()

    def __enter__(self) -> TrainingSetup:  # noqa: PYI034 (typing.Self needs Python 3.11)
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def dropout_sites(model: torch.nn.Module) -> list[str]:
    """The model's modules that draw random masks in training: ``nn.Dropout`` and its kin with p > 0, and modules
    that keep a dropout probability of their own for a functional call (Hugging Face attention's ``dropout_prob``,
    ``attention_dropout``)."""
    return [name or type(module).__name__ for name, module in model.named_modules()
            if (isinstance(module, torch.nn.modules.dropout._DropoutNd) and module.p > 0)
            or any(_dropout_probability(module, attr) for attr in vars(module))]


def _dropout_probability(module: torch.nn.Module, attr: str) -> bool:
    value = getattr(module, attr, None)
    return "dropout" in attr and isinstance(value, float) and 0 < value < 1


def switch_dropout_off(model: torch.nn.Module) -> None:
    """Every ``dropout_sites`` module's probability to 0: the model trains as before, drawing no random mask."""
    for module in model.modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd):
            module.p = 0.0
        for attr in [a for a in vars(module) if _dropout_probability(module, a)]:
            setattr(module, attr, 0.0)


@contextlib.contextmanager
def dropout_switched_off(model: torch.nn.Module):
    """``switch_dropout_off`` for the block only: each probability is put back after it (a rank's guard gradients
    are taken without masks, its measured steps with them)."""
    saved = [(module, "p", module.p) for module in model.modules()
             if isinstance(module, torch.nn.modules.dropout._DropoutNd)]
    saved += [(module, attr, getattr(module, attr)) for module in model.modules() for attr in list(vars(module))
              if _dropout_probability(module, attr)]
    switch_dropout_off(model)
    try:
        yield
    finally:
        for module, attr, value in saved:
            setattr(module, attr, value)


def sparse_gradients(model: torch.nn.Module) -> bool:
    """Whether the model's backward makes sparse gradients (``nn.Embedding``/``nn.EmbeddingBag`` with sparse=True)."""
    return any(getattr(module, "sparse", False) is True for module in model.modules())


def gradient_copy(grad: torch.Tensor, device: str = "cpu") -> torch.Tensor:
    """A float32 copy of a gradient to compare with another (guards, ranks): a sparse one (an embedding with
    ``sparse=True``) as the dense tensor it adds to its parameter, so that every gradient compares element by element
    whatever its layout. A copy: a later backward may add to the live one."""
    grad = grad.detach()
    if grad.is_sparse:
        grad = grad.to_dense()
    return grad.to(device, torch.float32, copy=True)
