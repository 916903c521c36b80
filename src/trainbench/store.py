"""Saved runs: the one reader of run files, and the one answer to "which saved run is the baseline, and why".

Runs are pytest-benchmark JSON files in its storage folder (``results/benchmarks/<machine id>/NNNN_name.json``);
runs of every device share a machine id's folder and are told apart by the device identity trainbench
records in their ``machine_info``. File names are matched as pytest-benchmark matches them
(``FileStorage.query``), so a name means the same run to both tools.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

# A run saved from a session that was interrupted (Ctrl-C, SIGTERM): kept, never a bare compare's baseline.
INCOMPLETE_KEY = "trainbench_incomplete"
RUN_FILES = "[0-9][0-9][0-9][0-9]_"  # pytest-benchmark's NNNN_ prefix of a saved run
DEFAULT_RUNS_DIR = Path("results/benchmarks")  # pytest-benchmark's storage, as pyproject.toml sets it


class RunFileError(Exception):
    """A run file that cannot be used; ``str()`` names the file and what was expected."""

    def __init__(self, path: Path | str, problem: str):
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


def load_run(path: Path | str) -> dict:
    """A pytest-benchmark JSON run, checked for the shape every reader needs (a ``benchmarks`` list)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RunFileError(path, "no such file; expected a pytest-benchmark JSON run") from None
    except (OSError, UnicodeDecodeError) as e:
        raise RunFileError(path, f"cannot read it ({e})") from None
    if not text.strip():
        raise RunFileError(path, "empty file; expected a pytest-benchmark JSON run (--benchmark-save)")
    try:
        run = json.loads(text)
    except json.JSONDecodeError as e:
        raise RunFileError(path, f"invalid JSON ({e}; truncated?); expected a pytest-benchmark JSON run") from None
    if not isinstance(run, dict) or not isinstance(run.get("benchmarks"), list):
        raise RunFileError(path, "no 'benchmarks' list; expected a pytest-benchmark JSON run "
                                 "(--benchmark-json or --benchmark-save)")
    return run


def storage_folder(storage: str) -> Path | None:
    """pytest-benchmark's folder of this machine's runs (None: not a file storage, e.g. elasticsearch)."""
    if "://" in storage and not storage.startswith("file://"):
        return None
    from pytest_benchmark.utils import get_machine_id

    return Path(storage.removeprefix("file://")) / get_machine_id()


def _query(storage: Path, machine: str, pattern: str) -> list[Path]:
    """pytest-benchmark's own matching (``FileStorage.query``): runs in ``storage``'s ``machine`` folder (a glob)
    whose file name matches ``pattern`` as --benchmark-compare reads it, in its order (run number, then folder)."""
    if not storage.is_dir():  # FileStorage would create it
        return []
    from pytest_benchmark.storage.file import FileStorage

    found = FileStorage(storage, logger=None, default_machine_id=machine).query(pattern)
    # query() answers resolved paths, and also matches files at the top of the storage: keep the machine folders'
    # runs, named under ``storage`` as the caller named it
    return [storage / path.parent.name / path.name for path in map(Path, found) if path.parent != storage.resolve()]


def matching_runs(folder: Path, name: str | bool | None = None) -> list[Path]:
    """The saved runs in ``folder`` whose file name matches ``name`` as ``--benchmark-compare=NAME`` reads it
    (a prefix or glob: ``0003``, ``*_baseline``; True or None: every run), oldest first."""
    return _query(folder.parent, folder.name, RUN_FILES if name in (None, True) else str(name))


def latest_run(runs_dir: Path | str = DEFAULT_RUNS_DIR) -> Path:
    """The newest saved run under ``runs_dir`` (pytest-benchmark's storage), in pytest-benchmark's own order
    (run number, then machine folder): never the file's modification time, which a checkout resets."""
    runs_dir = Path(runs_dir)
    runs = _query(runs_dir, "*", RUN_FILES)
    if not runs:
        runs = sorted((p for p in runs_dir.rglob("*.json") if p.is_file()), key=lambda p: (p.name, str(p.parent)))
    if not runs:
        raise RunFileError(runs_dir, "no *.json run found; save one with pytest --benchmark-save=NAME "
                                     "or --benchmark-json=FILE, or pass RUN_JSON")
    return runs[-1]


def device_of(run: dict) -> tuple | None:
    """The comparable device identity trainbench recorded in a run (None: a plain pytest-benchmark run)."""
    from .device import comparable_device

    return comparable_device((run.get("machine_info") or {}).get("trainbench"))


def describe_device(device: tuple) -> str:
    return f"{device[1]} ({', '.join(str(part) for part in (device[0], *device[2:]) if part)})"


@dataclass(frozen=True)
class SavedRun:
    path: Path
    device: tuple | None  # None: unreadable, or not made by trainbench
    complete: bool


def _read_saved(path: Path) -> SavedRun:
    try:
        run = load_run(path)
    except RunFileError:
        return SavedRun(path, None, True)  # pytest-benchmark reports an unreadable run itself
    return SavedRun(path, device_of(run), not run.get(INCOMPLETE_KEY))


class NoBaselineError(Exception):
    """No saved run can be this device's baseline; ``str()`` says what is there and how to make one."""


def choose_baseline(storage: str, compare, device_here) -> Path | None:
    """The run ``--benchmark-compare[=NAME]`` compares with, when trainbench must choose: the newest complete
    run of this device among those the name matches (a bare compare: among all). None: leave the choice to
    pytest-benchmark (no comparison, a named file, not file storage, plain pytest-benchmark runs).

    ``device_here``: a callable giving this session's comparable device (called only when needed: it may
    start the device). Raises NoBaselineError when a NAME matches runs of other devices only.
    """
    if not compare or not storage or (compare is not True and ("/" in str(compare) or Path(str(compare)).is_file())):
        return None
    folder = storage_folder(storage)
    if folder is None:
        return None
    runs = [_read_saved(path) for path in matching_runs(folder, compare)]
    if not runs or runs[-1].device is None:
        return None
    mine = device_here()
    if runs[-1].device == mine and runs[-1].complete and compare is True:
        return None  # pytest-benchmark's own choice is the right one
    same_device = [run.path for run in runs if run.device == mine and run.complete]
    if same_device:
        return same_device[-1]
    if compare is not True:
        others = sorted({describe_device(run.device) for run in runs if run.device})
        raise NoBaselineError(
            f"no complete run of this {describe_device(mine)} among the {len(runs)} in {folder} matching "
            f"{str(compare)!r} (runs of: {'; '.join(others)}); save one on this machine with --benchmark-save "
            "(make baseline) and commit it")
    return None


def why_no_baseline(storage: str, compare) -> str:
    """What is wrong with the runs ``--benchmark-compare`` would have loaded, one line."""
    folder = storage_folder(storage)
    if folder is None:
        return f"{storage} returned no run{'' if compare is True else f' matching {compare!r}'}"
    runs = matching_runs(folder, compare)
    if compare is True:
        runs = runs[-1:]
    if not runs:
        what = "no saved runs" if compare is True else f"no saved run matching {compare!r}"
        return f"{folder}: {what}; save one first with --benchmark-save=NAME on the baseline code"
    problems = []
    for path in runs:
        try:
            load_run(path)
        except RunFileError as e:
            problems.append(str(e))
    return "; ".join(problems) or f"{runs[-1]}: pytest-benchmark could not load it"
