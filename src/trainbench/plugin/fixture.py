"""The ``train_bench`` fixture: one case measured through the session (``trainbench.plugin.bench.TrainBench``), and
one warning per test file for its cases that ran with no budget."""

from __future__ import annotations

import functools

import pytest

from trainbench.plugin.notices import UnbudgetedCases
from trainbench.plugin.session import TrainbenchSession

SESSION = pytest.StashKey[TrainbenchSession]()


@pytest.fixture(scope="module")
def _trainbench_unbudgeted(request):
    """One list of unbudgeted cases per test file, warned once at its end."""
    unbudgeted = UnbudgetedCases(request.path)
    yield unbudgeted
    unbudgeted.warn()


@pytest.fixture
def train_bench(request, benchmark, _trainbench_unbudgeted):
    """Measure a recipe on a training spec: ``result = train_bench("amp_bf16", SPEC)``."""
    from trainbench.plugin.bench import TrainBench  # torch and the core: loaded by the first trainbench case

    session = request.config.stash[SESSION]
    line = (request.node.reportinfo()[1] or 0) + 1  # pytest counts lines from 0
    return TrainBench(benchmark, session, session.budgets_of(request.node), request.config,
                      functools.partial(_trainbench_unbudgeted.add, line=line))
