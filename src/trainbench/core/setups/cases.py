"""The suite: which recipe runs on which workload, and the ladder rungs.

One source of truth for the pytest benchmarks (``benchmarks/test_*.py``) and any other
runner: a recipe's ``suite`` entry (``recipes.RECIPES``) names the workloads it runs on, and naming one there adds
its case everywhere. A case id is
``<workload>-<recipe>``, the key of its budgets in ``benchmarks/budgets.toml``.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainbench.core.setups.ladders import LADDERS
from trainbench.core.records.outcome import case_id
from trainbench.core.setups.recipes import RECIPES, Recipe, get_recipe
from trainbench.core.setups.workloads import WORKLOADS, Profile
from trainbench.devices.device import DeviceCaps

def _suite() -> dict[str, tuple[str, ...]]:
    """Each built-in workload's recipes, in the recipe table's order: read from each recipe's ``suite`` entry."""
    unknown = {(r.name, w) for r in RECIPES.values() for w in r.suite if w not in WORKLOADS}
    if unknown:
        raise ValueError(f"recipes name workloads that are not built in: {sorted(unknown)}; known: {list(WORKLOADS)}")
    suite = {w: tuple(name for name, r in RECIPES.items() if w in r.suite) for w in WORKLOADS}
    return {w: names for w, names in suite.items() if names}


SUITE: dict[str, tuple[str, ...]] = _suite()


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
