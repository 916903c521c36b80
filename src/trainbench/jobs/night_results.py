"""What the night's sessions left: each case's outcome in their JUnit reports, and the run they saved (whole, or
as it stood after the last finished case of a session that was killed)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from xml.etree import ElementTree

from trainbench.core.harness.costs import TOTAL
from trainbench.core.harness.files import write_json_atomic
from trainbench.verdicts.store import RunFileError, SavedRun


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


def has_ladder_rungs(run_path: Path) -> bool:
    try:
        return any(record.ladder for record in SavedRun.load(run_path).cases(errors=[]))
    except RunFileError:
        return False


def night_results(out: Path) -> tuple[SavedRun | None, dict[str, dict], dict[str, CaseOutcomeLine]]:
    """The night's run (None: a rehearsal, a night that measured nothing), its cases' figures, and each case's
    pytest outcome from the sessions' JUnit reports."""
    try:
        run = SavedRun.load(out / "run.json")
    except RunFileError:
        run = None
    reported = {}
    for xml in sorted((out / "groups").glob("[0-9][0-9]-*.xml")) + [out / "groups" / "cases.xml"]:
        reported.update({c.case: c for c in junit_cases(xml)})
    return run, measured_cases(run), reported


def measured_cases(run: SavedRun | None) -> dict[str, dict]:
    """The metrics of each case the night's run measured (a record that cannot be read: left out)."""
    if run is None:
        return {}
    # beside the metrics, the case's own seconds (its cost ledger's total), for a case the JUnit report missed
    return {record.case: {**record.metrics, "case_seconds": record.phase_seconds.get(TOTAL)}
            for record in run.cases(errors=[])}
