"""The built-in workloads: training specs (``trainbench.core.setups.spec``) like any user's, sized per device profile.

The reference workload is the seeds': torchvision ResNet-18 with random weights on a
FakeCIFAR dataset (uint8 32x32x3 images served as PIL images, resized), CrossEntropy
and SGD(lr=0.001, momentum=0.9). Beside it: a transformer encoder classifier, the
seeds' hand-written GELU MLP, a small MLP, a GPT-style decoder LM (causal SDPA, AdamW)
and a Vision Transformer. Sizes come from a device *profile*: ``cpu`` keeps a case to
seconds on two cores, ``gpu`` uses the seeds' sizes (GPT-2 small, ViT-B/16 at 224).
A small CNN with a bias in each convolution before its BatchNorm (as users often write
it) is where removing that bias is measured. Random weights and synthetic data: nothing is downloaded.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset

from trainbench.core.setups.spec import SpecError, TrainingSpec, classification_loss


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
    # Where compute recipes and their baselines get their batches (recipes.judging_overrides):
    # None keeps the loader; "device" makes them on the device, off the critical path.
    compute_data: str | None = None


PROFILES = {
    # Two CPU cores: ResNet-18 at 64x64, batch 16 is ~0.1-0.3 s a step.
    "cpu": Profile("cpu", image_size=64, batch_size=16, dataset_size=2048, seq_len=64, d_model=128, layers=2),
    # The seeds' sizes: Resize(224), batch 32, 10,000 images.
    "gpu": Profile("gpu", image_size=224, batch_size=32, dataset_size=10_000, seq_len=256, d_model=512, layers=6,
                   compute_data="device"),
}


# -- data ------------------------------------------------------------------------------------

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
        img = Image.fromarray(self.data[index])
        if self.transform is not None:
            img = self.transform(img)
        return img, self.targets[index]

    def __len__(self) -> int:
        return len(self.data)


class FakeTokens(Dataset):
    """Random token sequences with a class label, for the transformer workload."""

    def __init__(self, size: int, seq_len: int, vocab: int, seed: int = 0, num_classes: int = 10):
        gen = torch.Generator().manual_seed(seed)
        self.tokens = torch.randint(0, vocab, (size, seq_len), generator=gen)
        self.targets = torch.randint(0, num_classes, (size,), generator=gen)

    def __getitem__(self, index: int):
        return self.tokens[index], self.targets[index]

    def __len__(self) -> int:
        return len(self.tokens)


class FakeText(Dataset):
    """Random token sequences for language modelling, served as ``{"input_ids": (seq_len + 1,)}``."""

    def __init__(self, size: int, seq_len: int, vocab: int, seed: int = 0):
        gen = torch.Generator().manual_seed(seed)
        self.tokens = torch.randint(0, vocab, (size, seq_len + 1), generator=gen)

    def __getitem__(self, index: int):
        return {"input_ids": self.tokens[index]}

    def __len__(self) -> int:
        return len(self.tokens)


class PILToHWCTensor:
    """PIL image -> uint8 tensor in the image's own HWC layout (no transpose on the host).

    Batches stack to NHWC; on the device ``permute(0, 3, 1, 2)`` gives the NCHW shape
    the model expects with channels-last strides, without a copy.
    """

    def __call__(self, img) -> torch.Tensor:
        return torch.from_numpy(np.array(img, dtype=np.uint8, copy=True))


def _torchvision():
    """torchvision, for the image workloads' models and transforms."""
    import torchvision  # lazy: seconds to import, which a session without an image workload need not pay

    return torchvision


def image_transform(image_size: int, pixels: str | None = None):
    """The seeds' transforms: float32 normalized on the host, or uint8 (CHW or HWC) left for the device."""
    T = _torchvision().transforms
    steps = [T.Resize(image_size)] if image_size != 32 else []
    if pixels == "uint8_hwc":
        return T.Compose(steps + [PILToHWCTensor()])
    if pixels == "uint8":
        # Keep 8-bit pixels: the copy to the device is 4x smaller; the step normalizes there.
        return T.Compose(steps + [T.PILToTensor()])
    return T.Compose(steps + [T.ToTensor(), T.Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))])


def _fake_cifar(image_size: int, dataset_size: int) -> Callable[..., Dataset]:
    def dataset(pixels: str | None = None) -> Dataset:
        return FakeCIFAR(dataset_size, transform=image_transform(image_size, pixels), seed=0)

    return dataset


def _random_images(image_size: int, num_classes: int = 10):
    """Synthetic (images in [-1, 1), labels) batches, made where the generator lives."""

    def batches(batch_size: int, gen: torch.Generator):
        images = torch.rand((batch_size, 3, image_size, image_size), generator=gen, device=gen.device).mul_(2.0).sub_(1.0)
        return images, torch.randint(0, num_classes, (batch_size,), generator=gen, device=gen.device)

    return batches


def _random_tokens(seq_len: int, vocab: int, num_classes: int = 10):
    def batches(batch_size: int, gen: torch.Generator):
        tokens = torch.randint(0, vocab, (batch_size, seq_len), generator=gen, device=gen.device)
        return tokens, torch.randint(0, num_classes, (batch_size,), generator=gen, device=gen.device)

    return batches


def _random_text(seq_len: int, vocab: int):
    def batches(batch_size: int, gen: torch.Generator):
        return {"input_ids": torch.randint(0, vocab, (batch_size, seq_len + 1), generator=gen, device=gen.device)}

    return batches


# -- models ----------------------------------------------------------------------------------

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


class ConvNet(nn.Module):
    """A small CNN as users often write it: Conv2d with its default bias, BatchNorm2d (which cancels that bias in
    training), ReLU and max-pooling per stage, then global average pooling and a linear head."""

    def __init__(self, widths: tuple[int, ...] = (32, 64, 128, 256), num_classes: int = 10):
        super().__init__()
        layers, channels = [], 3
        for width in widths:
            layers += [nn.Conv2d(channels, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
                       nn.MaxPool2d(2)]
            channels = width
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(channels, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(F.adaptive_avg_pool2d(self.features(images), 1), 1))


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


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        # The attention kernel is PyTorch's choice (math, flash, memory-efficient), or a recipe's (sdpa_kernel).
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class DecoderBlock(nn.Module):
    def __init__(self, d_model: int, heads: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, heads)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    """A GPT-2-style decoder-only LM: token and position embeddings, pre-norm blocks, tied LM head."""

    def __init__(self, vocab: int, d_model: int, layers: int, heads: int, seq_len: int):
        super().__init__()
        self.tokens = nn.Embedding(vocab, d_model)
        self.positions = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(DecoderBlock(d_model, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.head.weight = self.tokens.weight  # tied, as in GPT-2
        for embedding in (self.tokens, self.positions):  # GPT-2's initialization: unit-variance logits blow up the loss
            nn.init.normal_(embedding.weight, std=0.02)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.tokens(ids) + self.positions(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def next_token_loss(model: nn.Module, batch: dict) -> torch.Tensor:
    """Cross-entropy of every position's logits (batch, seq, vocab) against the next token."""
    ids = batch["input_ids"]
    logits = model(ids[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())


# -- the built-in specs ----------------------------------------------------------------------

_SGD = functools.partial(torch.optim.SGD, lr=0.001, momentum=0.9)  # the seeds' optimizer
_TOKEN_VOCAB = 1000


def _resnet18(profile: Profile) -> TrainingSpec:
    torchvision = _torchvision()
    size = profile.image_size
    return TrainingSpec(
        name="resnet18",
        description=f"torchvision ResNet-18 (random weights) on FakeCIFAR resized to {size} px, SGD momentum 0.9",
        model=lambda: torchvision.models.resnet18(weights=None, num_classes=10),
        loss_fn=classification_loss, optimizer=_SGD, batch_size=profile.batch_size,
        dataset=_fake_cifar(size, profile.dataset_size), batches=_random_images(size),
        checkpoint_blocks=("layer1", "layer2", "layer3", "layer4"), pixels=("uint8", "uint8_hwc"))


def _convnet(profile: Profile) -> TrainingSpec:
    size = profile.image_size
    return TrainingSpec(
        name="convnet",
        description=f"a user's small CNN (Conv2d with bias -> BatchNorm2d -> ReLU, 4 stages) on FakeCIFAR at {size} px, "
                    "SGD momentum 0.9",
        model=ConvNet, loss_fn=classification_loss, optimizer=_SGD, batch_size=profile.batch_size,
        dataset=_fake_cifar(size, profile.dataset_size), batches=_random_images(size), pixels=("uint8", "uint8_hwc"))


def _mlp(profile: Profile) -> TrainingSpec:
    return TrainingSpec(
        name="mlp", description="two-layer MLP on 32x32 FakeCIFAR (no resize): a step of well under a millisecond",
        model=lambda: nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 256), nn.ReLU(), nn.Linear(256, 10)),
        loss_fn=classification_loss, optimizer=_SGD, batch_size=profile.batch_size,
        dataset=_fake_cifar(32, profile.dataset_size), batches=_random_images(32), pixels=("uint8", "uint8_hwc"))


def _gelu_mlp(profile: Profile) -> TrainingSpec:
    return TrainingSpec(
        name="gelu_mlp",
        description="MLP with the seeds' hand-written pointwise GELU on 32x32 FakeCIFAR: what fusion removes",
        model=GeluMLP, loss_fn=classification_loss, optimizer=_SGD, batch_size=profile.batch_size,
        dataset=_fake_cifar(32, profile.dataset_size), batches=_random_images(32), pixels=("uint8", "uint8_hwc"))


def _transformer(profile: Profile) -> TrainingSpec:
    heads = max(4, profile.d_model // 64)
    return TrainingSpec(
        name="transformer", description="pre-norm transformer encoder classifier on random tokens, SGD momentum 0.9",
        model=lambda: TokenClassifier(_TOKEN_VOCAB, profile.d_model, profile.layers, heads, profile.seq_len),
        loss_fn=classification_loss, optimizer=_SGD, batch_size=profile.batch_size,
        dataset=lambda: FakeTokens(profile.dataset_size, profile.seq_len, _TOKEN_VOCAB, seed=0),
        batches=_random_tokens(profile.seq_len, _TOKEN_VOCAB),
        checkpoint_blocks=tuple(f"encoder.layers.{i}" for i in range(profile.layers)))


# GPT sizes: a 2-layer toy on two CPU cores; GPT-2 small (124M parameters, 1024 tokens) on a GPU.
_GPT_SIZES = {"cpu": {"vocab": 1024, "d_model": 128, "layers": 2, "heads": 4, "seq_len": 64, "batch": 8, "samples": 1024},
              "gpu": {"vocab": 50304, "d_model": 768, "layers": 12, "heads": 12, "seq_len": 1024, "batch": 8,
                      "samples": 2048}}


def _gpt(profile: Profile) -> TrainingSpec:
    s = _GPT_SIZES[profile.name]
    return TrainingSpec(
        name="gpt",
        description=(f"GPT-style decoder LM ({s['layers']} layers, d={s['d_model']}, {s['seq_len']} tokens, vocab "
                     f"{s['vocab']}), causal scaled_dot_product_attention, next-token loss, AdamW"),
        model=lambda: GPT(s["vocab"], s["d_model"], s["layers"], s["heads"], s["seq_len"]),
        loss_fn=next_token_loss,
        optimizer=functools.partial(torch.optim.AdamW, lr=3e-4, weight_decay=0.1),
        batch_size=s["batch"],
        dataset=lambda: FakeText(s["samples"], s["seq_len"], s["vocab"], seed=0),
        batches=_random_text(s["seq_len"], s["vocab"]),
        checkpoint_blocks=tuple(f"blocks.{i}" for i in range(s["layers"])))


# ViT sizes: a 3-layer ViT on 32 px images in 16 patches on the CPU; ViT-B/16 at 224 px on a GPU.
_VIT_SIZES = {"cpu": {"image": 32, "patch": 8, "layers": 3, "heads": 4, "hidden": 128, "mlp": 256},
              "gpu": {"image": 224, "patch": 16, "layers": 12, "heads": 12, "hidden": 768, "mlp": 3072}}


def _vit(profile: Profile) -> TrainingSpec:
    VisionTransformer = _torchvision().models.vision_transformer.VisionTransformer
    s = _VIT_SIZES[profile.name]
    return TrainingSpec(
        name="vit",
        description=(f"torchvision VisionTransformer ({s['layers']} layers, hidden {s['hidden']}, patch {s['patch']}) on "
                     f"FakeCIFAR at {s['image']} px, SGD momentum 0.9"),
        model=lambda: VisionTransformer(s["image"], s["patch"], s["layers"], s["heads"], s["hidden"], s["mlp"],
                                        num_classes=10),
        loss_fn=classification_loss, optimizer=_SGD, batch_size=profile.batch_size,
        dataset=_fake_cifar(s["image"], profile.dataset_size), batches=_random_images(s["image"]),
        checkpoint_blocks=tuple(f"encoder.layers.encoder_layer_{i}" for i in range(s["layers"])),
        pixels=("uint8", "uint8_hwc"))


WORKLOADS: dict[str, Callable[[Profile], TrainingSpec]] = {
    "resnet18": _resnet18,
    "convnet": _convnet,
    "mlp": _mlp,
    "transformer": _transformer,
    "gelu_mlp": _gelu_mlp,
    "gpt": _gpt,
    "vit": _vit,
}


SpecSource = TrainingSpec | str | Callable[[Profile], TrainingSpec]


def resolve_spec(spec: SpecSource, profile: Profile) -> TrainingSpec:
    """A concrete spec from a spec, a built-in workload's name, or a function of the profile returning a spec."""
    if isinstance(spec, TrainingSpec):
        return spec
    if isinstance(spec, str):
        if spec not in WORKLOADS:
            raise SpecError(f"unknown workload {spec!r}: expected a TrainingSpec or one of {sorted(WORKLOADS)}")
        return WORKLOADS[spec](profile)
    if callable(spec):
        resolved = spec(profile)
        if not isinstance(resolved, TrainingSpec):
            raise SpecError(f"{spec!r} returned {type(resolved).__name__}, expected a TrainingSpec")
        return resolved
    raise SpecError(f"expected a TrainingSpec, a workload name or a function of the profile, got {spec!r}")
