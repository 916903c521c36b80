"""Memory predictions made before the first case on every core (trainbench.core.method.predict_ahead): the same predictions
a case makes, kept where the case finds them; a forked process that dies or stalls costs only its own setups, which
their cases then predict; no fork where it is unsafe; and a suite session that says what it made ahead.

The forking scenarios run in a fresh process (tests/predict_ahead_scenarios.py): this one has run backward passes."""

import multiprocessing
from pathlib import Path

import pytest
import torch

from trainbench.core.method import predict_ahead as ahead
from trainbench.core.analyses.predict import PredictionCache, SharedPredictions

forks = pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(),
                           reason="the predictions are made ahead only where processes fork")


SUITE_SESSION = """
import pytest
from trainbench.core.setups.cases import Case
from trainbench.plugin import case_params

@pytest.mark.parametrize("case", case_params([Case("mlp", "baseline"), Case("mlp", "set_to_none")]))
def test_case(train_bench, case):
    train_bench.case(case)
"""


@forks
def test_forked_predictions_and_a_suite_session_that_predicts_ahead_in_a_fresh_process(pytester, quick_options,
                                                                                       monkeypatch):
    """One fresh process for both (a process start is most of either's cost): the session predicts its suite cases
    ahead before any test runs, then the scenarios fork theirs, and the suite cases, which run backward passes,
    come last (files in name order)."""
    monkeypatch.setenv("TRAINBENCH_PREDICT_MEMORY", "1")
    pytester.makepyfile(test_scenarios=(Path(__file__).parent / "predict_ahead_scenarios.py").read_text(),
                        test_suite=SUITE_SESSION)
    result = pytester.runpytest_subprocess(*quick_options, "-p", "no:randomly")
    result.assert_outcomes(passed=6)
    result.stdout.fnmatch_lines(["memory predictions: 4 setups made before the first case in * s by 2 processes"])


def test_no_fork_where_it_is_unsafe(cpu, monkeypatch):
    cache = PredictionCache(cpu)
    assert ahead.why_not_forked(cache, 1) == "one core"

    from trainbench.devices.device import CudaBackend

    on_cuda = CudaBackend.__new__(CudaBackend)  # not initialized: no CUDA needed to ask it this
    on_cuda.device = torch.device("cuda", 0)
    assert ahead.why_not_forked(PredictionCache(on_cuda), 2).startswith("fake tensors on cuda:0: a forked process")
    monkeypatch.setattr(ahead, "other_threads", lambda: 2)
    assert ahead.why_not_forked(cache, 2).startswith("2 other threads running")
    monkeypatch.setattr(ahead, "other_threads", lambda: 0)
    if "fork" in multiprocessing.get_all_start_methods():
        assert ahead.why_not_forked(cache, 2) is None


def test_a_shared_file_takes_many_predictions_in_one_write(cpu, tmp_path, monkeypatch):
    from trainbench.core.analyses import predict

    writes = []
    write = predict.write_text_atomic
    monkeypatch.setattr(predict, "write_text_atomic", lambda *a: writes.append(a[0]) or write(*a))
    shared = SharedPredictions(tmp_path / "p.json", cpu)
    shared.put_many({("cpu", "a", "x", 1): {"reason": "a"}, ("cpu", "b", "x", 1): {"reason": "b"}})
    shared.put(("cpu", "c", "x", 1), {"reason": "c"})
    shared.put_many({("cpu", "c", "x", 1): {"reason": "c"}})  # nothing new: not written again
    assert len(writes) == 2
    again = SharedPredictions(tmp_path / "p.json", cpu)
    assert [again.get(("cpu", n, "x", 1)) for n in "abc"] == [{"reason": n} for n in "abc"]
