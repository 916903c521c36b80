"""GPU readiness, checked on a CPU: what a GPU is said to offer, which copies and kernels count, how cases are judged
and kept apart on a GPU (device-side batches, fresh processes, the memory gate), and the step's GPU-facing knobs."""

import dataclasses
import functools
from types import SimpleNamespace

import pytest
import torch
import torch._dynamo
from torch import nn

from trainbench import device, step
from trainbench.device import CpuBackend, CudaBackend
from trainbench.measure import _OpCounter
from trainbench.recipes import ConfigError, TrainConfig, get_recipe, judging_overrides
from trainbench.runner import Runner
from trainbench.spec import TrainingSpec, classification_loss
from trainbench.workloads import PROFILES, resolve_spec

# -- peak throughput by exact GPU model -----------------------------------------------------------


@pytest.mark.parametrize(("name", "fp32", "tf32"), [
    ("NVIDIA L4", 30.3, 60.0),
    ("NVIDIA L40S", 91.6, 183.0),  # not the L4 row
    ("NVIDIA H100 PCIe", 51.0, 378.0),
    ("NVIDIA H100 NVL", 60.0, 417.5),
    ("NVIDIA H100 80GB HBM3", 67.0, 494.7),  # SXM5
    ("NVIDIA A100-SXM4-80GB", 19.5, 156.0),
    ("NVIDIA A10", 31.2, 62.5),
    ("Tesla V100S-PCIE-32GB", 16.4, None),  # not a V100 PCIe
    ("Tesla V100-SXM2-16GB", 15.7, None),
    ("Tesla V100-PCIE-16GB", 14.0, None),
])
def test_a_gpu_gets_the_peaks_of_its_own_model_and_form_factor(name, fp32, tf32):
    assert device.peak_tflops(name, "fp32") == fp32
    assert device.peak_tflops(name, "tf32") == tf32


@pytest.mark.parametrize("name", ["NVIDIA A10G", "NVIDIA L40", "NVIDIA GeForce RTX 4090", "some accelerator"])
def test_a_gpu_missing_from_the_table_has_no_peak(name):
    # A10G is not an A10 (other clocks): a row of a different model would give a wrong MFU, none gives no MFU.
    assert all(device.peak_tflops(name, dtype) is None for dtype in ("fp32", "tf32", "fp16", "bf16"))


def test_the_peak_is_that_of_the_precision_the_step_computes_in():
    assert device.peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == 989.4
    assert device.peak_tflops("Tesla V100-SXM2-16GB", "bf16") is None  # no bf16 tensor cores: no MFU, not fp32's


@pytest.mark.parametrize(("amp", "tf32_matmul", "tf32_cudnn", "capability", "expected"), [
    ("fp16", True, True, (9, 0), "fp16"),  # autocast wins
    ("bf16", False, False, (8, 0), "bf16"),
    (None, True, False, (8, 0), "tf32"),
    (None, False, True, (8, 6), "tf32"),  # cuDNN's default on sm_80+
    (None, True, True, (7, 0), "fp32"),  # no TF32 before Ampere
    (None, True, True, None, "fp32"),
    (None, False, False, (9, 0), "fp32"),
])
def test_compute_precision(amp, tf32_matmul, tf32_cudnn, capability, expected):
    assert device.compute_precision(amp, tf32_matmul, tf32_cudnn, capability) == expected


class _FakeL4(CudaBackend):
    """A CudaBackend that asks no driver: an L4 (sm_89) as cuda:0."""

    def __init__(self):
        self.device = torch.device("cuda", 0)

    @property
    def name(self):
        return "NVIDIA L4"

    def capability(self):
        return (8, 9)


@pytest.fixture
def tf32_flags():
    """Set (matmul, cuDNN) TF32 flags for a test, restored after (cuBLAS's flag is no plain attribute to monkeypatch)."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32

    def set_flags(matmul, cudnn):
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn

    yield set_flags
    set_flags(*saved)


def test_a_gpu_backend_reads_its_mfu_peak_from_the_tf32_flags(tf32_flags):
    tf32_flags(False, True)
    assert _FakeL4().mfu_peak(None) == ("tf32", 60.0)
    assert _FakeL4().mfu_peak("bf16") == ("bf16", 121.0)
    tf32_flags(True, False)
    assert _FakeL4().mfu_peak(None) == ("tf32", 60.0)
    tf32_flags(False, False)
    assert _FakeL4().mfu_peak(None) == ("fp32", 30.3)


# -- does this torch build have kernels for the GPU? ----------------------------------------------

CU130 = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]


@pytest.mark.parametrize(("capability", "arch_list"), [
    ((8, 9), CU130),  # sm_86 code runs on 8.9 (same major, later minor)
    ((7, 5), CU130),
    ((9, 0), ["sm_80", "compute_80"]),  # PTX of 8.0 JIT-compiles for 9.0
    ((9, 0), ["sm_90a"]),
    ((10, 3), ["sm_100f"]),
])
def test_a_build_with_kernels_for_the_gpu_is_supported(capability, arch_list):
    assert device.unsupported_arch(capability, arch_list) is None


@pytest.mark.parametrize(("capability", "arch_list", "sm"), [
    ((7, 0), CU130, "sm_70"),  # a V100 on a CUDA 13 wheel
    ((10, 0), ["sm_90a"], "sm_100"),  # sm_90a code runs on 9.0 only
    ((8, 0), ["sm_86"], "sm_80"),  # binary compatibility goes to later minors only
    ((12, 0), ["sm_100", "sm_90"], "sm_120"),  # no later-major SASS runs on an older major, nor an older on a newer
    ((8, 0), [], "sm_80"),
    ((10, 3), ["sm_100a"], "sm_103"),  # architecture-specific code runs on exactly that GPU
    ((12, 0), ["compute_100a"], "sm_120"),  # ... and its PTX is no portable PTX
])
def test_a_build_without_kernels_for_the_gpu_says_so(capability, arch_list, sm):
    message = device.unsupported_arch(capability, arch_list)
    assert message is not None and f"none that runs on {sm}" in message
    assert (" ".join(arch_list) or "no GPU") in message and "install a wheel" in message



# -- what the profiler and the op counter count ---------------------------------------------------

def _event(name, device_type=torch.autograd.DeviceType.CUDA, **extra):
    return SimpleNamespace(name=name, device_type=device_type, **extra)


@pytest.mark.parametrize(("event", "kernel"), [
    (_event("void at::native::vectorized_elementwise_kernel<4, ...>", is_user_annotation=False), True),
    (_event("ampere_sgemm_128x64_nn"), True),  # an event without the annotation flag
    (_event("Memcpy HtoD (Pageable -> Device)", is_user_annotation=False), False),
    (_event("Memcpy DtoH (Device -> Pageable)", is_user_annotation=False), False),
    (_event("Memset (Device)", is_user_annotation=False), False),
    (_event("forward", is_user_annotation=True), False),  # record_function's range on the GPU timeline
    (_event("aten::addmm", torch.autograd.DeviceType.CPU, is_user_annotation=False), False),
])
def test_only_compute_kernels_on_the_gpu_count_as_kernels(event, kernel):
    assert device.is_cuda_kernel_event(event) is kernel
    assert _FakeL4().is_device_kernel(event) is kernel
    assert CpuBackend(torch.device("cpu")).is_device_kernel(event) is False


@pytest.mark.parametrize(("src", "dst", "non_blocking", "pinned", "blocking"), [
    ("cpu", "cuda", False, False, True),  # pageable, blocking
    ("cpu", "cuda", False, True, True),  # pinned, but not asked to overlap
    ("cpu", "cuda", True, True, False),  # the one copy that overlaps
    ("cpu", "cuda", True, False, True),  # non_blocking from pageable memory: staged by the driver, the host waits
    ("cuda", "cpu", False, False, True),  # the host reads the result
    ("cuda", "cpu", True, False, False),  # non_blocking into pinned host memory: the host goes on
    ("cpu", "cpu", False, False, False),
    ("cuda", "cuda", False, False, False),
    ("cuda", "cuda", True, False, False),
])
def test_which_copies_the_host_waits_for(src, dst, non_blocking, pinned, blocking):
    assert device.is_blocking_copy(src, dst, non_blocking, pinned) is blocking


def test_a_gpu_backend_asks_the_source_tensor_whether_it_is_pinned():
    pageable = torch.ones(4)
    assert not pageable.is_pinned()
    assert _FakeL4().blocking_copy(pageable, torch.device("cuda", 0), non_blocking=True) is True
    assert _FakeL4().blocking_copy(pageable, torch.device("cpu"), non_blocking=True) is False
    pinned = SimpleNamespace(device=torch.device("cpu"), is_pinned=lambda: True)  # no pinned memory without a GPU
    assert _FakeL4().blocking_copy(pinned, torch.device("cuda", 0), non_blocking=True) is False
    assert _FakeL4().blocking_copy(pinned, torch.device("cuda", 0), non_blocking=False) is True


@pytest.mark.parametrize(("first", "count", "total", "expected"), [
    (0, 2, 8, [0, 1]),
    (1, 2, 2, [1, 0]),  # a run on cuda:1 of two GPUs wraps around
    (3, 2, 4, [3, 0]),
    (2, 1, 4, [2]),
])
def test_parallel_devices_start_at_the_runs_gpu(first, count, total, expected):
    assert device.parallel_devices(first, count, total) == expected


def test_parallel_devices_refuse_more_gpus_than_present():
    with pytest.raises(RuntimeError, match="3 GPUs needed, 2 present"):
        device.parallel_devices(0, 3, 2)


class _EveryCopyBlocks(CpuBackend):
    def __init__(self):
        super().__init__(torch.device("cpu"))

    def blocking_copy(self, src, dst_device, non_blocking):
        return True


@pytest.mark.parametrize("copy", [
    lambda x: x.to("cpu", copy=True),
    lambda x: x.to(device="cpu", dtype=torch.float64),
    lambda x: torch.empty(3).copy_(x),
])
def test_the_op_counter_asks_the_backend_which_copies_sync(copy):
    x = torch.randn(3)
    with _OpCounter(_EveryCopyBlocks()) as counter:
        copy(x)
    assert counter.syncs == 1
    with _OpCounter(CpuBackend(torch.device("cpu"))) as counter:
        copy(x)
    assert counter.syncs == 0 and sum(counter.ops.values()) >= 1


def test_the_op_counter_counts_item_as_a_sync_and_a_dtype_cast_as_none():
    x = torch.randn(3)
    with _OpCounter(_EveryCopyBlocks()) as counter:
        x.sum().item()
        x.to(torch.float64)  # no device given: not a transfer
    assert counter.syncs == 1 and counter.ops["aten._to_copy"] == 1 and counter.ops["aten._local_scalar_dense"] == 1


# -- how cases are judged on a GPU ----------------------------------------------------------------

GPU = PROFILES["gpu"]


@pytest.fixture(scope="module")
def gpu_resnet18():
    return resolve_spec("resnet18", GPU)  # a spec only: no model is built


def _judging(recipe, spec, profile=GPU, overrides=None):
    recipe = get_recipe(recipe)
    return judging_overrides(recipe, get_recipe(recipe.baseline), profile, spec, overrides or {})


@pytest.mark.parametrize("recipe", ["amp_fp16", "channels_last", "cudnn_benchmark", "set_to_none"])
def test_compute_recipes_are_judged_on_device_side_batches_on_the_gpu_profile(recipe, gpu_resnet18):
    assert GPU.compute_data == "device"
    assert _judging(recipe, gpu_resnet18) == {"synthetic": "device"}


@pytest.mark.parametrize("recipe", ["pinned_memory", "multiprocess_loading", "uint8_transfer", "device_tensors",
                                    "channels_last_input"])
def test_data_path_recipes_keep_the_loader(recipe, gpu_resnet18):
    assert _judging(recipe, gpu_resnet18) == {}


def test_ddp_keeps_the_loader_it_shards(gpu_resnet18):
    assert get_recipe("ddp").baseline == "data_parallel"
    assert _judging("ddp", gpu_resnet18) == {}


@pytest.mark.parametrize("recipe", ["amp_fp16", "channels_last", "set_to_none", "pinned_memory"])
def test_the_cpu_profile_keeps_the_loader_for_every_recipe(recipe):
    cpu_profile = PROFILES["cpu"]
    assert cpu_profile.compute_data is None
    assert _judging(recipe, resolve_spec("resnet18", cpu_profile), cpu_profile) == {}


def test_an_explicit_synthetic_override_is_left_as_given(gpu_resnet18):
    assert _judging("amp_fp16", gpu_resnet18, overrides={"synthetic": "host"}) == {}
    assert _judging("amp_fp16", gpu_resnet18, overrides={"synthetic": "device"}) == {}


def test_a_spec_without_a_batch_factory_keeps_its_loader(gpu_resnet18):
    loader_only = dataclasses.replace(gpu_resnet18, name="resnet18_loader_only", batches=None)
    assert _judging("amp_fp16", loader_only) == {}


@pytest.mark.parametrize("overrides", [{"num_workers": 4}, {"pin_memory": True}])
def test_a_users_loader_override_keeps_the_loader(overrides, gpu_resnet18):
    assert _judging("amp_fp16", gpu_resnet18, overrides=overrides) == {}


def test_replicas_go_with_data_parallel_only(profile):
    with pytest.raises(ConfigError, match="replicas > 1 goes with parallel='dp'"):
        TrainConfig(replicas=2).validate()
    with pytest.raises(ConfigError, match="replicas > 1 goes with parallel='dp'"):
        TrainConfig(parallel="dp").validate()  # DataParallel over one GPU is no data parallelism
    config = get_recipe("data_parallel").config(profile)
    assert (config.parallel, config.replicas, config.world_size) == ("dp", 2, 1)


def test_the_runner_judges_a_compute_recipe_and_its_guard_on_device_side_batches(cpu, profile, quick, monkeypatch):
    from trainbench import guards

    guarded = []
    real = guards.loss_trajectory

    def recorded(config, spec, backend, *args, **kwargs):
        guarded.append(config.synthetic)
        return real(config, spec, backend, *args, **kwargs)

    monkeypatch.setattr(guards, "loss_trajectory", recorded)
    device_side = dataclasses.replace(profile, compute_data="device")  # the CPU profile's sizes, judged as on a GPU
    outcome = Runner(cpu, device_side, quick, predict=False).run("set_to_none", "mlp")
    assert outcome.skipped is None and not outcome.failures
    assert outcome.result.config["synthetic"] == "device" and outcome.result.h2d_bytes_per_sample == 0
    assert guarded == ["device", "device"]  # the baseline's trajectory and the case's
    assert [v.kind for v in outcome.guard_verdicts] == ["loss"] and outcome.guard_verdicts[0].ok
    assert any(note.startswith("judged against baseline with both on device-side synthetic batches")
               for note in outcome.result.notes)


def test_a_paired_baseline_is_measured_on_the_same_device_side_batches(cpu, profile, quick, tmp_path):
    from trainbench.budgets import Budgets

    path = tmp_path / "budgets.toml"
    path.write_text('[cpu."mlp-set_to_none"]\nmax_ops_per_step_ratio = 2.0\n')
    device_side = dataclasses.replace(profile, compute_data="device")
    outcome = Runner(cpu, device_side, quick, predict=False).run("set_to_none", "mlp", budgets=Budgets.load(path))
    assert outcome.paired and outcome.baseline is not None
    assert outcome.baseline.config["synthetic"] == outcome.result.config["synthetic"] == "device"


# -- setups measured in a fresh process -----------------------------------------------------------

class _FreshForDeterministic(CpuBackend):
    """A CPU backend that, like CUDA's, measures deterministic setups in a new process with an environment."""

    def __init__(self):
        super().__init__(torch.device("cpu"))

    def fresh_process_reason(self, config):
        return "test reason" if config.deterministic else None

    def fresh_process_env(self, config):
        return {"TRAINBENCH_TEST_ENV": "1"}


def test_a_setup_a_device_keeps_per_process_is_measured_with_its_baseline_in_fresh_processes(profile, quick):
    # Two new interpreters (the case and its baseline); each re-creates the plain CPU backend and the built-in spec.
    outcome = Runner(_FreshForDeterministic(), profile, quick, predict=False).run("deterministic", "mlp")
    assert outcome.skipped is None and not outcome.failures
    assert "measured in a fresh process (TRAINBENCH_TEST_ENV=1)" in outcome.result.notes
    assert "why a fresh process: test reason" in outcome.result.notes
    assert outcome.result.config["deterministic"] is True and outcome.result.rounds == quick.rounds
    assert outcome.baseline is not None and outcome.baseline.recipe == "baseline"
    assert "measured in a fresh process (TRAINBENCH_TEST_ENV=1)" in outcome.baseline.notes
    # the loss guard compares the trajectories the two processes ran
    [verdict] = outcome.guard_verdicts
    assert verdict.kind == "loss" and verdict.ok
    assert (verdict.losses, verdict.baseline_losses) == outcome.fresh_losses and len(verdict.losses) == 4


# -- the memory gate ------------------------------------------------------------------------------

class _DeviceOfMemory(CpuBackend):
    def __init__(self, total_bytes):
        super().__init__(torch.device("cpu"))
        self.total_bytes = total_bytes

    def total_memory_bytes(self):
        return self.total_bytes


def test_a_case_predicted_not_to_fit_the_device_is_skipped_with_its_need(profile, quick):
    outcome = Runner(_DeviceOfMemory(10 * 2**20), profile, quick, predict=False).run("larger_batch", "resnet18")
    assert outcome.result is None
    assert outcome.skipped.startswith("larger_batch: needs ~") and " GiB (predicted tensor peak " in outcome.skipped
    assert outcome.skipped.endswith("has 0.0 GiB")


def test_a_case_that_fits_runs(profile, quick):
    small, large = _DeviceOfMemory(4 * 2**20), _DeviceOfMemory(64 * 2**30)
    larger_batch = get_recipe("larger_batch")
    mlp = resolve_spec("mlp", profile)
    # the MLP's parameters, gradients and momentum alone are ~9 MiB: 4 MiB cannot hold it, 64 GiB can
    assert "needs ~" in Runner(small, profile, quick, predict=False).planner.plan(larger_batch, mlp).skipped
    runner = Runner(large, profile, quick, predict=False)
    assert runner.planner.plan(larger_batch, mlp).skipped is None
    outcome = runner.run("larger_batch", "mlp")
    assert outcome.skipped is None and outcome.result.batch_size == 4 * profile.batch_size


# -- knobs of the step that matter on a GPU -------------------------------------------------------

@pytest.mark.parametrize(("recipe", "workload", "resets"), [
    ("compile", "mlp", 1),
    ("fuse_pointwise_compile", "gelu_mlp", 1),
    ("baseline", "mlp", 0),
])
def test_closing_a_compiled_setup_resets_dynamo(recipe, workload, resets, cpu, profile, monkeypatch):
    calls = []
    monkeypatch.setattr(torch._dynamo, "reset", lambda: calls.append("reset"))
    training = step.Training(get_recipe(recipe).config(profile), resolve_spec(workload, profile), cpu)
    assert calls == []  # building compiles nothing yet
    training.close()  # without a step: nothing compiled, the caches are reset all the same
    assert len(calls) == resets


@pytest.mark.parametrize("warn_only", [True, False])
def test_deterministic_algorithms_fail_rather_than_warn_and_restore_the_previous_state(warn_only):
    saved = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.backends.cudnn.deterministic)
    try:
        torch.use_deterministic_algorithms(warn_only, warn_only=warn_only)  # (True, warn) or all off
        torch.backends.cudnn.deterministic = False
        with step._deterministic_algorithms():
            assert torch.are_deterministic_algorithms_enabled()
            assert not torch.is_deterministic_algorithms_warn_only_enabled()
            assert torch.backends.cudnn.deterministic
        assert torch.are_deterministic_algorithms_enabled() is warn_only
        assert torch.is_deterministic_algorithms_warn_only_enabled() is warn_only
        assert torch.backends.cudnn.deterministic is False
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        torch.backends.cudnn.deterministic = saved[2]


def _loss_without_deterministic_kernel(model, batch):
    if torch.are_deterministic_algorithms_enabled():
        raise RuntimeError("fake_op_backward does not have a deterministic implementation, but you set "
                           "'torch.use_deterministic_algorithms(True)'")
    return classification_loss(model, batch)


def _random_features(batch_size, gen):
    return (torch.randn(batch_size, 8, generator=gen, device=gen.device),
            torch.randint(0, 2, (batch_size,), generator=gen, device=gen.device))


NONDETERMINISTIC = TrainingSpec(
    name="nondeterministic", model=lambda: nn.Linear(8, 2), loss_fn=_loss_without_deterministic_kernel,
    optimizer=functools.partial(torch.optim.SGD, lr=0.01), batch_size=4, batches=_random_features)


def test_a_model_without_deterministic_kernels_skips_the_deterministic_case(cpu, profile, quick):
    runner = Runner(cpu, profile, quick, predict=False)
    outcome = runner.run("deterministic", NONDETERMINISTIC)
    assert outcome.result is None
    assert outcome.skipped.startswith("deterministic: an op of the model has no deterministic kernel here: "
                                      "fake_op_backward does not have a deterministic implementation")
    assert not torch.are_deterministic_algorithms_enabled()  # the failed setup restored the flag
    assert runner.run("baseline", NONDETERMINISTIC).skipped is None  # the same spec trains without the flag


class _ClockLog(CpuBackend):
    """A CPU backend whose clock is a counter (10 s a read) and whose waits and syncs are logged, not waited."""

    def __init__(self, log):
        super().__init__(torch.device("cpu"))
        self.log, self.now = log, 0.0

    def clock(self):
        self.log.append(("clock", self.now))
        self.now += 10.0
        return self.now - 10.0

    def synchronize(self):
        self.log.append("synchronize")

    def busy_wait(self, seconds):
        self.log.append(("busy_wait", seconds))


@pytest.mark.parametrize(("fault", "after_the_update"), [
    (step.InjectedFault(slowdown=0.5), ["synchronize", ("clock", 10.0), ("busy_wait", 5.0)]),
    (None, []),
])
def test_the_injected_slowdown_waits_for_the_device_after_the_step(fault, after_the_update, profile):
    log = []
    with step.Training(get_recipe("baseline").config(profile), resolve_spec("mlp", profile), _ClockLog(log),
                       fault) as training:
        training.optimizer.register_step_post_hook(lambda *args: log.append("optimizer step"))
        micro_batches = training.fetch(training.batches())
        log.clear()
        training.backend.now = 0.0
        training.step(micro_batches)
    # the step's start, its work, then (with the fault) the device drained before the elapsed time is read:
    # a fraction of the whole step, not of the host's share of it
    assert log == [("clock", 0.0), "optimizer step", *after_the_update]


def test_data_parallel_skips_the_passes_its_replica_threads_escape(cpu, profile, quick):
    from trainbench.measure import Measurement

    with step.Training(get_recipe("baseline").config(profile), resolve_spec("mlp", profile), cpu) as training:
        # DataParallel needs 2 GPUs; the pass selection only reads the config, so the CPU setup stands in.
        training.config = dataclasses.replace(training.config, parallel="dp", replicas=2)
        m = Measurement(training, "mlp-data_parallel", "data_parallel", quick)
        m.warm_up(settle=False)
        m.measure_after_timing()
    assert set(m.result.phase_seconds) == {"peaks", "calls"}
    assert m.result.memory_breakdown_bytes == {} and m.result.flops_per_step is None
    assert m.result.aten_calls_per_step > 0  # the profiler sees every thread
    assert any("DataParallel: no memory breakdown" in note for note in m.result.notes)
