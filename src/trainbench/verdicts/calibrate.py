"""Calibration: budgets for this device from a measured run, with a stated margin.

``python -m trainbench calibrate [RUN_JSON]`` turns every case of a saved run into budget keys for the run's device
section (``cpu``, or the GPU's name): each calibrated signal gets ``max_<metric> = measured x (1 + margin)`` with its
kind's margin from the metric table (``Metric.calibration_margin``: deterministic signals none, so their bound is what
was measured; GPU allocator peaks and kernel counts 10%) unless the caller names one margin for all, a count of
things (ops, syncs, calls, kernels) rounded up to a whole number; and the same-session speed-up, where it was paired
(the case's rounds interleaved with its baseline's), ``min_speedup = measured x (1 - speed_margin)``. A case whose correctness guard failed gives no
budget: it did not train what its baseline trains, so its numbers promise nothing. Keys it does not calibrate
(notes, hand-written ratios, ``compare_fail``) are kept; other devices' sections are never touched. Each case goes
to the budgets file the caller names for it (the command line: the one the plugin finds for the case's test
file). It shows a unified diff and writes only when asked, atomically, after checking that each result still
parses as a budgets file.
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trainbench.core.records.budgets import BudgetError, Budgets, tomllib
from trainbench.core.harness.files import write_text_atomic
from trainbench.core.records.metrics import CALIBRATION_MARGINS, METRICS, calibrated_metrics
from trainbench.core.records.result import CaseRecord, RecordError
from trainbench.devices.caps import DeviceCaps
from trainbench.verdicts.store import INCOMPLETE_KEY, RunFileError, SavedRun, not_a_calibration


class CalibrationError(ValueError):
    """A run or budgets file calibration cannot use; the message names the file and the problem."""


@dataclass(frozen=True)
class FileChange:
    """One budgets file as calibration would leave it."""

    path: Path
    cases: tuple[str, ...]  # the cases calibrated into it
    diff: str  # unified diff of the file; empty when nothing changes
    new_text: str


@dataclass(frozen=True)
class Calibration:
    device_key: str
    files: tuple[FileChange, ...]
    left_out: tuple[str, ...] = ()  # cases of the run that gave no budget, and why
    unpaired: tuple[str, ...] = ()  # cases whose speed-up was timed apart from their baseline: no min_speedup
    margin: float | None = None  # the caller's one margin for every signal; None: each kind's (CALIBRATION_MARGINS)
    stopped: str | None = None  # the run was stopped before its end (a night's deadline): said, its cases calibrated

    @property
    def margins(self) -> str:
        """The headroom each kind of signal got, as the command line says it."""
        if self.margin is not None:
            return f"{self.margin:.0%} over every calibrated signal (--margin)"
        return ", ".join(f"{kind} {margin:.0%}" + (" (bounds at what was measured)" if margin == 0 else "")
                         for kind, margin in CALIBRATION_MARGINS.items())

    @property
    def cases(self) -> int:
        return sum(len(change.cases) for change in self.files)

    @property
    def diff(self) -> str:
        return "".join(change.diff for change in self.files)


def device_key_of(device: dict) -> str:
    """The budgets section a run's device belongs to, its most specific: ``cpu``, or the GPU's full name."""
    caps = DeviceCaps.from_identity(device)
    if not device.get("kind") or caps.cuda and not device.get("name"):
        raise CalibrationError("the run names no device (machine_info['trainbench'] is missing)")
    return caps.budget_keys[0]


def _round_up(value: float) -> float | int:
    """Up to 4 significant digits (integers stay integers), so a bound never sits below what was measured."""
    if value == 0:
        return 0
    if float(value).is_integer() and abs(value) >= 1:
        return int(value)
    scale = 10 ** (3 - math.floor(math.log10(abs(value))))
    rounded = math.ceil(value * scale - 1e-9) / scale  # 49 x 1.1 is 53.900000000000006: still 53.9
    return int(rounded) if rounded.is_integer() else rounded


def _round_down(value: float) -> float:
    return math.floor(value * 100 + 1e-9) / 100  # 1.4 x 0.7 is 0.97999...: not a reason to drop a step


def max_bound(metric: str, value: float, margin: float) -> float | int:
    """The ceiling calibration writes for ``metric`` measured at ``value`` with ``margin``: a count of things rounded
    up to a whole number; with no margin the value itself (rounding would let a change below it through); else
    rounded up to 4 significant digits. A value <= 0 (memory freed per step) gives 0, never a negative bound."""
    bound = max(0.0, value * (1 + margin))
    if METRICS[metric].count:
        return math.ceil(round(bound, 6))  # 50 x 1.1 is 55.00000000000001: still 55
    if margin == 0:
        return int(bound) if bound.is_integer() else bound
    return _round_up(bound)


def bounds_for(record: CaseRecord, gpu: bool, margin: float | None, speed_margin: float,
               only: tuple[str, ...] | None = None) -> dict[str, float | int]:
    """The calibrated budget keys of one case from its stored record (``margin``: one for every signal, None: each
    kind's; ``only``: these metrics, "speedup" for min_speedup)."""
    keys: dict[str, float | int] = {}
    for metric in calibrated_metrics(gpu):
        if only is not None and metric not in only:
            continue
        value = record.metrics.get(metric)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            headroom = METRICS[metric].calibration_margin if margin is None else margin
            keys[f"max_{metric}"] = max_bound(metric, float(value), headroom)
    speedup = record.speedup_vs_baseline
    # Only a paired speed-up (rounds interleaved with the baseline's; records from before pairing was
    # recorded count as paired) is free of the drift between two cases measured minutes apart.
    if speedup is not None and speedup > 0 and record.paired is not False and (only is None or "speedup" in only):
        keys["min_speedup"] = max(0.01, _round_down(speedup * (1 - speed_margin)))
    return keys


BudgetsTargets = Callable[[list[str]], dict[str, Path]]  # the fullnames of a run's cases -> each one's budgets file


def calibrate(run_path: Path | str, budgets: Path | str | BudgetsTargets, margin: float | None = None,
              speed_margin: float = 0.30, only: tuple[str, ...] | None = None) -> Calibration:
    """What calibration would change in the budgets files for the device of ``run_path`` (nothing is written).

    ``margin``: one headroom for every calibrated signal; None (the default): each kind's from the metric table
    (``Metric.calibration_margin``).

    ``budgets``: one file for every case, or a function from the pytest-benchmark fullnames of the run's cases to
    each one's file. ``only``: calibrate just these metrics' keys (and ``min_speedup`` if it names "speedup"),
    e.g. a new metric.
    """
    calibrated = calibrated_metrics(gpu=True)
    unknown = sorted(set(only or ()) - {*calibrated, "speedup"})
    if unknown:
        raise CalibrationError(f"--metrics {','.join(unknown)}: not calibrated metrics; expected some of "
                               f"{', '.join(calibrated)}, speedup")
    try:
        run = SavedRun.load(run_path).check()  # read whole: a negative count would calibrate a bound of 0
    except RunFileError as e:
        raise CalibrationError(str(e)) from None
    refused = not_a_calibration(run)
    if refused:
        raise CalibrationError(refused)
    if run.measured_nothing:  # a bound from nothing would be no promise; "budgets already match" would read green
        raise CalibrationError(f"{run_path}: every case failed (" + "; ".join(
            str(failed.get("error")) for failed in run.failed_cases) + "): nothing to calibrate from")
    device = run.device or {}
    key = device_key_of(device)
    gpu = DeviceCaps.from_identity(device).cuda
    try:
        records = run.cases()  # a plain pytest-benchmark test in the same run is not a case
    except RecordError as e:
        raise CalibrationError(str(e)) from None
    left_out = [f"{failed.get('case')}: no result ({failed.get('error')})" for failed in run.failed_cases]
    unpaired, calibrated_cases = [], []  # (fullname, record, bounds)
    for record in records:
        if record.guard_failures:  # it trains something else than its baseline: its numbers are no promise
            left_out += [f"{line} (no budget from a case whose guard failed)" for line in record.guard_failures]
            continue
        if record.speedup_vs_baseline is not None and record.paired is False and (only is None or "speedup" in only):
            unpaired.append(record.case)
        bounds = bounds_for(record, gpu, margin, speed_margin, only)
        if bounds:
            calibrated_cases.append((record.fullname, record, bounds))
    if callable(budgets):
        targets = budgets([fullname for fullname, _, _ in calibrated_cases])
    else:
        targets = {fullname: Path(budgets) for fullname, _, _ in calibrated_cases}
    files = []
    for path in dict.fromkeys(targets[fullname] for fullname, _, _ in calibrated_cases):
        cases = [(record, bounds) for fullname, record, bounds in calibrated_cases if targets[fullname] == path]
        files.append(_calibrate_file(Path(path), key, cases, Path(run_path).name))
    if not callable(budgets) and not files:  # nothing to calibrate: the named file, unchanged
        files.append(_calibrate_file(Path(budgets), key, [], Path(run_path).name))
    stopped = None if run.complete else (f"{run_path}: stopped before the end ({INCOMPLETE_KEY}): calibrated from the "
                                         f"{len(calibrated_cases)} case(s) it finished; the others have no figures")
    return Calibration(key, tuple(files), tuple(left_out), tuple(unpaired), margin, stopped)


def _calibrate_file(budgets_path: Path, key: str, cases: list[tuple[CaseRecord, dict]], run_name: str) -> FileChange:
    """One budgets file with ``cases``' bounds written into its ``key`` section."""
    try:
        old_text = budgets_path.read_text(encoding="utf-8") if budgets_path.exists() else ""
    except (OSError, UnicodeDecodeError) as e:
        raise CalibrationError(f"{budgets_path}: cannot read it ({e})") from None
    try:
        import tomlkit  # optional: keeps the file's comments and layout where installed
    except ImportError:  # a bare GPU box: a device's first section needs no round trip of the file
        new_text = _appended_section(budgets_path, old_text, key, cases, run_name)
        return _file_change(budgets_path, key, cases, old_text, new_text, tomllib.loads)
    try:
        doc = tomlkit.parse(old_text)
    except tomlkit.exceptions.ParseError as e:
        raise CalibrationError(f"{budgets_path}: not valid TOML: {e}") from None
    section = doc.get(key)
    if section is None:
        section = doc[key] = tomlkit.table(is_super_table=True)
    for record, bounds in cases:
        entry = section.get(record.case)
        if entry is None:
            entry = section[record.case] = tomlkit.table()
            entry["note"] = f"calibrated from {run_name}: {record.metrics.get('samples_per_s') or 0:.1f} samples/s"
        for name, value in bounds.items():
            entry[name] = value
    return _file_change(budgets_path, key, cases, old_text, tomlkit.dumps(doc), lambda text: tomlkit.parse(text).unwrap())


def _file_change(budgets_path: Path, key: str, cases: list[tuple[CaseRecord, dict]], old_text: str, new_text: str,
                 parse: Callable[[str], dict]) -> FileChange:
    """The change to one budgets file, once its new text is checked to load as budgets."""
    try:
        Budgets._parse(parse(new_text), budgets_path)
    except BudgetError as e:
        raise CalibrationError(f"calibrated budgets would not load: {e}") from None
    diff = "".join(difflib.unified_diff(old_text.splitlines(keepends=True), new_text.splitlines(keepends=True),
                                        fromfile=str(budgets_path), tofile=f"{budgets_path} (calibrated [{key}])"))
    return FileChange(budgets_path, tuple(record.case for record, _ in cases), diff, new_text)


def _appended_section(budgets_path: Path, old_text: str, key: str, cases: list[tuple[CaseRecord, dict]],
                      run_name: str) -> str:
    """``old_text`` with a new ``key`` section after it, written as plain TOML (no tomlkit: the file is not
    parsed and rewritten, so every comment stays). An existing section needs tomlkit, to keep its comments."""
    try:
        existing = tomllib.loads(old_text)
    except tomllib.TOMLDecodeError as e:
        raise CalibrationError(f"{budgets_path}: not valid TOML: {e}") from None
    if key in existing and cases:
        raise CalibrationError(f"{budgets_path}: [{key}] exists and tomlkit is not installed here: calibrating it "
                               "keeps its comments only with tomlkit (pip install tomlkit), or calibrate the saved "
                               "run on another machine")
    lines = [old_text.rstrip("\n"), ""] if old_text.strip() else []
    for record, bounds in cases:
        note = f"calibrated from {run_name}: {record.metrics.get('samples_per_s') or 0:.1f} samples/s"
        lines += [f"[{json.dumps(key)}.{json.dumps(record.case)}]", f"note = {json.dumps(note)}"]
        lines += [f"{name} = {value!r}" for name, value in bounds.items()] + [""]
    return "\n".join(lines)


def write(calibration: Calibration) -> list[Path]:
    """Write every budgets file calibration changes; the paths written."""
    written = []
    for change in calibration.files:
        if change.diff:
            write_text_atomic(change.path, change.new_text)
            written.append(change.path)
    return written
