"""A recommendation model: sparse embedding bags (``sparse=True``) trained by SparseAdam, a dense tower by Adam."""

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from trainbench import TrainingSpec

USERS, ITEMS, WIDTH, HISTORY = 5000, 20000, 32, 8


class TwoTower(nn.Module):
    def __init__(self):
        super().__init__()
        self.users = nn.EmbeddingBag(USERS, WIDTH, mode="mean", sparse=True)
        self.items = nn.EmbeddingBag(ITEMS, WIDTH, mode="mean", sparse=True)
        self.tower = nn.Sequential(nn.Linear(2 * WIDTH, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, user, history):
        # one user id, then HISTORY item ids per sample: equal-length bags as 2-D inputs
        return self.tower(torch.cat([self.users(user), self.items(history)], dim=1)).squeeze(-1)


def clicks(n, gen):
    return {"user": torch.randint(0, USERS, (n, 1), generator=gen),
            "history": torch.randint(0, ITEMS, (n, HISTORY), generator=gen),
            "clicked": torch.randint(0, 2, (n,), generator=gen).float()}


def click_loss(model, batch):
    return F.binary_cross_entropy_with_logits(model(batch["user"], batch["history"]), batch["clicked"])


def optimizers(model):
    sparse = [*model.users.parameters(), *model.items.parameters()]
    return {"embeddings": torch.optim.SparseAdam(sparse, lr=1e-3), "tower": torch.optim.Adam(model.tower.parameters())}


SPEC = TrainingSpec(name="two_tower", model=TwoTower, loss_fn=click_loss, optimizers=optimizers, batches=clicks,
                    batch_size=256)


@pytest.mark.parametrize("recipe", ["baseline", "set_to_none", "larger_batch", "grad_accumulation",
                                    "optimizer_foreach"])
def test_two_tower(train_bench, recipe):
    train_bench(recipe, SPEC)
