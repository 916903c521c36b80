"""A simulated asynchronous device on a clock the test controls.

The host and the device each have a time line in virtual seconds. Launching device work returns at once and queues
it behind what is queued already; ``synchronize`` moves the host to the moment the queue drains; the backend's
``clock`` reads the host's time. Nothing real is timed: the CPU computes the tensors, and only what a test states
(device work per step, host work, a loader's pace) moves the clocks, so every figure is exact.

As on a GPU, the launch queue is bounded: a launch into a full queue holds the host until the oldest queued work
has finished, so a host that runs ahead of the device is paced by it between syncs.
"""

from __future__ import annotations

import functools

import torch
from torch import nn
from torch.utils.data import Dataset

from trainbench.core.setups.spec import TrainingSpec, classification_loss
from trainbench.devices.device import CpuBackend


class AsyncClock:
    """The host's time, the device's queue of work, and a log of launches and syncs."""

    def __init__(self, queue_depth: int = 1000):
        self.host = 0.0
        self.queue_depth = queue_depth
        self._ends: list[float] = []  # when each launch still queued at ``host`` finishes, in order
        self.log: list[str] = []

    def _drop_finished(self) -> None:
        self._ends = [end for end in self._ends if end > self.host]

    @property
    def device_idle_at(self) -> float:
        """When the device finishes all the work queued so far."""
        return max([self.host, *self._ends])

    def launch(self, seconds: float) -> None:
        """Queue ``seconds`` of device work; the host waits only for room in the queue."""
        self._drop_finished()
        while len(self._ends) >= self.queue_depth:
            self.host = self._ends[0]
            self._drop_finished()
        self._ends.append(self.device_idle_at + seconds)
        self.log.append("launch")

    def host_work(self, seconds: float) -> None:
        """The host busy for ``seconds`` (launch overheads, a busy wait); the device runs on meanwhile."""
        self.host += seconds

    def synchronize(self) -> None:
        self.host = self.device_idle_at
        self._ends = []
        self.log.append("sync")

    def record_event(self) -> float:
        """An event queued behind the work so far: the device time at which it completes."""
        return self.device_idle_at


class AsyncBackend(CpuBackend):
    """The CPU backend, its timing moved onto an ``AsyncClock``: tensors are real, time is virtual."""

    def __init__(self, clock: AsyncClock):
        super().__init__(torch.device("cpu"))
        self.virtual = clock

    def clock(self) -> float:
        return self.virtual.host

    def synchronize(self) -> None:
        self.virtual.synchronize()

    def busy_wait(self, seconds: float) -> None:
        self.virtual.host_work(seconds)

    def cpu_clock(self) -> float | None:
        return None  # as on a GPU: a host waiting in a synchronize spins, its CPU time is wall time


class DeviceWork(nn.Module):
    """Queues ``seconds`` of device work per forward (and costs the host ``host_s`` to launch), computing nothing."""

    def __init__(self, clock: AsyncClock, seconds: float, host_s: float = 0.0):
        super().__init__()
        self.virtual, self.seconds, self.host_s = clock, seconds, host_s

    def forward(self, x):
        self.virtual.host_work(self.host_s)
        self.virtual.launch(self.seconds)
        return x


class PacedFeatures(Dataset):
    """Random features and labels, served by loader workers that finish a batch every ``period_s`` of host time.

    The workers run beside the host: they start when the first batch is asked for and keep up to ``prefetch``
    batches ready. ``next(loader)`` holds the host only while the batch it asks for is not ready yet.
    """

    def __init__(self, clock: AsyncClock, period_s: float, prefetch: int = 2, size: int = 64, features: int = 8):
        gen = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(size, features, generator=gen), torch.randint(0, 4, (size,), generator=gen)
        self.virtual, self.period_s, self.prefetch = clock, period_s, prefetch
        self._ready: list[float] = []  # when each batch handed out so far was ready
        self._taken: list[float] = []  # when the host took it

    def __len__(self) -> int:
        return len(self.x)

    def __getitems__(self, indices):
        k = len(self._taken)
        previous = self._ready[-1] if self._ready else self.virtual.host
        # A worker starts the next batch once the one before is done and a prefetch slot is free.
        slot_free = self._taken[k - self.prefetch] if k >= self.prefetch else previous
        ready = max(previous, slot_free) + self.period_s
        self.virtual.host = max(self.virtual.host, ready)
        self._ready.append(ready)
        self._taken.append(self.virtual.host)
        return [(self.x[i], self.y[i]) for i in indices]


def spec(clock: AsyncClock, device_s: float, host_s: float = 0.0, loader_period_s: float = 0.0) -> TrainingSpec:
    """A small classifier whose every step queues ``device_s`` of work, its batches paced by ``loader_period_s``."""
    return TrainingSpec(
        name="async", batch_size=4,
        model=lambda: nn.Sequential(DeviceWork(clock, device_s, host_s), nn.Linear(8, 4)),
        loss_fn=classification_loss, optimizer=functools.partial(torch.optim.SGD, lr=0.01),
        dataset=lambda: PacedFeatures(clock, loader_period_s))
