"""Host-side facts a benchmark run depends on: shared memory, cores, frequency governors, distorting settings.

Pure functions of what they are given (paths, an environment, counts) so ``doctor`` and its
tests can hand them fake inputs. Nothing here touches a GPU or imports torch.
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import sys
import sysconfig
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

# Environment variables that change what a timing measures, and why. A variable counts when set
# to a true value ("1", "true", "yes", "on"), a log level (LOG_LEVEL_ENV) when above 0.
DISTORTING_ENV: dict[str, str] = {
    "CUDA_LAUNCH_BLOCKING": "serializes every kernel launch: the host waits for each kernel, nothing overlaps, "
                            "every step time is wrong; unset it",
    "TORCH_SHOW_CPP_STACKTRACES": "every C++ error or warning torch raises, also those it catches itself, collects a "
                                  "stack trace; unset it",
    "PYTORCH_NO_CUDA_MEMORY_CACHING": "disables the caching allocator: every allocation and free goes to the driver "
                                      "(cudaMalloc/cudaFree), and memory figures are not the allocator's; unset it",
    "TORCH_CUDNN_V8_API_DISABLED": "falls back to cuDNN's legacy API where the build still has it: other convolution "
                                   "algorithms than a default run; unset it",
    "TORCH_COMPILE_DEBUG": "torch.compile writes a debug folder for every compiled graph: compile times inflate; unset it",
    "CUDNN_LOGINFO_DBG": "cuDNN logs every API call: each convolution pays for the logging; unset it",
    "CUBLAS_LOGINFO_DBG": "cuBLAS logs every API call: each matmul pays for the logging; unset it",
    "CUBLASLT_LOG_LEVEL": "cuBLASLt logs its calls: each matmul pays for the logging; unset it",
}

LOG_LEVEL_ENV = ("CUBLASLT_LOG_LEVEL",)
_TRUE = {"1", "true", "yes", "on", "y"}
_FALSE = {"0", "false", "no", "off", "n"}

@dataclass(frozen=True)
class Variable:
    """One of trainbench's own environment variables: what it sets, how its value reads, and its value where unset
    or blank."""

    what: str
    kind: str  # "switch" (on/off), "seconds" (> 0), "device" (auto, cpu, cuda, cuda:N), "pattern" (a regex), "path"
    default: object = None


# A GPU suite at full sizes takes well over an hour: 75 cases, paired baselines, fresh processes and torchrun ranks
# that each start CUDA, and torch.compile warm-ups of minutes each. Two hours still leave the nightly job
# (300 minutes) time for its gated pytest pass, so a timed-out asv pass is reported rather than the job killed.
ASV_TIMEOUT_S = 7200

# Every TRAINBENCH_* variable the package reads, and the one reader (``env_value``): "0" is off everywhere, and a value
# a variable cannot take is refused in one line, never read as something else (tests/test_architecture.py keeps every
# read of one here).
ENVIRONMENT: dict[str, Variable] = {
    "TRAINBENCH_EXPECT_CUDA": Variable("a GPU must be usable, as --trainbench-expect-cuda and doctor --expect-cuda",
                                       "switch", False),
    "TRAINBENCH_IGNORE_DOCTOR": Variable("a session runs past the doctor's blockers", "switch", False),
    "TRAINBENCH_PREDICT_MEMORY": Variable("memory is predicted under fake tensors (default on; off as "
                                          "--trainbench-no-predict)", "switch", True),
    "TRAINBENCH_ASV_SLOW": Variable("asv measures the slow cases (torch.compile) too", "switch", False),
    "TRAINBENCH_ASV_CASES": Variable("asv measures only the case ids this regular expression matches", "pattern"),
    "TRAINBENCH_ASV_DEVICE": Variable("the device asv measures on", "device", "auto"),
    "TRAINBENCH_ASV_TIMEOUT": Variable("the asv cache timeout", "seconds", ASV_TIMEOUT_S),
    "TRAINBENCH_PREDICTIONS_FILE": Variable("the JSON file one job's processes share their predictions in", "path"),
    # set by trainbench for the processes it starts: an A/B side's worker, the pytest that reads a user's project
    "TRAINBENCH_AB_DEVICE": Variable("the device an A/B side measures on", "device", "auto"),
    "TRAINBENCH_PROJECT_PROBE": Variable("where a probed project's pytest writes what it resolved", "path"),
}
# The on/off ones: every reader asks ``env_switch``.
SWITCHES: dict[str, str] = {name: v.what for name, v in ENVIRONMENT.items() if v.kind == "switch"}


class EnvError(ValueError):
    """A trainbench variable set to a value it cannot take; the message, one line, names it and what is expected."""


def env_value(name: str, environ: Mapping[str, str] | None = None):
    """The value of trainbench's variable ``name`` (an ``ENVIRONMENT`` entry) in ``environ`` (default: this process's),
    read as its kind says: a bool, seconds (a float > 0), a device ("auto", "cpu", "cuda", "cuda:N"), a regular
    expression or a path (a string); its default where unset or blank. Anything else raises ``EnvError``."""
    if name not in ENVIRONMENT:
        raise KeyError(f"{name}: not a trainbench variable; add it to host.ENVIRONMENT")
    variable = ENVIRONMENT[name]
    value = (os.environ if environ is None else environ).get(name)
    said = (value or "").strip()
    if not said:
        return variable.default
    reader = {"switch": _switch, "seconds": _seconds, "device": _device, "pattern": _pattern, "path": _path}
    return reader[variable.kind](name, value, said, variable)


def env_switch(name: str, environ: Mapping[str, str] | None = None) -> bool:
    """Whether switch ``name`` (a ``SWITCHES`` entry) is on: 1/true/yes/on, or 0/false/no/off; unset or empty: its
    default (``ENVIRONMENT``). Anything else raises ``EnvError``."""
    if name not in SWITCHES:
        raise KeyError(f"{name}: not a trainbench switch; add it to host.ENVIRONMENT")
    return env_value(name, environ)


def _switch(name: str, value: str, said: str, variable: Variable) -> bool:
    if said.lower() in _TRUE or said.lower() in _FALSE:
        return said.lower() in _TRUE
    raise EnvError(f"{name}={value!r}: expected 1 or 0 (or true/false, yes/no, on/off): {variable.what}")


def _seconds(name: str, value: str, said: str, variable: Variable) -> float:
    try:
        seconds = float(said)
    except ValueError:
        seconds = float("nan")  # refused below, in the same one line
    if not 0 < seconds < float("inf"):
        raise EnvError(f"{name}={value!r}: {variable.what} must be a positive number of seconds "
                       f"(unset: {variable.default})")
    return seconds


def is_device_spec(text: str) -> bool:
    """Whether ``text`` names a device trainbench trains on: auto, cpu, cuda or cuda:N (N a GPU's index)."""
    return text in ("auto", "cpu", "cuda") or (text.startswith("cuda:") and text[5:].isascii() and text[5:].isdigit())


def _device(name: str, value: str, said: str, variable: Variable) -> str:
    if is_device_spec(said):
        return said
    raise EnvError(f"{name}={value!r}: expected auto, cpu, cuda or cuda:N: {variable.what}")


def _pattern(name: str, value: str, said: str, variable: Variable) -> str:
    try:
        re.compile(value)
    except (re.error, OverflowError, RecursionError, ValueError) as e:
        raise EnvError(f"{name}={value!r}: not a regular expression ({e}): {variable.what}") from None
    return value


def _path(name: str, value: str, said: str, variable: Variable) -> str:
    if "\0" in value:
        raise EnvError(f"{name}={value!r}: expected a file path (no NUL character): {variable.what}")
    return value


def _is_true(value: str | None) -> bool:
    return value is not None and value.strip().lower() in _TRUE


def shm_free_bytes(path: str = "/dev/shm") -> int | None:
    """Free bytes of the shared-memory mount DataLoader workers hand batches through (None: not Linux, or no mount)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def shm_needed_bytes(batch_bytes: int, num_workers: int, prefetch_factor: int = 2) -> int:
    """Shared memory a DataLoader with ``num_workers`` workers can hold at once.

    Each worker collates its batches into shared memory and keeps up to ``prefetch_factor``
    of them in flight; the main process holds one more while the step consumes it.
    """
    if num_workers <= 0:
        return 0
    return batch_bytes * (num_workers * prefetch_factor + 1)


def _positive_int(value: str | None) -> int | None:
    try:
        number = int(value) if value is not None else None
    except ValueError:
        return None
    return number if number and number > 0 else None


def timing_distortions(environ: Mapping[str, str], anomaly_enabled: bool, profiler_enabled: bool, torch_threads: int,
                       cpu_count: int) -> list[tuple[str, str]]:
    """(name, why) for each setting of this process that makes timings measure something else than training."""
    found = [(name, f"{name}={environ[name]}: {why}") for name, why in DISTORTING_ENV.items()
             if (_positive_int if name in LOG_LEVEL_ENV else _is_true)(environ.get(name))]

    def add(name: str, message: str) -> None:
        found.append((name, message))

    if anomaly_enabled:
        add("anomaly_mode", "autograd anomaly detection is on for the whole process (set_detect_anomaly): every backward "
                            "op records a traceback and checks for NaN; turn it off")
    if profiler_enabled:
        add("profiler", "a profiler is running: every op is recorded; stop it before measuring")
    omp = environ.get("OMP_NUM_THREADS")
    if omp is not None:
        threads = _positive_int(omp)
        if threads is None:
            add("OMP_NUM_THREADS", f"OMP_NUM_THREADS={omp!r} is not a positive integer: set it to the usable cores "
                                   f"({cpu_count}) or unset it")
        elif threads > cpu_count:
            add("OMP_NUM_THREADS", f"OMP_NUM_THREADS={threads} on {cpu_count} usable cores: OpenMP threads contend for "
                                   f"cores (oversubscription); set it to {cpu_count} or unset it")
    if torch_threads > cpu_count:
        add("torch_threads", f"torch uses {torch_threads} threads on {cpu_count} usable cores: they contend for cores "
                             f"(oversubscription); set OMP_NUM_THREADS={cpu_count}")
    elif torch_threads * 2 < cpu_count:
        add("torch_threads", f"torch uses {torch_threads} threads of {cpu_count} usable cores: CPU numbers measure a "
                             "fraction of this machine; raise OMP_NUM_THREADS if that is not meant")
    return found


def cpu_governors(root: str = "/sys/devices/system/cpu") -> dict[str, int]:
    """How many cores use each cpufreq scaling governor (empty where unreadable: VMs, containers, not Linux)."""
    counts: Counter[str] = Counter()
    for path in Path(root).glob("cpu[0-9]*/cpufreq/scaling_governor"):
        try:
            counts[path.read_text().strip()] += 1
        except OSError:
            continue
    return dict(counts)


def usable_cpus() -> int:
    """Cores this process may run on (its affinity mask, which containers and taskset narrow), else all."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def cores_at_once() -> int:
    """Processes that can run at once here without sharing a core: ``usable_cpus``, fewer under a cgroup CPU quota."""
    quota = cgroup_cpu_quota()
    return max(1, min(usable_cpus(), int(quota) if quota else usable_cpus()))


def cgroup_cpu_quota(path: str = "/sys/fs/cgroup/cpu.max") -> float | None:
    """Cores' worth of CPU time a cgroup v2 quota allows (``docker --cpus``, Kubernetes limits), None when unlimited.

    The affinity mask still shows every core under a quota: more threads than the quota are throttled.
    """
    try:
        parts = Path(path).read_text().split()  # "max 100000" or "<quota> <period>" in microseconds
    except OSError:
        return None
    if len(parts) != 2 or not parts[0].isdigit() or not parts[1].isdigit() or int(parts[1]) == 0:
        return None
    quota, period = parts
    return int(quota) / int(period)


def c_compiler(environ: Mapping[str, str], cxx: bool = False) -> str | None:
    """The compiler torch.compile's kernels are built with, as it looks for one: ``CC`` (``CXX``) first, then on
    PATH. A GPU's Triton kernels need a C compiler for their launcher, the CPU's inductor kernels a C++ one."""
    variable, names = ("CXX", ("c++", "g++", "clang++")) if cxx else ("CC", ("cc", "gcc", "clang"))
    named = environ.get(variable, "").strip()
    if named:
        return shutil.which(named)
    return next((path for path in map(shutil.which, names) if path), None)


def python_header() -> str | None:
    """This Python's ``Python.h`` (the compiled kernels' launchers include it), or None where its headers are not
    installed (the python3-dev package)."""
    path = Path(sysconfig.get_paths()["include"]) / "Python.h"
    return str(path) if path.is_file() else None


def cublas_workspace_config(environ: Mapping[str, str]) -> str | None:
    """CUBLAS_WORKSPACE_CONFIG as set for this process (None: unset)."""
    return environ.get("CUBLAS_WORKSPACE_CONFIG") or None


def busy_cpu_seconds(cpus: set[int], stat_text: str) -> float | None:
    """CPU seconds the given cores have spent busy since boot, from ``/proc/stat`` text (None: no such lines).

    Busy = user + nice + system + irq + softirq + steal (guest time is already inside user).
    """
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    total, found = 0, False
    for line in stat_text.splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or not name[3:].isdigit() or int(name[3:]) not in cpus:
            continue
        fields = [int(x) for x in rest.split()]
        user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
        total += user + nice + system + irq + softirq + steal
        found = True
    return total / tick if found else None


def own_cpu_seconds() -> float:
    """CPU seconds this process and its waited-for children (loader workers, rank processes) have used."""
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


class LoadMeter:
    """How much of this process's cores *other* processes used while something ran, and the load average.

    Others' CPU = the cores' busy time (``/proc/stat``) minus this process tree's own (``getrusage``),
    over the wall time: a CPU hog beside a run shows as ~1 CPU of 2, the run's own threads and loader
    workers not at all (they are waited for before ``stop``). Off Linux only the load average is kept.
    """

    def __init__(self, stat_path: str = "/proc/stat", clock=None):
        self._stat_path = stat_path
        self._clock = clock or time.monotonic
        self._cpus = set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set(range(usable_cpus()))
        self._start: tuple | None = None

    def _read(self) -> tuple[float, float | None, float, list[float] | None]:
        try:
            busy = busy_cpu_seconds(self._cpus, Path(self._stat_path).read_text())
        except OSError:
            busy = None
        load = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
        return self._clock(), busy, own_cpu_seconds(), load

    def start(self) -> LoadMeter:
        self._start = self._read()
        return self

    def stop(self) -> dict:
        """{"cpus", "seconds", "other_cpus" (None off Linux), "load_average_1m": [start, end]}."""
        (t0, busy0, own0, load0), (t1, busy1, own1, load1) = self._start, self._read()
        wall = max(t1 - t0, 1e-9)
        other = None
        if busy0 is not None and busy1 is not None:
            other = max(0.0, ((busy1 - busy0) - (own1 - own0)) / wall)
        return {"cpus": len(self._cpus), "seconds": round(wall, 3),
                "other_cpus": None if other is None else round(other, 3),
                "load_average_1m": [load0[0], load1[0]] if load0 and load1 else None}
