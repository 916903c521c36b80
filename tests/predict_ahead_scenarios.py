"""Predictions made ahead in forked processes (trainbench.core.method.predict_ahead), run by tests/test_predict_ahead.py in a
fresh process of their own: autograd refuses to run in a process forked after its parent ran a backward, so only a
process that has run none can fork predicting children. In file order: the forking tests first, then the one that
runs steps here too."""

import json
import os
import time

import pytest
import torch

from trainbench.core.method import predict_ahead as ahead
from trainbench.core.setups.cases import Case
from trainbench.core.method.measure import MeasureSettings
from trainbench.core.analyses.predict import PredictionCache, memory_setup, predict_memory
from trainbench.core.setups.recipes import get_recipe
from trainbench.core.method.runner import Runner
from trainbench.core.setups.workloads import PROFILES, resolve_spec
from trainbench.devices.device import CpuBackend

CPU, PROFILE = CpuBackend(torch.device("cpu")), PROFILES["cpu"]


def _setups():
    mlp = resolve_spec("mlp", PROFILE)
    return [("cpu", get_recipe(name).config(PROFILE), mlp) for name in ("baseline", "set_to_none", "amp_bf16")] + [
        ("gpu", get_recipe("baseline").config(PROFILES["gpu"]), resolve_spec("mlp", PROFILES["gpu"]))]


def _first_child_meets(fault, tmp_path, monkeypatch):
    """The first child to take a setup leaves a mark, then meets ``fault``; the others predict only once the mark is
    there, so that child has surely taken exactly one setup."""
    mark, predict = tmp_path / "taken", ahead._predict

    def planted(cache, setup):
        try:
            os.close(os.open(mark, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            deadline = time.monotonic() + 60
            while not mark.exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            return predict(cache, setup)
        fault()

    monkeypatch.setattr(ahead, "_predict", planted)


@pytest.mark.parametrize("fault", [lambda: os._exit(3), lambda: time.sleep(3600)], ids=["dies", "stalls"])
def test_a_child_that_dies_or_stalls_loses_only_its_setup(fault, tmp_path, monkeypatch):
    _first_child_meets(fault, tmp_path, monkeypatch)
    cache, setups = PredictionCache(CPU), _setups()
    started = time.monotonic()
    # A child silent for 5 s is given up (killed), while the other goes on, however slowly it predicts.
    done = ahead.predict_ahead(cache, setups, processes=2, no_progress_s=5.0)
    assert time.monotonic() - started < 60  # a stalled child is killed, not waited for
    assert (done.setups, done.processes, done.left, done.refused) == (3, 2, 1, None)
    assert done.line().endswith("by 2 processes; 1 left to their cases (a process ended early)")
    assert sum(cache.known(cache.key(*setup)) is None for setup in setups) == 1  # left for its case to predict


def test_what_is_made_ahead_is_what_the_cases_ask_for_and_would_predict_and_is_kept(tmp_path, monkeypatch):
    kept = tmp_path / "predictions.json"
    quick = MeasureSettings(min_warmup_steps=1, max_warmup_steps=2, steady_window=1, rounds=2, steps_per_round=1,
                            memory_steps=1, attribution=False)
    runner = Runner(CPU, PROFILE, quick, predict=True, predictions=PredictionCache(CPU, kept))
    cases = [Case("mlp", "baseline"), Case("mlp", "set_to_none"), Case("mlp", "multiprocess_loading")]
    done = runner.predict_ahead(cases * 2, processes=2)  # each asked twice: made once
    # mlp as baseline and set_to_none at each profile (multiprocess_loading holds the baseline's tensors)
    assert (done.setups, done.processes, done.left) == (4, 2, 0), done
    assert done.line().startswith("memory predictions: 4 setups made before the first case in ")
    made = dict(runner.executor.predictions._predictions)
    assert len(json.loads(kept.read_text())) == 4  # written once, for the next session
    assert runner.predict_ahead(cases, processes=2) is None  # nothing left to make
    # From here on this process runs steps (and can fork no predicting child).
    asked, call = [], PredictionCache.__call__
    monkeypatch.setattr(PredictionCache, "__call__",
                        lambda self, *setup: asked.append(self.key(*setup)) or call(self, *setup))
    monkeypatch.setattr("trainbench.core.analyses.predict.predict_memory", lambda *a, **k: pytest.fail("predicted again"))
    for case in cases:
        assert "breakdown_bytes" in runner.run_case(case).result.predicted_memory, case
    assert set(asked) == set(made)  # no setup made that no case asks for
    monkeypatch.undo()
    for (profile_name, spec_name, _, setup), prediction in made.items():
        spec = resolve_spec(spec_name, PROFILES[profile_name])
        assert prediction == predict_memory(setup, spec, CPU) and "breakdown_bytes" in prediction
    fresh = PredictionCache(CPU, kept)  # a new session finds them in the file
    assert all(fresh.known(key) == prediction for key, prediction in made.items())


def test_children_that_cannot_run_autograd_predict_nothing_and_the_pass_says_why(monkeypatch):
    # What a child finds in a process forked after its parent's autograd started threads (torch's own words).
    why = "a forked process cannot run autograd after this one ran a backward (Unable to handle autograd's threading)"
    monkeypatch.setattr(ahead, "autograd_refused", lambda: why)
    cache = PredictionCache(CPU)
    refused = ahead.predict_ahead(cache, _setups(), processes=2, no_progress_s=60)
    assert (refused.setups, refused.processes, refused.left, refused.refused) == (0, 0, 4, why)
    assert refused.line() == f"memory predictions: made by each case, none ahead: {why}"
    assert all(cache.known(cache.key(*setup)) is None for setup in _setups())  # nothing claimed made
