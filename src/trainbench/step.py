"""Builds the loader, model, optimizer, GradScaler and the training step from a config.

The one place where each knob of ``TrainConfig`` takes effect, so a recipe means the
same thing in every benchmark, test and asv run.

A *step* is one optimizer update: ``step(fetch(batches))``. ``fetch`` takes as many
loader batches as the step consumes (the micro-batches of gradient accumulation), so
the time blocked on the loader can be measured apart from the step itself.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint
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


class SyntheticBatches:
    """Random batches with the dataset's shapes, made on the host (then copied) or on the device.

    The seeds' "construct tensors directly on the device": ``torch.rand(...).to(dev)``
    allocates, fills and copies on the host; ``torch.rand(..., device=dev)`` does none of it.
    """

    def __init__(self, sample, batch_size: int, device: torch.device, on_device: bool, seed: int,
                 vocab: int | None = None, num_classes: int = 10):
        inputs = torch.as_tensor(sample[0])
        self.shape = (batch_size, *inputs.shape)
        self.tokens = not inputs.is_floating_point()
        if self.tokens and vocab is None:
            raise ValueError("synthetic token batches need the dataset's vocabulary size (a `vocab` attribute)")
        self.vocab = vocab
        self.num_classes = num_classes
        self.batch_size = batch_size
        self.device = device
        self.make_on = device if on_device else torch.device("cpu")
        self.generator = torch.Generator(self.make_on).manual_seed(seed)

    def __iter__(self):
        return self

    def __next__(self):
        g, on = self.generator, self.make_on
        if self.tokens:
            inputs = torch.randint(0, self.vocab, self.shape, generator=g, device=on)
        else:
            inputs = torch.rand(self.shape, generator=g, device=on).mul_(2.0).sub_(1.0)  # in [-1, 1) like the loader's
        targets = torch.randint(0, self.num_classes, (self.batch_size,), generator=g, device=on)
        return inputs, targets


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


def batch_nbytes(batch) -> int:
    """Bytes of the host tensors a step copies to the device for one batch (or list of micro-batches)."""
    if isinstance(batch, list):
        return sum(batch_nbytes(b) for b in batch)
    return sum(t.nbytes for t in batch if isinstance(t, torch.Tensor))


def normalize_uint8(images: torch.Tensor) -> torch.Tensor:
    """The seeds' on-device normalization of uint8 pixels: same values as T.Normalize(0.5, 0.5)."""
    return (images.to(torch.float32) / 255.0 - 0.5) / 0.5


def enable_checkpointing(model: torch.nn.Module, block_names: list[str]) -> None:
    """Recompute each named block in backward instead of keeping its activations.

    Patches the blocks' ``forward`` in place, so parameter names (and the guard's
    gradient comparison by name) stay the same as without checkpointing.
    """
    for name in block_names:
        block = model.get_submodule(name)
        block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)


def add_conv_bias(model: torch.nn.Module) -> None:
    """Give every bias-free convolution a zero-initialized bias: the redundant bias before BatchNorm."""
    for module in model.modules():
        if isinstance(module, torch.nn.Conv2d) and module.bias is None:
            module.bias = torch.nn.Parameter(torch.zeros(module.out_channels))


def fuse_pointwise(model: torch.nn.Module, how: str) -> None:
    """Replace each module's ``pointwise`` function by its scripted or compiled version."""
    for module in model.modules():
        fn = getattr(module, "pointwise", None)
        if fn is None:
            continue
        if how == "script":
            module.pointwise = torch.jit.script(fn)
        else:
            module.pointwise = torch.compile(fn)


@dataclass(frozen=True)
class InjectedFault:
    """A regression planted on purpose, to prove that a regression gate catches it.

    ``slowdown``: after each step, wait that fraction of the step's host time (exact on
    the CPU; on a GPU the host time of an asynchronous step is its launch time).
    ``leak_mib``: keep that many MiB allocated on the device per step, never freed.
    """

    slowdown: float = 0.0
    leak_mib: float = 0.0


class Training:
    """A ready-to-run training setup: ``step(fetch(batches()))`` trains on one optimizer step's data."""

    def __init__(self, config: TrainConfig, backend: Backend, profile: Profile, fault: InjectedFault | None = None):
        self.config = config = config.validate()
        self.fault = fault
        self._leaked: list[torch.Tensor] = []
        self.backend = backend
        self.profile = profile
        self.device = backend.device
        self.workload = get_workload(config.workload)
        self.batch_size = config.resolved_batch_size(profile)  # per loader batch (micro-batch)
        self.samples_per_step = config.samples_per_step(profile)
        self._closers = contextlib.ExitStack()
        torch.manual_seed(config.seed)

        hwc = {"hwc": True} if config.channels_last_input else {}  # users' own datasets need not know the knob
        self.dataset = self.workload.build_dataset(profile, config.uint8_transfer, config.seed, **hwc)
        if config.parallel == "ddp":
            import torch.distributed as dist

            if not dist.is_initialized() or dist.get_world_size() != config.world_size:
                raise RuntimeError(f"parallel='ddp' needs an initialized process group of {config.world_size} ranks "
                                   "(trainbench.distributed launches them)")
            sampler = RankSampler(len(self.dataset), self.batch_size, dist.get_rank(), config.world_size, config.seed)
        else:
            sampler = EndlessSampler(len(self.dataset), config.seed)
        self.loader = DataLoader(
            self.dataset,
            batch_size=self.batch_size,
            sampler=sampler,
            num_workers=config.num_workers,
            pin_memory=config.pin_memory,
            drop_last=True,
            persistent_workers=config.num_workers > 0,
        )

        model = self.workload.build_model(profile)
        if config.conv_bias:
            add_conv_bias(model)
        model = model.to(self.device)
        if config.channels_last:
            model = model.to(memory_format=torch.channels_last)
        if config.checkpointing:
            enable_checkpointing(model, self.workload.checkpoint_blocks(model))
        if config.fuse_pointwise:
            fuse_pointwise(model, config.fuse_pointwise)
        model.train(config.eval_mode is None)
        self.model = model  # the plain module: parameter names, memory tracking, the optimizer
        wrapped = model
        if config.parallel == "dp":
            wrapped = torch.nn.DataParallel(model)
        elif config.parallel == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            wrapped = DistributedDataParallel(model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        self.forward = torch.compile(wrapped) if config.compile else wrapped
        self.criterion = self.workload.criterion().to(self.device)
        self.optimizer = self.workload.optimizer(model.parameters(), config.optimizer_impl)
        self.scaler = torch.amp.GradScaler(self.device.type) if config.grad_scaler else None
        self._autocast_dtype = _AUTOCAST_DTYPES.get(config.amp)

        previous = set_cudnn_benchmark(config.cudnn_benchmark)
        self._closers.callback(set_cudnn_benchmark, previous)
        if config.deterministic:
            self._closers.enter_context(_deterministic_algorithms())
        self._debug = self._closers.enter_context(_debug_api(config.debug))

        # Called before every forward of the model: the memory tracker follows one forward of the
        # root module at a time, and a step may run several (accumulation, a loss computed twice).
        self.before_forward = None
        self.steps_done = 0
        self.loss_total: torch.Tensor | float = 0.0  # the running loss kept by config.loss_history
        self._pending = None  # loss_history="item" with log_every > 1: summed on the device until the next sync
        self._iterator = None

    # -- data ---------------------------------------------------------------------
    def batches(self) -> Iterator:
        """The live, endless batch iterator (created once; workers persist)."""
        if self._iterator is None:
            if self.config.synthetic:
                self._iterator = SyntheticBatches(self.dataset[0], self.batch_size, self.device,
                                                  self.config.synthetic == "device", self.config.seed,
                                                  vocab=getattr(self.dataset, "vocab", None))
            else:
                self._iterator = iter(self.loader)
        return self._iterator

    def fetch(self, batches: Iterator) -> list:
        """The loader batches one optimizer step consumes (``accumulation_steps`` micro-batches)."""
        return [next(batches) for _ in range(self.config.accumulation_steps)]

    def h2d_bytes(self, micro_batches: list) -> int:
        """Bytes one step's data crosses from the host to the device (none when made on the device)."""
        return 0 if self.config.synthetic == "device" else batch_nbytes(micro_batches)

    def to_device(self, batch):
        inputs, targets = batch
        nb = self.config.non_blocking
        inputs = inputs.to(self.device, non_blocking=nb)
        targets = targets.to(self.device, non_blocking=nb)
        if self.config.channels_last_input:
            inputs = inputs.permute(0, 3, 1, 2)  # NHWC storage seen as NCHW: channels-last strides, no copy
        if self.config.uint8_transfer:
            inputs = normalize_uint8(inputs)
        if self.config.channels_last:
            inputs = inputs.contiguous(memory_format=torch.channels_last)
        return inputs, targets

    # -- the step -------------------------------------------------------------------
    def _loss(self, batch) -> torch.Tensor:
        inputs, targets = self.to_device(batch)
        if self.before_forward is not None:
            self.before_forward()
        with torch.autocast(self.device.type, dtype=self._autocast_dtype, enabled=self._autocast_dtype is not None):
            outputs = self.forward(inputs)
            return self.criterion(outputs, targets)

    def zero_grad(self) -> None:
        mode = self.config.zero_grad
        if mode == "param_none":
            for p in self.model.parameters():
                p.grad = None
        else:
            self.optimizer.zero_grad(set_to_none=mode == "set_to_none")

    def forward_backward(self, micro_batches: list) -> torch.Tensor:
        """Gradients of one optimizer step's data, in the seeds' order (forward, zero_grad, backward).

        Under accumulation each micro-batch's loss is divided by the number of
        micro-batches, so the summed gradients equal those of the whole batch.
        Returns the step's (mean) loss with its graph, as a training loop sees it.
        """
        k = len(micro_batches)
        total = None
        for i, batch in enumerate(micro_batches):
            loss = self.scale_for_accumulation(self._loss(batch), k)
            if i == 0:
                self.zero_grad()
            (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
            total = loss if total is None else total + loss
        return total

    @staticmethod
    def scale_for_accumulation(loss: torch.Tensor, micro_batches: int) -> torch.Tensor:
        """Each micro-batch contributes 1/k of the mean loss, so k backward passes sum to the whole batch's gradient."""
        return loss / micro_batches if micro_batches > 1 else loss

    def evaluate(self, micro_batches: list) -> torch.Tensor:
        """An evaluation step: forward and loss only, under the config's grad mode."""
        mode = self.config.eval_mode
        context = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}.get(mode, contextlib.nullcontext)
        with context():
            return self._loss(micro_batches[0])

    def step(self, micro_batches: list) -> torch.Tensor:
        """One optimizer step (or one evaluation batch). Returns the detached loss (no host sync)."""
        started = time.perf_counter()
        if self.config.eval_mode:
            loss = self.evaluate(micro_batches)
        else:
            loss = self.forward_backward(micro_batches)
            if self.scaler is not None:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                self.optimizer.step()
        self._track_loss(loss)
        if self.config.empty_cache:
            self.backend.empty_cache()
        if self._debug is not None:
            self._debug.step()
        self.steps_done += 1
        if self.fault is not None:
            self._inject(time.perf_counter() - started)
        return loss.detach()

    def _inject(self, step_seconds: float) -> None:
        fault = self.fault
        if fault.leak_mib:
            self._leaked.append(torch.empty(int(fault.leak_mib * 2**20), dtype=torch.uint8, device=self.device))
        if fault.slowdown:
            deadline = time.perf_counter() + fault.slowdown * step_seconds
            while time.perf_counter() < deadline:  # busy-wait: sleep granularity is coarse for millisecond steps
                pass

    def _track_loss(self, loss: torch.Tensor) -> None:
        """Keep a running loss the way a training loop would (seed 001's ``total_loss += loss``)."""
        mode = self.config.loss_history
        if mode == "tensor":
            self.loss_total = self.loss_total + loss  # keeps every step's autograd graph alive: the leak
        elif mode == "detach":
            self.loss_total = self.loss_total + loss.detach()
        elif mode == "item":
            pending = loss.detach() if self._pending is None else self._pending + loss.detach()
            if (self.steps_done + 1) % self.config.log_every == 0:
                self.loss_total += pending.item()  # a host-device sync
                pending = None
            self._pending = pending

    def retained_graph_nodes(self) -> int:
        """Autograd nodes reachable from the running loss: what ``total_loss += loss`` keeps alive.

        Backward frees the tensors the graph saved, but not the graph: its nodes (and
        their metadata) pile up on the host, one step's backward graph per step.
        """
        total = self.loss_total
        root = getattr(total, "grad_fn", None)
        seen, stack = set(), [root] if root is not None else []
        while stack:
            node = stack.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            stack.extend(next_node for next_node, _ in node.next_functions)
        return len(seen)

    def close(self) -> None:
        """Stop loader workers and restore global flags this setup changed."""
        iterator, self._iterator = self._iterator, None
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()
        self._closers.close()

    def __enter__(self) -> Training:  # noqa: PYI034 (typing.Self needs Python 3.11)
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@contextlib.contextmanager
def _deterministic_algorithms():
    previous = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
                torch.backends.cudnn.deterministic)
    torch.use_deterministic_algorithms(True, warn_only=True)  # warn, not fail, where an op has no deterministic kernel
    torch.backends.cudnn.deterministic = True
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])
        torch.backends.cudnn.deterministic = previous[2]


class _ProfilerLeftOn:
    """The seeds' profiler setup left running: records shapes and memory, step after step.

    Without ``with_stack``: its Python-level hook cannot be paused and restored by
    pytest-benchmark's instrumentation guard, and the cost that matters here is the
    per-op recording, which stays on.
    """

    def __init__(self):
        from torch.profiler import ProfilerActivity, profile, schedule

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        self.profiler = profile(activities=activities, schedule=schedule(wait=0, warmup=1, active=3, repeat=0),
                                on_trace_ready=lambda prof: None, record_shapes=True, profile_memory=True)

    def step(self) -> None:
        self.profiler.step()


class _NoStep:
    def step(self) -> None:
        pass


@contextlib.contextmanager
def _debug_api(mode: str | None):
    """A debug API switched on for the life of the setup, as when left on by mistake."""
    if mode is None:
        yield None
    elif mode == "anomaly":
        with torch.autograd.detect_anomaly(check_nan=True):
            yield _NoStep()
    elif mode == "emit_nvtx":
        with torch.autograd.profiler.emit_nvtx(record_shapes=True):
            yield _NoStep()
    elif mode == "profiler":
        left_on = _ProfilerLeftOn()
        with left_on.profiler:
            yield left_on
