"""One pytest session's trainbench hooks, registered as a pytest plugin by ``trainbench.plugin`` at configure. Each
hook hands its work to the piece that does it: the start-up checks (``startup``), the baseline run (``baseline``),
the device and its runner (``running``, loaded when first needed), the cases kept (``recorded``), the saved run
(``saving``), how the session stops (``signals``), the verdict (``gate``) and the terminal summary (``summary``).

Everything here acts on trainbench cases only: a session that runs none imports no torch and stores its
pytest-benchmark runs exactly as without trainbench.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from trainbench.core.processes.ab_transport import SideError
from trainbench.plugin import baseline, benchmark_adapter
from trainbench.plugin.baseline import BaselineChoice
from trainbench.plugin.gate import Gate
from trainbench.plugin.options import Options, discover_budgets, shown, usage_error
from trainbench.plugin.recorded import RecordedCases
from trainbench.plugin.saving import RunSaving
from trainbench.plugin.signals import Stopping
from trainbench.plugin.startup import BudgetFiles, check_output_files, check_writable
from trainbench.plugin.summary import write_last_lines, write_terminal_summary
from trainbench.verdicts.store import PYTEST_BENCHMARKS_CHOICE, Baseline, SavedRun

if TYPE_CHECKING:  # the A/B session's type, for the annotation: its module loads with --trainbench-ab alone
    from trainbench.jobs.ab import ABSession

if TYPE_CHECKING:
    from trainbench.plugin.running import Machine

FIXTURE = "train_bench"
BUDGETS_PATH = pytest.StashKey["Path | None"]()  # the budgets file of each collected trainbench case
MARKERS = ("trainbench_slow", "trainbench_gpu", "trainbench_min_gpus", "trainbench_min_capability")


def _uses_trainbench(item) -> bool:
    return FIXTURE in getattr(item, "fixturenames", ())


@dataclass
class TrainbenchSession:
    options: Options
    recorded: RecordedCases = field(default_factory=RecordedCases)  # every finished case, in order (``record``)
    budgets: BudgetFiles = field(default_factory=BudgetFiles)  # ``budgets(path)``: a budgets file, loaded once
    choice: BaselineChoice = BaselineChoice()  # the run to compare with, chosen at start-up
    refused: str | None = None  # why the run pytest-benchmark loaded itself cannot be a baseline
    ab: ABSession | None = None  # from --trainbench-ab
    collected: int = 0  # trainbench cases collected
    doctor: dict | None = None  # trainbench.jobs.doctor.doctor_record of the checks run before the first case
    predicted_ahead: object = None  # trainbench.core.method.predict_ahead.PredictedAhead: made before the cases
    started_s: float = field(default_factory=time.monotonic)  # the session's start (its wall time for --trainbench-costs)
    stopping: Stopping = field(default_factory=Stopping)
    gate: Gate = field(init=False)
    saving: RunSaving = field(init=False)
    _machine: Machine | None = None

    def __post_init__(self):
        self.gate, self.saving = Gate(self.options), RunSaving(self.options)

    @property
    def machine(self) -> Machine:
        """The device and its runner, made when first asked for."""
        if self._machine is None:
            from trainbench.plugin.running import Machine  # torch and the core: only once the device is needed

            self._machine = Machine(self.options)
        return self._machine

    def device_here(self) -> tuple:
        return self.machine.device_here()

    # -- set-up ---------------------------------------------------------------------------------------
    def start(self, config) -> None:
        """Checks that need more than the options: the device named, the one budgets file, the baseline."""
        self.check_device()
        if self.options.budgets_override is not None:
            self.budgets(self.options.budgets_override)  # a malformed file stops the session here
        ab = self.options.ab
        if ab is not None:
            # A/B's runner and verdicts: loaded with --trainbench-ab alone (~0.1 s of every other session's start)
            from trainbench.jobs.ab import ABSession

            self.ab = ABSession(ab.base_python, ab.head_python, ab.pairs, self.options.device_spec,
                                self.options.remeasure_s, ab.base_root)
        self.choice = baseline.choose(self.options, config, self.device_here)
        check_output_files([("--trainbench-compare-json", self.options.compare_json),
                            ("--trainbench-attribution-json", self.options.attribution_json),
                            ("--trainbench-save-progress", self.options.progress_json)])
        check_writable([("--trainbench-profile-trace", self.options.trace.folder if self.options.trace else None)])

    def check_device(self) -> None:
        """An explicit device that is not there, or no device (``cuda:x``), or a GPU this torch has no kernels for, is a
        set-up error naming --trainbench-device; "auto" is left to the first case (no torch for a session without)."""
        spec = self.options.device_spec
        if spec in ("", "auto") and self.options.simulate_gpu is None:
            return
        try:
            self.machine.backend  # noqa: B018
        except (RuntimeError, ValueError) as e:
            raise usage_error(f"--trainbench-device={shown(spec)}: {e}" if spec not in ("", "auto") else str(e)) from None

    def budgets_of(self, item):
        return self.budgets(item.stash.get(BUDGETS_PATH, self.options.budgets_override))

    # -- collection -----------------------------------------------------------------------------------
    def pytest_collection_modifyitems(self, config, items):
        self.collected = sum(map(_uses_trainbench, items))
        if self.collected:
            self._prepare(config)
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
            self.budgets.check_case_ids(paths, self.machine.known_case_ids(items))
        if self.collected:
            self._start_ab()  # last: the other checks take no seconds

    def _prepare(self, config) -> None:
        """Before the first trainbench case: the baseline usable, the GPU pinned (before the doctor's CUDA queries),
        the doctor's checks, SIGTERM handled, the run's storage and output files writable."""
        unusable = self.choice.unusable or self.refused
        if unusable:
            raise usage_error(unusable)
        self.machine.pin_gpu()
        self.doctor = self.machine.doctor()
        self.stopping.stop_cleanly_on_sigterm()
        self.saving.prepare(config, self.stopping)
        check_output_files([("--benchmark-json", self.options.benchmark.json)])

    def _start_ab(self) -> None:
        """Both A/B sides started and their handshake checked before the first case: a side whose Python cannot
        import trainbench, or speaks another protocol, stops the session in one line (it failed every case alike)."""
        if self.ab is None:
            return
        try:
            self.ab.start(self.machine.runner.settings.no_progress_s)
        except SideError as e:
            raise usage_error(f"--trainbench-ab: the A/B sides could not start: {e}") from None

    def _marker_skip_reason(self, item) -> str | None:
        if not any(item.get_closest_marker(name) for name in MARKERS):
            return None  # an item without trainbench markers never asks the device
        return self.machine.marker_skip_reason(item)

    # -- the cases ------------------------------------------------------------------------------------
    def pytest_runtest_makereport(self, item, call):
        """A trainbench case that failed before its rounds reached pytest-benchmark (an error in the user's spec or
        step, in the test before it called train_bench) has its failure, not also pytest-benchmark's "fixture was
        not used at all" warning; a user's own benchmark test keeps that warning."""
        if call.when in ("setup", "call") and call.excinfo is not None and _uses_trainbench(item) \
                and not call.excinfo.errisinstance(pytest.skip.Exception):
            benchmark = getattr(item, "funcargs", {}).get("benchmark")
            if benchmark is not None:
                benchmark_adapter.mark_untimed(benchmark, "failed before measuring")

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item, nextitem):
        result = yield
        self.saving.write_progress(item.config, len(self.recorded.recorded))  # once the case's fixtures closed
        return result

    def pytest_keyboard_interrupt(self, excinfo):
        self.stopping.interrupted = True

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
            self.stopping.finishing = True

    def _predict_ahead(self, items) -> None:
        """The memory predictions the collected suite cases will ask for, made before the first on every core. Not
        under A/B, a simulated GPU or pytest-xdist (its workers share the cores already), nor where predictions are
        off."""
        o = self.options
        if o.predict_memory and o.simulate_gpu is None and self.ab is None and o.xdist_workers == 1:
            self.predicted_ahead = self.machine.predict_ahead(items, _uses_trainbench)

    # -- pytest-benchmark's storage and compare -------------------------------------------------------
    def pytest_benchmark_update_json(self, config, benchmarks, output_json):
        self.saving.update_json(output_json, self.recorded, self.stopping.interrupted)

    def pytest_benchmark_update_machine_info(self, config, machine_info):
        """A session that ran trainbench cases records its device (plain pytest-benchmark runs stay as they are)."""
        if self.recorded.cases or self.recorded.failed_cases:
            machine_info["trainbench"] = self.saving.machine_info(self.doctor, self.machine.backend.identity())

    @pytest.hookimpl(tryfirst=True)
    def pytest_benchmark_compare_machine_info(self, config, benchmarksession, machine_info, compared_benchmark):
        """Refuse to compare trainbench runs of different devices or setups. First, so that pytest-benchmark's own
        check compares like with like: this session's device identity is in ``machine_info`` exactly when the
        compared run has one."""
        benchmark_adapter.locate_anywhere(benchmarksession)  # its own check names the storage: one outside the cwd
        chosen = self.choice.baseline
        compared = SavedRun(chosen.path if chosen else "the run --benchmark-compare loaded", compared_benchmark)
        refused = baseline.refusal(self.options, compared)
        self.refused = self.refused or refused
        mine = None if refused else baseline.device_record(self.options, compared,
                                                            lambda: self.machine.backend.identity(), self.device_here)
        if mine is None:
            machine_info.pop("trainbench", None)
        else:
            machine_info["trainbench"] = mine

    def pytest_sessionstart(self, session):
        baseline.check_loaded(self.options, session.config, ab=self.ab is not None)

    # -- the verdict and the summary ------------------------------------------------------------------
    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session, exitstatus):
        """Compare every case with the baseline run (or the A/B sides); fail on a gated regression, and fail a gate
        that compared nothing. A run that could not be saved fails the session (after the summary)."""
        self.saving.keep_at_end(session.config, self.recorded, self.stopping.interrupted)
        verdict = self.gate.verdict(session.config, self.recorded.cases, self.collected, self.ab,
                                    lambda: self.machine.backend.identity(), self.saving.installed_packages)
        self.gate.conclude(session, verdict, self.saving.stopped_status(self.stopping), ab=self.ab is not None)

    def pytest_terminal_summary(self, terminalreporter, exitstatus, config):
        write_terminal_summary(terminalreporter, self)

    def write_last_line(self, config) -> None:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            write_last_lines(reporter, self)

    def baseline_used(self) -> Baseline | None:
        """The run the comparison used and why (for the summary): trainbench's choice, or pytest-benchmark's."""
        chosen, comparison = self.choice.baseline, self.gate.comparison
        if chosen is not None or comparison is None or self.ab is not None:
            return chosen
        return Baseline(Path(comparison.baseline), PYTEST_BENCHMARKS_CHOICE)

    def close(self) -> None:
        """At pytest's unconfigure: what the session started ends with it."""
        if self.ab is not None:
            self.ab.close(force=self.stopping.interrupted)  # both environments' workers end with the session
        self.stopping.restore()
