"""Profiles on demand: a PyTorch Profiler trace of a few training steps of one case.

The seed articles read training through the profiler's TensorBoard plugin. ``record_trace``
builds the case's setup afresh after its measurement (never inside timed rounds), runs
``WARMUP_STEPS`` steps the profiler warms up on and ``ACTIVE_STEPS`` it records, each one
synchronized, and writes into ``<folder>/<case>/``:

- ``<case>.<timestamp>.pt.trace.json``: ``torch.profiler.tensorboard_trace_handler``'s file,
  what TensorBoard's PyTorch Profiler plugin (``tensorboard --logdir <folder>``) and
  HolisticTraceAnalysis load. It is a Chrome trace (``{"traceEvents": [...]}``): Perfetto and
  chrome://tracing open it as it is (the profiler saves its events once, so there is no copy);
- ``ops.txt``: the operators' table (``key_averages``), heaviest first;
- on a device with an allocator history (CUDA), ``memory_snapshot.pickle``: every allocation
  and free of those steps with its stack (``Backend.memory_history``), for pytorch.org/memory_viz.

Whether a case can be traced in this process is ``eligibility.why_not`` with ``Context(traced=True)``.
A trace that cannot be written raises ``OSError``; the case keeps its measurement (``Executor.trace``).
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch.profiler

from trainbench.core.setups.recipes import TrainConfig
from trainbench.core.setups.spec import TrainingSpec
from trainbench.core.setups.training import TrainingSetup
from trainbench.core.harness.watchdog import phase
from trainbench.devices.device import Backend

WARMUP_STEPS = 2  # the profiler's own start-up cost lands here, not in the recorded steps
ACTIVE_STEPS = 3


@dataclass(frozen=True)
class TraceRequest:
    """Where traces go and which cases get one (``wants(case_id)``)."""

    folder: Path
    wants: Callable[[str], bool] = lambda case: True


# Room for the trace file's ".<nanoseconds>.pt.trace.json" within a file system's 255-byte name limit.
MAX_NAME_CHARS = 120


def case_folder_name(case: str) -> str:
    """A file-system-safe folder and file name for a case id (ids hold brackets, commas and slashes). An id that
    is safe as it is keeps its name; one that had to be changed (or cut: a long id) ends with a hash of the whole
    id, so two ids that change into the same text (CJK names: all ``_``) never share a folder."""
    name = re.sub(r"[^A-Za-z0-9_.+-]+", "_", case).strip("_") or "case"
    if name == case and len(name) <= MAX_NAME_CHARS:
        return name
    digest = hashlib.sha1(case.encode("utf-8")).hexdigest()[:10]
    return f"{name[:MAX_NAME_CHARS - len(digest) - 1]}-{digest}"


def record_trace(config: TrainConfig, spec: TrainingSpec, backend: Backend, folder: Path, case: str) -> list[Path]:
    """Profile ``ACTIVE_STEPS`` steps of a freshly built ``config``; returns the files written."""
    name = case_folder_name(case)
    out = Path(folder) / name
    out.mkdir(parents=True, exist_ok=True)
    started_ns = time.time_ns()

    def on_trace_ready(prof) -> None:
        torch.profiler.tensorboard_trace_handler(str(out), worker_name=name)(prof)
        table = prof.key_averages().table(sort_by=backend.profiler_sort_key, row_limit=40)
        (out / "ops.txt").write_text(f"{case}: {ACTIVE_STEPS} training steps after {WARMUP_STEPS} warm-up steps, "
                                     f"{backend.name}\n{table}\n", encoding="utf-8")

    with phase("the profile trace"), TrainingSetup(config, spec, backend) as training:
        batches = training.batches()
        with backend.memory_history(out / "memory_snapshot.pickle"), \
                torch.profiler.profile(activities=backend.profiler_activities(), record_shapes=True, profile_memory=True,
                                       schedule=torch.profiler.schedule(wait=0, warmup=WARMUP_STEPS, active=ACTIVE_STEPS, repeat=1),
                                       on_trace_ready=on_trace_ready) as prof:
            for _ in range(WARMUP_STEPS + ACTIVE_STEPS):
                training.step(training.fetch(batches))
                backend.synchronize()  # each recorded step ends with its device work
                prof.step()
    files = sorted(p for p in out.iterdir() if p.stat().st_mtime_ns >= started_ns)
    if not any(p.name.endswith(".pt.trace.json") for p in files):  # the profiler logs a failed write, raises nothing
        raise OSError(f"the profiler wrote no trace file into {out}")
    return files
