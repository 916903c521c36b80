"""How a setup is measured: the method's settings per profile (``MeasureSettings``)."""

from __future__ import annotations

from dataclasses import dataclass, replace


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


def with_overrides(settings: MeasureSettings, **changes) -> MeasureSettings:
    return replace(settings, **{k: v for k, v in changes.items() if v is not None})
