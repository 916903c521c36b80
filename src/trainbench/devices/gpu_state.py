"""What the NVIDIA driver says about each GPU's state that a benchmark depends on: other processes on it,
MIG mode, and its clocks.

Asked through NVML (``pynvml``, from nvidia-ml-py, when importable), else ``nvidia-smi`` when on
PATH; ``None`` where neither answers (no GPU, no driver, a CPU runner). Nothing here starts CUDA:
the driver's management interface answers without a CUDA context. The parsers take nvidia-smi's
text so tests hand them fake machines.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

# nvidia-smi --query-gpu fields, in the order ``_parse_gpus`` reads them.
GPU_FIELDS = ("index", "uuid", "name", "mig.mode.current", "clocks.sm", "clocks.max.sm", "clocks.applications.graphics",
              "clocks.default_applications.graphics")
APPS_FIELDS = ("gpu_uuid", "pid", "used_memory")


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_mib: int | None  # None: the driver does not say (e.g. without the rights to see it)


@dataclass(frozen=True)
class GpuState:
    """One GPU as the driver numbers it (PCI bus order: not always CUDA's order)."""

    index: int
    uuid: str
    name: str
    mig: bool | None  # MIG mode on; None: the GPU has no MIG
    sm_clock_mhz: int | None
    max_sm_clock_mhz: int | None
    app_clock_mhz: int | None  # the applications clock set (``nvidia-smi -ac``)
    default_app_clock_mhz: int | None
    processes: tuple[GpuProcess, ...] = ()  # other compute processes on it: PIDs of this PID namespace, this one left out
    # Compute processes whose PIDs this PID namespace has not (the driver numbers them in the host's, a container
    # does not): this run's own or another's, which cannot be told
    unmatched: tuple[GpuProcess, ...] = ()

    @property
    def app_clocks_set(self) -> bool | None:
        """Whether someone set the applications clocks away from the default (None: unknown)."""
        if self.app_clock_mhz is None or self.default_app_clock_mhz is None:
            return None
        return self.app_clock_mhz != self.default_app_clock_mhz


def same_gpu(uuid_a: str | None, uuid_b: str | None) -> bool:
    """Whether two UUIDs name one GPU: NVML writes "GPU-<uuid>", torch the bare UUID."""
    def bare(uuid: str | None) -> str:
        return (uuid or "").strip().lower().removeprefix("gpu-")

    return bool(bare(uuid_a)) and bare(uuid_a) == bare(uuid_b)


def _number(text: str) -> int | None:
    head = text.strip().split(" ", 1)[0]
    return int(head) if head.isdigit() else None


def _parse_gpus(text: str) -> list[GpuState]:
    """``nvidia-smi --query-gpu=<GPU_FIELDS> --format=csv,noheader,nounits`` lines."""
    gpus = []
    for line in text.strip().splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != len(GPU_FIELDS) or _number(fields[0]) is None:
            continue
        index, uuid, name, mig, sm, max_sm, app, default_app = fields
        gpus.append(GpuState(int(index), uuid, name, {"Enabled": True, "Disabled": False}.get(mig), _number(sm),
                             _number(max_sm), _number(app), _number(default_app)))
    return gpus


def _parse_apps(text: str) -> dict[str, list[GpuProcess]]:
    """``nvidia-smi --query-compute-apps=<APPS_FIELDS> --format=csv,noheader,nounits`` lines, by GPU UUID."""
    apps: dict[str, list[GpuProcess]] = {}
    for line in text.strip().splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != len(APPS_FIELDS) or _number(fields[1]) is None:
            continue
        apps.setdefault(fields[0], []).append(GpuProcess(int(fields[1]), _number(fields[2])))
    return apps


def own_pids(status: str = "/proc/self/status") -> frozenset[int]:
    """This process's PIDs: its PID in each nested PID namespace its /proc shows (``NSpid``), else ``os.getpid()``."""
    try:
        with open(status) as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return frozenset(int(pid) for pid in line.split()[1:]) | {os.getpid()}
    except OSError:
        pass
    return frozenset({os.getpid()})


def pid_visible(pid: int, proc: str = "/proc") -> bool:
    """Whether ``pid`` is a process of this PID namespace (True where there is no /proc to ask: off Linux)."""
    return os.path.exists(os.path.join(proc, str(pid))) or not os.path.exists(os.path.join(proc, "self"))


def split_processes(found: Iterable[GpuProcess], own: frozenset[int],
                    visible: Callable[[int], bool] | None = None) -> tuple[tuple[GpuProcess, ...], tuple[GpuProcess, ...]]:
    """The driver's processes on a GPU as (other processes, processes that cannot be told from this run's own).

    The driver gives PIDs of the host's PID namespace. One that is ours is left out; one that this namespace has not
    (in a container) may be this run's own CUDA context seen from the host, or another container's process."""
    visible = visible or pid_visible
    others, unmatched = [], []
    for process in found:
        if process.pid in own:
            continue
        (others if visible(process.pid) else unmatched).append(process)
    return tuple(others), tuple(unmatched)


def with_processes(gpus: list[GpuState], apps: dict[str, list[GpuProcess]], own: frozenset[int],
                   visible: Callable[[int], bool] | None = None) -> list[GpuState]:
    """Each GPU with the processes the driver lists on it (by UUID), split by ``split_processes``."""
    states = []
    for g in gpus:
        others, unmatched = split_processes((p for uuid, found in apps.items() if same_gpu(uuid, g.uuid) for p in found),
                                            own, visible)
        states.append(replace(g, processes=others, unmatched=unmatched))
    return states


def _smi(smi: str, query: str, fields: tuple[str, ...]) -> str | None:
    try:
        out = subprocess.run([smi, f"--query-{query}={','.join(fields)}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10, check=False, env={**os.environ, "LC_ALL": "C"})
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def _from_nvidia_smi(smi: str, own: frozenset[int]) -> list[GpuState] | None:
    gpus = _smi(smi, "gpu", GPU_FIELDS)
    if gpus is None:
        return None
    apps = _smi(smi, "compute-apps", APPS_FIELDS)
    return with_processes(_parse_gpus(gpus), _parse_apps(apps or ""), own)


def _nvml_value(call, *args):
    """An NVML query's answer, None where the GPU does not support it (MIG on a consumer GPU) or it fails."""
    try:
        value = call(*args)
    except Exception:  # noqa: BLE001 - NVMLError_NotSupported and its kin
        return None
    return value.decode() if isinstance(value, bytes) else value


def _from_nvml(nvml, own: frozenset[int]) -> list[GpuState]:
    nvml.nvmlInit()
    try:
        gpus = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            mig = _nvml_value(nvml.nvmlDeviceGetMigMode, handle)
            processes = _nvml_value(nvml.nvmlDeviceGetComputeRunningProcesses, handle) or []
            sm, graphics = nvml.NVML_CLOCK_SM, nvml.NVML_CLOCK_GRAPHICS
            others, unmatched = split_processes(
                (GpuProcess(p.pid, p.usedGpuMemory // (1 << 20) if p.usedGpuMemory else None) for p in processes), own)
            gpus.append(GpuState(
                index, _nvml_value(nvml.nvmlDeviceGetUUID, handle) or "", _nvml_value(nvml.nvmlDeviceGetName, handle)
                or "?", None if mig is None else bool(mig[0]), _nvml_value(nvml.nvmlDeviceGetClockInfo, handle, sm),
                _nvml_value(nvml.nvmlDeviceGetMaxClockInfo, handle, sm),
                _nvml_value(nvml.nvmlDeviceGetApplicationsClock, handle, graphics),
                _nvml_value(nvml.nvmlDeviceGetDefaultApplicationsClock, handle, graphics), others, unmatched))
        return gpus
    finally:
        nvml.nvmlShutdown()


def nvml():
    """The ``pynvml`` module; ImportError where nvidia-ml-py is not installed."""
    import pynvml  # optional: nvidia-ml-py, imported where asked so a box without it still runs

    return pynvml


def gpu_states() -> tuple[str, list[GpuState]] | None:
    """(where the answer came from, each GPU's state), or None where neither NVML nor nvidia-smi answers."""
    try:
        return "NVML", _from_nvml(nvml(), own_pids())
    except Exception:  # noqa: BLE001,S110 - not installed, no driver, or an old library: nvidia-smi is the fallback
        pass
    smi = shutil.which("nvidia-smi")
    found = _from_nvidia_smi(smi, own_pids()) if smi else None
    return ("nvidia-smi", found) if found is not None else None
