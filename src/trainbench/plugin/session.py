"""One pytest session's trainbench state and hooks: device, runner, budgets, the baseline, signals, the
A/B sides and the gate's verdict. Registered as a pytest plugin by ``trainbench.plugin`` at configure.

Everything here acts on trainbench cases only: a session that runs none imports no torch and stores its
pytest-benchmark runs exactly as without trainbench.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from trainbench.core.harness.files import cannot_write, write_json_atomic
from trainbench.plugin import benchmark_adapter
from trainbench.plugin.options import Options, discover_budgets, shown, usage_error
from trainbench.plugin.summary import write_ab, write_nothing_compared, write_summary
from trainbench.verdicts.store import (
    ENVIRONMENT_KEY,
    FAILED_CASES_KEY,
    INCOMPLETE_KEY,
    PLANTED_KEY,
    PYTEST_BENCHMARKS_CHOICE,
    QUICK_KEY,
    Baseline,
    NoBaselineError,
    SavedRun,
    UnusableBaselineError,
    choose_baseline,
    describe_device,
    storage_folder,
    unusable_as_baseline,
    why_no_baseline,
)

# Modules that import torch (device, runner, budgets, doctor, ...) are imported where they are first needed: a
# pytest session that runs no trainbench case never pays for importing torch.

# Settings recorded with a run's device identity that change what is measured as much as the device does.
SETUP_KEYS = ("cpu_threads", "float32_matmul_precision", "cuda_matmul_allow_tf32", "cudnn_allow_tf32")
FIXTURE = "train_bench"
BUDGETS_PATH = pytest.StashKey["Path | None"]()  # the budgets file of each collected trainbench case


def _uses_trainbench(item) -> bool:
    return FIXTURE in getattr(item, "fixturenames", ())


@dataclass(frozen=True)
class RecordedCase:
    """What a session keeps of one finished case: its record as the summary and the gate read it (None: it ended
    without a result, ``error`` says why), and what the summary lists beside the table."""

    case: str
    fullname: str  # pytest-benchmark's key of the case in a saved run
    measured: object = None  # trainbench.core.records.result.MeasuredCase
    error: str | None = None
    trace: dict | None = None  # what its trace request gave
    attribution: dict | None = None  # its complete attribution tables (--trainbench-attribution-json)
    inconclusive: tuple[str, ...] = ()  # timed budgets the rounds could not judge


@dataclass
class TrainbenchSession:
    options: Options
    recorded: list[RecordedCase] = field(default_factory=list)  # every finished case, in order (``record``)
    budget_files: dict = field(default_factory=dict)  # path (or None) -> trainbench.core.records.budgets.Budgets
    comparison: object = None  # trainbench.verdicts.gate.Verdict, filled at session end when compared (or A/B ran)
    exit_status: int | None = None  # the session's, once the verdict has set it
    baseline: Baseline | None = None  # the run chosen to compare with, and why (None: pytest-benchmark's choice)
    unusable_baseline: str | None = None  # why the run to compare with cannot be used: stops a trainbench session
    collected: int = 0  # trainbench cases collected
    interrupted: bool = False  # Ctrl-C or SIGTERM: the saved run is marked incomplete
    doctor: dict | None = None  # trainbench.jobs.doctor.doctor_record of the checks run before the first case
    pinned_gpu: str | None = None  # the one GPU this worker sees (CUDA_VISIBLE_DEVICES), one worker per GPU
    ab: object = None  # trainbench.jobs.ab.ABSession from --trainbench-ab
    previous_sigterm: object = None  # the SIGTERM handler to restore at the end
    saved: Path | None = None  # the run --benchmark-save wrote (or tried to: ``save_problem`` says why not)
    save_problem: str | None = None
    late_sigterms: int = 0  # SIGTERMs after the last case: the first waits for the save and the summary
    started_s: float = field(default_factory=time.monotonic)  # the session's start (its wall time for --trainbench-costs)
    _finishing: bool = False  # the last case has ended: nothing is left to measure
    _backend: object = None
    _runner: object = None
    _pin_tried: bool = False
    _packages: dict | None = None  # this process's installed packages, read once (installed_packages)
    _progress_written: int = 0  # cases recorded when --trainbench-save-progress last wrote the run
    _simulated_counts: object = None  # --trainbench-simulate-gpu: the roofline's step counts (roofline.CountCache)
    predicted_ahead: object = None  # trainbench.core.method.predict_ahead.PredictedAhead: the predictions made before the cases

    # -- the cases ------------------------------------------------------------------------------------
    def record(self, outcome, fullname: str, budgets) -> dict | None:
        """Keep a finished case (a ``CaseOutcome``, not skipped) for the summary, the gate and the saved run; its
        record (what the saved run keeps of it), or None where it ended without a result."""
        if outcome.error is not None:
            self.recorded.append(RecordedCase(outcome.case, fullname, error=outcome.error))
            return None
        from trainbench.core.records.result import CaseRecord, MeasuredCase

        record = outcome.record()
        measured = MeasuredCase(CaseRecord.read(record, outcome.case, fullname), fullname,
                                budgets.compare_thresholds(self.runner.caps, outcome.case))
        self.recorded.append(RecordedCase(outcome.case, fullname, measured, trace=outcome.trace,
                                          attribution=outcome.result.attribution or None,
                                          inconclusive=tuple(outcome.inconclusive)))
        return record

    def forecast(self, outcome, config) -> None:
        """After the first measured case of a long session, what the rest will cost at its pace
        (``costs.cost_forecast``)."""
        from trainbench.core.harness.costs import TOTAL, cost_forecast

        if len(self.recorded) != 1 or outcome.result is None:
            return
        line = cost_forecast(outcome.case, outcome.result.phase_seconds.get(TOTAL, 0.0), self.collected - 1)
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if line and reporter is not None:
            reporter.write_line("")
            reporter.write_line(line, yellow=True)

    @property
    def cases(self) -> list:
        """The ``MeasuredCase`` of each case that has a result, for the summary and the gate."""
        return [r.measured for r in self.recorded if r.measured is not None]

    @property
    def failed_cases(self) -> list[dict]:
        """The cases that ended without a result (out of memory, a hang), as the saved run lists them."""
        return [{"case": r.case, "fullname": r.fullname, "error": r.error} for r in self.recorded if r.error is not None]

    @property
    def traces(self) -> list[tuple[str, dict]]:
        return [(r.case, r.trace) for r in self.recorded if r.trace is not None]

    @property
    def attributions(self) -> dict:
        return {r.case: r.attribution for r in self.recorded if r.attribution is not None}

    @property
    def inconclusive(self) -> list[str]:
        return [line for r in self.recorded for line in r.inconclusive]

    # -- set-up ---------------------------------------------------------------------------------------
    def start(self, config) -> None:
        """Checks that need more than the options: the device named, the one budgets file, the baseline."""
        self._check_device()
        if self.options.budgets_override is not None:
            self.budgets(self.options.budgets_override)  # a malformed file stops the session here
        if self.options.ab is not None:
            from trainbench.jobs.ab import ABSession

            ab = self.options.ab
            self.ab = ABSession(ab.base_python, ab.head_python, ab.pairs, self.options.device_spec,
                                self.options.remeasure_s, ab.base_root)
        self._choose_baseline(config)
        self._check_output_files([("--trainbench-compare-json", self.options.compare_json),
                                  ("--trainbench-attribution-json", self.options.attribution_json),
                                  ("--trainbench-save-progress", self.options.progress_json)])
        self._check_writable([("--trainbench-profile-trace", self.options.trace.folder if self.options.trace else None)])

    def _check_device(self) -> None:
        """An explicit device that is not there, or no device (``cuda:x``), or a GPU this torch has no kernels for, is a
        set-up error naming --trainbench-device; "auto" is left to the first case (no torch for a session without)."""
        spec = self.options.device_spec
        if spec in ("", "auto") and self.options.simulate_gpu is None:
            return
        try:
            self.backend  # noqa: B018
        except (RuntimeError, ValueError) as e:
            raise usage_error(f"--trainbench-device={shown(spec)}: {e}" if spec not in ("", "auto") else str(e)) from None

    @staticmethod
    def _check_writable(outputs: list[tuple[str, Path | None]]) -> None:
        """Every folder the session will write into takes a file now: found after the whole run, an unwritable one
        lost what was measured."""
        for option, folder in outputs:
            problem = folder is not None and cannot_write(folder)
            if problem:
                raise usage_error(f"{option}: cannot write into {shown(folder)} ({problem}); expected a writable folder")

    @classmethod
    def _check_output_files(cls, outputs: list[tuple[str, Path | None]]) -> None:
        """Every file the session writes at its end can be written now: its folder takes a file (created if
        missing) and the path is not a folder."""
        for option, path in outputs:
            if path is None or hasattr(path, "write"):  # pytest-benchmark < 5.3 opens --benchmark-json itself
                continue
            path = Path(path)
            if path.is_dir():  # output_file_problem's first answer, with an example of the path wanted
                raise usage_error(f"{option}={shown(path)}: is a folder; expected a file path (e.g. "
                                  f"{shown(path / 'out.json')})")
            cls._check_writable([(option, path.parent)])

    def _check_save_name(self, storage: str) -> None:
        """--benchmark-save's file name (``NNNN_<name>.json``) fits the storage folder's file system: a name too long
        failed only at the save, after the whole run."""
        name = self.options.benchmark.save
        if not name:
            return
        folder = storage_folder(storage)
        if folder is None:  # not a file storage
            return
        try:
            longest = os.pathconf(folder, "PC_NAME_MAX")
        except (OSError, ValueError, AttributeError):
            longest = 255
        file_name = f"0000_{name}.json"
        if len(os.fsencode(file_name)) > longest:
            raise usage_error(f"--benchmark-save={name[:40]}...: the run's file name ({len(os.fsencode(file_name))} "
                              f"bytes) is longer than {folder} takes ({longest}); expected a shorter name")

    def _choose_baseline(self, config) -> None:
        """Runs before pytest-benchmark's own (trylast) configure, which loads the run to compare with. A run that
        cannot be used stops a gated session now, and any other at collection if it has trainbench cases (a plain
        pytest-benchmark session is left to pytest-benchmark's own warning)."""
        try:
            self.baseline = choose_baseline(self.options.benchmark.storage, self.options.benchmark.compare,
                                            self.device_here,
                                            gated=self.options.compare_fail is not None)
        except UnusableBaselineError as e:
            if self.options.compare_fail is not None:
                raise usage_error(f"--trainbench-compare-fail: no baseline run to compare with: {e}") from None
            self.unusable_baseline = f"--benchmark-compare: {e}"
            return
        except NoBaselineError as e:
            if self.options.compare_fail is not None:
                raise usage_error(f"--trainbench-compare-fail: {e}") from None
            return
        if self.baseline is not None:
            benchmark_adapter.compare_with(config, self.baseline.path)

    def pin_gpu(self) -> None:
        """One GPU per pytest-xdist worker (``device.pin_to_one_gpu``), once, before anything of this session asks
        CUDA anything: CUDA reads ``CUDA_VISIBLE_DEVICES`` only at its start, so a query first (the doctor's)
        would leave every worker on GPU 0."""
        if self._pin_tried:
            return
        self._pin_tried = True
        if self.options.xdist_workers > 1 and self.options.device_spec in ("auto", "cuda") \
                and self.options.simulate_gpu is None:
            from trainbench.devices.device import pin_to_one_gpu

            self.pinned_gpu = pin_to_one_gpu(self.options.xdist_index, self.options.xdist_workers)

    @property
    def backend(self):
        if self._backend is None and self.options.simulate_gpu is not None:
            from trainbench.devices.simulated import SimulatedGpu

            self._backend = SimulatedGpu(self.options.simulate_gpu)
        if self._backend is None:  # lazy: importing torch costs seconds in unrelated pytest runs
            from trainbench.devices.device import get_backend

            self.pin_gpu()
            self._backend = get_backend(self.options.device_spec)
        return self._backend

    def device_here(self) -> tuple:
        from trainbench.devices.device import comparable_device

        return comparable_device(self.backend.identity())

    @property
    def runner(self):
        if self._runner is None:
            from trainbench.core.method.measure import DEFAULT_SETTINGS, with_overrides
            from trainbench.core.method.runner import Runner
            from trainbench.core.setups.workloads import PROFILES

            o = self.options
            name = self.backend.profile_name if o.profile_name == "auto" else o.profile_name
            settings = with_overrides(DEFAULT_SETTINGS[name], **o.settings_overrides)
            from trainbench.core.analyses.predict import PredictionCache

            # kept across sessions in pytest's cache, keyed by the spec's and trainbench's code and torch's version
            kept = Path(o.pytest_cache.mkdir("trainbench")) / "predictions.json" if o.pytest_cache else None
            if o.simulate_gpu is not None:  # no tensor can be made on it: its memory gate predicts on the CPU
                from trainbench.devices.simulated import prediction_backend

                predictions = PredictionCache(prediction_backend(), kept)
            else:
                predictions = PredictionCache(self.backend, kept)
            self._runner = Runner(self.backend, PROFILES[name], settings, o.fault, o.require_budgets,
                                  predict=o.predict_memory, strict_timing=o.strict_timing, trace=o.trace,
                                  remeasure_s=o.remeasure_s, predictions=predictions, pair_baselines=o.pair_baselines,
                                  quick=o.quick)
        return self._runner

    def budgets(self, path: Path | None):
        """The budgets file at ``path`` (None: none configured), loaded once; a malformed one is a usage error."""
        if path not in self.budget_files:
            from trainbench.core.records.budgets import BudgetError, Budgets

            try:
                self.budget_files[path] = Budgets.load(path) if path is not None else Budgets.empty()
            except BudgetError as e:
                raise usage_error(str(e)) from None
        return self.budget_files[path]

    def inconclusive_comparisons(self, config, fullname: str, budgets):
        """Under a gate, why a case's timed comparisons with its baseline record cannot be judged yet
        (``compare.inconclusive_comparisons``, for the runner to measure it again), or None where nothing compares it."""
        baseline = benchmark_adapter.loaded_baseline(config)
        if not baseline or self.options.compare_fail is None:
            return None
        from trainbench.core.records.result import CaseRecord, RecordError
        from trainbench.verdicts.compare import case_thresholds, inconclusive_comparisons

        try:
            base = SavedRun.compared(*baseline).case(fullname)
        except RecordError:
            return None  # the gate names the broken record at the end
        if base is None:
            return None

        def unsure(outcome) -> list[str]:
            limits = case_thresholds(self.options.compare_fail, budgets.compare_thresholds(self.runner.caps, outcome.case))
            current = CaseRecord.read(outcome.record(), outcome.case)
            return inconclusive_comparisons(current, base, limits, self.options.compare_alpha)

        return unsure

    def simulated_outcome(self, plan, case_id: str) -> tuple[str, str]:
        """Under --trainbench-simulate-gpu, what a case planned for that GPU (a ``CasePlan``, or why it cannot run)
        does there: ("fail", why the night would crash on it or refuse it wrongly) or ("skip", why it cannot run
        there, or what it would do there: ``night_plan.would_run``)."""
        from trainbench.core.analyses.predict import not_applicable
        from trainbench.core.analyses.roofline import CountCache
        from trainbench.devices.simulated import prediction_backend
        from trainbench.jobs.night_plan import planned, would_run

        gpu = self.options.simulate_gpu
        if self._simulated_counts is None:  # the roofline's step counts, once per setup for the session
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

    def budgets_of(self, item):
        return self.budgets(item.stash.get(BUDGETS_PATH, self.options.budgets_override))

    def parallel_timing_reason(self) -> str | None:
        """Why this session cannot time cases, or None: pytest-xdist workers that share one device measure each
        other (one worker per GPU, each pinned to its own, is fine)."""
        if self.options.xdist_workers < 2 or self.pinned_gpu is not None:
            return None
        return (f"{self.options.xdist_workers} pytest-xdist workers share {self.backend.name} ({self.backend.kind}), "
                "and cases timed side by side measure each other")

    # -- collection -----------------------------------------------------------------------------------
    def pytest_collection_modifyitems(self, config, items):
        self.collected = sum(map(_uses_trainbench, items))
        if self.collected:
            if self.unusable_baseline:
                raise usage_error(self.unusable_baseline)
            self.pin_gpu()  # before the doctor's CUDA queries
            self._check_runner()
            self._stop_cleanly_on_sigterm()
            storage = self.options.benchmark.storage
            # trainbench's cases only: a plain pytest-benchmark session is left as it is
            if self.options.benchmark.saving and storage:
                self._check_writable([("--benchmark-storage", storage_folder(storage))])
                self._check_save_name(storage)
                benchmark_adapter.save_atomically(config, self._saved_run, self._saving_run)
            self._check_output_files([("--benchmark-json", self.options.benchmark.json)])
        paths = set()
        for item in items:
            reason = self._marker_skip_reason(item)
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))
            elif _uses_trainbench(item):
                path = self.options.budgets_override or discover_budgets(Path(item.path), Path(config.rootpath))
                self.budgets(path)  # loaded (and checked) at collection: a broken file stops the run before any case
                item.stash[BUDGETS_PATH] = path
                paths.add(path)
        if any(path is not None for path in paths):
            self._check_budget_case_ids(paths, items)
        if self.collected:
            self._start_ab()  # last: the other checks take no seconds

    def _check_budget_case_ids(self, paths: set, items) -> None:
        """A budgets entry one typo away from a case id fails the session at start-up, not silently at the end."""
        from trainbench.core.records.budgets import BudgetError
        from trainbench.core.setups.cases import known_case_ids

        known = known_case_ids() | {item.callspec.id for item in items if hasattr(item, "callspec")}
        for path in paths:
            try:
                self.budgets(path).check_case_ids(known)
            except BudgetError as e:
                raise usage_error(str(e)) from None

    def _check_runner(self) -> None:
        """``python -m trainbench doctor``'s checks, once, before the first trainbench case: a blocker (CUDA
        expected and missing, a GPU the build has no kernels for, too little /dev/shm...) stops the session;
        every check is recorded in the saved run's machine info."""
        from trainbench.jobs.doctor import doctor_record, format_checks, run_checks

        if self.options.simulate_gpu is not None:  # the checks the night would make there: this machine runs nothing
            from trainbench.jobs.night_plan import simulated_checks

            checks = simulated_checks(self.options.simulate_gpu)
        else:
            checks = run_checks(self.options.device_spec, expect_cuda=self.options.expect_cuda)
        self.doctor = doctor_record(checks)
        if hasattr(os, "getloadavg"):  # a busy machine is the first suspect when numbers move; the end is added at save
            self.doctor["load_average"] = {"start": list(os.getloadavg())}
        blockers = [line for check, line in zip(checks, format_checks(checks)) if check.status == "FAIL"]
        if blockers and not self.options.ignore_doctor:
            raise usage_error("the runner is not ready (python -m trainbench doctor shows every check; "
                              "TRAINBENCH_IGNORE_DOCTOR=1 runs anyway):\n" + "\n".join(blockers))

    def _start_ab(self) -> None:
        """Both A/B sides started and their handshake checked before the first case: a side whose Python cannot
        import trainbench, or speaks another protocol, stops the session in one line (it failed every case alike)."""
        if self.ab is None:
            return
        from trainbench.jobs.ab import SideError

        try:
            self.ab.start(self.runner.settings.no_progress_s)
        except SideError as e:
            raise usage_error(f"--trainbench-ab: the A/B sides could not start: {e}") from None

    def _marker_skip_reason(self, item) -> str | None:
        """Why the trainbench markers on ``item`` rule it out on this session's device (``eligibility.why_not``)."""
        slow = item.get_closest_marker("trainbench_slow")
        gpu = item.get_closest_marker("trainbench_gpu")
        gpus = item.get_closest_marker("trainbench_min_gpus")
        capability = item.get_closest_marker("trainbench_min_capability")
        if not (slow or gpu or gpus or capability):
            return None
        from trainbench.core.setups.eligibility import Context, why_not
        from trainbench.core.setups.recipes import Recipe, Requirements
        from trainbench.core.setups.workloads import PROFILES

        try:
            caps = self.backend.caps()
        except RuntimeError as e:
            return str(e)
        requires = Requirements(cuda=gpu is not None, min_gpus=gpus.args[0] if gpus else 0,
                                min_capability=tuple(capability.args) if capability else None)
        what = (gpu.kwargs.get("what") if gpu else None) or ""  # trainbench_gpu(what="pinned_memory (...)"): -rs tells apart
        marked = Recipe(what, "the item's trainbench markers", requires=requires, slow=slow is not None)  # no knobs
        return why_not(marked, caps, PROFILES[caps.profile_name], context=Context(slow_allowed=self.options.run_slow))

    def pytest_runtest_makereport(self, item, call):
        """A trainbench case that failed before its rounds reached pytest-benchmark (an error in the user's spec or
        step, in the test before it called train_bench) has its failure, not also pytest-benchmark's "fixture was
        not used at all" warning; a user's own benchmark test keeps that warning."""
        if call.when in ("setup", "call") and call.excinfo is not None and _uses_trainbench(item) \
                and not call.excinfo.errisinstance(pytest.skip.Exception):
            benchmark = getattr(item, "funcargs", {}).get("benchmark")
            if benchmark is not None:
                benchmark_adapter.mark_untimed(benchmark, "failed before measuring")

    # -- signals --------------------------------------------------------------------------------------
    def _stop_cleanly_on_sigterm(self) -> None:
        """SIGTERM (a CI job cancelled, a timeout) ends the session as Ctrl-C does: the case running stops, its
        setup closes (loader workers end), and the cases already measured are saved, marked incomplete.
        Without this, the default action kills the process with nothing written."""
        if threading.current_thread() is not threading.main_thread():
            return

        def interrupt(signum, frame):
            if self._finishing:  # everything is measured: the save and the summary finish first
                self.late_sigterms += 1
                if self.late_sigterms == 1:
                    return
            raise KeyboardInterrupt(f"signal {signum} (SIGTERM)")  # a second one stops even the save

        self.previous_sigterm = signal.signal(signal.SIGTERM, interrupt)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item, nextitem):
        """--trainbench-save-progress: once a case has ended (its fixtures closed), the run so far is on disk,
        marked incomplete, so that no kill of the session loses a finished case; a write that fails is said and
        the session goes on."""
        result = yield
        path = self.options.progress_json
        if path is not None and len(self.recorded) > self._progress_written:
            self._progress_written = len(self.recorded)
            try:
                benchmark_adapter.write_progress(item.config, path, {INCOMPLETE_KEY: True})
            except OSError as e:
                reporter = item.config.pluginmanager.get_plugin("terminalreporter")
                if reporter is not None:
                    reporter.write_line(f"trainbench: --trainbench-save-progress {path}: not written ({e})", red=True)
        return result

    def pytest_keyboard_interrupt(self, excinfo):
        self.interrupted = True

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session):
        """Once the last case has ended (or the session was interrupted), a SIGTERM waits: the run is written whole,
        the summary printed, and the session then ends as interrupted; a second one stops it at once (a save it
        stops leaves no file)."""
        if self.collected and not session.config.option.collectonly and not session.testsfailed:
            self._predict_ahead(session.items)
        try:
            return (yield)
        finally:
            self._finishing = True

    def _predict_ahead(self, items) -> None:
        """The memory predictions the collected suite cases will ask for, made before the first on every core
        (``Runner.predict_ahead``): nothing is timed yet. Not under A/B, a simulated GPU or pytest-xdist (its
        workers share the cores already), nor where predictions are off."""
        o = self.options
        if not o.predict_memory or o.simulate_gpu is not None or self.ab is not None or o.xdist_workers > 1:
            return
        from trainbench.core.setups.cases import Case
        from trainbench.devices.host import cores_at_once

        cases = [item.callspec.params["case"] for item in items
                 if _uses_trainbench(item) and hasattr(item, "callspec") and item.get_closest_marker("skip") is None
                 and isinstance(item.callspec.params.get("case"), Case)]
        if cases:
            self.predicted_ahead = self.runner.predict_ahead(cases, cores_at_once())

    @contextlib.contextmanager
    def _saving_run(self):
        self._finishing = True  # as after the last case, should a save begin without the loop's end
        yield

    def _saved_run(self, path: Path | None, problem: str | None) -> None:
        self.saved, self.save_problem = path, problem

    def write_last_line(self, config) -> None:
        """After pytest's "N passed in T s": the gate's decision and the exit status, then whether the run was saved,
        as the log's last lines."""
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            self._write_comparison_line(reporter)
            self._write_save_line(reporter)  # last: a run not saved is a failed run, whatever the gate said

    def _write_comparison_line(self, reporter) -> None:
        if self.comparison is None or self.exit_status is None:
            return
        from trainbench.verdicts.present import last_line

        line = last_line(self.comparison.to_json(), self.exit_status)
        reporter.write_line(line, red=self.comparison.failed, green=not self.comparison.failed, bold=True)

    def _write_save_line(self, reporter) -> None:
        """A run not saved, or saved under a SIGTERM, says so as the log's last line."""
        status = f" (exit {self.exit_status})" if self.exit_status is not None else ""
        if self.save_problem is not None:
            reporter.write_line(f"trainbench: FAILED: the run was not saved{status}", red=True, bold=True)
        elif self.late_sigterms:
            saved = f"; the run was saved whole in {self.saved}" if self.saved is not None else ""
            reporter.write_line(f"trainbench: stopped by SIGTERM after the last case{saved}{status}", red=True, bold=True)

    def close(self) -> None:
        """At pytest's unconfigure: what the session started ends with it."""
        if self.ab is not None:
            self.ab.close(force=self.interrupted)  # both environments' workers end with the session
        if self.previous_sigterm is not None:
            signal.signal(signal.SIGTERM, self.previous_sigterm)

    # -- pytest-benchmark's storage and compare -------------------------------------------------------
    def pytest_benchmark_update_json(self, config, benchmarks, output_json):
        """Cases that failed before they had a result are in the saved run too, with why (they have no timing); a
        trainbench run records its installed packages once, for a later comparison to name the ones that differ."""
        if self.cases or self.failed_cases:
            output_json[ENVIRONMENT_KEY] = {"packages": self.installed_packages()}
        if self.failed_cases:
            output_json[FAILED_CASES_KEY] = list(self.failed_cases)
        if self.interrupted:
            output_json[INCOMPLETE_KEY] = True  # kept, but a bare --benchmark-compare never takes it as the baseline
        if self.options.quick:  # kept, never a baseline or a calibration: not every figure was measured
            output_json[QUICK_KEY] = True
        fault = self.options.fault
        if fault is not None and (fault.slowdown or fault.leak_mib):  # kept, never a baseline
            output_json[PLANTED_KEY] = {name: value for name, value in
                                        (("slowdown", fault.slowdown), ("leak_mib", fault.leak_mib)) if value}

    def pytest_benchmark_update_machine_info(self, config, machine_info):
        """A session that ran trainbench cases records its device (plain pytest-benchmark runs stay as they are)."""
        if self.cases or self.failed_cases:
            if self.doctor and "load_average" in self.doctor:
                self.doctor["load_average"]["end"] = list(os.getloadavg())
            machine_info["trainbench"] = {**self.backend.identity(), "doctor": self.doctor}

    @pytest.hookimpl(tryfirst=True)
    def pytest_benchmark_compare_machine_info(self, config, benchmarksession, machine_info, compared_benchmark):
        """Refuse to compare trainbench runs of different devices or setups: their numbers say nothing about
        each other. First, so that pytest-benchmark's own check compares like with like: this session's
        device identity is in ``machine_info`` exactly when the compared run has one."""
        benchmark_adapter.locate_anywhere(benchmarksession)  # its own check names the storage: one outside the cwd
        compared = SavedRun(self.baseline.path if self.baseline else "the run --benchmark-compare loaded",
                            compared_benchmark)
        if self._refused(compared):
            machine_info.pop("trainbench", None)
            return
        theirs = compared.comparable
        if theirs is None:
            machine_info.pop("trainbench", None)
            return
        stored = compared.device
        # The doctor's record tells how this run's machine was set up (free /dev/shm, warnings), not which device
        # it is: the compared run's own record stands in, so pytest-benchmark compares device identities only.
        machine_info["trainbench"] = {**self.backend.identity(), "doctor": compared.doctor}
        mine = self.device_here()
        if self.options.allow_cross_device:
            return
        if mine != theirs:
            raise usage_error(
                f"--benchmark-compare would compare this {describe_device(mine)} with {describe_device(theirs)}; "
                "numbers from different devices are not comparable. Compare with a run of this device "
                "(a bare --benchmark-compare picks the latest one), or pass --trainbench-allow-cross-device.")
        differ = [f"{key} {stored[key]!r} there, {value!r} here" for key, value in machine_info["trainbench"].items()
                  if key in SETUP_KEYS and key in stored and stored[key] != value]
        if differ:
            raise usage_error(
                "--benchmark-compare would compare runs made with other settings (" + "; ".join(differ)
                + "): thread counts and float precision change every number (e.g. OMP_NUM_THREADS=1 halves CPU "
                "throughput). Rerun with the baseline's settings, or pass --trainbench-allow-cross-device.")

    def _refused(self, compared: SavedRun) -> bool:
        """A run pytest-benchmark loaded that can never be a baseline (``store.unusable_as_baseline``: its own choice
        is not checked before, e.g. a run whose device or interrupted mark only its records hold) stops a gated
        session now and any other with trainbench cases at collection, as ``_choose_baseline`` does."""
        problem = unusable_as_baseline(compared)
        if problem is None:
            return False
        if self.options.compare_fail is not None:
            raise usage_error(f"--trainbench-compare-fail: no baseline run to compare with: {problem}")
        self.unusable_baseline = self.unusable_baseline or f"--benchmark-compare: {problem}"
        return True

    def pytest_sessionstart(self, session):
        """A gated comparison with no baseline pytest-benchmark could load stops here, before any case runs:
        pytest-benchmark only warns ("Can't compare", "Failed to load") and the gate would pass unchecked."""
        config = session.config
        compare = benchmark_adapter.compare_requested(config)
        if self.options.compare_fail is None or not compare or self.ab is not None \
                or benchmark_adapter.loaded_baseline(config) is not None:
            return
        raise usage_error("--trainbench-compare-fail: no baseline run to compare with: "
                          + why_no_baseline(self.options.benchmark.storage, compare))

    # -- the verdict ----------------------------------------------------------------------------------
    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session, exitstatus):
        """Compare every case with the baseline run (or the A/B sides); fail on a gated regression, and fail a gate
        that compared nothing. A run that could not be saved fails the session (after the summary)."""
        if self.failed_cases and not self.cases:  # pytest-benchmark saves no run without a benchmark
            benchmark_adapter.save_failed_cases(session.config)
        if self.options.attribution_json is not None and self.attributions:
            write_json_atomic(self.options.attribution_json, {"cases": self.attributions, "complete": not self.interrupted})
        self.comparison = self._verdict(session.config)
        if self.comparison is not None:
            if self.options.compare_json is not None:
                write_json_atomic(self.options.compare_json, self.comparison.to_json())
            if self.comparison.failed and not session.exitstatus:  # a failed test's status stands
                session.exitstatus = self.comparison.exit_status
        if (self.save_problem is not None or self.late_sigterms) and not session.exitstatus:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED if self.save_problem else pytest.ExitCode.INTERRUPTED
        if self.comparison is not None or self.save_problem is not None or self.late_sigterms:
            self.exit_status = int(session.exitstatus)
        if self.comparison is not None and self.comparison.failed and self.options.xdist_workers == 1:
            self._report_failed_gate(session)  # an xdist worker's report is not its to add

    def _report_failed_gate(self, session) -> None:
        """A failed gate is a failure in pytest's own summary too ("FAILED trainbench gate - ...", "3 passed, 1
        failed" in red, a failed test case in --junitxml): pytest's closing line alone read green."""
        from trainbench.verdicts.present import last_line

        line = last_line(self.comparison.to_json(), self.exit_status)
        what = "A/B" if self.ab is not None else "gate"
        report = pytest.TestReport(f"trainbench {what}", ("trainbench", None, f"trainbench {what}"), {}, "failed",
                                   line, "call")
        session.config.hook.pytest_runtest_logreport(report=report)

    def _verdict(self, config):
        """The comparison's verdict (None: none asked for, or a plain pytest-benchmark session's)."""
        import dataclasses

        gated = self.options.compare_fail is not None
        if not (gated or self.collected):
            return None  # no trainbench case and no gate: pytest-benchmark's own comparison, as without trainbench
        if self.ab is not None:
            verdict = self.ab.verdict(gated=gated, allow_inconclusive=self.options.allow_inconclusive)
            measured = len(self.ab.outcomes)
        else:
            baseline = benchmark_adapter.loaded_baseline(config)
            if baseline is None:
                return None
            from trainbench.verdicts.compare import compare_with_baseline
            from trainbench.verdicts.store import packages_of

            o = self.options
            verdict = compare_with_baseline(self.cases, baseline[1], baseline[0], self.backend.identity(), o.compare_fail,
                           o.compare_alpha, allow_new_cases=o.allow_new_cases,
                           allow_inconclusive=o.allow_inconclusive,
                           packages=(packages_of(baseline[0]), self.installed_packages()))
            measured = len(self.cases)
        if verdict.comparisons or verdict.errors:
            return verdict
        why = ("no trainbench case ran (each was skipped or deselected)" if not measured else
               f"no metric of the {measured} case(s) measured could be compared"
               + (f" ({len(verdict.new_cases)} not in the baseline run)" if verdict.new_cases else ""))
        return dataclasses.replace(verdict, nothing_compared=why)

    def pytest_terminal_summary(self, terminalreporter, exitstatus, config):
        nothing = self.comparison is not None and self.comparison.nothing_compared
        if self.ab is not None and self.comparison is not None and not nothing:
            write_ab(terminalreporter, self)
        elif self.cases or self.failed_cases:
            write_summary(terminalreporter, self)
        if nothing:
            write_nothing_compared(terminalreporter, self.comparison)
        if self.save_problem is not None:  # after the numbers it would have kept
            terminalreporter.write_line(f"trainbench: --benchmark-save: the run was not saved in "
                                        f"{self.saved or 'its storage'}: {self.save_problem}; its numbers are only "
                                        "in this summary", red=True)

    def installed_packages(self) -> dict[str, str]:
        """This process's installed packages (``environment.installed_packages``), read once: the saved run records
        them and the gate compares them with the baseline's."""
        if self._packages is None:
            from trainbench.devices.environment import installed_packages

            self._packages = installed_packages()
        return self._packages

    def baseline_used(self) -> Baseline | None:
        """The run the comparison used and why (for the summary): trainbench's choice, or pytest-benchmark's."""
        if self.baseline is not None or self.comparison is None or self.ab is not None:
            return self.baseline
        return Baseline(Path(self.comparison.baseline), PYTEST_BENCHMARKS_CHOICE)
