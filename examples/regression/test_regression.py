"""An MSE regression on float targets with plain SGD: the spec states its loss, nothing is assumed."""

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import TensorDataset

from trainbench import TrainingSpec

SPEC = TrainingSpec(
    name="price_regression",
    model=lambda: nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1)),
    loss_fn=lambda model, batch: F.mse_loss(model(batch[0]).squeeze(-1), batch[1]),
    optimizer=lambda params: torch.optim.SGD(params, lr=0.01),  # takes no foreach=/fused=: those recipes skip
    dataset=lambda: TensorDataset(torch.randn(2048, 16), torch.randn(2048)),
    batch_size=64,
)


@pytest.mark.parametrize("recipe", ["baseline", "larger_batch", "grad_accumulation", "optimizer_fused"])
def test_price_regression(train_bench, recipe):
    train_bench(recipe, SPEC)
