"""Cases measured in other processes: DDP ranks, and setups that need a fresh interpreter.

``measure_in_fresh_process`` measures one setup in a new interpreter, for what a device
keeps per process (cuDNN's plan cache, cuBLAS's workspace setting) and would carry from
one case into the next.


``measure_ddp`` spawns ``world_size`` processes (fresh interpreters: CUDA and forked
torch state do not mix), joins them into a process group (gloo on the CPU, NCCL on
GPUs) and runs the same ``Measurement`` in each. Ranks must run identical step
counts or their all-reduces deadlock, so warm-up is fixed rather than adaptive. Rank 0
writes its ``Result`` (timing with its own timer, in lockstep with the others) and the
first-step all-reduced gradients for the guard; the parent reads them back.

On the CPU each rank gets ``threads // world_size`` intra-op threads, so two ranks use
the same cores as the one-process baseline they are compared with.

The ranks are new interpreters, so they re-create the training spec by importing it:
a built-in workload by name, a user's spec from the module-level name it is bound to
(found by ``spec_reference``; the parent's ``sys.path`` goes along, so a spec defined in
a test module is found too). A spec made inside a test function cannot be re-created
there, and says so.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import torch

from .device import Backend
from .measure import Measurement, MeasureSettings
from .recipes import TrainConfig
from .result import Result
from .spec import SpecError, TrainingSpec
from .watchdog import suspended, watch
from .workloads import PROFILES, WORKLOADS, Profile, resolve_spec

JOIN_TIMEOUT_S = 900


class ProcessFailed(RuntimeError):
    """A rank or fresh process ended with an error; the message has its traceback."""


def spec_reference(spec: TrainingSpec) -> str:
    """How a rank process re-creates ``spec``: ``builtin:<name>`` or ``<module>:<attribute>``.

    A user's spec is looked up among the module-level names of the modules that define its
    functions (the test module, usually), then of every loaded module.
    """
    if spec.name in WORKLOADS and getattr(spec.model, "__module__", None) == __package__ + ".workloads":
        return f"builtin:{spec.name}"
    owners = [getattr(fn, "__module__", None) for fn in (spec.model, spec.loss_fn, spec.dataset, spec.batches)]
    candidates = [m for m in dict.fromkeys(owners) if m in sys.modules] + list(sys.modules)
    for module_name in candidates:
        module = sys.modules.get(module_name)
        for attribute, value in list(getattr(module, "__dict__", {}).items()):
            if value is spec and module_name != "__main__":
                return f"{module_name}:{attribute}"
    raise SpecError(f"training spec {spec.name!r}: DDP ranks are new processes and re-create the spec by importing it; "
                    "bind it to a module-level name (e.g. SPEC = TrainingSpec(...) in the test module)")


def load_spec(reference: str, profile: Profile) -> TrainingSpec:
    """The spec ``spec_reference`` named, in this process."""
    module_name, _, attribute = reference.partition(":")
    if module_name == "builtin":
        return resolve_spec(attribute, profile)
    return resolve_spec(getattr(importlib.import_module(module_name), attribute), profile)


def _worker(rank: int, job: dict, out_dir: str) -> None:
    # Before anything starts CUDA: e.g. cuBLAS reads CUBLAS_WORKSPACE_CONFIG once, when it starts.
    os.environ.update(job["env"])
    import torch.distributed as dist

    from .device import get_backend
    from .guards import loss_trajectory
    from .step import Training

    out = Path(out_dir)
    try:
        sys.path[:] = job["sys_path"]  # the parent's: a spec in a test module imports as it did there
        config = TrainConfig(**job["config"])
        world = config.world_size
        if job["threads"]:
            torch.set_num_threads(job["threads"])
        backend = get_backend(job["rank_devices"][rank])
        distributed = config.parallel == "ddp"
        if distributed:
            dist_backend = config.dist_backend or backend.default_dist_backend
            # NCCL bound to this rank's GPU up front (no guessing from the current device, no context on GPU 0).
            # A collective that waits longer than the case's progress limit for a peer raises instead of hanging.
            dist.init_process_group(dist_backend, init_method=f"file://{out / 'rendezvous'}", rank=rank,
                                    world_size=world, device_id=backend.device if dist_backend == "nccl" else None,
                                    timeout=datetime.timedelta(seconds=job["settings"]["no_progress_s"] or 1800))
        profile = PROFILES[job["profile"]]
        spec = load_spec(job["spec"], profile)
        settings = MeasureSettings(**job["settings"])
        with watch(settings.no_progress_s), Training(config, spec, backend) as training:
            if job["want_grads"]:
                # First-step gradients from the seeded weights, after DDP's all-reduce (the guard's input).
                training.forward_backward(training.fetch(training.batches()))
                if rank == 0:
                    grads = {n: p.grad.detach().float().cpu().numpy() for n, p in training.model.named_parameters()
                             if p.grad is not None}
                    np.savez(out / "grads.npz", **grads)
            m = Measurement(training, job["case"], job["recipe"], settings, job["extra_warmup_steps"], profile.name)
            result = m.run()
        if job["want_losses"]:  # the loss guard's trajectory, under this process's state too
            (out / "losses.json").write_text(json.dumps(loss_trajectory(config, spec, backend)))
        if rank == 0:
            tmp = out / "result.json.tmp"
            tmp.write_text(json.dumps(dataclasses.asdict(result)))
            os.replace(tmp, out / "result.json")
        if distributed:
            dist.destroy_process_group()
    except BaseException:
        (out / f"rank{rank}.err").write_text(traceback.format_exc())
        raise


def _job(config: TrainConfig, spec: TrainingSpec, backend: Backend, profile: Profile, settings: MeasureSettings,
         case: str, recipe_name: str, extra_warmup_steps: int, **extra) -> dict:
    return {
        "config": dataclasses.asdict(config),
        "spec": spec_reference(spec),
        "sys_path": list(sys.path),
        "rank_devices": [backend.rank_device_spec(rank) if config.parallel == "ddp" else str(backend.device)
                         for rank in range(config.world_size)],
        "threads": backend.rank_threads(config.world_size) if config.parallel == "ddp" else torch.get_num_threads(),
        "profile": profile.name,
        "settings": dataclasses.asdict(settings),
        "case": case,
        "recipe": recipe_name,
        "extra_warmup_steps": extra_warmup_steps,
        "want_grads": False,
        "want_losses": False,
        "env": {},
        **extra,
    }


def _launch(job: dict, nprocs: int, backend: Backend, what: str) -> Path:
    """Run ``_worker`` in ``nprocs`` new interpreters; returns the folder they wrote to (caller removes it)."""
    import torch.multiprocessing as mp
    from torch.multiprocessing.spawn import ProcessException

    backend.release_memory()  # the parent's cached blocks would share the GPU with the new processes
    out_dir = tempfile.mkdtemp(prefix="trainbench-proc-")
    context = mp.spawn(_worker, args=(job, out_dir), nprocs=nprocs, join=False)
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    try:
        with suspended():  # the processes watch their own progress; the deadline bounds the wait for them
            while not context.join(timeout=max(1.0, deadline - time.monotonic())):  # returns as each one exits
                if time.monotonic() > deadline:
                    for process in context.processes:
                        process.kill()
                    raise RuntimeError(f"still running after {JOIN_TIMEOUT_S} s (a collective hung?)")
    except (RuntimeError, ProcessException) as e:
        errors = "\n".join(p.read_text() for p in sorted(Path(out_dir).glob("rank*.err")))
        shutil.rmtree(out_dir, ignore_errors=True)
        raise ProcessFailed(f"{job['case']}: {what} failed:\n{errors or e}") from None
    except BaseException:  # Ctrl-C or SIGTERM in the parent: no rank outlives it, no temp folder stays
        for process in context.processes:
            if process.is_alive():
                process.kill()
        for process in context.processes:
            process.join(timeout=10)
        shutil.rmtree(out_dir, ignore_errors=True)
        raise
    return Path(out_dir)


def measure_ddp(config: TrainConfig, spec: TrainingSpec, backend: Backend, profile: Profile, settings: MeasureSettings,
                case: str, recipe_name: str, extra_warmup_steps: int = 0, want_grads: bool = False
                ) -> tuple[Result, dict[str, torch.Tensor] | None]:
    """Run ``config`` (parallel="ddp") in ``config.world_size`` processes; rank 0's Result and gradients."""
    settings = dataclasses.replace(settings, fixed_warmup=True)
    job = _job(config, spec, backend, profile, settings, case, recipe_name, extra_warmup_steps, want_grads=want_grads)
    out = _launch(job, config.world_size, backend, "a DDP rank")
    try:
        result = Result(**json.loads((out / "result.json").read_text()))
        grads = None
        if want_grads:
            with np.load(out / "grads.npz", allow_pickle=False) as npz:
                grads = {name: torch.from_numpy(npz[name]) for name in npz.files}
        return result, grads
    finally:
        shutil.rmtree(out, ignore_errors=True)


def measure_in_fresh_process(config: TrainConfig, spec: TrainingSpec, backend: Backend, profile: Profile,
                             settings: MeasureSettings, case: str, recipe_name: str, extra_warmup_steps: int = 0,
                             env: dict[str, str] | None = None, want_losses: bool = False
                             ) -> tuple[Result, list[float] | None]:
    """Measure one setup in a new interpreter: no plan cache, autotuning result or library state of earlier cases.

    Returns its Result and, with ``want_losses``, the loss guard's trajectory run in that process too.
    """
    job = _job(config, spec, backend, profile, settings, case, recipe_name, extra_warmup_steps,
               want_losses=want_losses, env=dict(env or {}))
    out = _launch(job, 1, backend, "the fresh process")
    try:
        result = Result(**json.loads((out / "result.json").read_text()))
        losses = json.loads((out / "losses.json").read_text()) if want_losses else None
    finally:
        shutil.rmtree(out, ignore_errors=True)
    result.notes.append("measured in a fresh process" + (f" ({', '.join(f'{k}={v}' for k, v in env.items())})"
                                                           if env else ""))
    return result, losses
