"""Device backends: synchronization, timing, peak memory, identity and capabilities per device kind.

This is the only module that calls ``torch.cuda`` or tells device kinds apart by name.
Everything else asks a ``Backend`` (a live device) or ``DeviceCaps`` (what a device
offers, also rebuilt from a recorded identity) so the rest of the code is the same on
every device.
"""

from __future__ import annotations

import functools
import os
import platform
import shutil
import subprocess
import time
from dataclasses import dataclass

import torch

# Dense peak throughput in TFLOP/s per GPU model and compute dtype, from the vendors'
# data sheets (no sparsity). Used for MFU; a GPU missing here simply reports no MFU.
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "V100": {"fp32": 15.7, "fp16": 125.0},
    "T4": {"fp32": 8.1, "fp16": 65.0},
    "A10G": {"fp32": 31.2, "fp16": 125.0, "bf16": 125.0},
    "L4": {"fp32": 30.3, "fp16": 121.0, "bf16": 121.0},
    "A100": {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0},
    "H100": {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4},
    "H200": {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4},
}


def peak_tflops(device_name: str, dtype: str) -> float | None:
    """Peak TFLOP/s of a known GPU for ``dtype`` ("fp32", "tf32", "fp16", "bf16")."""
    for model, peaks in PEAK_TFLOPS.items():
        if model in device_name:
            return peaks.get(dtype)
    return None


@dataclass(frozen=True)
class DeviceCaps:
    """What a device offers, as requirements and reports ask it: from a live backend or a recorded identity."""

    kind: str
    name: str
    cuda: bool = False
    capability: tuple[int, int] | None = None
    gpu_count: int = 0
    bf16: bool | None = None  # None: unknown (an identity recorded without it)

    @classmethod
    def from_identity(cls, identity: dict) -> DeviceCaps:
        kind = str(identity.get("kind") or "unknown")
        capability = identity.get("capability")
        return cls(kind=kind, name=str(identity.get("name") or "unknown device"), cuda=kind == "cuda",
                   capability=tuple(capability) if capability else None,
                   gpu_count=int(identity.get("gpu_count") or (1 if kind == "cuda" else 0)),
                   bf16=identity.get("bf16_supported"))

    @property
    def profile_name(self) -> str:
        """The default size profile: ``cpu`` for the CPU, ``gpu`` for accelerators."""
        return "gpu" if self.cuda else "cpu"

    @property
    def budget_keys(self) -> list[str]:
        """Budget-file sections to try for this device, most specific first."""
        if not self.cuda:
            return ["cpu"]
        keys = [self.name]
        if self.capability:
            keys.append(f"sm_{self.capability[0]}{self.capability[1]}")
        return keys + ["cuda"]


@dataclass(frozen=True)
class PeakMemory:
    """Allocator peaks since the last reset (None where the device has no allocator stats)."""

    allocated_bytes: int | None = None
    reserved_bytes: int | None = None
    alloc_retries: int | None = None


class Backend:
    """What the measurement needs from a device kind."""

    kind: str = "abstract"
    counts_kernels = False  # the profiler sees this device's kernels
    default_dist_backend = "gloo"  # torch.distributed backend for ranks on this device kind

    def __init__(self, device: torch.device):
        self.device = device

    def synchronize(self) -> None:
        raise NotImplementedError

    @staticmethod
    def clock() -> float:
        """The host clock every timing reads (tests replace it with a clock they control)."""
        return time.perf_counter()

    def timer(self) -> float:
        """A round-boundary clock: wait for queued device work, then read ``clock``."""
        self.synchronize()
        return self.clock()

    def busy_wait(self, seconds: float) -> None:
        """Hold the host for ``seconds`` of ``clock`` (sleep granularity is coarse for millisecond steps)."""
        deadline = self.clock() + seconds
        while self.clock() < deadline:
            pass

    def caps(self) -> DeviceCaps:
        return DeviceCaps(self.kind, self.name, cuda=False, capability=self.capability(),
                          gpu_count=self.device_count(), bf16=self.supports_bf16())

    @property
    def profile_name(self) -> str:
        return self.caps().profile_name

    def profiler_activities(self) -> list:
        """What torch.profiler records on this device."""
        from torch.profiler import ProfilerActivity

        return [ProfilerActivity.CPU]

    def is_device_event(self, event) -> bool:
        """A profiler event that is a kernel on this device (none on the CPU)."""
        return False

    def peak_tflops(self, dtype: str) -> float | None:
        """Peak dense TFLOP/s for MFU; None where unknown."""
        return None

    def ddp_device_ids(self) -> list[int] | None:
        """``device_ids`` for DistributedDataParallel (None: the module's device, as on the CPU)."""
        return None

    def rank_device_spec(self, rank: int) -> str:
        """The device a rank process of a one-machine process group trains on."""
        return self.device.type

    def rank_threads(self, world_size: int) -> int | None:
        """Intra-op threads per rank (None: leave as is); CPU ranks share the cores the one-process run had."""
        return None

    def reset_peak_memory(self) -> None:
        raise NotImplementedError

    def peak_memory(self) -> PeakMemory:
        raise NotImplementedError

    def empty_cache(self) -> None:
        """Return cached allocator blocks to the device (no-op without a caching allocator)."""

    def release_memory(self) -> None:
        """Free what dropped objects still hold (cycles included) and return cached blocks to the device."""
        import gc

        gc.collect()
        self.empty_cache()

    def capability(self) -> tuple[int, int] | None:
        return None

    def device_count(self) -> int:
        return 0

    def supports_bf16(self) -> bool:
        raise NotImplementedError

    @property
    def name(self) -> str:
        raise NotImplementedError

    def budget_keys(self) -> list[str]:
        """Budget-file sections to try for this device, most specific first."""
        return self.caps().budget_keys

    def identity(self) -> dict:
        """Everything a reader needs to know which machine and software produced a number."""
        return {
            "kind": self.kind,
            "device": str(self.device),
            "name": self.name,
            "capability": list(self.capability()) if self.capability() else None,
            "bf16_supported": self.supports_bf16(),
            "torch": torch.__version__,
            "torch_git": getattr(torch.version, "git_version", None),
            "cpu_model": _cpu_model(),
            "cpu_threads": torch.get_num_threads(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "python": platform.python_version(),
        }


class CpuBackend(Backend):
    kind = "cpu"

    def synchronize(self) -> None:
        # CPU ops run to completion when they return: there is no queue to drain.
        pass

    def reset_peak_memory(self) -> None:
        pass

    def peak_memory(self) -> PeakMemory:
        # No caching allocator on CPU: peak tensor memory comes from the memory tracker.
        return PeakMemory()

    def supports_bf16(self) -> bool:
        return torch.backends.cpu.get_cpu_capability() in ("AVX512", "AVX512_BF16", "AMX") or bool(
            getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)()
        )

    @property
    def name(self) -> str:
        return _cpu_model()

    def rank_threads(self, world_size: int) -> int | None:
        return max(1, torch.get_num_threads() // world_size)


class CudaBackend(Backend):
    kind = "cuda"
    counts_kernels = True
    default_dist_backend = "nccl"

    def __init__(self, device: torch.device):
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        super().__init__(device)

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def reset_peak_memory(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)

    def peak_memory(self) -> PeakMemory:
        stats = torch.cuda.memory_stats(self.device)
        return PeakMemory(
            allocated_bytes=torch.cuda.max_memory_allocated(self.device),
            reserved_bytes=torch.cuda.max_memory_reserved(self.device),
            alloc_retries=stats.get("num_alloc_retries", 0),
        )

    def empty_cache(self) -> None:
        torch.cuda.empty_cache()

    def capability(self) -> tuple[int, int]:
        return tuple(torch.cuda.get_device_capability(self.device))

    def device_count(self) -> int:
        return torch.cuda.device_count()

    def supports_bf16(self) -> bool:
        # Native bf16 only: by default PyTorch also counts emulation (V100, T4), where amp_bf16 would
        # measure emulated kernels.
        return torch.cuda.is_bf16_supported(including_emulation=False)

    @property
    def name(self) -> str:
        return torch.cuda.get_device_name(self.device)

    def caps(self) -> DeviceCaps:
        return DeviceCaps(self.kind, self.name, cuda=True, capability=self.capability(),
                          gpu_count=self.device_count(), bf16=self.supports_bf16())

    def profiler_activities(self) -> list:
        from torch.profiler import ProfilerActivity

        return [ProfilerActivity.CPU, ProfilerActivity.CUDA]

    def is_device_event(self, event) -> bool:
        return event.device_type == torch.autograd.DeviceType.CUDA

    def peak_tflops(self, dtype: str) -> float | None:
        return peak_tflops(self.name, dtype)

    def ddp_device_ids(self) -> list[int] | None:
        return [self.device.index]

    def rank_device_spec(self, rank: int) -> str:
        return f"cuda:{rank}"

    def identity(self) -> dict:
        ident = super().identity()
        props = torch.cuda.get_device_properties(self.device)
        ident.update(
            cuda=torch.version.cuda,
            cudnn=torch.backends.cudnn.version(),
            driver=_nvidia_driver_version(),
            total_memory_bytes=props.total_memory,
            multiprocessors=props.multi_processor_count,
            tensor_cores=self.capability() >= (7, 0),
            gpu_count=self.device_count(),
        )
        return ident


def cuda_available() -> bool:
    return torch.cuda.is_available()


def host_profiler_activities() -> list:
    """Profiler activities for a profiler started outside a measured case (a debug API left on)."""
    from torch.profiler import ProfilerActivity

    return [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda_available() else [])


def set_cudnn_benchmark(enabled: bool) -> bool:
    """Set cuDNN autotuning; returns the previous value so callers can restore it."""
    previous = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = enabled
    return previous


def get_backend(spec: str | None = None) -> Backend:
    """A backend for ``spec`` ("auto"/None, "cpu", "cuda", "cuda:1").

    "auto" picks CUDA when available, else the CPU. Asking for CUDA where there is
    none is an error, not a silent fall-back to the CPU.
    """
    if spec in (None, "", "auto"):
        spec = "cuda" if cuda_available() else "cpu"
    device = torch.device(spec)
    if device.type == "cpu":
        return CpuBackend(device)
    if device.type == "cuda":
        if not cuda_available():
            raise RuntimeError(f"device {spec!r} requested but torch.cuda.is_available() is False")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise RuntimeError(f"device {spec!r} requested but only {torch.cuda.device_count()} CUDA device(s) exist")
        return CudaBackend(device)
    raise ValueError(f"unsupported device {spec!r}: expected 'auto', 'cpu', 'cuda' or 'cuda:N'")


@functools.lru_cache(maxsize=1)  # read once: every measurement records the device identity
def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@functools.lru_cache(maxsize=1)  # one NVML call or nvidia-smi run per process, not one per measurement
def _nvidia_driver_version() -> str | None:
    try:
        import pynvml  # optional

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else version
    except Exception:  # noqa: BLE001,S110 - pynvml is optional and fails in many ways; nvidia-smi is the fallback
        pass
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=False, env={**os.environ, "LC_ALL": "C"},
        )
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None
