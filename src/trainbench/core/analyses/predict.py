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
says which and why, and a step that fails under fake tensors all the same returns its reason.

A prediction costs about two training steps of dispatch in Python whatever the sizes (a second or
two for a ResNet-50). ``PredictionCache`` makes one per memory setup (``memory_setup``: the
knobs that change no tensor of a step left out) and spec in a session.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, unset_fake_temporarily
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.optim import optimizer as torch_optimizer  # torch.optim's own namespace drops the module's name
from torch.utils import _foreach_utils

from trainbench.core.analyses.step_memory import StepMemory
from trainbench.core.harness.failures import failure_line
from trainbench.core.harness.files import write_text_atomic
from trainbench.core.setups.recipes import NotApplicable, TrainConfig, without_unpredictable
from trainbench.core.setups.spec import TrainingSpec, code_fingerprint, map_tensors
from trainbench.core.setups.data import BatchSource
from trainbench.core.setups.effects import ALREADY_COMPILED
from trainbench.core.setups.training import TrainingSetup, Updates, sparse_gradients
from trainbench.devices.device import Backend, DeviceCaps
from trainbench.devices.host import env_value

PREDICTED_STEPS = 1  # untracked steps before the tracked one: gradients and optimizer state exist

# The GPU a GPU-profile setup is predicted for when the runner has none: which ladder rungs and
# recipe knobs apply (tensor cores, bf16). Memory does not depend on which GPU it is.
NOMINAL_GPU = DeviceCaps("cuda", "a GPU of compute capability 9.0 (nominal)", cuda=True, capability=(9, 0),
                         gpu_count=1, bf16=True)



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


def unpredictable(config: TrainConfig) -> str | None:
    """Why FakeTensorMode cannot predict this setup's memory, or None (``Knob.unpredictable``)."""
    for _, why in config.turned("unpredictable"):
        return why
    return None


def memory_setup(config: TrainConfig) -> TrainConfig:
    """The setup whose step holds the same tensors as ``config``'s, with the knobs that change none at their defaults
    (``Knob.same_tensors``): the loader's (workers, pinned memory, non-blocking copies; a prediction never iterates
    it), cuDNN autotuning and ``empty_cache`` (the allocator's), NVTX ranges and a loss logged with ``.item()`` every
    step. Setups that map to one ``memory_setup`` share one prediction."""
    return config.with_defaults("same_tensors")


class _OneSampleBatches:
    """Loader-shaped batches without a loader: one real sample, collated ``batch_size`` times by the loader's collate
    function (the spec's, e.g. one that pads, or ``default_collate``) into fake tensors, no data."""

    def __init__(self, loader):
        with unset_fake_temporarily():  # a real sample: transforms may test values (Normalize checks std != 0)
            self.sample = _plain_tensors(loader.dataset[0])
        self.batch_size, self.collate = loader.batch_size, loader.collate_fn

    def __iter__(self) -> Iterator:
        return self

    def __next__(self):
        return self.collate([self.sample] * self.batch_size)


def _plain_tensors(sample):
    """``sample`` with tensor subclasses (torchvision's ``tv_tensors.Image`` from ``v2.ToImage()``, ...) as plain tensors,
    the type collating them gives in a real loader. FakeTensorMode refuses to run an op on a subclass it does not know
    (``aten.stack``: "Multiple dispatch failed ... all __torch_dispatch__ handlers returned NotImplemented")."""
    def plain(t):
        return t if type(t) in (torch.Tensor, FakeTensor) else t.as_subclass(torch.Tensor)

    return map_tensors(plain, sample)


def _fake_model(build: Callable[[], torch.nn.Module], mode) -> Callable[[], torch.nn.Module]:
    """``build`` for the fake mode: the model built under it where its construction asks its tensors nothing, else
    built from real tensors outside the mode and then made fake (parameters, buffers, ties between them kept).

    Building fake takes no memory and skips the initializers' work, but a constructor that computes a constant from
    tensors fails under fake tensors: timm's ``calculate_drop_path_rates`` (``torch.linspace(...).item()``, ViT,
    ConvNeXt), RegNet's widths. The real build holds the parameters once, uninitialized (``_no_weight_init``).
    """
    def model() -> torch.nn.Module:
        try:
            return build()
        except Exception:  # noqa: BLE001 - a real build raises the model's own error, if it has one
            with unset_fake_temporarily():
                real = build()
            return _made_fake(real, mode) if isinstance(real, torch.nn.Module) else real

    return model


def _made_fake(model: torch.nn.Module, mode) -> torch.nn.Module:
    """``model`` with fake parameters and buffers of the same shapes, dtypes and strides, in place."""
    # One fake tensor per real one, so tied weights stay tied (the real one kept alive while its id is a key).
    converted: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def fake(t: torch.Tensor, parameter: bool) -> torch.Tensor:
        if id(t) not in converted:
            f = mode.from_tensor(t, static_shapes=True)
            converted[id(t)] = t, torch.nn.Parameter(f, requires_grad=t.requires_grad) if parameter else f
        return converted[id(t)][1]

    with torch.no_grad():
        for module in model.modules():
            for name, param in module._parameters.items():
                if param is not None:
                    module._parameters[name] = fake(param, True)
            for name, buffer in module._buffers.items():
                if buffer is not None:
                    module._buffers[name] = fake(buffer, False)
    return model


@contextlib.contextmanager
def _no_weight_init():
    """``torch.nn.init``'s in-place initializers as no-ops while a fake model is built.

    Fake weights have no values to initialize, and some initializers test values (``trunc_normal_``
    resamples until none lies outside its bounds), which fake tensors cannot answer.
    """
    names = [name for name in dir(torch.nn.init) if name.endswith("_") and not name.startswith("_")
             and callable(getattr(torch.nn.init, name))]
    saved = {name: getattr(torch.nn.init, name) for name in names}
    try:
        for name in names:
            setattr(torch.nn.init, name, lambda tensor, *args, **kwargs: tensor)
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch.nn.init, name, fn)


@contextlib.contextmanager
def optimizer_path_of_real_tensors():
    """torch's optimizers and gradient clipping choose their implementation as they would for real tensors.

    They take the foreach path (one temporary the size of all parameters) only for tensors whose type is exactly
    ``Tensor`` or ``Parameter`` on a device with foreach kernels, so fake parameters on ``cuda`` would take the
    per-parameter loop a real CUDA run never takes, and the prediction would miss that temporary (~0.5 GB for
    GPT-2). Listing the fake type beside them, as torch itself lists ``DTensor``, leaves the device to decide:
    foreach on ``cuda``, the loop on the CPU, as for real tensors.
    """
    supported = (torch_optimizer._foreach_supported_types, _foreach_utils._foreach_supported_types)
    lists = [types for types in supported if FakeTensor not in types]
    for types in lists:
        types.append(FakeTensor)
    try:
        yield
    finally:
        for types in lists:
            types.remove(FakeTensor)


class _PredictedBatches(BatchSource):
    """A setup's batches that never come from a real loader."""

    def _loader(self, spec: TrainingSpec, config: TrainConfig):
        # The dataset built as a real run builds it: a constructor may ask its own tensors for values (lengths drawn
        # at random, ``.numpy()`` for PIL images), which fake tensors cannot answer. Only its first sample is read.
        with unset_fake_temporarily():
            return super()._loader(spec, config)

    def batches(self) -> Iterator:
        if self._iterator is None:
            self._iterator = self.batches_from_start()
        return self._iterator

    def batches_from_start(self) -> Iterator:
        # Fake tensors have no values to draw: no global generator to seed around them.
        return self._synthetic_batches() if self.synthetic else _OneSampleBatches(self.loader)

class _PredictedUpdates(Updates):
    def _apply_step(self, optimizer) -> None:
        # GradScaler.step asks whether any gradient overflowed (a host sync on a value fake tensors do
        # not have); its unscaling and the update allocate the same either way.
        if self.setup.scaler is not None:
            self.setup.scaler.unscale_(optimizer)
            self._scaled_steps.add(id(optimizer))
        optimizer.step()


class _PredictedTraining(TrainingSetup):
    """A ``TrainingSetup`` whose data never comes from a real loader and whose steps never ask the data a question."""

    batch_source = _PredictedBatches
    updates_class = _PredictedUpdates


@contextlib.contextmanager
def fake_training(config: TrainConfig, spec: TrainingSpec, backend: Backend) -> Iterator[TrainingSetup]:
    """A ``TrainingSetup`` of ``config`` on ``spec`` under ``FakeTensorMode`` on ``backend``'s device: its steps run
    no kernel and hold no memory. ``config`` must be predictable (``unpredictable`` is None). The memory prediction
    and the roofline's counts (``trainbench.core.analyses.roofline``) both step it."""
    # A shape environment lets ``.item()`` (a logged loss) return a symbol instead of failing.
    mode = FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv())
    with mode, optimizer_path_of_real_tensors(), contextlib.ExitStack() as stack:
        with _no_weight_init(), warnings.catch_warnings():
            # The loader is never iterated here: its worker count suits the GPU runner, not this one.
            warnings.filterwarnings("ignore", message="This DataLoader will create")
            # copy.deepcopy of a fake module (nn.TransformerEncoder clones its layer) asks each fake parameter for its
            # data pointer, which torch warns about, then clones it as a fake tensor: the copies are right.
            warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor")
            training = _PredictedTraining(config, dataclasses.replace(spec, model=_fake_model(spec.model, mode)),
                                          backend)
        stack.enter_context(training)
        if training.compiles:  # Inductor's code on fake tensors fails, or crashes the process (a segfault)
            raise NotPredictable(f"the spec's model came compiled (torch.compile): {_COMPILED_MODEL}")
        yield training


_COMPILED_MODEL = "compiled code runs its own kernels, which fake tensors cannot enter"


class NotPredictable(Exception):
    """A setup that fake tensors are known not to run (or to crash on), found only once it is built."""


def not_applicable(config: TrainConfig, spec: TrainingSpec, backend: Backend) -> str | None:
    """Why ``config``'s recipe changes nothing on ``spec``'s model, or cannot apply to it (the ``NotApplicable`` its
    real build raises: no 2-D convolution for channels-last, an optimizer without a foreach/fused path, a model that
    checkpoints or came compiled already...), from a build under fake tensors on ``backend``'s device that runs no
    step: what a simulated GPU says of the case where a real run would skip it. None where it applies, or where the
    build fails otherwise (the real run says why)."""
    buildable = without_unpredictable(config)  # compiling, processes: what a fake build cannot start
    try:
        with fake_training(buildable, spec, backend):
            pass
    except NotApplicable as e:
        return str(e)
    except NotPredictable as e:
        return ALREADY_COMPILED if config.compiles and str(e).endswith(_COMPILED_MODEL) else None
    except Exception:  # noqa: BLE001 - the real build raises the model's own error, if it has one
        return None
    return None


def predict_memory(config: TrainConfig, spec: TrainingSpec, backend: Backend, steps: int = PREDICTED_STEPS) -> dict:
    """The tracked breakdown of one step of ``config`` on ``spec``, from fake tensors on ``backend``'s device.

    Returns ``{"device", "batch_size", "breakdown_bytes"}``, or ``{"reason"}`` where the setup cannot be faked.
    """
    reason = unpredictable(config)
    if reason:
        return {"reason": reason}
    try:
        with fake_training(config, spec, backend) as training:
            if sparse_gradients(training.model):
                raise NotPredictable("sparse gradients (an embedding with sparse=True): fake tensors do not size "
                                     "them, or the optimizer state they make, as the real step does")
            batches = training.batches()
            for _ in range(steps):
                training.step(training.fetch(batches))
            breakdown = StepMemory(training).tracked_breakdown().by_kind
    except NotPredictable as e:
        return {"reason": str(e)}
    except Exception as e:  # noqa: BLE001 - any op fake tensors cannot run: say which, keep the case
        return {"reason": f"FakeTensorMode could not run the step: {failure_line(e)}"}
    return {"device": backend.device.type, "batch_size": training.samples_per_step, "breakdown_bytes": breakdown}


class PredictionCache:
    """``predict_memory`` once per memory setup (``memory_setup``) and spec in a session: a prediction takes a second
    or more, the memory check before a case, ladders and the GPU-profile prediction after it ask for the same setups
    again, and many recipes differ from another only in knobs that change no tensor (loader, cuDNN, logging)."""

    def __init__(self, backend: Backend, kept: Path | None = None):
        self.backend = backend
        self._predictions: dict[tuple, dict] = {}  # by (profile, spec name, memory setup)
        # By the spec object and memory setup: a spec the caller gave as it is (not a workload built per profile)
        # is the same spec in every profile, so where the setups match, so do the predictions.
        self._by_spec: dict[tuple, tuple[TrainingSpec, dict]] = {}
        # a job's file (TRAINBENCH_PREDICTIONS_FILE) over ``kept``, the file kept across sessions (pytest's cache)
        self._shared = SharedPredictions.from_environment(backend, default=kept)

    def __call__(self, profile_name: str, config: TrainConfig, spec: TrainingSpec) -> dict:
        setup = memory_setup(config)
        same_spec = (id(spec), setup)
        if same_spec in self._by_spec:
            return self._by_spec[same_spec][1]
        key = self.key(profile_name, config, spec)
        if key not in self._predictions:
            self.store({key: self.known(key) or self.predicted(config, spec)})
        self._by_spec[same_spec] = (spec, self._predictions[key])  # the spec kept: its id is not reused
        return self._predictions[key]

    @staticmethod
    def key(profile_name: str, config: TrainConfig, spec: TrainingSpec) -> tuple:
        """What a prediction is kept under: the profile, the spec's name and code (``code_fingerprint``: another
        process's prediction of other code is not this one's) and the memory setup."""
        return profile_name, spec.name, code_fingerprint(spec), memory_setup(config)

    def predicted(self, config: TrainConfig, spec: TrainingSpec) -> dict:
        """The prediction of ``config`` on ``spec``, made now (``predict_memory`` of its memory setup)."""
        return predict_memory(memory_setup(config), spec, self.backend)

    def known(self, key: tuple) -> dict | None:
        """The prediction kept under ``key`` in this session or in the shared file, else None."""
        if key in self._predictions:
            return self._predictions[key]
        return self._shared.get(key) if key[2] else None

    def store(self, predictions: dict[tuple, dict]) -> None:
        """Keep ``predictions`` (by ``key``) for this session and, where their code is known, in the shared file."""
        self._predictions.update(predictions)
        self._shared.put_many({key: value for key, value in predictions.items() if key[2]})


class SharedPredictions:
    """Predictions kept in a JSON file for the processes of one job (the GPU night's steps all predict the same
    setups of the built-in workloads), named by ``TRAINBENCH_PREDICTIONS_FILE``, or across a project's sessions
    (the plugin's file in pytest's cache: a second ``make bench`` predicts nothing it predicted before). Keyed by
    what is predicted (memory, the roofline's step counts), torch's version and the predicting device too; a file
    that cannot be read is started anew."""

    ENV = "TRAINBENCH_PREDICTIONS_FILE"

    def __init__(self, path, backend: Backend | None, what: str = "memory"):
        self.path = Path(path) if path else None
        # fake tensors differ by device kind; ``what``: the kind of answer (memory predictions, roofline counts)
        self.prefix = f"{what}|{torch.__version__}|{getattr(backend, 'kind', '')}|"
        self._entries: dict[str, dict] | None = None

    @classmethod
    def from_environment(cls, backend: Backend, what: str = "memory", default=None) -> SharedPredictions:
        """The file ``TRAINBENCH_PREDICTIONS_FILE`` names, else ``default`` (None: kept in this process only)."""
        return cls(env_value(cls.ENV) or default, backend, what)

    def _key(self, key: tuple) -> str:
        return self.prefix + repr(key)

    def _read(self) -> dict[str, dict]:
        if self._entries is None:
            try:
                entries = json.loads(self.path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                entries = {}
            self._entries = entries if isinstance(entries, dict) else {}
        return self._entries

    def get(self, key: tuple) -> dict | None:
        if self.path is None:
            return None
        found = self._read().get(self._key(key))
        return found if isinstance(found, dict) else None

    def put(self, key: tuple, prediction: dict) -> None:
        self.put_many({key: prediction})

    def put_many(self, predictions: dict[tuple, dict]) -> None:
        """Add ``predictions`` to the file in one write (another process may have added to it since it was read)."""
        if self.path is None:
            return
        new = {self._key(key): value for key, value in predictions.items() if self._read().get(self._key(key)) != value}
        if not new:
            return
        self._entries = None  # read again: other caches (here or in another process) may have added to the file
        try:
            text = json.dumps({**self._read(), **new}, sort_keys=True)
        except (TypeError, ValueError):
            return  # a prediction that is not plain data stays in this process
        self._entries.update(new)
        try:
            write_text_atomic(self.path, text)
        except OSError:
            self.path = None  # an unwritable file: predict in each process, as without it
