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
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import math
import shutil
import tarfile
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from xml.etree import ElementTree

from trainbench.core.harness.files import cannot_write, write_atomic, write_json_atomic, write_text_atomic
from trainbench.verdicts.render import Column, Table, number
from trainbench.verdicts.store import RunFileError, SavedRun

SUITE_FILE = "benchmarks/test_recipes.py"
# Time kept back from the measuring steps for keeping the run, calibrating, reporting and the summary.
FINISH_RESERVE_S = 60.0
# A step that would have less than this left is not started: it could not finish anything worth keeping.
MIN_STEP_S = 10.0
# pytest's exit status when its arguments selected nothing (the night's -k left a group empty): not a failure.
NO_TESTS_COLLECTED = 5
# After SIGINT, how long a step may take to save what it measured before it is sent SIGTERM, and then SIGKILL.
TERM_GRACE_S = 15.0
KILL_GRACE_S = 5.0


@dataclass(frozen=True)
class CaseGroup:
    """Cases measured in one pytest session, in the night's order: the first tell the most per second."""

    name: str
    why: str
    cases: tuple[str, ...] | None  # case ids; None: every suite case no earlier group took
    slow: bool = False  # torch.compile and the like: --trainbench-slow
    ladders: bool = False  # the ladder rungs (test_ladder) rather than single recipes


CASE_GROUPS: tuple[CaseGroup, ...] = (
    CaseGroup("resnet18", "the seeds' model: each CUDA data path and precision against its fp32 baseline",
              ("resnet18-baseline", "resnet18-amp_fp16", "resnet18-amp_bf16", "resnet18-channels_last_amp",
               "resnet18-uint8_transfer", "resnet18-pinned_memory", "resnet18-multiprocess_loading",
               "resnet18-cudnn_benchmark")),
    CaseGroup("gpt", "a decoder LM: flash attention and the fused optimizer",
              ("gpt-baseline", "gpt-sdpa_flash", "gpt-optimizer_fused")),
    CaseGroup("vit", "a Vision Transformer under bf16 autocast", ("vit-amp_bf16",)),
    CaseGroup("rest", "every other case of the suite that compiles nothing", None),
    CaseGroup("slow", "the cases that compile (torch.compile and the like): minutes of warm-up each", None,
              slow=True),
    CaseGroup("ladders", "the seeds' two ladders, rung by rung (torch.compile included): the slowest, last", None,
              slow=True, ladders=True),
)
# The GPU self-checks' share of the window: they come first in their step, the CUDA paths no case of the night
# measures after them.
SMOKE_CAP_S = 60.0
SMOKE_FILE = "smoke/test_gpu_smoke.py"
# The smoke tests that each run one CUDA path: those the night's own cases measure anyway are left out.
SMOKE_PATH_TESTS = ("test_cuda_path", "test_multi_gpu_path")
# Where a budget is shorter than this, the window profile trims what a case times (WindowProfile).
SHORT_NIGHT_S = 900.0


@dataclass(frozen=True)
class WindowProfile:
    """How much each case times in this night: fewer steps a round and no attribution where the budget is short
    (the rounds stay at the number whose 95% intervals keep their claim, ``stats`` and the tests of it)."""

    name: str
    why: str
    rounds: int | None = None  # None: the device profile's default
    steps_per_round: int | None = None
    min_warmup: int | None = None
    attribution: bool = True

    def pytest_args(self) -> tuple[str, ...]:
        args = [f"--trainbench-{flag}={value}" for flag, value in
                (("rounds", self.rounds), ("steps-per-round", self.steps_per_round),
                 ("min-warmup", self.min_warmup)) if value is not None]
        return (*args, *(() if self.attribution else ("--trainbench-no-attribution",)))

    def to_json(self) -> dict:
        return {**asdict(self), "pytest_args": list(self.pytest_args())}


def window_profile(budget_s: float, device: str) -> WindowProfile:
    """The measuring profile a night of ``budget_s`` seconds on ``device`` (cuda or cpu) uses."""
    if budget_s >= SHORT_NIGHT_S:
        return WindowProfile("full", f"a budget of {budget_s:g} s >= {SHORT_NIGHT_S:g} s: the device profile as is")
    why = f"a budget of {budget_s:g} s < {SHORT_NIGHT_S:g} s"
    if device == "cpu":  # ~0.1-0.3 s steps: 2 a round serve the interval better than fewer rounds of more
        return WindowProfile("short", why + ": 8 rounds of 2 steps, no attribution", rounds=8, steps_per_round=2,
                             attribution=False)
    # ms steps: the rounds cost little, the passes after them most; warm-up still runs until steady
    return WindowProfile("short", why + ": 10 rounds of 5 steps, warm-up from 5 steps, no attribution",
                         rounds=10, steps_per_round=5, min_warmup=5, attribution=False)


@dataclass
class StepRecord:
    name: str
    why: str
    status: str = "pending"  # pending, running, ok, failed, stopped (its deadline), not started, skipped
    exit_code: int | None = None
    seconds: float | None = None
    log: str | None = None
    note: str | None = None


@dataclass
class Night:
    """The night's manifest (``night.json``): every step, its status and time."""

    out: Path
    budget_s: float
    simulate_gpu: str | None
    python: str
    started: float = 0.0  # the clock's reading at the start
    steps: list[StepRecord] = field(default_factory=list)
    finished: bool = False
    interrupted: bool = False
    device: str = "cuda"  # cuda: a GPU night; cpu: the same night on the CPU cases
    profile: dict | None = None  # WindowProfile.to_json of the measuring steps
    deselected: dict[str, str] = field(default_factory=dict)  # case -> why the night did not run it
    verdict: str | None = None  # the last line's verdict, once the night has one
    archive_left_out: list[str] = field(default_factory=list)  # files the archive had no room for
    after: str | None = None  # --after: the earlier night's run whose measured cases go last tonight
    measured_before: frozenset[str] = frozenset()  # the case ids that run measured

    def to_json(self) -> dict:
        return {"budget_s": self.budget_s, "simulate_gpu": self.simulate_gpu, "python": self.python,
                "device": self.device, "profile": self.profile, "deselected": self.deselected,
                "after": self.after, "measured_before": sorted(self.measured_before),
                "finished": self.finished, "interrupted": self.interrupted, "verdict": self.verdict,
                "archive_left_out": self.archive_left_out,
                "steps": [asdict(step) for step in self.steps]}

    def save(self) -> None:
        write_json_atomic(self.out / "night.json", self.to_json())


@dataclass(frozen=True)
class StepOutcome:
    exit_code: int | None  # None: it never started
    stopped: bool = False  # it ran past its deadline and was stopped


# A step's command runs as (argv, log file, deadline on the night's clock) -> outcome.
StepRunner = Callable[[list[str], Path, float], StepOutcome]


class NightError(ValueError):
    """A night that cannot start; the message names what is wrong."""


# The pytest options the night sets itself: one given again through --pytest-arg would measure another device than
# the night says (a GPU night's summary heading a CPU's figures) or write its results where the night does not look.
NIGHT_OWNS = ("--trainbench-device", "--trainbench-simulate-gpu", "--benchmark-json", "--junitxml",
              "--trainbench-save-progress", "--trainbench-rounds", "--trainbench-steps-per-round")


def check_start(out: Path, budget_s: float, root: Path, simulate_gpu: str | None = None, device: str = "cuda",
                archive: Path | None = None, plan: Path | None = None, seconds_from: Path | None = None,
                after: Path | None = None, pytest_args: tuple[str, ...] = ()) -> None:
    """Refuse at start-up what would only fail later: no suite here, an output folder that cannot be written or
    holds an earlier night, a budget too short (or not a number) to measure anything, a GPU to simulate that cannot
    be, an archive that cannot be written, a plan that is not one."""
    from trainbench.devices.fleet import GpuSpecError, parse_gpu

    if device not in ("cuda", "cpu"):
        raise NightError(f"--device {device}: expected cuda or cpu")
    owned = next((arg for arg in pytest_args if arg.split("=", 1)[0] in NIGHT_OWNS), None)
    if owned is not None:
        raise NightError(f"--pytest-arg {owned}: the night sets {owned.split('=', 1)[0]} itself (--device, "
                         "--simulate-gpu, its profile and its outputs in --out); expected other pytest options")
    if simulate_gpu is not None:
        if device != "cuda":
            raise NightError("--simulate-gpu rehearses a GPU night: not with --device cpu")
        try:
            parse_gpu(simulate_gpu)
        except GpuSpecError as e:
            raise NightError(f"--simulate-gpu: {e}") from None
    if not _plugin_installed():
        raise NightError(f"trainbench is not installed for pytest in {sys.executable} (no pytest11 entry point): "
                         "pip install --no-deps --no-build-isolation -e . installs it and nothing else")
    if not (root / SUITE_FILE).is_file():
        raise NightError(f"{root / SUITE_FILE}: not found; run the night from a trainbench checkout")
    least = least_budget_s(simulate_gpu is not None)
    if not math.isfinite(budget_s) or budget_s < least:
        raise NightError(f"--budget-s {budget_s:g}: expected a number of seconds, at least {least:g}")
    if out.exists() and not out.is_dir():
        raise NightError(f"--out {out}: not a folder")
    if (out / "night.json").exists():
        raise NightError(f"--out {out}: holds an earlier night (night.json); expected a new or empty folder, so that "
                         "nothing of that night is read as tonight's")
    held = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if held:  # an old plan.json, run.json, groups/ or predictions.json would be read as tonight's
        raise NightError(f"--out {out}: holds {', '.join(held[:3])}{', ...' if len(held) > 3 else ''}; expected a new "
                         "or empty folder, so that nothing in it is read as tonight's (a plan made beforehand goes "
                         "in with --plan)")
    if plan is not None:
        _check_plan(plan)
    if seconds_from is not None:
        _check_seconds_from(seconds_from, simulate_gpu)
    if after is not None:
        measured_before(after)
    problem = cannot_write(out)  # made here where missing: under a file, /proc or a read-only folder it cannot be
    if problem:
        raise NightError(f"--out {out}: cannot be made or written into ({problem}); expected a folder this user can write")
    if archive is not None:
        if not archive.name.endswith(".tar.gz"):
            raise NightError(f"--archive {archive}: expected a file name ending in .tar.gz")
        if archive.resolve().is_relative_to(out.resolve()):
            raise NightError(f"--archive {archive}: inside --out {out}; expected a path outside the night's folder")
        archive.parent.mkdir(parents=True, exist_ok=True)
        problem = cannot_write(archive.parent)
        if problem:
            raise NightError(f"--archive {archive}: {problem}")


def _check_seconds_from(path: Path, simulate_gpu: str | None) -> None:
    if simulate_gpu is None:
        raise NightError("--seconds-from: only a rehearsal (--simulate-gpu) makes a plan; for a night on a GPU, make "
                         "the plan beforehand with plan --seconds-from and pass it as --plan")
    from trainbench.devices.fleet import parse_gpu
    from trainbench.jobs.night_plan import seconds_source
    from trainbench.verdicts.store import RunFileError

    try:
        seconds_source(path, parse_gpu(simulate_gpu))
    except RunFileError as e:
        raise NightError(f"--seconds-from: {e}") from None


def _check_plan(plan: Path) -> None:
    from trainbench.jobs.night_plan import PlanFileError, read_plan

    try:
        read_plan(plan)
    except PlanFileError as e:
        raise NightError(f"--plan {e}") from None


def least_budget_s(simulated: bool) -> float:
    """The least ``--budget-s`` a night accepts: two steps of ``MIN_STEP_S`` to measure in before its
    ``finish_reserve`` (45 s for a night on a GPU, 40 s for a rehearsal)."""
    budget = 2 * MIN_STEP_S
    while budget - finish_reserve(budget, simulated) < 2 * MIN_STEP_S:  # the reserve grows with the budget, slower
        budget = 2 * MIN_STEP_S + finish_reserve(budget, simulated)
    return budget


def finish_reserve(budget_s: float, simulated: bool) -> float:
    """Seconds kept back from measuring: for keeping the run, calibrating and reporting (a quarter of a short
    budget), or on a rehearsal, which has only its summary to write, for a stopped step to end."""
    if simulated:
        return TERM_GRACE_S + 5.0
    return max(min(FINISH_RESERVE_S, budget_s / 4), TERM_GRACE_S + MIN_STEP_S)


def _plugin_installed() -> bool:
    from importlib.metadata import entry_points

    return any(entry.name == "trainbench" for entry in entry_points(group="pytest11"))


def suite_node_ids(group: CaseGroup, taken: set[str]) -> list[str]:
    """The pytest node ids of ``group``'s cases in its order (``taken``: ids earlier groups ran, updated). A group
    of every case left takes those whose slowness is its own (the cheap ones first, those that compile after)."""
    from trainbench.core.setups.cases import ladder_cases, recipe_cases

    if group.ladders:
        ids = [case.id for case in ladder_cases()]
        test = "test_ladder"
    else:
        ids = (list(group.cases) if group.cases is not None else
               [case.id for case in recipe_cases() if case.own_recipe().slow == group.slow])
        test = "test_recipe"
    ids = [i for i in ids if i not in taken]
    taken.update(ids)
    return [f"{SUITE_FILE}::{test}[{case}]" for case in ids]


def night_node_ids(deselected: dict[str, str], measured_before: frozenset[str] = frozenset()) -> list[str]:
    """Every case of the night in its order (``CASE_GROUPS``), less the ``deselected`` ones; with
    ``measured_before`` (the case ids an earlier night of this device measured, ``--after``), the cases it did not
    measure first and those it did after them, each part in that order: a second window goes to what the first
    did not reach."""
    taken: set[str] = set(deselected)
    nodes = [node for group in CASE_GROUPS for node in suite_node_ids(group, taken)]
    again = [node for node in nodes if node[node.index("[") + 1:-1] in measured_before]
    return [node for node in nodes if node not in again] + again


def measured_before(path: Path) -> frozenset[str]:
    """The case ids an earlier night's run measured (``--after``): a saved run with no fault planted in it (a
    ``NightError`` says what else); one stopped at its deadline is taken: what it finished was measured."""
    try:
        run = SavedRun.load(path)
    except RunFileError as e:
        raise NightError(f"--after {e}") from None
    if run.marks_problem or run.planted:
        raise NightError(f"--after {path}: " + (run.marks_problem or f"measured with a fault planted on purpose "
                                                 f"({run.planted}); expected a night's own run"))
    cases = frozenset(run.case_ids().values())
    if not cases:
        raise NightError(f"--after {path}: measured no trainbench case; expected an earlier night's run.json")
    return cases


def smoke_node_ids(root: Path, measured: list[str]) -> list[str]:
    """The smoke step's tests in their order: the self-checks of the method first (what only they tell), then each
    CUDA path that none of the night's ``measured`` node ids measures anyway."""
    import ast

    tree = ast.parse((root / SMOKE_FILE).read_text(encoding="utf-8"))
    tests = [node.name for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")]
    paths = {}
    for node in tree.body:  # CUDA_PATHS = [("resnet18", "baseline"), ...]: literal lists, read without importing
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) \
                and node.targets[0].id.endswith("_PATHS"):
            paths[node.targets[0].id] = ast.literal_eval(node.value)
    cases = {node[node.index("[") + 1:-1] for node in measured}
    checks = [f"{SMOKE_FILE}::{name}" for name in tests if name not in SMOKE_PATH_TESTS]
    path_ids = [f"{SMOKE_FILE}::{test}[{workload}-{recipe}]"
                for test, table in (("test_cuda_path", "CUDA_PATHS"), ("test_multi_gpu_path", "MULTI_GPU_PATHS"))
                for workload, recipe in paths.get(table, ()) if f"{workload}-{recipe}" not in cases]
    return checks + path_ids


def doctor_deselections(doctor_json: Path) -> dict[str, str]:
    """Cases the doctor's blockers would kill, with why: with too little shared memory (its ``shm`` check FAILs),
    every case whose DataLoader workers would die of a bus error, ladder rungs included."""
    from trainbench.jobs.doctor import loader_worker_cases, read_checks

    shm = [c for c in read_checks(doctor_json) if c.name == "shm" and c.status == "FAIL"]
    if not shm:
        return {}
    why = f"deselected: the doctor's shm check failed ({shm[0].message})"
    return {case: why for case in loader_worker_cases("gpu")}


def subprocess_runner(clock: Callable[[], float] = time.monotonic, env: dict[str, str] | None = None) -> StepRunner:
    """Run a step as a child process in its own process group, its output into its log; stopped at the deadline.
    ``env``: variables the children get beside this process's."""

    def run(argv: list[str], log: Path, deadline: float) -> StepOutcome:
        env_here = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
        with open(log, "wb") as out:
            child = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env_here,
                                     start_new_session=True, preexec_fn=_interruptible)
            try:
                return _wait(child, deadline, clock)
            except BaseException:
                _stop(child)
                raise

    return run


def _interruptible() -> None:
    """In the child before it starts: SIGINT back to its default, so that Python makes it a KeyboardInterrupt. A
    night started in the background of a shell script inherits SIGINT ignored, and its steps would then sit out the
    deadline's SIGINT and lose their report to the SIGTERM after it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _wait(child: subprocess.Popen, deadline: float, clock: Callable[[], float]) -> StepOutcome:
    while True:
        left = deadline - clock()
        try:
            return StepOutcome(child.wait(timeout=max(0.05, min(left, 1.0))))
        except subprocess.TimeoutExpired:
            if clock() >= deadline:
                return StepOutcome(_stop(child), stopped=True)


def _stop(child: subprocess.Popen) -> int:
    """SIGINT to the step's process group first (pytest ends as on Ctrl-C: it reports the failures so far and writes
    its JUnit XML, and a trainbench session saves what it measured), SIGTERM after ``TERM_GRACE_S``, SIGKILL after
    ``KILL_GRACE_S`` more."""
    for sig, wait in ((signal.SIGINT, TERM_GRACE_S), (signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, None)):
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:
            pass
        try:
            return child.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
    return child.wait()


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
            if _has_ladder_rungs(run_path):
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


def keep_run(groups: Path, out: Path) -> str:
    """The night's run at ``out``: the cases session's ``--benchmark-json``, or, where the session was killed
    before writing it, the run as it stood after its last finished case (``--trainbench-save-progress``, marked
    incomplete)."""
    whole, progress = groups / "cases.json", groups / "cases.progress.json"
    problems = []
    for path, how in ((whole, "the session's run"), (progress, "the run after its last finished case "
                                                                "(the session ended before writing its own)")):
        if not path.exists():
            continue
        try:
            run = SavedRun.load(path)
        except RunFileError as e:  # e.g. the empty file --benchmark-json opens at the start of a killed session
            problems.append(str(e))
            continue
        write_json_atomic(out, run.run)
        return f"{run.benchmark_count} cases: {how}" + (f" ({'; '.join(problems)})" if problems else "")
    raise ValueError("the cases session saved no run" + (f" ({'; '.join(problems)})" if problems else
                                                         " (no case finished)"))


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:
        return False


def _has_ladder_rungs(run_path: Path) -> bool:
    try:
        return any(record.ladder for record in SavedRun.load(run_path).cases(errors=[]))
    except RunFileError:
        return False


# -- the summary -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class CaseOutcomeLine:
    """A case as one pytest session reported it (its JUnit XML)."""

    case: str
    outcome: str  # passed, failed, error, skipped
    message: str = ""
    seconds: float | None = None  # its wall time in the session (setup, call and teardown), as pytest reports it


def junit_cases(path: Path) -> list[CaseOutcomeLine]:
    """The suite cases of a pytest JUnit XML report, with their outcome and the skip or failure message."""
    try:
        root = ElementTree.parse(path).getroot()
    except (OSError, ElementTree.ParseError):
        return []
    found = []
    for testcase in root.iter("testcase"):
        name = testcase.get("name", "")
        case = name[name.find("[") + 1:-1] if name.endswith("]") and "[" in name else name
        outcome, message = "passed", ""
        for child in testcase:
            if child.tag in ("skipped", "failure", "error"):
                outcome = {"skipped": "skipped", "failure": "failed", "error": "error"}[child.tag]
                message = (child.get("message") or "").strip()
                break
        try:
            seconds = float(testcase.get("time", ""))
        except ValueError:
            seconds = None
        found.append(CaseOutcomeLine(case, outcome, message, seconds))
    return found


def write_summary(night: Night, out: Path) -> str:
    lines = summary_lines(night, out)
    write_text_atomic(out / "summary.md", "\n".join(lines) + "\n")
    return f"{len(lines)} lines"


def _summary_head(night: Night, run: SavedRun | None, plan: dict | None) -> list[str]:
    """The summary's title (which night, of what device) and what the night chose or left out."""
    device = (run.device or {}).get("name") if run is not None else None
    plan_gpu = (plan or {}).get("gpu", {}).get("name")
    what = "CPU night" if night.device == "cpu" and not night.simulate_gpu else "GPU night"
    name = night.simulate_gpu or device or plan_gpu or ("this CPU" if night.device == "cpu" else "this GPU")
    kind = "simulated: nothing measured" if night.simulate_gpu else "measured"
    lines = [f"# {what}: {name} ({kind})", "",
             f"Budget {night.budget_s:g} s; python {night.python}."
             + (" Interrupted." if night.interrupted else "") + (f" Verdict: {night.verdict}." if night.verdict else "")]
    if night.profile:
        lines += ["", f"Profile: {night.profile['name']} ({night.profile['why']}); pytest "
                      f"`{' '.join(night.profile['pytest_args']) or '(the defaults)'}`."]
    if plan_gpu and device and plan_gpu != device:
        lines += ["", f"The plan is of {plan_gpu}, the run of {device}: their rows compare different GPUs."]
    if night.after:
        lines += ["", f"After {night.after}: the {len(night.measured_before)} cases it measured went last, behind "
                      "those it did not."]
    if night.archive_left_out:
        lines += ["", f"Left out of the archive to fit {ARCHIVE_LIMIT_BYTES / 2**20:.0f} MiB (still in the night's "
                      f"folder): {', '.join(night.archive_left_out)}."]
    if night.deselected:
        lines += ["", "Not run, with why:", ""] + [f"- {case}: {why}" for case, why in night.deselected.items()]
    return lines


def _night_plan(out: Path) -> tuple[dict | None, str | None]:
    """The plan beside the night (``night_plan.read_plan``), or why it is left out of the summary: the run's own
    figures still stand."""
    from trainbench.jobs.night_plan import PlanFileError, read_plan

    if not (out / "plan.json").exists():
        return None, None
    try:
        return read_plan(out / "plan.json"), None
    except PlanFileError as e:
        return None, str(e)


def _night_results(out: Path) -> tuple[SavedRun | None, dict[str, dict], dict[str, CaseOutcomeLine]]:
    """The night's run (None: a rehearsal, a night that measured nothing), its cases' figures, and each case's
    pytest outcome from the sessions' JUnit reports."""
    try:
        run = SavedRun.load(out / "run.json")
    except RunFileError:
        run = None
    reported = {}
    for xml in sorted((out / "groups").glob("[0-9][0-9]-*.xml")) + [out / "groups" / "cases.xml"]:
        reported.update({c.case: c for c in junit_cases(xml)})
    return run, _measured_cases(run), reported


def summary_lines(night: Night, out: Path) -> list[str]:
    """summary.md: the steps, then each case as the plan saw it and as the night found it, and what differed."""
    plan, plan_problem = _night_plan(out)
    run, measured, reported = _night_results(out)
    lines = _summary_head(night, run, plan)
    if plan_problem:
        lines += ["", f"The plan is left out: {plan_problem}."]
    lines += ["", "## Steps", ""]
    lines += _table(("step", "status", "s", "note"),
                    [(s.name, s.status, "" if s.seconds is None else f"{s.seconds:.0f}", s.note or s.why)
                     for s in night.steps if s.name != "summary"])  # this file, being written
    from trainbench.core.setups.eligibility import HEADROOM
    from trainbench.core.analyses.roofline import versus_measured
    from trainbench.jobs.night_plan import planned_peak_mib

    planned = {c["case"]: c for c in (plan or {}).get("cases", [])}
    rows, differs, bounds = [], [], []
    for case in dict.fromkeys([*planned, *reported, *measured]):
        p, r, m = planned.get(case), reported.get(case), measured.get(case)
        plan_text = ("-" if p is None else f"skip: {p['skipped']}" if p.get("skipped") else
                     f"PROBLEM: {p['problem']}" if p.get("problem") else "run")
        night_text = ("measured (the session stopped before its report)" if r is None and m else
                      "not reached" if r is None else "would run (simulated)" if _would_run(r) else
                      r.outcome + (f": {r.message}" if r.message else ""))
        predicted = planned_peak_mib(p) if p else None
        peak = m.get("peak_memory_mib") if m else None
        speed = m.get("samples_per_s") if m else None
        roofline = (p or {}).get("roofline") or ""
        # what a case cost where it ran; a skip's instant is no cost worth a column
        seconds = (r.seconds if r and r.outcome != "skipped" and r.seconds is not None else
                   (m or {}).get("case_seconds"))
        predicted_s = (p or {}).get("predicted_s")
        rows.append((case, plan_text, night_text, roofline, *(number(v, ".1f" if isinstance(v, float) else "")
                                                               for v in (predicted_s, seconds, speed, peak, predicted))))
        difference = _difference(p, r, peak, predicted and predicted * HEADROOM)
        if difference:
            differs.append(f"- {case}: {difference}")
        step_ms, bound_s = (m or {}).get("step_time_ms"), (p or {}).get("bound_s")
        if step_ms and bound_s:
            bounds.append(f"- {case}: {versus_measured(bound_s, step_ms / 1000)}")
    lines += ["", "## Cases", "",
              "Plan: `python -m trainbench plan --simulate-gpu` of the same GPU (roofline: what bounds its step and "
              "the bound; predicted MiB: its own tensor peak, without the memory gate's headroom); night: the pytest outcome "
              "of the case; pred s: its seconds in the session as the plan predicted them (`plan --seconds-from` an "
              "earlier night); case s: its wall seconds in the night's session (what the next night's order and "
              "budget are sized by).", ""]
    lines += _fit_lines(night, planned)
    lines += _table(("case", "plan", "night", "roofline", "pred s", "case s", "samples/s", "peak MiB",
                     "predicted MiB"), rows, text_columns=4)
    lines += ["", "## What differed from the plan", ""] + (differs or ["- nothing"])
    if bounds:
        lines += ["", "## Measured steps against the roofline's bound", ""] + bounds
    if plan is None:
        lines += ["", "No plan was made (see the plan step): nothing to compare with."]
    return lines


# What the doctor step takes on a GPU box before the cases can start (17 s on the first H200 night), kept back from
# the cases' window where the plan's seconds are set against the budget.
DOCTOR_S = 20.0


def _fit_lines(night: Night, planned: dict[str, dict]) -> list[str]:
    """Which cases the budget fits by the plan's predicted seconds: the cases' window (the budget less the finish
    reserve, the doctor and the smoke step's cap) against their sum in the night's order."""
    if not any(c.get("predicted_s") is not None for c in planned.values()):
        return []
    window = night.budget_s - finish_reserve(night.budget_s, False) - DOCTOR_S - SMOKE_CAP_S
    order = [n[n.index("[") + 1:-1] for n in night_node_ids(night.deselected, night.measured_before)]
    runs = [planned[c] for c in order if c in planned and not planned[c].get("skipped") and not planned[c].get("problem")]
    spent, fitting = 0.0, 0
    for case in runs:
        if case.get("predicted_s") is None:
            break
        spent += case["predicted_s"]
        if spent > window:
            break
        fitting += 1
    last = f", through {runs[fitting - 1]['case']}" if fitting else ""
    stop = (f"; then {runs[fitting]['case']}" + (" (not predicted)" if runs[fitting].get("predicted_s") is None else
                                                  f" would end at ~{spent:.0f} s")) if fitting < len(runs) else ""
    return [f"By the plan's predicted seconds, a {night.budget_s:g} s night's cases step (~{window:.0f} s: the budget "
            f"less the finish reserve, ~{DOCTOR_S:g} s of doctor and the smoke step's {SMOKE_CAP_S:g} s cap) fits "
            f"{fitting} of the {len(runs)} cases that run{last}{stop}.", ""]


def _table(titles: tuple[str, ...], rows: list[tuple[str, ...]], text_columns: int | None = None) -> list[str]:
    text_columns = len(titles) if text_columns is None else text_columns
    columns = tuple(Column(title, left=i < text_columns) for i, title in enumerate(titles))
    return Table(columns, tuple(rows)).markdown()


def _difference(planned: dict | None, reported: CaseOutcomeLine | None, peak: float | None,
                predicted: float | None) -> str | None:
    if planned is None or reported is None:
        return None
    plan_runs = not planned.get("skipped") and not planned.get("problem")
    if plan_runs and reported.outcome == "skipped" and not _would_run(reported):
        return f"planned to run, skipped: {reported.message}"
    if not plan_runs and reported.outcome != "skipped":
        return f"planned to skip ({planned.get('skipped') or planned.get('problem')}), {reported.outcome}"
    if reported.outcome in ("failed", "error"):
        return f"{reported.outcome}: {reported.message}"
    if peak and predicted and peak > predicted:
        return f"measured peak {peak:.0f} MiB above the predicted {predicted:.0f} MiB (with headroom)"
    return None


def _would_run(reported: CaseOutcomeLine) -> bool:
    """A rehearsal's skip of a case the simulated GPU would run (``--trainbench-simulate-gpu``)."""
    return reported.outcome == "skipped" and "would run on simulated" in reported.message


def _measured_cases(run: SavedRun | None) -> dict[str, dict]:
    """The metrics of each case the night's run measured (a record that cannot be read: left out)."""
    if run is None:
        return {}
    from trainbench.core.harness.costs import TOTAL

    # beside the metrics, the case's own seconds (its cost ledger's total), for a case the JUnit report missed
    return {record.case: {**record.metrics, "case_seconds": record.phase_seconds.get(TOTAL)}
            for record in run.cases(errors=[])}


def _read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def child_environment(out: Path, simulate_gpu: str | None) -> dict[str, str]:
    """What the night's steps get beside this process's environment."""
    from trainbench.core.analyses.predict import SharedPredictions

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
    manifest = _read_json(out / "night.json")
    if manifest is None or not isinstance(manifest.get("steps"), list):
        raise NightError(f"{out / 'night.json'}: missing or unreadable; expected a night's folder")
    try:
        night = Night(out, float(manifest["budget_s"]), manifest.get("simulate_gpu"), str(manifest.get("python")),
                      steps=[StepRecord(**step) for step in manifest["steps"]], finished=bool(manifest["finished"]),
                      interrupted=bool(manifest.get("interrupted")), device=manifest.get("device", "cuda"),
                      profile=manifest.get("profile"), deselected=dict(manifest.get("deselected") or {}),
                      verdict=manifest.get("verdict"), archive_left_out=list(manifest.get("archive_left_out") or []),
                      after=manifest.get("after"), measured_before=frozenset(manifest.get("measured_before") or ()))
    except (KeyError, TypeError, ValueError) as e:
        raise NightError(f"{out / 'night.json'}: not a night's manifest ({e})") from None
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


# What comes back from a lent GPU box: files of at most 16 MiB.
ARCHIVE_LIMIT_BYTES = 16 * 2**20
# Left out first where the archive would be larger: traces, then the ladder report's pictures, then logs.
ARCHIVE_LEAVE_FIRST = ("*trace*", "*.png", "logs/*")


def write_archive(night: Night, archive: Path, limit: int = ARCHIVE_LIMIT_BYTES) -> list[str]:
    """The night's folder as one .tar.gz at ``archive`` (written whole, never a partial file) of at most ``limit``
    bytes; where everything would not fit, files are left out in ``ARCHIVE_LEAVE_FIRST``'s order (the largest of
    each kind first) and the summary rewritten to say which. Returns what was left out."""
    out = night.out
    left_out: list[str] = []
    while True:
        files = sorted(p for p in out.rglob("*") if p.is_file() and not p.name.endswith(".tmp"))  # summary.md too
        data = _tar_gz(out, [f for f in files if _relative(out, f) not in left_out])
        if len(data) <= limit:
            break
        candidates = [f for pattern in ARCHIVE_LEAVE_FIRST for f in sorted(
            (f for f in files if f.relative_to(out).match(pattern) and _relative(out, f) not in left_out),
            key=lambda f: -f.stat().st_size)]
        if not candidates:
            raise ValueError(f"{len(data) / 2**20:.1f} MiB without {', '.join(left_out) or 'anything'} left out: "
                             f"over the {limit / 2**20:.0f} MiB limit")
        left_out.append(_relative(out, candidates[0]))
        night.archive_left_out = list(left_out)
        night.save()
        write_summary(night, out)
    write_atomic(archive, lambda f: f.write(data))
    return left_out


def _relative(out: Path, path: Path) -> str:
    return path.relative_to(out).as_posix()


def _tar_gz(out: Path, files: list[Path]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for path in files:
            tar.add(path, arcname=f"{out.name}/{_relative(out, path)}")
    return buffer.getvalue()


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


# The subcommand: ``python -m trainbench night``.
NAME = "night"
HELP = "the GPU night: doctor, self-checks, the cases by what they tell, calibration, report, summary"
DESCRIPTION = ("Spend a GPU window measuring, within --budget-s, writing into --out as it goes: the doctor "
               "(doctor.json), the GPU self-checks (smoke/, capped), the suite's cases in one session in the order "
               "of what they tell, the run (run.json), its device's budgets section calibrated (a diff), the ladder "
               "report and summary.md beside the plan made before the night (--plan); --archive packs it all into "
               "one .tar.gz whatever the ending. Each step is a child process of this interpreter: nothing is "
               "installed, nothing is fetched. Exit 1 when a step failed or the night was interrupted, 2 when it "
               "cannot start.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--budget-s", type=float, default=None, metavar="SECONDS",
                        help="wall time for the whole night; measuring stops early enough to merge and summarize")
    parser.add_argument("--summarize", action="store_true",
                        help="run nothing: rewrite DIR/summary.md from what the folder holds now (e.g. a plan.json "
                             "made afterwards with plan --simulate-gpu GPU --json DIR/plan.json)")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="the night's folder (night.json, logs/, ...): a new or empty one")
    parser.add_argument("--archive", default=None, metavar="FILE.tar.gz",
                        help="pack the night's folder into FILE (at most 16 MiB; traces left out first) in every "
                             "ending: complete, partial, failed budgets, interrupted or crashed")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                        help="cuda (default): the GPU night; cpu: the same night measuring the CPU cases")
    parser.add_argument("--plan", default=None, metavar="PLAN.json",
                        help="a plan made before the night, on any machine (python -m trainbench plan --simulate-gpu "
                             "GPU --json PLAN.json), set beside the run in summary.md; no plan is made on the "
                             "night's clock")
    parser.add_argument("--simulate-gpu", default=None, metavar="GPU",
                        help="rehearse on a simulated GPU (a fleet name or spec): cases collect and skip as on it, "
                             "nothing is measured")
    parser.add_argument("--seconds-from", default=None, metavar="RUN.json",
                        help="with --simulate-gpu: an earlier night's run of that GPU, which the plan's predicted "
                             "seconds per case come from (the summary then says which cases the budget fits)")
    parser.add_argument("--after", default=None, metavar="RUN.json",
                        help="an earlier night's run (its run.json): the cases it did not measure go first tonight, "
                             "those it measured after them, so that a second window goes to what the first did not "
                             "reach")
    parser.add_argument("--pytest-arg", action="append", default=[], metavar="ARG",
                        help="one more argument for every pytest session of the night (repeatable)")


def run(args: argparse.Namespace) -> int:
    try:
        if args.summarize:
            print(summarize_again(Path(args.out)))
            return 0
        if args.budget_s is None:
            raise NightError("--budget-s: required to run a night")
        return run_night(Path(args.out), args.budget_s, args.simulate_gpu, Path.cwd(),
                         pytest_args=tuple(args.pytest_arg), device=args.device,
                         archive=Path(args.archive) if args.archive else None,
                         plan=Path(args.plan) if args.plan else None,
                         seconds_from=Path(args.seconds_from) if args.seconds_from else None,
                         after=Path(args.after) if args.after else None)
    except NightError as e:
        print(f"trainbench night: {e}", file=sys.stderr)
        return 2

