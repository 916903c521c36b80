"""trainbench: measured, budgeted PyTorch training steps as pytest benchmarks.

The public API (imported lazily: the pytest plugin loads this package in every session,
and a session that runs no trainbench case should not pay for importing torch):

- ``TrainingSpec``: a training stated in plain Python (``trainbench.core.setups.spec``);
- ``StepContext``: what a spec's own training step (``TrainingSpec.step``) is given: the optimizers, the
  recipe's autocast, backward, zero_grad and optimizer step (``trainbench.core.setups.training``);
- ``Recipe``: an optimization as a change to the training config (``trainbench.core.setups.recipes``);
- ``from_lightning``: a spec from a LightningModule's ``training_step`` and ``configure_optimizers`` (automatic or
  manual optimization), with or without a datamodule (``trainbench.core.setups.lightning_adapter``);
- ``classification_loss``: the loss of ``(inputs, class labels)`` batches, for specs that want it.
"""

import importlib

__version__ = "0.1.0"

_PUBLIC = {"TrainingSpec": "spec", "classification_loss": "spec", "Recipe": "recipes", "StepContext": "training",
           "from_lightning": "lightning_adapter"}  # each in trainbench.core.setups
__all__ = ["Recipe", "StepContext", "TrainingSpec", "classification_loss", "from_lightning"]


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(importlib.import_module(f"trainbench.core.setups.{_PUBLIC[name]}"), name)
    raise AttributeError(f"module 'trainbench' has no attribute {name!r}")
