"""What a night refuses at start-up rather than fail at later: each in one line that names the option."""

from __future__ import annotations

import math
import sys
from importlib.metadata import entry_points
from pathlib import Path

from trainbench.core.harness.files import cannot_write
from trainbench.devices.fleet import GpuSpecError, parse_gpu
from trainbench.jobs.night_manifest import NightError
from trainbench.jobs.night_plan import PlanFileError, read_plan, seconds_source
from trainbench.jobs.night_schedule import SUITE_FILE, least_budget_s
from trainbench.verdicts.store import RunFileError, SavedRun

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
    try:
        seconds_source(path, parse_gpu(simulate_gpu))
    except RunFileError as e:
        raise NightError(f"--seconds-from: {e}") from None


def _check_plan(plan: Path) -> None:
    try:
        read_plan(plan)
    except PlanFileError as e:
        raise NightError(f"--plan {e}") from None


def _plugin_installed() -> bool:
    return any(entry.name == "trainbench" for entry in entry_points(group="pytest11"))


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
