"""The measuring half of an A/B side (``trainbench.core.processes.ab_worker``): the device, the case's training and
its measurement, answering the commands the worker reads. The worker imports it only once its standard output is the
protocol's alone, and it loads torch inside a command, so a side whose torch cannot load answers why: torch and the
device for ``hello``, the method (torch._dynamo among it: half a side's start-up) at the first ``build``, so that a
side's identity does not wait for what only a case needs."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import trainbench


@contextmanager
def _loading() -> Iterator[None]:
    """Modules that live as long as the side (torch, the method: ~300k objects) load with the collector paused and are
    frozen after (``gc.freeze``): collections while they load walk them again and again (a sixth of a side's start-up),
    and every later one, inside the timed rounds too, would walk them all. Only where something loaded: what a case
    leaves behind is collected as ever, never frozen."""
    modules = len(sys.modules)
    gc.disable()
    try:
        yield
    finally:
        if len(sys.modules) > modules:
            gc.freeze()
        gc.enable()


class Worker:
    """The commands a side answers (``ab_worker`` reads them and writes the answers)."""

    def __init__(self, protocol: int):
        self.protocol = protocol  # the worker's (ab_worker.PROTOCOL), answered to hello
        self.backend = self.training = self.measurement = self.config = self.spec = None
        self.no_progress_s: float | None = None  # the case's progress limit: a command making none fails

    def hello(self) -> dict:
        with _loading():
            # torch and the device, what hello answers with; the method loads with the first case (build)
            from trainbench.devices import device, environment, host
        self.backend = device.get_backend(host.env_value("TRAINBENCH_AB_DEVICE"))
        # the side's installed packages: the verdict names those that differ between the sides
        return {"protocol": self.protocol, "trainbench": trainbench.__version__, "python": sys.executable,
                "identity": self.backend.identity(), "packages": environment.installed_packages()}

    def build(self, config: dict, recipe: str, extra_warmup_steps: int, spec: str, profile: str, settings: dict,
              case: str, threads: int | None = None, paths: list[str] | None = None, slowdown: float = 0.0) -> dict:
        with _loading():
            # the method, at the first case: hello answers without it
            import torch

            from trainbench.core.method import distributed, measure
            from trainbench.core.setups import recipes, training, workloads
        self.close_case()
        if threads:
            torch.set_num_threads(threads)
        self.no_progress_s = settings.get("no_progress_s")
        sys.path[:0] = [p for p in paths or () if p not in sys.path]  # a spec in the project's test modules
        self.spec = distributed.load_spec(spec, workloads.PROFILES[profile])
        self.config = recipes.TrainConfig.of(**config)
        fault = training.InjectedFault(slowdown=slowdown) if slowdown else None  # a planted regression, for tests
        self.training = training.TrainingSetup(self.config, self.spec, self.backend, fault)
        self.measurement = measure.Measurer(self.training, case, recipe, measure.MeasureSettings(**settings),
                                            extra_warmup_steps, profile)
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
        self.close_case()
        return {"result": result.to_dict()}

    def close_case(self) -> None:
        """Close the side's case, if one is open: the next ``build`` (or the worker's end) closes one whose build,
        rounds or passes failed before ``finish``, which would otherwise keep its global flags (anomaly mode, cuDNN
        autotuning ...), its loader's workers and its device memory through the next case."""
        if self.training is not None:
            self.training.close()
        self.training = self.measurement = None

    def losses(self) -> dict:
        from trainbench.core.setups.guards import loss_trajectory  # loaded with the method, by build

        return {"losses": loss_trajectory(self.config, self.spec, self.backend)}
