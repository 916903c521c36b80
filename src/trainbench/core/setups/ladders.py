"""The seeds' cumulative optimization ladders, with the figures the articles printed.

A ladder is a list of steps; rung *i* applies steps 0..i together (``compose``). On a
device that cannot run a step (pinned memory without a GPU) that rung is skipped and
later rungs go on without it, so the ladder still climbs and the report says which
step was left out. Batch sizes follow the profile: on the CPU profile the seeds'
32 / 128 (ladder000) and 32 / 512 / 1024 (ladder003) become 16 / 64 and 16 / 32 / 64
(the steps up keep their direction and the last doubling; a step stays well under a
second on two cores).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from trainbench.core.setups.eligibility import why_not
from trainbench.core.setups.recipes import RECIPES, ByProfile, Recipe, compose
from trainbench.core.setups.workloads import Profile
from trainbench.devices.device import DeviceCaps


@dataclass(frozen=True)
class ArticleFigure:
    """What the article printed for a rung (None where it printed nothing)."""

    samples_per_s: float | None = None
    step_time_ms: float | None = None
    memory_gb: float | None = None
    batch_size: int | None = None
    note: str = ""


@dataclass(frozen=True)
class LadderStep:
    label: str
    recipe: Recipe
    article: ArticleFigure


@dataclass(frozen=True)
class Ladder:
    name: str  # case-id friendly, e.g. "ladder003"
    title: str
    source: str  # the seed article and its hardware
    workload: str
    steps: tuple[LadderStep, ...]
    article_summary: str

    def rung_name(self, index: int) -> str:
        return f"{self.name}-{index}_{self.steps[index].recipe.name}"

    def split_rung(self, index: int, caps: DeviceCaps | None = None, profile: Profile | None = None
                   ) -> tuple[list[LadderStep], list[LadderStep]]:
        """Steps 0..index as (applied, left out): those a device with ``caps`` cannot run are left out (none without caps)."""
        applied, left_out = [], []
        for step in self.steps[: index + 1]:
            runnable = caps is None or why_not(step.recipe, caps, profile) is None
            (applied if runnable else left_out).append(step)
        return applied, left_out

    def rung_recipe(self, index: int, caps: DeviceCaps | None = None, profile: Profile | None = None) -> Recipe:
        """Steps 0..index composed, leaving out those the device cannot run."""
        applied, left_out = self.split_rung(index, caps, profile)
        description = " + ".join(s.label for s in applied)
        if left_out:
            description += " (left out on this device: " + ", ".join(s.label for s in left_out) + ")"
        return compose(self.rung_name(index), *(s.recipe for s in applied), description=description,
                       baseline=self.rung_name(0))

    def rung_info(self, index: int, caps: DeviceCaps | None = None, profile: Profile | None = None) -> dict:
        """What a measured rung records about its ladder (the report reads it back)."""
        applied, left_out = self.split_rung(index, caps, profile)
        step = self.steps[index]
        return {"name": self.name, "title": self.title, "source": self.source, "rung": index, "label": step.label,
                "applied": " + ".join(s.label for s in applied), "left_out": [s.label for s in left_out],
                "article": dataclasses.asdict(step.article), "article_summary": self.article_summary,
                "rungs": [s.label for s in self.steps]}


def _step(name: str, label: str, changes: dict | None = None, article: ArticleFigure = ArticleFigure()) -> LadderStep:
    """A ladder step: a recipe from RECIPES, or a ladder-only variant of one with other knob values."""
    base = RECIPES[name]
    if changes is None:
        return LadderStep(label, base, article)
    recipe = Recipe(f"{name}", base.description, {**base.changes, **changes}, base.requires,
                    extra_warmup_steps=base.extra_warmup_steps, slow=base.slow, loss_rtol=base.loss_rtol)
    return LadderStep(label, recipe, article)


# Both articles run AMP as fp16 autocast without a GradScaler; CPUs get bf16 (no fast fp16 kernels).
_ARTICLE_AMP = {"amp": ByProfile(cpu="bf16", gpu="fp16"), "grad_scaler": False}

LADDERS: dict[str, Ladder] = {
    ladder.name: ladder
    for ladder in [
        Ladder(
            name="ladder003",
            title="PyTorch Model Performance Analysis and Optimization (TensorBoard profiler walk-through)",
            source="seed 003: Tesla V100-SXM2-16GB (p3.2xlarge), PyTorch 2.0, ResNet-18 on FakeCIFAR at 224 px",
            workload="resnet18",
            steps=(
                _step("baseline", "baseline", article=ArticleFigure(400.0, 80.0, batch_size=32,
                                                                     note="80 ms/step at batch 32")),
                _step("multiprocess_loading", "multi-process loading",
                      article=ArticleFigure(865.0, 37.0, batch_size=32, note="37 ms/step, 8 workers")),
                _step("pinned_memory", "pinned memory",
                      article=ArticleFigure(1200.0, 46.0, batch_size=32,
                                            note="printed as 1200 samples/s and 46 ms at batch 32")),
                _step("larger_batch", "batch 512", {"batch_multiplier": ByProfile(cpu=2, gpu=16)},
                      article=ArticleFigure(1584.0, 324.0, batch_size=512, memory_gb=11.3)),
                _step("uint8_transfer", "uint8 copy at batch 1024", {"batch_multiplier": ByProfile(cpu=4, gpu=32)},
                      article=ArticleFigure(1670.0, batch_size=1024)),
                _step("set_to_none", "set_to_none", article=ArticleFigure(
                    None, batch_size=1024, note="no meaningful change")),
                LadderStep("AMP", Recipe("amp", "autocast without a GradScaler, as the article runs it", _ARTICLE_AMP,
                                         loss_rtol=0.03), ArticleFigure(2477.0, batch_size=1024)),
                _step("compile", "torch.compile", article=ArticleFigure(3268.0, batch_size=1024)),
            ),
            article_summary="400 -> 3268 samples/s (80 ms/step at batch 32 to 3268 samples/s at 1024): +717%, "
                            "which the article reports as 'increased performance by 817%'",
        ),
        Ladder(
            name="ladder000",
            title="PyTorch Training Optimizations using Memory Analysis",
            source="seed 000: the article's GPU (not named), ResNet-18 on FakeCIFAR at 224 px",
            workload="resnet18",
            steps=(
                _step("baseline", "Base_Model", article=ArticleFigure(273.5, 117.1, 2.51, 32)),
                LadderStep("Automatic Mixed Precision",
                           Recipe("amp", "autocast without a GradScaler, as the article runs it", _ARTICLE_AMP,
                                  loss_rtol=0.03),
                           ArticleFigure(395.1, 81.1, 1.32, 32)),
                _step("larger_batch", "Increase Batch Size", {"batch_multiplier": 4},
                      article=ArticleFigure(551.5, 232.1, 4.95, 128)),
                _step("uint8_transfer", "Reduce H2D Copy", article=ArticleFigure(631.63, 202.6, 4.95, 128)),
                _step("multiprocess_loading", "Multi-process Data Loading",
                      article=ArticleFigure(877.84, 145.8, 4.95, 128)),
                _step("pinned_memory", "Memory Pinning", article=ArticleFigure(1381.6, 92.6, 4.95, 128)),
            ),
            article_summary="273.5 -> 1381.6 samples/s: 505% of the baseline (+405%)",
        ),
    ]
}


def get_ladder(name: str) -> Ladder:
    try:
        return LADDERS[name]
    except KeyError:
        raise KeyError(f"unknown ladder {name!r}: expected one of {sorted(LADDERS)}") from None
