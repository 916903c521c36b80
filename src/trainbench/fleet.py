"""A table of named GPUs the night's plan can be made for on a CPU runner (``trainbench.simulated``).

Each entry is what a live ``CudaBackend`` would read from the driver: the name exactly as
the driver gives it (``get_device_name``) (budget sections and the peak-TFLOP/s table match on it),
compute capability, memory as torch reports it, SM count, native bf16, torch's TF32 defaults,
and how many such GPUs the machine has. Peak TFLOP/s per precision are not repeated here:
``device.peak_tflops`` answers them from the name, for real and simulated GPUs alike.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .device import peak_tflops

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
    # torch's defaults on every GPU: fp32 matmuls in full precision, cuDNN convolutions may use TF32 (sm_80+).
    tf32_matmul: bool = False
    tf32_cudnn: bool = True

    @property
    def sm(self) -> str:
        return f"sm_{self.capability[0]}{self.capability[1]}"

    def peak_tflops(self, precision: str) -> float | None:
        """Dense peak TFLOP/s of one of these GPUs for ``precision`` (the MFU table's answer)."""
        return peak_tflops(self.name, precision)

    def times(self, count: int) -> Gpu:
        """The same GPU, ``count`` of them in one machine."""
        return replace(self, key=f"{count}x{self.key}", count=count)


def _gib(gib: float) -> int:
    return int(gib * GiB)


# Memory: the total capacity torch reports for each model (its out-of-memory message's "total capacity"),
# to 0.1 GiB; it moves by ~1% with the driver and ECC, and a real run reads its own.
H100_SXM = Gpu("h100-sxm", "NVIDIA H100 80GB HBM3", (9, 0), _gib(79.1), 132, bf16=True)
H100_PCIE = Gpu("h100-pcie", "NVIDIA H100 PCIe", (9, 0), _gib(79.1), 114, bf16=True)
A100_40GB = Gpu("a100-40gb", "NVIDIA A100-SXM4-40GB", (8, 0), _gib(39.4), 108, bf16=True)
L4 = Gpu("l4", "NVIDIA L4", (8, 9), _gib(22.0), 58, bf16=True)
T4 = Gpu("t4", "Tesla T4", (7, 5), _gib(14.6), 40, bf16=False)
V100_16GB = Gpu("v100-16gb", "Tesla V100-SXM2-16GB", (7, 0), _gib(15.8), 80, bf16=False)
H200 = Gpu("h200", "NVIDIA H200", (9, 0), _gib(139.8), 132, bf16=True)

FLEET: dict[str, Gpu] = {gpu.key: gpu for gpu in (
    H100_SXM, H100_PCIE, A100_40GB, L4, T4, V100_16GB, H200, H100_SXM.times(2), H100_SXM.times(8))}


def find_gpu(model: str) -> Gpu:
    """The fleet member ``model`` names: its key ("h100-sxm", "2xh100-sxm") or its device name, optionally
    prefixed with a count ("2x" + name). Raises ``KeyError`` listing the fleet."""
    if model in FLEET:
        return FLEET[model]
    count, _, rest = model.partition("x")
    name, times = (rest, int(count)) if count.isdigit() and rest else (model, 1)
    for gpu in FLEET.values():
        if gpu.count == 1 and name in (gpu.name, gpu.key):
            return gpu if times == 1 else gpu.times(times)
    known = ", ".join(f"{gpu.key} ({gpu.name}{f' x{gpu.count}' if gpu.count > 1 else ''})" for gpu in FLEET.values())
    raise KeyError(f"unknown GPU {model!r}; the fleet: {known}")
