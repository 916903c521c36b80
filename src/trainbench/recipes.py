"""Optimizations as declarative changes to a training configuration.

A ``Recipe`` names the knobs it turns (``amp="fp16"``, ``num_workers=8`` ...), what the
device must offer for it to make sense (CUDA, a compute capability, several GPUs) and
how much extra warm-up it needs. Recipes compose, so the seeds' cumulative ladders are
lists of recipes. ``step.py`` is the one place where each knob takes effect.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from .workloads import Profile, get_workload

AMP_DTYPES = ("fp16", "bf16")


@dataclass(frozen=True)
class TrainConfig:
    """Everything that decides how one training step runs. Defaults are the seeds' baseline."""

    workload: str = "resnet18"
    batch_size: int | None = None  # None: the profile's default
    num_workers: int = 0
    pin_memory: bool = False
    non_blocking: bool = False
    uint8_transfer: bool = False  # copy uint8 pixels, normalize on the device
    # The seeds' baseline calls ``optimizer.zero_grad()`` meaning "write zeros"; PyTorch 2
    # changed the default to set_to_none=True, so the baseline asks for zeros explicitly.
    set_to_none: bool = False
    amp: str | None = None  # autocast dtype: "fp16" | "bf16"
    grad_scaler: bool = False
    compile: bool = False
    cudnn_benchmark: bool = False
    channels_last: bool = False
    seed: int = 0

    def validate(self) -> "TrainConfig":
        workload = get_workload(self.workload)
        if self.batch_size is not None and (not isinstance(self.batch_size, int) or self.batch_size < 1):
            raise ValueError(f"batch_size must be a positive int, got {self.batch_size!r}")
        if not isinstance(self.num_workers, int) or self.num_workers < 0:
            raise ValueError(f"num_workers must be an int >= 0, got {self.num_workers!r}")
        if self.amp is not None and self.amp not in AMP_DTYPES:
            raise ValueError(f"amp must be one of {AMP_DTYPES} or None, got {self.amp!r}")
        if self.grad_scaler and self.amp is None:
            raise ValueError("grad_scaler=True needs amp set: gradient scaling only exists for mixed precision")
        if self.uint8_transfer and not workload.supports_uint8:
            raise ValueError(f"uint8_transfer needs image inputs; workload {self.workload!r} feeds {workload.input_kind}")
        if self.channels_last and workload.input_kind != "image":
            raise ValueError(f"channels_last needs image inputs; workload {self.workload!r} feeds {workload.input_kind}")
        return self

    def resolved_batch_size(self, profile: Profile) -> int:
        return self.batch_size if self.batch_size is not None else profile.batch_size


_CONFIG_FIELDS = {f.name for f in dataclasses.fields(TrainConfig)}


@dataclass(frozen=True)
class ByProfile:
    """A knob value that depends on the device profile, e.g. batch 64 on CPU, 512 on GPU."""

    cpu: Any
    gpu: Any

    def pick(self, profile: Profile) -> Any:
        return getattr(self, profile.name)


@dataclass(frozen=True)
class Requirements:
    """What a device must offer for a recipe to be meaningful there."""

    cuda: bool = False
    min_capability: tuple[int, int] | None = None
    min_gpus: int = 0
    bf16: bool = False

    def merge(self, other: "Requirements") -> "Requirements":
        caps = [c for c in (self.min_capability, other.min_capability) if c]
        return Requirements(
            cuda=self.cuda or other.cuda,
            min_capability=max(caps) if caps else None,
            min_gpus=max(self.min_gpus, other.min_gpus),
            bf16=self.bf16 or other.bf16,
        )

    def unmet(self, backend) -> str | None:
        """Why ``backend`` cannot run this, or None when it can."""
        if (self.cuda or self.min_capability or self.min_gpus) and backend.kind != "cuda":
            return f"needs a CUDA device; running on {backend.kind}"
        if self.min_capability and backend.capability() < self.min_capability:
            have = ".".join(map(str, backend.capability()))
            need = ".".join(map(str, self.min_capability))
            return f"needs compute capability >= {need}; {backend.name} has {have}"
        if self.min_gpus and backend.device_count() < self.min_gpus:
            return f"needs {self.min_gpus} GPUs; {backend.device_count()} present"
        if self.bf16 and not backend.supports_bf16():
            return f"needs bfloat16 support; {backend.name} has none"
        return None


@dataclass(frozen=True)
class Recipe:
    name: str
    description: str
    changes: Mapping[str, Any] = field(default_factory=dict)
    requires: Requirements = Requirements()
    extra_warmup_steps: int = 0  # compile and autotuning need longer to reach steady state
    slow: bool = False
    # Correctness guard: largest relative loss difference vs the baseline over a few seeded
    # steps (trainbench.guards). None: not guarded, the recipe changes what is trained by design.
    loss_rtol: float | None = None

    def __post_init__(self):
        unknown = set(self.changes) - _CONFIG_FIELDS
        if unknown:
            raise ValueError(f"recipe {self.name!r} changes unknown knobs {sorted(unknown)}; known: {sorted(_CONFIG_FIELDS)}")

    def config(self, profile: Profile, base: TrainConfig | None = None, **overrides) -> TrainConfig:
        """The training config this recipe gives on ``profile``, starting from ``base``."""
        values = {k: (v.pick(profile) if isinstance(v, ByProfile) else v) for k, v in self.changes.items()}
        values.update(overrides)
        return dataclasses.replace(base or TrainConfig(), **values).validate()


def compose(name: str, *recipes: Recipe, description: str | None = None) -> Recipe:
    """One recipe applying ``recipes`` in order (later ones win on the same knob)."""
    changes: dict[str, Any] = {}
    requires = Requirements()
    for r in recipes:
        changes.update(r.changes)
        requires = requires.merge(r.requires)
    return Recipe(
        name=name,
        description=description or " + ".join(r.name for r in recipes),
        changes=changes,
        requires=requires,
        extra_warmup_steps=max((r.extra_warmup_steps for r in recipes), default=0),
        slow=any(r.slow for r in recipes),
        loss_rtol=None if any(r.loss_rtol is None for r in recipes) else max(r.loss_rtol for r in recipes),
    )


BASELINE = Recipe("baseline", "the seeds' starting point: fp32, one process, pageable float32 copies, zero_grad() writing zeros")

RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in [
        BASELINE,
        Recipe(
            "amp_bf16",
            "autocast to bfloat16 (no GradScaler needed: bf16 keeps fp32's exponent range)",
            {"amp": "bf16"},
            Requirements(bf16=True),
            loss_rtol=0.03,  # bf16 keeps 8 mantissa bits; measured 0.0063 on ResNet-18 over 4 steps
        ),
        Recipe(
            "amp_fp16",
            "autocast to float16 with a GradScaler (tensor cores on GPU)",
            {"amp": "fp16", "grad_scaler": True},
            # fp16 pays off on tensor cores; CPUs have no fast fp16 kernels (a step is ~30x slower here).
            Requirements(cuda=True, min_capability=(7, 0)),
            loss_rtol=0.01,
        ),
        Recipe("larger_batch", "4x the batch on CPU, the seeds' 512 on GPU", {"batch_size": ByProfile(cpu=64, gpu=512)}),
        Recipe(
            "uint8_transfer",
            "copy uint8 pixels and normalize on the device: 4x fewer bytes to the device",
            {"uint8_transfer": True},
            loss_rtol=1e-6,  # the same normalization, on the device: bit-identical on CPU
        ),
        Recipe("set_to_none", "zero_grad(set_to_none=True): free gradients instead of writing zeros", {"set_to_none": True},
               loss_rtol=1e-6),
        Recipe(
            "multiprocess_loading",
            "DataLoader worker processes (2 on the CPU profile, the seeds' 8 on GPU)",
            {"num_workers": ByProfile(cpu=2, gpu=8)},
            loss_rtol=1e-6,  # the sampler runs in the main process: same batches, same order
        ),
        Recipe(
            "pinned_memory",
            "page-locked host batches and non_blocking copies that overlap compute",
            {"pin_memory": True, "non_blocking": True},
            Requirements(cuda=True),
            loss_rtol=1e-6,
        ),
        Recipe(
            "cudnn_benchmark",
            "cuDNN autotuner picks the fastest convolution algorithms",
            {"cudnn_benchmark": True},
            Requirements(cuda=True),
            extra_warmup_steps=5,
            loss_rtol=1e-3,  # other convolution algorithms round differently
        ),
        Recipe(
            "channels_last",
            "NHWC memory format for the model and its inputs",
            {"channels_last": True},
            loss_rtol=1e-3,  # NHWC kernels sum in another order: measured 2.7e-5
        ),
        Recipe(
            "compile",
            "torch.compile of the model (compile time is warm-up, not steady state)",
            {"compile": True},
            extra_warmup_steps=10,
            slow=True,
            loss_rtol=1e-3,  # fused kernels round differently
        ),
    ]
}


def get_recipe(name: str) -> Recipe:
    try:
        return RECIPES[name]
    except KeyError:
        raise KeyError(f"unknown recipe {name!r}: expected one of {sorted(RECIPES)}") from None
