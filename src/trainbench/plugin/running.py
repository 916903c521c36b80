"""What a trainbench session needs its device for: the backend and the runner, the doctor's checks, why a marked
case cannot run here, a simulated GPU's plans and the memory predictions made ahead.

This module imports torch and the core. The session loads it once, at the first thing that needs the device
(``TrainbenchSession.machine``): a session that runs no trainbench case never imports it.
"""

from __future__ import annotations

import os
from pathlib import Path

from trainbench.core.analyses.predict import PredictionCache, not_applicable
from trainbench.core.analyses.roofline import CountCache
from trainbench.core.method.measure import DEFAULT_SETTINGS, with_overrides
from trainbench.core.method.runner import Runner
from trainbench.core.setups.cases import Case, known_case_ids
from trainbench.core.setups.eligibility import Context, why_not
from trainbench.core.setups.recipes import Recipe, Requirements
from trainbench.core.setups.workloads import PROFILES
from trainbench.devices import device  # by module: its functions are looked up at each call
from trainbench.devices.host import cores_at_once
from trainbench.devices.simulated import SimulatedGpu, prediction_backend
from trainbench.jobs.doctor import doctor_record, format_checks, run_checks
from trainbench.jobs.night_plan import planned, simulated_checks, would_run
from trainbench.plugin.options import Options, usage_error


class Machine:
    """The session's device, its runner, and what is asked of them; each made once, when first asked for."""

    def __init__(self, options: Options):
        self.options = options
        self.pinned_gpu: str | None = None  # the one GPU this worker sees (CUDA_VISIBLE_DEVICES), one worker per GPU
        self._pin_tried = False
        self._backend = None
        self._runner = None
        self._simulated_counts = None  # --trainbench-simulate-gpu: the roofline's step counts, once per setup

    def pin_gpu(self) -> None:
        """One GPU per pytest-xdist worker (``device.pin_to_one_gpu``), once, before anything of this session asks
        CUDA anything: CUDA reads ``CUDA_VISIBLE_DEVICES`` only at its start, so a query first (the doctor's)
        would leave every worker on GPU 0."""
        if self._pin_tried:
            return
        self._pin_tried = True
        o = self.options
        if o.xdist_workers > 1 and o.device_spec in ("auto", "cuda") and o.simulate_gpu is None:
            self.pinned_gpu = device.pin_to_one_gpu(o.xdist_index, o.xdist_workers)

    @property
    def backend(self):
        if self._backend is None and self.options.simulate_gpu is not None:
            self._backend = SimulatedGpu(self.options.simulate_gpu)
        if self._backend is None:
            self.pin_gpu()
            self._backend = device.get_backend(self.options.device_spec)
        return self._backend

    def device_here(self) -> tuple:
        return device.comparable_device(self.backend.identity())

    @property
    def runner(self) -> Runner:
        if self._runner is None:
            o = self.options
            name = self.backend.profile_name if o.profile_name == "auto" else o.profile_name
            settings = with_overrides(DEFAULT_SETTINGS[name], **o.settings_overrides)
            # kept across sessions in pytest's cache, keyed by the spec's and trainbench's code and torch's version
            kept = Path(o.pytest_cache.mkdir("trainbench")) / "predictions.json" if o.pytest_cache else None
            # no tensor can be made on a simulated GPU: its memory gate predicts on the CPU
            predicting = prediction_backend() if o.simulate_gpu is not None else self.backend
            self._runner = Runner(self.backend, PROFILES[name], settings, o.fault, o.require_budgets,
                                  predict=o.predict_memory, strict_timing=o.strict_timing, trace=o.trace,
                                  remeasure_s=o.remeasure_s, predictions=PredictionCache(predicting, kept),
                                  pair_baselines=o.pair_baselines, quick=o.quick)
        return self._runner

    def doctor(self) -> dict:
        """``python -m trainbench doctor``'s checks, run once before the first trainbench case, as the saved run's
        machine info records them: a blocker (CUDA expected and missing, a GPU the build has no kernels for, too
        little /dev/shm...) stops the session."""
        o = self.options
        if o.simulate_gpu is not None:  # the checks the night would make there: this machine runs nothing
            checks = simulated_checks(o.simulate_gpu)
        else:
            checks = run_checks(o.device_spec, expect_cuda=o.expect_cuda)
        record = doctor_record(checks)
        if hasattr(os, "getloadavg"):  # a busy machine is the first suspect when numbers move; the end is added at save
            record["load_average"] = {"start": list(os.getloadavg())}
        blockers = [line for check, line in zip(checks, format_checks(checks)) if check.status == "FAIL"]
        if blockers and not o.ignore_doctor:
            raise usage_error("the runner is not ready (python -m trainbench doctor shows every check; "
                              "TRAINBENCH_IGNORE_DOCTOR=1 runs anyway):\n" + "\n".join(blockers))
        return record

    def known_case_ids(self, items) -> set[str]:
        """Every case id a budgets entry may name: the built-in cases' and the collected items'."""
        return known_case_ids() | {item.callspec.id for item in items if hasattr(item, "callspec")}

    def marker_skip_reason(self, item) -> str | None:
        """Why the trainbench markers on ``item`` rule it out on this device (``eligibility.why_not``)."""
        slow = item.get_closest_marker("trainbench_slow")
        gpu = item.get_closest_marker("trainbench_gpu")
        gpus = item.get_closest_marker("trainbench_min_gpus")
        capability = item.get_closest_marker("trainbench_min_capability")
        try:
            caps = self.backend.caps()
        except RuntimeError as e:
            return str(e)
        requires = Requirements(cuda=gpu is not None, min_gpus=gpus.args[0] if gpus else 0,
                                min_capability=tuple(capability.args) if capability else None)
        what = (gpu.kwargs.get("what") if gpu else None) or ""  # trainbench_gpu(what="pinned_memory (...)"): -rs tells apart
        marked = Recipe(what, "the item's trainbench markers", requires=requires, slow=slow is not None)  # no knobs
        return why_not(marked, caps, PROFILES[caps.profile_name], context=Context(slow_allowed=self.options.run_slow))

    def simulated_outcome(self, plan, case_id: str) -> tuple[str, str]:
        """Under --trainbench-simulate-gpu, what a case planned for that GPU (a ``CasePlan``, or why it cannot run)
        does there: ("fail", why the night would crash on it or refuse it wrongly) or ("skip", why it cannot run
        there, or what it would do there: ``night_plan.would_run``)."""
        gpu = self.options.simulate_gpu
        if self._simulated_counts is None:
            self._simulated_counts = CountCache(prediction_backend())
        c = planned(self.runner, plan, case_id, self._simulated_counts)
        if c.problem:
            return "fail", c.problem
        if c.skipped:
            return "skip", c.skipped
        # What the real build would find about the spec's model (the CPU run skips such a case as not applicable)
        reason = not_applicable(plan.config, plan.spec, prediction_backend())
        if reason:
            return "skip", f"{plan.recipe.name}: {reason}"
        return "skip", (f"{c.case}: would run on simulated {gpu.name}: {would_run(c, gpu)}; nothing is measured on a "
                        "simulated GPU")

    def predict_ahead(self, items, uses_trainbench):
        """The memory predictions the collected suite cases will ask for, made before the first on every core
        (``Runner.predict_ahead``; None where no such case was collected): nothing is timed yet."""
        cases = [item.callspec.params["case"] for item in items
                 if uses_trainbench(item) and hasattr(item, "callspec") and item.get_closest_marker("skip") is None
                 and isinstance(item.callspec.params.get("case"), Case)]
        return self.runner.predict_ahead(cases, cores_at_once()) if cases else None

    def parallel_timing_reason(self) -> str | None:
        """Why this session cannot time cases, or None: pytest-xdist workers that share one device measure each
        other (one worker per GPU, each pinned to its own, is fine)."""
        if self.options.xdist_workers < 2 or self.pinned_gpu is not None:
            return None
        return (f"{self.options.xdist_workers} pytest-xdist workers share {self.backend.name} ({self.backend.kind}), "
                "and cases timed side by side measure each other")
