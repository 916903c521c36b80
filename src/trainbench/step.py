"""Builds the loader, model, optimizer, GradScaler and the training step from a config.

The one place where each knob of ``TrainConfig`` takes effect, so a recipe means the
same thing in every benchmark, test and asv run.
"""

from __future__ import annotations

from typing import Iterator

import torch
from torch.utils.data import DataLoader, Sampler

from .device import Backend, set_cudnn_benchmark
from .recipes import TrainConfig
from .workloads import Profile, get_workload

_AUTOCAST_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


class EndlessSampler(Sampler[int]):
    """Seeded random permutations, one after another, forever.

    The loader iterator never ends, so workers keep prefetching across epoch
    boundaries and no timed round ever pays for starting an epoch.
    """

    def __init__(self, length: int, seed: int = 0):
        self.length = length
        self.seed = seed

    def __iter__(self) -> Iterator[int]:
        gen = torch.Generator().manual_seed(self.seed)
        while True:
            yield from torch.randperm(self.length, generator=gen).tolist()


def batch_nbytes(batch) -> int:
    """Bytes of the tensors a step copies to the device for one batch."""
    return sum(t.nbytes for t in batch if isinstance(t, torch.Tensor))


def normalize_uint8(images: torch.Tensor) -> torch.Tensor:
    """The seeds' on-device normalization of uint8 pixels: same values as T.Normalize(0.5, 0.5)."""
    return (images.to(torch.float32) / 255.0 - 0.5) / 0.5


class Training:
    """A ready-to-run training setup: ``step(next(batches))`` trains on one batch."""

    def __init__(self, config: TrainConfig, backend: Backend, profile: Profile):
        self.config = config.validate()
        self.backend = backend
        self.profile = profile
        self.device = backend.device
        self.workload = get_workload(config.workload)
        self.batch_size = config.resolved_batch_size(profile)
        torch.manual_seed(config.seed)

        self.dataset = self.workload.build_dataset(profile, config.uint8_transfer, config.seed)
        self.loader = DataLoader(
            self.dataset,
            batch_size=self.batch_size,
            sampler=EndlessSampler(len(self.dataset), config.seed),
            num_workers=config.num_workers,
            pin_memory=config.pin_memory,
            drop_last=True,
            persistent_workers=config.num_workers > 0,
        )

        model = self.workload.build_model(profile).to(self.device)
        if config.channels_last:
            model = model.to(memory_format=torch.channels_last)
        model.train()
        self.model = model
        self.forward = torch.compile(model) if config.compile else model
        self.criterion = self.workload.criterion().to(self.device)
        self.optimizer = self.workload.optimizer(model.parameters())
        self.scaler = torch.amp.GradScaler(self.device.type) if config.grad_scaler else None
        self._autocast_dtype = _AUTOCAST_DTYPES.get(config.amp)
        self._previous_cudnn_benchmark = set_cudnn_benchmark(config.cudnn_benchmark)
        self._iterator = None

    def batches(self) -> Iterator:
        """The live, endless batch iterator (created once; workers persist)."""
        if self._iterator is None:
            self._iterator = iter(self.loader)
        return self._iterator

    def to_device(self, batch):
        inputs, targets = batch
        nb = self.config.non_blocking
        inputs = inputs.to(self.device, non_blocking=nb)
        targets = targets.to(self.device, non_blocking=nb)
        if self.config.uint8_transfer:
            inputs = normalize_uint8(inputs)
        if self.config.channels_last:
            inputs = inputs.contiguous(memory_format=torch.channels_last)
        return inputs, targets

    def step(self, batch) -> torch.Tensor:
        """One optimizer step, in the seeds' order. Returns the detached loss (no host sync)."""
        inputs, targets = self.to_device(batch)
        with torch.autocast(self.device.type, dtype=self._autocast_dtype, enabled=self._autocast_dtype is not None):
            outputs = self.forward(inputs)
            loss = self.criterion(outputs, targets)
        self.optimizer.zero_grad(set_to_none=self.config.set_to_none)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            loss.backward()
            self.optimizer.step()
        return loss.detach()

    def close(self) -> None:
        """Stop loader workers and restore global flags this setup changed."""
        iterator, self._iterator = self._iterator, None
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()
        set_cudnn_benchmark(self._previous_cudnn_benchmark)

    def __enter__(self) -> "Training":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
