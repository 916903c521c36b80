"""The device module: what a GPU is said to offer, which copies and kernels count, which GPUs a run takes (checked
with torch.cuda replaced or not reached, so it runs on CPUs)."""

import os
from types import SimpleNamespace

import pytest
import torch

from trainbench.devices import device
from trainbench.devices.device import CpuBackend, CudaBackend, pin_to_one_gpu


def test_a_gpu_supports_bf16_only_natively(monkeypatch):
    asked = {}

    def is_bf16_supported(including_emulation=True):
        asked["including_emulation"] = including_emulation
        return including_emulation  # a V100: bf16 only by emulation

    monkeypatch.setattr(device.torch.cuda, "is_bf16_supported", is_bf16_supported)
    backend = object.__new__(device.CudaBackend)
    assert backend.supports_bf16() is False and asked == {"including_emulation": False}


# -- peak throughput by exact GPU model -----------------------------------------------------------


@pytest.mark.parametrize(("name", "fp32", "tf32"), [
    ("NVIDIA L4", 30.3, 60.0),
    ("NVIDIA L40S", 91.6, 183.0),  # not the L4 row
    ("NVIDIA H100 PCIe", 51.0, 378.0),
    ("NVIDIA H100 NVL", 60.0, 417.5),
    ("NVIDIA H100 80GB HBM3", 67.0, 494.7),  # SXM5
    ("NVIDIA A100-SXM4-80GB", 19.5, 156.0),
    ("NVIDIA A10", 31.2, 62.5),
    ("NVIDIA A10G", 35.0, 35.0),  # AWS's A10G: not the A10's row (half its tensor rate)
    ("NVIDIA GeForce RTX 4090", 82.6, 82.6),
    ("NVIDIA B200", 75.0, 1100.0),
    ("Tesla V100S-PCIE-32GB", 16.4, None),  # not a V100 PCIe
    ("Tesla V100-SXM2-16GB", 15.7, None),
    ("Tesla V100-PCIE-16GB", 14.0, None),
])
def test_a_gpu_gets_the_peaks_of_its_own_model_and_form_factor(name, fp32, tf32):
    assert device.peak_tflops(name, "fp32") == fp32
    assert device.peak_tflops(name, "tf32") == tf32


@pytest.mark.parametrize("name", ["NVIDIA L40", "NVIDIA GeForce RTX 4080", "NVIDIA B100", "some accelerator"])
def test_a_gpu_missing_from_the_table_has_no_peak(name):
    # An L40 is not an L40S, a 4080 not a 4090: a row of a different model would give a wrong MFU, none gives no MFU.
    assert all(device.peak_tflops(name, dtype) is None for dtype in ("fp32", "tf32", "fp16", "bf16"))


def test_the_peak_is_that_of_the_precision_the_step_computes_in():
    assert device.peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == 989.4
    assert device.peak_tflops("Tesla V100-SXM2-16GB", "bf16") is None  # no bf16 tensor cores: no MFU, not fp32's


@pytest.mark.parametrize(("amp", "tf32_matmul", "tf32_cudnn", "capability", "conv_share", "expected"), [
    ("fp16", True, True, (9, 0), 0.0, "fp16"),  # autocast wins
    ("bf16", False, False, (8, 0), 0.9, "bf16"),
    (None, True, False, (8, 0), 0.0, "tf32"),
    (None, False, True, (8, 6), 0.9, "tf32"),  # mostly convolutions: cuDNN's flag, on by default on sm_80+
    (None, False, True, (8, 6), 0.0, "fp32"),  # a transformer under cuDNN's default: its matmuls run in fp32
    (None, False, True, (8, 6), 0.5, "fp32"),  # half convolutions is not mostly
    (None, True, False, (8, 6), 0.9, "fp32"),  # convolutions with cuDNN TF32 off, whatever the matmuls may use
    (None, True, True, (7, 0), 0.9, "fp32"),  # no TF32 before Ampere
    (None, True, True, None, 0.0, "fp32"),
    (None, False, False, (9, 0), 0.9, "fp32"),
])
def test_compute_precision_follows_the_flag_of_the_kernels_doing_most_of_the_flops(amp, tf32_matmul, tf32_cudnn,
                                                                                   capability, conv_share, expected):
    assert device.compute_precision(amp, tf32_matmul, tf32_cudnn, capability, conv_share) == expected


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


def test_a_gpu_backend_reads_its_mfu_peak_from_the_tf32_flags_of_the_kernels_doing_the_work(tf32_flags):
    tf32_flags(False, True)  # torch's defaults: matmuls in fp32, convolutions in TF32
    assert _FakeL4().mfu_peak(None) == ("fp32", 30.3)  # gpt, transformer, gelu_mlp: no convolution
    assert _FakeL4().mfu_peak(None, convolution_share=0.95) == ("tf32", 60.0)  # resnet
    assert _FakeL4().mfu_peak("bf16") == ("bf16", 121.0)
    tf32_flags(True, False)
    assert _FakeL4().mfu_peak(None) == ("tf32", 60.0)
    assert _FakeL4().mfu_peak(None, convolution_share=0.95) == ("fp32", 30.3)
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


# -- one GPU per pytest-xdist worker ----------------------------------------------------------------

def test_each_worker_is_pinned_to_its_own_gpu_where_there_are_enough(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "_device_count_nvml", lambda: 4)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,6,7")
    assert pin_to_one_gpu(1, 4) == "5"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "5"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,6,7")
    assert pin_to_one_gpu(0, 8) is None and os.environ["CUDA_VISIBLE_DEVICES"] == "3,5,6,7"  # too few GPUs
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert pin_to_one_gpu(0, 2) is None  # CUDA already started: the variable would change nothing


def test_no_gpu_means_no_pinning(monkeypatch):
    monkeypatch.setattr(torch.cuda, "_device_count_nvml", lambda: -1)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert pin_to_one_gpu(0, 2) is None


# -- which device a run means, and which runs it can be compared with ---------------------------------

def test_get_backend_gives_the_cpu_asked_for_and_refuses_what_it_cannot_give():
    assert isinstance(device.get_backend("cpu"), CpuBackend)
    with pytest.raises(ValueError, match="unsupported device 'meta'"):
        device.get_backend("meta")
    if not torch.cuda.is_available():
        assert isinstance(device.get_backend("auto"), CpuBackend)
        with pytest.raises(RuntimeError, match=r"device 'cuda:1' requested but torch.cuda.is_available\(\) is False"):
            device.get_backend("cuda:1")


def test_caps_from_a_recorded_gpu_identity_name_its_budget_sections_most_specific_first():
    caps = device.DeviceCaps.from_identity({"kind": "cuda", "name": "NVIDIA L4", "capability": [8, 9],
                                            "bf16_supported": True})
    assert (caps.cuda, caps.capability, caps.gpu_count, caps.profile_name) == (True, (8, 9), 1, "gpu")
    assert caps.budget_keys == ["NVIDIA L4", "sm_89", "cuda"]
    cpu = device.DeviceCaps.from_identity({"kind": "cpu", "name": "AMD EPYC"})
    assert (cpu.cuda, cpu.bf16, cpu.budget_keys, cpu.profile_name) == (False, None, ["cpu"], "cpu")
    unknown = device.DeviceCaps.from_identity({})
    assert (unknown.kind, unknown.name, unknown.cuda) == ("unknown", "unknown device", False)


@pytest.mark.parametrize(("key", "section"), [("cpu", True), ("cuda", True), ("sm_90", True), ("sm_100", True),
                                             ("NVIDIA L4", True), ("sm_9", False), ("mlp-baseline", False),
                                             ("gpu", False), ("NVIDIA RTX A6000", True), ("AMD EPYC 7B13", False),
                                             ("Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz", False),
                                             (" NVIDIA L4", False)])
def test_a_budget_section_is_a_key_some_device_answers_to(key, section):
    assert device.is_budget_section(key) is section


def test_the_live_cpu_backend_reports_what_its_runs_record():
    backend = CpuBackend(torch.device("cpu"))
    identity = backend.identity()
    assert identity["kind"] == "cpu" and identity["device"] == "cpu" and identity["capability"] is None
    assert identity["cpu_threads"] == torch.get_num_threads() and identity["torch"] == torch.__version__
    assert backend.caps() == device.DeviceCaps.from_identity(identity)
    assert backend.budget_keys() == ["cpu"] and backend.peak_memory() == device.PeakMemory()


def test_runs_are_comparable_on_the_same_device_and_on_the_cpu_with_the_same_kernels():
    avx512 = {"kind": "cpu", "name": "AMD EPYC", "cpu_capability": "AVX512", "cpu_threads": 2}
    assert device.comparable_device(avx512) == device.comparable_device({**avx512, "cpu_threads": 8})
    assert device.comparable_device(avx512) != device.comparable_device({**avx512, "cpu_capability": "AVX2"})
    h100 = {"kind": "cuda", "name": "NVIDIA H100 80GB HBM3", "cpu_capability": "AVX512"}
    assert device.comparable_device(h100) == device.comparable_device({**h100, "cpu_capability": "AVX2"})
    assert device.comparable_device(None) is None and device.comparable_device({"name": "x"}) is None


def test_a_gpu_measures_autotuning_and_deterministic_setups_in_a_fresh_process(monkeypatch):
    from trainbench.core.setups.recipes import TrainConfig

    gpu = _FakeL4()
    assert gpu.fresh_process_reason(TrainConfig()) is None and gpu.fresh_process_env(TrainConfig()) == {}
    assert "plan cache" in gpu.fresh_process_reason(TrainConfig(cudnn_benchmark=True))
    assert "CUBLAS_WORKSPACE_CONFIG" in gpu.fresh_process_reason(TrainConfig(deterministic=True))
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    assert gpu.fresh_process_env(TrainConfig(deterministic=True)) == {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")  # the user's own deterministic choice is kept
    assert gpu.fresh_process_env(TrainConfig(deterministic=True)) == {"CUBLAS_WORKSPACE_CONFIG": ":16:8"}
    assert CpuBackend(torch.device("cpu")).fresh_process_reason(TrainConfig(deterministic=True)) is None


def test_setting_cudnn_autotuning_returns_the_setting_to_restore():
    saved = torch.backends.cudnn.benchmark
    try:
        torch.backends.cudnn.benchmark = False
        assert device.set_cudnn_benchmark(True) is False and torch.backends.cudnn.benchmark is True
        assert device.set_cudnn_benchmark(False) is True and torch.backends.cudnn.benchmark is False
    finally:
        torch.backends.cudnn.benchmark = saved


@pytest.mark.parametrize(("error", "out_of_memory"), [
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), True),
    (RuntimeError("[enforce fail at alloc_cpu.cpp:119] DefaultCPUAllocator: can't allocate memory: you tried to "
                  "allocate 8589934592 bytes. Error code 12 (Cannot allocate memory)"), True),
    (RuntimeError("DefaultCPUAllocator: not enough memory: you tried to allocate 8589934592 bytes."), True),
    (MemoryError(), True),
    (RuntimeError("element 0 of tensors does not require grad and does not have a grad_fn"), False),
    (ValueError("can't allocate memory"), False),
])
def test_out_of_memory_is_told_alike_for_the_device_and_the_host(error, out_of_memory):
    assert device.is_out_of_memory(error) is out_of_memory


@pytest.mark.parametrize("name", ["NVIDIA H100 80GB HBM3 MIG 1g.10gb", "NVIDIA A100-SXM4-40GB MIG 3g.20gb",
                                  "NVIDIA H100 PCIe MIG 7g.80gb"])
def test_a_mig_slice_gets_no_peak_of_the_whole_gpu(name):
    # Its SMs are a share of the GPU's: the whole GPU's peak would make its MFU read several times too low.
    assert all(device.peak_tflops(name, dtype) is None for dtype in ("fp32", "tf32", "fp16", "bf16"))
    assert "MIG" in device.no_peak_reason(name) and "MFU not computed" in device.no_peak_reason(name)
    assert device.no_peak_reason("NVIDIA H100 80GB HBM3") is None


def test_the_sm_clock_is_read_where_this_torch_has_it_else_asked_elsewhere_and_never_raises():
    import types

    from trainbench.devices.device import NOMINAL_SM_CLOCK_KHZ, sm_clock_khz

    def refuse():
        raise RuntimeError("NVML not found")

    assert sm_clock_khz(types.SimpleNamespace(clock_rate=1_980_000), (refuse,)) == 1_980_000
    without = types.SimpleNamespace(total_memory=80 << 30)  # a build whose properties have no clock_rate (CUDA 13)
    assert sm_clock_khz(without, (refuse, lambda: 1_755_000.0)) == 1_755_000
    assert sm_clock_khz(types.SimpleNamespace(clock_rate=0), (lambda: None, lambda: 1_410_000.0)) == 1_410_000
    assert sm_clock_khz(without, (refuse, lambda: None)) == NOMINAL_SM_CLOCK_KHZ


def test_a_pinned_process_remembers_how_many_gpus_it_was_pinned_among(monkeypatch):
    monkeypatch.setattr(device, "_PINNED", {"among": 0})
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "_device_count_nvml", lambda: 4)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,6,7")
    backend = object.__new__(CudaBackend)
    monkeypatch.setattr(CudaBackend, "name", property(lambda self: "NVIDIA H100 80GB HBM3"))
    monkeypatch.setattr(CudaBackend, "capability", lambda self: (9, 0))
    monkeypatch.setattr(CudaBackend, "device_count", lambda self: 1)
    monkeypatch.setattr(CudaBackend, "supports_bf16", lambda self: True)
    assert backend.caps().pinned_among == 0
    pin_to_one_gpu(2, 4)
    assert backend.caps().pinned_among == 4
