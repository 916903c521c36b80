"""A measured case's result: the metrics derived from its rounds and passes, and its one serialized form read back."""

import statistics

import pytest

from trainbench.core.records.result import METRICS, MIB, CaseRecord, RecordError, Result, case_record


def test_samples_per_s_and_step_time_come_from_the_same_median():
    r = Result("c", "mlp", "baseline", "cpu", batch_size=16, config={}, device={}, steps_per_round=5,
               round_step_times_s=[0.010, 0.020, 0.030, 0.100])  # one stalled round does not move either
    assert r.step_time_s == pytest.approx(0.025)
    assert r.samples_per_s == pytest.approx(16 / 0.025)
    q1, _, q3 = statistics.quantiles([0.010, 0.020, 0.030, 0.100], n=4, method="inclusive")
    assert r.step_time_iqr_s == pytest.approx(q3 - q1)
    m = r.metrics()
    assert m["samples_per_s"] == pytest.approx(640.0) and m["step_time_ms"] == pytest.approx(25.0)
    assert m["samples_per_s"] * m["step_time_ms"] / 1e3 == pytest.approx(16)  # batch = rate x step time
    ddp = Result("c", "mlp", "ddp_gloo", "cpu", batch_size=16, config={}, device={}, steps_per_round=5,
                 round_step_times_s=[0.025], world_size=2)
    assert ddp.samples_per_s == pytest.approx(32 / 0.025)  # every rank's samples


def test_a_baseline_without_trainbench_data_is_a_clear_error():
    with pytest.raises(RecordError, match="base.json: test_x: not a trainbench case"):
        CaseRecord.read({"foo": 1}, "base.json: test_x")
    with pytest.raises(RecordError, match="base.json: test_x: ops_per_step = 'lots': expected a finite number or null"):
        CaseRecord.read({"case": "c", "samples_per_step": 16, "ops_per_step": "lots"}, "base.json: test_x")


def _result(**fields):
    return Result("mlp-baseline", "mlp", "baseline", "cpu", batch_size=16, config={"amp": None},
                  device={"kind": "cpu", "name": "AMD EPYC"}, **fields)


def test_a_result_without_rounds_or_passes_has_no_metric_rather_than_zero():
    metrics = _result().metrics()
    assert set(metrics) == set(METRICS)
    assert all(value is None for value in metrics.values()), {k: v for k, v in metrics.items() if v is not None}
    assert _result(round_step_times_s=[0.02]).step_time_iqr_s == 0.0  # one round: no spread, not unknown


def test_derived_metrics_come_from_the_rounds_the_passes_and_the_device_peak():
    result = _result(steps_per_round=4, round_step_times_s=[0.02, 0.02], data_wait_s=0.04, warmup_steps=3,
                     first_step_s=1.5, warmup_s=2.0, flops_per_step=4 * 10**9, peak_tflops=1.0,
                     memory_breakdown_bytes={"total": 3 * MIB, "params": MIB, "activations": 2 * MIB},
                     memory_growth_bytes_per_step=0.0)
    metrics = result.metrics()
    assert metrics["data_wait_fraction"] == pytest.approx(0.04 / (2 * 0.02 * 4))
    assert (metrics["first_step_s"], metrics["warmup_s"]) == (1.5, 2.0)
    assert metrics["achieved_tflops"] == pytest.approx(0.2) and metrics["mfu"] == pytest.approx(0.2)
    assert metrics["gflops_per_sample"] == pytest.approx(4 / 16)
    assert (metrics["tracked_peak_mib"], metrics["param_mib"], metrics["activation_mib"]) == (3, 1, 2)
    assert metrics["peak_memory_mib"] == 3  # no allocator peak on the CPU: the tracked peak stands in
    assert _result(peak_allocated_bytes=5 * MIB, memory_breakdown_bytes={"total": MIB}).metrics()["peak_memory_mib"] == 5
    assert metrics["memory_growth_mib_per_step"] == 0 and metrics["grad_mib"] is None


def test_a_case_record_reads_back_as_what_was_measured():
    result = _result(steps_per_round=2, round_step_times_s=[0.01, 0.03], ops_per_step=40, world_size=2,
                     notes=["a note"])
    record = CaseRecord.read(case_record(result, speedup_vs_baseline=1.5, paired=True, ladder={"rung": 1}),
                             "run.json: test_mlp")
    assert record.case == "mlp-baseline" and record.samples_per_step == 32  # both ranks' samples
    assert record.metrics == result.metrics() and record.round_step_times_s == [0.01, 0.03]
    assert (record.speedup_vs_baseline, record.paired, record.ladder) == (1.5, True, {"rung": 1})
    assert record.profile == "cpu" and record.device == {"kind": "cpu", "name": "AMD EPYC"}
    assert record.raw["notes"] == ["a note"] and record.machine_load is None


def test_a_record_saved_before_samples_per_step_reads_its_batch_size():
    older = {"case": "mlp-baseline", "batch_size": 16, "round_step_times_s": [0.01], "samples_per_s": 1600.0}
    record = CaseRecord.read(older, "0001_baseline.json: test_mlp")
    assert record.samples_per_step == 16 and record.paired is None and record.metrics["ops_per_step"] is None


@pytest.mark.parametrize(("change", "message"), [
    ({"round_step_times_s": "fast"}, "round_step_times_s: expected a list of finite seconds"),
    ({"round_step_times_s": [0.01, True]}, "round_step_times_s: expected a list of finite seconds"),
    ({"samples_per_step": 0}, "samples_per_step = 0: expected a positive int"),
    ({"samples_per_step": None, "batch_size": None}, "samples_per_step = None: expected a positive int"),
    ({"speedup_vs_baseline": "2x"}, "speedup_vs_baseline = '2x': expected a finite number above 0 or null"),
    ({"samples_per_s": True}, "samples_per_s = True: expected a finite number or null"),
    ({"samples_per_s": float("nan")}, "samples_per_s = nan: expected a finite number or null"),
    ({"ops_per_step": float("inf")}, "ops_per_step = inf: expected a finite number or null"),
    ({"tracked_peak_mib": float("-inf")}, "tracked_peak_mib = -inf: expected a finite number or null"),
    ({"round_step_times_s": [0.01, float("nan")]}, "round_step_times_s: expected a list of finite seconds"),
    ({"speedup_vs_baseline": float("inf")}, "speedup_vs_baseline = inf: expected a finite number above 0 or null"),
    # a timed metric without its rounds would be judged as a bare value, with no interval
    ({"samples_per_s": 1600.0, "round_step_times_s": None},
     "samples_per_s = 1600.0 without round_step_times_s: expected the rounds it was measured in"),
    ({"step_time_ms": 10.0, "round_step_times_s": []},
     "step_time_ms = 10.0 without round_step_times_s: expected the rounds it was measured in"),
    ({"round_step_times_s": ""}, "round_step_times_s: expected a list of finite seconds"),
    # the machine's load decides whether a slowdown counts: a corrupt one must not pass for a quiet or a busy machine
    ({"machine_load": "busy"}, "machine_load = 'busy': expected a dict (cpus, other_cpus, load_average_1m) or null"),
    ({"machine_load": {"cpus": 2, "other_cpus": float("nan")}},
     "machine_load.other_cpus = nan: expected a finite number >= 0 or null"),
    ({"machine_load": {"cpus": "2", "other_cpus": 1.1}}, "machine_load.cpus = '2': expected a count or null"),
    ({"machine_load": {"cpus": 2, "other_cpus": 1.1, "load_average_1m": [3.9]}},
     "machine_load.load_average_1m = [3.9]: expected [start, end] or null"),
    # values no measurement gives: calibrate wrote max_ops_per_step = 0 from a negative count
    ({"ops_per_step": -120}, "ops_per_step = -120: expected a value >= 0"),
    ({"activation_mib": -0.5}, "activation_mib = -0.5: expected a value >= 0"),
    ({"round_step_times_s": [0.01, -0.01]}, "round_step_times_s holds -0.01: expected seconds per step above 0 and "
                                            "at most 86400"),
    ({"round_step_times_s": [1e300]}, "round_step_times_s holds 1e+300: expected seconds per step above 0 and at "
                                      "most 86400"),
    ({"round_cpu_times_s": [-1.0]}, "round_cpu_times_s holds -1.0: expected seconds per step >= 0 and at most 86400"),
    ({"samples_per_s": 0.0}, "samples_per_s = 0.0: expected a samples/s above 0 (a timed metric of zero or less was "
                             "not measured)"),
    ({"samples_per_s": 5.0}, "samples_per_s = 5.0: expected 1600, as its rounds give it"),  # beside 10 ms rounds
    ({"step_time_ms": 1e300}, "step_time_ms = 1e+300: expected 10, as its rounds give it"),
    ({"speedup_vs_baseline": -1.5}, "speedup_vs_baseline = -1.5: expected a finite number above 0 or null"),
    # every other field a reader takes, whole: a wrong type deep in it once crashed the gate after the run
    ({"attribution": {"ops": {"aten.mm": "6"}}}, "attribution.ops['aten.mm'] = '6': expected a finite number"),
    ({"attribution": {"time": {"ops_ms": {"aten::mm": [1.0], "aten::add": [1.0, 2.0]}}}},
     "attribution.time.ops_ms: rows of [1, 2] profiled steps: expected one count for every row"),
    ({"attribution": {"time": {"ops_ms": {"aten::mm": 1.0}}}},
     "attribution.time.ops_ms['aten::mm'] = 1.0: expected a non-empty list of finite numbers (one per profiled step)"),
    ({"attribution": {"memory": {"peak_bytes": []}}},
     "attribution.memory.peak_bytes = []: expected a table (row -> number)"),
    ({"attribution": "tables"}, "attribution = 'tables': expected the attribution tables (a dict) or null"),
    ({"paired": "no"}, "paired = 'no': expected true or false or null"),
    ({"notes": 3}, "notes = 3: expected a list of notes or null"),
    ({"budget": {"checks": "ok"}}, "budget = {'checks': 'ok'}: expected a dict whose checks are a list of dicts or null"),
])
def test_a_malformed_record_names_where_and_what_was_expected(change, message):
    info = {"case": "c", "samples_per_step": 16, "round_step_times_s": [0.01], **change}
    with pytest.raises(RecordError) as raised:
        CaseRecord.read(info, "run.json: test_c")
    assert str(raised.value) == f"run.json: test_c: {message}"
