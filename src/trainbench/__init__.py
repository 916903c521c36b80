"""trainbench: measured, budgeted PyTorch training steps as pytest benchmarks.

The public API (imported lazily: the pytest plugin loads this package in every session,
and a session that runs no trainbench case should not pay for importing torch):

- ``TrainingSpec``: a training stated in plain Python (``trainbench.core.setups.spec``);
- ``StepContext``: what a spec's own training step (``TrainingSpec.step``) is given: the optimizers, the
  recipe's autocast, backward, zero_grad and optimizer step (``trainbench.core.setups.training``);
- ``Recipe``: an optimization as a change to the training config (``trainbench.core.setups.recipes``);
- ``from_lightning``: a spec from a LightningModule's ``training_step`` and ``configure_optimizers`` (automatic or
  manual optimization), with or without a datamodule (``trainbench.core.setups.lightning_adapter``);
- ``classification_loss``: the loss of ``(inputs, class labels)`` batches, for specs that want it;
- ``knob`` and ``recipe``: an optimization of a user's own, as one entry like the built-in ones: a new knob with what it
  does (``model=``, ``batch=``, ``forward=``, ``after_step=``, ``process=`` hooks) and a recipe turning it, with its
  guard tolerances, requirements (``Requirements``) and baseline (``trainbench.core.setups.recipes``).
"""

import importlib

__version__ = "0.1.0"

# name -> (module of trainbench.core.setups, its attribute)
_PUBLIC = {"TrainingSpec": ("spec", "TrainingSpec"), "classification_loss": ("spec", "classification_loss"),
           "Recipe": ("recipes", "Recipe"), "Requirements": ("recipes", "Requirements"),
           "ByProfile": ("recipes", "ByProfile"), "knob": ("recipes", "register_knob"),
           "recipe": ("recipes", "new_recipe"), "StepContext": ("training", "StepContext"),
           "from_lightning": ("lightning_adapter", "from_lightning")}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    if name in _PUBLIC:
        module, attribute = _PUBLIC[name]
        return getattr(importlib.import_module(f"trainbench.core.setups.{module}"), attribute)
    raise AttributeError(f"module 'trainbench' has no attribute {name!r}")
