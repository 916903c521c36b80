"""When a timed check can be judged: interval vs limit, a busy machine, and the load meter's arithmetic."""

import pytest

from trainbench.host import LoadMeter, busy_cpu_seconds
from trainbench.noise import busy_reason, dispersion, inconclusive_reason

QUIET = {"cpus": 2, "seconds": 5.0, "other_cpus": 0.04, "load_average_1m": [2.0, 2.1]}
HOG = {"cpus": 2, "seconds": 5.0, "other_cpus": 1.02, "load_average_1m": [3.9, 4.2]}


def test_dispersion_is_iqr_over_median():
    assert dispersion([10, 10, 10, 10]) == 0
    assert dispersion([8, 9, 10, 11, 12]) == pytest.approx(2 / 10)
    assert dispersion([5.0]) is None


def test_a_paired_ratio_that_every_pair_puts_below_the_limit_is_conclusive():
    case = [50.0, 52.0, 49.0, 51.0, 50.0]
    base = [100.0, 101.0, 99.0, 102.0, 100.0]  # every pair ~0.5: a real 0.5x vs a 0.6 budget
    assert inconclusive_reason("samples_per_s", 0.6, 0.5, case, base, True, [QUIET]) is None


def test_scattered_pairs_that_straddle_the_limit_are_inconclusive():
    case = [30.0, 90.0, 45.0, 80.0, 35.0]
    base = [100.0, 100.0, 100.0, 100.0, 100.0]  # pairs 0.3..0.9 around a 0.6 budget
    reason = inconclusive_reason("samples_per_s", 0.6, 0.45, case, base, True, [QUIET])
    assert reason.startswith("rounds too noisy to judge: 95% interval 0.3..0.9 includes the limit 0.6 (IQR/median")


def test_a_busy_machine_makes_a_timed_miss_inconclusive_but_never_a_deterministic_one():
    case, base = [50.0] * 5, [100.0] * 5
    assert "other processes used 1.02 of 2 CPUs" in inconclusive_reason("samples_per_s", 0.6, 0.5, case, base, True,
                                                                         [HOG, HOG])
    assert inconclusive_reason("activation_mib", 1.0, 1.5, [], None, False, [HOG]) is None
    assert busy_reason(QUIET) is None and busy_reason(None) is None
    assert busy_reason({"cpus": 2, "other_cpus": None}) is None  # not measured (not Linux): no claim either way


def test_an_absolute_timed_limit_is_judged_on_the_rounds_themselves():
    assert inconclusive_reason("step_time_ms", 10.0, 12.0, [11.9, 12.0, 12.1], None, False, [QUIET]) is None
    assert inconclusive_reason("step_time_ms", 10.0, 12.0, [6.0, 12.0, 18.0], None, False, [QUIET]) is not None


STAT = """cpu  900 0 300 5000 10 0 20 0 0 0
cpu0 400 0 100 2500 5 0 10 0 0 0
cpu1 500 0 200 2500 5 0 10 0 0 0
intr 1 2 3
"""


def test_busy_cpu_seconds_sums_the_given_cores(monkeypatch):
    monkeypatch.setattr("os.sysconf", lambda name: 100)
    assert busy_cpu_seconds({0, 1}, STAT) == pytest.approx((400 + 100 + 10 + 500 + 200 + 10) / 100)
    assert busy_cpu_seconds({1}, STAT) == pytest.approx(7.1)
    assert busy_cpu_seconds({5}, STAT) is None


def test_the_load_meter_subtracts_this_process_trees_own_cpu(monkeypatch, tmp_path):
    """Cores busy for 30 CPU-seconds over 10 s, of which this process used 10: others used 2 CPUs."""
    monkeypatch.setattr("os.sysconf", lambda name: 100)
    stat = tmp_path / "stat"
    clock = iter([0.0, 10.0])
    own = iter([5.0, 15.0])
    monkeypatch.setattr("trainbench.host.own_cpu_seconds", lambda: next(own))
    meter = LoadMeter(str(stat), clock=lambda: next(clock))
    meter._cpus = {0, 1}
    stat.write_text("cpu0 0 0 0 0 0 0 0 0\ncpu1 0 0 0 0 0 0 0 0\n")
    meter.start()
    stat.write_text("cpu0 1500 0 0 0 0 0 0 0\ncpu1 1500 0 0 0 0 0 0 0\n")
    load = meter.stop()
    assert load["other_cpus"] == pytest.approx(2.0) and load["cpus"] == 2 and load["seconds"] == 10.0


def test_the_load_meter_reads_this_machine():
    load = LoadMeter().start().stop()
    assert load["cpus"] >= 1 and load["seconds"] >= 0
    assert load["other_cpus"] is None or load["other_cpus"] >= 0
