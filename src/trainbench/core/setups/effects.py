"""What each knob does to a training setup: its ``Effect``, the part of its knob-table entry that acts.

``TrainingSetup`` asks no knob by name: it applies the effects of the knobs a config turns, stage by stage in the
order of ``STAGES``, and within a stage in the knob table's order (``TrainConfig``'s fields, then users' knobs in the
order they were registered). Each hook gets the setup and the knob's value; what only the built model can tell (no
convolution for channels-last, no ``pointwise`` function) raises ``NotApplicable`` naming what is missing. The
model changes the built-in knobs make live here too, beside the effects that call them.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
from collections.abc import Callable
import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensor
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import profile, schedule
from torch.utils.checkpoint import checkpoint

from trainbench.core.setups.spec import Batch, NotApplicable, SpecError, map_tensors
from trainbench.devices.device import host_profiler_activities, set_cudnn_benchmark

if TYPE_CHECKING:  # a hook's first argument; the setup imports this module
    from trainbench.core.setups.training import TrainingSetup

DEBUG_PROFILER, DEBUG_NVTX = "profiler", "emit_nvtx"

# The stages a setup applies, in this order:
# process   (setup, value) -> context manager, entered for the setup's life (a process-wide setting, restored at close);
#           what it yields is kept as ``setup.entered[knob]`` for the knob's later hooks
# loader    (setup, value) -> DataLoader keyword arguments
# model     (setup, model, value) -> model: the built model on the device, before data parallelism
# parallel  (setup, module, value) -> the module a step calls (DataParallel, DDP, FSDP2)
# compiled  (setup, module, value) -> that module compiled
# setup     (setup, value) -> None: once the optimizers are built (a GradScaler)
# batch     (setup, batch, value) -> batch: each batch once on the device
# forward   (setup, value) -> context manager around each forward and its loss
# zero_grad (setup, optimizer or None, value) -> None: how gradients are cleared
# after_step (setup, loss, value) -> None: after each step
# error     (setup, error, value) -> an exception to raise from a step's RuntimeError instead, or None


@dataclass(frozen=True)
class Effect:
    """What a knob does, by stage (``STAGES``: its hook fields, in their order); None where it does nothing at a stage. ``at_default``: the hooks run
    at the knob's default value too (a setting the setup states either way, such as cuDNN's autotuner off)."""

    process: Callable[[TrainingSetup, Any], Any] | None = None
    loader: Callable[[TrainingSetup, Any], dict] | None = None
    model: Callable[[TrainingSetup, torch.nn.Module, Any], torch.nn.Module] | None = None
    parallel: Callable[[TrainingSetup, torch.nn.Module, Any], torch.nn.Module] | None = None
    compiled: Callable[[TrainingSetup, torch.nn.Module, Any], torch.nn.Module] | None = None
    setup: Callable[[TrainingSetup, Any], None] | None = None
    batch: Callable[[TrainingSetup, Batch, Any], Batch] | None = None
    forward: Callable[[TrainingSetup, Any], Any] | None = None
    zero_grad: Callable[[TrainingSetup, Any, Any], None] | None = None
    after_step: Callable[[TrainingSetup, torch.Tensor, Any], None] | None = None
    error: Callable[[TrainingSetup, RuntimeError, Any], BaseException | None] | None = None
    at_default: bool = False


# The stages, in the order a setup applies them: Effect's hook fields (the one list of them)
STAGES = tuple(f.name for f in dataclasses.fields(Effect) if f.name != "at_default")


def checkpointing_already(model: torch.nn.Module) -> str | None:
    """Where the spec's model recomputes activations itself, as Hugging Face models do after
    ``gradient_checkpointing_enable()`` (their ``is_gradient_checkpointing``, a module's ``gradient_checkpointing``
    flag), or None."""
    if getattr(model, "is_gradient_checkpointing", False) is True:
        return "is_gradient_checkpointing"
    on = [name or type(model).__name__ for name, module in model.named_modules()
          if getattr(module, "gradient_checkpointing", False) is True]
    return f"gradient_checkpointing on {', '.join(on[:3])}{', ...' if len(on) > 3 else ''}" if on else None


def enable_checkpointing(model: torch.nn.Module, block_names: list[str]) -> None:
    """Recompute each named block in backward instead of keeping its activations.

    Patches the blocks' ``forward`` in place, so parameter names (and the guard's
    gradient comparison by name) stay the same as without checkpointing.
    """
    for name in block_names:
        try:
            block = model.get_submodule(name)
        except AttributeError:
            close = difflib.get_close_matches(name, [n for n, _ in model.named_modules() if n], n=3)
            hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
            raise SpecError(f"checkpoint block {name!r} is not a submodule of the model{hint}") from None
        block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)


_ConvNd = torch.nn.modules.conv._ConvNd
_BatchNorm = torch.nn.modules.batchnorm._BatchNorm
_InstanceNorm = torch.nn.modules.instancenorm._InstanceNorm
CANCELLING_NORMS = ("BatchNorm or InstanceNorm normalizing with the input's own statistics, as in training; GroupNorm "
                    "with one channel per group")


def batch_statistics_norms(model: torch.nn.Module) -> list[str]:
    """The BatchNorms of ``model`` that normalize with the statistics of the batch they see (in training, or without
    running statistics), by name: their output depends on which samples share a batch."""
    return [name or type(m).__name__ for name, m in model.named_modules()
            if isinstance(m, _BatchNorm) and (m.training or not m.track_running_stats)]


def cancels_channel_bias(norm: torch.nn.Module, channels: int, training: bool) -> bool:
    """Whether ``norm``, reading ``channels`` channels, cancels any constant added to each channel (a convolution's bias).

    BatchNorm subtracts each channel's mean over the batch, InstanceNorm each channel's mean over one
    sample: a constant added to a channel moves its mean by as much and leaves its variance, so the output
    is the same. Only with the input's own statistics: in evaluation, running statistics let the bias
    through. GroupNorm subtracts one mean per group: a per-channel bias is cancelled only where a group is
    one channel; across the channels of a larger group it shifts their deviations from the group's mean
    (and the group's variance). LayerNorm after a convolution normalizes over the channels too: not cancelled.
    """
    if isinstance(norm, (_BatchNorm, _InstanceNorm)):
        return norm.num_features == channels and (training or not norm.track_running_stats)
    if isinstance(norm, torch.nn.GroupNorm):
        return norm.num_groups == norm.num_channels == channels
    return False


class _ConvNormTracer(torch.fx.Tracer):
    """Keeps every convolution and norm (subclasses from other libraries too) one node of the traced graph."""

    def is_leaf_module(self, m: torch.nn.Module, module_qualified_name: str) -> bool:
        return isinstance(m, (_ConvNd, _BatchNorm, _InstanceNorm, torch.nn.GroupNorm)) or \
            super().is_leaf_module(m, module_qualified_name)


def convs_before_norms(model: torch.nn.Module, training: bool = True) -> tuple[list[torch.nn.Module], str]:
    """The convolutions whose output only a norm that cancels their bias reads (``cancels_channel_bias``), and how
    they were found.

    From the data flow of the graph torch.fx traces: every call of the convolution feeds a cancelling norm
    and nothing else (an output also read before its norm, by a skip connection or as a feature map, keeps
    its bias). Where tracing fails (data-dependent control flow, ops fx cannot trace), from registration
    order: a convolution registered right before such a norm of its channel count among its parent's
    children, the order nn.Sequential runs them in (and the usual order of a module's ``__init__``, which
    does not prove the data flow: the guards compare the training with and without the change).
    """
    try:
        graph = _ConvNormTracer().trace(model)
    except Exception as e:  # whatever stops the trace (control flow on values, untraceable ops): the fallback
        why = (str(e).strip().splitlines() or [""])[0][:160]
        return (_by_registration_order(model, training),
                f"by registration order: torch.fx could not trace the model ({type(e).__name__}: {why})")
    calls: dict[int, tuple[torch.nn.Module, list[bool]]] = {}
    for node in graph.nodes:
        module = model.get_submodule(node.target) if node.op == "call_module" else None
        if isinstance(module, _ConvNd):
            users = list(node.users)
            user = users[0] if len(users) == 1 else None
            feeds_norm = (user is not None and user.op == "call_module" and bool(user.args) and user.args[0] is node
                          and cancels_channel_bias(model.get_submodule(user.target), module.out_channels, training))
            calls.setdefault(id(module), (module, []))[1].append(feeds_norm)
    return [module for module, feeds_norm in calls.values() if all(feeds_norm)], "by tracing the model with torch.fx"


def _by_registration_order(model: torch.nn.Module, training: bool) -> list[torch.nn.Module]:
    found: dict[int, torch.nn.Module] = {}
    for parent in model.modules():
        children = list(parent.children())
        for conv, following in zip(children, children[1:]):
            if isinstance(conv, _ConvNd) and cancels_channel_bias(following, conv.out_channels, training):
                found[id(conv)] = conv
    return list(found.values())


@dataclass(frozen=True)
class ConvBiasChange:
    """What ``add_conv_bias`` or ``remove_conv_bias_before_norm`` did."""

    changed: int  # convolutions given a bias, or relieved of theirs
    before_norms: int  # convolutions followed by a norm that cancels their bias (``convs_before_norms``)
    found_by: str  # how those were found


def add_conv_bias(model: torch.nn.Module, training: bool = True) -> ConvBiasChange:
    """Give each bias-free convolution followed by a norm that cancels it a zero-initialized bias: the redundant
    bias of the seeds' "with bias" model (the same function at first, one more parameter and add per layer)."""
    convs, found_by = convs_before_norms(model, training)
    bias_free = [conv for conv in convs if conv.bias is None]
    for conv in bias_free:
        conv.bias = torch.nn.Parameter(torch.zeros(conv.out_channels, dtype=conv.weight.dtype, device=conv.weight.device))
    return ConvBiasChange(len(bias_free), len(convs), found_by)


def remove_conv_bias_before_norm(model: torch.nn.Module, training: bool = True) -> ConvBiasChange:
    """Remove the bias of each convolution followed by a norm that cancels it: the same outputs (the norm subtracts
    the bias with the channel's mean), one parameter and add per layer fewer. Weights stay as built."""
    convs, found_by = convs_before_norms(model, training)
    biased = [conv for conv in convs if conv.bias is not None]
    for conv in biased:
        conv.bias = None
    return ConvBiasChange(len(biased), len(convs), found_by)


_BIAS_FREE_HINT = "recipe conv_bias_free measures them as they are against conv_bias's added biases"


def change_conv_bias(model: torch.nn.Module, how: str, training: bool) -> str:
    """The ``conv_bias`` knob on a built model ("add" or "remove"): what it did, as a result note; ``NotApplicable``
    where the model has no convolution before a cancelling norm, or none to change."""
    convs = [m for m in model.modules() if isinstance(m, _ConvNd)]
    if not convs:
        raise NotApplicable("the model has no convolution")
    if how == "remove" and all(conv.bias is None for conv in convs):
        raise NotApplicable(f"the model's convolutions have no bias already: nothing to remove ({_BIAS_FREE_HINT})")
    if how == "add" and all(conv.bias is not None for conv in convs):
        raise NotApplicable("every convolution of the model has a bias already: nothing to add")
    change = (remove_conv_bias_before_norm if how == "remove" else add_conv_bias)(model, training)
    found = f"found {change.found_by}"
    if not change.before_norms:
        raise NotApplicable(f"no convolution of the model is followed by a norm that cancels its bias ({CANCELLING_NORMS}; "
                            f"{found})")
    if not change.changed and how == "remove":
        raise NotApplicable(f"the model's convolutions before a norm have no bias already: nothing to remove "
                            f"({_BIAS_FREE_HINT}; {found})")
    if not change.changed:
        raise NotApplicable(f"the model's convolutions before a norm have a bias already: nothing to add (no_conv_bias "
                            f"measures removing them; {found})")
    done = "removed the bias of" if how == "remove" else "added a zero bias to"
    return f"conv_bias={how}: {done} {change.changed} of the {change.before_norms} convolutions followed by a norm that " \
           f"cancels their bias ({found})"


def fuse_pointwise(model: torch.nn.Module, how: str) -> int:
    """Replace each module's ``pointwise`` function by its scripted or compiled version. Returns how many."""
    fused = 0
    for module in model.modules():
        fn = getattr(module, "pointwise", None)
        if fn is None:
            continue
        module.pointwise = torch.jit.script(fn) if how == "script" else torch.compile(fn)
        fused += 1
    return fused




def compile_in_place(model: torch.nn.Module) -> None:
    """``nn.Module.compile()`` of the modules a custom step calls: the top-level children that hold parameters (the
    model itself where none does).

    A custom step calls ``model.G(...)`` and ``model.D(...)``, not the root's forward, so ``torch.compile(model)``
    would compile nothing it runs; compiled in place, every call of those modules runs compiled code, whatever
    calls them, and parameter names stay as they are (no ``_orig_mod.`` prefix) for the optimizers and guards.
    """
    children = [child for child in model.children() if next(child.parameters(), None) is not None]
    for module in children or [model]:
        module.compile()


_SDPA_BACKENDS = {"math": "MATH", "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION"}


def sdpa_context(backend: str | None):
    """scaled_dot_product_attention restricted to one kernel family (a no-op context for None)."""
    if backend is None:
        return contextlib.nullcontext()
    return sdpa_kernel(getattr(SDPBackend, _SDPA_BACKENDS[backend]))




def channels_last_already(model: torch.nn.Module) -> bool:
    """Whether the spec's model came in the channels-last memory format (``model.to(memory_format=torch.channels_last)``):
    every 2-D convolution's weight is NHWC (and not also NCHW-contiguous, as a 1x1 kernel is either way)."""
    weights = [m.weight for m in model.modules() if isinstance(m, torch.nn.Conv2d)
               and not m.weight.is_contiguous()]
    return bool(weights) and all(w.is_contiguous(memory_format=torch.channels_last) for w in weights)




ALREADY_COMPILED = "the spec's model came compiled (torch.compile): compiling it again changes nothing"


def compiled_by_user(model: torch.nn.Module) -> bool:
    """Whether the spec's model, or a module in it, came compiled: ``torch.compile(module)`` (an
    ``OptimizedModule``) or ``module.compile()``. Its step runs Inductor's code, whatever the recipe says."""
    return any(type(module).__name__ == "OptimizedModule" or getattr(module, "_compiled_call_impl", None) is not None
               for module in model.modules())


def module_to(model: torch.nn.Module, *args, **kwargs) -> torch.nn.Module:
    """``model.to(...)``, also for a model built under FakeTensorMode (trainbench.core.analyses.predict).

    ``Module.to`` swaps a fake parameter with its converted copy, which fails while the fake
    mode holds a weak reference to it; new Parameters in place of the old do the same job
    before any optimizer has seen them.
    """
    if not any(isinstance(p, FakeTensor) for p in model.parameters()):
        return model.to(*args, **kwargs)
    def convert(t: torch.Tensor) -> torch.Tensor:  # as Module.to: a memory format applies to 4-D and 5-D tensors only
        return t.to(*args, **(kwargs if t.dim() in (4, 5) else {k: v for k, v in kwargs.items() if k != "memory_format"}))

    converted: dict[int, torch.nn.Parameter] = {}  # one new Parameter per old one: tied weights stay tied
    with torch.no_grad():
        for module in model.modules():
            for name, param in module._parameters.items():
                if param is not None:
                    if id(param) not in converted:
                        converted[id(param)] = torch.nn.Parameter(convert(param), requires_grad=param.requires_grad)
                    module._parameters[name] = converted[id(param)]
            for name, buffer in module._buffers.items():
                if buffer is not None:
                    module._buffers[name] = convert(buffer)
    return model


@contextlib.contextmanager
def _deterministic_algorithms():
    previous = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
                torch.backends.cudnn.deterministic)
    # Fail, not warn, where an op has no deterministic kernel: a warning would let the case measure
    # nondeterministic kernels under the name "deterministic" (the step reports it as not applicable).
    torch.use_deterministic_algorithms(True, warn_only=False)
    torch.backends.cudnn.deterministic = True
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])
        torch.backends.cudnn.deterministic = previous[2]


class _ProfilerLeftOn:
    """The seeds' profiler setup left running: records shapes and memory, step after step.

    Without ``with_stack``: its Python-level hook cannot be paused and restored by
    pytest-benchmark's instrumentation guard, and the cost that matters here is the
    per-op recording, which stays on.
    """

    def __init__(self):
        self.profiler = profile(activities=host_profiler_activities(), schedule=schedule(wait=0, warmup=1, active=3, repeat=0),
                                on_trace_ready=lambda prof: None, record_shapes=True, profile_memory=True)

    def step(self) -> None:
        self.profiler.step()


class _NoStep:
    def step(self) -> None:
        pass


@contextlib.contextmanager
def _debug_api(mode: str | None):
    """A debug API switched on for the life of the setup, as when left on by mistake."""
    if mode is None:
        yield None
    elif mode == "anomaly":
        with torch.autograd.detect_anomaly(check_nan=True):
            yield _NoStep()
    elif mode == DEBUG_NVTX:
        with torch.autograd.profiler.emit_nvtx(record_shapes=True):
            yield _NoStep()
    elif mode == DEBUG_PROFILER:
        left_on = _ProfilerLeftOn()
        with left_on.profiler:
            yield left_on


# -- the built-in knobs' effects ------------------------------------------------------------------------------
@contextlib.contextmanager
def cudnn_benchmark_set(enabled: bool):
    """cuDNN's autotuner on or off for the setup's life (off stated at the default too: an earlier setup's or the
    user's flag does not leak into a case)."""
    previous = set_cudnn_benchmark(bool(enabled))
    try:
        yield
    finally:
        set_cudnn_benchmark(previous)


def _workers(setup: TrainingSetup, workers: int) -> dict:
    # persistent: the timed rounds never wait for workers to start; a batch slower than the timeout fails the case
    return {"num_workers": workers, "persistent_workers": True, "timeout": setup.config.loader_timeout_s}


def _channels_last_model(setup: TrainingSetup, model: torch.nn.Module, _on: bool) -> torch.nn.Module:
    if not any(isinstance(m, torch.nn.Conv2d) for m in model.modules()):
        raise NotApplicable("the model has no 2-D convolution (channels-last changes nothing)")
    if channels_last_already(model) and setup.config.amp is None:  # channels_last_amp still changes the precision
        raise NotApplicable("the model is channels-last already (its convolution weights are NHWC): "
                            "converting it again changes nothing the baseline does not do")
    return module_to(model, memory_format=torch.channels_last)


def _channels_last_batch(setup: TrainingSetup, batch: Batch, _on: bool) -> Batch:
    return map_tensors(lambda t: t.contiguous(memory_format=torch.channels_last)
                       if t.dim() == 4 and t.is_floating_point() else t, batch)


def _pixels_on_device(setup: TrainingSetup, batch: Batch, _on: bool) -> Batch:
    """A 4-D uint8 tensor is a batch of images: normalized on the device (NHWC seen as channels-last NCHW)."""
    def normalized(t: torch.Tensor) -> torch.Tensor:
        if t.dim() != 4 or t.dtype != torch.uint8:
            return t
        if setup.config.pixels == "uint8_hwc":
            t = t.permute(0, 3, 1, 2)  # NHWC storage seen as NCHW: channels-last strides, no copy
        return setup.normalize_pixels(t)

    return map_tensors(normalized, batch)


def _no_second_compile(model: torch.nn.Module) -> None:
    if compiled_by_user(model):
        raise NotApplicable(ALREADY_COMPILED)


def _compile_check(setup: TrainingSetup, model: torch.nn.Module, _on: bool) -> torch.nn.Module:
    _no_second_compile(model)
    return model


def _compiled(setup: TrainingSetup, module: torch.nn.Module, _on: bool) -> torch.nn.Module:
    if setup.spec.custom_step:  # the step calls the model's children, not the root's forward
        compile_in_place(setup.model)
        return module
    return torch.compile(module)


def _checkpointed(setup: TrainingSetup, model: torch.nn.Module, _on: bool) -> torch.nn.Module:
    already = checkpointing_already(model)
    if already:
        raise NotApplicable(f"the model checkpoints already ({already}): recomputing its blocks again "
                            "changes nothing the baseline does not do")
    enable_checkpointing(model, list(setup.spec.checkpoint_blocks))
    return model


def _conv_bias(setup: TrainingSetup, model: torch.nn.Module, how: str) -> torch.nn.Module:
    setup.notes = (*setup.notes, change_conv_bias(model, how, training=setup.config.trains))
    return model


def _fused(setup: TrainingSetup, model: torch.nn.Module, how: str) -> torch.nn.Module:
    if how == "compile":
        _no_second_compile(model)
    if not fuse_pointwise(model, how):
        raise NotApplicable("the model has no module with a `pointwise` function to fuse")
    return model


def _whole_batch_statistics(setup: TrainingSetup, model: torch.nn.Module, _steps: int) -> torch.nn.Module:
    """Accumulated micro-batches train as the whole batch only where no BatchNorm normalizes each by its own
    statistics, or where they stand for data-parallel shards, which normalize their own samples as they do."""
    norms = [] if setup.micro_batches_are_shards else batch_statistics_norms(model)
    if norms:
        raise NotApplicable(f"the model's BatchNorm ({', '.join(norms[:3])}{', ...' if len(norms) > 3 else ''}) "
                            "normalizes each micro-batch by its own statistics: accumulated micro-batches do "
                            "not train as the whole batch does")
    return model


def _evaluation(setup: TrainingSetup, model: torch.nn.Module, _mode: str) -> torch.nn.Module:
    return model.eval()


_GRAD_MODES = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}


def _grad_mode(setup: TrainingSetup, mode: str):
    return _GRAD_MODES.get(mode, contextlib.nullcontext)()


_AUTOCAST_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def _autocast(setup: TrainingSetup, amp: str):
    return torch.autocast(setup.device.type, dtype=_AUTOCAST_DTYPES[amp])


def _grad_scaler(setup: TrainingSetup, _on: bool) -> None:
    setup.scaler = torch.amp.GradScaler(setup.device.type)


def _no_kernel(setup: TrainingSetup, error: RuntimeError, backend: str) -> BaseException | None:
    """The kernel the recipe asks for cannot run this model's attention here."""
    if "No available kernel" not in str(error):
        return None
    return NotApplicable(f"scaled_dot_product_attention has no {backend} kernel for this model's attention on "
                         f"{setup.device.type} (its mask, dtype, dropout or head size): "
                         f"{str(error).strip().splitlines()[0]}")


def _no_deterministic_kernel(setup: TrainingSetup, error: RuntimeError, _on: bool) -> BaseException | None:
    if "deterministic" not in str(error):
        return None
    return NotApplicable(f"an op of the model has no deterministic kernel here: {str(error).splitlines()[0]}")


def _clear_gradients(setup: TrainingSetup, optimizer, mode: str) -> None:
    """``optimizer.zero_grad`` writing zeros or setting None, or ``param.grad = None`` (of ``optimizer``'s
    parameters, or with None of the whole model's)."""
    if mode == "param_none":
        params = setup.model.parameters() if optimizer is None else (
            p for group in optimizer.param_groups for p in group["params"])
        for p in params:
            p.grad = None
    else:
        for one in setup.optimizers.values() if optimizer is None else (optimizer,):
            one.zero_grad(set_to_none=mode == "set_to_none")


def _keep_loss(setup: TrainingSetup, loss: torch.Tensor, mode: str) -> None:
    """Keep a running loss the way a training loop would (seed 001's ``total_loss += loss``)."""
    if mode == "tensor":
        setup.loss_total = setup.loss_total + loss  # keeps every step's autograd graph alive: the leak
    elif mode == "detach":
        setup.loss_total = setup.loss_total + loss.detach()
    else:  # "item": summed on the device, one .item() (a host sync) every log_every steps
        pending = loss.detach() if setup.pending_loss is None else setup.pending_loss + loss.detach()
        if (setup.steps_done + 1) % setup.config.log_every == 0:
            setup.loss_total += pending.item()
            pending = None
        setup.pending_loss = pending


def _empty_cache(setup: TrainingSetup, loss: torch.Tensor, _on: bool) -> None:
    setup.backend.empty_cache()


def _debug_step(setup: TrainingSetup, loss: torch.Tensor, _mode: str) -> None:
    setup.entered["debug"].step()


def _data_parallel(setup: TrainingSetup, model: torch.nn.Module, mode: str) -> torch.nn.Module:
    """The module a step calls: DataParallel, DDP or FSDP2 (sharded in place)."""
    if mode == "dp":
        # The same GPUs as the DDP case, starting at this one (by default DataParallel takes every GPU, from 0).
        device_ids = setup.backend.parallel_device_ids(setup.config.replicas)
        return torch.nn.DataParallel(model, device_ids=device_ids, output_device=device_ids[0])
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel  # torch.distributed: only where ranks run

        return DistributedDataParallel(model, device_ids=setup.backend.ddp_device_ids())
    from torch.distributed.fsdp import fully_shard  # as DDP's

    if any(getattr(module, "sparse", False) is True for module in model.modules()):
        raise NotApplicable("FSDP2 shards dense gradients only: its reduce-scatter has no kernel for the "
                            "sparse gradients of an embedding with sparse=True (DDP all-reduces them)")
    # Each block a unit of its own (its parameters gathered just before it runs and freed after, as the seeds'
    # transformer blocks are), then the model for what is left: FSDP2's usual wrapping.
    for name in setup.spec.checkpoint_blocks:
        fully_shard(model.get_submodule(name))
    fully_shard(model)  # in place: the parameters become DTensor shards, the names stay
    return model


# Each built-in knob's effect (TrainConfig's knob entries name these).
WORKERS = Effect(loader=_workers)
PINNED = Effect(loader=lambda setup, on: {"pin_memory": True})
UINT8_PIXELS = Effect(batch=_pixels_on_device)
AUTOCAST = Effect(forward=_autocast)
GRAD_SCALER = Effect(setup=_grad_scaler)
ACCUMULATION = Effect(model=_whole_batch_statistics)
CHECKPOINTING = Effect(model=_checkpointed)
ZERO_GRAD = Effect(zero_grad=_clear_gradients, at_default=True)
LOSS_HISTORY = Effect(after_step=_keep_loss)
EVALUATION = Effect(model=_evaluation, forward=_grad_mode)
EMPTY_CACHE = Effect(after_step=_empty_cache)
COMPILE = Effect(model=_compile_check, compiled=_compiled)
CUDNN_BENCHMARK = Effect(process=lambda setup, on: cudnn_benchmark_set(on), at_default=True)
CHANNELS_LAST = Effect(model=_channels_last_model, batch=_channels_last_batch)
CONV_BIAS = Effect(model=_conv_bias)
FUSE_POINTWISE = Effect(model=_fused)
SDPA = Effect(forward=lambda setup, backend: sdpa_context(backend), error=_no_kernel)
DEBUG = Effect(process=lambda setup, mode: _debug_api(mode), after_step=_debug_step)
DETERMINISTIC = Effect(process=lambda setup, on: _deterministic_algorithms(), error=_no_deterministic_kernel)
DATA_PARALLEL = Effect(parallel=_data_parallel)
