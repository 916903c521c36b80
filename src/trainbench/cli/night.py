"""The GPU night: one command that spends a short GPU window measuring, within a time budget, writing as it goes.

``python -m trainbench night --budget-s SECONDS --out DIR`` runs, each step a child process of the interpreter it
was started with (nothing installed, no network): the doctor, the GPU self-checks (``smoke/``), the suite's
cases in groups ordered by what they tell (``CASE_GROUPS``), then the run those groups saved (merged), its
device's calibrated budgets section (a diff), the ladder report, the simulated plan of the same GPU, and
``summary.md``, which sets the run beside that plan. ``--simulate-gpu`` rehearses it on any machine: the cases
collect and skip as that GPU would, and nothing is measured.

Every step has a deadline inside the budget: measuring steps end ``FINISH_RESERVE_S`` before it, so that the
run is always merged and summarized; a step that cannot start in time is recorded as not started, one that runs
past its deadline is stopped (SIGTERM: a pytest session saves what it measured, marked incomplete), and the
manifest ``night.json`` is rewritten after every step. Killed at any point, what finished is on disk.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from xml.etree import ElementTree

from trainbench.core.files import cannot_write, write_json_atomic, write_text_atomic
from trainbench.verdicts.render import Column, Table, number
from trainbench.verdicts.store import RunFileError, SavedRun, merged_run

SUITE_FILE = "benchmarks/test_recipes.py"
# Time kept back from the measuring steps for merging, calibrating, reporting, planning and the summary.
FINISH_RESERVE_S = 60.0
# A step that would have less than this left is not started: it could not finish anything worth keeping.
MIN_STEP_S = 10.0
# pytest's exit status when its arguments selected nothing (the night's -k left a group empty): not a failure.
NO_TESTS_COLLECTED = 5
# After SIGTERM, how long a step may take to save what it measured before it is killed.
TERM_GRACE_S = 15.0


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
    CaseGroup("ladders", "the seeds' two ladders, rung by rung (torch.compile included)", None, slow=True,
              ladders=True),
    CaseGroup("rest", "every other case of the suite", None, slow=True),
)


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

    def to_json(self) -> dict:
        return {"budget_s": self.budget_s, "simulate_gpu": self.simulate_gpu, "python": self.python,
                "finished": self.finished, "interrupted": self.interrupted,
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


def check_start(out: Path, budget_s: float, root: Path, simulate_gpu: str | None = None) -> None:
    """Refuse at start-up what would only fail later: no suite here, an output folder that cannot be written, a
    budget too short to measure anything, a GPU to simulate that cannot be."""
    from trainbench.devices.fleet import GpuSpecError, parse_gpu

    if simulate_gpu is not None:
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
    if budget_s < least:
        raise NightError(f"--budget-s {budget_s:g}: too short; expected at least {least:g} s")
    if out.exists() and not out.is_dir():
        raise NightError(f"--out {out}: not a folder")
    out.mkdir(parents=True, exist_ok=True)
    problem = cannot_write(out)
    if problem:
        raise NightError(f"--out {out}: {problem}")


def least_budget_s(simulated: bool) -> float:
    """The least ``--budget-s`` a night accepts: two steps of ``MIN_STEP_S`` to measure in before its
    ``finish_reserve`` (45 s for a night on a GPU, 40 s for a rehearsal)."""
    budget = 2 * MIN_STEP_S
    while budget - finish_reserve(budget, simulated) < 2 * MIN_STEP_S:  # the reserve grows with the budget, slower
        budget = 2 * MIN_STEP_S + finish_reserve(budget, simulated)
    return budget


def finish_reserve(budget_s: float, simulated: bool) -> float:
    """Seconds kept back from measuring: for merging, calibrating, reporting and planning (a quarter of a short
    budget), or on a rehearsal, which has only its summary to write, for a stopped step to end."""
    if simulated:
        return TERM_GRACE_S + 5.0
    return max(min(FINISH_RESERVE_S, budget_s / 4), TERM_GRACE_S + MIN_STEP_S)


def _plugin_installed() -> bool:
    from importlib.metadata import entry_points

    return any(entry.name == "trainbench" for entry in entry_points(group="pytest11"))


def suite_node_ids(group: CaseGroup, taken: set[str]) -> list[str]:
    """The pytest node ids of ``group``'s cases in its order (``taken``: ids earlier groups ran, updated)."""
    from trainbench.core.cases import ladder_cases, recipe_cases

    if group.ladders:
        ids = [case.id for case in ladder_cases()]
        test = "test_ladder"
    else:
        ids = list(group.cases) if group.cases is not None else [case.id for case in recipe_cases()]
        test = "test_recipe"
    ids = [i for i in ids if i not in taken]
    taken.update(ids)
    return [f"{SUITE_FILE}::{test}[{case}]" for case in ids]


def subprocess_runner(clock: Callable[[], float] = time.monotonic, env: dict[str, str] | None = None) -> StepRunner:
    """Run a step as a child process in its own process group, its output into its log; stopped at the deadline.
    ``env``: variables the children get beside this process's."""

    def run(argv: list[str], log: Path, deadline: float) -> StepOutcome:
        env_here = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
        with open(log, "wb") as out:
            child = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env_here,
                                     start_new_session=True)
            try:
                return _wait(child, deadline, clock)
            except BaseException:
                _stop(child)
                raise

    return run


def _wait(child: subprocess.Popen, deadline: float, clock: Callable[[], float]) -> StepOutcome:
    while True:
        left = deadline - clock()
        try:
            return StepOutcome(child.wait(timeout=max(0.05, min(left, 1.0))))
        except subprocess.TimeoutExpired:
            if clock() >= deadline:
                return StepOutcome(_stop(child), stopped=True)


def _stop(child: subprocess.Popen) -> int:
    """SIGTERM to the step's process group (pytest saves what it measured), SIGKILL after ``TERM_GRACE_S``."""
    for sig, wait in ((signal.SIGTERM, TERM_GRACE_S), (signal.SIGKILL, None)):
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
                 say: Callable[[str], None] = print, pytest_args: tuple[str, ...] = ()):
        self.night, self.root, self.runner, self.clock, self.say = night, root, runner, clock, say
        self.pytest_args = pytest_args
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
        outcome = self.runner(argv, self.out / step.log, deadline)
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
                  ("--trainbench-device=cuda",))
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
            self.say("night: interrupted; merging and summarizing what finished")
        self._finish()
        night.finished = True
        night.save()
        failed = [s.name for s in night.steps if s.status == "failed"]
        missing = [s.name for s in night.steps if s.status in ("not started", "stopped")]
        used = self.clock() - night.started
        if night.interrupted:  # the steps after the one it stopped were never tried: not "complete"
            verdict = "INTERRUPTED" + (": " + ", ".join(failed) + " failed" if failed else "")
        elif failed:
            verdict = "FAILED: " + ", ".join(failed)
        else:
            verdict = "PARTIAL: " + ", ".join(missing) + " did not finish in the budget" if missing else "complete"
        self.say(f"night: {verdict}; {used:.0f} s of {night.budget_s:.0f}; {self.out / 'summary.md'}")
        return 1 if failed or night.interrupted else 0

    def _measure(self, deadline: float) -> None:
        simulate = ("--simulate-gpu", self.night.simulate_gpu) if self.night.simulate_gpu else ("--expect-cuda",)
        self.run_step("doctor", "this machine before a run (CUDA, driver, memory, timing distortions)",
                      self.trainbench("doctor", *simulate, "--json", str(self.out / "doctor.json")), deadline)
        if self.night.simulate_gpu:  # a rehearsal's plan is its measurement, and predicts what its sessions ask
            self._plan(self.night.simulate_gpu, deadline)
        why = "self-checks of the measurement on this GPU (make gpu-smoke)"
        if self.night.simulate_gpu:
            self.skip_step("smoke", why, "the self-checks measure: nothing runs on a simulated GPU")
        else:
            report = self.out / "groups" / "smoke.xml"
            step = self.run_step("smoke", why, self.pytest("smoke", "--junitxml", str(report)), deadline)
            checked = junit_cases(report)
            if step.status == "ok" and checked and all(c.outcome == "skipped" for c in checked):
                # pytest passes a session that skipped everything: the night checked nothing, and says so
                step.status, step.note = "failed", f"every self-check skipped: {checked[0].message}"
                self.night.save()
                self.say(f"night: smoke: failed: {step.note}")
        taken: set[str] = set()
        for position, group in enumerate(CASE_GROUPS, 1):
            stem = f"{position:02d}-{group.name}"
            node_ids = suite_node_ids(group, taken)
            extra = ("--trainbench-slow",) if group.slow else ()
            self.run_step(f"cases-{stem}", f"{len(node_ids)} cases: {group.why}",
                          self.pytest(*extra, "--benchmark-json", str(self.out / "groups" / f"{stem}.json"),
                                      "--junitxml", str(self.out / "groups" / f"{stem}.xml"), *node_ids), deadline)

    def _plan(self, gpu: str, deadline: float) -> None:
        self.run_step("plan", f"the simulated plan of {gpu}, to set beside the run",
                      self.trainbench("plan", "--simulate-gpu", gpu, "--json", str(self.out / "plan.json")), deadline)

    def _finish(self) -> None:
        end = self.end - TERM_GRACE_S  # a step stopped at its deadline may take this long to end
        run_path = self.out / "run.json"
        why = "the groups' runs merged into one pytest-benchmark run"
        if self.night.simulate_gpu:
            merge = self.skip_step("run", why, "nothing is measured on a simulated GPU")
        else:
            merge = self.in_process("run", why, lambda: merge_runs(
                sorted((self.out / "groups").glob("[0-9][0-9]-*.json")), run_path))
        if merge.status == "ok" and run_path.exists():
            self.run_step("calibrate", "this GPU's budgets section calibrated from the run (a diff, not written)",
                          self.trainbench("calibrate", str(run_path), "--budgets",
                                          str(self.root / "benchmarks" / "budgets.toml")), end)
            self.run_step("report", "the ladder report of the run",
                          self.trainbench("report", str(run_path), "--out", str(self.out / "report")), end)
        if not self.night.simulate_gpu:  # on a GPU the plan takes no GPU time from the cases: planned last
            gpu = _recorded_gpu(run_path)
            if gpu:
                self._plan(gpu, end)
            else:
                self.skip_step("plan", "the simulated plan of this GPU", "no run names a GPU to plan for")
        self.in_process("summary", "summary.md: the run beside the plan",
                        lambda: write_summary(self.night, self.out))


def _tail(path: Path, lines: int) -> list[str]:
    try:
        return path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
    except OSError:
        return []


def merge_runs(parts: list[Path], out: Path) -> str:
    """The groups' pytest-benchmark runs as one run at ``out`` (the first's machine and commit info, every case,
    incomplete if any part is). A part that cannot be read is left out and named."""
    runs, unreadable = [], []
    for part in parts:
        try:
            runs.append(SavedRun.load(part))
        except RunFileError as e:
            unreadable.append(str(e))
    if not runs:
        raise ValueError("no group saved a run" + (f" ({'; '.join(unreadable)})" if unreadable else ""))
    merged = merged_run(runs, incomplete=bool(unreadable))
    write_json_atomic(out, merged)
    note = f"{sum(run.benchmark_count for run in runs)} cases from {len(runs)} group(s)"
    return note + (f"; left out: {'; '.join(unreadable)}" if unreadable else "")


def _recorded_gpu(run_path: Path) -> str | None:
    """The GPU the run was measured on, by name (None: no run, or a CPU run)."""
    from trainbench.devices.device import DeviceCaps

    try:
        device = SavedRun.load(run_path).device or {}
    except RunFileError:
        return None
    return device.get("name") if DeviceCaps.from_identity(device).cuda and device.get("name") else None


# -- the summary -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class CaseOutcomeLine:
    """A case as one pytest session reported it (its JUnit XML)."""

    case: str
    outcome: str  # passed, failed, error, skipped
    message: str = ""


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
        found.append(CaseOutcomeLine(case, outcome, message))
    return found


def write_summary(night: Night, out: Path) -> str:
    lines = summary_lines(night, out)
    write_text_atomic(out / "summary.md", "\n".join(lines) + "\n")
    return f"{len(lines)} lines"


def summary_lines(night: Night, out: Path) -> list[str]:
    """summary.md: the steps, then each case as the plan saw it and as the night found it, and what differed."""
    plan = _read_json(out / "plan.json")
    measured = _measured_cases(out / "run.json")
    reported = {}
    for xml in sorted((out / "groups").glob("[0-9][0-9]-*.xml")):
        reported.update({c.case: c for c in junit_cases(xml)})
    gpu = (plan or {}).get("gpu", {}).get("name") or night.simulate_gpu or "this GPU"
    kind = "simulated: nothing measured" if night.simulate_gpu else "measured"
    lines = [f"# GPU night: {gpu} ({kind})", "",
             f"Budget {night.budget_s:g} s; python {night.python}."
             + (" Interrupted." if night.interrupted else ""), "", "## Steps", ""]
    lines += _table(("step", "status", "s", "note"),
                    [(s.name, s.status, "" if s.seconds is None else f"{s.seconds:.0f}", s.note or s.why)
                     for s in night.steps if s.name != "summary"])  # this file, being written
    from trainbench.core.roofline import versus_measured

    planned = {c["case"]: c for c in (plan or {}).get("cases", [])}
    rows, differs, bounds = [], [], []
    for case in dict.fromkeys([*planned, *reported, *measured]):
        p, r, m = planned.get(case), reported.get(case), measured.get(case)
        plan_text = ("-" if p is None else f"skip: {p['skipped']}" if p.get("skipped") else
                     f"PROBLEM: {p['problem']}" if p.get("problem") else "run")
        night_text = ("not reached" if r is None else "would run (simulated)" if _would_run(r) else
                      r.outcome + (f": {r.message}" if r.message else ""))
        predicted = p.get("needed_mib") if p else None
        peak = m.get("peak_memory_mib") if m else None
        speed = m.get("samples_per_s") if m else None
        roofline = (p or {}).get("roofline") or ""
        rows.append((case, plan_text, night_text, roofline, *(number(v, ".1f" if isinstance(v, float) else "")
                                                               for v in (speed, peak, predicted))))
        difference = _difference(p, r, peak, predicted)
        if difference:
            differs.append(f"- {case}: {difference}")
        step_ms, bound_s = (m or {}).get("step_time_ms"), (p or {}).get("bound_s")
        if step_ms and bound_s:
            bounds.append(f"- {case}: {versus_measured(bound_s, step_ms / 1000)}")
    lines += ["", "## Cases", "",
              "Plan: `python -m trainbench plan --simulate-gpu` of the same GPU (roofline: what bounds its step and "
              "the bound; predicted MiB: its tensor peak with the memory gate's headroom); night: the pytest outcome "
              "of the case.", ""]
    lines += _table(("case", "plan", "night", "roofline", "samples/s", "peak MiB", "predicted MiB"), rows,
                    text_columns=4)
    lines += ["", "## What differed from the plan", ""] + (differs or ["- nothing"])
    if bounds:
        lines += ["", "## Measured steps against the roofline's bound", ""] + bounds
    if plan is None:
        lines += ["", "No plan was made (see the plan step): nothing to compare with."]
    return lines


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


def _measured_cases(run_path: Path) -> dict[str, dict]:
    """The metrics of each case the night's run measured (a record that cannot be read: left out)."""
    try:
        run = SavedRun.load(run_path)
    except RunFileError:
        return {}
    return {record.case: record.metrics for record in run.cases(errors=[])}


def _read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def child_environment(out: Path, simulate_gpu: str | None) -> dict[str, str]:
    """What the night's steps get beside this process's environment."""
    from trainbench.core.predict import SharedPredictions

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
                      interrupted=bool(manifest.get("interrupted")))
    except (KeyError, TypeError, ValueError) as e:
        raise NightError(f"{out / 'night.json'}: not a night's manifest ({e})") from None
    write_summary(night, out)
    return out / "summary.md"


def run_night(out: Path, budget_s: float, simulate_gpu: str | None, root: Path, python: str = sys.executable,
              runner: StepRunner | None = None, clock: Callable[[], float] = time.monotonic,
              say: Callable[[str], None] = print, pytest_args: tuple[str, ...] = ()) -> int:
    """The night, start to end; its exit status (0: every step that ran passed)."""
    check_start(out, budget_s, root, simulate_gpu)
    night = Night(out, budget_s, simulate_gpu, python)
    runner = runner or subprocess_runner(clock, child_environment(out, simulate_gpu))
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        return NightRun(night, root, runner, clock, say, pytest_args).run()
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


# The subcommand: ``python -m trainbench night``.
NAME = "night"
HELP = "the GPU night: doctor, self-checks, the cases by what they tell, calibration, report, summary"
DESCRIPTION = ("Spend a GPU window measuring, within --budget-s, writing into --out as it goes: the doctor "
               "(doctor.json), the GPU self-checks (smoke/), the suite's cases in groups ordered by what they "
               "tell, the merged run (run.json), its device's budgets section calibrated (a diff), the ladder "
               "report, the simulated plan of the same GPU (plan.json) and summary.md beside it. Each step is a "
               "child process of this interpreter: nothing is installed, nothing is fetched. Exit 1 when a "
               "step failed, 2 when the night cannot start.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--budget-s", type=float, default=None, metavar="SECONDS",
                        help="wall time for the whole night; measuring stops early enough to merge and summarize")
    parser.add_argument("--summarize", action="store_true",
                        help="run nothing: rewrite DIR/summary.md from what the folder holds now (e.g. a plan.json "
                             "made afterwards with plan --simulate-gpu GPU --json DIR/plan.json)")
    parser.add_argument("--out", required=True, metavar="DIR", help="the night's folder (night.json, logs/, ...)")
    parser.add_argument("--simulate-gpu", default=None, metavar="GPU",
                        help="rehearse on a simulated GPU (a fleet name or spec): cases collect and skip as on it, "
                             "nothing is measured")
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
                         pytest_args=tuple(args.pytest_arg))
    except NightError as e:
        print(f"trainbench night: {e}", file=sys.stderr)
        return 2

