"""A training spec from a Lightning module: its ``training_step`` and ``configure_optimizers``, with or without a
datamodule, in one line (``trainbench.from_lightning``).

No ``Trainer`` runs: trainbench drives the step, so its recipes (AMP, set_to_none, foreach/fused, compile...) and
its timing apply as to any spec. What a Trainer would add around the step (logging, callbacks, learning-rate
schedulers) is not run and not timed: ``self.log`` without a Trainer is Lightning's own no-op, and a scheduler
returned by ``configure_optimizers`` is left out (its per-step cost is a few scalar updates).

- automatic optimization (Lightning's default): the loss is what ``training_step(batch, 0)`` returns (a tensor, or
  a dict's ``"loss"``); the optimizer is the one ``configure_optimizers`` builds. As Lightning's own strategies
  do, the module is wrapped in a root whose ``forward`` is its ``training_step``, so what wraps the root's forward
  (``torch.compile``, DDP's gradient hooks, the memory tracker) wraps the whole step;
- manual optimization (``self.automatic_optimization = False``, e.g. a GAN's alternating updates): the module's
  own ``training_step`` runs as the spec's custom step; ``self.optimizers()``, ``self.manual_backward``,
  ``optimizer.step()`` / ``zero_grad()`` and ``self.toggle_optimizer`` go through trainbench's step context, so a
  GradScaler and the zero-grad recipes apply as a Trainer's precision plugin would apply them.

Lightning's reading of ``configure_optimizers``'s many return shapes is Lightning's own (``_configure_optimizers``,
the one private of Lightning used here).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from typing import Any

import torch

from trainbench.core.setups.spec import Batch, SpecError, TrainingSpec


def lightning_optimizers(module) -> list[torch.optim.Optimizer]:
    """The optimizers ``module.configure_optimizers()`` returns, in any of the shapes Lightning accepts (schedulers
    left out)."""
    from lightning.pytorch.core.optimizer import _configure_optimizers  # optional: only a LightningModule's spec asks

    optimizers, _schedulers, _monitor = _configure_optimizers(module.configure_optimizers())
    if not optimizers:
        raise SpecError(f"{type(module).__name__}.configure_optimizers() returned no optimizer")
    return list(optimizers)


@contextlib.contextmanager
def _no_trainer_log_warning():
    """``self.log`` without a Trainer is Lightning's documented no-op, but it warns at every call: not the user's
    problem here, where no Trainer runs by design."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"You are trying to `self.log\(\)` but the `self.trainer` reference")
        yield


def training_step_loss(output: Any, module_name: str) -> torch.Tensor:
    """The loss of a ``training_step`` output: a tensor, or a dict's ``"loss"`` (Lightning's two forms)."""
    if isinstance(output, dict):
        output = output.get("loss")
    if not isinstance(output, torch.Tensor):
        raise SpecError(f"{module_name}.training_step returned {type(output).__name__}: expected the loss tensor or a "
                        "dict with 'loss' (a step returning None trains nothing to measure)")
    return output


class TrainingStepModule(torch.nn.Module):
    """The root module of a Lightning spec: ``forward(batch)`` is the LightningModule's ``training_step(batch, 0)``
    (Lightning's strategies wrap a module the same way for DDP), the module itself ``.module``."""

    def __init__(self, module: torch.nn.Module):
        super().__init__()
        self.module = module

    def forward(self, batch: Batch):
        with _no_trainer_log_warning():
            return self.module.training_step(batch, 0)

    def to(self, *args, **kwargs) -> TrainingStepModule:
        # Through the LightningModule's own ``to`` (Lightning's DeviceDtypeModuleMixin): nn.Module.to on this root
        # would move the tensors but leave ``self.device`` and ``self.dtype`` at cpu and float32, and a
        # training_step making tensors with ``device=self.device`` would put them on the wrong device.
        self.module.to(*args, **kwargs)
        return super().to(*args, **kwargs)


class _ContextOptimizer:
    """An optimizer as ``self.optimizers()`` gives it to a manual ``training_step``: ``step`` and ``zero_grad`` through
    trainbench's step context (the GradScaler, the zero-grad recipe), everything else the optimizer's own."""

    def __init__(self, optimizer: torch.optim.Optimizer, context):
        self.optimizer, self._context = optimizer, context

    def step(self, closure: Callable | None = None):
        if closure is not None:
            closure()
        self._context.step(self.optimizer)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._context.zero_grad(self.optimizer)

    def __getattr__(self, name: str):
        return getattr(self.optimizer, name)


def _manual_step(module_name: str) -> Callable:
    """A custom step running a manual-optimization module's own ``training_step`` through the step context."""

    def step(model, batch: Batch, context) -> torch.Tensor:
        module = getattr(model, "_orig_mod", model).module  # the LightningModule inside the root
        optimizers = [_ContextOptimizer(opt, context) for opt in context.optimizers.values()]
        saved = {name: module.__dict__.get(name) for name in ("optimizers", "manual_backward", "toggle_optimizer",
                                                              "untoggle_optimizer")}
        state: dict = {}
        module.optimizers = lambda use_pl_optimizer=True: optimizers[0] if len(optimizers) == 1 else optimizers
        module.manual_backward = lambda loss, *args, **kwargs: context.backward(loss)
        module.toggle_optimizer = lambda optimizer: _toggle(state, context, optimizer)
        module.untoggle_optimizer = lambda optimizer: _untoggle(state)
        try:
            with _no_trainer_log_warning():
                output = module.training_step(batch, 0)
        finally:
            for name, value in saved.items():
                if value is None:
                    module.__dict__.pop(name, None)
                else:
                    module.__dict__[name] = value
        if output is None:  # a manual step may return nothing: the last loss it backpropagated is not known
            return torch.zeros(())
        return training_step_loss(output, module_name).detach()

    return step


def _toggle(state: dict, context, optimizer) -> None:
    """Lightning's ``toggle_optimizer``: only ``optimizer``'s parameters require grad until untoggled."""
    optimizer = getattr(optimizer, "optimizer", optimizer)
    everything = [p for opt in context.optimizers.values() for group in opt.param_groups for p in group["params"]]
    state.setdefault("requires_grad", {p: p.requires_grad for p in everything})
    for p in everything:
        p.requires_grad = False
    for group in optimizer.param_groups:
        for p in group["params"]:
            p.requires_grad = state["requires_grad"][p]


def _untoggle(state: dict) -> None:
    for p, requires_grad in state.pop("requires_grad", {}).items():
        p.requires_grad = requires_grad


def from_lightning(module: Callable[[], Any], *, name: str, batch_size: int | None = None,
                   datamodule: Callable[[], Any] | None = None, **spec_fields) -> TrainingSpec:
    """A ``TrainingSpec`` of a LightningModule: ``module()`` builds it (random weights), ``datamodule()`` (optional)
    its data (``setup("fit")`` then ``train_dataloader()``'s dataset, collate function and batch size), else give
    ``batches=`` or ``dataset=`` as for any spec. ``spec_fields`` go to ``TrainingSpec`` (``checkpoint_blocks``,
    ``items``...)."""
    probe = module()
    module_name = type(probe).__name__
    if not hasattr(probe, "training_step") or not hasattr(probe, "configure_optimizers"):
        raise SpecError(f"training spec {name!r}: {module_name} has no training_step/configure_optimizers: expected a "
                        "LightningModule")
    manual = getattr(probe, "automatic_optimization", True) is False
    del probe
    if datamodule is not None:
        loader = _train_loader(datamodule, name)
        spec_fields.setdefault("dataset", lambda: loader.dataset)
        spec_fields.setdefault("collate_fn", loader.collate_fn)
        batch_size = batch_size or loader.batch_size
    if batch_size is None:
        raise SpecError(f"training spec {name!r}: give batch_size (or a datamodule whose train_dataloader has one)")
    if manual:
        spec_fields["step"] = _manual_step(module_name)
    else:
        spec_fields["loss_fn"] = lambda model, batch: training_step_loss(model(batch), module_name)
    # Block names are the module's own; in the root they sit under ``module.``.
    spec_fields["checkpoint_blocks"] = [f"module.{block}" for block in spec_fields.get("checkpoint_blocks", ())]
    return TrainingSpec(name=name, model=lambda: TrainingStepModule(module()),
                        optimizers=lambda root: lightning_optimizers(root.module), batch_size=batch_size, **spec_fields)


def _train_loader(datamodule: Callable[[], Any], name: str):
    data = datamodule()
    data.setup("fit")
    loader = data.train_dataloader()
    if not isinstance(loader, torch.utils.data.DataLoader):
        raise SpecError(f"training spec {name!r}: {type(data).__name__}.train_dataloader() returned "
                        f"{type(loader).__name__}: expected one DataLoader")
    return loader
