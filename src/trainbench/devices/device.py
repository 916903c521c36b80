"""Device backends: synchronization, timing, peak memory, identity and capabilities per device kind.

This is the only module that calls ``torch.cuda`` or tells device kinds apart by name (with ``devices.caps``, its
torch-free half: what a device offers, budgets' section names, peak throughput by GPU name).
Everything else asks a ``Backend`` (a live device) or ``DeviceCaps`` (what a device
offers, also rebuilt from a recorded identity) so the rest of the code is the same on
every device.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import platform
import shutil
import subprocess
import time
from collections.abc import Callable
from importlib import metadata
from typing import Any

import torch
from torch.profiler import ProfilerActivity

from trainbench.devices.caps import (  # noqa: F401  (re-exported: what a device offers, torch-free)
    BUDGET_SECTION_EXAMPLES,
    MOSTLY_CONVOLUTION,
    NO_PEAK,
    PEAK_TFLOPS,
    DeviceCaps,
    PeakMemory,
    budget_section_problem,
    comparable_device,
    compute_precision,
    cpu_model,
    gpu_name_problem,
    is_budget_section,
    no_peak_reason,
    peak_tflops,
)
from trainbench.devices.gpu_state import nvml
from trainbench.devices.host import is_device_spec

class Backend:
    """What the measurement needs from a device kind."""

    kind: str = "abstract"
    counts_kernels = False  # the profiler sees this device's kernels
    has_allocator_peaks = False  # a caching allocator records peaks (the peaks pass measures something)
    default_dist_backend = "gloo"  # torch.distributed backend for ranks on this device kind
    profiler_sort_key = "self_cpu_time_total"  # the operators' table of a profile trace, heaviest first
    # A process forked from one that used this device can use it too (a CUDA context does not survive a fork).
    usable_after_fork = False

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

    def cpu_clock(self) -> float | None:
        """CPU seconds this process has used, where they are the step's work; None where the host mostly waits for
        the device (a CUDA synchronize spins, so its CPU time is wall time)."""
        return None

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
        return [ProfilerActivity.CPU]

    @contextlib.contextmanager
    def memory_history(self, snapshot_path):
        """Record the allocator's history while the block runs and dump it to ``snapshot_path``
        (a device without one, like the CPU, records nothing and writes no file)."""
        yield

    def allocator_history(self, run: Callable[[], None]) -> list[dict] | None:
        """The caching allocator's history (alloc and free entries with their Python and C++ frames) while ``run`` runs, or None
        on a device without one (the CPU)."""
        return None

    def mfu_peak(self, amp: str | None, convolution_share: float = 0.0) -> tuple[str, float | None]:
        """The precision a step with autocast dtype ``amp`` computes in (``convolution_share``: the share of its
        FLOPs in convolutions), and this device's peak dense TFLOP/s for it (None where unknown: no MFU)."""
        return (amp or "fp32"), None

    def is_device_kernel(self, event) -> bool:
        """A profiler event that is a compute kernel on this device (none on the CPU)."""
        return False

    def blocking_copy(self, src: torch.Tensor, dst_device: torch.device, non_blocking: bool) -> bool:
        """Whether copying ``src`` to ``dst_device`` makes the host wait for the device (a sync)."""
        return False

    def elapsed_since(self, started: float) -> float:
        """Wall seconds since ``started`` (a ``clock`` reading) including the device work queued since."""
        self.synchronize()
        return self.clock() - started

    def ddp_device_ids(self) -> list[int] | None:
        """``device_ids`` for DistributedDataParallel (None: the module's device, as on the CPU)."""
        return None

    def fresh_process_reason(self, config) -> str | None:
        """Why a setup with ``config`` must be measured in a new process on this device, or None."""
        return None

    def fresh_process_env(self, config) -> dict[str, str]:
        """Environment a fresh process for ``config`` starts with (set before the device libraries start)."""
        return {}

    def parallel_device_ids(self, count: int) -> list[int]:
        """The device indices a multi-device case uses (DataParallel replicas, DDP ranks)."""
        raise RuntimeError(f"{self.kind} has no multi-device data parallelism")

    def rank_device_spec(self, rank: int) -> str:
        """The device a rank process of a one-machine process group trains on."""
        return self.device.type

    def rank_threads(self, world_size: int) -> int:
        """Intra-op threads per rank: the ranks share the cores the one-process run has (torchrun's default of one
        thread a rank would leave a one-process baseline, DataParallel's on a GPU, every core against their one)."""
        return max(1, torch.get_num_threads() // world_size)

    def ideal_ddp_speedup(self, world_size: int) -> float:
        """What ``world_size`` ranks would gain over one process training the same global batch, if scaling were
        perfect: one device each, so ``world_size``x (the CPU's ranks split one process's cores: 1x)."""
        return float(world_size)

    def reset_peak_memory(self) -> None:
        raise NotImplementedError

    def peak_memory(self) -> PeakMemory:
        raise NotImplementedError

    def empty_cache(self) -> None:
        """Return cached allocator blocks to the device (no-op without a caching allocator)."""

    def reserved_bytes(self) -> int | None:
        """Memory the allocator holds now (None without a caching allocator)."""
        return None

    def total_memory_bytes(self) -> int | None:
        """The device's memory, where cases must fit in it (None: host memory, not checked)."""
        return None

    def memory_bandwidth_gbs(self) -> float | None:
        """Peak device-memory bandwidth in GB/s (the roofline's memory term), where known: a simulated GPU's data
        sheet figure (``fleet.Gpu.bandwidth_gbs``); None on live devices, which do not report it."""
        return None

    def release_memory(self) -> None:
        """Free what dropped objects still hold (cycles included) and return cached blocks to the device."""
        gc.collect()
        self.empty_cache()

    caching_allocator = False  # freed blocks stay reserved for the next allocation (CUDA's caching allocator)

    def release_cache(self) -> None:
        """Before a setup is built: what earlier setups left cached returned to the device, so the new one's
        allocator figures (reserved peak, reserved between steps) do not depend on which cases ran before. Nothing
        to return without a caching allocator (the CPU: no collection either)."""
        if self.caching_allocator:
            self.release_memory()

    def kept_while_others_run(self) -> str | None:
        """What this process keeps on its device while processes it started use the same device (after
        ``release_memory``), for their results' notes; None where it keeps nothing there."""
        return None

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
            "cpu_model": cpu_model(),
            "cpu_threads": torch.get_num_threads(),
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "python": platform.python_version(),
        }


class CpuBackend(Backend):
    kind = "cpu"
    usable_after_fork = True

    def synchronize(self) -> None:
        # CPU ops run to completion when they return: there is no queue to drain.
        pass

    def cpu_clock(self) -> float | None:
        # Every thread of the process (intra-op threads included); loader worker processes are not counted.
        return time.process_time()

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
        return cpu_model()

    def ideal_ddp_speedup(self, world_size: int) -> float:
        return 1.0  # the ranks share the cores one process had (rank_threads)


class CudaBackend(Backend):
    kind = "cuda"
    counts_kernels = True
    has_allocator_peaks = True
    default_dist_backend = "nccl"
    profiler_sort_key = "self_device_time_total"
    caching_allocator = True

    def __init__(self, device: torch.device):
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        super().__init__(device)
        unsupported = unsupported_arch(self.capability(), torch.cuda.get_arch_list())
        if unsupported:
            raise RuntimeError(f"{device} ({self.name}): {unsupported}")
        # The current device is where every later context, pinned-memory thread and cache goes:
        # left at 0, a run on cuda:1 would also create a context and hold memory on GPU 0.
        torch.cuda.set_device(self.device)

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def reset_peak_memory(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)
        torch.cuda.reset_accumulated_memory_stats(self.device)  # num_alloc_retries counts from here, not process start

    def peak_memory(self) -> PeakMemory:
        stats = torch.cuda.memory_stats(self.device)
        return PeakMemory(
            allocated_bytes=torch.cuda.max_memory_allocated(self.device),
            reserved_bytes=torch.cuda.max_memory_reserved(self.device),
            alloc_retries=stats.get("num_alloc_retries", 0),
        )

    def empty_cache(self) -> None:
        torch.cuda.empty_cache()

    def reserved_bytes(self) -> int | None:
        return torch.cuda.memory_reserved(self.device)

    def kept_while_others_run(self) -> str | None:
        if not torch.cuda.is_initialized():
            return None
        # The context cannot be given back while this process lives; its cache can, and was.
        return (f"the parent process keeps its CUDA context on {self.device} (its cache released before: "
                f"{torch.cuda.memory_reserved(self.device) / 2**20:.0f} MiB still reserved)")

    def time_sleep_kernel(self, seconds: float) -> tuple[float, float]:
        """A spin kernel of about ``seconds``, timed by ``timer`` (what every round reads) and by CUDA events.

        A self-check of the timing: the two must agree, or round times do not measure device work.
        """
        def record() -> torch.cuda.Event:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event

        return time_with_events(self.timer, record, lambda start, end: start.elapsed_time(end) / 1e3,
                                lambda: self.sleep_kernel(seconds))

    def sleep_kernel(self, seconds: float) -> None:
        """Queue a spin kernel of about ``seconds`` of device time (no host wait): known device work for
        self-checks, and a slowdown planted in one op."""
        torch.cuda._sleep(int(seconds * self.sm_clock_khz() * 1e3))

    def sm_clock_khz(self) -> float:
        """The SM clock the spin kernel counts cycles of (``sm_clock_khz``), read once per device."""
        return _cached_sm_clock_khz(self.device.index, lambda: sm_clock_khz(
            torch.cuda.get_device_properties(self.device),
            (lambda: _nvml_max_sm_clock_khz(torch.cuda.get_device_properties(self.device).uuid),
             lambda: _timed_sm_clock_khz(self.device))))

    def total_memory_bytes(self) -> int | None:
        return torch.cuda.get_device_properties(self.device).total_memory

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
                          gpu_count=self.device_count(), bf16=self.supports_bf16(), pinned_among=_PINNED["among"])

    def profiler_activities(self) -> list:
        return [ProfilerActivity.CPU, ProfilerActivity.CUDA]

    @contextlib.contextmanager
    def memory_history(self, snapshot_path):
        # Every allocation and free with its stack, for pytorch.org/memory_viz; off again afterwards.
        torch.cuda.memory._record_memory_history(max_entries=100_000, device=self.device)
        try:
            yield
            torch.cuda.memory._dump_snapshot(str(snapshot_path))
        finally:
            torch.cuda.memory._record_memory_history(enabled=None, device=self.device)

    def allocator_history(self, run: Callable[[], None]) -> list[dict] | None:
        # C++ frames too: autograd's engine thread runs backward without Python frames, and only its C++ stack names
        # the autograd node (MmBackward0) an allocation is for. Symbolized by dladdr (function names, no DWARF
        # lookups: addr2line over libtorch_cuda would take minutes) unless the user chose a mode.
        os.environ.setdefault("TORCH_SYMBOLIZE_MODE", "dladdr")
        try:
            torch.cuda.memory._record_memory_history(max_entries=1_000_000, context="alloc", stacks="all",
                                                     device=self.device)
        except RuntimeError:  # no C++ unwinder on this platform: Python frames only
            torch.cuda.memory._record_memory_history(max_entries=1_000_000, context="alloc", stacks="python",
                                                     device=self.device)
        try:
            run()
            self.synchronize()
            snapshot = torch.cuda.memory._snapshot(self.device)
        finally:
            torch.cuda.memory._record_memory_history(enabled=None, device=self.device)
        traces = snapshot.get("device_traces") or []
        index = self.device.index or 0
        return list(traces[index]) if index < len(traces) else []

    def is_device_kernel(self, event) -> bool:
        return is_cuda_kernel_event(event)

    def mfu_peak(self, amp: str | None, convolution_share: float = 0.0) -> tuple[str, float | None]:
        precision = compute_precision(amp, torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
                                      self.capability(), convolution_share)
        return precision, peak_tflops(self.name, precision)

    def blocking_copy(self, src: torch.Tensor, dst_device: torch.device, non_blocking: bool) -> bool:
        return is_blocking_copy(src.device.type, dst_device.type, non_blocking, src.device.type == "cpu" and src.is_pinned())

    def ddp_device_ids(self) -> list[int] | None:
        return [self.device.index]

    def fresh_process_reason(self, config) -> str | None:
        # state the CUDA libraries read once per process (the config's knob table: Knob.fresh_process)
        for _, why in config.turned("fresh_process"):
            return why
        return None

    def fresh_process_env(self, config) -> dict[str, str]:
        env = {}
        for _, (variable, accepted) in config.turned("fresh_env"):  # a value given in the environment, if accepted
            given = os.environ.get(variable)
            env[variable] = given if given in accepted else accepted[0]
        return env

    def parallel_device_ids(self, count: int) -> list[int]:
        """The ``count`` GPUs a multi-GPU case uses, starting at this one: DataParallel and DDP ranks use the same."""
        return parallel_devices(self.device.index, count, self.device_count())

    def rank_device_spec(self, rank: int) -> str:
        return f"cuda:{self.parallel_device_ids(rank + 1)[rank]}"

    def identity(self) -> dict:
        ident = super().identity()
        props = torch.cuda.get_device_properties(self.device)
        ident.update(
            cuda=torch.version.cuda,
            cudnn=torch.backends.cudnn.version(),
            cublas=_cublas_version(),
            nccl=_nccl_version(),
            driver=_nvidia_driver_version(),
            total_memory_bytes=props.total_memory,
            multiprocessors=props.multi_processor_count,
            tensor_cores=self.capability() >= (7, 0),
            cuda_matmul_allow_tf32=torch.backends.cuda.matmul.allow_tf32,
            cudnn_allow_tf32=torch.backends.cudnn.allow_tf32,
            gpu_count=self.device_count(),
        )
        return ident


# What the spin kernel assumes where no clock can be read: its duration is then only approximate, which the
# self-checks that use it (timer against device events) do not depend on.
NOMINAL_SM_CLOCK_KHZ = 1_500_000.0


def sm_clock_khz(props, fallbacks: tuple[Callable[[], float | None], ...] = ()) -> float:
    """A GPU's SM clock in kHz: ``clock_rate`` of its properties where this torch has it (CUDA 13 dropped
    ``cudaDeviceProp::clockRate``, so a build may not), else the first of ``fallbacks`` that answers (NVML's maximum
    SM clock, a spin kernel timed by device events), else ``NOMINAL_SM_CLOCK_KHZ``. Never raises."""
    clock = getattr(props, "clock_rate", None)
    if clock:
        return float(clock)
    for fallback in fallbacks:
        try:
            clock = fallback()
        except Exception:  # noqa: BLE001 - NVML missing or refusing, a failed launch: the next way answers
            clock = None
        if clock:
            return float(clock)
    return NOMINAL_SM_CLOCK_KHZ


_SM_CLOCKS: dict[int | None, float] = {}


def _cached_sm_clock_khz(index: int | None, read: Callable[[], float]) -> float:
    if index not in _SM_CLOCKS:
        _SM_CLOCKS[index] = read()
    return _SM_CLOCKS[index]


def _nvml_max_sm_clock_khz(uuid) -> float | None:
    pynvml = nvml()
    text = str(uuid)
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByUUID(text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}")
        return pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM) * 1e3  # MHz
    finally:
        pynvml.nvmlShutdown()


def _timed_sm_clock_khz(device: torch.device, cycles: int = 20_000_000) -> float:
    """Cycles per millisecond of a spin kernel timed by device events (a first, short launch loads the module)."""
    with torch.cuda.device(device):
        torch.cuda._sleep(1000)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        return cycles / start.elapsed_time(end)


def time_with_events(timer: Callable[[], float], record_event: Callable[[], Any],
                     event_seconds: Callable[[Any, Any], float], work: Callable[[], None]) -> tuple[float, float]:
    """Seconds of ``work`` by the round timer and by device events recorded around it on the device's queue.

    The timer reads each side the way a round does (``Backend.timer``); the events see only the device's time
    line, so the two agree when, and only when, the timer waits for queued work at both ends.
    """
    started = timer()
    start = record_event()
    work()
    end = record_event()
    return timer() - started, event_seconds(start, end)


def timer_event_disagreement(timer_s: float, event_s: float) -> str | None:
    """Why the round timer does not measure the device work the events saw, or None where the two agree.

    The timer adds a synchronize and a launch (tens of microseconds) to what the events see: 5% plus 0.5 ms.
    """
    if event_s <= 0:
        return f"the events saw no device time ({event_s * 1e3:.3f} ms)"
    if abs(timer_s - event_s) > 0.05 * event_s + 0.5e-3:
        return f"timer {timer_s * 1e3:.3f} ms, events {event_s * 1e3:.3f} ms"
    return None


def cuda_available() -> bool:
    return torch.cuda.is_available()


def build_arch_list() -> list[str]:
    """The GPU architectures this torch build has kernels for (empty for a CPU-only build); starts no CUDA."""
    return torch.cuda.get_arch_list()


_PINNED = {"among": 0}  # what pin_to_one_gpu did to this process: the GPUs visible before (0: nothing pinned)


def pin_to_one_gpu(index: int, count: int) -> str | None:
    """Make GPU ``index`` of the visible ones the only GPU this process sees, when there are at least ``count``.

    For ``count`` processes sharing a host (pytest-xdist workers), one GPU each. It sets
    ``CUDA_VISIBLE_DEVICES``, which CUDA reads once, at its start: so the GPUs are counted
    through NVML (no CUDA start), and nothing is pinned once CUDA has started in this process.
    Returns the GPU pinned (its entry of the visible list), or None.
    """
    if torch.cuda.is_initialized():
        return None
    nvml_count = getattr(torch.cuda, "_device_count_nvml", lambda: -1)()  # honours CUDA_VISIBLE_DEVICES
    if nvml_count < count or index >= nvml_count:
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [v.strip() for v in visible.split(",")] if visible else [str(i) for i in range(nvml_count)]
    os.environ["CUDA_VISIBLE_DEVICES"] = ids[index]
    _PINNED["among"] = nvml_count  # a multi-GPU case then skips saying why it sees one (eligibility)
    return ids[index]


def parallel_devices(first: int, count: int, total: int) -> list[int]:
    """``count`` device indices from ``first`` on, wrapping around: a run on cuda:1 of two GPUs uses [1, 0]."""
    if count > total:
        raise RuntimeError(f"{count} GPUs needed, {total} present")
    return [(first + i) % total for i in range(count)]


def unsupported_arch(capability: tuple[int, int], arch_list: list[str]) -> str | None:
    """Why this torch build has no kernels for a GPU of ``capability``, or None when it has.

    A build runs on its own ``sm_XY`` targets, on later GPUs of the same major version
    (binary compatibility), and JIT-compiles ``compute_XY`` PTX for any GPU at least that new.
    """
    major, minor = capability
    for arch in arch_list:
        kind, _, number = arch.partition("_")
        variant = number[-1] if number[-1:] in ("a", "f") else ""
        number = number.rstrip("af")
        if kind not in ("sm", "compute") or not number.isdigit():
            continue
        built = (int(number[:-1]), int(number[-1]))
        if variant == "a":  # sm_90a / compute_90a: that GPU only
            runs = built == (major, minor)
        elif kind == "sm" or variant == "f":  # SASS and family code: later minors of the same major
            runs = built[0] == major and built[1] <= minor
        else:  # portable PTX: JIT-compiled for any GPU at least that new
            runs = built <= (major, minor)
        if runs:
            return None
    return (f"this torch build ({torch.__version__}, CUDA {torch.version.cuda}) has kernels for "
            f"{' '.join(arch_list) or 'no GPU'}, none that runs on sm_{major}{minor}: install a wheel built for "
            "this GPU (docs/ci-and-gpu.md, \"A GPU runner\")")


# How torch's host allocator says it ran out (torch.OutOfMemoryError is the CUDA and XPU allocators' own type).
_HOST_OUT_OF_MEMORY = ("DefaultCPUAllocator: can't allocate memory", "DefaultCPUAllocator: not enough memory")


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is a device's or the host's allocator running out of memory."""
    if isinstance(error, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(error, RuntimeError) and any(message in str(error) for message in _HOST_OUT_OF_MEMORY)


def is_cuda_kernel_event(event) -> bool:
    """A compute kernel in a CUDA profile: not a memcpy, a memset or a user annotation's GPU range."""
    if event.device_type != torch.autograd.DeviceType.CUDA or getattr(event, "is_user_annotation", False):
        return False
    return not event.name.startswith(("Memcpy", "Memset", "cudaMemcpy", "cudaMemset"))


def is_blocking_copy(src_type: str, dst_type: str, non_blocking: bool, src_pinned: bool) -> bool:
    """A copy between host and GPU that the host waits for: a blocking copy to the host, and a
    host-to-GPU copy unless it is non_blocking from pinned memory (a pageable source is staged by
    the driver, which returns only when the copy is done)."""
    if src_type == dst_type or "cuda" not in (src_type, dst_type):
        return False
    if dst_type == "cpu":  # non_blocking to the host copies into pinned memory without waiting
        return not non_blocking
    return not (non_blocking and src_pinned)


def cuda_runtime() -> dict:
    """What this process's torch build and driver offer, for ``doctor``: never raises."""
    info: dict = {"torch": torch.__version__, "torch_cuda": torch.version.cuda, "arch_list": [], "available": False,
                  "devices": [], "driver": None, "error": None}
    if torch.version.cuda is None:
        return info
    try:
        info["arch_list"] = torch.cuda.get_arch_list()
        info["driver"] = _nvidia_driver_version()
        info["available"] = torch.cuda.is_available()
        for index in range(torch.cuda.device_count() if info["available"] else 0):
            props = torch.cuda.get_device_properties(index)
            capability = (props.major, props.minor)
            info["devices"].append({"index": index, "name": props.name, "capability": capability,
                                    "uuid": str(getattr(props, "uuid", "") or ""),  # matches the driver's GPU
                                    "total_memory_bytes": props.total_memory,
                                    "unsupported": unsupported_arch(capability, info["arch_list"])})
    except Exception as e:  # noqa: BLE001 - a broken driver raises many kinds; doctor reports it as it is
        info["error"] = f"{type(e).__name__}: {e}"
    return info


def host_profiler_activities() -> list:
    """Profiler activities for a profiler started outside a measured case (a debug API left on)."""
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
    if not is_device_spec(spec):  # torch.device's own errors are many and may span lines ("x\ny")
        raise ValueError(f"unsupported device {spec!r}: expected 'auto', 'cpu', 'cuda' or 'cuda:N'")
    device = torch.device(spec)
    if device.type == "cpu":
        return CpuBackend(device)
    if device.type == "cuda":
        if not cuda_available():
            raise RuntimeError(f"device {spec!r} requested but torch.cuda.is_available() is False")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise RuntimeError(f"device {spec!r} requested but only {torch.cuda.device_count()} CUDA device(s) exist")
        return CudaBackend(device)
    raise ValueError(f"unsupported device {spec!r}: no backend serves it")  # a kind is_device_spec admits, none here


def _cublas_version() -> str | None:
    """cuBLAS's version where it came as a pip wheel (torch's own dependency); None where it is the system's."""
    for package in ("nvidia-cublas", "nvidia-cublas-cu13", "nvidia-cublas-cu12"):
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    return None


def _nccl_version() -> str | None:
    try:
        version = torch.cuda.nccl.version()
    except Exception:  # noqa: BLE001 - a build without NCCL raises in several ways
        return None
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


@functools.lru_cache(maxsize=1)  # one NVML call or nvidia-smi run per process, not one per measurement
def _nvidia_driver_version() -> str | None:
    try:
        pynvml = nvml()
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
