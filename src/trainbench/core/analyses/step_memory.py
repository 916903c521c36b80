"""The memory of a training setup's step, on batches of its seeded stream from the start: the allocator's peaks, the
live tensor memory and autograd nodes a step keeps (growth: a leak if > 0), and the tracked breakdown of the tensor
peak into parameters, gradients, optimizer state, activations... It needs no timing: the measurement asks it after
its timed rounds, and the memory prediction asks it of a setup under fake tensors (``trainbench.core.analyses.predict``).

1. Peaks: a few steps with the allocator's peaks reset (CUDA; the CPU has none).
2. Growth: live tensor bytes and kept autograd nodes after each of a few steps, under ``_LiveStorages``.
3. Breakdown: one step under PyTorch's ``MemTracker`` or, for steps it cannot follow, ``_StorageKinds``.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import warnings
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

from trainbench.core.analyses.attribution import (
    Sites,
    allocator_sites,
    module_grad_hooks_removed,
    parameter_sites,
)
from trainbench.core.harness.failures import failure_line
from trainbench.core.harness.watchdog import NoProgress
from trainbench.core.setups.recipes import NotApplicable
from trainbench.core.setups.training import TrainingSetup, sparse_gradients

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


class _StorageKinds(TorchDispatchMode):
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


def _no_sites(backward: bool = True) -> contextlib.AbstractContextManager[Sites | None]:
    """Where no sites are asked: a context yielding None in the place of ``attribution.Sites``."""
    return contextlib.nullcontext()


@dataclass(frozen=True)
class AllocatorPeaks:
    """The caching allocator's peaks over a few steps as timed, and what it holds between steps."""

    allocated_bytes: int | None
    reserved_bytes: int | None
    alloc_retries: int | None
    # what the step leaves reserved for the next one: the figure empty_cache lowers (its in-step peak it cannot)
    reserved_between_steps_bytes: int | None
    by_site: dict[str, int] | None  # the allocator's bytes at the peak by the line that asked (``allocator_sites``)


@dataclass(frozen=True)
class Growth:
    """What a step keeps alive, per step: live tensor bytes and autograd nodes."""

    bytes_per_step: float
    graph_nodes_per_step: float
    by_site: dict | None  # the tracked peak's and the kept bytes' sites, the parameters' (where sites were asked)


@dataclass(frozen=True)
class Breakdown:
    """The tensor peak of one step by kind (``total`` among them), and why it was tracked by storage identity rather
    than by ``MemTracker`` (None where MemTracker tracked it, or the step is a custom one)."""

    by_kind: dict[str, int]
    by_identity_because: str | None = None


@dataclass(frozen=True)
class StepMemory:
    """The memory passes of one training setup. ``window``: a new iterator over batches 0, 1, ... of its seeded
    stream, for each pass (by default ``TrainingSetup.batches_from_start``); ``step``: one step on fetched
    micro-batches (by default the setup's own); ``sites``: where ops run and tensors are made
    (``attribution.Sites``), or a null context yielding None (the default)."""

    training: TrainingSetup
    window: Callable[[], Iterator] | None = None
    step: Callable[[list], torch.Tensor] | None = None
    sites: Callable[..., contextlib.AbstractContextManager[Sites | None]] = _no_sites

    def _batches(self) -> Iterator:
        return (self.window or self.training.batches_from_start)()

    def _run(self, micro_batches: list) -> None:
        (self.step or self.training.step)(micro_batches)

    def allocator_peaks(self, steps: int, by_site: bool) -> AllocatorPeaks | None:
        """Allocator peaks of ``steps`` steps (None on a device without them: no steps run for it); ``by_site``: one
        more step with the allocator's history on (CUDA; None elsewhere)."""
        backend = self.training.backend
        if not backend.has_allocator_peaks:
            return None
        backend.synchronize()
        # What earlier cases (and dropped objects awaiting the collector) left in the cache would
        # otherwise be part of this case's reserved peak, which would then depend on the order of cases.
        backend.release_memory()
        backend.reset_peak_memory()
        window = self._batches()
        for _ in range(steps):
            self._run(self.training.fetch(window))
        backend.synchronize()
        peak = backend.peak_memory()
        between = backend.reserved_bytes()
        history = backend.allocator_history(lambda: self._run(self.training.fetch(window))) if by_site else None
        return AllocatorPeaks(peak.allocated_bytes, peak.reserved_bytes, peak.alloc_retries, between,
                              allocator_sites(history) if history is not None else None)

    def growth(self) -> Growth:
        """Live tensor memory and kept autograd nodes added per step, over GROWTH_STEPS steps (x log_every) after a first."""
        training = self.training
        # Steps that sync every N (loss_history="item", log_every=N) hold a pending sum between
        # syncs: compare two steps at the same point of that cycle.
        n = training.config.log_every
        steps = -(-GROWTH_STEPS // n) * n  # GROWTH_STEPS, rounded up to whole cycles
        # Batches are fetched outside the counter: loader internals are not the step's memory.
        # Each is dropped after its step, so only what the step itself keeps can grow.
        window = self._batches()
        pending = [training.fetch(window) for _ in range(steps + 1)]
        live_after, nodes_after, sites_after = [], [], []  # after the first step and after the last
        with self.sites(backward=False) as sites, _LiveStorages(training.backend.device, sites) as live:
            for i in range(steps + 1):
                self._run(pending.pop(0))
                if i in (0, steps):
                    training.backend.synchronize()
                    gc.collect()  # count what the step keeps reachable, not cycles awaiting the collector
                    live_after.append(live.live_bytes())
                    nodes_after.append(training.retained_graph_nodes())
                    sites_after.append(live.live_by_site())
        by_site = None
        if sites is not None:  # which sites' tensors the steps kept (a leak), and which made up the peak
            kept = {site: (sites_after[1].get(site, 0) - sites_after[0].get(site, 0)) / steps
                    for site in {*sites_after[0], *sites_after[1]}}
            by_site = {"peak_bytes": live.peak_by_site, "kept_bytes_per_step": {site: n for site, n in kept.items() if n},
                       "param_bytes": parameter_sites(training.model)}
        # The first step is the reference: it frees what earlier steps left (the previous loss, gradients
        # set to None) and that the counter never saw. A kept graph (``total_loss += loss``) grows by one
        # step's backward graph each step.
        return Growth((live_after[1] - live_after[0]) / steps, (nodes_after[1] - nodes_after[0]) / steps, by_site)

    def tracked_breakdown(self) -> Breakdown:
        """The tensor peak of one step split into parameters, gradients, optimizer state, activations...

        Steps trainbench runs around a ``loss_fn``: PyTorch's ``MemTracker``. It follows the model
        module by module and cannot follow a loss that calls a submodule twice outside the root's
        forward (a GAN's ``model.D(real)``, ``model.D(fake)``), nor a module fed a structure its hooks
        cannot rebuild (they unflatten each module's inputs and outputs through pytree, which fails on a
        ``PackedSequence``); such a step, and every custom step, is tracked by storage identity instead
        (``_StorageKinds``), which no calling pattern can confuse. An error of the step itself recurs there.
        """
        training, because = self.training, None
        if training.context is None and sparse_gradients(training.model):
            because = ("memory breakdown tracked by storage identity: the model has sparse gradients (an embedding "
                       "with sparse=True), whose storage MemTracker cannot read")
        elif training.context is None:
            try:
                return Breakdown(self.memtracker_breakdown())
            except (NotApplicable, NoProgress):
                raise
            except NotImplementedError:  # "MemTracker does not support memory tracking for multiple iterative calls"
                because = ("memory breakdown tracked by storage identity: the loss calls a module again outside the "
                           "root module's forward, which MemTracker cannot follow")
            except Exception as e:  # noqa: BLE001 - the hooks' own failure; the step's own recurs below
                because = (f"memory breakdown tracked by storage identity: MemTracker's module hooks failed "
                           f"({failure_line(e)})")
        return Breakdown(self.storage_breakdown(), because)

    def memtracker_breakdown(self) -> dict[str, int]:
        """One step's breakdown by PyTorch's ``MemTracker`` (``FSDPMemTracker`` for an FSDP2 setup)."""
        training = self.training
        optimizers = list(training.optimizers.values())
        if training.config.turned("shards_parameters"):  # sharded and gathered parameters and gradients told apart
            # Loaded here: only an FSDP setup's breakdown needs FSDP2's tracker.
            from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

            if len(optimizers) != 1:
                raise NotApplicable(f"FSDP2's memory tracker follows one optimizer; the spec has {len(optimizers)}")
            tracker = FSDPMemTracker(training.model, optimizers[0])
        else:
            # Loaded here: torch.distributed's trackers take ~50 ms to load, and only this pass uses them.
            from torch.distributed._tools.mem_tracker import MemTracker

            tracker = MemTracker()
            tracker.track_external(training.model, *optimizers)
        global_peak_only(tracker)
        micro_batches = training.fetch(self._batches())  # outside the tracker: loader transforms are modules too
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
                self._run(micro_batches)
                training.backend.synchronize()
        finally:
            training.before_forward = None
        per_device = self._device_stats(tracker.get_tracker_snapshot("peak"))
        breakdown = {"total": int(per_device.get("Total", 0))}
        for ref_type, nbytes in per_device.items():
            key = _MEMTRACKER_CATEGORIES.get(getattr(ref_type, "name", str(ref_type)).split(".")[-1])
            if key:
                breakdown[key] = int(nbytes)
        return breakdown

    def storage_breakdown(self) -> dict[str, int]:
        """One step's breakdown by storage identity (``_StorageKinds``): any loss or step function."""
        training = self.training
        micro_batches = training.fetch(self._batches())
        with _StorageKinds(training.backend.device, training.model, training.optimizers.values()) as tracker:
            self._run(micro_batches)
            training.backend.synchronize()
        return tracker.peak_breakdown()

    def _device_stats(self, snapshot) -> dict:
        device_type = self.training.backend.device.type
        return next((v for k, v in snapshot.items() if torch.device(k).type == device_type), {})
