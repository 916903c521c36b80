"""Correctness guard: an optimization must not change what is trained beyond its tolerance.

The guard trains the recipe and its baseline from the same seeded weights on the same
seeded batches for a few steps and compares the loss at every step. A recipe declares
its tolerance (``Recipe.loss_rtol``): ~0 for pure data-path or bookkeeping changes,
a few percent for reduced precision, and None where the recipe changes what is
trained by design (a larger batch).
"""

from __future__ import annotations

from dataclasses import dataclass

from .device import Backend
from .recipes import TrainConfig
from .step import Training
from .workloads import Profile

GUARD_STEPS = 4


@dataclass(frozen=True)
class GuardVerdict:
    ok: bool
    max_rel_diff: float
    losses: list[float]
    baseline_losses: list[float]
    message: str


def loss_trajectory(config: TrainConfig, backend: Backend, profile: Profile, steps: int = GUARD_STEPS) -> list[float]:
    """Losses of the first ``steps`` steps from seeded weights on seeded batches."""
    with Training(config, backend, profile) as training:
        batches = training.batches()
        losses = [training.step(next(batches)) for _ in range(steps)]
        return [float(loss) for loss in losses]  # syncs once per step, after the steps ran


def compare_trajectories(losses: list[float], baseline: list[float], rtol: float) -> GuardVerdict:
    diffs = [abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, baseline, strict=True)]
    worst = max(diffs)
    step = diffs.index(worst)
    ok = worst <= rtol
    message = (
        f"loss vs baseline over {len(diffs)} seeded steps: worst relative difference {worst:.3g} at step {step} "
        f"({losses[step]:.6g} vs {baseline[step]:.6g}), tolerance {rtol:g}"
    )
    return GuardVerdict(ok, worst, losses, baseline, message)
