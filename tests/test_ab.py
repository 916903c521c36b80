"""A/B of two environments: the same interpreter on both sides, a planted slowdown in the head."""

import sys

import pytest

from trainbench.ab import ABCase, SideError, run_case, start, verdict
from trainbench.compare import verdict_table

SETTINGS = {"min_warmup_steps": 2, "max_warmup_steps": 6, "steady_window": 2, "rounds": 3, "steps_per_round": 2,
            "memory_steps": 1}
CASE = ABCase("mlp-baseline", "baseline", "builtin:mlp", "cpu", SETTINGS, threads=1)


@pytest.fixture(scope="module")
def sides():
    base, head, hello = start(sys.executable, sys.executable)
    yield base, head, hello
    base.close()
    head.close()


def _by_metric(outcome):
    return {c.metric: c for c in outcome.comparisons}


def test_the_same_environment_on_both_sides_is_unchanged(sides):
    base, head, hello = sides
    assert hello["base"]["python"] == hello["head"]["python"] == sys.executable
    outcome = run_case(base, head, CASE, pairs=8, thresholds={"step_time_ms": 1.0, "samples_per_s": 1.0},
                       loss_rtol=0.0)
    compared = _by_metric(outcome)
    assert len(outcome.pairs) == 8
    # 100%: a margin no load on this machine moves a paired median ratio across.
    assert compared["step_time_ms"].verdict in ("unchanged", "improved")
    deterministic = [c for c in outcome.comparisons if c.metric not in ("step_time_ms", "samples_per_s")]
    assert deterministic and all(c.verdict == "unchanged" for c in deterministic), verdict_table(deterministic)
    assert outcome.guard.ok  # the same seeded losses, exactly
    shape = verdict([outcome], hello, gated=True)
    assert not shape["failed"] and set(shape["ab"]) == {"base", "head"} and shape["pairs"]["mlp-baseline"]


def test_a_slowdown_planted_in_the_head_is_caught_pair_by_pair(sides):
    base, head, hello = sides
    outcome = run_case(base, head, CASE, pairs=8, thresholds={"step_time_ms": 0.5, "samples_per_s": 0.5},
                       head_slowdown=3.0)  # every head step waits 3x its own time: 4x slower
    step = _by_metric(outcome)["step_time_ms"]
    assert step.verdict == "regressed", step.describe()
    assert step.ci[0] > 1.5 and step.p_value < 0.05
    assert verdict([outcome], hello, gated=True)["failed"]


def _wrapper(tmp_path, body: str) -> str:
    """A 'Python' that is a script, as users wrap an environment (LD_LIBRARY_PATH, modules): it ignores the
    arguments it is given and runs ``body``."""
    script = tmp_path / "python-wrapper"
    script.write_text(f"#!/bin/sh\nexec {sys.executable} -c {body!r}\n")
    script.chmod(0o755)
    return str(script)


def test_another_trainbench_on_one_side_is_a_clear_start_up_error(tmp_path):
    other = _wrapper(tmp_path, "import runpy, trainbench; trainbench.__version__ = '9.9'; "
                               "runpy.run_module('trainbench.ab_worker', run_name='__main__')")
    with pytest.raises(SideError, match=r"trainbench differs between the sides: base .* has 0\.1\.0 .*head .* has 9\.9"):
        start(sys.executable, other)


def test_a_side_whose_worker_cannot_start_names_the_side_and_why(tmp_path):
    broken = _wrapper(tmp_path, "raise SystemExit('No module named trainbench')")
    with pytest.raises(SideError, match=r"(?s)head side \(.*python-wrapper\): the worker ended during 'hello'.*"
                                         "No module named trainbench"):
        start(sys.executable, broken)
