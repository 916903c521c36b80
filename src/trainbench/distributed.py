"""Data-parallel cases: launch one process per rank, measure in all, report rank 0.

``measure_ddp`` spawns ``world_size`` processes (fresh interpreters: CUDA and forked
torch state do not mix), joins them into a process group (gloo on the CPU, NCCL on
GPUs) and runs the same ``Measurement`` in each. Ranks must run identical step
counts or their all-reduces deadlock, so warm-up is fixed rather than adaptive. Rank 0
writes its ``Result`` (timing with its own timer, in lockstep with the others) and the
first-step all-reduced gradients for the guard; the parent reads them back.

On the CPU each rank gets ``threads // world_size`` intra-op threads, so two ranks use
the same cores as the one-process baseline they are compared with.

Workloads and recipes must be importable from ``trainbench`` (the ranks are new
interpreters): a workload registered only inside a test module is not seen there.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import torch

from .measure import Measurement, MeasureSettings
from .recipes import TrainConfig
from .result import Result
from .workloads import PROFILES

JOIN_TIMEOUT_S = 900


def _worker(rank: int, job: dict, out_dir: str) -> None:
    import torch.distributed as dist

    from .device import get_backend
    from .step import Training

    out = Path(out_dir)
    try:
        config = TrainConfig(**job["config"])
        world = config.world_size
        on_gpu = job["device_kind"] == "cuda"
        if not on_gpu:
            torch.set_num_threads(max(1, job["threads"] // world))
        dist_backend = config.dist_backend or ("nccl" if on_gpu else "gloo")
        dist.init_process_group(dist_backend, init_method=f"file://{out / 'rendezvous'}", rank=rank, world_size=world)
        backend = get_backend(f"cuda:{rank}" if on_gpu else "cpu")
        profile = PROFILES[job["profile"]]
        settings = MeasureSettings(**job["settings"])
        with Training(config, backend, profile) as training:
            if job["want_grads"]:
                # First-step gradients from the seeded weights, after DDP's all-reduce (the guard's input).
                training.forward_backward(training.fetch(training.batches()))
                if rank == 0:
                    grads = {n: p.grad.detach().float().cpu().numpy() for n, p in training.model.named_parameters()
                             if p.grad is not None}
                    np.savez(out / "grads.npz", **grads)
            m = Measurement(training, job["case"], job["recipe"], settings, job["extra_warmup_steps"])
            result = m.run()
        if rank == 0:
            tmp = out / "result.json.tmp"
            tmp.write_text(json.dumps(dataclasses.asdict(result)))
            os.replace(tmp, out / "result.json")
        dist.destroy_process_group()
    except BaseException:
        (out / f"rank{rank}.err").write_text(traceback.format_exc())
        raise


def measure_ddp(config: TrainConfig, device_kind: str, profile_name: str, settings: MeasureSettings, case: str,
                recipe_name: str, extra_warmup_steps: int = 0, want_grads: bool = False
                ) -> tuple[Result, dict[str, torch.Tensor] | None]:
    """Run ``config`` (parallel="ddp") in ``config.world_size`` processes; rank 0's Result and gradients."""
    import torch.multiprocessing as mp
    from torch.multiprocessing.spawn import ProcessException

    settings = dataclasses.replace(settings, fixed_warmup=True)
    job = {
        "config": dataclasses.asdict(config),
        "device_kind": device_kind,
        "profile": profile_name,
        "settings": dataclasses.asdict(settings),
        "case": case,
        "recipe": recipe_name,
        "extra_warmup_steps": extra_warmup_steps,
        "want_grads": want_grads,
        "threads": torch.get_num_threads(),
    }
    with tempfile.TemporaryDirectory(prefix="trainbench-ddp-") as out_dir:
        context = mp.spawn(_worker, args=(job, out_dir), nprocs=config.world_size, join=False)
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        try:
            while not context.join(timeout=max(1.0, deadline - time.monotonic())):  # returns as each rank exits
                if time.monotonic() > deadline:
                    for process in context.processes:
                        process.kill()
                    raise RuntimeError(f"ranks still running after {JOIN_TIMEOUT_S} s (a collective hung?)")
        except (RuntimeError, ProcessException) as e:
            errors = "\n".join(p.read_text() for p in sorted(Path(out_dir).glob("rank*.err")))
            raise RuntimeError(f"{case}: a DDP rank failed:\n{errors or e}") from None
        out = Path(out_dir)
        fields = json.loads((out / "result.json").read_text())
        result = Result(**fields)
        grads = None
        if want_grads:
            with np.load(out / "grads.npz", allow_pickle=False) as npz:
                grads = {name: torch.from_numpy(npz[name]) for name in npz.files}
        return result, grads
