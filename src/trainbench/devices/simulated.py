"""A simulated GPU: a fleet member (``trainbench.devices.fleet``) presented as a CUDA device, with no CUDA.

Everything decided before a kernel runs asks this backend what a live ``CudaBackend`` would
answer: its capabilities and identity, budget sections, memory (the out-of-memory gate), MFU
peak, fresh-process needs and the device ids of DP/DDP/FSDP ranks. Where the CUDA backend's
answer does not touch the driver, it is the very same function. Nothing is measured: a
timer, a synchronize or an allocator statistic raises ``NothingRunsHere``.

Its ``device`` is ``cuda:N``, on which no tensor can be made here. Memory predictions run under
FakeTensorMode on the CPU (``prediction_backend``), as a CPU runner's GPU-profile predictions do:
they depend on the profile's sizes, not on the GPU.
"""

from __future__ import annotations

import torch

from trainbench.devices.device import (
    Backend,
    CpuBackend,
    CudaBackend,
    DeviceCaps,
    PeakMemory,
    build_arch_list,
    compute_precision,
    parallel_devices,
    unsupported_arch,
)
from trainbench.devices.fleet import DEFAULT_WHEEL_ARCHS, DEFAULT_WHEEL_CUDA, Gpu


def prediction_backend() -> Backend:
    """Where a simulated GPU's memory predictions run (fake tensors on the CPU)."""
    return CpuBackend(torch.device("cpu"))


class NothingRunsHere(RuntimeError):
    """Something asked a simulated GPU to run or time work."""


def wheel_arch_list() -> list[str]:
    """The architectures the night's torch has kernels for: this build's, or the default wheel's on a CPU-only build."""
    return build_arch_list() or list(DEFAULT_WHEEL_ARCHS)


class SimulatedGpu(Backend):
    """GPU ``index`` of a machine with ``gpu.count`` of ``gpu``; refused, as ``CudaBackend`` is, by a build
    without kernels for it."""

    kind = "cuda"
    counts_kernels = True
    has_allocator_peaks = True
    default_dist_backend = "nccl"
    profiler_sort_key = "self_device_time_total"

    def __init__(self, gpu: Gpu, index: int = 0, arch_list: list[str] | None = None):
        super().__init__(torch.device("cuda", index))
        self.gpu = gpu
        self.index = index
        unsupported = unsupported_arch(gpu.capability, wheel_arch_list() if arch_list is None else arch_list)
        if unsupported:
            raise RuntimeError(f"cuda:{index} ({gpu.name}): {unsupported}")

    # -- nothing is measured ---------------------------------------------------------------------
    def _refuse(self, what: str):
        raise NothingRunsHere(f"{what} on a simulated {self.gpu.name}: nothing runs or is timed on it; "
                              "measure on the GPU itself (--trainbench-device=cuda)")

    def synchronize(self) -> None:
        self._refuse("synchronize")

    def reset_peak_memory(self) -> None:
        self._refuse("reset_peak_memory")

    def peak_memory(self) -> PeakMemory:
        self._refuse("peak_memory")

    # -- what the driver would report ------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.gpu.name

    def capability(self) -> tuple[int, int]:
        return self.gpu.capability

    def device_count(self) -> int:
        return self.gpu.count

    def supports_bf16(self) -> bool:
        return self.gpu.bf16

    def total_memory_bytes(self) -> int | None:
        return self.gpu.memory_bytes

    def memory_bandwidth_gbs(self) -> float | None:
        return self.gpu.bandwidth_gbs

    def caps(self) -> DeviceCaps:
        return DeviceCaps(self.kind, self.name, cuda=True, capability=self.capability(), gpu_count=self.device_count(),
                          bf16=self.supports_bf16())

    def mfu_peak(self, amp: str | None, convolution_share: float = 0.0) -> tuple[str, float | None]:
        precision = compute_precision(amp, self.gpu.tf32_matmul, self.gpu.tf32_cudnn, self.capability(),
                                      convolution_share)
        return precision, self.gpu.peak_tflops(precision)

    def identity(self) -> dict:
        ident = super().identity()
        ident.update(device=f"cuda:{self.index}", simulated=True, total_memory_bytes=self.gpu.memory_bytes,
                     multiprocessors=self.gpu.multiprocessors, tensor_cores=self.capability() >= (7, 0),
                     cuda_matmul_allow_tf32=self.gpu.tf32_matmul, cudnn_allow_tf32=self.gpu.tf32_cudnn,
                     gpu_count=self.gpu.count)
        return ident

    # -- the CUDA backend's own decisions --------------------------------------------------------
    fresh_process_reason = CudaBackend.fresh_process_reason
    fresh_process_env = CudaBackend.fresh_process_env
    rank_device_spec = CudaBackend.rank_device_spec
    ddp_device_ids = CudaBackend.ddp_device_ids

    def parallel_device_ids(self, count: int) -> list[int]:
        return parallel_devices(self.index, count, self.gpu.count)


def simulated_runtime(gpu: Gpu, arch_list: list[str] | None = None) -> dict:
    """``device.cuda_runtime()``'s answer on a machine with ``gpu.count`` of ``gpu`` and this torch (its arch list:
    ``arch_list``, default this build's or the default wheel's)."""
    archs = wheel_arch_list() if arch_list is None else list(arch_list)
    devices = [{"index": i, "name": gpu.name, "capability": gpu.capability, "total_memory_bytes": gpu.memory_bytes,
                "unsupported": unsupported_arch(gpu.capability, archs)} for i in range(gpu.count)]
    return {"torch": torch.__version__, "torch_cuda": torch.version.cuda or DEFAULT_WHEEL_CUDA, "arch_list": archs,
            "available": True, "devices": devices, "driver": "(simulated)", "error": None}
