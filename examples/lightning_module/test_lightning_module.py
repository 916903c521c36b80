"""A LightningModule benchmarked as it is written: its training_step and configure_optimizers, its datamodule's data,
no Trainer (trainbench drives the step, so its recipes and timing apply)."""

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from trainbench import from_lightning

L = pytest.importorskip("lightning.pytorch")


class Classifier(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 256), nn.ReLU(), nn.Linear(256, 10))

    def training_step(self, batch, batch_idx):
        images, labels = batch
        loss = F.cross_entropy(self.net(images), labels)
        self.log("train_loss", loss)  # Lightning's no-op without a Trainer
        return loss

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=1e-3)
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, step_size=100)}


class RandomImages(L.LightningDataModule):
    def setup(self, stage):
        generator = torch.Generator().manual_seed(0)
        self.train = torch.utils.data.TensorDataset(torch.randn(512, 3, 32, 32, generator=generator),
                                                    torch.randint(0, 10, (512,), generator=generator))

    def train_dataloader(self):
        return torch.utils.data.DataLoader(self.train, batch_size=32, shuffle=True)


SPEC = from_lightning(Classifier, name="lightning_classifier", datamodule=RandomImages)


@pytest.mark.parametrize("recipe", ["baseline", "set_to_none", "optimizer_foreach", "amp_bf16"])
def test_lightning_classifier(train_bench, recipe):
    train_bench(recipe, SPEC)
