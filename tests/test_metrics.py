"""Every metric's kind, the queries over it, the alias table, and reading a timed metric round by round."""

import statistics

import pytest

from trainbench.core.records.budgets import parse_key
from trainbench.core.records.metrics import (
    DETERMINISTIC,
    DEVICE_CHOICE,
    KINDS,
    METRICS,
    TIMED,
    Metric,
    allocator_metrics,
    calibrated_metrics,
    deterministic_metrics,
    device_choice_metrics,
    is_timed,
    metrics_in,
    parse_thresholds,
    per_round,
    resolve,
    rounds_of,
    timed_metrics,
)
from trainbench.core.records.result import CaseRecord, Result, case_record


def test_every_metric_has_one_kind_and_speed_is_exactly_the_timed_ones():
    assert {metric.kind for metric in METRICS.values()} == set(KINDS)
    assert set(metrics_in("speed")) == {name for name in METRICS if is_timed(name)}
    assert set(metrics_in("memory")) | set(metrics_in("work")) == {name for name in METRICS if not is_timed(name)}


@pytest.mark.parametrize(("kind", "group"), [(TIMED, "memory"), (DETERMINISTIC, "speed"), ("noisy", "speed")])
def test_a_metric_whose_kind_and_group_disagree_is_refused(kind, group):
    with pytest.raises(ValueError, match="kind|speed metrics"):
        Metric("", False, kind, "a metric", group=group)


def test_the_queries_partition_the_metrics():
    assert timed_metrics() == ["samples_per_s", "items_per_s", "step_time_ms", "cpu_time_ms", "achieved_tflops", "mfu"]
    assert allocator_metrics() == ["peak_memory_mib", "peak_reserved_mib", "reserved_between_steps_mib"]
    assert len(deterministic_metrics()) == 15 and "tracked_peak_mib" in deterministic_metrics()
    assert not set(deterministic_metrics()) & {name for name in METRICS if is_timed(name)}
    # single-value timings are timed (noise can move them) but not read round by round
    assert is_timed("first_step_s") and "first_step_s" not in timed_metrics()
    # allocator retries are neither timed nor exact nor stable enough to calibrate
    assert not is_timed("alloc_retries") and "alloc_retries" not in calibrated_metrics(gpu=True)


def test_calibration_takes_allocator_peaks_and_kernel_choice_on_a_gpu_only():
    assert calibrated_metrics(gpu=False) == deterministic_metrics()
    assert calibrated_metrics(gpu=True) == deterministic_metrics() + allocator_metrics() + device_choice_metrics()


def test_every_calibrated_metric_takes_its_kinds_margin_from_the_table_and_exact_signals_none():
    # a margin over an exact signal lets a change through: +6.8% parameters passed a 10% one
    assert all(METRICS[name].calibration_margin == 0 for name in deterministic_metrics())
    assert all(METRICS[name].calibration_margin > 0 for name in allocator_metrics() + device_choice_metrics())
    assert all(METRICS[name].calibration_margin is not None for name in calibrated_metrics(gpu=True))
    assert METRICS["samples_per_s"].calibration_margin is None  # never calibrated: a speed-up is, as a ratio
    counts = {name for name, metric in METRICS.items() if metric.count}
    assert counts == {"ops_per_step", "syncs_per_step", "aten_calls_per_step", "kernels_per_step", "alloc_retries"}


def test_kernel_counts_are_the_libraries_choice_not_part_of_the_deterministic_gate():
    # cuDNN autotuning and a driver/cuDNN/cuBLAS update change which kernels run: same code, other count
    assert device_choice_metrics() == ["kernels_per_step"] and METRICS["kernels_per_step"].kind == DEVICE_CHOICE
    assert "kernels_per_step" not in deterministic_metrics() and not is_timed("kernels_per_step")
    assert "kernels_per_step" not in parse_thresholds("deterministic:0%")
    assert parse_thresholds("deterministic:0%,kernels_per_step:5%")["kernels_per_step"] == pytest.approx(0.05)


def test_memory_means_the_device_peak_in_a_gate_and_in_a_budget_key():
    assert resolve("memory") == resolve("peak_memory") == "peak_memory_mib"
    assert parse_thresholds("memory:2%") == {"peak_memory_mib": pytest.approx(0.02)}
    assert parse_key("max_memory_ratio") == ("peak_memory_mib", "max", True)
    assert parse_key("max_step_time") == ("step_time_ms", "max", False)
    assert parse_key("min_speedup") == ("samples_per_s", "min", True)
    assert resolve("no_such_metric") == "no_such_metric"


def test_per_round_values_follow_the_metric():
    assert per_round("step_time_ms", 20.0, [0.010, 0.020, 0.030]) == pytest.approx([10, 20, 30])
    assert per_round("samples_per_s", 100.0, [0.010, 0.020, 0.040]) == pytest.approx([200, 100, 50])
    assert per_round("mfu", 0.4, [0.010, 0.020, 0.040]) == pytest.approx([0.8, 0.4, 0.2])
    assert per_round("activation_mib", 5.0, [0.01, 0.02]) == []  # not read per round
    assert per_round("first_step_s", 5.0, [0.01, 0.02]) == []  # one value per run
    assert per_round("mfu", None, [0.01, 0.02]) == []  # not measured (not a known GPU)
    assert per_round("step_time_ms", 20.0, [0.0, 0.020]) == pytest.approx([20])  # a round with no time is left out
    with pytest.raises(KeyError):
        per_round("samples_per_second", 1.0, [0.01])


def _measured() -> Result:
    return Result("mlp-baseline", "mlp", "baseline", "cpu", batch_size=16, config={}, device={}, steps_per_round=2,
                  round_step_times_s=[0.010, 0.012, 0.011, 0.014, 0.009], flops_per_step=4e9, peak_tflops=2.0,
                  round_cpu_times_s=[0.019, 0.022, 0.020, 0.027, 0.018], items_per_step=1000.0, items_unit="tokens")


@pytest.mark.parametrize("metric", timed_metrics())
def test_each_timed_metric_round_by_round_is_its_value_at_the_median_round(metric):
    result = _measured()
    rounds = per_round(metric, result.metrics()[metric], rounds_of(metric, result))
    assert len(rounds) == 5 and statistics.median(rounds) == pytest.approx(result.metrics()[metric])


def test_a_stored_records_rounds_are_read_by_the_same_rule():
    result = _measured()
    record = CaseRecord.read(case_record(result), "mlp-baseline")
    for metric in timed_metrics():
        assert record.per_round(metric) == pytest.approx(per_round(metric, result.metrics()[metric],
                                                                  rounds_of(metric, result)))
    assert record.per_round("samples_per_s") == pytest.approx([16 / t for t in result.round_step_times_s])
    # MFU per round is MFU (it was samples/s): 4 GFLOP per step at 2 TFLOP/s peak
    assert record.per_round("mfu") == pytest.approx([4e9 / t / 1e12 / 2.0 for t in result.round_step_times_s])
    assert record.per_round("activation_mib") == []
    # CPU time follows each round's CPU seconds, not its wall time
    assert record.per_round("cpu_time_ms") == pytest.approx([t * 1e3 for t in result.round_cpu_times_s])


def test_a_metric_twice_in_a_gate_spec_is_refused_and_one_beside_deterministic_keeps_its_own():
    from trainbench.core.records.metrics import ThresholdError, parse_thresholds

    for spec in ("samples_per_s:5%,samples_per_s:10%", "peak_memory:2%,peak_memory_mib:3%",
                 "deterministic:0%,deterministic:1%"):
        with pytest.raises(ThresholdError, match=r"has a threshold already in .*expected one threshold per metric"):
            parse_thresholds(spec)  # the later silently won
    for spec in ("deterministic:0%,gflops_per_sample:1%", "gflops_per_sample:1%,deterministic:0%"):
        parsed = parse_thresholds(spec)
        assert parsed["gflops_per_sample"] == 0.01 and parsed["ops_per_step"] == 0.0


def test_every_metric_is_measured_by_phases_of_the_cost_table():
    from trainbench.core.harness.costs import PHASES
    from trainbench.core.records.metrics import METRICS, passes_measuring

    assert all(set(m.measured_by) <= set(PHASES) for m in METRICS.values())
    assert passes_measuring(["samples_per_s"]) == {"rounds"}
    assert passes_measuring(["ops_per_step", "aten_calls_per_step"]) == {"work", "calls"}
    assert passes_measuring(["predicted_gpu_peak_mib"]) == {"predict"}
    with pytest.raises(ValueError, match="expected phases"):
        Metric("", False, "deterministic", "a metric", group="work", passes=("lunch",))
