"""The passes after the timed rounds: memory (``step_memory``: allocator peaks, growth, the tracked breakdown) and
work (``step_work``: FLOPs, ops and syncs, the profiler's calls and kernels), with attribution tables where asked.

Each pass reads its batches from the start of the seeded stream, made again (``AfterTiming.window``), never from
where the warm-up and the rounds left the live one: with batches whose shapes vary (padding to each batch's longest
sequence) their figures would otherwise move with the rounds, the warm-up and what ran before.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator

from trainbench.core.analyses.attribution import Sites, per_step
from trainbench.core.analyses.step_memory import StepMemory, heap_frozen
from trainbench.core.analyses.step_work import StepWork
from trainbench.core.harness.costs import spent
from trainbench.core.harness.watchdog import phase
from trainbench.core.method.measured import Measured
from trainbench.core.records.result import VARYING_SHAPES_NOTE, Result
from trainbench.core.setups.spec import batch_shapes
from trainbench.core.setups.effects import compiled_by_user
from trainbench.devices.caps import convolution_share
from trainbench.devices.device import no_peak_reason


class AfterTiming:
    """The memory and work passes of a measured setup, their figures, notes and attribution tables in its result."""

    # The fields the memory and work passes fill: exact functions of code and shapes (allocator
    # peaks nearly so), the same whenever the same setup is measured in one process.
    PASS_FIELDS = ("peak_allocated_bytes", "peak_reserved_bytes", "alloc_retries", "reserved_between_steps_bytes",
                   "memory_breakdown_bytes", "memory_growth_bytes_per_step", "graph_nodes_growth_per_step",
                   "flops_per_step", "ops_per_step",
                   "syncs_per_step", "h2d_bytes_per_sample", "aten_calls_per_step", "kernels_per_step", "attribution",
                   "peak_tflops", "peak_precision")

    def __init__(self, measured: Measured):
        self._measured = measured
        self._window_shapes: dict[int, tuple] = {}  # the shapes of each window batch the passes read, by index
        self.memory = StepMemory(measured.training, self.window, measured.step_on, self.sites)
        self.work = StepWork(measured.training, self.window, measured.step_on, self.sites)

    def run(self) -> None:
        """The memory and work passes, ordered so that compiled code stays compiled.

        First the passes that run the step as it was timed (allocator peaks, the profiler's
        call count), then those that run it under a TorchDispatchMode (growth, MemTracker,
        FLOP and op counts): after one step under a dispatch mode, torch 2.9 runs a
        ``torch.compile``d function eagerly for good (2.14 keeps it compiled).
        """
        m = self._measured
        passes = [("peaks", self.peaks), ("calls", self.calls), ("memory", self.memory_pass), ("work", self.work_pass)]
        for _, unseen in m.training.config.turned("unseen_by_dispatch"):
            # Replicas in threads of their own (DataParallel): dispatch modes (growth, MemTracker, FLOP and op counts)
            # see only the main thread's share, and the tracker's module hooks race between them.
            passes = passes[:2]
            m.note(unseen)
        if m.settings.passes is not None:
            skipped = [name for name, _ in passes if name not in m.settings.passes]
            passes = [(name, run) for name, run in passes if name in m.settings.passes]
            if skipped:
                m.note(f"quick run: the {', '.join(skipped)} pass{'es' if len(skipped) > 1 else ''} skipped "
                       "(no budget names what they measure)")
        for name, run in passes:
            # After the peaks pass (whose release_memory collects what earlier cases dropped), the heap is frozen.
            with phase(f"{m.result.recipe}'s {name} pass"), spent(name, m.baseline), \
                    (contextlib.nullcontext() if name == "peaks" else heap_frozen()):
                run()
        varying = self.window_shapes_note()
        if varying:
            m.note(varying)

    def window(self) -> Iterator:
        """Batches 0, 1, ... of the seeded stream, made again (``TrainingSetup.batches_from_start``): the fixed window
        every memory and work pass reads from its start, so their figures do not move with the warm-up, the rounds or
        what ran before, and every recipe counts the same batches. Each batch's shapes are kept
        (``window_shapes_note``). A ``map``, not a generator: a generator's frame would keep the last batch alive,
        which the growth pass would count as memory a step keeps."""
        return map(self._shapes_kept, itertools.count(), self._measured.training.batches_from_start())

    def _shapes_kept(self, index: int, batch):
        self._window_shapes.setdefault(index, batch_shapes(batch))
        return batch

    def window_shapes_note(self) -> str | None:
        """The note of a spec whose batch shapes vary across the window the passes read, or None."""
        shapes = self._window_shapes
        if len(set(shapes.values())) < 2:
            return None
        return (f"{VARYING_SHAPES_NOTE} ({len(set(shapes.values()))} shapes among batches 0..{len(shapes) - 1}): work "
                f"and memory from batches 0..{len(shapes) - 1} of the seeded stream, the same for every recipe, "
                "number of rounds and warm-up")

    def sites(self, backward: bool = True):
        """Where ops run and tensors are made (``attribution.Sites``), or a null context yielding None: attribution
        off, or compiled code, which the module hooks would send back to recompilation."""
        m = self._measured
        if not m.settings.attribution:
            return contextlib.nullcontext()
        if m.training.compiles:
            if not any("module sites" in note for note in m.result.notes):
                m.note("no module sites in the attribution: their module hooks would recompile compiled code")
            return contextlib.nullcontext()
        return Sites(m.training.model, backward)

    def attribute(self, **tables) -> None:
        """Add the passes' attribution tables to the result (only where attribution is on)."""
        m = self._measured
        if m.settings.attribution:
            m.record(attribution={**(m.result.attribution or {}), **tables})

    # -- memory ----------------------------------------------------------------------------------------------
    def peaks(self) -> None:
        """Allocator peaks of a few steps as timed (CUDA; the CPU backend reports none)."""
        m = self._measured
        peaks = self.memory.allocator_peaks(m.settings.memory_steps, by_site=m.settings.attribution)
        if peaks is None:  # the CPU: no allocator to ask, so no steps were run for it
            return
        m.record(peak_allocated_bytes=peaks.allocated_bytes, peak_reserved_bytes=peaks.reserved_bytes,
                 alloc_retries=peaks.alloc_retries, reserved_between_steps_bytes=peaks.reserved_between_steps_bytes)
        if peaks.by_site is not None:
            self.attribute(allocator_peak_bytes=peaks.by_site)

    def memory_pass(self) -> None:
        """Growth per step, then the tracked breakdown of the peak (both under dispatch modes)."""
        m = self._measured
        growth = self.memory.growth()
        if growth.by_site is not None:
            self.attribute(memory=growth.by_site)
        m.record(memory_growth_bytes_per_step=growth.bytes_per_step,
                 graph_nodes_growth_per_step=growth.graph_nodes_per_step)
        if m.settings.breakdown:
            m.record(memory_breakdown_bytes=self.tracked_breakdown())
            if compiled_by_user(m.training.model):
                m.note("the spec's model came compiled: what its compiled code allocates is invisible to the "
                       "tracked breakdown (peak and activation MiB count only what runs outside it)")

    def tracked_breakdown(self) -> dict[str, int]:
        """The tensor peak of one step by kind (``StepMemory.tracked_breakdown``), noting how it was tracked."""
        breakdown = self.memory.tracked_breakdown()
        if breakdown.by_identity_because:
            self._measured.note(breakdown.by_identity_because)
        return breakdown.by_kind

    # -- work ------------------------------------------------------------------------------------------------
    def work_pass(self) -> None:
        """FLOPs of the window's first step; ops and syncs per step over its first N steps (N: ``log_every``, the
        cycle of a loss synced every N steps), so every recipe's FLOPs count the same batch."""
        m = self._measured
        training = m.training
        n = training.config.log_every
        steps = self.work.fetched(n)
        m.record(h2d_bytes_per_sample=training.h2d_bytes(steps[0]) / training.samples_per_step)
        if not m.settings.work:
            return
        work = self.work.count(steps)
        precision, peak_tflops = m.backend.mfu_peak(training.config.amp, convolution_share(work.flops_by_op))
        no_peak = no_peak_reason(m.backend.name)
        if no_peak and not any(no_peak in note for note in m.result.notes):
            m.note(f"{m.backend.name}: {no_peak}")
        syncs = sum(work.syncs_by_site.values())
        m.record(flops_per_step=work.flops, ops_per_step=sum(work.ops.values()) / n, syncs_per_step=syncs / n,
                 peak_precision=precision, peak_tflops=peak_tflops)
        self.attribute(ops=per_step(work.ops, n), flops=per_step(work.flops_by_op, 1),
                       syncs=per_step(work.syncs_by_site, n))
        if work.ops_by_site is not None:
            self.attribute(ops_by_site=per_step(work.ops_by_site, n))

    def calls(self) -> None:
        """aten calls and device kernels of a step (the first of the profiled steps), from PyTorch's profiler, and
        with attribution on, each op's self time over ``profiled_steps`` steps.

        Unlike the dispatch-mode op count, the profiler sees what compiled code really
        runs (a compiled region appears as its few extern calls and kernels), so this is
        the count that fusion and ``torch.compile`` cut.
        """
        m = self._measured
        if not m.settings.work:
            return
        profiled = self.work.profile(m.settings.profiled_steps if m.settings.attribution else 1)
        if profiled is None:
            m.note("aten call count skipped: a profiler is already running")
            return
        m.record(aten_calls_per_step=sum(n for op, n in profiled["calls"].items() if op.startswith("aten::")))
        if m.backend.counts_kernels:
            m.record(kernels_per_step=sum(profiled["kernel_calls"].values()))
        if m.settings.attribution:
            self.attribute(time=profiled)

    def reuse(self, earlier: Result) -> None:
        """Take the memory and work figures of an earlier measurement of the same setup instead of re-running them."""
        m = self._measured
        m.record(**{name: getattr(earlier, name) for name in self.PASS_FIELDS})
        m.note("memory and work figures from this setup's earlier measurement in the session")
        for note in earlier.notes:
            if note.startswith(VARYING_SHAPES_NOTE):
                m.note(note)
