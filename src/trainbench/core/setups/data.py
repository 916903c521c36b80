"""The batches a training setup trains on: the spec's dataset behind an endless seeded sampler (this rank's share
under DDP/FSDP) or its batch factory, the live stream and the same stream again from its start.

Batch i is a function of the seed and i alone, whatever the recipe (save its batch size): the guards compare a recipe
with its baseline on the same samples, the memory and work passes read a fixed window of them.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from torch.utils.data import DataLoader, Sampler

from trainbench.core.setups.recipes import TrainConfig
from trainbench.core.setups.spec import NotApplicable, SpecError, TrainingSpec, batch_nbytes, map_tensors, unsplittable

if TYPE_CHECKING:  # the setup builds its batch source, and is what the source reads its config and spec from
    from trainbench.core.setups.training import TrainingSetup


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


class SyntheticBatches:
    """The spec's batch factory as an endless iterator, its batches made on the host (then copied) or on the device.

    The seeds' "construct tensors directly on the device": ``torch.rand(...).to(dev)``
    allocates, fills and copies on the host; ``torch.rand(..., device=dev)`` does none of it.

    Each step's whole batch (all ranks, all micro-batches) is made at once and sliced, so a step trains on the
    same samples however it is split: what the accumulation and DDP guards compare with the one big batch.
    """

    def __init__(self, spec: TrainingSpec, batch_size: int, device: torch.device, on_device: bool, seed: int,
                 rank: int = 0, world_size: int = 1, micro_batches: int = 1):
        self.make = spec.batches
        self.batch_size = batch_size  # one micro-batch of one rank
        self.generator = torch.Generator(device if on_device else torch.device("cpu")).manual_seed(seed)
        self.rank, self.world_size, self.micro_batches = rank, world_size, micro_batches
        self._pending: list = []

    def __iter__(self):
        return self

    def __next__(self):
        if self.world_size == 1 and self.micro_batches == 1:
            return self.make(self.batch_size, self.generator)
        if not self._pending:
            # Rank ``rank``'s slice of the global batch, as RankSampler gives a Dataset's, then its micro-batches (copies,
            # so the rest of the global batch is freed at once).
            step = self.batch_size * self.micro_batches
            whole = self.make(step * self.world_size, self.generator)
            reason = unsplittable(whole, step * self.world_size)
            if reason:
                raise NotApplicable(f"a step's batch is split into {self.micro_batches * self.world_size} micro-batches "
                                    f"or ranks' shares, and the spec's batches hold {reason}")
            start = self.rank * step
            self._pending = [map_tensors(lambda t, i=i: t[start + i * self.batch_size:
                                                          start + (i + 1) * self.batch_size].clone(), whole)
                             for i in range(self.micro_batches)]
        return self._pending.pop(0)


class SeededStream:
    """``batches`` with torch's and Python's global random generators on states of their own, seeded with ``seed``,
    while each batch is made (and restored after): what a dataset or collate draws from them is the same for batch i
    whatever else drew from them before."""

    def __init__(self, batches: Iterator, seed: int):
        self.batches = batches
        self._torch_state = torch.Generator().manual_seed(seed).get_state()
        self._python_state = random.Random(seed).getstate()

    def __iter__(self):
        return self

    def __next__(self):
        torch_state, python_state = torch.random.get_rng_state(), random.getstate()
        torch.random.set_rng_state(self._torch_state)
        random.setstate(self._python_state)
        try:
            return next(self.batches)
        finally:
            self._torch_state, self._python_state = torch.random.get_rng_state(), random.getstate()
            torch.random.set_rng_state(torch_state)
            random.setstate(python_state)


class RankSampler(Sampler[int]):
    """This rank's share of the endless sampler: slice ``rank`` of every global batch.

    With ``world_size`` ranks of ``batch_size`` each, the ranks together see exactly
    the samples a single process with the global batch would see, step for step, so
    DDP gradients can be compared with one-process gradients.
    """

    def __init__(self, length: int, batch_size: int, rank: int, world_size: int, seed: int = 0):
        self.endless = EndlessSampler(length, seed)
        self.batch_size, self.rank, self.world_size = batch_size, rank, world_size

    def __iter__(self) -> Iterator[int]:
        stream = iter(self.endless)
        while True:
            global_batch = [next(stream) for _ in range(self.batch_size * self.world_size)]
            yield from global_batch[self.rank * self.batch_size:(self.rank + 1) * self.batch_size]


class BatchSource:
    """A setup's batches: its loader (None for a batch factory's synthetic batches), the live stream and the fixed
    window; what one step's micro-batches hold (items, bytes to the device)."""

    def __init__(self, setup: TrainingSetup):
        self.setup = setup
        config, spec = setup.config, setup.spec
        self.batch_size = config.loader_batch_size(spec)  # per loader batch (micro-batch)
        self.synthetic = config.synthetic or (None if spec.dataset is not None else "host")
        self.loader = None if self.synthetic else self._loader(spec, config)
        self._iterator = None

    def step_batches(self, batches: Iterator) -> list:
        """The loader batches one optimizer step consumes (``accumulation_steps`` micro-batches)."""
        try:
            return [next(batches) for _ in range(self.setup.config.accumulation_steps)]
        except StopIteration:  # the loader's sampler is endless: only a batches factory can run dry
            raise SpecError(f"the data of training spec {self.setup.spec.name!r} yields no more batches") from None

    def _rank(self) -> tuple[int, int]:
        """(this process's rank, the number of ranks) under DDP/FSDP; (0, 1) otherwise."""
        config = self.setup.config
        if not config.rank_processes:
            return 0, 1
        import torch.distributed as dist  # only where ranks train: a build without it trains the rest

        if not dist.is_initialized() or dist.get_world_size() != config.shards:
            raise RuntimeError(f"parallel={config.parallel!r} needs an initialized process group of "
                               f"{config.world_size} ranks (trainbench.core.method.distributed launches them)")
        return dist.get_rank(), config.world_size

    def _loader(self, spec: TrainingSpec, config: TrainConfig) -> DataLoader:
        """The spec's dataset behind an endless sampler (this rank's share under DDP/FSDP), workers persistent."""
        dataset = spec.make_dataset(config.pixels)
        if len(dataset) == 0:  # the endless sampler would look for a first index forever
            raise SpecError(f"the dataset of training spec {spec.name!r} yields no batches (its length is 0)")
        rank, world_size = self._rank()
        if world_size > 1:
            sampler = RankSampler(len(dataset), self.batch_size, rank, world_size, config.seed)
        else:
            sampler = EndlessSampler(len(dataset), config.seed)
        knobs = {key: given for _, value, hook in self.setup.hooks["loader"] for key, given in hook(self.setup, value).items()}
        return DataLoader(dataset, batch_size=self.batch_size, sampler=sampler, drop_last=True,
                          collate_fn=spec.collate_fn,
                          generator=torch.Generator().manual_seed(config.seed),  # the workers' seeds: the seed's
                          **knobs)


    def batches(self) -> Iterator:
        """The live, endless batch iterator (created once; workers persist)."""
        if self._iterator is None:
            self._iterator = self._stream(live=True)
        return self._iterator

    def batches_from_start(self) -> Iterator:
        """The batch stream again from its first batch, apart from the live one (which the warm-up and the rounds
        have moved on): the fixed window the measurement's memory and work passes read."""
        return self._stream(live=False)

    def _stream(self, live: bool) -> Iterator:
        """The batch stream: batch i is a function of the seed and i alone, whatever the recipe, save its batch size.

        The spec's factory on a generator seeded afresh, or the loader's seeded sampler and collate, its workers
        seeded from the seed. The window (``live=False``) also seeds torch's and Python's global generators while
        each of its batches is made (a dataset or collate that draws from them, which the steps draw from too); the
        live stream leaves them alone, as the cost of switching them (~0.1 ms a batch) would be in the timed rounds.
        A recipe with another batch size draws batches of its own size from the same seed: from a dataset, its batch
        i holds the samples the seeded order puts there (a 4x batch: the baseline's batches 4i..4i+3), from a factory
        what it makes at that size."""
        if self.synthetic:
            stream = self._synthetic_batches()
        elif live:
            stream = iter(self.loader)
        else:  # read in this process, apart from the live loader and its workers
            stream = iter(DataLoader(self.loader.dataset, batch_size=self.loader.batch_size, sampler=self.loader.sampler,
                                     collate_fn=self.loader.collate_fn, pin_memory=self.loader.pin_memory,
                                     drop_last=True))
        return stream if live else SeededStream(stream, self.setup.config.seed)

    def _synthetic_batches(self) -> SyntheticBatches:
        setup = self.setup
        return SyntheticBatches(setup.spec, self.batch_size, setup.device, self.synthetic == "device", setup.config.seed,
                                *self._rank(), setup.config.accumulation_steps)

    def items_of(self, micro_batches: list) -> torch.Tensor | None:
        """The items (``TrainingSpec.items``: tokens...) of one step's micro-batches in this process, as a tensor
        (no host sync); None where the spec counts none."""
        counts = [self.setup.spec.count_items(batch) for batch in micro_batches]
        if not counts or counts[0] is None:
            return None
        return sum(counts[1:], counts[0])

    def h2d_bytes(self, micro_batches: list) -> int:
        """Bytes one step's data crosses from the host to the device (none when made on the device)."""
        return 0 if self.synthetic == "device" else batch_nbytes(micro_batches)


    def close(self) -> None:
        """Stop the live loader's workers."""
        iterator, self._iterator = self._iterator, None
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()
