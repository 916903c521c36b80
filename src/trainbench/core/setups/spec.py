"""The public training spec: what is trained, stated in plain Python, independent of how it is optimized.

A ``TrainingSpec`` says how to build the model and the optimizer(s), how to compute the
loss of a batch (``loss_fn(model, batch)``: any forward signature, any batch
structure) or how to run a whole training step (``step(model, batch, ctx)``: several
optimizers, alternating updates, as a GAN's), where the data comes from (a ``Dataset`` for loader cases, a batch factory
for synthetic ones) and how many samples a batch holds. Recipes (``trainbench.core.setups.recipes``)
change *how* it is trained; ``trainbench.core.setups.training`` builds the training from a spec and a
recipe's config. The built-in workloads (``trainbench.core.setups.workloads``) are specs like any
user's.

Batches are any nest of tuples, lists, dicts and tensors: they move to the device
leaf by leaf, and every tensor in them counts towards the bytes a step copies. A leaf that is an
object with a ``.to(device)`` method (PyG's ``Batch``, HF's ``BatchEncoding``, a dataclass of one's
own) moves itself; the tensors it holds (mapping values, dataclass fields, attributes) count.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.data import Dataset

Batch = Any  # a tensor, or any nest of tuples, lists and dicts of tensors and objects with .to(device)
# What ``TrainingSpec.optimizers`` may return: one optimizer, a list of them, or a dict by name.
Optimizers = torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | Mapping[str, torch.optim.Optimizer]
PIXEL_FORMATS = ("uint8", "uint8_hwc")


class SpecError(ValueError):
    """A spec that cannot be trained as given; the message names the spec and what was expected."""


class NotApplicable(Exception):
    """A recipe that cannot apply to a spec: the message says what the spec lacks (the case is skipped)."""


@dataclass(frozen=True)
class TrainingSpec:
    """A training, stated as a user states it.

    - ``model()`` builds the ``nn.Module`` (random weights; it is moved to the device for you).
    - ``optimizer(params, **impl)`` builds any ``torch.optim.Optimizer``. Give a class with its
      arguments, e.g. ``functools.partial(torch.optim.AdamW, lr=1e-3)``, so the foreach/fused
      recipes can pass ``foreach=``/``fused=``; a factory that takes only ``params`` still trains,
      and those recipes are skipped with the reason.
    - or ``optimizers(model)`` builds them from the built model (on the device, changed by the recipe): one
      optimizer, a list, or a dict by name, e.g. ``lambda m: {"D": Adam(m.D.parameters()), "G": Adam(m.G.parameters())}``
      or ``lambda m: m.configure_optimizers()``; the foreach/fused recipes rebuild each with ``foreach=``/``fused=``.
    - ``loss_fn(model, batch)`` returns the scalar loss of one batch already on the device; trainbench runs
      zero_grad, backward and the optimizer step(s) around it.
    - or ``step(model, batch, ctx)`` runs one whole training step on one batch already on the device, as users
      write it (zero_grad, backward and ``step`` of each optimizer through ``ctx``, a ``training.StepContext``)
      and returns the scalar loss to report (it may be detached). Give exactly one of ``loss_fn`` and ``step``,
      and exactly one of ``optimizer`` and ``optimizers``.
    - ``dataset()`` returns a ``torch.utils.data.Dataset`` (loader cases: workers, pinned memory),
      and/or ``batches(batch_size, generator)`` returns one batch made with ``generator`` on its
      device (synthetic cases; also the data path when no dataset is given).
    - ``batch_size``: samples per batch (per optimizer step without accumulation).
    - ``checkpoint_blocks``: dotted names of the submodules gradient checkpointing recomputes.
    - ``pixels``: the formats ``dataset(pixels=...)`` can also serve (``"uint8"``: uint8 CHW images;
      ``"uint8_hwc"``: uint8 HWC images): the uint8-transfer recipes copy those and normalize on
      the device every 4-D uint8 tensor of a batch with ``normalize`` (default: as
      ``T.Normalize(0.5, 0.5)`` after ``ToTensor``).
    - ``items(batch)``: how many items a batch holds, where a sample is not the unit that counts (e.g.
      the non-padding label tokens of a padded language-model batch: ``lambda b: (b["labels"] != -100).sum()``).
      It must count what ``loss_fn`` averages over: gradient accumulation then weights each micro-batch's
      loss by its share of the step's items, so the accumulated gradients equal the whole batch's, and
      every case reports ``items_per_s`` (e.g. tokens/s) beside samples/s. An int or a tensor (no host sync).
    - ``items_unit``: what ``items`` counts, as the summary names it (``"tokens"`` gives tokens/s).
    - ``collate_fn``: the DataLoader's collate function for ``dataset``'s samples (e.g. one that pads
      sequences of different lengths); default: PyTorch's.
    """

    name: str
    model: Callable[[], nn.Module]
    _: KW_ONLY  # the rest by keyword: which of loss_fn/step and optimizer/optimizers is given is the spec's choice
    loss_fn: Callable[[nn.Module, Batch], torch.Tensor] | None = None
    step: Callable[[nn.Module, Batch, Any], torch.Tensor] | None = None  # (model, batch, training.StepContext)
    optimizer: Callable[..., torch.optim.Optimizer] | None = None
    optimizers: Callable[[nn.Module], Optimizers] | None = None
    batch_size: int
    dataset: Callable[..., Dataset] | None = None
    batches: Callable[[int, torch.Generator], Batch] | None = None
    checkpoint_blocks: Sequence[str] = ()
    pixels: Sequence[str] = ()
    normalize: Callable[[torch.Tensor], torch.Tensor] | None = None
    description: str = ""
    items: Callable[[Batch], int | torch.Tensor] | None = None
    items_unit: str = "items"
    collate_fn: Callable[[list], Batch] | None = None

    def __post_init__(self):
        where = f"training spec {self.name!r}"
        if not isinstance(self.name, str) or not self.name or any(c in self.name for c in "[]/ "):
            raise SpecError(f"{where}: name must be a non-empty string without spaces, '/', '[' or ']'")
        for one, other, what in (("loss_fn", "step", "the loss of a batch, or the whole training step"),
                                 ("optimizer", "optimizers", "an optimizer factory of parameters, or the optimizers of "
                                                             "the model")):
            given = [field for field in (one, other) if getattr(self, field) is not None]
            if len(given) != 1:
                raise SpecError(f"{where}: give exactly one of {one} and {other} ({what}); "
                                + ("got both" if given else "got neither"))
        for field in ("model", "loss_fn", "step", "optimizer", "optimizers"):
            value = getattr(self, field)
            if (value is not None or field == "model") and not callable(value):
                raise SpecError(f"{where}: {field} must be callable, got {value!r}")
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise SpecError(f"{where}: batch_size must be a positive int, got {self.batch_size!r}")
        if self.dataset is None and self.batches is None:
            raise SpecError(f"{where}: give a dataset (loader cases) or a batches factory (synthetic cases), or both")
        unknown = set(self.pixels) - set(PIXEL_FORMATS)
        if unknown:
            raise SpecError(f"{where}: unknown pixel formats {sorted(unknown)}; expected some of {PIXEL_FORMATS}")
        for field in ("items", "collate_fn"):
            if getattr(self, field) is not None and not callable(getattr(self, field)):
                raise SpecError(f"{where}: {field} must be callable or None, got {getattr(self, field)!r}")
        if not isinstance(self.items_unit, str) or not self.items_unit.strip() or "/" in self.items_unit:
            raise SpecError(f"{where}: items_unit must be a word such as 'tokens', got {self.items_unit!r}")
        if isinstance(self.checkpoint_blocks, str):
            raise SpecError(f"{where}: checkpoint_blocks must be a list of module names, got the string "
                            f"{self.checkpoint_blocks!r}")

    @property
    def custom_step(self) -> bool:
        """Whether the spec runs its own training step (``step``) rather than trainbench's around ``loss_fn``."""
        return self.step is not None

    def optimizer_accepts(self, argument: str) -> bool | None:
        """Whether ``optimizer`` takes ``argument`` (``foreach``, ``fused``) by keyword; None for ``optimizers``
        (what they return tells, once built)."""
        return accepts_keyword(self.optimizer, argument) if self.optimizer is not None else None

    def make_dataset(self, pixels: str | None = None) -> Dataset:
        """The spec's dataset, serving ``pixels`` (a format of ``self.pixels``) where asked, its own samples otherwise."""
        return self.dataset(pixels=pixels) if pixels else self.dataset()

    def count_items(self, batch: Batch) -> torch.Tensor | None:
        """The items ``batch`` holds as a float tensor on the batch's device (None without ``items``): no host sync."""
        if self.items is None:
            return None
        count = self.items(batch)
        if isinstance(count, torch.Tensor):
            if count.numel() != 1 or count.is_complex():
                raise SpecError(f"training spec {self.name!r}: items returned a tensor of shape {tuple(count.shape)}, "
                                "expected one count (e.g. mask.sum())")
            return count.reshape(()).to(torch.float64)
        if isinstance(count, bool) or not isinstance(count, (int, float)) or count < 0:
            raise SpecError(f"training spec {self.name!r}: items returned {count!r}, expected a count >= 0")
        return torch.tensor(float(count), dtype=torch.float64)

    def pixel_normalize(self) -> Callable[[torch.Tensor], torch.Tensor]:
        return self.normalize or normalize_uint8


def accepts_keyword(fn: Callable, argument: str) -> bool:
    """Whether calling ``fn(..., argument=...)`` is allowed by its signature (a class: its constructor)."""
    target = fn.func if isinstance(fn, functools.partial) else fn
    try:
        parameters = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == argument and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) or p.kind == p.VAR_KEYWORD
               for p in parameters)


def normalize_uint8(images: torch.Tensor) -> torch.Tensor:
    """The seeds' on-device normalization of uint8 pixels: same values as ToTensor + Normalize(0.5, 0.5)."""
    return (images.to(torch.float32) / 255.0 - 0.5) / 0.5


def classification_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """``(inputs, targets)`` batches: cross-entropy of ``model(inputs)`` against integer class labels."""
    inputs, targets = batch
    if targets.is_floating_point():
        raise SpecError("classification_loss needs integer class labels; got float targets "
                        "(state a regression loss such as mse_loss in the spec instead)")
    return nn.functional.cross_entropy(model(inputs), targets)


# -- batches of any structure ---------------------------------------------------------------

def movable(leaf: Any) -> bool:
    """Whether a batch's leaf is an object that moves itself with ``.to(device)`` (PyG's ``Batch``, HF's
    ``BatchEncoding``, a user's dataclass): not a tensor, not a module, not a class."""
    return (not isinstance(leaf, (torch.Tensor, nn.Module, type))
            and callable(getattr(leaf, "to", None)))


def _contents(obj: Any) -> list:
    """What an object that moves itself holds: a mapping's values, a dataclass's fields, else its attributes."""
    if isinstance(obj, Mapping):
        return list(obj.values())
    if dataclasses.is_dataclass(obj):
        return [getattr(obj, f.name) for f in dataclasses.fields(obj)]
    slots = [name for cls in type(obj).__mro__ for name in getattr(cls, "__slots__", ())]
    return [*getattr(obj, "__dict__", {}).values(), *(getattr(obj, name, None) for name in slots)]


def tensors_of(batch: Batch) -> list[torch.Tensor]:
    """Every tensor of ``batch``: its pytree leaves, and inside each object that moves itself (``movable``) what it
    holds, walked the same way (an object that holds itself, as a parent link may, is not walked again)."""
    found, inside = [], []

    def walk(value):
        for leaf in tree_flatten(value)[0]:
            if isinstance(leaf, torch.Tensor):
                found.append(leaf)
            elif movable(leaf) and id(leaf) not in inside:
                inside.append(id(leaf))
                walk(_contents(leaf))
                inside.pop()

    walk(batch)
    return found


def batch_nbytes(batch: Batch) -> int:
    """Bytes of every tensor in ``batch`` (a nest of any structure, or a list of micro-batches)."""
    return sum(t.nbytes for t in tensors_of(batch))


def batch_shapes(batch: Batch) -> tuple[tuple[int, ...], ...]:
    """The shape of every tensor in ``batch``, in order: two batches of one shape compute alike."""
    return tuple(tuple(t.shape) for t in tensors_of(batch))


def map_tensors(fn: Callable[[torch.Tensor], torch.Tensor], batch: Batch) -> Batch:
    """``batch`` with ``fn`` applied to every tensor, structure kept (dicts, tuples, lists, namedtuples); objects that
    move themselves are left as they are."""
    return tree_map(lambda leaf: fn(leaf) if isinstance(leaf, torch.Tensor) else leaf, batch)


def batch_to_device(batch: Batch, device: torch.device, non_blocking: bool = False) -> Batch:
    """``batch`` on ``device``: each tensor, and each object that moves itself (``movable``) by its own
    ``.to(device)`` (with ``non_blocking=`` where it takes it; one that moves in place and returns None is kept)."""
    def move(leaf):
        if isinstance(leaf, torch.Tensor):
            return leaf.to(device, non_blocking=non_blocking)
        if not movable(leaf):
            return leaf
        moved = (leaf.to(device, non_blocking=True) if non_blocking and accepts_keyword(leaf.to, "non_blocking")
                 else leaf.to(device))
        return leaf if moved is None else moved

    return tree_map(move, batch)


def unsplittable(batch: Batch, samples: int) -> str | None:
    """Why ``batch`` of ``samples`` samples cannot be sliced into micro-batches or ranks' shares along the first
    dimension of every tensor (None where it can): an object that moves itself, or a tensor of other rows (a graph's
    edge list)."""
    for leaf in tree_flatten(batch)[0]:
        if movable(leaf):
            return f"a {type(leaf).__name__} (an object with .to()), which cannot be sliced by sample"
        if isinstance(leaf, torch.Tensor) and (leaf.dim() == 0 or leaf.shape[0] != samples):
            return (f"a tensor of shape {tuple(leaf.shape)}, where every tensor's first dimension must be the batch's "
                    f"{samples} samples to slice it by sample")
    return None


# The spec's fields that hold its code: what a prediction made from it depends on beyond its recipe's knobs.
_CODE_FIELDS = ("model", "loss_fn", "step", "optimizer", "optimizers", "batches", "dataset", "collate_fn")


@functools.lru_cache(maxsize=1)
def _trainbench_digest() -> str:
    """trainbench's version and a digest of its own source files: a prediction kept across sessions (a user's
    cache) was made by this trainbench's code, not only by a release of the same number."""
    try:
        digest = hashlib.sha256(version("pytest-trainbench").encode())
    except PackageNotFoundError:
        digest = hashlib.sha256(b"trainbench (not installed)")
    package = Path(__file__).resolve().parent.parent
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


@functools.lru_cache(maxsize=256)
def code_fingerprint(spec: TrainingSpec) -> str | None:
    """A digest of the files holding the spec's code (its model, loss or step, optimizer(s) and data factories, as
    their source files read now) and of trainbench's version and source: the key under which a prediction made
    from this spec may be shared with another process (``predict.SharedPredictions``). An edited model is a new key, so a file of
    predictions kept from before the edit is never read as this code's. None where a file cannot be read: then
    nothing is shared."""
    digest = hashlib.sha256(_trainbench_digest().encode())
    files = set()
    for name in _CODE_FIELDS:
        code = getattr(spec, name, None)
        while isinstance(code, functools.partial):
            code = code.func
        if code is None or isinstance(code, str):
            continue
        try:
            files.add(inspect.getsourcefile(code if inspect.isclass(code) or inspect.isroutine(code) else type(code)))
        except (TypeError, OSError):
            return None
    try:
        for path in sorted(f for f in files if f):
            with open(path, "rb") as source:
                digest.update(path.encode() + b"\0" + source.read())
    except OSError:
        return None
    return digest.hexdigest()[:16]
