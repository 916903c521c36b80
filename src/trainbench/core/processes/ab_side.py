"""The measuring half of an A/B side (``trainbench.core.processes.ab_worker``): the device, the case's training and
its measurement, answering the commands the worker reads. It imports torch; the worker imports it only once its
standard output is the protocol's alone, and inside a command, so a side whose torch cannot load answers why."""

from __future__ import annotations

import sys

import torch

import trainbench
from trainbench.core.method.distributed import load_spec
from trainbench.core.method.measure import Measurer, MeasureSettings
from trainbench.core.setups.guards import loss_trajectory
from trainbench.core.setups.recipes import TrainConfig
from trainbench.core.setups.training import InjectedFault, TrainingSetup
from trainbench.core.setups.workloads import PROFILES
from trainbench.devices.device import get_backend
from trainbench.devices.environment import installed_packages
from trainbench.devices.host import env_value


class Worker:
    """The commands a side answers (``ab_worker`` reads them and writes the answers)."""

    def __init__(self, protocol: int):
        self.protocol = protocol  # the worker's (ab_worker.PROTOCOL), answered to hello
        self.backend = self.training = self.measurement = self.config = self.spec = None
        self.no_progress_s: float | None = None  # the case's progress limit: a command making none fails

    def hello(self) -> dict:
        self.backend = get_backend(env_value("TRAINBENCH_AB_DEVICE"))
        # the side's installed packages: the verdict names those that differ between the sides
        return {"protocol": self.protocol, "trainbench": trainbench.__version__, "python": sys.executable,
                "identity": self.backend.identity(), "packages": installed_packages()}

    def build(self, config: dict, recipe: str, extra_warmup_steps: int, spec: str, profile: str, settings: dict,
              case: str, threads: int | None = None, paths: list[str] | None = None, slowdown: float = 0.0) -> dict:
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
        return {"losses": loss_trajectory(self.config, self.spec, self.backend)}
