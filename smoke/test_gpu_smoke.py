"""GPU smoke run (``make gpu-smoke``): one case per CUDA path, and self-checks of the measurement on this GPU.

Run it on a new GPU runner before trusting its numbers (after ``python -m trainbench doctor``).
It times nothing against budgets: each case must build, train, pass its correctness guard and
give sane figures; the self-checks test the method itself (timer vs CUDA events, allocator
peaks independent of what ran before, kernel counts, MFU, GradScaler, the memory prediction).
Short rounds keep it within a few minutes on one GPU. On a machine without CUDA every test is
skipped with the reason.
"""

from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.trainbench_gpu(what="GPU smoke")

# (workload, recipe): each CUDA path of the suite once.
CUDA_PATHS = [
    ("resnet18", "baseline"), ("resnet18", "pinned_memory"), ("resnet18", "uint8_transfer"),
    ("resnet18", "channels_last_input"), ("resnet18", "device_tensors"), ("resnet18", "amp_fp16"),
    ("resnet18", "amp_bf16"), ("resnet18", "channels_last_amp"), ("resnet18", "cudnn_benchmark"),
    ("resnet18", "deterministic"), ("resnet18", "emit_nvtx"), ("resnet18", "profiler_left_on"),
    ("resnet18", "empty_cache"), ("resnet18", "multiprocess_loading"), ("resnet18", "optimizer_fused"),
    ("gelu_mlp", "fuse_pointwise_script"), ("gelu_mlp", "fuse_pointwise_compile"), ("resnet18", "compile"),
    ("transformer", "amp_fp16"), ("gpt", "amp_fp16"),
]
MULTI_GPU_PATHS = [("resnet18", "data_parallel"), ("resnet18", "ddp")]


def _runner(device: str = "cuda"):
    from trainbench.core.method.measure import MeasureSettings
    from trainbench.core.method.runner import Runner
    from trainbench.core.setups.workloads import PROFILES
    from trainbench.devices.device import get_backend

    settings = MeasureSettings(min_warmup_steps=5, max_warmup_steps=40, steady_window=3, steady_tolerance=0.10,
                               rounds=4, steps_per_round=5, memory_steps=2)
    return Runner(get_backend(device), PROFILES["gpu"], settings, predict=True)


@pytest.fixture(scope="module")
def runner():
    return _runner()


def _check_outcome(outcome) -> None:
    from trainbench.core.setups.recipes import PROFILING_DEBUG_MODES

    if outcome.skipped:
        pytest.skip(outcome.skipped)
    assert not outcome.failures, "\n".join(outcome.failures)
    result = outcome.result
    assert result.samples_per_s and result.samples_per_s > 0
    assert all(t > 0 for t in result.round_step_times_s)
    if result.world_size == 1 and result.config.get("parallel") is None:
        if result.config.get("debug") in PROFILING_DEBUG_MODES:
            # The case's own profiler (NVTX ranges included) leaves no room for the one that counts: no count, by design.
            assert result.kernels_per_step is None and result.aten_calls_per_step is None
        else:
            assert result.kernels_per_step and result.kernels_per_step > 0, "the profiler saw no kernel"
        assert result.peak_allocated_bytes and result.peak_allocated_bytes > 0
    assert result.final_loss is not None and math.isfinite(result.final_loss)
    mfu = result.metrics()["mfu"]
    assert mfu is None or 0 < mfu < 1, f"MFU {mfu} against the {result.peak_precision} peak {result.peak_tflops}"


@pytest.mark.parametrize(("workload", "recipe"), CUDA_PATHS, ids=[f"{w}-{r}" for w, r in CUDA_PATHS])
def test_cuda_path(runner, workload, recipe):
    _check_outcome(runner.run(recipe, workload))


@pytest.mark.trainbench_min_gpus(2)
@pytest.mark.parametrize(("workload", "recipe"), MULTI_GPU_PATHS, ids=[f"{w}-{r}" for w, r in MULTI_GPU_PATHS])
def test_multi_gpu_path(runner, workload, recipe):
    _check_outcome(runner.run(recipe, workload))


@pytest.mark.trainbench_min_gpus(2)
def test_a_case_on_the_second_gpu():
    from trainbench.devices.device import get_backend

    try:
        second = _runner("cuda:1")
        assert second.backend.device.index == 1
        _check_outcome(second.run("amp_fp16", "resnet18"))
    finally:
        get_backend("cuda:0")  # the current device back to GPU 0 for the tests after this one


# -- self-checks of the method ---------------------------------------------------------------

@pytest.mark.parametrize("milliseconds", [2, 20])
def test_the_round_timer_agrees_with_cuda_events_on_a_known_kernel(runner, milliseconds):
    runner.backend.time_sleep_kernel(milliseconds / 1e3)  # first launch: module load
    from trainbench.devices.device import timer_event_disagreement

    disagreement = timer_event_disagreement(*runner.backend.time_sleep_kernel(milliseconds / 1e3))
    assert disagreement is None, disagreement


def test_a_case_peak_does_not_depend_on_what_ran_before(runner):
    alone = runner.run("baseline", "resnet18").result
    runner.run("larger_batch", "resnet18")  # leaves a large cache behind
    after_large = runner.run("baseline", "resnet18", overrides={"seed": 1}).result
    assert after_large.peak_allocated_bytes == pytest.approx(alone.peak_allocated_bytes, rel=0.01)
    assert after_large.peak_reserved_bytes == pytest.approx(alone.peak_reserved_bytes, rel=0.05)


def test_interleaved_peaks_are_each_setup_alone(runner):
    from trainbench.core.records.budgets import Budgets

    # A ratio budget (one no speed can fail) makes the runner interleave the case with its baseline.
    budgets = Budgets.from_text('[cuda."resnet18-amp_bf16"]\nmin_speedup = 0.01\n', source="<smoke>")
    outcome = runner.run("amp_bf16", "resnet18", budgets=budgets)
    if outcome.skipped:
        pytest.skip(outcome.skipped)
    assert outcome.paired
    alone = runner.run("amp_bf16", "resnet18", overrides={"seed": 1}).result
    assert outcome.result.peak_allocated_bytes == pytest.approx(alone.peak_allocated_bytes, rel=0.01)


def test_kernel_counts_are_stable(runner):
    first = runner.run("baseline", "resnet18").result
    second = runner.run("baseline", "resnet18", overrides={"seed": 1}).result
    assert first.kernels_per_step > 0
    assert first.kernels_per_step == second.kernels_per_step


def test_grad_scaler_and_guard_gradients_are_finite(runner):
    from trainbench.core.setups.recipes import get_recipe
    from trainbench.core.setups.training import TrainingSetup
    from trainbench.core.setups.workloads import resolve_spec

    profile = runner.profile
    with TrainingSetup(get_recipe("amp_fp16").config(profile), resolve_spec("resnet18", profile), runner.backend) as t:
        batches = t.batches()
        for _ in range(5):
            t.step(t.fetch(batches))
        scale = t.scaler.get_scale()
    assert math.isfinite(scale) and scale > 0
    outcome = runner.run("amp_fp16", "resnet18")
    grads = [v for v in outcome.guard_checks if v.kind == "gradients"]
    assert grads and all(math.isfinite(v.max_rel_diff) for v in grads)


def test_predicted_memory_is_the_allocator_peak_within_ten_percent_and_the_library_workspaces(runner):
    import os

    from trainbench.core.analyses.predict import allocator_peak_bounds
    from trainbench.devices.host import cublas_workspace_config

    result = runner.run("baseline", "resnet18").result
    check = result.predicted_memory["check"]
    assert check["matches"], check["differences"]
    low, high = allocator_peak_bounds(check["predicted_total"], runner.backend.caps().capability,
                                      cublas_workspace_config(os.environ))
    assert low <= result.peak_allocated_bytes <= high, (
        f"max_memory_allocated {result.peak_allocated_bytes / 2**20:.1f} MiB, predicted "
        f"{check['predicted_total'] / 2**20:.1f} MiB (allowed {low / 2**20:.1f}-{high / 2**20:.1f} MiB)")


class _GeluNet:
    """A tiny MLP with one ``nn.GELU`` (aten::gelu), built inside the spec so that the smoke file stays importable."""

    @staticmethod
    def spec():
        import functools

        import torch

        from trainbench.core.setups.spec import TrainingSpec

        def batches(batch_size, generator):
            return (torch.randn(batch_size, 256, generator=generator),
                    torch.randint(0, 8, (batch_size,), generator=generator))

        return TrainingSpec(
            "gelu_net", lambda: torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 8)),
            optimizer=functools.partial(torch.optim.SGD, lr=0.01), batch_size=64, batches=batches,
            loss_fn=lambda m, b: torch.nn.functional.cross_entropy(m(b[0]), b[1]))


def test_attribution_names_a_planted_slow_op_and_its_kernel(runner):
    """aten::gelu's CUDA kernel patched to queue 5 ms of spin kernel after its own work: the gate's explanation of
    the slower step names aten::gelu first (its device time) and the spin kernel (kernel time), each with most
    of the change."""
    import torch

    from trainbench.core.records.result import CaseRecord, case_record
    from trainbench.verdicts.compare import compare_case

    spec = _GeluNet.spec()
    base = runner.run("baseline", spec).result
    library = torch.library.Library("aten", "IMPL")

    def slow_gelu(x, approximate="none"):
        out = 0.5 * x * (1.0 + torch.erf(x / 2**0.5))
        runner.backend.sleep_kernel(0.005)
        return out

    library.impl("gelu", slow_gelu, "CUDA")
    try:
        slow = runner.run("baseline", spec).result
    finally:
        library._destroy()
    records = [CaseRecord.read(case_record(r), side) for r, side in ((base, "base"), (slow, "head"))]
    (step,) = compare_case(records[1], records[0], {"step_time_ms": 0.10})
    assert step.verdict == "regressed", step.describe()
    lines = step.explanation
    assert lines[0].startswith("op self time: aten::gelu +"), lines
    kernels = [line for line in lines if line.startswith("kernel time:")]
    assert kernels and float(kernels[0].rsplit(", ", 1)[1].split("%")[0]) > 50, lines
