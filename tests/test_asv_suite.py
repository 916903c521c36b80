"""asv and pytest run the same cases; the asv cache measures, skips with reasons, and feeds every track."""

import importlib.util
import re
import sys
from pathlib import Path

import pytest
from asv_runner.benchmarks._base import get_setup_cache_key
from asv_runner.benchmarks.mark import SkipNotImplemented

from trainbench.core.records.metrics import METRICS, deterministic_metrics, is_timed

ROOT = Path(__file__).parents[1]


def _asv_module():
    spec = importlib.util.spec_from_file_location("asv_bench", ROOT / "benchmarks" / "asv_bench.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["asv_bench"] = module  # as asv imports it (inspect looks modules up there)
    spec.loader.exec_module(module)
    return module


ASV_CLASSES = ("Speed", "Memory", "Work")


def test_asv_and_pytest_enumerate_the_same_cases(pytester, monkeypatch):
    # pytest's collection of the suite as `pytest benchmarks` in the project makes it, in this process (a fresh
    # interpreter importing torch was most of this test's time; pytester puts sys.modules back afterwards)
    monkeypatch.chdir(ROOT)
    result = pytester.runpytest_inprocess("benchmarks", "--collect-only", "-q", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    collected = result.stdout.str()
    pytest_ids = re.findall(r"::test_(?:recipe|ladder)\[([^\]]+)\]", collected)
    assert len(pytest_ids) > 50
    module = _asv_module()
    for name in ASV_CLASSES:
        [asv_ids] = getattr(module, name).params
        assert sorted(asv_ids) == sorted(pytest_ids), name


def test_the_asv_classes_share_one_measurement():
    # asv keys setup_cache by the function; one key means the suite is measured once per environment
    module = _asv_module()
    keys = {get_setup_cache_key(getattr(module, name).setup_cache) for name in ASV_CLASSES}
    assert len(keys) == 1 and None not in keys


def test_the_asv_cache_measures_selected_cases_and_skips_the_rest_with_a_reason(monkeypatch):
    from trainbench.core.method.measure import DEFAULT_SETTINGS, MeasureSettings

    # the cache measures as the suite does, in the fewest steps that take every pass (the tracks read what was
    # measured, not how long: the CPU profile's warm-up and ten rounds of gelu_mlp's ~0.2 s step, twice for the
    # burn-in, were most of this test's time)
    monkeypatch.setitem(DEFAULT_SETTINGS, "cpu", MeasureSettings(min_warmup_steps=1, max_warmup_steps=2, steady_window=1,
                                                                 rounds=2, steps_per_round=1, memory_steps=1))
    module = _asv_module()
    speed, memory, work = module.Speed(), module.Memory(), module.Work()
    monkeypatch.setenv("TRAINBENCH_ASV_CASES", "^gelu_mlp-baseline$")
    monkeypatch.setenv("TRAINBENCH_ASV_DEVICE", "cpu")
    case = "gelu_mlp-baseline"
    cache = speed.setup_cache()
    for bench in (speed, memory, work):
        bench.setup(cache, case)
    assert speed.track_samples_per_s(cache, case) > 0
    assert speed.track_step_time(cache, case) < 1.0  # seconds
    assert memory.track_peak_memory(cache, case) > 16 * 2**20  # bytes: 16 MiB of weights at least
    assert memory.track_memory_growth_per_step(cache, case) == 0
    assert work.track_syncs_per_step(cache, case) == 0
    assert work.track_aten_calls_per_step(cache, case) > work.track_ops_per_step(cache, case) / 2
    with pytest.raises(SkipNotImplemented, match="does not measure kernels_per_step"):
        work.track_kernels_per_step(cache, case)  # CUDA kernels: n/a on CPU, not a failure
    with pytest.raises(NotImplementedError, match="not selected by TRAINBENCH_ASV_CASES"):
        speed.setup(cache, "resnet18-baseline")
    assert "needs a CUDA device" in cache["resnet18-pinned_memory"]["skip"]
    assert "slow case" in cache["resnet18-compile"]["skip"]


def test_every_track_reports_a_known_metric_with_a_unit():
    module = _asv_module()
    tracks = {name: [getattr(getattr(module, name), attr) for attr in dir(getattr(module, name)) if attr.startswith("track_")]
              for name in ASV_CLASSES}
    every = [t for group in tracks.values() for t in group]
    assert {t.unit for t in every} >= {"samples/s", "seconds", "bytes"}
    assert all(t.metric in METRICS for t in every)
    # every deterministic signal a budget can gate is tracked across commits, and none of them
    # sits with the timing (a CPU runner gates on Memory and Work only)
    assert set(deterministic_metrics()) <= {t.metric for t in tracks["Memory"] + tracks["Work"]}
    assert all(is_timed(t.metric) for t in tracks["Speed"])
    assert not any(is_timed(t.metric) for t in tracks["Memory"] + tracks["Work"])


def test_a_case_that_failed_without_a_result_fails_its_tracks_with_the_reason():
    module = _asv_module()
    cache = {"mlp-baseline": {"error": "mlp-baseline: out of memory at batch 16: planted"}}
    with pytest.raises(RuntimeError, match="out of memory at batch 16"):
        module.Memory().setup(cache, "mlp-baseline")


def test_the_asv_cache_timeout_comes_from_the_environment(monkeypatch):
    from trainbench.core.method.asv_suite import DEFAULT_TIMEOUT_S, TIMEOUT_ENV, cache_timeout_s

    monkeypatch.delenv(TIMEOUT_ENV, raising=False)
    assert cache_timeout_s() == DEFAULT_TIMEOUT_S == 7200
    monkeypatch.setenv(TIMEOUT_ENV, "7200")
    assert cache_timeout_s() == 7200
    assert _asv_module().Speed.setup_cache.timeout == 7200  # what asv reads when it spawns the measurement
    for bad in ("0", "abc", "nan", "inf"):  # "abc" was float()'s own error
        monkeypatch.setenv(TIMEOUT_ENV, bad)
        with pytest.raises(ValueError, match=rf"^TRAINBENCH_ASV_TIMEOUT='{bad}': the asv cache timeout must be a "
                                             "positive number of seconds \\(unset: 7200\\)$") as raised:
            cache_timeout_s()
        assert raised.value.__context__ is None or raised.value.__suppress_context__
