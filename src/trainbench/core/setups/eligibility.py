"""Can this case run here, and if not, why: the one answer every caller asks.

The runner (a case, its baseline, their memory), the pytest session (a test's markers), the
fixture (an A/B run), asv, the ladder report (why a rung is absent from a run), ladders (which
steps a rung applies), doctor and profile traces all call ``why_not``. It checks in one order
and gives the first reason found:

1. the device (a recipe's ``Requirements`` against ``DeviceCaps``): CUDA, compute capability,
   GPU count, a CPU-only stand-in on a GPU, bfloat16;
2. the setup on this device and PyTorch build: a bf16 autocast, torch.distributed (and FSDP2)
   for rank processes;
3. the training spec (``recipes.spec_unmet``): what it lacks for the setup's knobs;
4. the caller's mode (``Context``): a slow case where slow cases were not asked for, an A/B run
   (one worker process per environment), a profile trace taken in this process;
5. memory: the setup's predicted tensor peak against the device's memory (twice in an A/B run:
   both sides' processes hold it), last because it costs a prediction. ``does_not_fit`` answers for
   setups alive together (a case interleaved with its baseline).

What the device lacks comes before what the caller chose, so no reason asks for an option that
would not make the case run. What only the built model tells (``recipes.NotApplicable``) is
found by building it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch.distributed as dist

from trainbench.core.setups.recipes import Recipe, Requirements, TrainConfig, spec_unmet, without_unpredictable
from trainbench.core.setups.spec import TrainingSpec
from trainbench.core.setups.workloads import Profile
from trainbench.devices.device import DeviceCaps

SLOW_HINT = "run with --trainbench-slow"  # how a pytest run lets slow cases in

# A device needs more than the tensor peak: the caching allocator's rounding and fragmentation,
# cuDNN/cuBLAS workspaces, the CUDA context. A case predicted above total / HEADROOM is skipped.
HEADROOM = 1.25


class SuiteCase(Protocol):
    """A ``cases.Case`` as eligibility reads it (cases imports ladders, which asks ``why_not``)."""

    ladder: str | None  # the ladder a rung belongs to; None for a recipe case

    def own_recipe(self) -> Recipe: ...


@dataclass(frozen=True)
class MemoryLimit:
    """The device's memory and the predicted breakdown of a setup on it (``predict.predict_memory``'s answer)."""

    total_bytes: int
    predict: Callable[[TrainConfig, TrainingSpec], dict]


@dataclass(frozen=True)
class Context:
    """What the caller's mode adds to the device's own rules; the defaults are a plain measurement."""

    slow_allowed: bool = True
    slow_hint: str = SLOW_HINT  # what lets slow cases in, for the reason (asv: an environment variable)
    ab: bool = False  # an A/B run: each environment measures the case in one worker process of its own
    traced: bool = False  # a profile trace of the case, taken in this process
    fresh_process: Callable[[TrainConfig], str | None] | None = None  # the live device's Backend.fresh_process_reason
    memory: MemoryLimit | None = None  # None: memory is not checked (no limit known, or not asked)


PLAIN = Context()


def why_not(case: Recipe | SuiteCase, caps: DeviceCaps, profile: Profile, spec: TrainingSpec | None = None,
            config: TrainConfig | None = None, context: Context = PLAIN) -> str | None:
    """Why ``case`` cannot run on a device with ``caps`` (for ``spec``, as ``config``) in ``context``, or None.

    ``case``: a recipe, or a suite case (a ladder rung needs what its own step needs). ``config``:
    the recipe's config with the caller's overrides (default: the recipe's own on ``profile``).
    A recipe without a name (a test's own markers) gives its reasons without a prefix.
    """
    recipe, rung = (case, False) if isinstance(case, Recipe) else (case.own_recipe(), case.ladder is not None)
    reason = _device_lacks(recipe.requires, caps)
    if reason is None:
        config = config or recipe.config(profile)
        reason = _build_lacks(config, caps) or (spec_unmet(spec, config) if spec is not None else None)
    if reason:
        return f"{recipe.name}: {reason}" if recipe.name else reason
    if recipe.slow and not context.slow_allowed:
        return f"slow case: {context.slow_hint}"
    fresh = context.fresh_process(config) if context.fresh_process and (context.ab or context.traced) else None
    if context.ab:
        reason = _not_in_ab_run(recipe, rung, config, fresh)
    if reason is None and context.traced:
        reason = _untraceable(config, fresh)
    if reason is None and context.memory is not None and spec is not None:
        # An A/B run keeps both sides' worker processes alive, each holding the case, on the one device.
        label, copies = (f"{recipe.name} on both A/B sides (a process each)", 2) if context.ab else (recipe.name, 1)
        reason = does_not_fit(label, [config] * copies, caps, spec, context.memory)
    return reason


def _device_lacks(requires: Requirements, caps: DeviceCaps) -> str | None:
    """What a device with ``caps`` lacks for ``requires``, or None."""
    if requires.needs_cuda and not caps.cuda:
        return f"needs a CUDA device; this run uses {caps.kind} ({caps.name})"
    capability = requires.min_capability or (requires.gpu_capability if caps.cuda else None)
    if capability and caps.capability and caps.capability < capability:
        have, need = ".".join(map(str, caps.capability)), ".".join(map(str, capability))
        return f"needs compute capability >= {need}; {caps.name} has {have}"
    if requires.min_gpus and caps.gpu_count < requires.min_gpus:
        if caps.pinned_among >= requires.min_gpus:
            return (f"needs {requires.min_gpus} GPUs; this pytest-xdist worker sees one of the host's "
                    f"{caps.pinned_among}, pinned to it as every worker is to its own: run the multi-GPU cases "
                    "in a run without -n (-n 0 or -p no:xdist)")
        return f"needs {requires.min_gpus} GPUs; {caps.gpu_count} present"
    if requires.cpu_only and caps.cuda:
        variant = f": on GPUs the {requires.gpu_variant} recipe measures the same" if requires.gpu_variant else ""
        return f"runs on the CPU only; this run uses {caps.kind}{variant}"
    if requires.bf16 and caps.bf16 is False:
        return f"needs bfloat16 support; {caps.name} has none"
    return None


def _lacks_fully_shard(caps: DeviceCaps) -> str | None:
    from torch.distributed import fsdp  # only here: importing FSDP takes about half a second

    if not hasattr(fsdp, "fully_shard"):
        return "needs FSDP2 (torch.distributed.fsdp.fully_shard, PyTorch 2.6+); this PyTorch has none"
    return None


# What a knob may need of the device or the PyTorch build (``Knob.build_needs`` names these): why it is missing, or None.
BUILD_NEEDS: dict[str, Callable[[DeviceCaps], str | None]] = {
    "bf16": lambda caps: f"needs bfloat16 support; {caps.name} has none" if caps.bf16 is False else None,
    "torch.distributed": lambda caps: None if dist.is_available() else "this PyTorch build has no torch.distributed",
    "fully_shard": _lacks_fully_shard,
}


def _build_lacks(config: TrainConfig, caps: DeviceCaps) -> str | None:
    """What this device or PyTorch build lacks for the setup's knobs (a recipe need not declare them), or None."""
    for _, needs in config.turned("build_needs"):
        for need in needs:
            reason = BUILD_NEEDS[need](caps)
            if reason:
                return reason
    return None


def _not_in_ab_run(recipe: Recipe, rung: bool, config: TrainConfig, fresh: str | None) -> str | None:
    """Why an A/B run cannot compare the case: each environment measures it in one worker process."""
    if rung:
        return "A/B compares recipe cases; a ladder rung is compared through its recipe's own case"
    elsewhere = "its ranks run in other processes" if config.rank_processes else fresh
    return f"{recipe.name}: not in an A/B run: {elsewhere}" if elsewhere else None


def _untraceable(config: TrainConfig, fresh: str | None) -> str | None:
    """Why a profile trace of the case cannot be taken in this process."""
    if config.rank_processes:
        return f"{config.parallel.upper()} ranks run in other processes"
    if fresh:
        return f"the case runs in a fresh process ({fresh})"
    if config.runs_a_profiler:
        return f"the case runs a profiler of its own (debug={config.debug!r})"
    return None


def memory_needed(config: TrainConfig, spec: TrainingSpec, memory: MemoryLimit) -> tuple[int, int] | None:
    """(predicted tensor peak, what the setup needs with the allocator's headroom) in bytes, or None where the
    setup cannot be predicted: the figure the memory gate judges, for callers that report it (doctor).

    Compiled and parallel setups are predicted without compilation and as one process of the
    same batch: close enough to tell that a 24 GiB setup will not fit a 16 GiB GPU.
    """
    predicted = memory.predict(without_unpredictable(config), spec).get("breakdown_bytes")
    if not predicted:
        return None
    return int(predicted["total"]), int(predicted["total"] * HEADROOM)


def does_not_fit(label: str | None, configs: Sequence[TrainConfig], caps: DeviceCaps, spec: TrainingSpec,
                 memory: MemoryLimit) -> str | None:
    """Why ``configs``, alive on the device at the same time, would run out of its memory, from the sum of what
    each needs (``memory_needed``; ``label`` names them in the reason), or None; None too where one cannot be
    predicted."""
    needed = [memory_needed(config, spec, memory) for config in configs]
    if not all(needed) or sum(n[1] for n in needed) <= memory.total_bytes:
        return None
    peaks = [n[0] for n in needed]
    total = sum(peaks)
    parts = " + ".join(f"{peak / 2**30:.1f}" for peak in peaks)
    return (f"{label}: needs ~{total * HEADROOM / 2**30:.1f} GiB (predicted tensor peak{'s' if len(peaks) > 1 else ''} "
            f"{parts} GiB + {HEADROOM - 1:.0%} for the allocator and workspaces); "
            f"{caps.name} has {memory.total_bytes / 2**30:.1f} GiB")
