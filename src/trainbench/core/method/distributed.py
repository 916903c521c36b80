"""Cases measured in other processes: DDP ranks under torchrun, and setups that need a fresh interpreter.

``measure_ddp`` runs ``world_size`` rank processes through PyTorch's own launcher,
``torch.distributed.run`` (torchrun's elastic agent: c10d rendezvous, ``RANK``/``LOCAL_RANK``/
``WORLD_SIZE`` in each rank's environment, ``init_process_group`` from it; gloo on the CPU,
NCCL on GPUs). Every rank runs the same ``Measurer``; its timed rounds start at a barrier, so
round N is the same round on every rank, and the case's round time is the slowest rank's (the
job goes at its pace). Ranks must run identical step counts or their all-reduces deadlock, so
warm-up is fixed rather than adaptive. Rank 0 gathers every rank's round times, memory breakdown
and whether their all-reduced first-step gradients are identical, and writes the ``Result``
(with ``ranks``) and the gradients for the guard; the parent reads them back.

``measure_in_fresh_process`` measures one setup in a new interpreter, for what a device
keeps per process (cuDNN's plan cache, cuBLAS's workspace setting) and would carry from
one case into the next.

On the CPU each rank gets ``threads // world_size`` intra-op threads, so two ranks use
the same cores as the one-process baseline they are compared with.

The ranks are new interpreters, so they re-create the training spec by importing it:
a built-in workload by name, a user's spec from the module-level name it is bound to
(found by ``spec_reference``; the parent's ``sys.path`` goes along, so a spec defined in
a test module is found too). A spec made inside a test function cannot be re-created
there, and says so.

Several machines: a rank runs ``python -m trainbench.core.processes.rank_entry JOB_DIR`` under any torchrun
(see ``torchrun_command``), so the same job runs with ``--nnodes=2 --rdzv-backend=c10d
--rdzv-endpoint=HOST:PORT`` on each node.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import faulthandler
import importlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from trainbench.core.harness.costs import case_ledger, spent
from trainbench.core.method.settings import MeasureSettings
from trainbench.core.setups.recipes import NotApplicable, TrainConfig, get_recipe
from trainbench.core.records.result import RELAUNCH_NOTE, Result
from trainbench.core.setups.spec import SpecError, TrainingSpec
from trainbench.core.harness.watchdog import suspended, watch
from trainbench.core.setups.workloads import PROFILES, WORKLOADS, Profile, resolve_spec
from trainbench.devices.device import Backend, get_backend

JOIN_TIMEOUT_S = 900


class ProcessFailed(RuntimeError):
    """A rank or fresh process ended with an error; the message has its traceback."""


def spec_reference(spec: TrainingSpec) -> str:
    """How a rank process re-creates ``spec``: ``builtin:<name>`` or ``<module>:<attribute>``.

    A user's spec is looked up among the module-level names of the modules that define its
    functions (the test module, usually), then of every loaded module.
    """
    builtin_module = resolve_spec.__module__  # core.setups.workloads, where the built-in specs are made
    if spec.name in WORKLOADS and getattr(spec.model, "__module__", None) == builtin_module:
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


def import_spec_module(reference: str) -> None:
    """Import the module that defines a ``spec_reference``'s spec: what it registers (a user's own knobs and recipes,
    ``trainbench.recipe``) exists in this process before a config that turns them is read."""
    module_name = reference.partition(":")[0]
    if module_name != "builtin":
        importlib.import_module(module_name)


def load_spec(reference: str, profile: Profile) -> TrainingSpec:
    """The spec ``spec_reference`` named, in this process."""
    module_name, _, attribute = reference.partition(":")
    if module_name == "builtin":
        return resolve_spec(attribute, profile)
    return resolve_spec(getattr(importlib.import_module(module_name), attribute), profile)


def barrier_rounds(barrier):
    """A ``RoundRunner`` whose rounds all start at ``barrier()``: round N is timed over the same steps on every rank."""
    def runner(step, rounds: int, steps_per_round: int, timer) -> list[float]:
        times = []
        for _ in range(rounds):
            barrier()
            start = timer()
            for _ in range(steps_per_round):
                step()
            times.append((timer() - start) / steps_per_round)
        return times

    return runner


def full_gradients(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter's whole gradient on this rank (an FSDP shard is gathered: a collective, every rank calls it)."""
    from trainbench.core.setups.training import gradient_copy  # loaded by now: see _run_rank

    grads = {}
    for name, p in model.named_parameters():
        if p.grad is not None:
            grad = p.grad.detach()
            grads[name] = gradient_copy(grad.full_tensor() if hasattr(grad, "full_tensor") else grad, grad.device)
    return grads


def gradient_spread(grads: dict[str, torch.Tensor]) -> float:
    """The largest difference of any gradient element between ranks (0.0: identical).

    Every rank all-reduces its flattened gradients once with MAX and once with MIN; equal vectors mean
    every rank holds the same gradients bit for bit, as data-parallel training requires.
    """
    flat = torch.cat([g.flatten() for g in grads.values()]) if grads else torch.zeros(1)
    high, low = flat.clone(), flat.clone()
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    return float((high - low).abs().max())


def run_rank(out_dir: str) -> None:
    """One rank (or the one fresh process) of the job in ``out_dir``; under torchrun, from its environment."""
    out = Path(out_dir)
    rank = int(os.environ.get("RANK", "0"))
    # A crash below Python (a C++ abort in a collective, a segfault) leaves no traceback file: this prints every
    # thread's Python stack to the rank's stderr, which torchrun keeps in the job's logs.
    faulthandler.enable()
    # torchrun starts each rank in a session of its own: the launcher ends the rank's group by this id if need be.
    (out / f"rank{rank}.pid").write_text(str(os.getpid()))
    try:
        job = json.loads((out / "job.json").read_text())
        # Before anything starts CUDA: e.g. cuBLAS reads CUBLAS_WORKSPACE_CONFIG once, when it starts.
        os.environ.update(job["env"])
        _run_rank(job, out, rank)
    except NotApplicable as e:  # the recipe cannot apply to the spec's model: the case is skipped, not failed
        (out / f"rank{rank}.not_applicable").write_text(str(e))
        raise
    except BaseException:
        (out / f"rank{rank}.err").write_text(traceback.format_exc())
        raise


def _run_rank(job: dict, out: Path, rank: int) -> None:
    sys.path[:] = job["sys_path"]  # the parent's: a spec in a test module imports as it did there
    import_spec_module(job["spec"])  # registers the user's own knobs the config may turn
    config = TrainConfig.of(**job["config"])
    distributed = config.rank_processes
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if distributed and world != config.shards:
        raise RuntimeError(f"the case trains {config.world_size} ranks, but torchrun started WORLD_SIZE={world}")
    if job["threads"]:
        torch.set_num_threads(job["threads"])
    backend = get_backend(job["rank_devices"][local_rank % len(job["rank_devices"])])
    if distributed:
        dist_backend = config.dist_backend or backend.default_dist_backend
        # From torchrun's environment (MASTER_ADDR/PORT, RANK, WORLD_SIZE); NCCL bound to this rank's GPU up front
        # (no guessing from the current device, no context on GPU 0). A collective that waits longer than the
        # case's progress limit for a peer raises instead of hanging.
        dist.init_process_group(dist_backend, device_id=backend.device if dist_backend == "nccl" else None,
                                timeout=datetime.timedelta(seconds=job["settings"]["no_progress_s"] or 1800))
    profile = PROFILES[job["profile"]]
    spec = load_spec(job["spec"], profile)
    settings = MeasureSettings(**job["settings"])
    # The training modules (torch._dynamo with them: about a second of CPU) load once the rank has its spec and its
    # peers: a rank whose spec's module fails to import, or whose peer died before they met, ends without them.
    from trainbench.core.setups.guards import loss_trajectory
    from trainbench.core.setups.training import TrainingSetup

    ranks: dict = {}
    with case_ledger() as ledger, watch(settings.no_progress_s):
        with spent("setup"):
            training = TrainingSetup(config, spec, backend)
        with training:
            result = _measure_rank(job, out, rank, training, distributed, settings, profile, ranks)
    result = result.replace(phase_seconds=dict(ledger.seconds))  # what the parent adds to the case's costs
    if job["want_losses"]:  # the loss guard's trajectory, under this process's state too
        (out / "losses.json").write_text(json.dumps(loss_trajectory(config, spec, backend)))
    if distributed:
        mine = {"round_step_times_s": result.round_step_times_s, "memory_breakdown_bytes": result.memory_breakdown_bytes,
                "peak_allocated_bytes": result.peak_allocated_bytes, "device": str(backend.device)}
        gathered = [None] * world
        dist.all_gather_object(gathered, mine)
        per_round = list(zip(*(r["round_step_times_s"] for r in gathered)))
        ranks.update(world_size=world, launcher="torchrun (torch.distributed.run)", dist_backend=dist.get_backend(),
                     ideal_speedup=backend.ideal_ddp_speedup(world), per_rank=gathered)
        # The job goes at its slowest rank's pace.
        result = result.replace(round_step_times_s=[max(times) for times in per_round], round_cpu_times_s=[],  # not one rank's
                                ranks=ranks).with_note(
            f"{world} ranks under torchrun; each timed round starts at a barrier and lasts as long as its slowest rank")
    if rank == 0:
        tmp = out / "result.json.tmp"
        tmp.write_text(json.dumps(result.to_dict()))
        os.replace(tmp, out / "result.json")
    if distributed:
        dist.destroy_process_group()


def _measure_rank(job: dict, out: Path, rank: int, training, distributed: bool, settings, profile, ranks: dict):
    """The rank's measurement on its built setup (DDP ranks record their first-step gradients first)."""
    # loaded by now: see _run_rank
    from trainbench.core.method.measure import Measurer, run_rounds
    from trainbench.core.setups.training import dropout_switched_off

    if distributed:
        # First-step gradients from the seeded weights, after the all-reduce (DDP: identical on every rank) or the
        # reduce-scatter (FSDP: each rank its shard, gathered whole here), rank 0's the guard's input.
        # (with the model's dropout off where the guard compares so: a rank's share draws other masks than the batch)
        with dropout_switched_off(training.model) if job.get("grads_dropout_off") else contextlib.nullcontext():
            training.forward_backward(training.fetch(training.batches()))
        grads = full_gradients(training.model)
        ranks["max_grad_difference_between_ranks"] = gradient_spread(grads)
        if job["want_grads"] and rank == 0:
            np.savez(out / "grads.npz", **{n: g.cpu().numpy() for n, g in grads.items()})
    m = Measurer(training, job["case"], job["recipe"], settings, job["extra_warmup_steps"], profile.name)
    return m.run(barrier_rounds(dist.barrier) if distributed else run_rounds)


def _job(config: TrainConfig, spec: TrainingSpec, backend: Backend, profile: Profile, settings: MeasureSettings,
         case: str, recipe_name: str, extra_warmup_steps: int, **extra) -> dict:
    return {
        "config": config.record(),
        "spec": spec_reference(spec),
        "sys_path": list(sys.path),
        "rank_devices": [backend.rank_device_spec(rank) if config.rank_processes else str(backend.device)
                         for rank in range(config.world_size)],
        "threads": backend.rank_threads(config.world_size) if config.rank_processes else torch.get_num_threads(),
        "profile": profile.name,
        "settings": dataclasses.asdict(settings),
        "case": case,
        "recipe": recipe_name,
        "extra_warmup_steps": extra_warmup_steps,
        "want_grads": False,
        "grads_dropout_off": False,
        "want_losses": False,
        "env": {},
        **extra,
    }


def torchrun_command(nprocs: int, job_dir: str | Path, rendezvous: list[str] | None = None,
                     log_dir: str | Path | None = None) -> list[str]:
    """The torchrun command line that runs the job in ``job_dir`` as ``nprocs`` ranks on this machine.

    ``rendezvous``: torchrun's options for several machines (``--nnodes=2 --node-rank=0
    --rdzv-backend=c10d --rdzv-endpoint=HOST:PORT --rdzv-id=RUN``); default ``--standalone``, one
    machine on a free local port. ``log_dir``: torchrun writes each rank's stdout and stderr there
    (``<log_dir>/<run>/attempt_0/<local rank>/stderr.log``), so a rank that dies is told apart.
    """
    logs = [f"--log-dir={log_dir}", "--redirects=3"] if log_dir else []
    return [sys.executable, "-m", "torch.distributed.run", *(rendezvous or ["--standalone"]),
            f"--nproc-per-node={nprocs}", "--max-restarts=0", *logs, "-m", "trainbench.core.processes.rank_entry", str(job_dir)]


def write_job(job: dict) -> Path:
    """A new folder holding ``job.json``: what every rank reads (the caller removes the folder)."""
    out = Path(tempfile.mkdtemp(prefix="trainbench-proc-"))
    (out / "job.json").write_text(json.dumps(job))
    return out


def scale_out_job(case_id: str, nnodes: int, nproc_per_node: int, backend: Backend, profile: Profile,
                  settings: MeasureSettings) -> Path:
    """The job of a DDP or FSDP case (``<workload>-<recipe>``) over ``nnodes`` x ``nproc_per_node`` ranks, in a new
    folder that torchrun runs on every node (``python -m trainbench torchrun-job`` prints the commands)."""
    workload, _, recipe_name = case_id.partition("-")
    if workload not in WORKLOADS:
        raise SpecError(f"{case_id!r}: no built-in workload {workload!r} (expected <workload>-<recipe>, "
                        f"workloads: {', '.join(sorted(WORKLOADS))})")
    recipe = get_recipe(recipe_name)
    config = recipe.config(profile)
    if not config.rank_processes:
        raise SpecError(f"{case_id!r}: recipe {recipe_name!r} trains in one process; torchrun runs DDP and FSDP cases")
    if nnodes < 1 or nproc_per_node < 1:
        raise SpecError(f"{case_id!r}: --nnodes and --nproc-per-node must be >= 1, got {nnodes} and {nproc_per_node}")
    config = dataclasses.replace(config, world_size=nnodes * nproc_per_node)  # the recipe, scaled out
    job = _job(config, resolve_spec(workload, profile), backend, profile, dataclasses.replace(settings, fixed_warmup=True),
               case_id, recipe.name, recipe.extra_warmup_steps)
    job["rank_devices"] = [backend.rank_device_spec(r) for r in range(nproc_per_node)]  # by LOCAL_RANK on each node
    return write_job(job)


def _child_env(job: dict) -> dict:
    env = {**os.environ, **job["env"]}
    if job["threads"]:  # torchrun would otherwise set OMP_NUM_THREADS=1 for every rank (with a warning)
        env["OMP_NUM_THREADS"] = str(job["threads"])
    return env


def _end(process: subprocess.Popen, out: Path) -> None:
    """End a launched process and everything it started: torchrun (which stops its ranks on SIGTERM), then
    whatever is left of each rank's own session (torchrun starts every rank in one), DataLoader workers too."""
    _signal_group(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        _signal_group(process.pid, signal.SIGKILL)
        process.wait()
    for pid_file in out.glob("rank*.pid"):
        pid = int(pid_file.read_text() or 0)
        if _runs_job(pid, out):  # not a process that reused the pid of a rank that ended
            _signal_group(pid, signal.SIGKILL)


def _runs_job(pid: int, out: Path) -> bool:
    try:
        return str(out) in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False  # gone (or no /proc: torchrun's own SIGTERM handling ended its ranks)


def _signal_group(pid: int, sig: int) -> None:
    try:
        if pid > 0:
            os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass  # already gone


# A job one of whose processes crashed below Python (a C++ abort, heap corruption, a segfault: faulthandler says
# "Fatal Python error") is run again once, from the start: such crashes were seen rarely and at random on a loaded
# 2-core runner (``malloc(): unsorted double linked list corrupted`` as gloo ranks stopped the profiler). A Python
# error, a hang and a crash that repeats still fail the case.
NATIVE_CRASH_RELAUNCHES = 1


def _launch(job: dict, nprocs: int, backend: Backend, what: str) -> tuple[Path, list[str]]:
    """Run the job in ``nprocs`` new interpreters (torchrun for DDP); the folder they wrote to (the caller removes
    it) and the notes for its result: the native crashes it was relaunched after, each summarized in a line, and
    what this process keeps on a device the new ones use."""
    crashes: list[str] = []
    while True:
        out, returncode = _launch_once(job, nprocs, backend, what)
        if returncode == 0:
            return out, [f"{RELAUNCH_NOTE}: {crash}" for crash in crashes] + _shared_device(job, backend)
        not_applicable = sorted(out.glob("rank*.not_applicable"))
        if not_applicable:  # as the case's own process would have said it
            reason = not_applicable[0].read_text()
            shutil.rmtree(out, ignore_errors=True)
            raise NotApplicable(reason)
        errors, crash = _errors(out), _native_crash(out)
        shutil.rmtree(out, ignore_errors=True)
        if crash is None or len(crashes) == NATIVE_CRASH_RELAUNCHES:
            earlier = "".join(f"\n(run again after an earlier crash: {c})" for c in crashes)
            raise ProcessFailed(f"{job['case']}: {what} failed (exit status {returncode}):\n{errors}{earlier}")
        crashes.append(crash)


def _shared_device(job: dict, backend: Backend) -> list[str]:
    """A note where this process's device is one the job's processes use (rank 0's GPU): what it keeps there."""
    kept = backend.kept_while_others_run() if str(backend.device) in job["rank_devices"] else None
    return [kept] if kept else []


def _launch_once(job: dict, nprocs: int, backend: Backend, what: str) -> tuple[Path, int]:
    backend.release_memory()  # the parent's cached blocks would share the GPU with the new processes
    out = write_job(job)
    command = (torchrun_command(nprocs, out, log_dir=out / "logs") if TrainConfig.of(**job["config"]).rank_processes
               else [sys.executable, "-m", "trainbench.core.processes.rank_entry", str(out)])
    with open(out / "launcher.log", "wb") as log:
        process = subprocess.Popen(command, env=_child_env(job), stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)  # one process group: ended together, whatever happens
    try:
        with suspended():  # the processes watch their own progress; the deadline bounds the wait for them
            return out, process.wait(timeout=JOIN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        _end(process, out)
        errors = _errors(out)
        shutil.rmtree(out, ignore_errors=True)
        raise ProcessFailed(f"{job['case']}: {what} still running after {JOIN_TIMEOUT_S} s (a collective hung?)"
                            + (f":\n{errors}" if errors else "")) from None
    except BaseException:  # Ctrl-C or SIGTERM in the parent: no rank outlives it, no temp folder stays
        _end(process, out)
        shutil.rmtree(out, ignore_errors=True)
        raise


def _native_crash(out: Path) -> str | None:
    """One line for a job one of whose processes crashed below Python, naming the process and what it printed last
    (faulthandler's 'Fatal Python error: Aborted' or 'Segmentation fault' and the line above it, e.g. ``malloc():
    ...`` or ``terminate called ...``); None when none did: a Python error (its peers then fail in Python too, or
    are ended by torchrun) is the case's failure, and running it again would repeat it."""
    streams = sorted(out.glob("logs/*/attempt_*/*/stderr.log")) + [out / "launcher.log"]
    for stream in streams:
        lines = [line for line in (stream.read_text(errors="replace").splitlines() if stream.exists() else [])
                 if line.strip()]
        fatal = next((i for i, line in enumerate(lines) if line.startswith("Fatal Python error")), None)
        if fatal is not None:
            who = f"local rank {stream.parent.name}" if stream.name == "stderr.log" else "the process"
            return f"{who}: " + "; ".join(lines[max(fatal - 1, 0):fatal + 1] + _crash_sites(lines[fatal + 1:]))
    return None


def _crash_sites(stacks: list[str]) -> list[str]:
    """Where the crashing thread and up to two others were, from faulthandler's stacks: each one's innermost frame
    (``measure.py:418 in count_calls``), or ``<no Python frame>`` for a native thread or the interpreter's exit."""
    sites = []
    for header, first in zip(stacks, stacks[1:] + [""]):
        if header.startswith(("Current thread", "Thread 0x")) and len(sites) < 3:
            frame = re.match(r'\s*File "(?:.*/)?([^/"]+)", line (\d+) in (\S+)', first)
            where = f"{frame[1]}:{frame[2]} in {frame[3]}" if frame else first.strip() or "?"
            sites.append(("crashing thread" if header.startswith("Current") else "another thread") + f" at {where}")
    return sites


def _errors(out: Path) -> str:
    """The ranks' Python tracebacks; for a rank that died without one (a C++ abort, a signal), the end of its
    stderr (``terminate called ...``, faulthandler's stacks); else the end of the launcher's output."""
    same: dict[str, list[str]] = {}  # each traceback once: ranks that fail alike (a spec's error) print it alike
    for path in sorted(out.glob("rank*.err")):
        same.setdefault(path.read_text(), []).append(path.stem)
    if same:
        return "\n".join(text if len(ranks) == 1 else f"{' and '.join(ranks)}, the same traceback:\n{text}"
                         for text, ranks in same.items())
    errors = []
    for stderr in sorted(out.glob("logs/*/attempt_*/*/stderr.log")):
        lines = stderr.read_text(errors="replace").splitlines()
        if lines:
            errors.append(f"local rank {stderr.parent.name}'s stderr (last {min(len(lines), 40)} lines):\n"
                          + "\n".join(lines[-40:]))
    log = out / "launcher.log"
    if log.exists():  # torchrun's own summary after the ranks' streams; a fresh process's whole output otherwise
        tail = log.read_text(errors="replace").splitlines()[-12 if errors else -40:]
        errors.append(("torchrun: " if errors else "") + "\n".join(tail))
    return "\n".join(errors)


def _with_notes(result: Result, notes: list[str]) -> Result:
    """The measurement is the relaunched job's, whole; the crash before it is recorded, never dropped, and so is
    what the parent kept on a device the processes used."""
    for note in notes:
        result = result.with_note(note)
    return result


def measure_ddp(config: TrainConfig, spec: TrainingSpec, backend: Backend, profile: Profile, settings: MeasureSettings,
                case: str, recipe_name: str, extra_warmup_steps: int = 0, want_grads: bool = False,
                grads_dropout_off: bool = False) -> tuple[Result, dict[str, torch.Tensor] | None]:
    """Run ``config`` (parallel="ddp") as ``config.world_size`` torchrun ranks; rank 0's Result and gradients (its
    first step's, with the model's dropout off where ``grads_dropout_off``)."""
    settings = dataclasses.replace(settings, fixed_warmup=True)
    job = _job(config, spec, backend, profile, settings, case, recipe_name, extra_warmup_steps, want_grads=want_grads,
               grads_dropout_off=grads_dropout_off)
    out, notes = _launch(job, config.world_size, backend, "a DDP rank")
    try:
        result = _with_notes(Result.from_dict(json.loads((out / "result.json").read_text())), notes)
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
    out, notes = _launch(job, 1, backend, "the fresh process")
    try:
        result = _with_notes(Result.from_dict(json.loads((out / "result.json").read_text())), notes)
        losses = json.loads((out / "losses.json").read_text()) if want_losses else None
    finally:
        shutil.rmtree(out, ignore_errors=True)
    result = result.with_note("measured in a fresh process" + (
        f" ({', '.join(f'{k}={v}' for k, v in env.items())})" if env else ""))
    return result, losses
