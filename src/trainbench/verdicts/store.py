"""Saved runs: the one reader of run files and of what is in them (``SavedRun``: its cases as ``CaseRecord``s, the
device and profile that made it, its markers), and the one answer to "which saved run is the baseline, and why".

Runs are pytest-benchmark JSON files in its storage folder (``results/benchmarks/<machine id>/NNNN_name.json``);
runs of every device share a machine id's folder and are told apart by the device identity trainbench
records in their ``machine_info``. File names are matched as pytest-benchmark matches them
(``FileStorage.query``), so a name means the same run to both tools.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_benchmark.storage.file import FileStorage
from pytest_benchmark.utils import get_machine_id

from trainbench.devices.caps import comparable_device

# The plugin loads this module in every pytest session: the records (result, its statistics and numpy, ~60 ms of
# imports) load when a run is read (_result).
if TYPE_CHECKING:
    from trainbench.core.records.result import CaseRecord

# A run saved from a session that was interrupted (Ctrl-C, SIGTERM): kept, never a bare compare's baseline.
INCOMPLETE_KEY = "trainbench_incomplete"
# Cases that ended without a result (out of memory, a crash), with why: [{"case": ..., "error": ...}].
FAILED_CASES_KEY = "trainbench_failed_cases"
# A run measured with a fault planted on purpose (--trainbench-inject-*): {"slowdown": fraction, "leak_mib": MiB}.
# Kept, but never a baseline: a gate against it would call the next honest run an improvement.
PLANTED_KEY = "trainbench_planted_fault"
# A run measured with --trainbench-quick (only the passes its budgets name): kept, never a baseline or a calibration,
# whose every figure must be a whole measurement's.
QUICK_KEY = "trainbench_quick"
# The run's software beyond its device identity, once per run (not per case, and not in machine_info, whose every
# difference pytest-benchmark warns about): {"packages": {canonical name: version}}.
ENVIRONMENT_KEY = "trainbench_environment"
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


def packages_of(path: Path | str) -> dict[str, str] | None:
    """The installed packages the run file at ``path`` recorded (``SavedRun.packages``); None where it cannot be
    read (not a file: another storage's run; the gate names an unreadable baseline through its own reader)."""
    try:
        return SavedRun.load(path).packages
    except RunFileError:
        return None


def storage_folder(storage: str) -> Path | None:
    """pytest-benchmark's folder of this machine's runs (None: not a file storage, e.g. elasticsearch)."""
    if "://" in storage and not storage.startswith("file://"):
        return None
    return Path(storage.removeprefix("file://")) / get_machine_id()


def _query(storage: Path, machine: str, pattern: str) -> list[Path]:
    """pytest-benchmark's own matching (``FileStorage.query``): runs in ``storage``'s ``machine`` folder (a glob)
    whose file name matches ``pattern`` as --benchmark-compare reads it, in its order (run number, then folder)."""
    if not storage.is_dir():  # FileStorage would create it
        return []
    found = FileStorage(storage, logger=None, default_machine_id=machine).query(pattern)
    # query() answers resolved paths, and also matches files at the top of the storage: keep the machine folders'
    # runs, named under ``storage`` as the caller named it
    return [storage / path.parent.name / path.name for path in map(Path, found) if path.parent != storage.resolve()]


def matching_runs(folder: Path, name: str | bool | None = None) -> list[Path]:
    """The saved runs in ``folder`` whose file name matches ``name`` as ``--benchmark-compare=NAME`` reads it
    (a prefix or glob: ``0003``, ``*_baseline``; True or None: every run), oldest first."""
    return _query(folder.parent, folder.name, RUN_FILES if name in (None, True) else str(name))


def latest_run(runs_dir: Path | str = DEFAULT_RUNS_DIR, device_here: Callable[[], tuple] | None = None) -> Path:
    """The newest run saved on this machine under ``runs_dir`` (pytest-benchmark's storage: its folder for this
    machine), in pytest-benchmark's own order (the run number): never the file's modification time, which a
    checkout resets. Another machine's run is never taken for this one's: without a run of this machine, the
    error names the newest there is, to pass as RUN_JSON. ``device_here``: this session's comparable device
    (``device.comparable_device``): the newest run of that device, where one machine saved runs of several (a CPU
    run 0001 and a GPU run 0002 of one box), else an error naming the newest there is."""
    runs_dir = Path(runs_dir)
    machine = get_machine_id()
    mine = _query(runs_dir, machine, RUN_FILES)
    if mine and device_here is not None:
        here = device_here()
        for path in reversed(mine):
            run = _read_saved(path)
            if run.problem is None and run.comparable == here:
                return path
        raise RunFileError(runs_dir, f"no run of this {describe_device(here)} saved on this machine (the newest, "
                                     f"{mine[-1].name}, is of another device); pass the run to use as RUN_JSON")
    if mine:
        return mine[-1]
    others = _query(runs_dir, "*", RUN_FILES) or sorted(
        (p for p in runs_dir.rglob("*.json") if p.is_file()), key=lambda p: (p.name, str(p.parent)))
    if others:
        raise RunFileError(runs_dir, f"no run saved on this machine ({machine}); the newest of another is "
                                     f"{others[-1]}: pass it as RUN_JSON to use it")
    raise RunFileError(runs_dir, "no *.json run found; save one with pytest --benchmark-save=NAME "
                                 "or --benchmark-json=FILE, or pass RUN_JSON")


def describe_device(device: tuple) -> str:
    return f"{device[1]} ({', '.join(str(part) for part in (device[0], *device[2:]) if part)})"


@dataclass(frozen=True)
class Baseline:
    """The run a comparison uses, and why that one (a line of the summary)."""

    path: Path
    why: str


# What the summary says of a run pytest-benchmark chose itself (not a run trainbench made, or not file storage).
PYTEST_BENCHMARKS_CHOICE = "pytest-benchmark's own choice (not a run trainbench made)"


@dataclass(frozen=True)
class SavedRun:
    """A saved run (pytest-benchmark JSON) as every reader reads it: its trainbench cases as ``CaseRecord``s, the
    device and profile that made it, whether it is complete or carries a planted fault, its packages."""

    path: Path | str
    run: dict | None  # None: unreadable (``problem`` says why)
    problem: str | None = None
    names: tuple[str, ...] | None = None  # the benchmarks' names where they are keyed apart (``compared``)

    @classmethod
    def load(cls, path: Path | str) -> SavedRun:
        """The run file at ``path``; raises ``RunFileError`` where it is not a run."""
        return cls(Path(path), load_run(path))

    @classmethod
    def compared(cls, path: Path | str, benchmarks: dict) -> SavedRun:
        """The run pytest-benchmark loaded to compare with: its benchmarks by fullname (no machine info kept)."""
        return cls(path, {"benchmarks": list(benchmarks.values())}, names=tuple(benchmarks))

    # -- what made it ---------------------------------------------------------------------------------------------
    @property
    def device(self) -> dict | None:
        """The device identity trainbench recorded for the run: its machine info's, else its cases' (a run known
        only by its benchmarks, or whose machine info lost it) where every case recorded the same one; None:
        unreadable, a plain pytest-benchmark run, or a device that cannot be read (``device_problem`` says why)."""
        return self._device()[0]

    @property
    def device_problem(self) -> str | None:
        """Why the device of a run with trainbench cases cannot be read (None: it can, or the run has no cases):
        no identity in its machine info and a case without one, or cases that name different devices. Such a run is never
        a baseline: which device made it is what the device check needs."""
        return self._device()[1]

    def _device(self) -> tuple[dict | None, str | None]:
        if self.run is None:
            return None, None
        identity = self._machine_identity()
        recorded = [(name, info.get("device")) for name, info in self._records()]
        if "kind" in identity:  # what the session recorded for the whole run
            return {key: value for key, value in identity.items() if key != "doctor"}, None
        if not recorded:
            return None, None
        missing = next((name for name, d in recorded if not _identity(d)), None)
        if missing is not None:
            return None, (f"no device recorded: machine_info has no 'trainbench' entry and {missing} has no device "
                          "in its record; expected a run saved by trainbench (it records both)")
        devices = {_device_key(d): (name, d) for name, d in recorded}
        if len(devices) > 1:
            named = "; ".join(f"{name}: {_device_words(d)}" for name, d in devices.values())
            return None, f"no device in machine_info, and its cases name {len(devices)} devices ({named}): expected one"
        return recorded[0][1], None

    @property
    def doctor(self) -> dict | None:
        """How the run's machine was set up (``trainbench doctor``'s record, kept with its device identity)."""
        return self._machine_identity().get("doctor")

    def _machine_identity(self) -> dict:
        machine_info = self.run.get("machine_info") if self.run is not None else None
        identity = machine_info.get("trainbench") if isinstance(machine_info, dict) else None
        return identity if isinstance(identity, dict) else {}

    @property
    def comparable(self) -> tuple | None:
        """What another run's device must equal for the two to be compared (``device.comparable_device``)."""
        return comparable_device(self.device)

    @property
    def profile(self) -> str | None:
        """The profile(s) its cases ran with, joined (None: no case recorded one)."""
        return ", ".join(sorted({str(info["profile"]) for _, info in self._records() if info.get("profile")})) or None

    @property
    def commit(self) -> dict:
        commit = self.run.get("commit_info") if self.run is not None else None
        return commit if isinstance(commit, dict) else {}

    @property
    def saved_at(self) -> str | None:
        return self.run.get("datetime") if self.run is not None else None

    @property
    def packages(self) -> dict[str, str] | None:
        """The installed packages it recorded (name -> version), or None: a run saved before they were, or a plain
        pytest-benchmark run. A malformed record reads as none: it can only make a verdict say less."""
        environment = self.run.get(ENVIRONMENT_KEY) if self.run is not None else None
        packages = environment.get("packages") if isinstance(environment, dict) else None
        if not isinstance(packages, dict):
            return None
        return {str(name): str(version) for name, version in packages.items()}

    # -- its state ------------------------------------------------------------------------------------------------
    @property
    def complete(self) -> bool:
        return self.run is not None and not self.run.get(INCOMPLETE_KEY)

    @property
    def planted(self) -> dict | None:  # the fault planted in it on purpose, if any (a malformed mark counts)
        fault = self.run.get(PLANTED_KEY) if self.run is not None else None
        return (fault if isinstance(fault, dict) else {"unreadable": repr(fault)}) if fault else None

    @property
    def quick(self) -> bool:
        return bool(self.run is not None and self.run.get(QUICK_KEY))

    @property
    def marks_problem(self) -> str | None:
        """Why its interrupted or planted-fault mark cannot be read (None: absent or well formed): a mark that
        is neither is no proof that the run is complete, or honest."""
        if self.run is None:
            return None
        incomplete, fault = self.run.get(INCOMPLETE_KEY), self.run.get(PLANTED_KEY)
        for key in (INCOMPLETE_KEY, QUICK_KEY):
            if self.run.get(key) is not None and not isinstance(self.run.get(key), bool):
                return f"{key} = {self.run.get(key)!r}: expected true or false"
        if fault is not None and not (isinstance(fault, dict) and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in fault.values())):
            return f"{PLANTED_KEY} = {fault!r}: expected the planted fault (name -> amount)"
        return None

    def check(self) -> SavedRun:
        """This run read whole, as a baseline or calibration reads it: its marks, the device that made it, every
        trainbench record (``cases``), each benchmark once. Raises ``RunFileError`` naming the file, the case and
        the field where any of them cannot be read; found at start-up, never after a whole run."""
        records = _result()
        problem = self.problem or self.marks_problem or self.device_problem
        if problem:
            raise RunFileError(self.path, problem.removeprefix(f"{self.path}: "))
        try:
            self.cases()
            # a run trainbench made (its device in machine_info), or one with a case beside the benchmark
            has_cases = bool(self._records()) or bool(self._machine_identity())
            for name, bench in self._benchmarks():  # a record that lost its case id is still a broken trainbench record
                info = bench.get(_RECORD) if isinstance(bench, dict) else None
                # pytest-benchmark writes a dict for every benchmark ({} for a plain test beside trainbench's cases)
                lost = has_cases and not isinstance(info, dict)
                if lost or (isinstance(info, dict) and not (isinstance(info.get("case"), str) and info["case"])
                            and _TRAINBENCH_FIELDS & set(info)):
                    records.CaseRecord.read(info, f"{self.path}: {name}")
        except records.RecordError as e:
            raise RunFileError(self.path, str(e).removeprefix(f"{self.path}: ")) from None
        return self

    @property
    def measured_nothing(self) -> bool:
        """Every case failed: the run keeps them (``FAILED_CASES_KEY``) and no benchmark; never a baseline."""
        return self.run is not None and not self._benchmarks() and bool(self.failed_cases)

    @property
    def failed_cases(self) -> list[dict]:
        """Cases that ended without a result, with why: [{"case": ..., "error": ...}]."""
        failed = self.run.get(FAILED_CASES_KEY) if self.run is not None else None
        return [entry for entry in failed if isinstance(entry, dict)] if isinstance(failed, list) else []

    # -- its cases ------------------------------------------------------------------------------------------------
    @property
    def benchmark_count(self) -> int:
        return len(self._benchmarks())

    def _benchmarks(self) -> list[tuple[str, object]]:
        """(pytest-benchmark fullname, stored benchmark) of every benchmark, trainbench's or not."""
        benchmarks = self.run.get("benchmarks") if self.run is not None else None
        benchmarks = benchmarks if isinstance(benchmarks, list) else []
        if self.names is not None:
            return list(zip(self.names, benchmarks))
        return [(_name_of(bench) or f"benchmark {index}", bench) for index, bench in enumerate(benchmarks)]

    def _records(self) -> list[tuple[str, dict]]:
        """(fullname, stored record) of every trainbench case: a benchmark whose record names its case."""
        found = []
        for name, bench in self._benchmarks():
            info = bench.get(_RECORD) if isinstance(bench, dict) else None
            if isinstance(info, dict) and info.get("case"):
                found.append((name, info))
        return found

    def case_ids(self) -> dict[str, str]:
        """Every trainbench case, pytest-benchmark fullname -> case id, in the run's order."""
        return {name: str(info["case"]) for name, info in self._records()}

    def only(self, fullnames) -> SavedRun:
        """This run with only the benchmarks named ``fullnames``."""
        kept = [(name, bench) for name, bench in self._benchmarks() if name in fullnames]
        return SavedRun(self.path, {**self.run, "benchmarks": [bench for _, bench in kept]}, self.problem,
                        tuple(name for name, _ in kept))

    def cases(self, errors: list[str] | None = None, having: str | None = None) -> list[CaseRecord]:
        """Every trainbench case (``having``: whose record has that field, e.g. ``ladder``), read and checked
        (``CaseRecord.read``), in the run's order. A record that cannot be read raises ``RecordError`` naming the
        run and the case; with ``errors``, its message goes there instead and the case is left out."""
        records = _result()
        found, seen = [], {}
        for index, (name, info) in enumerate(self._records()):
            if name in seen:  # pytest-benchmark keys a run by fullname: the later entry would silently win
                twice = records.RecordError(f"{self.path}: {name}: in the run twice (its case records {seen[name]} and "
                                    f"{index}); expected each benchmark once: remove one")
                if errors is None:
                    raise twice
                errors.append(str(twice))
            seen.setdefault(name, index)
            if having is not None and info.get(having) is None:
                continue
            try:
                found.append(records.CaseRecord.read(info, f"{self.path}: {name}", fullname=name))
            except records.RecordError as e:
                if errors is None:
                    raise
                errors.append(str(e))
        return found

    def case(self, fullname: str) -> CaseRecord | None:
        """The benchmark named ``fullname``, read as a trainbench case (None: the run has no such benchmark); raises
        ``RecordError`` where it is not one or its record cannot be read."""
        for name, bench in self._benchmarks():
            if name == fullname:
                info = bench.get(_RECORD) if isinstance(bench, dict) else None
                return _result().CaseRecord.read(info if isinstance(info, dict) else {}, f"{self.path}: {name}", fullname=name)
        return None


def _result():
    """``core.records.result``, imported when a run is read."""
    from trainbench.core.records import result  # lazy: see the note on TYPE_CHECKING above

    return result


def _identity(device: object) -> bool:
    return isinstance(device, dict) and "kind" in device


def _device_key(device: dict) -> tuple:
    """What two identities of one run must share: the keys ``device.comparable_device`` compares (read here without
    loading torch), the CPU's kernels included on every device."""
    return tuple(json.dumps(device.get(key), sort_keys=True, default=repr) for key in ("kind", "name", "cpu_capability"))


def _device_words(device: dict) -> str:
    return f"{device.get('name')} ({', '.join(str(part) for part in (device.get('kind'), device.get('cpu_capability')) if part)})"


def _name_of(bench: object) -> str | None:
    return (bench.get("fullname") or bench.get("name")) if isinstance(bench, dict) else None


# Where pytest-benchmark keeps what a test adds to its benchmark, so where a case's record lives in a saved run.
_RECORD = "extra_info"
# Fields only a trainbench record has: a benchmark holding one is a trainbench case, whatever became of its case id.
_TRAINBENCH_FIELDS = {"case", "samples_per_step", "round_step_times_s"}


def record_case(benchmark, record: dict) -> None:
    """Keep ``record`` with the case's pytest-benchmark benchmark: it is saved with the run, where ``SavedRun``
    reads it back."""
    getattr(benchmark, _RECORD).update(record)


def _read_saved(path: Path) -> SavedRun:
    """A run as --benchmark-compare would load it: pytest-benchmark skips, with a warning, one whose benchmarks
    have no ``stats``, so that one is unreadable too."""
    try:
        run = load_run(path)
    except RunFileError as e:
        return SavedRun(path, None, str(e))
    for index, bench in enumerate(run["benchmarks"]):
        if not isinstance(bench, dict) or not isinstance(bench.get("stats"), dict):
            return SavedRun(path, None, f"{path}: {_name_of(bench) or f'benchmark {index}'}: no 'stats'; expected a "
                                        "pytest-benchmark JSON run")
    saved = SavedRun(path, run)
    # a run whose marks or device cannot be read is as unreadable as a truncated one: never passed over, never used
    problem = saved.marks_problem or saved.device_problem
    return SavedRun(path, None, f"{path}: {problem}") if problem else saved


class NoBaselineError(Exception):
    """No saved run can be this device's baseline; ``str()`` says what is there and how to make one."""


class UnusableBaselineError(NoBaselineError):
    """The run a compare names, or would take as the newest, cannot be a baseline (unreadable, interrupted, a
    wrong-typed record): it is never passed over for an older one, which would compare with the wrong code."""


def choose_baseline(storage: str, compare, device_here, gated: bool = False) -> Baseline | None:
    """The run ``--benchmark-compare[=NAME]`` compares with, and why: a file named by its path, else the newest
    complete run of this device among those the name matches (a bare compare: among all). None: leave the choice
    to pytest-benchmark (no comparison, not file storage, no run matches, a plain pytest-benchmark run).

    ``device_here``: a callable giving this session's comparable device (called only when needed: it may
    start the device). ``gated``: a trainbench gate, which passes over a newer plain pytest-benchmark run (it would
    compare nothing) for the newest run trainbench made; a session without one leaves it to pytest-benchmark. Raises UnusableBaselineError when the run it would take (or one newer) is unreadable or
    interrupted, or has a wrong-typed record; NoBaselineError when a NAME matches runs of other devices only.
    """
    if not compare or not storage:
        return None
    if compare is not True and Path(str(compare)).is_file():
        return _named_run(_read_saved(Path(str(compare))))
    if compare is not True and (Path(str(compare)).is_absolute() or "/" in str(compare)):
        # a path, not a name to match (pytest-benchmark's own query raised on an absolute one: an INTERNALERROR)
        raise UnusableBaselineError(f"{compare}: no such run file; expected a saved run's path, or the number or "
                                    "name of one in the storage (e.g. --benchmark-compare=0003)")
    folder = storage_folder(storage)
    if folder is None:
        return None
    runs = [_read_saved(path) for path in matching_runs(folder, compare)]
    if not runs:
        return None
    if runs[-1].problem:
        raise UnusableBaselineError(f"{runs[-1].problem}; it is the newest run {_matching(compare)}, and an older "
                                    "one would compare with other code: fix or remove it")
    if runs[-1].device is None and not (gated and any(run.device is not None for run in runs)):
        return None  # a plain pytest-benchmark run: its usual behaviour
    return _newest_of_device(runs, device_here(), folder, compare)


def _matching(compare) -> str:
    return "saved" if compare is True else f"matching {str(compare)!r}"


def _named_run(run: SavedRun) -> Baseline | None:
    """A run named by its path: used as it is, or refused (``unusable_as_baseline``); never replaced by another."""
    problem = unusable_as_baseline(run)
    if problem:
        raise UnusableBaselineError(problem)
    if run.comparable is None:
        return None
    return Baseline(run.path, "named by --benchmark-compare")


def unusable_as_baseline(run: SavedRun) -> str | None:
    """Why ``run`` can never be a baseline, one line naming its file (``SavedRun.check``: unreadable marks, device
    or records, a benchmark twice; interrupted; ``_refused``: a planted fault, every case failed), or None. For a run
    trainbench did not choose."""
    try:
        run.check()
    except RunFileError as e:
        return str(e)
    if not run.complete:
        return _interrupted(run.path)
    return _refused(run)


def _interrupted(path: Path, what: str = "an interrupted run") -> str:
    return (f"{path}: {what} ({INCOMPLETE_KEY}: its session was stopped before the end), never a baseline; "
            "compare with a complete run (--benchmark-compare=NNNN of one) or save one with --benchmark-save")


def _quick(run: SavedRun, what: str = "a baseline") -> str:
    return (f"{run.path}: a quick run ({QUICK_KEY}: --trainbench-quick measured only what its budgets named), never "
            f"{what}; use a run measured whole")


def not_a_calibration(run: SavedRun) -> str | None:
    """Why ``run``'s figures can never become budgets, one line naming its file (a planted fault, a quick run), or
    None. One stopped before the end may: its finished cases are whole measurements (``calibrate`` says so)."""
    if run.planted:
        return (f"{run.path}: a run measured with a fault planted on purpose ({PLANTED_KEY}: "
                + ", ".join(f"{name} {value}" for name, value in run.planted.items())
                + "), never calibrated from: its figures are the fault's; use a run saved without --trainbench-inject-*")
    if run.quick:
        return _quick(run, "calibrated from")
    return None


def _planted(run: SavedRun) -> str:
    fault = ", ".join(f"{name} {value}" for name, value in run.planted.items())
    return (f"{run.path}: a run measured with a fault planted on purpose ({PLANTED_KEY}: {fault}), never a "
            "baseline; compare with a run saved without --trainbench-inject-*")


def _refused(run: SavedRun) -> str | None:
    """Why a complete run is never a baseline (a planted fault, a quick run, every case failed), or None."""
    if run.planted:
        return _planted(run)
    if run.quick:
        return _quick(run)
    if run.measured_nothing:
        return (f"{run.path}: a run in which every case failed ({FAILED_CASES_KEY}, no benchmark), never a "
                "baseline; compare with a run that measured its cases")
    return None


def _newest_of_device(runs: list[SavedRun], mine: tuple, folder: Path, compare) -> Baseline | None:
    """The newest complete run of ``mine`` in ``runs`` (oldest first), with the newer ones passed over and why;
    an unreadable run newer than it may have been this device's newest, so it stops the choice."""
    passed: dict[str, list[str]] = {}
    newest_refused = None  # the newest complete run of this device that is never a baseline (``_refused``)
    for run in reversed(runs):
        if run.problem:
            raise UnusableBaselineError(f"{run.problem}; it is newer than every complete run of this device "
                                        f"{_matching(compare)}: fix or remove it")
        if run.comparable == mine and run.complete and not _refused(run):
            _check_records(run)
            why = f"the newest complete run of this {describe_device(mine)} {_matching(compare)} in {folder}"
            skipped = "; ".join(f"{what} {', '.join(names)}" for what, names in passed.items())
            return Baseline(run.path, why + (f" (passed over newer runs: {skipped})" if skipped else ""))
        if run.comparable is None:
            what = "not made by trainbench"
        elif run.comparable != mine:
            what = "of another device"
        elif not run.complete:
            what = "interrupted"
        else:
            what = ("with a planted fault" if run.planted else "quick (--trainbench-quick)" if run.quick else
                    "with every case failed")
            newest_refused = newest_refused or run
        passed.setdefault(what, []).append(run.path.name)
    if newest_refused is not None and "interrupted" not in passed:
        raise UnusableBaselineError(f"{_refused(newest_refused)}; so is every complete run of this "
                                    f"{describe_device(mine)} {_matching(compare)}")
    if "interrupted" in passed:
        raise UnusableBaselineError(_interrupted(
            folder / passed["interrupted"][0],
            f"interrupted, as is every run of this {describe_device(mine)} {_matching(compare)}"))
    if compare is not True:
        others = sorted({describe_device(run.comparable) for run in runs if run.comparable})
        raise NoBaselineError(
            f"no complete run of this {describe_device(mine)} among the {len(runs)} in {folder} matching "
            f"{str(compare)!r} (runs of: {'; '.join(others)}); save one on this machine with --benchmark-save "
            "(make baseline) and commit it")
    return None  # only other devices' runs: pytest-benchmark loads the newest and the device check refuses it


def _check_records(run: SavedRun) -> None:
    """The chosen run reads whole as the gate will read it (``SavedRun.check``): a wrong-typed record found at the
    end would have cost the whole run."""
    try:
        run.check()
    except RunFileError as e:
        raise UnusableBaselineError(str(e)) from None


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
