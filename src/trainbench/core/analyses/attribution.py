"""Where a step's ops, time, FLOPs and memory go: the tables a changed verdict is explained from.

Recorded per case after its timed rounds, never inside them (``Measurer``'s passes):

- ``ops``: aten ops dispatched per step, by op and by the module that ran them (``ops_by_site``);
- ``flops``: ``FlopCounterMode``'s FLOPs per step by op;
- ``time``: each op's self time per step over a few profiled steps, from PyTorch's profiler (host time on
  the CPU; on CUDA the device time of the kernels each op launched, and each kernel's own under ``kernels``);
  what no op covers (Python, the host between ops, an idle device) is its own row, so the rows add up to the
  profiled step's wall time;
- ``calls``: the profiler's calls per step by op (what ``aten_calls_per_step`` counts);
- ``memory``: tensor bytes by the site that allocated them (a module's forward or backward, the optimizer
  step), at the tracked peak and kept alive per step (a leak), and the parameters' bytes by the module that
  owns them (``param_bytes``); on CUDA also the caching allocator's bytes at
  the step's peak by the line of code that asked for them, or in backward the autograd node
  (``allocator_peak_bytes``, from its history).

A saved run keeps the top ``TOP`` rows of each table and the rest summed into ``OTHER`` (``compact``), so a
case's tables stay a few kilobytes; ``Result.attribution`` keeps them whole (a side file's).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import sysconfig
import traceback
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.profiler import profile

import trainbench
from trainbench.core.records.tables import BETWEEN_OPS, OPTIMIZER, OUTSIDE_MODULES




@contextlib.contextmanager
def tracker_warnings_silenced():
    """Where trainbench follows a step's modules with global hooks (``MemTracker``, ``ModTracker``,
    ``FlopCounterMode``), the warnings they cause in a user's output are silenced: "Module is None. Skipping
    PRE_BW/POST_BW hook" for a module made in forward (or one a model's own checkpointing dropped), gone by backward,
    once per module and step; and torch's note that a model the user compiled runs under global module hooks. The
    hooks are trainbench's, not the user's, and nothing read from them depends on those modules."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Module is None\. Skipping (PRE|POST)_BW hook")
        warnings.filterwarnings("ignore", message=r"Using `torch\.compile\(module\)` when there are global hooks")
        yield


def _mod_tracker():
    """``torch.distributed._tools.mod_tracker``, imported by the passes that follow modules through backward."""
    from torch.distributed._tools import mod_tracker  # lazy: torch.distributed's tools take seconds to import

    return mod_tracker


@contextlib.contextmanager
def module_grad_hooks_removed():
    """Remove, on exit, every backward hook a ``ModTracker`` (a ``MemTracker``'s, or the op sites' here) registered
    on the step's tensors.

    ``register_multi_grad_hook`` keeps the tensors' autograd nodes in the closure it registers on those same
    nodes: a reference cycle through C++ that no collector can see, so each tracked step kept its graph alive
    after it ended, and with the graph the model's parameters and gradients. On a GPU each case left its model
    on the device, and the allocator peaks of every later case counted it (measured on an H200: up to 5.4 GiB,
    ``results/gpu-night``). Removing the hooks breaks the cycle. A torch whose tracker registers them otherwise
    is left as it is.

    Inside, the trackers' warnings are silenced (``tracker_warnings_silenced``)."""
    mod_tracker = _mod_tracker()
    register = getattr(mod_tracker, "register_multi_grad_hook", None)
    handles = []

    def recorded(*args, **kwargs):
        handle = register(*args, **kwargs)
        handles.append(handle)
        return handle

    if register is not None:
        mod_tracker.register_multi_grad_hook = recorded
    try:
        with tracker_warnings_silenced():
            yield
    finally:
        if register is not None:
            mod_tracker.register_multi_grad_hook = register
        for handle in handles:
            handle.remove()


class Sites:
    """The site an op runs at: the innermost module whose forward (or backward) is running, or the optimizer step.

    ``backward=True``: PyTorch's ``ModTracker`` follows the modules through forward and backward (global hooks,
    so a custom step's direct submodule calls count too). Its backward hooks keep the graph of a forward that
    never runs backward alive, so where memory is measured (``backward=False``) plain global forward hooks
    follow the modules and backward work is one site, ``(backward)``. Modules are named as ``ModTracker`` names
    them: the root's class, then the attribute path (``ResNet.layer1.0.conv1``).
    """

    def __init__(self, model=None, backward: bool = True):
        self.backward = backward
        self._names = {} if model is None else module_names(model)
        self._modules = None
        self._stack: list[str] = []  # forward-only: the modules whose forward is running, innermost last
        self._in_optimizer = 0
        self._handles: list = []

    def __enter__(self) -> Sites:  # noqa: PYI034 (typing.Self needs Python 3.11)
        def before(optimizer, args, kwargs):
            self._in_optimizer += 1

        def after(optimizer, args, kwargs):
            self._in_optimizer -= 1

        self._handles = [register_optimizer_step_pre_hook(before), register_optimizer_step_post_hook(after)]
        if self.backward:
            self._hooks_removed = module_grad_hooks_removed()
            self._hooks_removed.__enter__()
            self._modules = _mod_tracker().ModTracker()
            self._modules.__enter__()
        else:
            def enter(module, args):
                self._stack.append(self._names.get(module) or type(module).__name__)

            def leave(module, args, output):
                if self._stack:
                    self._stack.pop()

            self._handles += [register_module_forward_pre_hook(enter),
                              register_module_forward_hook(leave, always_call=True)]
        return self

    def __exit__(self, *exc) -> None:
        if self._modules is not None:
            self._modules.__exit__(*exc)
            self._modules = None
            self._hooks_removed.__exit__(*exc)
        for handle in self._handles:
            handle.remove()
        self._handles, self._stack = [], []

    def site(self) -> str:
        if self._in_optimizer:
            return OPTIMIZER
        in_backward = torch._C._current_graph_task_id() != -1
        if self._modules is None:
            if in_backward:
                return "(backward)"
            return self._stack[-1] if self._stack else OUTSIDE_MODULES
        active = [name for name in self._modules.parents if name != "Global"]
        if not active:  # in backward: gradients accumulating into .grad, the loss's own backward
            return f"{OUTSIDE_MODULES} (backward)" if in_backward else OUTSIDE_MODULES
        innermost = max(active, key=lambda name: (name.count("."), name))  # a module's name extends its parent's
        return f"{innermost} (backward)" if in_backward else innermost


def module_names(model) -> dict:
    """Each module of ``model`` -> its site name, as ``ModTracker`` names it: the root's class, then the attribute
    path (``ResNet.layer1.0.conv1``)."""
    root = type(model).__name__
    return {module: root + (f".{name}" if name else "") for name, module in model.named_modules()}


def parameter_sites(model) -> dict[str, int]:
    """Parameter bytes by the module that owns them, named as ``Sites`` names modules (a shared parameter once, at
    its first owner): what a change of the parameters, their gradients or their optimizer state comes from."""
    seen, owned = set(), Counter()
    for module, name in module_names(model).items():
        for parameter in module.parameters(recurse=False):
            if id(parameter) not in seen:
                seen.add(id(parameter))
                owned[name] += parameter.numel() * parameter.element_size()
    return dict(owned)


def per_step(counts, steps: int) -> dict[str, float]:
    """Counts over ``steps`` steps (a mapping, its keys ops or sites) as counts per step, by name."""
    return {str(key): value / steps for key, value in counts.items() if value}


def profile_steps(run_step: Callable[[], None], steps: int, backend) -> dict:
    """Profile ``steps`` steps, one profiler each: per-op self time (ms) per step, calls per step, and on a device
    whose kernels the profiler sees, each kernel's time and launches. Complete tables (``compact`` trims them)."""
    per_step_ms: list[dict[str, float]] = []
    kernel_ms: list[dict[str, float]] = []
    calls: Counter = Counter()
    kernel_calls: Counter = Counter()
    walls = []
    for _ in range(steps):
        with profile(activities=backend.profiler_activities()) as prof:
            started = backend.timer()  # the rounds' clock: a profiled step's wall is timed as a round's step is
            run_step()
            walls.append((backend.timer() - started) * 1e3)
        ops: dict[str, float] = {}
        for row in prof.key_averages():
            if getattr(row, "device_type", DeviceType.CPU) != DeviceType.CPU:
                continue  # a kernel's own row: counted under kernels, and in the op that launched it
            ops[row.key] = ops.get(row.key, 0.0) + getattr(row, backend.profiler_sort_key) / 1e3
            if not per_step_ms:
                calls[row.key] += row.count
        kernels: dict[str, float] = {}
        for event in prof.events():
            if backend.is_device_kernel(event):
                kernels[event.name] = kernels.get(event.name, 0.0) + event.time_range.elapsed_us() / 1e3
                if not per_step_ms:
                    kernel_calls[event.name] += 1
        ops[BETWEEN_OPS] = max(walls[-1] - sum(ops.values()), 0.0)
        per_step_ms.append(ops)
        kernel_ms.append(kernels)
    profile_table = {"steps": steps, "wall_ms": walls, "ops_ms": _series(per_step_ms), "calls": dict(calls)}
    if backend.counts_kernels:
        profile_table.update(kernels_ms=_series(kernel_ms), kernel_calls=dict(kernel_calls))
    return profile_table


def _series(steps: list[dict[str, float]]) -> dict[str, list[float]]:
    """Per-step dicts as one list per key (0 in a step that lacks the key)."""
    keys = sorted({key for step in steps for key in step})
    return {key: [step.get(key, 0.0) for step in steps] for key in keys}


# Sites of allocations no user line asked for. Autograd's engine runs backward on a thread of its own (one per
# device) with no Python frames: its allocations are named by the autograd node whose C++ frame made them.
BACKWARD = "backward (autograd)"
NO_STACK = "(no stack)"
# ``torch::autograd::generated::MmBackward0::apply(...)``: the node autograd recorded for a forward op.
_AUTOGRAD_NODE = re.compile(r"torch::autograd::generated::(\w+)::apply\b")
_AUTOGRAD_ENGINE = "torch::autograd::Engine::"
_LIBRARY_FOLDERS = ("site-packages", "dist-packages")


def allocator_sites(trace: list[dict]) -> dict[str, int]:
    """Bytes live at the allocator's peak by call site, replaying one device's allocator history (the
    ``device_traces`` entries of an allocator snapshot, ``Backend.allocator_history``: ``alloc`` and ``free_completed`` with their
    address, size and frames, Python and C++). A site is ``allocation_site``'s; blocks allocated before the history
    started are not in it. The whole table (``compact`` keeps its top rows)."""
    live: dict[int, tuple[int, str]] = {}
    by_site: Counter = Counter()
    peak, at_peak = 0, {}
    for entry in trace:
        action = entry.get("action")
        if action == "alloc":
            site = allocation_site(entry.get("frames") or [])
            live[entry["addr"]] = (entry["size"], site)
            by_site[site] += entry["size"]
            total = sum(by_site.values())
            if total > peak:
                peak, at_peak = total, {k: v for k, v in by_site.items() if v}
        elif action == "free_completed" and entry.get("addr") in live:
            size, site = live.pop(entry["addr"])
            by_site[site] -= size
    return at_peak


def allocation_site(frames: list[dict]) -> str:
    """Where an allocation comes from, its frames innermost first: the first Python frame of the user's code
    (``file:line (function)``), else the autograd node running it in backward (``backward (autograd): MmBackward0``),
    else the innermost Python frame (the library's line), else ``BACKWARD`` when autograd's engine is on the C++
    stack, else ``NO_STACK``."""
    innermost_python = None
    for frame in frames:
        filename, name = str(frame.get("filename", "")), str(frame.get("name", ""))
        if _is_python_frame(filename):
            if not is_framework_file(filename):
                return _frame_site(frame)
            innermost_python = innermost_python or frame
            continue
        node = _AUTOGRAD_NODE.search(name)
        if node:
            return f"{BACKWARD}: {node.group(1)}"
    if innermost_python is not None:
        return _frame_site(innermost_python)
    if any(_AUTOGRAD_ENGINE in str(frame.get("name", "")) for frame in frames):
        return BACKWARD
    return NO_STACK


def python_call_site() -> str:
    """``allocation_site`` of the Python stack where this is called: the user's line that led here (``file:line
    (function)``), else the innermost library line (an optimizer's own ``.item()``)."""
    return allocation_site([{"filename": f.filename, "line": f.lineno, "name": f.name}
                            for f in reversed(traceback.extract_stack()[:-1])])


def _frame_site(frame: dict) -> str:
    return f"{str(frame.get('filename', '?')).rsplit('/', 1)[-1]}:{frame.get('line', '?')} ({frame.get('name', '?')})"


def _is_python_frame(filename: str) -> bool:
    # C++ frames name a source (.cpp, .h), a library (.so) or nothing ("??")
    return filename.endswith(".py") or filename.startswith("<")


def is_framework_file(filename: str) -> bool:
    """Whether a Python frame's file is trainbench's, PyTorch's, the standard library's or an installed package's
    (not the user's code), by where the file resolves: under one of ``_framework_roots()``, or in a
    site-packages folder. A user's checkout whose path merely contains "trainbench" or "torch" is the user's."""
    if filename.startswith("<"):  # <frozen importlib._bootstrap>, <string>: no file of the user's
        return True
    resolved = _resolved(filename)
    return (any(part in _LIBRARY_FOLDERS for part in resolved.parts)
            or any(resolved.is_relative_to(root) for root in _framework_roots()))


@functools.lru_cache(maxsize=4096)
def _resolved(filename: str) -> Path:
    return Path(os.path.realpath(filename))


@functools.lru_cache(maxsize=1)
def _framework_roots() -> tuple[Path, ...]:
    """trainbench's and PyTorch's installed package folders (also where they run from a checkout), and this
    interpreter's standard library and package folders."""
    packages = (Path(trainbench.__file__).parent, Path(torch.__file__).parent)
    paths = sysconfig.get_paths()
    library = (paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib") if paths.get(key))
    return tuple(dict.fromkeys(_resolved(str(path)) for path in (*packages, *library)))
