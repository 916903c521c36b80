"""What a device offers and how budgets name it, without torch: peak throughput by GPU name, the precision a step
computes in, ``DeviceCaps`` (also rebuilt from a recorded identity), which runs compare (``comparable_device``),
budgets-file section names, the host CPU's model.

Torch-free so that reading saved runs, budgets and verdicts (``core.records.budgets``, ``verdicts.calibrate``, the fleet) never
imports torch; the live backends are ``trainbench.devices.device``'s, which re-exports these names.
"""

from __future__ import annotations

import functools
import platform
import re
from dataclasses import dataclass


# Dense peak tensor/vector throughput in TFLOP/s per GPU model and form factor, from NVIDIA's
# data sheets (halved where a sheet quotes 2:4 sparsity). A GPU is matched by the whole name
# torch.cuda.get_device_name() gives, most specific pattern first: "L4" must not match
# "L40S", nor "H100" an "H100 PCIe", nor "V100" a "V100S". A GPU missing here reports no MFU.
PEAK_TFLOPS: list[tuple[str, dict[str, float]]] = [
    (r"\bV100S\b", {"fp32": 16.4, "fp16": 130.0}),
    (r"\bV100\b.*\bPCIE\b", {"fp32": 14.0, "fp16": 112.0}),
    (r"\bV100\b", {"fp32": 15.7, "fp16": 125.0}),  # SXM2 / SXM3
    (r"\bT4\b", {"fp32": 8.1, "fp16": 65.0}),
    (r"\bA100\b", {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0}),  # SXM4 and PCIe alike
    (r"\bA10\b", {"fp32": 31.2, "tf32": 62.5, "fp16": 125.0, "bf16": 125.0}),
    # AWS's A10G (G5 instances): more CUDA cores than the A10, half its tensor rate.
    (r"\bA10G\b", {"fp32": 35.0, "tf32": 35.0, "fp16": 70.0, "bf16": 70.0}),
    (r"\bL4\b", {"fp32": 30.3, "tf32": 60.0, "fp16": 121.0, "bf16": 121.0}),
    (r"\bL40S\b", {"fp32": 91.6, "tf32": 183.0, "fp16": 362.0, "bf16": 362.0}),
    (r"\bH100\b.*\bPCIe\b", {"fp32": 51.0, "tf32": 378.0, "fp16": 756.0, "bf16": 756.0}),
    (r"\bH100\b.*\bNVL\b", {"fp32": 60.0, "tf32": 417.5, "fp16": 835.5, "bf16": 835.5}),
    (r"\bH100\b", {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4}),  # SXM5 ("H100 80GB HBM3")
    (r"\bH200\b.*\bNVL\b", {"fp32": 60.0, "tf32": 417.5, "fp16": 835.5, "bf16": 835.5}),
    (r"\bH200\b", {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4}),  # SXM
    (r"\bB200\b", {"fp32": 75.0, "tf32": 1100.0, "fp16": 2250.0, "bf16": 2250.0}),  # HGX B200, per GPU
    # GeForce: fp16/bf16 tensor rate with fp32 accumulation (what autocast's matmuls use), half the fp16-accumulate one.
    (r"\bRTX 4090\b", {"fp32": 82.6, "tf32": 82.6, "fp16": 165.2, "bf16": 165.2}),
]


# Devices whose name matches a row of PEAK_TFLOPS but whose peak is not that row's, and why they get no MFU. A MIG
# slice ("NVIDIA H100 80GB HBM3 MIG 1g.10gb") has a fraction of the GPU's SMs (16 of 132 for 1g.10gb: not 1/7):
# against the whole GPU's peak its MFU would read up to 8x low.
NO_PEAK: list[tuple[str, str]] = [
    (r"\bMIG\b", "a MIG slice has a share of the GPU's SMs, not the whole GPU's peak: MFU not computed"),
]


def no_peak_reason(device_name: str) -> str | None:
    """Why ``device_name`` gets no peak though its model may be in the table (a MIG slice), else None."""
    return next((why for pattern, why in NO_PEAK if re.search(pattern, device_name, flags=re.IGNORECASE)), None)


def peak_tflops(device_name: str, dtype: str) -> float | None:
    """Peak dense TFLOP/s of a known GPU for ``dtype`` ("fp32", "tf32", "fp16", "bf16"), else None."""
    if no_peak_reason(device_name):
        return None
    for pattern, peaks in PEAK_TFLOPS:
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            return peaks.get(dtype)
    return None


# Above this share of a step's FLOPs in convolutions, cuDNN's TF32 flag decides what the step computes in;
# below it, the matmuls do (cuBLAS's flag).
MOSTLY_CONVOLUTION = 0.5


def compute_precision(amp: str | None, tf32_matmul: bool, tf32_cudnn: bool, capability: tuple[int, int] | None,
                      convolution_share: float = 0.0) -> str:
    """The precision whose peak bounds a step: the autocast dtype, else TF32 where the flag of the kernels that do
    most of the FLOPs allows it on sm_80+ (cuDNN's for a step that is mostly convolutions, where it is on by
    default; cuBLAS's matmul flag otherwise, off by default), else fp32. An fp32 transformer under cuDNN's default
    TF32 computes in fp32: against the TF32 peak its MFU would read ~7x too low."""
    if amp:
        return amp
    tf32 = tf32_cudnn if convolution_share > MOSTLY_CONVOLUTION else tf32_matmul
    if tf32 and capability is not None and capability >= (8, 0):
        return "tf32"
    return "fp32"


@dataclass(frozen=True)
class DeviceCaps:
    """What a device offers, as requirements and reports ask it: from a live backend or a recorded identity."""

    kind: str
    name: str
    cuda: bool = False
    capability: tuple[int, int] | None = None
    gpu_count: int = 0
    bf16: bool | None = None  # None: unknown (an identity recorded without it)
    # The GPUs the host has where this process was pinned to one of them (pin_to_one_gpu: one per pytest-xdist
    # worker), so gpu_count is 1; 0: not pinned.
    pinned_among: int = 0

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
        keys = [self.name] if gpu_name_problem(self.name) is None else []  # a section so named is refused: none applies
        if self.capability:
            keys.append(f"sm_{self.capability[0]}{self.capability[1]}")
        return keys + ["cuda"]


def comparable_device(identity: dict | None) -> tuple | None:
    """What two runs must share to be compared: the device kind and name, and on the CPU the kernels torch
    dispatches to (``cpu_capability``: AVX2 and AVX-512 machines run other kernels, and bf16 convolutions
    even other operators). None for a record that has no device identity."""
    if not isinstance(identity, dict) or "kind" not in identity:
        return None
    device = (identity.get("kind"), identity.get("name"))
    return device + (identity.get("cpu_capability"),) if identity.get("kind") == "cpu" else device


# Budget-file sections a typo is most likely meant for ("did you mean").
BUDGET_SECTION_EXAMPLES = ["cpu", "cuda", "sm_70", "sm_80", "sm_90"]

# What a CPU's model name has (/proc/cpuinfo's "model name": a CPU backend's name) and no GPU's name (get_device_name)
# has: a budgets section named after the CPU ("AMD EPYC 7B13", the name a "no section for ..." line shows) can
# never apply, since a CPU answers to [cpu] only.
_CPU_NAME = re.compile(r"\b(?:CPU|Processor|EPYC|Xeon|Ryzen|Threadripper|Opteron|Core\(TM\)|Pentium|Celeron|Atom|"
                       r"Neoverse|Graviton|Altra|Kunpeng)\b|\d\s*GHz\b|^Apple M\d", re.IGNORECASE)


def gpu_name_problem(name: str) -> str | None:
    """Why no GPU's full name as the driver gives it (``get_device_name``) can be ``name``, or None where one may be:
    several words ("Tesla T4", "NVIDIA L4"), no space around them, and no CPU's name. A GPU's name is a budgets
    section exactly when this says None (``DeviceCaps.budget_keys``): real GPUs beyond ``fleet.FLEET`` included."""
    if " " not in name.strip():
        return "neither a device class nor a GPU's full name, which has several words"
    if name != name.strip():
        return "spaces around a name: a GPU's has none, and sections match it exactly"
    if _CPU_NAME.search(name) or name == cpu_model():
        return "a CPU's name: a CPU answers to [cpu] only"
    return None


def budget_section_problem(key: str, gpu_names=()) -> str | None:
    """Why no device answers to budgets section ``key`` (``DeviceCaps.budget_keys``), or None where some device does:
    ``cpu`` (every CPU), ``cuda`` (every GPU), ``sm_<major><minor>`` (a GPU of that capability) or a GPU's full name
    (``gpu_name_problem``). ``gpu_names``: GPU names known here (the fleet's): one written in other letter case
    never matches it, and no other GPU has it."""
    if key in ("cpu", "cuda") or re.fullmatch(r"sm_\d{2,3}", key):
        return None
    if any(name.lower() == key.strip().lower() and name != key for name in gpu_names):
        return "a GPU's name written otherwise: sections match it exactly"
    return gpu_name_problem(key)


def is_budget_section(key: str) -> bool:
    """A budgets-file section some device answers to (``budget_section_problem``)."""
    return budget_section_problem(key) is None


@dataclass(frozen=True)
class PeakMemory:
    """Allocator peaks since the last reset (None where the device has no allocator stats)."""

    allocated_bytes: int | None = None
    reserved_bytes: int | None = None
    alloc_retries: int | None = None


@functools.lru_cache(maxsize=1)  # read once: every measurement records the device identity
def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def convolution_share(flops_by_op: dict) -> float:
    """The share of a step's FLOPs in convolutions (forward and backward), from ``FlopCounterMode``'s per-op
    counts: which TF32 flag (cuDNN's or cuBLAS's) decides the precision the step computes in."""
    total = sum(flops_by_op.values())
    return sum(n for op, n in flops_by_op.items() if "conv" in str(op)) / total if total else 0.0
