"""The work of a training setup's step, on batches of its seeded stream from the start: FLOPs (``FlopCounterMode``),
aten ops dispatched and the host-device syncs among them (``_OpCounter``), and the profiler's view of a few steps
(aten calls, device kernels, each op's self time: ``attribution.profile_steps``). Like ``step_memory``, it needs no
timing: the measurement asks it after its timed rounds.
"""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from trainbench.core.analyses.attribution import (
    Sites,
    profile_steps,
    python_call_site,
    tracker_warnings_silenced,
)
from trainbench.core.setups.training import TrainingSetup
from trainbench.devices.device import Backend

# Kineto (the profiler behind the aten-call count) logs an ERROR line when a CUDA build finds no GPU.
os.environ.setdefault("KINETO_LOG_LEVEL", "5")


class _OpCounter(TorchDispatchMode):
    """Counts every aten op dispatched, and the host-device syncs among them: ``_local_scalar_dense``
    (``.item()``, ``if tensor:``) and copies the host must wait for (``Backend.blocking_copy``), each sync by the op
    and the Python line that made it (``attribution.python_call_site``: the user's, where the call is theirs)."""

    def __init__(self, backend: Backend, sites: Sites | None = None):
        super().__init__()
        self.backend = backend
        self.sites = sites  # where each op runs (trainbench.core.analyses.attribution), if asked
        self.ops: Counter[str] = Counter()
        self.ops_by_site: Counter[str] = Counter()
        self.syncs_by_site: Counter[str] = Counter()  # each sync: an ``.item()``-like read or a blocking copy

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func.overloadpacket)
        self.ops[name] += 1
        if self.sites is not None:
            self.ops_by_site[self.sites.site()] += 1
        blocking = 0
        if name == "aten._to_copy" and kwargs.get("device") is not None:
            blocking = self.backend.blocking_copy(args[0], torch.device(kwargs["device"]),
                                                  bool(kwargs.get("non_blocking", False)))
        elif name == "aten.copy_" and len(args) >= 2 and isinstance(args[1], torch.Tensor):
            non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
            blocking = self.backend.blocking_copy(args[1], args[0].device, bool(non_blocking))
        if blocking or name == "aten._local_scalar_dense":
            self.syncs_by_site[f"{name}{' (blocking copy)' if blocking else ''} at {python_call_site()}"] += 1
        return func(*args, **kwargs)

    @property
    def syncs(self) -> int:
        return sum(self.syncs_by_site.values())


def _no_sites(backward: bool = True) -> contextlib.AbstractContextManager[Sites | None]:
    """Where no sites are asked: a context yielding None in the place of ``attribution.Sites``."""
    return contextlib.nullcontext()


@dataclass(frozen=True)
class WorkCount:
    """What the counted steps dispatched: the first one's FLOPs (by op too), and every one's ops and syncs."""

    flops: int
    flops_by_op: dict
    ops: Counter  # by op
    syncs_by_site: Counter  # by op and the Python line that made it
    ops_by_site: Counter | None  # by module site, where sites were asked


@dataclass(frozen=True)
class StepWork:
    """The work passes of one training setup. ``window``: a new iterator over batches 0, 1, ... of its seeded stream,
    for each pass (by default ``TrainingSetup.batches_from_start``); ``step``: one step on fetched micro-batches (by
    default the setup's own); ``sites``: where ops run (``attribution.Sites``), or a null context yielding None."""

    training: TrainingSetup
    window: Callable[[], Iterator] | None = None
    step: Callable[[list], torch.Tensor] | None = None
    sites: Callable[..., contextlib.AbstractContextManager[Sites | None]] = _no_sites

    def fetched(self, steps: int) -> list[list]:
        """The micro-batches of the window's first ``steps`` steps."""
        window = (self.window or self.training.batches_from_start)()
        return [self.training.fetch(window) for _ in range(steps)]

    def _run(self, micro_batches: list) -> None:
        (self.step or self.training.step)(micro_batches)

    def count(self, steps: list[list]) -> WorkCount:
        """FLOPs of the first of ``steps`` (fetched micro-batches), ops and syncs of all of them."""
        flops = FlopCounterMode(display=False)
        with self.sites() as sites, tracker_warnings_silenced():
            counter = _OpCounter(self.training.backend, sites)
            for i, micro_batches in enumerate(steps):
                # The op counter inside the FLOP counter, as ever: FlopCounterMode decomposes the composite ops it
                # sees first (under inference_mode, conv2d and linear reach the modes whole), so a counter outside
                # it would count their pieces and an inference-mode step as many ops as a no_grad one.
                with flops if i == 0 else contextlib.nullcontext(), counter:
                    self._run(micro_batches)
        self.training.backend.synchronize()
        return WorkCount(int(flops.get_total_flops()), flops.get_flop_counts().get("Global", {}), counter.ops,
                         counter.syncs_by_site, counter.ops_by_site if sites is not None else None)

    def profile(self, steps: int) -> dict | None:
        """``steps`` steps of the window, one profiler each (``attribution.profile_steps``), or None where a profiler
        is already running: a second one fails to start and, on its way out, stops the one running (torch 2.9 then
        crashes when that one is closed)."""
        if self.training.config.runs_a_profiler or torch.autograd.profiler._is_profiler_enabled:
            return None
        # Batches fetched before profiling: the loader's work is not the step's.
        pending = self.fetched(steps)
        return profile_steps(lambda: self._run(pending.pop(0)), steps, self.training.backend)
