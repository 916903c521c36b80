"""The GPU night: one command that spends a short GPU window measuring, within a time budget, writing as it goes,
and leaves one archive of what it measured in every ending.

``python -m trainbench night --budget-s SECONDS --out DIR [--archive FILE.tar.gz]`` runs, each step a child
process of the interpreter it was started with (nothing installed, no network): the doctor, the GPU self-checks
(``smoke/``, capped at ``SMOKE_CAP_S``, the checks of the method first), the suite's cases in one pytest session
in the order of what they tell (``CASE_GROUPS``, the ladders last) under the window's measuring profile
(``window_profile``), then the run it saved (or, where it was killed, the run it saved after its last finished
case), its device's calibrated budgets section (a diff), the ladder report, and ``summary.md``, which sets the run
beside the plan made before the night (``--plan``). ``--device cpu`` runs the same night on the CPU cases;
``--simulate-gpu`` rehearses it on any machine: the cases collect and skip as that GPU would, and nothing is
measured.

Every step has a deadline inside the budget: measuring steps end ``FINISH_RESERVE_S`` before it, so that the
run is always kept and summarized; a step that cannot start in time is recorded as not started, one that runs
past its deadline is stopped (SIGINT, then SIGTERM, then SIGKILL: a pytest session reports and saves what it
measured, marked incomplete), and the manifest ``night.json`` is rewritten after every step. Killed at any
point, what finished is on disk, and the archive is written on the way out.

This module runs the steps (``NightRun``, ``run_night``); the order, profile and deadlines are
``night_schedule``'s, the checks at start-up ``night_start``'s, what the sessions left ``night_results``'s, the
summary ``night_summary``'s and the packing ``night_archive``'s.
"""

from __future__ import annotations

import importlib.util
import shutil
import signal
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

from trainbench.core.analyses.predict import SharedPredictions
from trainbench.jobs.doctor import loader_worker_cases, read_checks
from trainbench.jobs.night_archive import ARCHIVE_LIMIT_BYTES, pack_folder
from trainbench.jobs.night_manifest import Night, StepRecord, read_manifest
from trainbench.jobs.night_processes import KILL_GRACE_S, TERM_GRACE_S, StepRunner, subprocess_runner
from trainbench.jobs.night_results import has_ladder_rungs, junit_cases, keep_run
from trainbench.jobs.night_schedule import (CASE_GROUPS, MIN_STEP_S, SMOKE_CAP_S, WindowProfile, finish_reserve,
                                            night_node_ids, smoke_node_ids, window_profile)
from trainbench.jobs.night_start import check_start, measured_before
from trainbench.jobs.night_summary import write_summary
from trainbench.verdicts.store import RunFileError

# pytest's exit status when its arguments selected nothing (the night's -k left a group empty): not a failure.
NO_TESTS_COLLECTED = 5


def doctor_deselections(doctor_json: Path) -> dict[str, str]:
    """Cases the doctor's blockers would kill, with why: with too little shared memory (its ``shm`` check FAILs),
    every case whose DataLoader workers would die of a bus error, ladder rungs included."""
    shm = [c for c in read_checks(doctor_json) if c.name == "shm" and c.status == "FAIL"]
    if not shm:
        return {}
    why = f"deselected: the doctor's shm check failed ({shm[0].message})"
    return {case: why for case in loader_worker_cases("gpu")}


class NightRun:
    """One night: its steps in order, each under its deadline, the manifest rewritten after each."""

    def __init__(self, night: Night, root: Path, runner: StepRunner, clock: Callable[[], float],
                 say: Callable[[str], None] = print, pytest_args: tuple[str, ...] = (),
                 seconds_from: Path | None = None):
        self.night, self.root, self.runner, self.clock, self.say = night, root, runner, clock, say
        self.pytest_args, self.seconds_from = pytest_args, seconds_from
        self.end = 0.0

    @property
    def out(self) -> Path:
        return self.night.out

    # -- steps -------------------------------------------------------------------------------------
    def run_step(self, name: str, why: str, argv: list[str], deadline: float) -> StepRecord:
        """One child step: not started without ``MIN_STEP_S`` before ``deadline``, stopped at it."""
        step = StepRecord(name, why, log=f"logs/{name}.log")
        self.night.steps.append(step)
        left = deadline - self.clock()
        if left < MIN_STEP_S:
            step.status, step.note = "not started", f"{max(left, 0):.0f} s left of the budget"
            self.night.save()
            self.say(f"night: {name}: not started ({step.note})")
            return step
        step.status = "running"
        self.night.save()
        self.say(f"night: {name}: {why} ({left:.0f} s left)")
        start = self.clock()
        try:
            outcome = self.runner(argv, self.out / step.log, deadline)
        except KeyboardInterrupt:  # the night was interrupted: the step ended with it, never left "running"
            step.seconds, step.status = round(self.clock() - start, 1), "stopped"
            step.note = "stopped when the night was interrupted; what it measured was saved, marked incomplete"
            self.night.save()
            raise
        step.seconds = round(self.clock() - start, 1)
        step.exit_code = outcome.exit_code
        step.status = ("stopped" if outcome.stopped else
                       "ok" if outcome.exit_code in (0, NO_TESTS_COLLECTED) else "failed")
        if outcome.stopped:
            step.note = "stopped at its deadline; what it measured was saved, marked incomplete"
        elif outcome.exit_code == NO_TESTS_COLLECTED:
            step.note = "no case selected (-k or -m left none)"
        self.night.save()
        self.say(f"night: {name}: {step.status}" + (f" (exit {step.exit_code})" if step.status == "failed" else "")
                 + f" in {step.seconds:.0f} s")
        if step.status == "failed":
            for line in _tail(self.out / step.log, 12):
                self.say(f"    {line}")
        return step

    def in_process(self, name: str, why: str, work: Callable[[], str | None]) -> StepRecord:
        """A step run here (no child: it only reads and writes files), its note what ``work`` returns."""
        step = StepRecord(name, why, status="running")
        self.night.steps.append(step)
        start = self.clock()
        try:
            step.note = work()
            step.status = "ok"
        except (OSError, ValueError, RunFileError) as e:
            step.status, step.note = "failed", str(e)
        step.seconds = round(self.clock() - start, 1)
        self.night.save()
        self.say(f"night: {name}: {step.status}" + (f": {step.note}" if step.note else ""))
        return step

    def skip_step(self, name: str, why: str, note: str) -> StepRecord:
        step = StepRecord(name, why, status="skipped", note=note)
        self.night.steps.append(step)
        self.night.save()
        self.say(f"night: {name}: skipped: {note}")
        return step

    def python(self, *args: str) -> list[str]:
        return [self.night.python, *args]

    def trainbench(self, *args: str) -> list[str]:
        return self.python("-m", "trainbench", *args)

    def pytest(self, *args: str) -> list[str]:
        # a GPU night that found no GPU fails rather than measuring the CPU profile
        device = (("--trainbench-simulate-gpu", self.night.simulate_gpu) if self.night.simulate_gpu else
                  (f"--trainbench-device={self.night.device}",))
        return self.python("-m", "pytest", "-rs", "-p", "no:cacheprovider", *device, *self.pytest_args, *args)

    # -- the night ---------------------------------------------------------------------------------
    def run(self) -> int:
        night = self.night
        night.started = self.clock()
        self.end = night.started + night.budget_s
        measure_end = self.end - finish_reserve(night.budget_s, bool(night.simulate_gpu))
        (self.out / "logs").mkdir(parents=True, exist_ok=True)
        (self.out / "groups").mkdir(parents=True, exist_ok=True)
        night.save()
        try:
            self._measure(measure_end)
        except KeyboardInterrupt:
            night.interrupted = True
            self.say("night: interrupted; keeping and summarizing what finished")
        try:
            self._finish()
        except KeyboardInterrupt:  # a second signal: what is on disk stays, the archive is still written
            night.interrupted = True
        night.finished = True
        failed = [s.name for s in night.steps if s.status == "failed"]
        missing = [s.name for s in night.steps if s.status in ("not started", "stopped")]
        if night.interrupted:  # the steps after the one it stopped were never tried: not "complete"
            verdict = "INTERRUPTED" + (": " + ", ".join(failed) + " failed" if failed else "")
        elif failed:
            verdict = "FAILED: " + ", ".join(failed)
        else:
            verdict = "PARTIAL: " + ", ".join(missing) + " did not finish in the budget" if missing else "complete"
        night.verdict = verdict
        night.save()
        used = self.clock() - night.started
        self.say(f"night: {verdict}; {used:.0f} s of {night.budget_s:.0f}; {self.out / 'summary.md'}")
        return 1 if failed or night.interrupted else 0

    def _measure(self, deadline: float) -> None:
        night = self.night
        doctor_args = (("--simulate-gpu", night.simulate_gpu) if night.simulate_gpu else
                       ("--expect-cuda",) if night.device == "cuda" else ("--device", "cpu"))
        self.run_step("doctor", "this machine before a run (CUDA, driver, memory, timing distortions)",
                      self.trainbench("doctor", *doctor_args, "--json", str(self.out / "doctor.json")), deadline)
        if night.simulate_gpu:  # a rehearsal's plan is its measurement, and predicts what its sessions ask
            self._plan(night.simulate_gpu, deadline)
        elif night.device == "cuda":
            night.deselected = doctor_deselections(self.out / "doctor.json")
            for case, why in night.deselected.items():
                self.say(f"night: {case}: {why}")
        node_ids = night_node_ids(night.deselected, night.measured_before)
        again = sum(node[node.index("[") + 1:-1] in night.measured_before for node in node_ids)
        order = f"({', '.join(g.name for g in CASE_GROUPS)})" + (
            f"; the {again} that {night.after} measured after the {len(node_ids) - again} it did not"
            if night.after else "")
        self._smoke(node_ids, deadline)
        self.run_step("cases", f"{len(node_ids)} cases in one session, in the order of what they tell {order}",
                      self.pytest("--trainbench-slow", "--trainbench-costs", *self.profile.pytest_args(),
                                  "--trainbench-save-progress", str(self.out / "groups" / "cases.progress.json"),
                                  "--benchmark-json", str(self.out / "groups" / "cases.json"),
                                  "--junitxml", str(self.out / "groups" / "cases.xml"), *node_ids), deadline)

    def _smoke(self, measured: list[str], deadline: float) -> None:
        why = f"self-checks of the measurement on this GPU first, capped at {SMOKE_CAP_S:g} s (make gpu-smoke)"
        if self.night.simulate_gpu:
            self.skip_step("smoke", why, "the self-checks measure: nothing runs on a simulated GPU")
            return
        if self.night.device != "cuda":
            self.skip_step("smoke", why, "GPU self-checks: nothing to check on a CPU night")
            return
        report = self.out / "groups" / "smoke.xml"
        step = self.run_step("smoke", why, self.pytest("--junitxml", str(report),
                                                       *smoke_node_ids(self.root, measured)),
                             min(deadline, self.clock() + SMOKE_CAP_S))
        checked = junit_cases(report)
        if step.status == "ok" and checked and all(c.outcome == "skipped" for c in checked):
            # pytest passes a session that skipped everything: the night checked nothing, and says so
            step.status, step.note = "failed", f"every self-check skipped: {checked[0].message}"
            self.night.save()
            self.say(f"night: smoke: failed: {step.note}")
        elif step.status == "stopped":
            step.note = f"stopped at its cap of {SMOKE_CAP_S:g} s; the checks it finished are in groups/smoke.xml"
            self.night.save()

    @property
    def profile(self) -> WindowProfile:
        return window_profile(self.night.budget_s, self.night.device)

    def _plan(self, gpu: str, deadline: float) -> None:
        seconds = ("--seconds-from", str(self.seconds_from)) if self.seconds_from else ()
        self.run_step("plan", f"the simulated plan of {gpu}, to set beside the run",
                      self.trainbench("plan", "--simulate-gpu", gpu, "--json", str(self.out / "plan.json"), *seconds),
                      deadline)

    def _finish(self) -> None:
        end = self.end - TERM_GRACE_S - KILL_GRACE_S  # a step stopped at its deadline may take this long to end
        run_path = self.out / "run.json"
        why = "the cases' run (or, where the session was killed, the run as it stood after its last case)"
        if self.night.simulate_gpu:
            merge = self.skip_step("run", why, "nothing is measured on a simulated GPU")
        else:
            merge = self.in_process("run", why, lambda: keep_run(self.out / "groups", run_path))
        if merge.status == "ok" and run_path.exists():
            why = "this device's budgets section calibrated from the run (a diff, not written)"
            if not _importable("tomlkit"):  # the diff keeps the budgets file's comments through tomlkit
                self.skip_step("calibrate", why, "tomlkit is not installed here: calibrate the archive's run.json "
                                                 "where it is (python -m trainbench calibrate run.json)")
            else:
                self.run_step("calibrate", why, self.trainbench("calibrate", str(run_path), "--budgets",
                                                                str(self.root / "benchmarks" / "budgets.toml")), end)
            why = "the ladder report of the run"
            if has_ladder_rungs(run_path):
                self.run_step("report", why, self.trainbench("report", str(run_path), "--out",
                                                             str(self.out / "report")), end)
            else:
                self.skip_step("report", why, "no ladder rung was measured")
        self.in_process("summary", "summary.md: the run beside the plan",
                        lambda: write_summary(self.night, self.out))


def _tail(path: Path, lines: int) -> list[str]:
    try:
        return path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
    except OSError:
        return []


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:
        return False


def child_environment(out: Path, simulate_gpu: str | None) -> dict[str, str]:
    """What the night's steps get beside this process's environment."""
    # every pytest session and the plan predict the same setups: once for the night
    env = {SharedPredictions.ENV: str(out / "predictions.json")}
    if simulate_gpu is None:
        # The doctor step has recorded (and, on a blocker, failed the night on) the checks each session would
        # repeat: a check never yet proven on this GPU must not stop the window's measurements. The sessions
        # still run on CUDA or not at all (--trainbench-device=cuda).
        env["TRAINBENCH_IGNORE_DOCTOR"] = "1"
    return env


def summarize_again(out: Path) -> Path:
    """Rewrite ``out``'s summary.md from what the folder holds now (e.g. a plan made afterwards, on another
    machine, where the night's own was stopped): the steps as night.json recorded them."""
    night = read_manifest(out)
    write_summary(night, out)
    return out / "summary.md"


def run_night(out: Path, budget_s: float, simulate_gpu: str | None, root: Path, python: str = sys.executable,
              runner: StepRunner | None = None, clock: Callable[[], float] = time.monotonic,
              say: Callable[[str], None] = print, pytest_args: tuple[str, ...] = (), device: str = "cuda",
              archive: Path | None = None, plan: Path | None = None, seconds_from: Path | None = None,
              after: Path | None = None) -> int:
    """The night, start to end; its exit status (0: every step that ran passed). With ``archive``, the night's
    folder is packed into it whatever the ending: complete, partial, failed, interrupted or crashed."""
    check_start(out, budget_s, root, simulate_gpu, device, archive, plan, seconds_from, after, pytest_args)
    night = Night(out, budget_s, simulate_gpu, python, device=device)
    if after is not None:
        night.after, night.measured_before = str(after), measured_before(after)
    night.profile = window_profile(budget_s, device).to_json()
    if plan is not None:  # made before the night, off its clock
        shutil.copyfile(plan, out / "plan.json")
    runner = runner or subprocess_runner(clock, child_environment(out, simulate_gpu))
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        return NightRun(night, root, runner, clock, say, pytest_args, seconds_from).run()
    finally:
        signal.signal(signal.SIGTERM, previous)
        if archive is not None:
            _archive_whatever_happens(night, archive, say)


def write_archive(night: Night, archive: Path, limit: int = ARCHIVE_LIMIT_BYTES) -> list[str]:
    """The night's folder packed into ``archive`` (``night_archive.pack_folder``); what had to be left out to fit
    ``limit`` is recorded in the manifest and said in the summary the archive holds. Returns what was left out."""

    def record(left_out: list[str]) -> None:
        night.archive_left_out = left_out
        night.save()
        write_summary(night, night.out)

    return pack_folder(night.out, archive, limit, record)


def _archive_whatever_happens(night: Night, archive: Path, say: Callable[[str], None]) -> None:
    """The archive, written with SIGTERM and SIGINT held off (it takes a second); a failure to write it is said
    as the night's last line."""
    held = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        left_out = write_archive(night, archive)
        say(f"night: archive {archive} ({archive.stat().st_size / 2**20:.1f} MiB)"
            + (f"; left out to fit {ARCHIVE_LIMIT_BYTES / 2**20:.0f} MiB: {', '.join(left_out)}" if left_out else ""))
    except (OSError, ValueError, tarfile.TarError) as e:
        say(f"night: FAILED: the archive {archive} was not written ({e})")
    finally:
        for sig, handler in held.items():
            signal.signal(sig, handler)


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")
