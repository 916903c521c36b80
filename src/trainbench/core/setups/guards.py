"""Correctness guards: an optimization must not change what is trained beyond its tolerance.

Two checks, both from the same seeded weights on the same seeded samples:

- the **loss guard** trains the recipe and its baseline for a few steps and compares
  the loss at every step (``Recipe.loss_rtol``): ~0 for pure data-path or bookkeeping
  changes, a few percent for reduced precision, None where the recipe changes what is
  trained by design (a larger batch);
- the **gradient guard** compares the gradients of the first step parameter by
  parameter (``Recipe.grad_rtol``), where an optimization promises the same gradients
  by construction: accumulation over micro-batches vs the whole batch, checkpointing
  vs keeping activations. Under a GradScaler they are the gradients of the first step the scaler
  takes: one whose scaled gradients overflow is skipped and taken again at a lower scale, as in training.

A custom step (``TrainingSpec.step``) is guarded on what it trains: the loss it returns, and the
gradients each optimizer steps on, kept as ``ctx.step`` is called (a GAN's discriminator gradients
at its update, then the generator's, computed through the updated discriminator). Not the
parameters' change: Adam's first update is about ``lr * sign(grad)`` whatever the gradient's size,
so an update would hide the gradient errors this guard is there to catch; and the gradients a
step leaves behind mix what each update used with what later backward passes added (the
generator's loss reaches the discriminator's gradients after its update).

Where a config is guarded on both, one setup gives both (``seeded_run``): the first step's
gradients are read before its update, and the steps go on from there.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from trainbench.core.records.outcome import GuardCheck
from trainbench.core.setups.recipes import TrainConfig
from trainbench.core.setups.spec import TrainingSpec
from trainbench.core.setups.training import TrainingSetup, gradient_copy
from trainbench.devices.device import Backend

GUARD_STEPS = 4
# A step GradScaler skips halves its scale (2**16 at first): this many skips reach a scale of 2**-8,
# far below any loss scale fp16 gradients need, so a step still overflowing there never trains.
MAX_SKIPPED_STEPS = 24


def loss_trajectory(config: TrainConfig, spec: TrainingSpec, backend: Backend, steps: int = GUARD_STEPS,
                    micro_batches_are_shards: bool = False, dropout_off: bool = False) -> list[float]:
    """Losses of the first ``steps`` steps from seeded weights on seeded batches (``micro_batches_are_shards``,
    ``dropout_off``: as ``TrainingSetup`` takes them)."""
    with TrainingSetup(config, spec, backend, micro_batches_are_shards=micro_batches_are_shards,
                       dropout_off=dropout_off) as training:
        batches = training.batches()
        losses = [training.step(training.fetch(batches)) for _ in range(steps)]
        return [float(loss) for loss in losses]  # syncs once per step, after the steps ran


@dataclass(frozen=True)
class SeededRun:
    """What the guards take of one setup trained from its seeds."""

    losses: list[float] | None = None  # of its first steps (loss_trajectory)
    gradients: dict[str, torch.Tensor] | None = None  # of its first step (first_step_gradients)


def seeded_run(config: TrainConfig, spec: TrainingSpec, backend: Backend, losses: bool = True, gradients: bool = False,
               steps: int = GUARD_STEPS, micro_batches_are_shards: bool = False, dropout_off: bool = False) -> SeededRun:
    """The losses of the first ``steps`` steps and the first step's gradients, as ``loss_trajectory`` and
    ``first_step_gradients`` give them, from one setup where both are asked for: the first step's gradients are
    read before its update, its loss is the trajectory's first. A first step whose gradients overflowed under a
    GradScaler (the scaler skips it) leaves the gradients to ``first_step_gradients``, which builds it again."""
    shards, off = micro_batches_are_shards, dropout_off
    if not gradients:
        return SeededRun(losses=loss_trajectory(config, spec, backend, steps, shards, off) if losses else None)
    if not losses:
        return SeededRun(gradients=first_step_gradients(config, spec, backend, shards, off))
    with TrainingSetup(config, spec, backend, micro_batches_are_shards=shards, dropout_off=off) as training:
        grads, first = _first_step(training)
        if training.context is None:
            training.optimizer_step()  # the plain step's update, once its gradients are read
        batches = training.batches()
        trajectory = [float(loss) for loss in [first, *(training.step(training.fetch(batches))
                                                        for _ in range(steps - 1))]]
        overflowed = training.scaler is not None and not all(bool(g.isfinite().all()) for g in grads.values())
    return SeededRun(trajectory, first_step_gradients(config, spec, backend, shards, off) if overflowed else grads)


def compare_trajectories(losses: list[float], baseline: list[float], rtol: float) -> GuardCheck:
    diffs = [abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, baseline, strict=True)]
    # A NaN or infinite loss is the worst difference there is (max() would pass over a NaN).
    diffs = [d if math.isfinite(d) else math.inf for d in diffs]
    worst = max(diffs)
    step = diffs.index(worst)
    message = (
        f"loss vs baseline over {len(diffs)} seeded steps: worst relative difference {worst:.3g} at step {step} "
        f"({losses[step]:.6g} vs {baseline[step]:.6g}), tolerance {rtol:g}"
    )
    return GuardCheck(worst <= rtol, "loss", worst, message, losses, baseline)


def first_step_gradients(config: TrainConfig, spec: TrainingSpec, backend: Backend,
                         micro_batches_are_shards: bool = False, dropout_off: bool = False) -> dict[str, torch.Tensor]:
    """Gradients of the first step (before any update), by parameter name, in fp32 on the host; of a custom step,
    those each optimizer stepped on, by ``"optimizer:parameter"`` (``"D#2:..."`` for its second update in the step).

    Under a GradScaler: unscaled, from the first step the scaler would take. A step whose gradients
    hold an inf or NaN (the scaler's found_inf) is one it skips, lowering its scale; the step is built
    again from the same seeds at that scale, up to ``MAX_SKIPPED_STEPS`` times (then its non-finite
    gradients are returned, and fail the comparison)."""
    scale = None
    for _ in range(MAX_SKIPPED_STEPS + 1):
        with TrainingSetup(config, spec, backend, micro_batches_are_shards=micro_batches_are_shards,
                           dropout_off=dropout_off) as training:
            if training.scaler is not None and scale is not None:
                training.scaler = _scaler_at(training.scaler, training.device.type, scale)
            grads, _ = _first_step(training)
            if training.scaler is None or all(bool(g.isfinite().all()) for g in grads.values()):
                return grads
            scale = training.scaler.get_scale() * training.scaler.get_backoff_factor()
    return grads


def _first_step(training: TrainingSetup) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The first step's gradients and its loss: a custom step taken whole (its gradients those each ``ctx.step``
    stepped on), a plain one up to its update (not applied)."""
    if training.context is not None:
        training.updates.stepped_gradients = {}
        loss = training.step(training.fetch(training.batches()))
        grads, training.updates.stepped_gradients = training.updates.stepped_gradients, None
        return grads, loss
    loss = training.forward_backward(training.fetch(training.batches()))
    if training.scaler is not None:
        for optimizer in training.optimizers.values():
            training.scaler.unscale_(optimizer)
    # copies: on the host .float().cpu() is the live gradient itself, which training on (seeded_run) would change
    grads = {name: gradient_copy(p.grad) for name, p in training.model.named_parameters() if p.grad is not None}
    return grads, loss.detach()


def _scaler_at(scaler: torch.amp.GradScaler, device_type: str, scale: float) -> torch.amp.GradScaler:
    """A GradScaler like ``scaler`` that starts at ``scale``: where it would stand after skipping a step."""
    return torch.amp.GradScaler(device_type, init_scale=scale, growth_factor=scaler.get_growth_factor(),
                                backoff_factor=scaler.get_backoff_factor(), growth_interval=scaler.get_growth_interval())


def with_likely_cause(verdict: GuardCheck, config: TrainConfig, spec: TrainingSpec) -> GuardCheck:
    """A failed gradient guard's message with what the setup tells of its likely cause (accumulation: an item-weighted
    mean averaged as a sample mean; a BatchNorm's per-micro-batch statistics never get here: ``TrainingSetup`` skips
    such a case)."""
    causes = [cause for _, cause in config.turned("gradient_guard_cause")]
    if verdict.ok or verdict.kind != "gradients" or not causes or spec.items is not None:  # items: weighted already
        return verdict
    return dataclasses.replace(verdict, message=f"{verdict.message}; likely cause: {'; '.join(causes)}")


def compare_gradients(grads: dict[str, torch.Tensor], baseline: dict[str, torch.Tensor], rtol: float,
                      measure: str = "parameter") -> GuardCheck:
    """``measure`` (``recipes.GRADIENT_MEASURES``) of ``grads`` against ``baseline`` within ``rtol``: the worst
    parameter's relative error ||g - g_base|| / ||g_base||, or the step's direction; a missing gradient fails."""
    missing = sorted(set(baseline) - set(grads))
    extra = sorted(set(grads) - set(baseline))
    if missing or extra:
        what = "; ".join(x for x in (f"no gradient for {', '.join(missing[:3])}" if missing else "",
                                     f"unexpected gradient for {', '.join(extra[:3])}" if extra else "") if x)
        return GuardCheck(False, "gradients", float("inf"), f"gradients vs baseline: {what}")
    if measure == "direction":
        return _compare_directions(grads, baseline, rtol)
    worst, worst_name = 0.0, ""
    for name, base in baseline.items():
        err = float(torch.linalg.vector_norm(grads[name] - base) / torch.linalg.vector_norm(base).clamp_min(1e-30))
        if not math.isfinite(err):
            err = math.inf  # a NaN gradient (fp16 overflow, a broken kernel) fails; err > worst would skip it
        if err > worst:
            worst, worst_name = err, name
    message = (f"first-step gradients vs baseline over {len(baseline)} parameters: worst relative error {worst:.3g} "
               f"({worst_name or 'all equal'}), tolerance {rtol:g}")
    return GuardCheck(worst <= rtol, "gradients", worst, message)


def _compare_directions(grads: dict[str, torch.Tensor], baseline: dict[str, torch.Tensor], rtol: float) -> GuardCheck:
    """1 - cos(g, g_base) over every gradient as one vector: how far the step turns (gradients that all underflowed
    to zero turn it by 1)."""
    g = torch.cat([grads[name].flatten().double() for name in baseline])
    base = torch.cat([b.flatten().double() for b in baseline.values()])
    norms = float(torch.linalg.vector_norm(g) * torch.linalg.vector_norm(base))
    if not (math.isfinite(norms) and bool(g.isfinite().all())):
        turned = math.inf  # an inf or NaN gradient (fp16 overflow, a broken kernel) fails
    else:
        turned = 1.0 - (float(g @ base) / norms if norms > 0 else 0.0)
    message = (f"first-step gradients vs baseline over {len(baseline)} parameters as one vector: 1 - cosine {turned:.3g} "
               f"(norm ratio {float(torch.linalg.vector_norm(g)) / max(float(torch.linalg.vector_norm(base)), 1e-30):.3g}), "
               f"tolerance {rtol:g}")
    return GuardCheck(turned <= rtol, "gradients", turned, message)
