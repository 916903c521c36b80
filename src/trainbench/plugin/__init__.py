"""pytest plugin: trainbench's options, markers and fixture, and the session that owns its hooks.

Glue only. The options are read once into ``trainbench.plugin.options.Options``; the session object
(``trainbench.plugin.session``) is registered as a plugin, its hooks handing their work to the pieces beside it (the
device and runner, the cases kept, the saved run, signals, the gate, the summary); the fixture is
``trainbench.plugin.fixture``. How a case is measured and judged is the pytest-free core
(``trainbench.core.method.runner``, which asv uses too). Everything here touches trainbench cases only: its markers are
namespaced (``trainbench_*``), and a session that runs no trainbench case imports no torch and stores its
pytest-benchmark runs exactly as without the plugin.
"""

from __future__ import annotations

import sys

import pytest

from trainbench.plugin.fixture import SESSION, _trainbench_unbudgeted, train_bench  # noqa: F401  (the fixtures)
from trainbench.plugin.notices import InconclusiveTimingWarning, NoBudgetWarning  # noqa: F401  (-W error::...)
from trainbench.plugin.options import Options, add_options
from trainbench.plugin.session import TrainbenchSession

MARKERS = {
    "trainbench_gpu": "trainbench_gpu(what=...): a trainbench case that needs a CUDA device; skipped with the reason "
                      "elsewhere",
    "trainbench_min_gpus": "trainbench_min_gpus(n): a trainbench case that needs at least n CUDA devices",
    "trainbench_min_capability": "trainbench_min_capability(major, minor): a trainbench case that needs a CUDA device "
                                 "of at least this compute capability",
    "trainbench_slow": "trainbench_slow: a long trainbench case (e.g. torch.compile on CPU); runs only with "
                       "--trainbench-slow",
}
SESSION_PLUGIN = "trainbench-session"
USER_ENTRIES = pytest.StashKey[tuple]()  # users' knobs and recipes as the session found them


def pytest_addoption(parser):
    add_options(parser)


def _user_entries_now() -> tuple[dict, dict]:
    """Users' knobs and recipes registered so far; none where the recipes are not loaded (no torch for it)."""
    recipes = sys.modules.get("trainbench.core.setups.recipes")
    return recipes.user_entries() if recipes is not None else ({}, {})


def pytest_configure(config):
    config.stash[USER_ENTRIES] = _user_entries_now()  # this session's registrations end with it
    for line in MARKERS.values():
        config.addinivalue_line("markers", line)
    session = config.stash[SESSION] = TrainbenchSession(Options.from_config(config))
    session.start(config)
    config.pluginmanager.register(session, SESSION_PLUGIN)


def pytest_unconfigure(config):
    recipes = sys.modules.get("trainbench.core.setups.recipes")
    if recipes is not None and USER_ENTRIES in config.stash:
        recipes.restore_user_entries(config.stash[USER_ENTRIES])
    session = config.stash.get(SESSION, None)
    if session is not None:
        session.write_last_line(config)
        session.close()
        if config.pluginmanager.get_plugin(SESSION_PLUGIN) is session:
            config.pluginmanager.unregister(session, SESSION_PLUGIN)


def marks_for(recipe) -> list:
    """pytest marks from a recipe's requirements, so GPU-only cases are collected and skipped with a reason."""
    req, marks = recipe.requires, []
    if req.needs_cuda:
        marks.append(pytest.mark.trainbench_gpu(what=f"{recipe.name} ({recipe.description})"))
    if req.min_capability:
        marks.append(pytest.mark.trainbench_min_capability(*req.min_capability))
    if req.min_gpus:
        marks.append(pytest.mark.trainbench_min_gpus(req.min_gpus))
    if recipe.slow:
        marks.append(pytest.mark.trainbench_slow)
    return marks


def recipe_params(*names):
    """``pytest.param`` per recipe, with markers derived from its requirements: ``recipe_params("baseline", "amp_bf16")``
    or ``recipe_params(["baseline", "amp_bf16"])``; none, every built-in recipe and every one of the user's own
    registered by then (``trainbench.recipe``).

    Use with ``@pytest.mark.parametrize("recipe", recipe_params(...))`` so that GPU-only
    recipes are collected everywhere and skipped with a reason on CPU runners.
    """
    from trainbench.core.setups.recipes import RECIPES, USER_RECIPES, get_recipe  # torch: only a test module that asks loads it

    flat = [n for name in names for n in ([name] if isinstance(name, str) else list(name))]
    odd = [repr(n) for n in flat if not isinstance(n, str)]
    if odd:
        raise TypeError(f"recipe_params: {', '.join(odd)}: expected recipe names (str), e.g. recipe_params('baseline')")
    return [pytest.param(name, id=name, marks=marks_for(get_recipe(name))) for name in flat or (*RECIPES, *USER_RECIPES)]


def case_params(cases):
    """``pytest.param`` per ``trainbench.core.setups.cases.Case``, id = the case id (the budgets key)."""
    return [pytest.param(case, id=case.id, marks=marks_for(case.own_recipe())) for case in cases]
