"""A timm MobileNetV3 (random weights, nothing downloaded) on PIL images through torchvision transforms, uint8 path too."""

import functools

import numpy as np
import pytest
import torch
from PIL import Image
from torch.nn import functional as F
from torch.utils.data import Dataset
from torchvision import transforms as T

from trainbench import TrainingSpec

timm = pytest.importorskip("timm")

MEAN, STD = timm.data.IMAGENET_DEFAULT_MEAN, timm.data.IMAGENET_DEFAULT_STD


class Photos(Dataset):
    """Seeded random 64x64 RGB photos with a class label, served as PIL images are: float32 normalized on the host,
    or (``pixels="uint8"``) the uint8 pixels as they are, to normalize on the device."""

    def __init__(self, pixels=None, size=256):
        rng = np.random.default_rng(0)
        self.images = rng.integers(0, 256, (size, 64, 64, 3), dtype=np.uint8)
        self.labels = rng.integers(0, 10, size).tolist()
        self.transform = T.PILToTensor() if pixels == "uint8" else T.Compose([T.ToTensor(), T.Normalize(MEAN, STD)])

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.transform(Image.fromarray(self.images[i])), self.labels[i]


@functools.cache
def stats_on(device):  # copied to the device once, not every step
    return tuple(torch.tensor(values, device=device).view(3, 1, 1) for values in (MEAN, STD))


def normalize(images):
    """uint8 NCHW batches on the device, as ToTensor + Normalize do on the host (no F.normalize: it syncs on std == 0)."""
    mean, std = stats_on(images.device)
    return (images.float() / 255 - mean) / std


SPEC = TrainingSpec(
    name="timm_mobilenet", model=lambda: timm.create_model("mobilenetv3_small_050", pretrained=False, num_classes=10),
    loss_fn=lambda model, batch: F.cross_entropy(model(batch[0]), batch[1]), batch_size=8,
    optimizer=functools.partial(torch.optim.SGD, lr=0.01, momentum=0.9),
    dataset=Photos, pixels=("uint8",), normalize=normalize,
)


@pytest.mark.parametrize("recipe", ["baseline", "uint8_transfer", "channels_last", "optimizer_foreach"])
def test_timm_mobilenet(train_bench, recipe):
    train_bench(recipe, SPEC)
