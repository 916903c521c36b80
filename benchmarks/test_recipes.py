"""Every optimization of the seed articles as one parametrized case, and the articles' ladders.

The case list is ``trainbench.core.setups.cases`` (shared with other runners); budgets per device
class live in budgets.toml. GPU-only cases are collected everywhere and skipped with
their reason on CPU runners.
"""

import pytest

from trainbench.core.setups.cases import ladder_cases, recipe_cases
from trainbench.plugin import case_params


@pytest.mark.parametrize("case", case_params(recipe_cases()))
def test_recipe(train_bench, benchmark, case):
    benchmark.group = case.workload
    train_bench.case(case)


@pytest.mark.parametrize("case", case_params(ladder_cases()))
def test_ladder(train_bench, benchmark, case):
    """Cumulative rungs: rung i applies the ladder's steps 0..i, measured against rung 0."""
    benchmark.group = case.ladder
    train_bench.case(case)
