"""``python -m trainbench doctor``: is this machine fit to benchmark on, before an hour of runner time says no.

Each check is a small function of plain inputs (the ``cuda_runtime()`` dict, byte counts,
an environment) returning ``Check`` lines, so tests hand them fake machines. ``FAIL`` is a
blocker (a run would crash or measure nothing meaningful), ``warn`` distorts the numbers,
``info`` is context a reader of the results needs.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import torch
from torch.utils._pytree import tree_flatten

from trainbench.core.analyses.predict import PredictionCache
from trainbench.core.harness.files import write_json_atomic
from trainbench.core.setups.cases import all_cases, ladder_cases, recipe_cases
from trainbench.core.setups.eligibility import Context, MemoryLimit, memory_needed, why_not
from trainbench.core.setups.recipes import spec_unmet
from trainbench.core.setups.workloads import PROFILES, resolve_spec
from trainbench.devices import host
from trainbench.devices.device import cpu_model, cuda_runtime, get_backend
from trainbench.devices.gpu_state import GpuState, gpu_states, same_gpu

STATUSES = ("ok", "info", "warn", "FAIL")
MiB = 1 << 20
GiB = 1 << 30

# Oldest driver branch each CUDA major version runs on under minor-version compatibility (NVIDIA's CUDA
# compatibility table); each toolkit also ships its own, newer driver (12.6: R560), which a few features need.
MIN_DRIVER = {13: 580, 12: 525, 11: 450}
WHEELS_BY_DRIVER = ("cu130 and cu132 wheels need driver >= 580 for CUDA 13.x, cu126 runs on >= 525 under CUDA 12.x "
                    "minor-version compatibility: see NVIDIA's CUDA compatibility table")


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # one of STATUSES
    message: str

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"check {self.name!r}: status must be one of {STATUSES}, got {self.status!r}")


# -- CUDA -----------------------------------------------------------------------------------

def expects_cuda(flag: bool, device_spec: str | None, environ: Mapping[str, str]) -> bool:
    """A run that must use a GPU: asked on the command line, by TRAINBENCH_EXPECT_CUDA=1, or by naming a CUDA device."""
    return bool(flag or host.env_switch("TRAINBENCH_EXPECT_CUDA", environ) or str(device_spec or "").startswith("cuda"))


def _release(version: str) -> str:
    return version.split("+", 1)[0]


def torch_pkgs(torch_version: str, wheel: str) -> str:
    """The Makefile's reinstall line for this torch release built for ``wheel`` (e.g. "cu126")."""
    packages = [f"torch=={_release(torch_version)}"]
    try:
        packages.append(f"torchvision=={_release(metadata.version('torchvision'))}")
    except metadata.PackageNotFoundError:
        pass
    return f'make clean install TORCH_PKGS="{" ".join(packages)} --index-url https://download.pytorch.org/whl/{wheel}"'


def _driver_major(driver: str | None) -> int | None:
    head = (driver or "").split(".", 1)[0]
    return int(head) if head.isdigit() else None


def _cuda_major(torch_cuda: str | None) -> int | None:
    head = (torch_cuda or "").split(".", 1)[0]
    return int(head) if head.isdigit() else None


def _wheel_for(capability: tuple[int, int]) -> str:
    """A wheel whose arch list covers ``capability``: only the CUDA 12 builds still carry pre-Turing GPUs (sm_70)."""
    return "cu126" if tuple(capability) < (7, 5) else "cu130"


def check_cuda(runtime: dict, expect_cuda: bool, environ: Mapping[str, str] | None = None,
               gpus_used: bool = True) -> list[Check]:
    """The torch build, whether CUDA works, each GPU's arch against the build and the driver, from ``cuda_runtime()``.

    A GPU the build has no kernels for blocks a run that uses the GPUs (``gpus_used``), else it is a warning.
    """
    environ = {} if environ is None else environ
    torch_version, torch_cuda = runtime.get("torch") or "?", runtime.get("torch_cuda")
    driver, error = runtime.get("driver"), runtime.get("error")
    devices = runtime.get("devices") or []
    available = bool(runtime.get("available")) and bool(devices)
    arch_list = runtime.get("arch_list") or []
    checks = [Check("torch", "info", f"torch {torch_version}, " + (
        f"CUDA {torch_cuda} build for {' '.join(arch_list) or 'unknown archs'}" if torch_cuda else "CPU-only build"))]

    if torch_cuda is None:
        if expect_cuda:
            checks.append(Check("cuda", "FAIL", f"CUDA expected, but torch {torch_version} is a CPU-only build: install "
                                                f"a CUDA build: {torch_pkgs(torch_version, 'cu130')} ({WHEELS_BY_DRIVER})"))
        else:
            checks.append(Check("cuda", "info", "CPU-only torch build: measuring the CPU profile"))
        return checks

    if available:
        names = ", ".join(f"cuda:{d['index']} {d['name']}" for d in devices)
        checks.append(Check("cuda", "ok", f"{len(devices)} GPU(s): {names}"))
    else:
        reason, fix = _why_no_gpu(torch_version, torch_cuda, driver, error, environ)
        if expect_cuda:
            checks.append(Check("cuda", "FAIL", f"CUDA expected, but {reason}: {fix}"))
        else:
            checks.append(Check("cuda", "info", f"{reason}; not expected: measuring the CPU profile"))

    for d in devices:
        capability = tuple(d["capability"])
        arch = f"sm_{capability[0]}{capability[1]}"
        if d.get("unsupported"):
            fix = torch_pkgs(torch_version, _wheel_for(capability))
            checks.append(Check(f"gpu{d['index']}_arch", "FAIL" if gpus_used else "warn",
                                f"{d['name']} ({arch}): {d['unsupported']}; e.g. {fix}"))
        else:
            checks.append(Check(f"gpu{d['index']}_arch", "ok", f"{d['name']} ({arch}) has kernels in this build"))

    if driver:
        checks.append(Check("driver", "info", f"NVIDIA driver {driver}"))
    elif available:
        checks.append(Check("driver", "warn", "NVIDIA driver version unknown (neither pynvml nor nvidia-smi answered): "
                                              "results will not record it; install nvidia-ml-py or put nvidia-smi on PATH"))
    else:
        checks.append(Check("driver", "info", "no NVIDIA driver found"))
    return checks


def _why_no_gpu(torch_version: str, torch_cuda: str, driver: str | None, error: str | None,
                environ: Mapping[str, str]) -> tuple[str, str]:
    """Why a CUDA build sees no GPU, and what to do about it."""
    reason = f"this CUDA {torch_cuda} build (torch {torch_version}) sees no usable GPU"
    if error:
        reason += f" ({error})"
    wheel_fix = f"pick the wheel for your driver: {torch_pkgs(torch_version, 'cu126')} ({WHEELS_BY_DRIVER})"
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return f"{reason}: CUDA_VISIBLE_DEVICES={visible!r} hides every GPU", "unset it"
    if driver is None:
        return (f"{reason} and no NVIDIA driver answered (NVML, nvidia-smi)",
                "install the driver; in a container pass the GPUs in (docker run --gpus all)")
    have, need = _driver_major(driver), MIN_DRIVER.get(_cuda_major(torch_cuda) or 0)
    if have is not None and need is not None and have < need:
        return (f"{reason}: driver {driver} is older than CUDA {torch_cuda} needs (>= {need})",
                f"upgrade the driver, or {wheel_fix}")
    if have is not None and need is not None:
        return (f"{reason} with driver {driver} (new enough for CUDA {torch_cuda})",
                "check that nvidia-smi lists the GPU, and in a container that it is passed in (docker run --gpus all)")
    return (f"{reason} with driver {driver}",
            f"check nvidia-smi; if the driver is older than the wheel's CUDA needs, {wheel_fix}")


def select_device(device_spec: str | None, runtime: dict) -> tuple[Check, bool]:
    """The device a run with ``--device device_spec`` would measure, and whether it is a GPU (no CUDA context made)."""
    spec = device_spec or "auto"
    devices = runtime.get("devices") or []
    available = bool(runtime.get("available")) and bool(devices)
    if spec == "auto":
        if available:
            return Check("device", "ok", f"auto: cuda:{devices[0]['index']} ({devices[0]['name']}), gpu profile"), True
        return Check("device", "ok", f"auto: cpu ({cpu_model()}), cpu profile"), False
    if spec.startswith("cuda"):  # parsed as torch.device does; the GPU itself is looked up in the runtime, not opened
        try:
            index = torch.device(spec).index or 0
        except RuntimeError as e:
            return Check("device", "FAIL", f"--device {spec!r}: {e}; expected auto, cpu, cuda or cuda:N"), False
        if not available:
            return Check("device", "FAIL", f"{spec} requested, but no GPU is usable (see the cuda check)"), False
        if index >= len(devices):
            return Check("device", "FAIL", f"{spec} requested, but only {len(devices)} CUDA device(s) exist: "
                                           f"pick cuda:0..cuda:{len(devices) - 1}"), False
        return Check("device", "ok", f"{spec} ({devices[index]['name']}), gpu profile"), True
    try:
        backend = get_backend(spec)
    except (RuntimeError, ValueError) as e:
        return Check("device", "FAIL", f"--device {spec!r}: {e}"), False
    uses_gpu = backend.caps().cuda
    return Check("device", "ok", f"{spec} ({backend.name}), {backend.caps().profile_name} profile"), uses_gpu


@dataclass(frozen=True)
class CaseMemory:
    """A heavy case on one GPU as the runner will treat it: its memory need, and whether it runs."""

    case_id: str
    needed_bytes: int | None  # predicted tensor peak with the runner's headroom; None: not predicted
    skipped: str | None = None  # why the runner will skip it there (``eligibility.why_not``); None: it runs


# The suite's heaviest setups on the GPU profile (the largest batches, fp32): the device-memory check
# predicts these few rather than every case (a second or more each).
HEAVIEST_CASES = ("resnet18-ladder003-4_uint8_transfer", "transformer-larger_batch", "gpt-larger_batch",
                  "vit-larger_batch")


def heaviest_cases(caps, total_bytes: int, predict) -> list[CaseMemory]:
    """The ``HEAVIEST_CASES`` on a GPU of ``caps`` with ``total_bytes`` of memory, each judged by the runner's own
    rule (``eligibility.why_not`` with its memory gate); ``predict(config, spec)``: ``predict_memory``'s answer."""
    profile, limit = PROFILES["gpu"], MemoryLimit(total_bytes, predict)
    found = []
    for case in all_cases():
        if case.id not in HEAVIEST_CASES:
            continue
        recipe = case.recipe(caps, profile)
        config, spec = recipe.config(profile), resolve_spec(case.workload, profile)
        skipped = why_not(recipe, caps, profile, spec, config, Context(memory=limit))
        needed = memory_needed(config, spec, limit)
        found.append(CaseMemory(case.id, needed[1] if needed else None, skipped))
    return found


def check_device_memory(device: dict, cases: list[CaseMemory]) -> list[Check]:
    """A GPU's memory against what the largest case that will run there needs; a line per case the runner will skip.

    A case that does not fit is skipped by the runner's memory gate, not run out of memory: information, not a
    blocker. What a case needs already holds the gate's headroom for the allocator, workspaces and the CUDA
    context (``eligibility.HEADROOM``): a case the gate lets run fits, and only one that runs though it needs more
    than the GPU has is a warning."""
    total, name = device["total_memory_bytes"], f"gpu{device['index']}_memory"
    have = f"{device['name']} has {total / MiB:,.0f} MiB"
    checks = []
    for case in cases:
        if case.skipped:
            need = f" (needs {case.needed_bytes / MiB:,.0f} MiB of {total / MiB:,.0f})" if case.needed_bytes else ""
            checks.append(Check(f"{name}:{case.case_id}", "info", f"{case.case_id} will be skipped{need}: {case.skipped}"))
    running = [c for c in cases if not c.skipped and c.needed_bytes is not None]
    if not running:
        unpredicted = [c.case_id for c in cases if not c.skipped]
        what = (f"what {', '.join(unpredicted)} needs is not predicted" if unpredicted
                else f"none of {', '.join(HEAVIEST_CASES)} will run on it")
        return [Check(name, "info", f"{have}; {what}"), *checks]
    largest = max(running, key=lambda c: c.needed_bytes)
    line = (f"{have}; the largest case that will run ({largest.case_id}) needs {largest.needed_bytes / MiB:,.0f} MiB "
            "with the memory gate's headroom")
    if largest.needed_bytes > total:
        return [Check(name, "warn", f"{line}: more than the GPU has, yet it is not skipped: it would run out of "
                                    "memory"), *checks]
    return [Check(name, "ok", line), *checks]


# -- shared memory --------------------------------------------------------------------------

def _sample_nbytes(sample) -> int:
    """Bytes one sample adds to a collated batch: tensors and arrays as they are, Python numbers as 8-byte tensors."""
    total = 0
    for leaf in tree_flatten(sample)[0]:
        if hasattr(leaf, "nbytes"):  # torch.Tensor, numpy.ndarray
            total += int(leaf.nbytes)
        elif isinstance(leaf, int | float):  # default_collate makes int64 / float64 tensors of them
            total += 8
    return total


def uses_loader_workers(config) -> bool:
    """Whether a case of this ``TrainConfig`` loads its batches in DataLoader worker processes (shared memory)."""
    return config.num_workers > 0 and not config.synthetic


def loader_worker_cases(profile_name: str) -> list[str]:
    """The suite's cases, ladder rungs included, whose DataLoader workers use shared memory on ``profile_name``."""
    profile = PROFILES[profile_name]
    return [case.id for case in all_cases() if uses_loader_workers(case.recipe(None, profile).config(profile))]


@functools.lru_cache(maxsize=8)  # the datasets are seeded: the answer only changes with the suite
def largest_worker_batch(profile_name: str, caps=None, rungs: bool = False) -> tuple[str, int, int] | None:
    """The case whose DataLoader workers hold the most shared memory on ``profile_name``, among the suite's recipe
    cases (``rungs``: among the ladders' rungs instead): (case id, bytes of one loader batch, worker processes over
    all ranks), None when no such case uses workers.

    Builds datasets and one sample each, never a model. ``caps`` (a ``DeviceCaps``) leaves out
    cases the device cannot run; without it every case counts.
    """
    profile = PROFILES[profile_name]
    samples: dict[tuple[str, str | None], int] = {}
    best: tuple[int, str, int, int] | None = None
    for case in ladder_cases() if rungs else recipe_cases():
        recipe = case.recipe(caps, profile)
        config = recipe.config(profile)
        if not uses_loader_workers(config):
            continue
        spec = resolve_spec(case.workload, profile)
        reason = spec_unmet(spec, config) if caps is None else why_not(recipe, caps, profile, spec, config)
        if spec.dataset is None or reason:
            continue
        key = (case.workload, config.pixels)
        if key not in samples:
            samples[key] = _sample_nbytes(spec.make_dataset(config.pixels)[0])
        batch_bytes = samples[key] * config.loader_batch_size(spec)
        workers = config.num_workers * config.world_size  # each rank starts its own workers
        needed = host.shm_needed_bytes(batch_bytes, workers)
        if best is None or needed > best[0]:
            best = (needed, case.id, batch_bytes, workers)
    return None if best is None else best[1:]


def _shm_need(largest: tuple[str, int, int] | None) -> tuple[int, str]:
    """Shared memory a ``largest_worker_batch`` answer needs, and the figures that say why."""
    if largest is None:
        return 0, ""
    case_id, batch_bytes, workers = largest
    needed = host.shm_needed_bytes(batch_bytes, workers)
    return needed, (f"{needed / MiB:.0f} MiB needed by {case_id} ({workers} workers x 2 prefetched + 1 batch of "
                    f"{batch_bytes / MiB:.1f} MiB)")


def _shm_fix(needed: int) -> str:
    size = max(1, -(-2 * needed // GiB))  # twice the need, in whole GiB
    return f"docker run --shm-size={size}g, or --ipc=host"


def check_shm(free_bytes: int | None, largest: tuple[str, int, int] | None, profile_name: str,
              path: str = "/dev/shm", largest_rung: tuple[str, int, int] | None = None) -> Check:
    """Shared memory against the largest worker batch: too little and DataLoader workers die with a bus error. Sized
    for the suite's recipe cases (``largest``: a blocker where they do not fit); a ladder rung that needs more
    (``largest_rung``, e.g. the larger-batch rung's fp32 images) is a warning: only those rungs would fail."""
    needed, figures = _shm_need(largest)
    rung_needed, rung_figures = _shm_need(largest_rung)
    if largest is None and largest_rung is None:
        return Check("shm", "ok", f"no {profile_name}-profile case uses DataLoader workers")
    figures = figures or f"no {profile_name}-profile recipe case uses DataLoader workers"
    if rung_needed > needed:
        figures += f"; {rung_figures}"
    if free_bytes is None:
        return Check("shm", "info", f"{path} not found, free shared memory unknown; {figures}")
    free = f"{path} has {free_bytes / MiB:.0f} MiB free"
    if free_bytes < needed:
        return Check("shm", "FAIL", f"{free}, {figures}: DataLoader workers would die with a bus error (Docker's "
                                    f"default is 64 MiB): {_shm_fix(max(needed, rung_needed))}")
    if free_bytes < rung_needed:
        return Check("shm", "warn", f"{free}, {figures}: enough for the recipe cases, but {largest_rung[0]}'s "
                                    f"workers (and those of any rung as large) would die with a bus error: "
                                    f"{_shm_fix(rung_needed)}")
    return Check("shm", "ok", f"{free}, {figures}")


# -- environment and host -------------------------------------------------------------------

def check_cublas(config: str | None) -> Check:
    """CUBLAS_WORKSPACE_CONFIG: it changes cuBLAS's workspace for every case, and makes matmuls deterministic."""
    if config is None:
        return Check("cublas_workspace", "info", "CUBLAS_WORKSPACE_CONFIG unset: the deterministic case sets :4096:8 "
                                                 "in its own fresh process")
    return Check("cublas_workspace", "info", f"CUBLAS_WORKSPACE_CONFIG={config}: every case's cuBLAS runs with it (the "
                                             "deterministic case keeps :4096:8 or :16:8, else sets :4096:8)")


def check_cuda_env(environ: Mapping[str, str]) -> list[Check]:
    """The allocator's configuration (recorded) and NVIDIA_TF32_OVERRIDE, which overrules torch's TF32 flags."""
    conf = {name: environ[name] for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF") if environ.get(name)}
    checks = [Check("cuda_alloc_conf", "info", "; ".join(f"{name}={value}" for name, value in conf.items())
                    + ": every case's caching allocator runs with it (memory peaks and fragmentation follow it)"
                    if conf else "PYTORCH_CUDA_ALLOC_CONF unset: the caching allocator's defaults")]
    override = environ.get("NVIDIA_TF32_OVERRIDE")
    if override is None:
        checks.append(Check("tf32_override", "info", "NVIDIA_TF32_OVERRIDE unset: torch's TF32 flags decide"))
    elif override.strip() == "0":
        checks.append(Check("tf32_override", "warn", "NVIDIA_TF32_OVERRIDE=0 turns TF32 off in cuBLAS and cuDNN "
                                                     "whatever torch's flags say: fp32 matmuls and convolutions run in "
                                                     "full fp32 while results record TF32 (precision, MFU peak); "
                                                     "unset it"))
    else:
        checks.append(Check("tf32_override", "info", f"NVIDIA_TF32_OVERRIDE={override}: no effect (only 0 turns "
                                                     "TF32 off)"))
    return checks


def check_gpu_state(state: tuple[str, list[GpuState]] | None, devices: list[dict]) -> list[Check]:
    """Other processes, MIG mode and clocks of each GPU the run sees (matched to the driver's by UUID; all the
    driver's GPUs where torch gave no UUID), from ``gpu_state.gpu_states()``."""
    if state is None:
        return [Check("gpu_state", "info", "neither NVML (nvidia-ml-py) nor nvidia-smi answered: other processes "
                                           "on the GPU, MIG mode and clocks not checked")]
    source, gpus = state
    seen = [(f"gpu{d['index']}", g) for d in devices for g in gpus if same_gpu(g.uuid, d.get("uuid"))]
    checks = []
    for label, gpu in seen or [(f"driver_gpu{g.index}", g) for g in gpus]:
        checks += _gpu_state_checks(label, gpu, source)
    return checks


def _listed(processes) -> str:
    return ", ".join(f"pid {p.pid}" + (f" {p.used_mib:,} MiB" if p.used_mib is not None else "") for p in processes)


def _processes_check(label: str, name: str, gpu: GpuState) -> Check:
    """Other processes on the GPU. PIDs the driver gives from another PID namespace (a container's host) may be this
    run's own CUDA context: one such is "cannot tell", more than one holds at least one other process."""
    shares = "they share its SMs and memory, and every timing measures them too"
    unmatched = (f"; {len(gpu.unmatched)} more whose PIDs are not in this PID namespace ({_listed(gpu.unmatched)})"
                 if gpu.unmatched else "")
    if gpu.processes:
        return Check(f"{label}_processes", "warn", f"{name}: {len(gpu.processes)} other process(es) on it "
                                                   f"({_listed(gpu.processes)}){unmatched}: {shares}")
    if len(gpu.unmatched) > 1:
        return Check(f"{label}_processes", "warn", f"{name}: {len(gpu.unmatched)} processes on it whose PIDs are not "
                                                   f"in this PID namespace ({_listed(gpu.unmatched)}): at most one is "
                                                   f"this run's own, the others are not: {shares}")
    if gpu.unmatched:
        return Check(f"{label}_processes", "info", f"{name}: one process on it ({_listed(gpu.unmatched)}) whose PID "
                                                   "is not in this PID namespace (a container): this run's own CUDA "
                                                   "context or another process, cannot tell (nvidia-smi on the host "
                                                   "can)")
    return Check(f"{label}_processes", "ok", f"{name}: no other process on it")


def _gpu_state_checks(label: str, gpu: GpuState, source: str) -> list[Check]:
    name = f"{gpu.name} ({source})"
    processes = _processes_check(label, name, gpu)
    if gpu.mig is None:
        mig = Check(f"{label}_mig", "info", f"{name}: no MIG mode")
    elif gpu.mig:
        mig = Check(f"{label}_mig", "warn", f"{name}: MIG mode on: the run measures one MIG slice, not the GPU; "
                                            "its results compare only with runs on the same slice")
    else:
        mig = Check(f"{label}_mig", "ok", f"{name}: MIG mode off")
    return [processes, mig, Check(f"{label}_clocks", "info", f"{name}: {_clocks(gpu)}")]


def _clocks(gpu: GpuState) -> str:
    now = f"SM clock {gpu.sm_clock_mhz if gpu.sm_clock_mhz is not None else '?'} MHz"
    now += f" (max {gpu.max_sm_clock_mhz} MHz)" if gpu.max_sm_clock_mhz is not None else ""
    if gpu.app_clocks_set:
        return f"{now}; applications clocks set to {gpu.app_clock_mhz} MHz (default {gpu.default_app_clock_mhz})"
    if gpu.app_clocks_set is None:
        return f"{now}; applications clocks unknown"
    return (f"{now}; applications clocks at their default, not locked: clocks follow load, power and temperature "
            "(sudo nvidia-smi --lock-gpu-clocks=MIN,MAX holds them)")


def compile_cases(profile_name: str) -> list[str]:
    """The suite's cases whose setup torch.compile builds kernels for on ``profile_name``."""
    profile = PROFILES[profile_name]
    return [case.id for case in all_cases() if case.recipe(None, profile).config(profile).compiles]


def check_compile_toolchain(uses_cuda: bool, compiler: str | None, header: str | None, cases: list[str]) -> Check:
    """What torch.compile needs to build kernels: a C compiler for Triton's launchers on a GPU (a C++ one on the
    CPU) and this Python's ``Python.h``; without them the compile cases fail."""
    kind = "C compiler (CC, cc, gcc or clang) for Triton" if uses_cuda else "C++ compiler (CXX, c++, g++ or clang++)"
    missing = [what for what, found in ((kind, compiler), ("Python.h (python3-dev)", header)) if not found]
    if missing:
        return Check("compile_toolchain", "warn", f"no {' and no '.join(missing)}: the {len(cases)} compile case(s) "
                                                  f"would fail: {', '.join(cases) or 'none'}")
    return Check("compile_toolchain", "ok", f"{compiler} and {header}: torch.compile can build the kernels of "
                                            f"{len(cases)} compile case(s)")


def check_timing(distortions: list[tuple[str, str]], uses_cuda: bool) -> list[Check]:
    """A warning per distorting setting; CUDA_LAUNCH_BLOCKING on a GPU run is a blocker: every number would be wrong."""
    if not distortions:
        return [Check("timing", "ok", "no debug mode, profiler, distorting variable or thread oversubscription")]
    return [Check(f"timing:{name}", "FAIL" if name == "CUDA_LAUNCH_BLOCKING" and uses_cuda else "warn", message)
            for name, message in distortions]


def check_cpu(model: str, usable: int, torch_threads: int, capability: str, governors: dict[str, int],
              quota: float | None) -> list[Check]:
    """The CPU as results record it, and whether its clocks or a cgroup quota vary what it delivers."""
    checks = [Check("cpu", "info", f"{model}: {usable} usable cores, torch uses {torch_threads} threads, "
                                   f"{capability} kernels")]
    if quota is not None and quota < min(usable, torch_threads):
        checks.append(Check("cpu_quota", "warn", f"a cgroup quota allows {quota:g} cores' time to {torch_threads} torch "
                                                 f"threads: they are throttled; set OMP_NUM_THREADS={max(1, int(quota))}"))
    if not governors:
        checks.append(Check("cpu_governor", "info", "frequency governor not readable (VM or container): clock scaling "
                                                    "unknown"))
        return checks
    total = sum(governors.values())
    other = {g: n for g, n in governors.items() if g != "performance"}
    if other:
        listed = ", ".join(f"{n} {g}" for g, n in sorted(other.items()))
        checks.append(Check("cpu_governor", "warn", f"{listed} of {total} cores not 'performance': clocks follow load; "
                                                    "sudo cpupower frequency-set -g performance"))
    else:
        checks.append(Check("cpu_governor", "ok", f"all {total} cores 'performance'"))
    return checks


def _profiler_running() -> bool:
    return bool(getattr(torch.autograd.profiler, "_is_profiler_enabled", False))


# -- all checks -----------------------------------------------------------------------------

def run_checks(device_spec: str = "auto", expect_cuda: bool = False, environ: Mapping[str, str] | None = None,
               shm_path: str = "/dev/shm", runtime: dict | None = None) -> list[Check]:
    """Every check for a run on ``device_spec`` (``runtime``: a ``cuda_runtime()`` dict, read here when None)."""
    environ = os.environ if environ is None else environ
    runtime = cuda_runtime() if runtime is None else runtime
    device_check, uses_cuda = select_device(device_spec, runtime)
    checks = check_cuda(runtime, expects_cuda(expect_cuda, device_spec, environ), environ, gpus_used=uses_cuda)
    checks.append(device_check)
    profile_name = "gpu" if uses_cuda else "cpu"

    try:
        largest, largest_rung = largest_worker_batch(profile_name), largest_worker_batch(profile_name, rungs=True)
    except Exception as e:  # noqa: BLE001 - a suite being edited must not hide the other checks
        checks.append(Check("shm", "warn", f"could not size the worker batches of the {profile_name} profile: "
                                           f"{type(e).__name__}: {e}"))
    else:
        checks.append(check_shm(host.shm_free_bytes(shm_path), largest, profile_name, shm_path, largest_rung))
    if uses_cuda:
        checks += _device_memory_checks(device_spec, runtime)

    checks.append(check_cublas(host.cublas_workspace_config(environ)))
    checks += check_cuda_env(environ)
    if runtime.get("torch_cuda"):  # a CPU-only build's runner has no GPU to ask about
        checks += check_gpu_state(gpu_states(), runtime.get("devices") or [])
    checks.append(_toolchain_check(uses_cuda, profile_name, environ))
    usable = host.usable_cpus()
    checks += check_timing(host.timing_distortions(environ, torch.is_anomaly_enabled(), _profiler_running(),
                                                   torch.get_num_threads(), usable), uses_cuda)
    checks += check_cpu(cpu_model(), usable, torch.get_num_threads(), torch.backends.cpu.get_cpu_capability(),
                        host.cpu_governors(), host.cgroup_cpu_quota())
    return checks


def _device_memory_checks(device_spec: str, runtime: dict) -> list[Check]:
    try:
        backend = get_backend(device_spec)
        caps, predict = backend.caps(), functools.partial(PredictionCache(backend), "gpu")  # one prediction per setup
        checks = []
        for device in runtime.get("devices") or []:  # each GPU judged as itself: a host may mix GPUs
            own = dataclasses.replace(caps, name=device["name"], capability=tuple(device["capability"]))
            checks += check_device_memory(device, heaviest_cases(own, device["total_memory_bytes"], predict))
        return checks
    except Exception as e:  # noqa: BLE001 - the other checks still say what they found
        return [Check("gpu_memory", "warn", f"could not predict the heaviest cases: {type(e).__name__}: {e}")]


def _toolchain_check(uses_cuda: bool, profile_name: str, environ: Mapping[str, str]) -> Check:
    try:
        cases = compile_cases(profile_name)
    except Exception as e:  # noqa: BLE001 - a suite being edited must not hide the other checks
        return Check("compile_toolchain", "warn", f"could not list the compile cases: {type(e).__name__}: {e}")
    return check_compile_toolchain(uses_cuda, host.c_compiler(environ, cxx=not uses_cuda), host.python_header(), cases)


def format_checks(checks: list[Check]) -> list[str]:
    """One line per check: ``STATUS  name: message``."""
    return [f"{c.status:<4}  {c.name}: {c.message}" for c in checks]


def write_checks(path, checks: list[Check]) -> None:
    """``doctor --json PATH``: every check as a JSON list (name, status, message), written whole."""
    write_json_atomic(path, [dataclasses.asdict(c) for c in checks])


def read_checks(path) -> list[Check]:
    """The checks ``write_checks`` wrote at ``path``; none where it is missing or not that list (a doctor that did
    not finish)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    checks = []
    for item in data if isinstance(data, list) else []:
        try:
            checks.append(Check(item["name"], item["status"], item["message"]))
        except (TypeError, KeyError, ValueError):  # not a check this doctor wrote
            continue
    return checks


def doctor_record(checks: list[Check]) -> dict:
    """A JSON-able summary for saved machine info: every check, and how many blockers and warnings."""
    return {"checks": [dataclasses.asdict(c) for c in checks],
            "blockers": sum(c.status == "FAIL" for c in checks),
            "warnings": sum(c.status == "warn" for c in checks)}
