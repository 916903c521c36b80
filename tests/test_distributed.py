"""DDP over gloo: two rank processes on the CPU, the path a GPU nightly takes with NCCL."""

import dataclasses
from pathlib import Path

import pytest
import rank_faults
import torch

from trainbench.core.method.distributed import ProcessFailed, measure_ddp
from trainbench.core.setups.guards import compare_gradients, first_step_gradients
from trainbench.core.setups.recipes import TrainConfig, get_recipe
from trainbench.core.records.result import RELAUNCH_NOTE
from trainbench.core.setups.spec import SpecError
from trainbench.core.setups.workloads import PROFILES, resolve_spec


# The faulty jobs' spec: rank_faults plants its fault (by TRAINBENCH_TEST_FAULT) as a rank imports it, before the
# process group and the training modules. Its ranks make their batches on the device: no loader either.
DDP_ON_SYNTHETIC_BATCHES = TrainConfig(parallel="ddp", world_size=2, synthetic="device")


def test_a_failing_rank_reports_its_traceback(cpu, profile, quick, monkeypatch):
    monkeypatch.setenv(rank_faults.FAULT, "raise")
    with pytest.raises(RuntimeError, match="(?s)x-ddp_gloo: a DDP rank failed.*a fault planted in this process"):
        measure_ddp(DDP_ON_SYNTHETIC_BATCHES, rank_faults.MLP, cpu, profile, quick, "x-ddp_gloo", "ddp_gloo")


# The relaunch tests run their ranks without the work passes (work=False: no profiler): gloo ranks stopping the
# profiler crash below Python (rarely, at random: distributed.NATIVE_CRASH_RELAUNCHES), and such a crash of their own
# would be one more than the one planted, or the one these tests say never happened.


def test_a_rank_that_crashes_below_python_once_is_relaunched_and_the_crash_is_noted(cpu, profile, quick, tmp_path,
                                                                                     monkeypatch):
    # The relaunched ranks finish, then leave without the native teardown that would abort them: a second crash
    # would be a second note, or (the one relaunch spent) the case's failure.
    monkeypatch.setenv(rank_faults.FAULT, f"abort_once:{tmp_path / 'crashed'}")
    result, _ = measure_ddp(DDP_ON_SYNTHETIC_BATCHES, rank_faults.MLP, cpu, profile,
                            dataclasses.replace(quick, work=False), "x-ddp_gloo", "ddp_gloo")
    assert result.ranks["world_size"] == 2 and result.rounds == quick.rounds  # measured whole by the relaunch
    [note] = [n for n in result.notes if n.startswith(RELAUNCH_NOTE)]
    assert "Fatal Python error: Aborted" in note and "local rank" in note


def test_a_job_that_crashes_below_python_twice_fails_with_both_crashes(cpu, profile, quick, monkeypatch):
    # The one relaunch spent, a second crash fails the case. Both launch paths take that rule (``_launch``); the
    # one-process job (no torchrun) shows it at a third of a DDP job's start-up. The crash-once test above has
    # torchrun's ranks crash, relaunch and recover.
    from trainbench.core.method.distributed import measure_in_fresh_process

    monkeypatch.setenv(rank_faults.FAULT, "abort")
    with pytest.raises(ProcessFailed) as failed:
        measure_in_fresh_process(TrainConfig(synthetic="device"), rank_faults.MLP, cpu, profile, quick, "x-fresh",
                                 "baseline")
    message = str(failed.value)
    assert "x-fresh: the fresh process failed" in message
    assert "Fatal Python error: Aborted" in message  # the second crash, from the process's own stream
    assert "run again after an earlier crash: the process: Fatal Python error: Aborted" in message  # and the first


def test_a_native_crash_is_summarized_with_where_each_thread_was(tmp_path):
    from trainbench.core.method.distributed import _native_crash

    stderr = tmp_path / "logs" / "run" / "attempt_0" / "1" / "stderr.log"
    stderr.parent.mkdir(parents=True)
    stderr.write_text("USDT: profiler_stop\nterminate called without an active exception\n"
                      "Fatal Python error: Aborted\n\n"
                      "Current thread 0x00007f00 (most recent call first):\n  <no Python frame>\n\n"
                      "Thread 0x00007f01 (most recent call first):\n"
                      '  File "/x/site-packages/trainbench/measure.py", line 418 in count_calls\n'
                      '  File "/x/site-packages/trainbench/measure.py", line 300 in run\n\n'
                      "Extension modules: numpy.core._multiarray_umath (total: 1)\n")
    assert _native_crash(tmp_path) == ("local rank 1: terminate called without an active exception; "
                                       "Fatal Python error: Aborted; crashing thread at <no Python frame>; "
                                       "another thread at measure.py:418 in count_calls")
    stderr.write_text("Traceback (most recent call last):\nValueError: a Python error is no native crash\n")
    assert _native_crash(tmp_path) is None


def test_a_spec_the_ranks_cannot_import_is_a_clear_error(cpu, profile, mlp, quick):
    local = dataclasses.replace(mlp, name="made_in_a_function")
    with pytest.raises(SpecError, match="bind it to a module-level name"):
        measure_ddp(TrainConfig(parallel="ddp", world_size=2), local, cpu, profile, quick, "x-ddp_gloo", "ddp_gloo")


class _HangsOnRank1(torch.utils.data.Dataset):
    """Rank 1's data never arrives (a stuck read on one node); rank 0 trains on and waits in the all-reduce."""

    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        import time

        import torch.distributed as dist

        if dist.is_initialized() and dist.get_rank() == 1:
            time.sleep(3600)
        return self.items[i]


HANGS_ON_RANK_1 = dataclasses.replace(resolve_spec("mlp", PROFILES["cpu"]), name="hangs_on_rank_1",
                                      dataset=lambda: _HangsOnRank1(resolve_spec("mlp", PROFILES["cpu"]).dataset()))


def test_a_rank_that_stops_making_progress_fails_the_case_within_the_limit(cpu, profile, quick):
    import time

    started = time.monotonic()
    with pytest.raises(ProcessFailed, match=r"(?s)x-ddp_gloo: a DDP rank failed.*no progress for 3 s in"):
        measure_ddp(TrainConfig(parallel="ddp", world_size=2), HANGS_ON_RANK_1, cpu, profile,
                    dataclasses.replace(quick, no_progress_s=3), "x-ddp_gloo", "ddp_gloo")
    assert time.monotonic() - started < 180  # the limit and interpreter start-up, never the hour rank 1 sleeps


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Two "nodes" normally finish in about 10 s here, 40 s beside a CPU hog.
NODES_DEADLINE_S = 180


def _run_nodes(command: list[str], logs: Path) -> tuple[list[int | None], str]:
    """Both nodes of a torchrun job at once: their exit statuses (None: still running at the deadline, then
    ended with their process groups) and their output. Waiting on both together matters: when one node's rank
    dies, the other node's agent waits up to 300 s in torchrun's exit barrier."""
    import os
    import signal
    import subprocess
    import time

    streams = [open(logs / f"node{n}.log", "wb") for n in range(2)]
    try:
        nodes = [subprocess.Popen(command, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=stream,
                                  stderr=subprocess.STDOUT, start_new_session=True) for stream in streams]
        deadline = time.monotonic() + NODES_DEADLINE_S
        while time.monotonic() < deadline and any(node.poll() is None for node in nodes):
            if any(node.poll() not in (None, 0) for node in nodes):
                time.sleep(5)  # the other node's rank fails in its next collective; give it a moment to say so
                break
            time.sleep(0.2)
        codes = [node.poll() for node in nodes]
        for node in nodes:  # never leave a node, its ranks or its rendezvous store behind
            try:
                os.killpg(node.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            node.wait()
    finally:
        for stream in streams:
            stream.close()
    output = "\n".join(f"--- node {n} (exit status {code}):\n" + (logs / f"node{n}.log").read_text(errors="replace")
                       for n, code in enumerate(codes))
    return codes, output


def test_two_nodes_of_one_rank_each_meet_through_c10d_rendezvous_on_localhost(capsys, tmp_path):
    """What docs/scale-out.md tells a multi-node user to do, with 2 "nodes" of 1 rank on this machine."""
    import json
    import shlex
    import shutil

    from trainbench.__main__ import main
    from trainbench.core.records.result import Result

    attempts = []
    # As the suite does for its own jobs, a rendezvous whose rank crashed below Python (faulthandler's "Fatal Python
    # error") is run once more; so is one that hung: gloo ranks stopping the profiler have (rarely, at random)
    # corrupted the heap, which aborts or wedges a rank. A Python error fails at once, and so do two bad runs.
    for attempt in range(2):
        endpoint = f"127.0.0.1:{_free_port()}"
        assert main(["torchrun-job", "mlp-ddp_gloo", "--nnodes=2", "--nproc-per-node=1", f"--rdzv-endpoint={endpoint}",
                     "--device=cpu", "--rounds=2", "--steps-per-round=2", "--min-warmup=1"]) == 0
        printed = capsys.readouterr().out.splitlines()
        out = Path(printed[0].split()[1])
        [command] = [shlex.split(line) for line in printed if "torch.distributed.run" in line]
        logs = tmp_path / f"attempt{attempt}"
        logs.mkdir()
        try:
            codes, output = _run_nodes(command, logs)
            if codes == [0, 0]:
                result = Result(**json.loads((out / "result.json").read_text()))
                break
        finally:
            shutil.rmtree(out, ignore_errors=True)
        attempts.append(output)
        native = None in codes or "Fatal Python error" in output
        assert native and attempt == 0, "\n\n".join(attempts)
    assert f"--rdzv-endpoint={endpoint}" in command and "--nnodes=2" in command
    assert result.ranks["world_size"] == 2 and len(result.ranks["per_rank"]) == 2
    assert result.ranks["max_grad_difference_between_ranks"] == 0.0
    assert result.samples_per_s == pytest.approx(32 / result.step_time_s) and len(result.round_step_times_s) == 2


def test_a_torchrun_job_of_a_one_process_case_is_refused(capsys):
    from trainbench.__main__ import main

    assert main(["torchrun-job", "mlp-amp_bf16", "--device=cpu"]) == 2
    assert "trains in one process; torchrun runs DDP and FSDP cases" in capsys.readouterr().err


def _batchnorm_mlp():
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 64, bias=False),
                               torch.nn.BatchNorm1d(64), torch.nn.ReLU(), torch.nn.Linear(64, 10))


# BatchNorm after a bias-free layer (as in ResNet): imported by name in the rank processes.
BATCHNORM_MLP = dataclasses.replace(resolve_spec("mlp", PROFILES["cpu"]), name="batchnorm_mlp", model=_batchnorm_mlp)


@pytest.fixture(scope="module")
def _ddp_then_fsdp_measured():
    return {}


@pytest.fixture
def ddp_then_fsdp(cpu, profile, quick, _ddp_then_fsdp_measured):
    """batchnorm_mlp-ddp_gloo (a ratio budget: its one-process baseline is measured too), then batchnorm_mlp-fsdp_gloo
    in the same Runner, against that DDP measurement as a session's later case has it: one DDP job for the module's
    DDP, BatchNorm and FSDP tests, not one a test. Each rank makes its slice of the global batch on the device (how the
    GPU profile judges DDP); "ddp_grads" are the first-step gradients its rank 0 recorded for the guard."""
    from trainbench.core.records.budgets import Budgets
    from trainbench.core.method.runner import Runner

    measured = _ddp_then_fsdp_measured
    if not measured:
        runner, on_device = Runner(cpu, profile, quick), {"synthetic": "device"}
        budgets = Budgets.from_text('[cpu."batchnorm_mlp-ddp_gloo"]\nmin_speedup = 0.001\n')
        ddp = runner.run("ddp_gloo", BATCHNORM_MLP, budgets=budgets, overrides=on_device)
        ddp_grads = runner.executor.measurement.ddp_grads  # the FSDP case records its own in their place
        measured.update(runner=runner, ddp=ddp, ddp_grads=ddp_grads,
                        fsdp=runner.run("fsdp_gloo", BATCHNORM_MLP, overrides=on_device))
    return measured


def test_ranks_run_under_torchrun_and_report_their_rounds_memory_and_scaling(ddp_then_fsdp, quick):
    outcome = ddp_then_fsdp["ddp"]
    assert outcome.failures == () and [c.bound.key for c in outcome.bound_checks] == ["min_speedup"]
    result = outcome.result
    assert result.world_size == 2 and result.batch_size == 16
    assert result.samples_per_s == pytest.approx(32 / result.step_time_s)  # both ranks' samples per median step
    assert result.warmup_steps == quick.min_warmup_steps and any("fixed warm-up" in n for n in result.notes)
    assert result.syncs_per_step == 0 and result.flops_per_step > 0
    # The guard: the all-reduced gradients of the two ranks' slices are those of one process that splits the global
    # batch as they do (the BatchNorm test below compares them itself).
    assert [v.kind for v in outcome.guard_checks] == ["gradients"] and outcome.guard_checks[0].ok
    ranks = outcome.record()["ranks"]
    assert ranks["launcher"] == "torchrun (torch.distributed.run)" and ranks["dist_backend"] == "gloo"
    assert [len(r["round_step_times_s"]) for r in ranks["per_rank"]] == [quick.rounds] * 2
    # The case's round is its slowest rank's round.
    assert outcome.result.round_step_times_s == [max(t) for t in zip(*(r["round_step_times_s"] for r in ranks["per_rank"]))]
    assert ranks["per_rank"][0]["memory_breakdown_bytes"] == ranks["per_rank"][1]["memory_breakdown_bytes"]
    assert ranks["ideal_speedup"] == 1.0 and ranks["speedup_vs"] == "one_process"
    # one_process trains the global batch: not the one-rank reference the scaling efficiency divides by
    assert "scaling_efficiency" not in ranks


def test_batchnorm_ranks_on_synthetic_batches_match_one_process_that_splits_the_batch_as_they_do(ddp_then_fsdp, cpu,
                                                                                                  profile, quick):
    """Each rank makes its slice of the global batch on the device (how the GPU profile judges DDP), and its
    BatchNorm normalizes its own samples: the guard's one-process reference must split the batch as they do."""
    recipe = get_recipe("ddp_gloo")
    result, grads = ddp_then_fsdp["ddp"].result, ddp_then_fsdp["ddp_grads"]
    assert result.world_size == 2 and result.batch_size == 16
    assert result.samples_per_s == pytest.approx(32 / result.step_time_s)
    assert result.warmup_steps == quick.min_warmup_steps and "fixed warm-up" in result.notes[0]
    assert result.syncs_per_step == 0 and result.flops_per_step > 0
    one_process = get_recipe("one_process").config(profile, synthetic="device")
    per_rank = first_step_gradients(one_process.one_process_equivalent(2), BATCHNORM_MLP, cpu, micro_batches_are_shards=True)
    verdict = compare_gradients(grads, per_rank, recipe.grad_rtol)
    assert verdict.ok, verdict.message
    # The fault the reference avoids: one pass over the global batch normalizes over both ranks' samples.
    whole_batch = first_step_gradients(one_process, BATCHNORM_MLP, cpu)
    assert not compare_gradients(grads, whole_batch, recipe.grad_rtol).ok


def test_fsdp2_ranks_hold_half_the_parameters_gradients_and_optimizer_state_of_ddp(ddp_then_fsdp, cpu):
    from dataclasses import replace

    from trainbench.core.records.budgets import Budgets

    outcome = ddp_then_fsdp["fsdp"]
    assert outcome.failures == () and outcome.baseline_recipe.name == "ddp_gloo"
    # the session's DDP measurement (its very rounds), not a second DDP job
    assert outcome.baseline.round_step_times_s == ddp_then_fsdp["ddp"].result.round_step_times_s
    assert [v.kind for v in outcome.guard_checks] == ["gradients"] and outcome.guard_checks[0].ok
    fsdp, ddp = outcome.result.memory_breakdown_bytes, outcome.baseline.memory_breakdown_bytes
    for part in ("params", "grads", "optimizer_state"):
        assert fsdp[part] * 2 == ddp[part]  # the MLP's tensors split evenly over 2 ranks
    # Ratio budgets on them, judged as the Runner judges a case's budget (a ratio budget of its own would have the
    # Runner measure DDP again, right after the case: the fresh baseline a timed ratio needs).
    budgets = Budgets.from_text('[cpu."batchnorm_mlp-fsdp_gloo"]\nmax_param_mib_ratio = 0.55\nmax_grad_mib_ratio = 0.55\n'
                                'max_optimizer_state_mib_ratio = 0.55\n')
    judged = ddp_then_fsdp["runner"].judge.check_budget(replace(outcome, budget=budgets.for_case(cpu.caps(), outcome.case)))
    assert judged.failures == () and len(judged.bound_checks) == 3 and all(c.ok for c in judged.bound_checks)
    assert outcome.result.flops_per_step == outcome.baseline.flops_per_step
    ranks = outcome.record()["ranks"]
    assert ranks["speedup_vs"] == "ddp_gloo" and "scaling_efficiency" not in ranks  # its baseline is DDP, not one process


# A spec whose data never arrives, for scripts run in their own processes (they import it by name).
STUCK_SPEC = '''
import dataclasses, signal, time
import pytest
import torch
from trainbench.core.setups.workloads import PROFILES, resolve_spec

class Stuck(torch.utils.data.Dataset):
    def __init__(self, items):
        self.items = items
    def __len__(self):
        return len(self.items)
    def __getitem__(self, i):
        time.sleep(3600)

MLP = resolve_spec("mlp", PROFILES["cpu"])
STUCK = dataclasses.replace(MLP, name="stuck", dataset=lambda: Stuck(MLP.dataset()))
'''

def _children() -> dict[int, list[int]]:
    """Live processes by parent pid."""
    from pathlib import Path

    found: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":  # a zombie has ended; it only waits for its parent
            found.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    return found


def _torchrun_under(parent: int, seconds: float = 180) -> tuple[int, list[int], Path]:
    """torchrun started by ``parent``, its 2 ranks and the job folder it runs, once the ranks are up."""
    import time

    deadline, launcher, ranks = time.monotonic() + seconds, None, []
    while time.monotonic() < deadline and len(ranks) < 2:
        children = _children()
        launcher = next(iter(children.get(parent, [])), None)
        ranks = children.get(launcher, []) if launcher else []
        time.sleep(0.2)
    assert len(ranks) == 2, f"torchrun did not start 2 ranks within {seconds:g} s"
    return launcher, ranks, Path(Path(f"/proc/{launcher}/cmdline").read_bytes().split(b"\0")[-2].decode())


def _alive(pid: int) -> bool:
    from pathlib import Path

    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


SESSION_WITH_A_STUCK_DDP_CASE = STUCK_SPEC + '''

def test_a_finished(train_bench):
    train_bench("baseline", "mlp")

def test_b_stuck_ddp(train_bench):
    train_bench("ddp_gloo", STUCK)
'''


def test_an_interrupted_session_ends_the_ddp_ranks_and_keeps_the_finished_case(pytester, quick_options):
    """SIGTERM, as a CI runner cancelling a job sends: the DDP case's torchrun and every rank end within seconds, its
    job folder goes, the finished case is kept. The plugin turns SIGTERM into the KeyboardInterrupt that Ctrl-C
    raises; from there the two take one path, so this one signal (the plugin's handler and that path) covers both."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    pytester.makepyfile(test_session=SESSION_WITH_A_STUCK_DDP_CASE)
    session = subprocess.Popen([sys.executable, "-m", "pytest", "--benchmark-save=run", *quick_options],
                               cwd=pytester.path, env={**os.environ, "PYTHONPATH": str(pytester.path)},
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        launcher, ranks, job_dir = _torchrun_under(session.pid)
        started = time.monotonic()
        session.send_signal(signal.SIGTERM)
        output = session.communicate(timeout=120)[0].decode(errors="replace")
        assert time.monotonic() - started < 60, output
    finally:
        session.kill()
    assert session.returncode == pytest.ExitCode.INTERRUPTED, output
    assert "trainbench summary" in output and "mlp-baseline" in output
    assert not [pid for pid in [launcher, *ranks] if _alive(pid)], "torchrun or a rank outlived the session"
    assert not job_dir.exists()
    [saved] = list(pytester.path.rglob("0001_run.json"))
    kept = json.loads(saved.read_text())
    assert kept["trainbench_incomplete"] is True and [b["name"] for b in kept["benchmarks"]] == ["test_a_finished"]


def test_gpu_ranks_share_the_cores_their_one_process_baseline_has(monkeypatch):
    # Not torchrun's one thread a rank against DataParallel's every core: the same cores, split between the ranks.
    from trainbench.core.method.distributed import _child_env
    from trainbench.devices.device import CpuBackend, CudaBackend

    monkeypatch.setattr(torch, "get_num_threads", lambda: 16)
    gpu = object.__new__(CudaBackend)  # no CUDA needed: the answer depends on the host's threads only
    assert CudaBackend.rank_threads(gpu, 2) == CpuBackend.rank_threads(gpu, 2) == 8
    assert CudaBackend.rank_threads(gpu, 32) == 1
    assert _child_env({"env": {}, "threads": CudaBackend.rank_threads(gpu, 2)})["OMP_NUM_THREADS"] == "8"


def test_the_parent_releases_its_cache_before_the_ranks_start_and_notes_what_it_keeps_on_their_device(
        profile, quick, monkeypatch):
    # A GPU run's parent holds a CUDA context on rank 0's device: its cache goes before they start, its context is noted.
    import json
    import subprocess

    from trainbench.core.method import distributed
    from trainbench.core.records.result import Result
    from trainbench.devices.device import CpuBackend

    events = []

    class Parent(CpuBackend):
        def release_memory(self):
            events.append("released")

        def kept_while_others_run(self):
            return "the parent process keeps its CUDA context on cpu"

    class Started:  # the new process, done at once: it wrote its result into the job's folder (the last argument)
        def __init__(self, command, **kwargs):
            events.append("started")
            out = Path(command[-1])
            result = Result("mlp-x", "mlp", "x", "cpu", 16, {}, {"kind": "cpu"})
            (out / "result.json").write_text(json.dumps(dataclasses.asdict(result)))

        def wait(self, timeout=None):
            return 0

    monkeypatch.setattr(subprocess, "Popen", Started)
    spec, backend = resolve_spec("mlp", profile), Parent(torch.device("cpu"))
    result, _ = distributed.measure_in_fresh_process(TrainConfig(), spec, backend, profile, quick, "mlp-x", "x")
    assert events == ["released", "started"]
    assert "the parent process keeps its CUDA context on cpu" in result.notes
    job = distributed._job(TrainConfig(), spec, backend, profile, quick, "mlp-x", "x", 0)
    assert distributed._shared_device({**job, "rank_devices": ["cuda:1"]}, backend) == []  # not the parent's device


def test_ranks_that_fail_alike_show_their_traceback_once(tmp_path):
    from trainbench.core.method.distributed import _errors

    spec_error = "Traceback (most recent call last):\n  ...\nSpecError: training spec 'bad': loss_fn returned ...\n"
    for rank in (0, 1):
        (tmp_path / f"rank{rank}.err").write_text(spec_error)
    assert _errors(tmp_path) == f"rank0 and rank1, the same traceback:\n{spec_error}"
    (tmp_path / "rank2.err").write_text("RuntimeError: another\n")
    assert _errors(tmp_path).count("SpecError") == 1 and _errors(tmp_path).endswith("RuntimeError: another\n")


def test_a_finished_child_runs_its_exit_handlers_and_skips_the_interpreters_teardown():
    # How ranks, fresh processes and A/B sides end (trainbench.core.harness.child_exit): what the exit handlers print is
    # kept, an object torn down with the interpreter never sees its finalizer run, the exit status is the one given.
    import subprocess
    import sys

    script = ("import atexit\n"
              "from trainbench.core.harness.child_exit import exit_without_teardown\n"
              "class Teardown:\n"
              "    def __del__(self):\n"
              "        print('torn down', flush=True)\n"
              "kept = Teardown()\n"
              "atexit.register(lambda: print('exit handler'))\n"
              "print('buffered', end='')\n"
              "exit_without_teardown(3)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 3 and done.stdout == "bufferedexit handler\n", done.stderr
