"""A two-input (image, text) contrastive model with its own loss, nested dict batches and Adam."""

import functools

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset

from trainbench import TrainingSpec


class TwoTowers(nn.Module):
    def __init__(self):
        super().__init__()
        self.image = nn.Sequential(nn.Conv2d(3, 16, 3, stride=2), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                   nn.Linear(16, 32))
        self.text = nn.EmbeddingBag(1000, 32)

    def forward(self, images, tokens):
        return F.normalize(self.image(images), dim=-1), F.normalize(self.text(tokens), dim=-1)


class Pairs(Dataset):
    def __init__(self, size=512):
        self.images, self.tokens = torch.randn(size, 3, 32, 32), torch.randint(0, 1000, (size, 16))

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return {"image": self.images[i], "text": {"ids": self.tokens[i]}}


def contrastive_loss(model, batch):
    image, text = model(batch["image"], batch["text"]["ids"])
    logits, labels = image @ text.T / 0.07, torch.arange(len(image), device=image.device)
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2


SPEC = TrainingSpec(name="two_towers", model=TwoTowers, loss_fn=contrastive_loss, dataset=Pairs, batch_size=32,
                    optimizer=functools.partial(torch.optim.Adam, lr=1e-3))


@pytest.mark.parametrize("recipe", ["baseline", "channels_last", "set_to_none", "multiprocess_loading"])
def test_two_towers(train_bench, recipe):
    train_bench(recipe, SPEC)
