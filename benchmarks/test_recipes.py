"""Each optimization of the seed articles as one parametrized case of ResNet-18 training.

Budgets per device class live in budgets.toml; GPU-only recipes are collected
everywhere and skipped with their reason on CPU runners.
"""

import pytest

from trainbench.plugin import recipe_params

CASES = recipe_params(
    "baseline",
    "amp_bf16",
    "amp_fp16",
    "larger_batch",
    "uint8_transfer",
    "set_to_none",
    "multiprocess_loading",
    "pinned_memory",
    "cudnn_benchmark",
)


@pytest.mark.parametrize("recipe", CASES)
def test_resnet18(train_bench, benchmark, recipe):
    benchmark.group = "resnet18"
    train_bench(recipe, workload="resnet18")


TRANSFORMER_CASES = recipe_params("baseline", "amp_bf16", "larger_batch", "set_to_none", "amp_fp16")


@pytest.mark.parametrize("recipe", TRANSFORMER_CASES)
def test_transformer(train_bench, benchmark, recipe):
    """The same recipes on a second model family: a small transformer encoder on tokens."""
    benchmark.group = "transformer"
    train_bench(recipe, workload="transformer")
