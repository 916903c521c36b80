"""A model the project compiles itself (``torch.compile(model)``): measured as it runs, never re-compiled."""

import pytest
import torch
from torch import nn

from trainbench import TrainingSpec, classification_loss


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.LayerNorm(128), nn.Linear(128, 128), nn.GELU())
        self.head = nn.Linear(128, 10)

    def forward(self, x):
        return self.head(self.body(x))


def compiled_classifier():
    return torch.compile(Classifier())  # as the project trains it


SPEC = TrainingSpec(
    name="compiled_classifier", model=compiled_classifier, loss_fn=classification_loss, batch_size=64,
    optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3),
    batches=lambda n, gen: (torch.randn(n, 64, generator=gen), torch.randint(0, 10, (n,), generator=gen)),
)


@pytest.mark.trainbench_slow  # Inductor compiles each setup: seconds, not milliseconds
@pytest.mark.parametrize("recipe", ["baseline", "compile"])
def test_compiled_classifier(train_bench, recipe):
    train_bench(recipe, SPEC)
