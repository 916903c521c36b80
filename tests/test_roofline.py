"""The roofline: what bounds a step (compute, memory, launches), its lower bound, and the speed-ups it rules out."""

import dataclasses
import math

import pytest

from trainbench.core.analyses.roofline import (
    COMPUTE,
    LAUNCH,
    LAUNCH_S,
    MEMORY,
    allowed_speedup,
    compute_seconds,
    speedup_flag,
    step_bound,
    versus_measured,
)

H100_BF16, H100_FP32, H100_GBS = 989.4, 67.0, 3350


def test_the_largest_term_names_what_bounds_the_step():
    big_matmuls = step_bound(compute_seconds([(1e15, H100_BF16)]), bytes_moved=1e9, bandwidth_gbs=H100_GBS, launches=500)
    assert big_matmuls.by == COMPUTE and big_matmuls.seconds == pytest.approx(1e15 / 989.4e12)
    elementwise = step_bound(compute_seconds([(1e9, H100_BF16)]), bytes_moved=50e9, bandwidth_gbs=H100_GBS, launches=500)
    assert elementwise.by == MEMORY and elementwise.seconds == pytest.approx(50e9 / 3350e9)
    small = step_bound(compute_seconds([(1e9, H100_BF16)]), bytes_moved=1e8, bandwidth_gbs=H100_GBS, launches=620)
    assert small.by == LAUNCH and small.seconds == pytest.approx(620 * LAUNCH_S)
    assert small.phrase() == "launch-bound, >= 3.1 ms/step"
    assert big_matmuls.phrase() == "compute-bound, >= 1011 ms/step"


def test_unknown_terms_are_left_out_and_said():
    no_peak = step_bound(compute_seconds([(1e12, None)]), bytes_moved=1e9, bandwidth_gbs=None, launches=1000)
    assert no_peak.by == LAUNCH and no_peak.phrase() == "launch-bound, >= 5.0 ms/step (no compute or memory term)"
    assert step_bound(None, 1e9, None, None).seconds is None
    assert "unknown" in step_bound(None, 1e9, None, None).phrase()
    assert compute_seconds([(0, None), (67e12, H100_FP32)]) == pytest.approx(1.0)  # a part with no FLOPs needs no peak


def test_convolutions_and_matmuls_each_at_their_precisions_peak():
    # fp32 with cuDNN's TF32 default: the convolutions at the TF32 peak, the rest at fp32's
    assert compute_seconds([(494.7e12, 494.7), (67e12, 67.0)]) == pytest.approx(2.0)


def test_a_speedup_the_roofline_rules_out_is_flagged_with_the_bound_kinds():
    base = step_bound(compute_seconds([(1e11, H100_FP32)]), 1e8, H100_GBS, launches=600)  # 3.0 ms of launches
    amp = step_bound(compute_seconds([(1e11, H100_BF16)]), 1e8, H100_GBS, launches=720)  # autocast's casts: 3.6 ms
    assert base.by == amp.by == LAUNCH
    assert allowed_speedup(amp, 32, base, 32) == pytest.approx(600 / 720)
    flag = speedup_flag(1.2, amp, 32, base, 32)
    assert flag.startswith("min_speedup 1.2 cannot hold by the roofline: both launch-bound")
    assert "~0.83x" in flag
    # compute-bound in fp32, launch-bound under AMP: 5.0x allowed, 1.2 holds
    heavy = step_bound(compute_seconds([(1e12, H100_FP32)]), 1e8, H100_GBS, launches=600)
    assert speedup_flag(1.2, amp, 32, heavy, 32) is None
    # a larger batch in the same launches: the samples/s speed-up counts the samples
    assert allowed_speedup(amp, 64, base, 32) == pytest.approx(2 * 600 / 720)
    assert speedup_flag(1.5, amp, 64, base, 32) is None
    # within the margin the counts' estimates leave: not flagged
    assert speedup_flag(0.9, amp, 32, base, 32) is None
    assert speedup_flag(1.2, step_bound(None, 0, None, None), 32, base, 32) is None  # no bound: nothing said
    # the same device work (pinned memory, cuDNN autotuning): its speed-up is outside the roofline, not ruled out
    assert speedup_flag(1.2, base, 32, base, 32) is None


def test_a_measured_step_against_its_bound():
    assert "near the bound" in versus_measured(3.1e-3, 3.5e-3)
    assert "well above the bound" in versus_measured(3.1e-3, 12e-3) and "(3.87x)" in versus_measured(3.1e-3, 12e-3)
    assert "below the bound" in versus_measured(3.1e-3, 1e-3)


def test_a_small_case_planned_on_a_simulated_h100_gets_a_finite_bound():
    from trainbench.core.method.measure import DEFAULT_SETTINGS
    from trainbench.core.analyses.predict import PredictionCache
    from trainbench.core.analyses.roofline import CountCache
    from trainbench.core.method.runner import Runner
    from trainbench.core.setups.workloads import PROFILES
    from trainbench.devices.fleet import H100_SXM
    from trainbench.devices.simulated import SimulatedGpu, prediction_backend
    from trainbench.jobs.night_plan import planned

    # the CPU profile's MLP keeps the fake steps to a second
    runner = Runner(SimulatedGpu(H100_SXM), PROFILES["cpu"], DEFAULT_SETTINGS["cpu"],
                    predictions=PredictionCache(prediction_backend()))
    counts = CountCache(prediction_backend())
    plan = runner.planner.plan("amp_bf16", "mlp")
    c = planned(runner, plan, plan.case, counts)
    assert c.skipped is None and c.bound_s is not None and math.isfinite(c.bound_s) and c.bound_s > 0
    assert c.roofline.startswith(("compute-bound", "memory-bound", "launch-bound")) and "ms/step" in c.roofline
    counted = counts("cpu", plan.config, plan.spec)
    assert counted.flops > 0 and counted.bytes_moved > 0 and counted.launches > 0 and counted.samples > 0
    assert counts("cpu", plan.config, plan.spec) is counted  # cached
    base = counts("cpu", plan.baseline_config, plan.spec)
    assert base.flops == counted.flops and base.launches < counted.launches  # autocast adds casts, not FLOPs
    assert counts("cpu", dataclasses.replace(plan.config, compile=True), plan.spec).launches is None  # fused
