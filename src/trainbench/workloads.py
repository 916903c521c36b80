"""Models and synthetic data: what is trained, independent of how it is optimized.

The reference workload is the seeds': torchvision ResNet-18 with random weights on a
FakeCIFAR dataset (uint8 32x32x3 images served as PIL images, resized), CrossEntropy
and SGD(lr=0.001, momentum=0.9). Sizes come from a device *profile*: ``cpu`` keeps a
case to seconds on two cores, ``gpu`` uses the seeds' sizes. Nothing is downloaded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset


@dataclass(frozen=True)
class Profile:
    """Default sizes for one class of device."""

    name: str
    image_size: int  # Resize() target of the image workloads
    batch_size: int
    dataset_size: int
    seq_len: int  # transformer workload
    d_model: int
    layers: int


PROFILES = {
    # Two CPU cores: ResNet-18 at 64x64, batch 16 is ~0.1-0.3 s a step.
    "cpu": Profile("cpu", image_size=64, batch_size=16, dataset_size=2048, seq_len=64, d_model=128, layers=2),
    # The seeds' sizes: Resize(224), batch 32, 10,000 images.
    "gpu": Profile("gpu", image_size=224, batch_size=32, dataset_size=10_000, seq_len=256, d_model=512, layers=6),
}


def profile_for(kind: str) -> Profile:
    """The default profile of a device kind (``cpu`` for the CPU, ``gpu`` for accelerators)."""
    return PROFILES["cpu" if kind == "cpu" else "gpu"]


class FakeCIFAR(Dataset):
    """CIFAR-10-shaped random data served like torchvision's CIFAR10: (PIL image, int label).

    Seeded, so every recipe trains on identical bytes.
    """

    def __init__(self, size: int, transform: Callable | None = None, seed: int = 0, num_classes: int = 10):
        rng = np.random.default_rng(seed)
        self.data = rng.integers(0, 256, size=(size, 32, 32, 3), dtype=np.uint8)
        self.targets = rng.integers(0, num_classes, size=size).tolist()
        self.transform = transform

    def __getitem__(self, index: int):
        from PIL import Image

        img = Image.fromarray(self.data[index])
        if self.transform is not None:
            img = self.transform(img)
        return img, self.targets[index]

    def __len__(self) -> int:
        return len(self.data)


class FakeTokens(Dataset):
    """Random token sequences with a class label, for the transformer workload."""

    def __init__(self, size: int, seq_len: int, vocab: int, seed: int = 0, num_classes: int = 10):
        self.vocab = vocab
        gen = torch.Generator().manual_seed(seed)
        self.tokens = torch.randint(0, vocab, (size, seq_len), generator=gen)
        self.targets = torch.randint(0, num_classes, (size,), generator=gen)

    def __getitem__(self, index: int):
        return self.tokens[index], self.targets[index]

    def __len__(self) -> int:
        return len(self.tokens)


class PILToHWCTensor:
    """PIL image -> uint8 tensor in the image's own HWC layout (no transpose on the host).

    Batches stack to NHWC; on the device ``permute(0, 3, 1, 2)`` gives the NCHW shape
    the model expects with channels-last strides, without a copy.
    """

    def __call__(self, img) -> torch.Tensor:
        return torch.from_numpy(np.array(img, dtype=np.uint8, copy=True))


def image_transform(image_size: int, uint8: bool, hwc: bool = False):
    """The seeds' transforms: float32 normalized on the host, or uint8 left for the device."""
    import torchvision.transforms as T

    steps = [T.Resize(image_size)] if image_size != 32 else []
    if hwc:
        if not uint8:
            raise ValueError("HWC batches are uint8: normalization happens on the device")
        return T.Compose(steps + [PILToHWCTensor()])
    if uint8:
        # Keep 8-bit pixels: the copy to the device is 4x smaller; step.py normalizes there.
        return T.Compose(steps + [T.PILToTensor()])
    return T.Compose(steps + [T.ToTensor(), T.Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))])


class TokenClassifier(nn.Module):
    """A small pre-norm transformer encoder with mean pooling and a linear head."""

    def __init__(self, vocab: int, d_model: int, layers: int, heads: int, seq_len: int, num_classes: int = 10):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.zeros(1, seq_len, d_model))
        layer = nn.TransformerEncoderLayer(
            d_model, heads, dim_feedforward=4 * d_model, dropout=0.0, batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos[:, : tokens.shape[1]]
        return self.head(self.encoder(x).mean(dim=1))


@dataclass(frozen=True)
class Workload:
    """A model, its data and its loss; sizes come from a profile."""

    name: str
    description: str
    input_kind: str  # "image" (uint8 pixels available) or "tokens"
    build_model: Callable[[Profile], nn.Module]
    build_dataset: Callable[..., Dataset]  # (profile, uint8, seed, hwc=False)
    lr: float = 0.001
    momentum: float = 0.9
    # Dotted names of the blocks gradient checkpointing recomputes (None: not supported).
    checkpoint_blocks: Callable[[nn.Module], list[str]] | None = None
    conv_bn: bool = False  # has convolutions followed by BatchNorm (the conv-bias case)
    pointwise_block: bool = False  # has modules with a ``pointwise`` function to fuse (GeluMLP)

    @property
    def supports_uint8(self) -> bool:
        return self.input_kind == "image"

    def criterion(self) -> nn.Module:
        return nn.CrossEntropyLoss()

    def optimizer(self, params, impl: str | None = None) -> torch.optim.Optimizer:
        """SGD as in the seeds; ``impl`` picks the update kernels (None: PyTorch's default for the device)."""
        kwargs = {"loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}.get(impl, {})
        return torch.optim.SGD(params, lr=self.lr, momentum=self.momentum, **kwargs)


def _resnet18(profile: Profile) -> nn.Module:
    import torchvision

    return torchvision.models.resnet18(weights=None, num_classes=10)


def _fake_cifar(image_size_of: Callable[[Profile], int]):
    def build(profile: Profile, uint8: bool, seed: int, hwc: bool = False) -> Dataset:
        transform = image_transform(image_size_of(profile), uint8, hwc)
        return FakeCIFAR(profile.dataset_size, transform=transform, seed=seed)

    return build


def _mlp(profile: Profile) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 256), nn.ReLU(), nn.Linear(256, 10))


def gelu(x: torch.Tensor) -> torch.Tensor:
    """The seeds' hand-written GELU: five pointwise ops, each a kernel (and a memory round trip) in eager mode."""
    return x * 0.5 * (1.0 + torch.erf(x / 1.41421))


class GeluMLP(nn.Module):
    """Linear -> pointwise GELU -> Linear, twice: the seeds' fusion example inside a model.

    ``pointwise`` is a plain function attribute so a config can swap in a scripted or
    compiled version of the same function (TrainConfig.fuse_pointwise).
    """

    def __init__(self, in_features: int = 3 * 32 * 32, hidden: int = 1024, num_classes: int = 10):
        super().__init__()
        self.flatten = nn.Flatten()
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.head = nn.Linear(hidden, num_classes)
        self.pointwise = gelu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pointwise(self.fc1(self.flatten(x)))
        x = self.pointwise(self.fc2(x))
        return self.head(x)


def _gelu_mlp(profile: Profile) -> nn.Module:
    return GeluMLP()


def _resnet_blocks(model: nn.Module) -> list[str]:
    return ["layer1", "layer2", "layer3", "layer4"]


def _encoder_blocks(model: nn.Module) -> list[str]:
    return [f"encoder.layers.{i}" for i in range(len(model.encoder.layers))]


_VOCAB = 1000


def _transformer(profile: Profile) -> nn.Module:
    heads = max(4, profile.d_model // 64)
    return TokenClassifier(_VOCAB, profile.d_model, profile.layers, heads, profile.seq_len)


def _tokens(profile: Profile, uint8: bool, seed: int, hwc: bool = False) -> Dataset:
    return FakeTokens(profile.dataset_size, profile.seq_len, _VOCAB, seed=seed)


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in [
        Workload(
            "resnet18",
            "torchvision ResNet-18 (random weights) on FakeCIFAR, Resize per profile, SGD momentum 0.9",
            "image",
            _resnet18,
            _fake_cifar(lambda p: p.image_size),
            checkpoint_blocks=_resnet_blocks,
            conv_bn=True,
        ),
        Workload(
            "mlp",
            "two-layer MLP on 32x32 FakeCIFAR (no resize): a step of well under a millisecond",
            "image",
            _mlp,
            _fake_cifar(lambda p: 32),
        ),
        Workload(
            "transformer",
            "pre-norm transformer encoder classifier on random tokens",
            "tokens",
            _transformer,
            _tokens,
            checkpoint_blocks=_encoder_blocks,
        ),
        Workload(
            "gelu_mlp",
            "MLP with the seeds' hand-written pointwise GELU on 32x32 FakeCIFAR: what fusion removes",
            "image",
            _gelu_mlp,
            _fake_cifar(lambda p: 32),
            pointwise_block=True,
        ),
    ]
}


def register_workload(workload: Workload) -> Workload:
    """Make a workload of your own available to recipes, the fixture and asv by name."""
    if workload.name in WORKLOADS and WORKLOADS[workload.name] is not workload:
        raise ValueError(f"workload {workload.name!r} is already registered")
    WORKLOADS[workload.name] = workload
    return workload


def get_workload(name: str) -> Workload:
    try:
        return WORKLOADS[name]
    except KeyError:
        raise KeyError(f"unknown workload {name!r}: expected one of {sorted(WORKLOADS)}") from None
