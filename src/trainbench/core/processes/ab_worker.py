"""``python -m trainbench.core.processes.ab_worker``: one side of an A/B run (``trainbench.jobs.ab``), in that side's Python.

It reads one JSON command per line on stdin and answers one JSON line on stdout; everything
else the process prints (torch's warnings, a user's print) goes to stderr, so the protocol
stays clean. Commands: ``hello``, ``build`` (the case, then its warm-up), ``round`` (one timed
round), ``profile`` (a profiled step, after the rounds: where the step's time goes), ``finish`` (the
memory and work passes: the Result), ``losses`` (the loss guard's trajectory), ``close``. An error
answers ``{"error": traceback}`` and the worker goes on. While a command makes progress, ``{"progress": true}``
lines come before its answer (the runner waits only as long as a side is silent).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import traceback
from contextlib import contextmanager

import trainbench
from trainbench.core.harness.child_exit import exit_without_teardown
from trainbench.core.harness.watchdog import watch
from trainbench.devices.environment import installed_packages
from trainbench.devices.host import env_value

PROTOCOL = 5  # 2: round takes rewarm_steps; 3: round answers cpu_time_s, snapshot; 4: profile; 5: progress lines


class _Worker:
    def __init__(self):
        self.backend = self.training = self.measurement = self.config = self.spec = None
        self.no_progress_s: float | None = None  # the case's progress limit: a command making none fails

    def hello(self) -> dict:
        from trainbench.devices.device import get_backend

        self.backend = get_backend(env_value("TRAINBENCH_AB_DEVICE"))
        # the side's installed packages: the verdict names those that differ between the sides
        return {"protocol": PROTOCOL, "trainbench": trainbench.__version__, "python": sys.executable,
                "identity": self.backend.identity(), "packages": installed_packages()}

    def build(self, config: dict, recipe: str, extra_warmup_steps: int, spec: str, profile: str, settings: dict,
              case: str, threads: int | None = None, paths: list[str] | None = None, slowdown: float = 0.0) -> dict:
        import torch

        from trainbench.core.method.distributed import load_spec
        from trainbench.core.method.measure import Measurer, MeasureSettings
        from trainbench.core.setups.recipes import TrainConfig
        from trainbench.core.setups.training import InjectedFault, TrainingSetup
        from trainbench.core.setups.workloads import PROFILES

        if threads:
            torch.set_num_threads(threads)
        self.no_progress_s = settings.get("no_progress_s")
        sys.path[:0] = [p for p in paths or () if p not in sys.path]  # a spec in the project's test modules
        self.spec = load_spec(spec, PROFILES[profile])
        self.config = TrainConfig.of(**config)
        fault = InjectedFault(slowdown=slowdown) if slowdown else None  # a planted regression, for tests
        self.training = TrainingSetup(self.config, self.spec, self.backend, fault)
        self.measurement = Measurer(self.training, case, recipe, MeasureSettings(**settings), extra_warmup_steps,
                                    profile)
        self.measurement.warm_up()
        return {"warmup_steps": self.measurement.result.warmup_steps}

    def round(self, rewarm_steps: int = 0) -> dict:
        self.measurement.time_one_round(rewarm_steps)
        result = self.measurement.result
        return {"step_time_s": result.round_step_times_s[-1],
                "cpu_time_s": result.round_cpu_times_s[-1] if result.round_cpu_times_s else None}

    def profile(self, rewarm_steps: int = 0, steps: int = 1) -> dict:
        """``steps`` profiled steps after ``rewarm_steps`` untimed ones (as before a round): each op's (and kernel's)
        self time per step (``attribution.profile_steps``), or None where a profiler of the case's own is running.
        Asked for after the timed rounds, never between them: the profiler slows the step it watches."""
        for _ in range(rewarm_steps):
            self.measurement.timed_step()
        return {"profile": self.measurement.profile(steps)}

    def snapshot(self) -> dict:
        """The result so far (timing only: the memory and work passes run at ``finish``)."""
        return {"result": self.measurement.result.to_dict()}

    def finish(self) -> dict:
        self.measurement.measure_after_timing()
        result = self.measurement.finish()
        self.training.close()
        self.training = self.measurement = None
        return {"result": result.to_dict()}

    def losses(self) -> dict:
        from trainbench.core.setups.guards import loss_trajectory

        return {"losses": loss_trajectory(self.config, self.spec, self.backend)}


@contextmanager
def _progress_lines(protocol, watchdog):
    """While a command runs, a ``{"progress": true}`` line every quarter of the limit in which the case made progress:
    the runner waits for an answer only as long as the side is silent (``ab_transport.SILENCE_FACTOR``)."""
    if watchdog is None:
        yield
        return
    stop = threading.Event()

    def tell():
        seen = watchdog.last_beat
        while not stop.wait(watchdog.limit_s / 4):
            if watchdog.suspended or watchdog.last_beat != seen:  # waiting on child processes is no silence
                seen = watchdog.last_beat
                protocol.write(json.dumps({"progress": True}) + "\n")

    thread = threading.Thread(target=tell, daemon=True, name="trainbench-ab-progress")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()  # before the answer is written: one line at a time


def main() -> None:
    protocol = os.fdopen(os.dup(1), "w", buffering=1)  # our answers only
    os.dup2(2, 1)  # anything else printed goes to stderr
    worker = _Worker()
    for line in sys.stdin:
        request = json.loads(line)
        command = request.pop("command")
        if command == "close":
            break
        try:
            limit = request.get("settings", {}).get("no_progress_s") if command == "build" else worker.no_progress_s
            with watch(limit) as watchdog, _progress_lines(protocol, watchdog):  # a hung dataset or lock fails the
                answer = getattr(worker, command)(**request)                     # command, not the A/B session
        except Exception:  # noqa: BLE001 - any failure of the side is reported to the runner, which names the side
            answer = {"error": traceback.format_exc()}
        protocol.write(json.dumps(answer) + "\n")
    if worker.training is not None:  # closed before its finish: its loader's workers end with it
        worker.training.close()
    protocol.close()
    exit_without_teardown(0)


if __name__ == "__main__":
    main()
