"""What a trainbench session adds to the run pytest-benchmark saves (the failed cases, its device and the doctor's
checks, the installed packages, its marks), and how it is saved: whole, under a number of its own, the run so far
after every case on request, and a save that failed said rather than raised."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from trainbench.core.harness.files import write_json_atomic
from trainbench.devices.environment import installed_packages
from trainbench.plugin import benchmark_adapter
from trainbench.plugin.options import Options
from trainbench.plugin.recorded import RecordedCases
from trainbench.plugin.signals import Stopping
from trainbench.plugin.startup import check_save_name, check_writable
from trainbench.verdicts.store import (
    ENVIRONMENT_KEY, FAILED_CASES_KEY, INCOMPLETE_KEY, PLANTED_KEY, QUICK_KEY, storage_folder)


@dataclass
class RunSaving:
    options: Options
    saved: Path | None = None  # the run --benchmark-save wrote (or tried to: ``problem`` says why not)
    problem: str | None = None
    progress_written: int = 0  # cases recorded when --trainbench-save-progress last wrote the run
    packages: dict | None = None  # this process's installed packages, read once (``installed_packages``)

    def prepare(self, config, stopping: Stopping) -> None:
        """A trainbench session's run is saved atomically into a storage that takes it (a plain pytest-benchmark
        session is left as it is)."""
        storage = self.options.benchmark.storage
        if self.options.benchmark.saving and storage:
            check_writable([("--benchmark-storage", storage_folder(storage))])
            check_save_name(self.options.benchmark.save, storage)
            benchmark_adapter.save_atomically(config, self._report, stopping.saving_run)

    def _report(self, path: Path | None, problem: str | None) -> None:
        self.saved, self.problem = path, problem

    def write_progress(self, config, recorded: int) -> None:
        """--trainbench-save-progress: once a case has ended, the run so far is on disk, marked incomplete, so that
        no kill of the session loses a finished case; a write that fails is said and the session goes on."""
        path = self.options.progress_json
        if path is None or recorded <= self.progress_written:
            return
        self.progress_written = recorded
        try:
            benchmark_adapter.write_progress(config, path, {INCOMPLETE_KEY: True})
        except OSError as e:
            reporter = config.pluginmanager.get_plugin("terminalreporter")
            if reporter is not None:
                reporter.write_line(f"trainbench: --trainbench-save-progress {path}: not written ({e})", red=True)

    def installed_packages(self) -> dict[str, str]:
        """This process's installed packages (``environment.installed_packages``), read once: the saved run records
        them and the gate compares them with the baseline's."""
        if self.packages is None:
            self.packages = installed_packages()
        return self.packages

    def update_json(self, output_json: dict, recorded: RecordedCases, interrupted: bool) -> None:
        """Cases that failed before they had a result are in the saved run too, with why (they have no timing); a
        trainbench run records its installed packages once, for a later comparison to name the ones that differ."""
        if recorded.cases or recorded.failed_cases:
            output_json[ENVIRONMENT_KEY] = {"packages": self.installed_packages()}
        if recorded.failed_cases:
            output_json[FAILED_CASES_KEY] = list(recorded.failed_cases)
        if interrupted:
            output_json[INCOMPLETE_KEY] = True  # kept, but a bare --benchmark-compare never takes it as the baseline
        if self.options.quick:  # kept, never a baseline or a calibration: not every figure was measured
            output_json[QUICK_KEY] = True
        fault = self.options.fault
        if fault is not None and (fault.slowdown or fault.leak_mib):  # kept, never a baseline
            output_json[PLANTED_KEY] = {name: value for name, value in
                                        (("slowdown", fault.slowdown), ("leak_mib", fault.leak_mib)) if value}

    @staticmethod
    def machine_info(doctor: dict | None, identity: dict) -> dict:
        """The device a trainbench run was measured on, and the doctor's checks with the load at their end."""
        if doctor and "load_average" in doctor:
            doctor["load_average"]["end"] = list(os.getloadavg())
        return {**identity, "doctor": doctor}

    def keep_at_end(self, config, recorded: RecordedCases, interrupted: bool) -> None:
        """A run whose every case failed is saved too (pytest-benchmark saves none without a benchmark); the complete
        attribution tables go to --trainbench-attribution-json."""
        if recorded.failed_cases and not recorded.cases:
            benchmark_adapter.save_failed_cases(config)
        if self.options.attribution_json is not None and recorded.attributions:
            write_json_atomic(self.options.attribution_json, {"cases": recorded.attributions,
                                                              "complete": not interrupted})

    def stopped_status(self, stopping: Stopping) -> pytest.ExitCode | None:
        """The status an unsaved run (failed) or a SIGTERM after the last case (interrupted) gives the session."""
        if self.problem is not None:
            return pytest.ExitCode.TESTS_FAILED
        return pytest.ExitCode.INTERRUPTED if stopping.late_sigterms else None
