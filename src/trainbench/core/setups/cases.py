"""The suite: which recipe runs on which workload, and the ladder rungs.

One source of truth for the pytest benchmarks (``benchmarks/test_*.py``) and any other
runner: adding a recipe name here adds its case everywhere. A case id is
``<workload>-<recipe>``, the key of its budgets in ``benchmarks/budgets.toml``.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainbench.core.setups.ladders import LADDERS
from trainbench.core.records.outcome import case_id
from trainbench.core.setups.recipes import RECIPES, Recipe, get_recipe
from trainbench.core.setups.workloads import WORKLOADS, Profile
from trainbench.devices.device import DeviceCaps

SUITE: dict[str, tuple[str, ...]] = {
    # The seeds' model: every optimization that applies to a CNN on images.
    "resnet18": (
        "baseline",
        # data path
        "multiprocess_loading", "pinned_memory", "uint8_transfer", "channels_last_input", "device_tensors",
        # precision
        "amp_bf16", "amp_fp16", "amp_fp16_no_scaler",
        # batch and memory
        "larger_batch", "checkpointing", "set_to_none", "param_grad_none", "loss_detach",
        "eval_no_grad", "eval_inference_mode", "empty_cache",
        # compute
        "compile", "cudnn_benchmark", "channels_last", "channels_last_amp", "conv_bias_free",
        "optimizer_foreach", "optimizer_fused", "anomaly_detection", "profiler_left_on", "emit_nvtx",
        "deterministic", "loss_item_every_n",
        # scale
        "ddp", "fsdp",
    ),
    # A user's CNN with a bias before each BatchNorm: what removing it saves (ResNet-18 has none to remove).
    "convnet": ("baseline", "no_conv_bias"),
    # A second model family; also where accumulation can promise exact gradients (LayerNorm, no BatchNorm).
    "transformer": (
        "baseline", "amp_bf16", "amp_fp16", "larger_batch", "grad_accumulation", "checkpointing", "set_to_none",
        "optimizer_foreach", "eval_inference_mode", "ddp_gloo", "fsdp_gloo",
    ),
    # The seeds' pointwise-fusion example (a hand-written GELU) inside a model.
    "gelu_mlp": ("baseline", "fuse_pointwise_script", "fuse_pointwise_compile"),
    # What platform teams train now: a decoder LM (AdamW, causal SDPA) and a Vision Transformer.
    "gpt": (
        "baseline", "amp_bf16", "compile", "optimizer_foreach", "optimizer_fused", "checkpointing",
        "grad_accumulation", "larger_batch", "sdpa_flash", "sdpa_efficient",
    ),
    "vit": ("baseline", "amp_bf16", "checkpointing", "larger_batch"),
}


@dataclass(frozen=True)
class Case:
    workload: str
    recipe_name: str
    ladder: str | None = None
    rung: int | None = None

    @property
    def id(self) -> str:
        return case_id(self.workload, self.recipe_name)

    def recipe(self, caps: DeviceCaps | None = None, profile: Profile | None = None) -> Recipe:
        """The recipe to measure; a ladder rung leaves out the steps the device cannot run (none without caps)."""
        if self.ladder is not None:
            return LADDERS[self.ladder].rung_recipe(self.rung, caps, profile)
        return get_recipe(self.recipe_name)

    def own_recipe(self) -> Recipe:
        """What decides the case's markers: a rung needs what its own step needs, not what earlier steps need."""
        if self.ladder is not None:
            ladder = LADDERS[self.ladder]
            step = ladder.steps[self.rung].recipe
            return Recipe(ladder.rung_name(self.rung), step.description, step.changes, step.requires,
                          slow=step.slow)
        return get_recipe(self.recipe_name)


def recipe_cases() -> list[Case]:
    return [Case(workload, name) for workload, names in SUITE.items() for name in names]


def ladder_cases() -> list[Case]:
    return [Case(ladder.workload, ladder.rung_name(i), ladder.name, i)
            for ladder in LADDERS.values() for i in range(len(ladder.steps))]


def known_case_ids() -> set[str]:
    """Every case id knowable without running anything: the suite's and each built-in workload x recipe pair."""
    return {case.id for case in all_cases()} | {case_id(w, r) for w in WORKLOADS for r in RECIPES}


def all_cases() -> list[Case]:
    return recipe_cases() + ladder_cases()
