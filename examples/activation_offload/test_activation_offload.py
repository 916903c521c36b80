"""An optimization of the team's own, gated like the built-in ones: saved activations kept in host memory.

``trainbench.knob`` adds a knob with what it does (here around each forward: autograd keeps the tensors it saves
for backward on the host), ``trainbench.recipe`` a recipe turning it, with its guard: the loss and the first
step's gradients must equal the baseline's (the same numbers, only stored elsewhere).
"""

import pytest
import torch
from torch import nn

from trainbench import TrainingSpec, classification_loss, knob, recipe

knob("offload_activations", False, forward=lambda setup, on: torch.autograd.graph.save_on_cpu())
recipe("activation_offload", "activations saved for backward kept in host memory",
       {"offload_activations": True}, loss_rtol=1e-6, grad_rtol=1e-6)

SPEC = TrainingSpec(
    name="tabular_mlp",
    model=lambda: nn.Sequential(nn.Linear(32, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 10)),
    loss_fn=classification_loss,
    optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3),
    batches=lambda batch_size, generator: (torch.randn(batch_size, 32, generator=generator),
                                           torch.randint(0, 10, (batch_size,), generator=generator)),
    batch_size=64,
)


@pytest.mark.parametrize("recipe", ["baseline", "activation_offload"])
def test_tabular_mlp(train_bench, recipe):
    train_bench(recipe, SPEC)
