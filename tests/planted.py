"""Training specs with a change planted in one process by an environment variable, for A/B tests of attribution.

The change is PyTorch's or the model's, never trainbench's own fault injection:

- ``TRAINBENCH_TEST_SLOW_OP_MS=N``: importing this module replaces ``aten::gelu``'s CPU kernel by a Python one
  that computes the same function from other ops and sleeps N ms first (a regression of one aten op, as a
  slower kernel in a new release would be; a sleep: a margin no load on the machine can erase);
- ``TRAINBENCH_TEST_LEAK=1``: ``Net.leaky`` keeps each forward's output alive (a leak in one module).
"""

from __future__ import annotations

import functools
import math
import os
import time

import torch
from torch import nn

from trainbench.core.setups.spec import TrainingSpec, classification_loss

SLOW_OP_MS = "TRAINBENCH_TEST_SLOW_OP_MS"
LEAK = "TRAINBENCH_TEST_LEAK"


def _plant_slow_gelu(ms: float) -> torch.library.Library:
    library = torch.library.Library("aten", "IMPL")

    def slow_gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
        time.sleep(ms / 1e3)
        if approximate == "tanh":
            return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x.pow(3))))
        return 0.5 * x * (1.0 + torch.erf(x * (1 / math.sqrt(2))))

    library.impl("gelu", slow_gelu, "CPU")
    return library  # the override lasts while the library object lives


_SLOW_GELU = _plant_slow_gelu(float(os.environ[SLOW_OP_MS])) if os.environ.get(SLOW_OP_MS) else None


class Leaky(nn.Module):
    """A pointwise step whose output it keeps, every forward, where the environment plants a leak."""

    def __init__(self, may_leak: bool):
        super().__init__()
        self.leaks = may_leak and bool(os.environ.get(LEAK))
        self.kept: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.tanh(x)  # allocated here: the site is this module's
        if self.leaks:
            self.kept.append(out.detach())
        return out


class Net(nn.Module):
    def __init__(self, activation: type[nn.Module], may_leak: bool = False):
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.act = activation()
        self.leaky = Leaky(may_leak)
        self.fc2 = nn.Linear(64, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.leaky(self.act(self.fc1(x))))


def _batches(batch_size: int, generator: torch.Generator):
    inputs = torch.randn((batch_size, 32), generator=generator, device=generator.device)
    return inputs, torch.randint(0, 4, (batch_size,), generator=generator, device=generator.device)


_SGD = functools.partial(torch.optim.SGD, lr=0.01)
GELU_NET = TrainingSpec("planted_gelu", lambda: Net(nn.GELU), loss_fn=classification_loss, optimizer=_SGD,
                        batch_size=16, batches=_batches)
# ReLU: the leak is judged beside an unchanged step, whatever the gelu override does in the same process
LEAKY_NET = TrainingSpec("planted_leak", lambda: Net(nn.ReLU, may_leak=True), loss_fn=classification_loss,
                         optimizer=_SGD, batch_size=16, batches=_batches)
