"""The measurement method: warm-up until steady, synchronized rounds, memory, work signals.

1. Warm-up: at least ``min_warmup_steps`` (plus the recipe's extra for compile or
   autotuning), then windows of steps until two consecutive windows agree within
   ``steady_tolerance`` (or ``max_warmup_steps``). Loader workers are running and
   prefetching on the live endless iterator before timing starts.
2. Timing: a round is ``steps_per_round`` steps on the live iterator between two
   ``backend.timer()`` reads; the timer synchronizes the device, so a round is
   end-to-end (data stalls count) with no sync inside it.
3. Memory: a separate warm pass with reset allocator peaks; live tensor bytes and kept
   autograd nodes after each of a few steps (growth: a leak if > 0); then one step under
   PyTorch's ``MemTracker`` (or, for steps it cannot follow, ``_StepMemory``) that splits the
   tensor peak into parameters, gradients, optimizer state and activations.
4. Work: one step under ``FlopCounterMode`` and an op counter (FLOPs, ops, syncs),
   plus the bytes each step copies to the device.

Each pass of 3 and 4 reads its batches from the start of the seeded stream, made again
(``Measurer._window``), never from where the warm-up and the rounds left the live one: with
batches whose shapes vary (padding to each batch's longest sequence) their figures would
otherwise move with the rounds, the warm-up and what ran before.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import itertools
import math
import os
import warnings
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Protocol

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import FlopCounterMode
from torch.utils.weak import WeakIdKeyDictionary

from trainbench.core.analyses.attribution import (
    Sites,
    allocator_sites,
    module_grad_hooks_removed,
    parameter_sites,
    per_step,
    profile_steps,
    python_call_site,
    tracker_warnings_silenced,
)
from trainbench.devices.device import Backend, no_peak_reason
from trainbench.devices.caps import convolution_share

# Kineto (the profiler behind the aten-call count) logs an ERROR line when a CUDA build finds no GPU.
os.environ.setdefault("KINETO_LOG_LEVEL", "5")
from trainbench.core.harness.costs import recharge, spent
from trainbench.core.harness.failures import failure_line
from trainbench.core.setups.guards import GUARD_STEPS
from trainbench.core.setups.recipes import NotApplicable
from trainbench.core.records.result import VARYING_SHAPES_NOTE, Result
from trainbench.core.setups.spec import batch_shapes
from trainbench.core.setups.training import TrainingSetup, compiled_by_user, sparse_gradients
from trainbench.core.harness.watchdog import NoProgress, phase


@dataclass(frozen=True)
class MeasureSettings:
    min_warmup_steps: int = 3
    max_warmup_steps: int = 30
    steady_window: int = 3
    steady_tolerance: float = 0.10
    rounds: int = 10  # a first look of two decides from 7 pairs (stats.least_rounds); 10 leave room for a dropped one
    steps_per_round: int = 1  # on CPU, more rounds of fewer steps serve the interval better than the reverse
    memory_steps: int = 2
    breakdown: bool = True  # MemTracker pass
    work: bool = True  # FLOP / op / sync pass
    # Where the step's ops, time, FLOPs and memory go (trainbench.core.analyses.attribution), recorded in the passes after
    # timing: what explains a changed verdict. ``profiled_steps``: steps the profiler times, one at a time.
    attribution: bool = True
    profiled_steps: int = 4  # a side: the fewest whose interval can place a change (stats.rounds_needed)
    # Exactly min_warmup_steps (+ the recipe's extra), no settling windows: ranks of a
    # process group must run the same number of steps, or their collectives deadlock.
    fixed_warmup: bool = False
    # A case that makes no progress (no step, no batch) for this long fails alone (trainbench.core.harness.watchdog);
    # 0: no limit. Generous: torch.compile's first step and cuDNN autotuning are progress-free minutes.
    no_progress_s: float = 600.0
    # The passes after the timed rounds to run ("peaks", "calls", "memory", "work"; None: all): a quick run
    # (--trainbench-quick) runs only those whose metrics its budgets name (metrics.passes_measuring)
    passes: tuple[str, ...] | None = None


DEFAULT_SETTINGS = {
    "cpu": MeasureSettings(),
    "gpu": MeasureSettings(min_warmup_steps=10, max_warmup_steps=200, steady_window=5, steady_tolerance=0.05,
                           rounds=10, steps_per_round=10, memory_steps=3, no_progress_s=1200.0),
}


GROWTH_STEPS = 2  # steps after the first over which live memory growth is measured (x log_every)


class _LiveStorages(TorchDispatchMode):
    """Bytes of the storages that aten ops created under this mode and that are still alive.

    The same weak-reference bookkeeping as MemTracker's, without its module hooks: those
    hooks keep the graph of a forward that never runs backward (an evaluation step, a loss
    computed twice) alive, a leak of the tracker's own. (The profiler's allocator events
    were no alternative: on CPU they can count frees of blocks allocated before profiling.)
    """

    def __init__(self, device: torch.device, sites: Sites | None = None):
        super().__init__()
        self.device_type = device.type
        self.sites = sites  # where each storage was made (trainbench.core.analyses.attribution), if asked
        self._entries = WeakIdKeyDictionary()  # storage -> [bytes, site]; an entry goes when its storage is freed
        self._by_site: Counter[str] = Counter()  # live bytes per site
        self._refs: set = set()
        self.peak, self.peak_by_site = 0, {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type == self.device_type:
                # a wrapper subclass (DTensor) by its own storage, as it always was; a sparse tensor by its parts'
                for storage in _storages(t) if t.layout in _SPARSE_PARTS else [t.untyped_storage()]:
                    self._track(storage)
        if self.sites is not None:
            total = sum(self._by_site.values())
            if total > self.peak:
                self.peak, self.peak_by_site = total, dict(self._by_site)
        return out

    def _track(self, storage) -> None:
        entry = self._entries.get(storage)
        if entry is None:
            entry = self._entries[storage] = [storage.nbytes(), self.sites.site() if self.sites else ""]
            self._by_site[entry[1]] += entry[0]
            self._refs.add(weakref.ref(storage, functools.partial(self._freed, entry)))
        elif storage.nbytes() != entry[0]:  # resized in place
            self._by_site[entry[1]] += storage.nbytes() - entry[0]
            entry[0] = storage.nbytes()

    def _freed(self, entry: list, ref) -> None:
        self._by_site[entry[1]] -= entry[0]
        self._refs.discard(ref)

    def live_bytes(self) -> int:
        return sum(entry[0] for entry in self._entries.values())

    def live_by_site(self) -> dict[str, int]:
        return {site: n for site, n in self._by_site.items() if n}


class RoundRunner(Protocol):
    """Runs ``rounds`` timed rounds of ``steps_per_round`` calls; returns each round's mean step seconds."""

    def __call__(self, step: Callable[[], None], rounds: int, steps_per_round: int, timer: Callable[[], float]) -> list[float]: ...


def _round_cpu_times(marks: list[float | None], rounds: int, steps_per_round: int) -> list[float]:
    """CPU seconds per step of each round from the CPU clock read at each round's start and end ([] where the
    device has no CPU clock, or a runner read the timer other than twice a round)."""
    if len(marks) != 2 * rounds or any(m is None for m in marks):
        return []
    return [(marks[2 * i + 1] - marks[2 * i]) / steps_per_round for i in range(rounds)]


def run_rounds(step: Callable[[], None], rounds: int, steps_per_round: int, timer: Callable[[], float]) -> list[float]:
    """The plain round loop; identical in shape to pytest-benchmark's pedantic runner."""
    times = []
    for _ in range(rounds):
        start = timer()
        for _ in range(steps_per_round):
            step()
        times.append((timer() - start) / steps_per_round)
    return times


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


_MEMTRACKER_CATEGORIES = {
    "PARAM": "params",
    "BUFFER": "buffers",
    "GRAD": "grads",
    "OPT": "optimizer_state",
    "ACT": "activations",
    "TEMP": "temporaries",
    "OTH": "other",
    # FSDP2 (FSDPMemTracker): a rank's own shards are its parameters and gradients; the whole tensors it gathers
    # for a block, and the collectives' buffers, are its own entries.
    "SHARDED_PARAM": "params",
    "UNSHARDED_PARAM": "unsharded_params",
    "SHARDED_GRAD": "grads",
    "UNSHARDED_GRAD": "unsharded_grads",
    "ALL_GATHER": "all_gather",
    "REDUCE_SCATTER": "reduce_scatter",
    "INP": "inputs",
}


class _StepMemory(TorchDispatchMode):
    """The tensor peak of a step and its split by kind, with no module hooks: any loss or step function.

    Storages are told apart by identity. Those alive when tracking starts: the model's parameters
    and buffers, their gradients, the optimizers' state. One an op creates: optimizer state inside
    an optimizer's step, a temporary inside a backward pass, an activation otherwise; a gradient
    once it lands in a parameter's ``.grad`` (a parameter hook). MemTracker's categories, without
    its module hooks, so submodules called directly, a module called several times and shared
    weights are all one to it. (Activations a checkpointed block recomputes in backward count as
    temporaries here; MemTracker, which sees the block's forward run again, counts them as activations.)
    """

    def __init__(self, device: torch.device, model: torch.nn.Module, optimizers):
        super().__init__()
        self.device_type = device.type
        self.model, self.optimizers = model, list(optimizers)
        self._entries = WeakIdKeyDictionary()  # storage -> [bytes, kind]
        self._refs: set = set()  # weak references whose callbacks take a freed storage's bytes off its kind
        self._bytes: Counter[str] = Counter()
        self._in_optimizer = 0
        self._handles: list = []
        self.peak, self._peak_bytes = 0, {}

    def __enter__(self):
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        def before(optimizer, args, kwargs):
            self._in_optimizer += 1

        def after(optimizer, args, kwargs):
            self._in_optimizer -= 1
            self._take_state(optimizer)

        self._handles = [register_optimizer_step_pre_hook(before), register_optimizer_step_post_hook(after)]
        for p in self.model.parameters():
            self._track(p, "params")
            if p.grad is not None:
                self._track(p.grad, "grads", reclassify=True)
            if p.requires_grad:
                self._handles.append(p.register_post_accumulate_grad_hook(
                    lambda param: self._track(param.grad, "grads", reclassify=True)))
        for b in self.model.buffers():
            self._track(b, "buffers")
        for optimizer in self.optimizers:
            self._take_state(optimizer)
        self._update_peak()
        return super().__enter__()

    def __exit__(self, *exc):
        for handle in self._handles:
            handle.remove()
        self._handles = []
        return super().__exit__(*exc)

    def _take_state(self, optimizer) -> None:
        for state in optimizer.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    self._track(value, "optimizer_state", reclassify=True)

    def _track(self, t: torch.Tensor, kind: str, reclassify: bool = False) -> None:
        if t.device.type != self.device_type:
            return
        for storage in _storages(t):
            entry = self._entries.get(storage)
            if entry is None:
                entry = self._entries[storage] = [storage.nbytes(), kind]
                self._bytes[kind] += entry[0]
                self._refs.add(weakref.ref(storage, functools.partial(self._freed, entry)))
                continue
            if storage.nbytes() != entry[0]:  # resized in place
                self._bytes[entry[1]] += storage.nbytes() - entry[0]
                entry[0] = storage.nbytes()
            if reclassify and entry[1] != kind:
                self._bytes[entry[1]] -= entry[0]
                self._bytes[kind] += entry[0]
                entry[1] = kind

    def _freed(self, entry: list, ref) -> None:
        self._bytes[entry[1]] -= entry[0]
        self._refs.discard(ref)

    def _update_peak(self) -> None:
        total = sum(self._bytes.values())
        if total > self.peak:
            self.peak, self._peak_bytes = total, dict(self._bytes)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self._in_optimizer:
            kind = "optimizer_state"
        elif torch._C._current_graph_task_id() != -1:  # inside a backward pass
            kind = "temporaries"
        else:
            kind = "activations"
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._track(t, kind)
        self._update_peak()
        return out

    def peak_breakdown(self) -> dict[str, int]:
        kinds = ("params", "buffers", "grads", "optimizer_state", "activations", "temporaries")
        return {"total": int(self.peak), **{kind: int(self._peak_bytes.get(kind, 0)) for kind in kinds}}


# A sparse tensor has no storage of its own: its data is in these dense tensors (an embedding's sparse gradient, a
# SparseAdam state), by layout.
_SPARSE_PARTS = {torch.sparse_coo: ("_indices", "_values"), torch.sparse_csr: ("crow_indices", "col_indices", "values"),
                 torch.sparse_csc: ("ccol_indices", "row_indices", "values"),
                 torch.sparse_bsr: ("crow_indices", "col_indices", "values"),
                 torch.sparse_bsc: ("ccol_indices", "row_indices", "values")}


def _storages(t: torch.Tensor) -> list:
    """The storages holding ``t``'s data (a wrapper subclass's inner tensors', a sparse tensor's parts')."""
    if not isinstance(t, torch.Tensor):  # what a subclass's flatten names beside its tensors (a DeviceMesh)
        return []
    if is_traceable_wrapper_subclass(t):
        names, _ = t.__tensor_flatten__()
        return [s for name in names for s in _storages(getattr(t, name))]
    if t.layout in _SPARSE_PARTS:
        return [s for part in _SPARSE_PARTS[t.layout] for s in _storages(getattr(t, part)())]
    try:
        return [t.untyped_storage()]
    except (RuntimeError, NotImplementedError):  # layouts with no storage to count (nested, mkldnn)
        return []


# Windows this long judge steadiness well enough: a model whose steps take STEADY_WINDOW_S / 2 seconds or more
# compares windows of 2 steps, not the 3 (5 on GPU) its profile asks for: a steady one warms up for 5 steps on CPU,
# not 7 (on GPU for its minimum of 10, not 11).
STEADY_WINDOW_S = 1.5


def _settled(step_times: list[float], window: int, tolerance: float) -> bool:
    """The last window of steps took within ``tolerance`` of the window before it. A window is ``window`` steps, or
    fewer (never under 2) where fewer of the typical (median) step already last ``STEADY_WINDOW_S``."""
    typical = sorted(step_times)[len(step_times) // 2] if step_times else 0.0
    if typical > 0:
        window = min(window, max(2, math.ceil(STEADY_WINDOW_S / typical)))
    if len(step_times) < 2 * window:
        return False
    last, before = sum(step_times[-window:]), sum(step_times[-2 * window:-window])
    return before > 0 and abs(last / before - 1.0) <= tolerance


class _HeapFreeze:
    """Who holds the collector's permanent generation: this module (for its passes) or someone else."""

    holding = False  # inside heap_frozen's own freeze
    # Someone else froze the heap (a test suite, a server before it forks). ``gc.get_freeze_count`` walks every frozen
    # object (30 ms for 350k), and a suite that freezes before each test would pay that at every pass: it is asked
    # until the answer is yes, then the heap is taken to stay theirs (at worst, passes after they unfreeze run
    # unfrozen: slower, and their state untouched).
    elsewhere = False


@contextlib.contextmanager
def heap_frozen() -> Iterator[None]:
    """The passes after timing (and the GPU prediction) walk only the objects they make. The collections they set off
    (the profiler's event tables, MemTracker's snapshots and fake tensors make tens of thousands of objects) and
    growth's own ``gc.collect`` would otherwise walk everything alive: torch, pytest and the user's model, ~350k
    objects and 0.1-0.3 s a collection on two cores, often more than the steps they follow. ``gc.freeze`` moves what is alive now
    out of the collector's reach until the passes end (refcounting still frees it; cycles that are already garbage
    wait until then, and hold the same bytes before and after the steps, so growth is unchanged). Where someone
    else froze objects, the state is theirs: left as it is."""
    state = _HeapFreeze
    if not state.holding and not state.elsewhere:
        state.elsewhere = gc.get_freeze_count() > 0
    if state.holding or state.elsewhere:  # frozen already: by these passes (a nested call) or by someone else
        yield
        return
    gc.freeze()
    state.holding = True
    try:
        yield
    finally:
        state.holding = False
        gc.unfreeze()


def global_peak_only(tracker) -> bool:
    """Make a MemTracker (or FSDPMemTracker) keep only its global peak up to date after each op; True if it was changed.

    After every op the stock tracker also walks every module it has seen to update the peaks of those running
    (for a ResNet-50, ~400 weak-reference look-ups per op): 20-30 times a small model's step on the CPU, over half
    of a fake step's time in the prediction. Only the global peak is read (``get_tracker_snapshot("peak")``), so
    the walk is given no module to walk and the tracker's own code updates that peak as before. A torch whose
    tracker names these otherwise keeps the stock update: slower, never wrong.
    """
    update = getattr(tracker, "_update_peak_stats", None)
    if update is None or not hasattr(tracker, "memory_tracking"):
        return False

    def global_only(peak_state) -> None:
        modules, tracker.memory_tracking = tracker.memory_tracking, {}
        try:
            update(peak_state)
        finally:
            tracker.memory_tracking = modules

    tracker._update_peak_stats = global_only
    return True


class Measurer:
    """Measures one training setup; ``run()`` returns a ``Result``.

    The pieces (``warm_up``, ``time_rounds``/``time_one_round``, ``measure_after_timing``)
    are public so the pytest plugin can drive them with its own runners.
    """

    def __init__(self, training: TrainingSetup, case: str, recipe_name: str, settings: MeasureSettings,
                 extra_warmup_steps: int = 0, profile_name: str = "", baseline: bool = False):
        self.training = training
        self.baseline = baseline  # the case's baseline: its phases are the baseline's share of the case's cost
        self.backend: Backend = training.backend
        self.settings = settings
        self.extra_warmup_steps = extra_warmup_steps
        self._batches = training.batches()
        self._window_shapes: dict[int, tuple] = {}  # the shapes of each window batch the passes read, by index
        self._wait_s = 0.0
        self._last_loss: torch.Tensor | None = None
        self._timed_items: list[torch.Tensor] = []  # each timed step's items (TrainingSpec.items), summed after timing
        # A setup fresh from its seeds: its first warm-up steps are the loss guard's seeded trajectory (kept as
        # tensors, read after the warm-up)
        self._seeded: list[torch.Tensor] | None = [] if training.steps_run == 0 else None
        # Warmed up to its minimum only, its first interleaved rounds judging whether it is steady (``warm_up``)
        self._settling_in_rounds = False
        self._rounds_dropped = 0  # leading rounds found to be warm-up (``drop_first_round``)
        self._rounds_dropped_beside = 0  # rounds dropped with the interleaved setup's rounds that were warm-up
        self._round_waits: list[float] = []  # each timed round's data wait, and how many items it kept
        self._round_items: list[int] = []
        self.result = Result(
            case=case,
            workload=training.spec.name,
            recipe=recipe_name,
            profile=profile_name,
            batch_size=training.samples_per_step,
            config=training.config.record(),
            device=self.backend.identity(),
            steps_per_round=settings.steps_per_round,
            world_size=training.config.world_size,
            items_unit=training.spec.items_unit if training.spec.items is not None else None,
            notes=list(training.notes),  # what building the setup changed (e.g. which convolution biases)
        )

    def _set(self, **fields) -> None:
        """The result so far, with ``fields`` measured: each pass replaces it, none edits it in place."""
        self.result = self.result.replace(**fields)

    def _note(self, note: str) -> None:
        self.result = self.result.with_note(note)

    # -- 1. warm-up ---------------------------------------------------------------
    def timed_step(self) -> None:
        """One step on the live iterator, recording the time blocked on the loader (on the clock rounds read)."""
        t0 = self.backend.clock()
        micro_batches = self.training.fetch(self._batches)
        self._wait_s += self.backend.clock() - t0
        self._last_loss = self.training.step(micro_batches)

    def _window(self) -> Iterator:
        """Batches 0, 1, ... of the seeded stream, made again (``TrainingSetup.batches_from_start``): the fixed window
        every memory and work pass reads from its start, so their figures do not move with the warm-up, the rounds or
        what ran before, and every recipe counts the same batches. Each batch's shapes are kept
        (``window_shapes_note``). A ``map``, not a generator: a generator's frame would keep the last batch alive,
        which the growth pass would count as memory a step keeps."""
        return map(self._shapes_kept, itertools.count(), self.training.batches_from_start())

    def _shapes_kept(self, index: int, batch):
        self._window_shapes.setdefault(index, batch_shapes(batch))
        return batch

    def _window_step(self, window: Iterator) -> None:
        self._last_loss = self.training.step(self.training.fetch(window))

    def window_shapes_note(self) -> str | None:
        """The note of a spec whose batch shapes vary across the window the passes read, or None."""
        shapes = self._window_shapes
        if len(set(shapes.values())) < 2:
            return None
        return (f"{VARYING_SHAPES_NOTE} ({len(set(shapes.values()))} shapes among batches 0..{len(shapes) - 1}): work "
                f"and memory from batches 0..{len(shapes) - 1} of the seeded stream, the same for every recipe, "
                "number of rounds and warm-up")

    def warm_up(self, settle: bool = True, in_rounds: bool = False) -> None:
        """Warm up; ``settle=False``: only the minimum steps (a setup already measured once in this process).
        ``in_rounds``: the minimum steps here, and the timed rounds that follow (``time_rounds``, ``interleave_rounds``)
        judge whether the setup is steady by the rule that would have judged more warm-up steps (``round_is_warm_up``)."""
        with phase(f"{self.result.recipe}'s warm-up"), spent("warm-up", self.baseline):
            self._warm_up(settle, in_rounds)

    @property
    def warmed_up(self) -> bool:
        return self.result.warmup_steps > 0

    def _warm_up(self, settle: bool, in_rounds: bool = False) -> None:
        s, timer = self.settings, self.backend.timer
        start = timer()
        self.timed_step()
        self._set(first_step_s=timer() - start)
        self._keep_seeded_loss()
        done, times, window = 1, [], s.steady_window
        minimum = s.min_warmup_steps + self.extra_warmup_steps
        # Settled when the last window of steps took within the tolerance of the window before it, checked after
        # every step from the minimum on: the minimum's steps after the first count towards the windows, so a
        # setup that is steady from its second step stops after 1 + 2 windows (or the minimum), not after the
        # minimum and two more windows. A limit that leaves no room past the minimum judges nothing.
        settling = settle and not s.fixed_warmup and s.max_warmup_steps > minimum
        if settling and in_rounds and s.rounds >= 2:  # its rounds are the windows: one disagreeing with the next is warm-up
            self._settling_in_rounds, settling = True, False
            if self._seeded is not None:
                # The loss guard's seeded trajectory is the warm-up's first steps, run back to back: in the rounds,
                # the other setup's steps come between (and draw from the global generator a model may sample from).
                minimum = max(minimum, GUARD_STEPS)
        steady = False
        while done < minimum or (settling and not steady and done < s.max_warmup_steps):
            t0 = timer()
            self.timed_step()
            times.append(timer() - t0)
            done += 1
            self._keep_seeded_loss()
            steady = settling and done >= minimum and _settled(times, window, s.steady_tolerance)
        self._set(warmup_steps=done, warmup_steady=steady, warmup_s=timer() - start)
        self._keep_seeded_losses()
        if self._settling_in_rounds:
            return  # its rounds say how it settled
        if s.fixed_warmup:
            self._note(f"fixed warm-up of {done} steps (ranks step in lockstep)")
        elif not settle:
            self._note(f"warm-up of {done} steps: this setup settled when measured earlier in the session")
        elif not steady:
            self._note(f"warm-up did not settle within {s.max_warmup_steps} steps (tolerance {s.steady_tolerance:.0%})")

    def _keep_seeded_loss(self) -> None:
        if self._seeded is not None and len(self._seeded) < GUARD_STEPS and self._last_loss is not None:
            self._seeded.append(self._last_loss)

    def _keep_seeded_losses(self) -> None:
        """The warm-up's first steps' losses as the seeded trajectory (``Result.seeded_losses``), one sync each, after
        the warm-up."""
        if self._seeded is not None and len(self._seeded) == GUARD_STEPS:
            self._set(seeded_losses=[float(loss) for loss in self._seeded])
        self._seeded = None

    def round_is_warm_up(self) -> bool:
        """Whether the first timed round is warm-up still, for a setup warmed up ``in_rounds``: the warm-up's rule on
        rounds for windows. Its first two rounds agreeing within the tolerance, it is steady from the first; the
        first disagreeing, it is warm-up (``drop_first_round``) while the warm-up limit leaves room for another."""
        s, times = self.settings, self.result.round_step_times_s
        if self._settling_in_rounds and len(self._round_waits) != len(times):  # a runner that reads its timer oddly
            self._settling_in_rounds = False
            self._note("warm-up not judged steady: the rounds could not be told apart")
        if not self._settling_in_rounds or len(times) < 2:
            return False
        if times[0] > 0 and abs(times[1] / times[0] - 1.0) <= s.steady_tolerance:
            self._settling_in_rounds = False
            self._set(warmup_steady=True)
            return False
        if self.result.warmup_steps + s.steps_per_round > s.max_warmup_steps:
            self._settling_in_rounds = False
            self._note(f"warm-up did not settle within {s.max_warmup_steps} steps (tolerance {s.steady_tolerance:.0%})")
            return False
        return True

    def drop_first_round(self, own: bool = True) -> None:
        """The first timed round taken as warm-up: its steps and time join the warm-up's, its timing, data wait and
        items leave the rounds' (and its seconds the rounds' share of the case's cost). ``own=False``: dropped with
        the round beside it in interleaved timing, which was the warm-up."""
        s, r = self.settings, self.result
        first = r.round_step_times_s[0]
        del self._timed_items[:self._round_items.pop(0)]
        wait = self._round_waits.pop(0)
        times = r.round_step_times_s[1:]
        cpu = r.round_cpu_times_s[1:] if len(r.round_cpu_times_s) == len(r.round_step_times_s) else []
        self._set(round_step_times_s=times, rounds=len(times), round_cpu_times_s=cpu, data_wait_s=r.data_wait_s - wait,
                  items_per_step=self._items_per_step(), warmup_steps=r.warmup_steps + s.steps_per_round,
                  warmup_s=r.warmup_s + first * s.steps_per_round)
        recharge(first * s.steps_per_round, "rounds", "warm-up", self.baseline)
        if own:
            self._rounds_dropped += 1
        else:
            self._rounds_dropped_beside += 1

    def end_rounds(self) -> None:
        """After the rounds: how the warm-up ended, said."""
        if self._settling_in_rounds:  # one round: nothing to judge it by
            self._settling_in_rounds = False
            self._note(f"warm-up of {self.result.warmup_steps} steps, not judged steady: one timed round")
        dropped, beside = self._rounds_dropped, self._rounds_dropped_beside
        if self.baseline:
            return  # its case's note says it
        if dropped:
            self._note(f"its first {dropped} timed round{'s' if dropped > 1 else ''} taken as warm-up: each took more "
                       f"than {self.settings.steady_tolerance:.0%} longer or shorter than the next")
        if beside:
            self._note(f"{beside} round{'s' if beside > 1 else ''} dropped beside its baseline's, which were warm-up "
                       "(the rounds stay paired)")

    # -- 2. timing ----------------------------------------------------------------
    def time_rounds(self, runner: RoundRunner = run_rounds) -> None:
        """The rounds asked, timed by ``runner``. For a setup warmed up ``in_rounds``, while its first round is warm-up
        still (``round_is_warm_up``) that round is dropped and ``runner`` times one more."""
        s = self.settings
        self.start_rounds()
        in_round = False

        def step():
            before, items = self._wait_s, len(self._timed_items)
            self.timed_step()
            if in_round:  # runners may add steps outside their rounds
                self._count_items()
                self._round_waits[-1] += self._wait_s - before
                self._round_items[-1] += len(self._timed_items) - items

        cpu_marks: list[float | None] = []

        def timer() -> float:  # the runner reads it at each round's start and end: CPU time is read there too
            nonlocal in_round
            now = self.backend.timer()
            cpu_marks.append(self.backend.cpu_clock())
            in_round = not in_round
            if in_round:
                self._round_waits.append(0.0)
                self._round_items.append(0)
            return now

        def timed(count: int) -> None:  # its phase closed before a round is moved to the warm-up's seconds
            cpu_marks.clear()
            with phase(f"{self.result.recipe}'s timed rounds"), spent("rounds", self.baseline):
                times = runner(step, count, s.steps_per_round, timer)
                self._add_rounds(times, _round_cpu_times(cpu_marks, len(times), s.steps_per_round))

        timed(s.rounds)
        while self.round_is_warm_up():
            self.drop_first_round()
            timed(1)
        self.end_rounds()

    def _count_items(self) -> None:
        """Keep the items of the step just timed (a tensor each: summed, with one sync, after the rounds)."""
        if self.training.last_items is not None:
            self._timed_items.append(self.training.last_items)

    def _items_per_step(self) -> float | None:
        """Mean items per timed step, in this process (None where the spec counts none)."""
        if not self._timed_items:
            return None
        return float(torch.stack([t.to("cpu") for t in self._timed_items]).sum()) / len(self._timed_items)

    def start_rounds(self) -> None:
        """Forget any timed rounds: ``time_one_round`` calls from here on are the case's rounds."""
        self._wait_s = 0.0
        self._timed_items = []
        self._round_waits, self._round_items = [], []
        self._set(round_step_times_s=[], round_cpu_times_s=[], rounds=0, data_wait_s=0.0, items_per_step=None)

    def time_one_round(self, rewarm_steps: int = 0) -> None:
        """One more timed round, appended to the result (for interleaved A/B timing), after ``rewarm_steps``
        untimed steps: a process that sat idle while another ran starts cold (its caches evicted, its
        OpenMP threads asleep), which would slow the first steps of its round."""
        s, timer = self.settings, self.backend.timer
        with spent("warm-up", self.baseline):
            for _ in range(rewarm_steps):
                self.timed_step()
        before, items_before = self._wait_s, len(self._timed_items)
        with phase(f"{self.result.recipe}'s timed rounds"), spent("rounds", self.baseline):
            start, cpu_start = timer(), self.backend.cpu_clock()
            for _ in range(s.steps_per_round):
                self.timed_step()
                self._count_items()
            round_time = (timer() - start) / s.steps_per_round
            cpu_end = self.backend.cpu_clock()
        self._round_waits.append(self._wait_s - before)
        self._round_items.append(len(self._timed_items) - items_before)
        self._add_rounds([round_time], _round_cpu_times([cpu_start, cpu_end], 1, s.steps_per_round))

    def _add_rounds(self, times: list[float], cpu: list[float]) -> None:
        """Timed rounds (and their CPU seconds per step, [] where unknown) appended to the result's, its data wait and
        items per step those of every round kept (``_round_waits``, ``_timed_items``)."""
        r = self.result
        all_times, all_cpu = [*r.round_step_times_s, *times], [*r.round_cpu_times_s, *cpu]
        self._set(round_step_times_s=all_times, rounds=len(all_times), data_wait_s=sum(self._round_waits),
                  round_cpu_times_s=all_cpu if len(all_cpu) == len(all_times) else [], items_per_step=self._items_per_step())

    # -- 3 and 4. after timing ---------------------------------------------------------
    def measure_after_timing(self) -> None:
        """The memory and work passes, ordered so that compiled code stays compiled.

        First the passes that run the step as it was timed (allocator peaks, the profiler's
        call count), then those that run it under a TorchDispatchMode (growth, MemTracker,
        FLOP and op counts): after one step under a dispatch mode, torch 2.9 runs a
        ``torch.compile``d function eagerly for good (2.14 keeps it compiled).
        """
        passes = [("peaks", self.measure_peaks), ("calls", self.count_calls), ("memory", self.measure_memory),
                  ("work", self.count_work)]
        if self.training.config.parallel == "dp":
            # DataParallel runs its replicas in threads of its own: dispatch modes (growth, MemTracker, FLOP and op
            # counts) see only the main thread's share, and the tracker's module hooks race between them.
            passes = passes[:2]
            self._note("DataParallel: no memory breakdown, growth, FLOP or op counts (replica threads are invisible "
                       "to dispatch modes); allocator peaks are the first GPU's")
        if self.settings.passes is not None:
            skipped = [name for name, _ in passes if name not in self.settings.passes]
            passes = [(name, run) for name, run in passes if name in self.settings.passes]
            if skipped:
                self._note(f"quick run: the {', '.join(skipped)} pass{'es' if len(skipped) > 1 else ''} skipped "
                           "(no budget names what they measure)")
        for name, run in passes:
            # After the peaks pass (whose release_memory collects what earlier cases dropped), the heap is frozen.
            with phase(f"{self.result.recipe}'s {name} pass"), spent(name, self.baseline), \
                    (contextlib.nullcontext() if name == "peaks" else heap_frozen()):
                run()
        varying = self.window_shapes_note()
        if varying:
            self._note(varying)

    # -- 3. memory ----------------------------------------------------------------
    def measure_peaks(self) -> None:
        """Allocator peaks of a few steps as timed (CUDA; the CPU backend reports none)."""
        backend = self.backend
        if not backend.has_allocator_peaks:  # the CPU: no allocator to ask, so no steps to run for it
            return
        backend.synchronize()
        # What earlier cases (and dropped objects awaiting the collector) left in the cache would
        # otherwise be part of this case's reserved peak, which would then depend on the order of cases.
        backend.release_memory()
        backend.reset_peak_memory()
        window = self._window()
        for _ in range(self.settings.memory_steps):
            self._window_step(window)
        backend.synchronize()
        peak = backend.peak_memory()
        # Reserved between steps: what the step leaves for the next one, the figure empty_cache lowers (its in-step
        # peak it cannot).
        self._set(peak_allocated_bytes=peak.allocated_bytes, peak_reserved_bytes=peak.reserved_bytes,
                  alloc_retries=peak.alloc_retries, reserved_between_steps_bytes=backend.reserved_bytes())
        if self.settings.attribution:  # one more step, with the allocator's history on (CUDA; None elsewhere)
            history = backend.allocator_history(lambda: self._window_step(window))
            if history is not None:
                self._attribute(allocator_peak_bytes=allocator_sites(history))

    def measure_memory(self) -> None:
        """Growth per step, then the tracked breakdown of the peak (both under dispatch modes)."""
        self._measure_growth()
        if self.settings.breakdown:
            self._set(memory_breakdown_bytes=self.tracked_breakdown())
            if compiled_by_user(self.training.model):
                self._note("the spec's model came compiled: what its compiled code allocates is invisible to the "
                           "tracked breakdown (peak and activation MiB count only what runs outside it)")

    def _measure_growth(self) -> None:
        """Live tensor memory and kept autograd nodes added per step, over GROWTH_STEPS steps (x log_every) after a first."""
        training = self.training
        # Steps that sync every N (loss_history="item", log_every=N) hold a pending sum between
        # syncs: compare two steps at the same point of that cycle.
        n = training.config.log_every
        steps = -(-GROWTH_STEPS // n) * n  # GROWTH_STEPS, rounded up to whole cycles
        # Batches are fetched outside the counter: loader internals are not the step's memory.
        # Each is dropped after its step, so only what the step itself keeps can grow.
        window = self._window()
        pending = [training.fetch(window) for _ in range(steps + 1)]
        live_after, nodes_after, sites_after = [], [], []  # after the first step and after the last
        with self._sites(backward=False) as sites, _LiveStorages(self.backend.device, sites) as live:
            for i in range(steps + 1):
                self._last_loss = training.step(pending.pop(0))
                if i in (0, steps):
                    self.backend.synchronize()
                    gc.collect()  # count what the step keeps reachable, not cycles awaiting the collector
                    live_after.append(live.live_bytes())
                    nodes_after.append(training.retained_graph_nodes())
                    sites_after.append(live.live_by_site())
        if sites is not None:  # which sites' tensors the steps kept (a leak), and which made up the peak
            kept = {site: (sites_after[1].get(site, 0) - sites_after[0].get(site, 0)) / steps
                    for site in {*sites_after[0], *sites_after[1]}}
            self._attribute(memory={"peak_bytes": live.peak_by_site,
                                    "kept_bytes_per_step": {site: n for site, n in kept.items() if n},
                                    "param_bytes": parameter_sites(training.model)})
        # The first step is the reference: it frees what earlier steps left (the previous loss, gradients
        # set to None) and that the counter never saw. A kept graph (``total_loss += loss``) grows by one
        # step's backward graph each step.
        self._set(memory_growth_bytes_per_step=(live_after[1] - live_after[0]) / steps,
                  graph_nodes_growth_per_step=(nodes_after[1] - nodes_after[0]) / steps)

    def tracked_breakdown(self) -> dict[str, int]:
        """The tensor peak of one step split into parameters, gradients, optimizer state, activations...

        Steps trainbench runs around a ``loss_fn``: PyTorch's ``MemTracker``. It follows the model
        module by module and cannot follow a loss that calls a submodule twice outside the root's
        forward (a GAN's ``model.D(real)``, ``model.D(fake)``), nor a module fed a structure its hooks
        cannot rebuild (they unflatten each module's inputs and outputs through pytree, which fails on a
        ``PackedSequence``); such a step, and every custom step, is tracked by storage identity instead
        (``_StepMemory``), which no calling pattern can confuse. An error of the step itself recurs there.
        """
        if self.training.context is None and sparse_gradients(self.training.model):
            self._note("memory breakdown tracked by storage identity: the model has sparse gradients (an embedding "
                       "with sparse=True), whose storage MemTracker cannot read")
        elif self.training.context is None:
            try:
                return self._memtracker_breakdown()
            except (NotApplicable, NoProgress):
                raise
            except NotImplementedError:  # "MemTracker does not support memory tracking for multiple iterative calls"
                self._note("memory breakdown tracked by storage identity: the loss calls a module again outside the "
                           "root module's forward, which MemTracker cannot follow")
            except Exception as e:  # noqa: BLE001 - the hooks' own failure; the step's own recurs below
                self._note(f"memory breakdown tracked by storage identity: MemTracker's module hooks failed "
                           f"({failure_line(e)})")
        return self._storage_breakdown()

    def _memtracker_breakdown(self) -> dict[str, int]:
        training = self.training
        optimizers = list(training.optimizers.values())
        if training.config.parallel == "fsdp":  # sharded and gathered parameters and gradients told apart
            from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

            if len(optimizers) != 1:
                raise NotApplicable(f"FSDP2's memory tracker follows one optimizer; the spec has {len(optimizers)}")
            tracker = FSDPMemTracker(training.model, optimizers[0])
        else:
            from torch.distributed._tools.mem_tracker import MemTracker

            tracker = MemTracker()
            tracker.track_external(training.model, *optimizers)
        global_peak_only(tracker)
        micro_batches = training.fetch(self._window())  # outside the tracker: loader transforms are modules too
        # MemTracker follows one forward of the root module per iteration and raises on a second;
        # its per-module stats are not read here (only its global peak), so clear them before each.
        training.before_forward = tracker.reset_mod_stats
        try:
            # One step only: the tracker's hooks keep graphs that see no backward alive, and over
            # several steps those would pile up in the peak.
            with module_grad_hooks_removed(), tracker, warnings.catch_warnings():
                # A hook's failure is raised (and handled by the caller); torch also warns that it silenced the
                # forward hook that would have run after it.
                warnings.filterwarnings("ignore", message="global module forward hook with ``always_call=True``")
                self._last_loss = training.step(micro_batches)
                self.backend.synchronize()
        finally:
            training.before_forward = None
        per_device = self._device_stats(tracker.get_tracker_snapshot("peak"))
        breakdown = {"total": int(per_device.get("Total", 0))}
        for ref_type, nbytes in per_device.items():
            key = _MEMTRACKER_CATEGORIES.get(getattr(ref_type, "name", str(ref_type)).split(".")[-1])
            if key:
                breakdown[key] = int(nbytes)
        return breakdown

    def _storage_breakdown(self) -> dict[str, int]:
        training = self.training
        micro_batches = training.fetch(self._window())
        with _StepMemory(self.backend.device, training.model, training.optimizers.values()) as tracker:
            self._last_loss = training.step(micro_batches)
            self.backend.synchronize()
        return tracker.peak_breakdown()

    def _device_stats(self, snapshot) -> dict:
        return next((v for k, v in snapshot.items() if torch.device(k).type == self.backend.device.type), {})

    # -- 4. work ------------------------------------------------------------------
    def count_work(self) -> None:
        """FLOPs of the window's first step; ops and syncs per step over its first N steps (N: ``log_every``, the
        cycle of a loss synced every N steps), so every recipe's FLOPs count the same batch."""
        training = self.training
        n = training.config.log_every
        window = self._window()
        steps = [training.fetch(window) for _ in range(n)]
        self._set(h2d_bytes_per_sample=training.h2d_bytes(steps[0]) / training.samples_per_step)
        if not self.settings.work:
            return
        flops = FlopCounterMode(display=False)
        with self._sites() as sites, tracker_warnings_silenced():
            counter = _OpCounter(self.backend, sites)
            for i, micro_batches in enumerate(steps):
                # The op counter inside the FLOP counter, as ever: FlopCounterMode decomposes the composite ops it
                # sees first (under inference_mode, conv2d and linear reach the modes whole), so a counter outside
                # it would count their pieces and an inference-mode step as many ops as a no_grad one.
                with flops if i == 0 else contextlib.nullcontext(), counter:
                    self._last_loss = training.step(micro_batches)
        self.backend.synchronize()
        flops_by_op = flops.get_flop_counts().get("Global", {})
        precision, peak_tflops = self.backend.mfu_peak(self.training.config.amp, convolution_share(flops_by_op))
        no_peak = no_peak_reason(self.backend.name)
        if no_peak and not any(no_peak in note for note in self.result.notes):
            self._note(f"{self.backend.name}: {no_peak}")
        self._set(flops_per_step=int(flops.get_total_flops()), ops_per_step=sum(counter.ops.values()) / n,
                  syncs_per_step=counter.syncs / n, peak_precision=precision, peak_tflops=peak_tflops)
        self._attribute(ops=per_step(counter.ops, n), flops=per_step(flops_by_op, 1),
                        syncs=per_step(counter.syncs_by_site, n))
        if sites is not None:
            self._attribute(ops_by_site=per_step(counter.ops_by_site, n))

    def count_calls(self) -> None:
        """aten calls and device kernels of a step (the first of the profiled steps), from PyTorch's profiler, and
        with attribution on, each op's self time over ``profiled_steps`` steps.

        Unlike the dispatch-mode op count, the profiler sees what compiled code really
        runs (a compiled region appears as its few extern calls and kernels), so this is
        the count that fusion and ``torch.compile`` cut.
        """
        if not self.settings.work:
            return
        profiled = self.profile(self.settings.profiled_steps if self.settings.attribution else 1)
        if profiled is None:
            self._note("aten call count skipped: a profiler is already running")
            return
        self._set(aten_calls_per_step=sum(n for op, n in profiled["calls"].items() if op.startswith("aten::")))
        if self.backend.counts_kernels:
            self._set(kernels_per_step=sum(profiled["kernel_calls"].values()))
        if self.settings.attribution:
            self._attribute(time=profiled)

    def profile(self, steps: int) -> dict | None:
        """``steps`` steps on the live iterator, one profiler each (``attribution.profile_steps``), or None where a
        profiler is already running: a second one fails to start and, on its way out, stops the one running (torch
        2.9 then crashes when that one is closed)."""
        if self.training.config.runs_a_profiler or torch.autograd.profiler._is_profiler_enabled:
            return None
        # Batches fetched before profiling: the loader's work is not the step's.
        window = self._window()
        pending = [self.training.fetch(window) for _ in range(steps)]

        def step():
            self._last_loss = self.training.step(pending.pop(0))

        return profile_steps(step, steps, self.backend)

    def _sites(self, backward: bool = True):
        """Where ops run and tensors are made (``attribution.Sites``), or a null context yielding None: attribution
        off, or compiled code, which the module hooks would send back to recompilation."""
        if not self.settings.attribution:
            return contextlib.nullcontext()
        if self.training.compiles:
            if not any("module sites" in note for note in self.result.notes):
                self._note("no module sites in the attribution: their module hooks would recompile compiled code")
            return contextlib.nullcontext()
        return Sites(self.training.model, backward)

    def _attribute(self, **tables) -> None:
        """Add the passes' attribution tables to the result (only where attribution is on)."""
        if self.settings.attribution:
            self._set(attribution={**(self.result.attribution or {}), **tables})

    def rewarm(self) -> None:
        """A few untimed steps after other work ran in between (another setup's warm-up, the passes)."""
        with spent("warm-up", self.baseline):
            for _ in range(self.settings.min_warmup_steps):
                self.timed_step()

    # The fields the memory and work passes fill: exact functions of code and shapes (allocator
    # peaks nearly so), the same whenever the same setup is measured in one process.
    PASS_FIELDS = ("peak_allocated_bytes", "peak_reserved_bytes", "alloc_retries", "reserved_between_steps_bytes",
                   "memory_breakdown_bytes", "memory_growth_bytes_per_step", "graph_nodes_growth_per_step",
                   "flops_per_step", "ops_per_step",
                   "syncs_per_step", "h2d_bytes_per_sample", "aten_calls_per_step", "kernels_per_step", "attribution",
                   "peak_tflops", "peak_precision")

    def reuse_passes(self, earlier: Result) -> None:
        """Take the memory and work figures of an earlier measurement of the same setup instead of re-running them."""
        self._set(**{name: getattr(earlier, name) for name in self.PASS_FIELDS})
        self._note("memory and work figures from this setup's earlier measurement in the session")
        for note in earlier.notes:
            if note.startswith(VARYING_SHAPES_NOTE):
                self._note(note)

    def finish(self) -> Result:
        if self._last_loss is not None:
            self._set(final_loss=float(self._last_loss))  # one sync, after all timing
        return self.result

    def run(self, runner: RoundRunner = run_rounds, passes_from: Result | None = None) -> Result:
        """The whole method (``passes_from``: an earlier measurement of this setup whose passes stand): warm-up to the
        minimum, the rounds judging when it ended (``warm_up(in_rounds=True)``), the passes."""
        self.warm_up(in_rounds=True)
        self.time_rounds(runner)
        if passes_from is not None:
            self.reuse_passes(passes_from)
        else:
            self.measure_after_timing()
        return self.finish()


def measure(training: TrainingSetup, case: str, recipe_name: str, settings: MeasureSettings, extra_warmup_steps: int = 0,
            profile_name: str = "", runner: RoundRunner = run_rounds) -> Result:
    """Measure a built training setup (one process) with the whole method."""
    return Measurer(training, case, recipe_name, settings, extra_warmup_steps, profile_name).run(runner)


def interleave_rounds(case: Measurer, baseline: Measurer) -> None:
    """Time a case's and its baseline's rounds interleaved, in ABBA order, after the case's warm-up and the baseline's
    few steps since (its minimum warm-up where it settled when measured earlier in the session and was not warmed yet).

    A setup warmed up to its minimum has its rounds for the warm-up rule's windows: while the first round of the
    case (or of a baseline warmed up so) disagrees with its second, that pair of rounds is warm-up and another pair
    is timed, so the rounds that stand are as many as asked and steady, without the windows' steps before them.

    A shared runner's speed drifts over seconds; timed back to back, a slow spell lands
    on one side of a speed-up and skews it by tens of percent. Alternating rounds puts
    both sides under the same conditions, so the ratio of the two is what a same-session
    budget should judge. The memory and work passes are not timed: the runner runs them
    with one setup alive at a time, so allocator peaks are each setup's own.
    """
    case.warm_up(in_rounds=True)
    if baseline.warmed_up:
        baseline.rewarm()
    else:  # a baseline that settled when measured earlier in the session: its minimum, right before the rounds
        baseline.warm_up(settle=False)
        baseline.training.check_loss("the end of warm-up")
    for m in (case, baseline):
        m.start_rounds()
    timed = 0
    while len(case.result.round_step_times_s) < case.settings.rounds:
        for m in ((baseline, case) if timed % 2 == 0 else (case, baseline)):
            m.time_one_round()
        timed += 1
        warm_up = [m.round_is_warm_up() for m in (case, baseline)]
        if any(warm_up):  # the pair goes: the rounds stay paired
            for m, own in zip((case, baseline), warm_up):
                m.drop_first_round(own)
    for m in (case, baseline):
        m.end_rounds()


def with_overrides(settings: MeasureSettings, **changes) -> MeasureSettings:
    return replace(settings, **{k: v for k, v in changes.items() if v is not None})
