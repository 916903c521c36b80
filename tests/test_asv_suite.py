"""asv and pytest run the same cases; the asv cache measures, skips with reasons, and feeds every track."""

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
from asv_runner.benchmarks.mark import SkipNotImplemented

from trainbench.result import METRICS

ROOT = Path(__file__).parents[1]


def _asv_module():
    spec = importlib.util.spec_from_file_location("asv_bench", ROOT / "benchmarks" / "asv_bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_asv_and_pytest_enumerate_the_same_cases():
    collected = subprocess.run([sys.executable, "-m", "pytest", "benchmarks", "--collect-only", "-q", "-p", "no:cacheprovider"],
                               cwd=ROOT, capture_output=True, text=True, check=True).stdout
    pytest_ids = re.findall(r"::test_(?:recipe|ladder)\[([^\]]+)\]", collected)
    [asv_ids] = _asv_module().TrainingStep.params
    assert len(pytest_ids) > 50
    assert sorted(asv_ids) == sorted(pytest_ids)


def test_the_asv_cache_measures_selected_cases_and_skips_the_rest_with_a_reason(monkeypatch):
    module = _asv_module()
    bench = module.TrainingStep()
    monkeypatch.setenv("TRAINBENCH_ASV_CASES", "^gelu_mlp-baseline$")
    monkeypatch.setenv("TRAINBENCH_ASV_DEVICE", "cpu")
    cache = bench.setup_cache()
    bench.setup(cache, "gelu_mlp-baseline")
    assert bench.track_samples_per_s(cache, "gelu_mlp-baseline") > 0
    assert bench.track_step_time(cache, "gelu_mlp-baseline") < 1.0  # seconds
    assert bench.track_peak_memory(cache, "gelu_mlp-baseline") > 16 * 2**20  # bytes: 16 MiB of weights at least
    assert bench.track_syncs_per_step(cache, "gelu_mlp-baseline") == 0
    assert bench.track_aten_calls_per_step(cache, "gelu_mlp-baseline") > bench.track_ops_per_step(cache, "gelu_mlp-baseline") / 2
    assert bench.track_memory_growth_per_step(cache, "gelu_mlp-baseline") == 0
    with pytest.raises(SkipNotImplemented, match="does not measure kernels_per_step"):
        bench.track_kernels_per_step(cache, "gelu_mlp-baseline")  # CUDA kernels: n/a on CPU, not a failure
    with pytest.raises(NotImplementedError, match="not selected by TRAINBENCH_ASV_CASES"):
        bench.setup(cache, "resnet18-baseline")
    assert "needs a CUDA device" in cache["resnet18-pinned_memory"]["skip"]
    assert "slow case" in cache["resnet18-compile"]["skip"]


def test_every_track_reports_a_known_metric_with_a_unit():
    bench_class = _asv_module().TrainingStep
    tracks = [getattr(bench_class, name) for name in dir(bench_class) if name.startswith("track_")]
    assert {t.unit for t in tracks} >= {"samples/s", "seconds", "bytes"}
    assert all(t.metric in METRICS for t in tracks)
    # every deterministic signal a budget can gate is tracked across commits too
    deterministic = {name for name, metric in METRICS.items() if metric.deterministic}
    assert deterministic <= {t.metric for t in tracks}
