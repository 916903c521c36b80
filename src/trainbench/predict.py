"""Device memory of a training setup predicted without running it: FakeTensorMode + MemTracker.

Under ``FakeTensorMode`` every tensor has shape, dtype, strides and device but no data, and
no kernel runs: a step of ResNet-18 at 224 px and batch 1024 takes about a second on a CPU
and no memory. ``MemTracker`` follows the fake storages exactly as it follows real ones, so
the same code that measures a case's breakdown (parameters, gradients, optimizer state,
activations, temporaries, tracked peak) predicts it at the GPU profile's sizes on a CPU runner.

What it is: the live-tensor peak of one step after ``PREDICTED_STEPS`` untracked ones (so
gradients and optimizer state exist, as in the measured breakdown). What it is not: the
CUDA caching allocator's rounding, fragmentation and cached blocks, cuDNN/cuBLAS workspaces
and the CUDA context (``max_memory_allocated`` is above it by those). On a CPU runner the
fake tensors live on the CPU: CPU autocast casts a slightly different op list than CUDA
autocast, and CPU kernels save different extras for backward than cuDNN (e.g. BatchNorm's
reserve space), so a prediction made there differs from one made on the GPU by such buffers.
Optimizers take the implementation torch would take for real tensors on the same device
(foreach on CUDA: ``optimizer_path_of_real_tensors``), with its all-parameters temporaries.

Setups whose step depends on data or runs real kernels cannot be faked; ``unpredictable``
says which and why.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import warnings
from collections.abc import Iterator

from .device import Backend, DeviceCaps
from .recipes import TrainConfig
from .spec import TrainingSpec
from .training import TrainingSetup

PREDICTED_STEPS = 1  # untracked steps before the tracked one: gradients and optimizer state exist

# The GPU a GPU-profile setup is predicted for when the runner has none: which ladder rungs and
# recipe knobs apply (tensor cores, bf16). Memory does not depend on which GPU it is.
NOMINAL_GPU = DeviceCaps("cuda", "a GPU of compute capability 9.0 (nominal)", cuda=True, capability=(9, 0),
                         gpu_count=1, bf16=True)


# A device needs more than the tensor peak: the caching allocator's rounding and fragmentation,
# cuDNN/cuBLAS workspaces, the CUDA context. A case predicted above total / HEADROOM is skipped.
HEADROOM = 1.25

# How far the allocator's peak may be from the prediction on a GPU, beyond the workspaces below:
# rounding to the caching allocator's blocks and the few buffers CPU and CUDA kernels save differently.
PEAK_TOLERANCE = 0.10

# cuBLAS's workspace, from torch 2.14's aten/src/ATen/cuda/CublasHandlePool.cpp: CUBLAS_WORKSPACE_CONFIG
# (":SIZE_KiB:COUNT" pairs, summed) or, unset, ":4096:8" (32 MiB) on sm_90 and ":4096:2:16:8" (8.125 MiB)
# elsewhere. cuBLASLt adds its own, CUBLASLT_WORKSPACE_SIZE (default 1 MiB), unless it shares cuBLAS's.
# Each is allocated once per cuBLAS handle through the caching allocator, so max_memory_allocated
# counts it; a handle is per thread: the training thread's and autograd's device thread's (backward).
# cuDNN's convolution workspace depends on the algorithm chosen; no setting sizes it.
_CUBLAS_DEFAULT_KIB = {(9, 0): 4096 * 8}
_CUBLAS_OTHER_KIB = 4096 * 2 + 16 * 8
_CUBLASLT_DEFAULT_KIB = 1024
_CUBLAS_HANDLES = 2


def cublas_workspace_bytes(capability: tuple[int, int] | None, cublas_config: str | None) -> int:
    """Bytes of one cuBLAS handle's workspace as torch sizes it on a GPU of ``capability``."""
    pairs = re.findall(r":([0-9]+):([0-9]+)", cublas_config or "")
    if pairs:
        return sum(int(size) * int(count) for size, count in pairs) * 1024
    return _CUBLAS_DEFAULT_KIB.get(capability, _CUBLAS_OTHER_KIB) * 1024


def library_workspace_bytes(capability: tuple[int, int] | None, cublas_config: str | None) -> int:
    """The most the cuBLAS and cuBLASLt workspaces of a training step add to ``max_memory_allocated``."""
    return _CUBLAS_HANDLES * (cublas_workspace_bytes(capability, cublas_config) + _CUBLASLT_DEFAULT_KIB * 1024)


def allocator_peak_bounds(predicted_total: int, capability: tuple[int, int] | None,
                          cublas_config: str | None) -> tuple[int, int]:
    """The range of ``max_memory_allocated`` a GPU step of predicted tensor peak ``predicted_total`` may show:
    the prediction within ``PEAK_TOLERANCE``, plus at most the library workspaces above it."""
    margin = PEAK_TOLERANCE * predicted_total
    return (int(predicted_total - margin),
            int(predicted_total + margin) + library_workspace_bytes(capability, cublas_config))


def without_unpredictable(config: TrainConfig) -> TrainConfig:
    """The nearest setup fake tensors can run: no compilation, one process with the same per-process batch."""
    return dataclasses.replace(config, compile=False, fuse_pointwise=None, parallel=None, world_size=1, replicas=1,
                               dist_backend=None, debug=None if config.debug in ("anomaly", "profiler") else config.debug)


def unpredictable(config: TrainConfig) -> str | None:
    """Why FakeTensorMode cannot predict this setup's memory, or None."""
    if config.compile or config.fuse_pointwise:
        return "compiled code (torch.compile, TorchScript) runs its own kernels, which fake tensors cannot enter"
    if config.parallel:
        return "data parallelism runs replicas in other threads or processes, outside the fake mode"
    if config.debug == "anomaly":
        return "anomaly mode checks every gradient for NaN: a data-dependent test fake tensors cannot answer"
    if config.debug == "profiler":
        return "the profiler records real kernels, none of which run under fake tensors"
    return None


class _OneSampleBatches:
    """Loader-shaped batches without a loader: one real sample, collated ``batch_size`` times (fake, no data)."""

    def __init__(self, dataset, batch_size: int):
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        with unset_fake_temporarily():  # a real sample: transforms may test values (Normalize checks std != 0)
            self.sample = dataset[0]
        self.batch_size = batch_size

    def __iter__(self) -> Iterator:
        return self

    def __next__(self):
        from torch.utils.data import default_collate

        return default_collate([self.sample] * self.batch_size)


@contextlib.contextmanager
def _no_weight_init():
    """``torch.nn.init``'s in-place initializers as no-ops while a fake model is built.

    Fake weights have no values to initialize, and some initializers test values (``trunc_normal_``
    resamples until none lies outside its bounds), which fake tensors cannot answer.
    """
    from torch.nn import init

    names = [name for name in dir(init) if name.endswith("_") and not name.startswith("_")
             and callable(getattr(init, name))]
    saved = {name: getattr(init, name) for name in names}
    try:
        for name in names:
            setattr(init, name, lambda tensor, *args, **kwargs: tensor)
        yield
    finally:
        for name, fn in saved.items():
            setattr(init, name, fn)


@contextlib.contextmanager
def optimizer_path_of_real_tensors():
    """torch's optimizers and gradient clipping choose their implementation as they would for real tensors.

    They take the foreach path (one temporary the size of all parameters) only for tensors whose type is exactly
    ``Tensor`` or ``Parameter`` on a device with foreach kernels, so fake parameters on ``cuda`` would take the
    per-parameter loop a real CUDA run never takes, and the prediction would miss that temporary (~0.5 GB for
    GPT-2). Listing the fake type beside them, as torch itself lists ``DTensor``, leaves the device to decide:
    foreach on ``cuda``, the loop on the CPU, as for real tensors.
    """
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.optim import optimizer
    from torch.utils import _foreach_utils

    lists = [types for types in (optimizer._foreach_supported_types, _foreach_utils._foreach_supported_types)
             if FakeTensor not in types]
    for types in lists:
        types.append(FakeTensor)
    try:
        yield
    finally:
        for types in lists:
            types.remove(FakeTensor)


class _PredictedTraining(TrainingSetup):
    """A ``TrainingSetup`` whose data never comes from a real loader and whose steps never ask the data a question."""

    def batches(self) -> Iterator:
        if self._iterator is None:
            if self.synthetic:
                return super().batches()
            self._iterator = _OneSampleBatches(self.loader.dataset, self.batch_size)
        return self._iterator

    def step_optimizer(self, optimizer, name: str) -> None:
        # GradScaler.step asks whether any gradient overflowed (a host sync on a value fake tensors do
        # not have); its unscaling and the update allocate the same either way.
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)
            self._scaler_stepped = True
        optimizer.step()


def predict_memory(config: TrainConfig, spec: TrainingSpec, backend: Backend, steps: int = PREDICTED_STEPS) -> dict:
    """The tracked breakdown of one step of ``config`` on ``spec``, from fake tensors on ``backend``'s device.

    Returns ``{"device", "batch_size", "breakdown_bytes"}``, or ``{"reason"}`` where the setup cannot be faked.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from .measure import Measurer, MeasureSettings

    reason = unpredictable(config)
    if reason:
        return {"reason": reason}
    # A shape environment lets ``.item()`` (a logged loss) return a symbol instead of failing.
    mode = FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv())
    try:
        with mode, optimizer_path_of_real_tensors(), contextlib.ExitStack() as stack:
            with _no_weight_init(), warnings.catch_warnings():
                # The loader is never iterated here: its worker count suits the GPU runner, not this one.
                warnings.filterwarnings("ignore", message="This DataLoader will create")
                training = _PredictedTraining(config, spec, backend)
            stack.enter_context(training)
            measurement = Measurer(training, "predicted", "predicted", MeasureSettings(), 0, "")
            batches = training.batches()
            for _ in range(steps):
                training.step(training.fetch(batches))
            breakdown = measurement.tracked_breakdown()
    except Exception as e:  # noqa: BLE001 - any op fake tensors cannot run: say which, keep the case
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return {"reason": f"FakeTensorMode could not run the step: {type(e).__name__}: {first[:300]}"}
    return {"device": backend.device.type, "batch_size": training.samples_per_step, "breakdown_bytes": breakdown}


class PredictionCache:
    """``predict_memory`` once per setup in a session: a prediction takes a second or more, and the memory
    check before a case, ladders and the GPU-profile prediction after it ask for the same setups again."""

    def __init__(self, backend: Backend):
        self.backend = backend
        self._predictions: dict[tuple, dict] = {}  # by (profile, spec, config)

    def __call__(self, profile_name: str, config: TrainConfig, spec: TrainingSpec) -> dict:
        key = (profile_name, spec.name, config)
        if key not in self._predictions:
            self._predictions[key] = predict_memory(config, spec, self.backend)
        return self._predictions[key]
