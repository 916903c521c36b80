"""The GPUs the night's plan can be made for on a CPU runner (``trainbench.devices.simulated``): a table of named ones, and
any other from an explicit spec (``parse_gpu``, the one reader of ``--simulate-gpu`` and ``--trainbench-simulate-gpu``).

Each entry is what a live ``CudaBackend`` would read from the driver: the name exactly as
the driver gives it (``get_device_name``) (budget sections and the peak-TFLOP/s table match on it),
compute capability, memory as torch reports it, SM count, native bf16, torch's TF32 defaults,
and how many such GPUs the machine has; and its peak memory bandwidth from the data sheet (the
roofline's memory term). Peak TFLOP/s per precision are not repeated here:
``device.peak_tflops`` answers them from the name, for real and simulated GPUs alike; only a GPU
given by an explicit spec may carry its own, which answer first.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from trainbench.devices.caps import peak_tflops

GiB = 2**30

# What the default torch wheel (PyPI's torch 2.14.1, CUDA 13.0) has kernels for, as get_arch_list()
# gives it: the night's build where the plan is made on a CPU-only torch. sm_70 (V100) needs a CUDA 12.6 wheel.
DEFAULT_WHEEL_CUDA = "13.0"
DEFAULT_WHEEL_ARCHS = ("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120")


@dataclass(frozen=True)
class Gpu:
    """One fleet member: a GPU model and how many of it a machine has."""

    key: str  # short name for the command line and tests, e.g. "h100-sxm", "8xh100"
    name: str  # as torch reports it (get_device_name)
    capability: tuple[int, int]
    memory_bytes: int  # get_device_properties().total_memory: less than the data sheet's figure
    multiprocessors: int
    bf16: bool  # native bf16 (is_bf16_supported(including_emulation=False))
    count: int = 1
    bandwidth_gbs: float | None = None  # peak device-memory bandwidth, GB/s (data sheet; None: unknown)
    # Dense peak TFLOP/s per precision given with an explicit spec: answered before device.peak_tflops's name table.
    peaks: tuple[tuple[str, float], ...] = ()
    # torch's defaults on every GPU: fp32 matmuls in full precision, cuDNN convolutions may use TF32 (sm_80+).
    tf32_matmul: bool = False
    tf32_cudnn: bool = True

    @property
    def sm(self) -> str:
        return f"sm_{self.capability[0]}{self.capability[1]}"

    def peak_tflops(self, precision: str) -> float | None:
        """Dense peak TFLOP/s of one of these GPUs for ``precision``: the spec's own, else the MFU table's answer."""
        return dict(self.peaks).get(precision) or peak_tflops(self.name, precision)

    def times(self, count: int) -> Gpu:
        """The same GPU, ``count`` of them in one machine."""
        return replace(self, key=f"{count}x{self.key}", count=count)


def _gib(gib: float) -> int:
    return int(gib * GiB)


# Memory: the total capacity torch reports for each model (its out-of-memory message's "total capacity"),
# to 0.1 GiB; it moves by ~1% with the driver and ECC, and a real run reads its own. Bandwidth: the data sheet's.
H100_SXM = Gpu("h100-sxm", "NVIDIA H100 80GB HBM3", (9, 0), _gib(79.1), 132, bf16=True, bandwidth_gbs=3350)
H100_PCIE = Gpu("h100-pcie", "NVIDIA H100 PCIe", (9, 0), _gib(79.1), 114, bf16=True, bandwidth_gbs=2000)
A100_40GB = Gpu("a100-40gb", "NVIDIA A100-SXM4-40GB", (8, 0), _gib(39.4), 108, bf16=True, bandwidth_gbs=1555)
A100_80GB = Gpu("a100-80gb", "NVIDIA A100-SXM4-80GB", (8, 0), _gib(79.1), 108, bf16=True, bandwidth_gbs=2039)
L4 = Gpu("l4", "NVIDIA L4", (8, 9), _gib(22.0), 58, bf16=True, bandwidth_gbs=300)
L40S = Gpu("l40s", "NVIDIA L40S", (8, 9), _gib(44.4), 142, bf16=True, bandwidth_gbs=864)
A10G = Gpu("a10g", "NVIDIA A10G", (8, 6), _gib(22.0), 80, bf16=True, bandwidth_gbs=600)
RTX_4090 = Gpu("rtx4090", "NVIDIA GeForce RTX 4090", (8, 9), _gib(23.6), 128, bf16=True, bandwidth_gbs=1008)
T4 = Gpu("t4", "Tesla T4", (7, 5), _gib(14.6), 40, bf16=False, bandwidth_gbs=320)
V100_16GB = Gpu("v100-16gb", "Tesla V100-SXM2-16GB", (7, 0), _gib(15.8), 80, bf16=False, bandwidth_gbs=900)
H200 = Gpu("h200", "NVIDIA H200", (9, 0), _gib(139.8), 132, bf16=True, bandwidth_gbs=4800)
B200 = Gpu("b200", "NVIDIA B200", (10, 0), _gib(178.4), 148, bf16=True, bandwidth_gbs=8000)  # HGX B200, per GPU

FLEET: dict[str, Gpu] = {gpu.key: gpu for gpu in (
    H100_SXM, H100_PCIE, A100_40GB, A100_80GB, L4, L40S, A10G, RTX_4090, T4, V100_16GB, H200, B200,
    H100_SXM.times(2), H100_SXM.times(8))}


class GpuSpecError(ValueError):
    """A ``--simulate-gpu`` value that names no fleet GPU, or an explicit spec with a bad field: one line."""


def find_gpu(model: str) -> Gpu:
    """The fleet member ``model`` names: its key ("h100-sxm", "2xh100-sxm") or its device name, optionally
    prefixed with a count ("2x" + name). Raises ``KeyError`` listing the fleet."""
    if model in FLEET:
        return FLEET[model]
    count, _, rest = model.partition("x")
    name, times = (rest, int(count)) if count.isascii() and count.isdigit() and rest else (model, 1)
    if times < 1:
        raise KeyError(f"{model!r}: a machine has 1 or more GPUs, got {times}")
    for gpu in FLEET.values():
        if gpu.count == 1 and name in (gpu.name, gpu.key):
            return gpu if times == 1 else gpu.times(times)
    known = ", ".join(f"{gpu.key} ({gpu.name}{f' x{gpu.count}' if gpu.count > 1 else ''})" for gpu in FLEET.values())
    raise KeyError(f"unknown GPU {model!r}; the fleet: {known}, or an explicit spec ({SPEC_HELP})")


PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
# The fields of an explicit spec: (what is expected, reader). name, memory_gib, capability and sms are required.
_SPEC_FIELDS = {
    "name": "the name torch would report", "memory_gib": "GiB > 0", "capability": "MAJOR.MINOR, e.g. 8.9",
    "sms": "a whole number > 0", "bf16": "1 or 0", "count": "a whole number > 0", "bandwidth_gbs": "GB/s > 0",
    **{f"tflops_{p}": "TFLOP/s > 0" for p in PRECISIONS}}
_REQUIRED = ("name", "memory_gib", "capability", "sms")
SPEC_HELP = ("name=NAME,memory_gib=GIB,capability=MAJOR.MINOR,sms=N[,bf16=1|0][,count=N][,bandwidth_gbs=GBS]"
             "[,tflops_fp32=T][,tflops_tf32=T][,tflops_fp16=T][,tflops_bf16=T]")


def parse_gpu(text: str) -> Gpu:
    """The GPU ``text`` gives: a fleet member's key or name (``find_gpu``), or an explicit spec
    ``name=...,memory_gib=...,capability=...,sms=...`` with optional ``bf16`` (default: capability >= 8.0),
    ``count``, ``bandwidth_gbs`` and ``tflops_<precision>`` (missing peaks come from the name's table entry, if
    any). Raises ``GpuSpecError`` naming the field and what it expects."""
    text = text.strip()
    if "=" not in text:
        try:
            return find_gpu(text)
        except KeyError as e:
            raise GpuSpecError(e.args[0]) from None
    fields: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, eq, value = (s.strip() for s in part.partition("="))
        if not eq or key not in _SPEC_FIELDS:
            raise GpuSpecError(f"GPU spec: {part!r} is not a field; expected {SPEC_HELP}")
        if key in fields:
            raise GpuSpecError(f"GPU spec: {key} given twice")
        fields[key] = value
    missing = [key for key in _REQUIRED if not fields.get(key)]
    if missing:
        raise GpuSpecError(f"GPU spec: {missing[0]} missing: expected {_SPEC_FIELDS[missing[0]]} ({SPEC_HELP})")
    capability = _capability(fields["capability"])
    peaks = tuple((p, _number(fields, f"tflops_{p}")) for p in PRECISIONS if f"tflops_{p}" in fields)
    count = int(_number(fields, "count", whole=True)) if "count" in fields else 1
    memory_bytes = _number(fields, "memory_gib") * GiB
    if not 1 <= memory_bytes < 2**63:  # 0 bytes, or more than any size a device reports (float("inf") among them)
        raise GpuSpecError(f"GPU spec: memory_gib={fields['memory_gib']!r}: expected {_SPEC_FIELDS['memory_gib']}, "
                           "from 1 byte to under 2**63 bytes")
    gpu = Gpu(key=fields["name"], name=fields["name"], capability=capability,
              memory_bytes=int(memory_bytes), multiprocessors=int(_number(fields, "sms", whole=True)),
              bf16=_flag(fields["bf16"]) if "bf16" in fields else capability >= (8, 0),
              bandwidth_gbs=_number(fields, "bandwidth_gbs") if "bandwidth_gbs" in fields else None, peaks=peaks)
    return gpu if count == 1 else gpu.times(count)


def _number(fields: dict[str, str], key: str, whole: bool = False) -> float:
    """A field's positive number (a whole one where ``whole``), or ``GpuSpecError`` naming it."""
    try:
        value = float(fields[key])
    except ValueError:
        value = float("nan")
    if not (0 < value < float("inf")) or (whole and value != int(value)):
        raise GpuSpecError(f"GPU spec: {key}={fields[key]!r}: expected {_SPEC_FIELDS[key]}")
    return value


def _capability(text: str) -> tuple[int, int]:
    major, dot, minor = text.partition(".")
    if not (dot and major.isdigit() and minor.isdigit() and len(minor) == 1):
        raise GpuSpecError(f"GPU spec: capability={text!r}: expected {_SPEC_FIELDS['capability']}")
    return int(major), int(minor)


def _flag(text: str) -> bool:
    if text.lower() not in ("1", "0", "true", "false", "yes", "no"):
        raise GpuSpecError(f"GPU spec: bf16={text!r}: expected {_SPEC_FIELDS['bf16']}")
    return text.lower() in ("1", "true", "yes")
