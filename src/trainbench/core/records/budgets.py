"""Budgets: what each case promises, per device class, and the check of a Result against it.

File format (TOML), one table per device class and case::

    [cpu."resnet18-uint8_transfer"]
    note = "4x fewer bytes cross to the device"
    max_h2d_bytes_per_sample_ratio = 0.26   # relative to the session's baseline
    max_activation_mib = 32                  # absolute

Device classes, most specific first: the GPU's name ("Tesla V100-SXM2-16GB"), its
capability ("sm_70"), "cuda" for any GPU, and "cpu".

Keys are ``min_<metric>`` / ``max_<metric>`` (absolute) or ``min_<metric>_ratio`` /
``max_<metric>_ratio`` (this case / the baseline recipe measured in the same session),
for any metric in ``trainbench.core.records.metrics.METRICS`` or its alias there (``max_memory_ratio`` is
``max_peak_memory_mib_ratio``); ``min_speedup`` is ``min_samples_per_s_ratio``.
"""

from __future__ import annotations

import difflib
import math
import sys
import unicodedata
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from trainbench.core.records.metrics import ALIASES, METRICS, ThresholdError, parse_thresholds, resolve
from trainbench.core.records.result import Result
from trainbench.devices.caps import BUDGET_SECTION_EXAMPLES, DeviceCaps, budget_section_problem
from trainbench.devices.fleet import FLEET

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

SPEEDUP_KEY = "min_speedup"  # the ratio budget most cases set, named for what it promises
TEXT_KEYS = {"note"}


class BudgetError(ValueError):
    """A budgets file that cannot be used; the message names the file and entry."""


@dataclass(frozen=True)
class Bound:
    metric: str
    bound: str  # "min" | "max"
    relative: bool
    limit: float
    key: str  # as written in the file

    def describe(self) -> str:
        what = f"{self.metric} ratio vs baseline" if self.relative else self.metric
        return f"{what} {'>=' if self.bound == 'min' else '<='} {self.limit:g}"


@dataclass(frozen=True)
class BoundCheck:
    """One bound of a case's budget checked against what was measured."""

    bound: Bound
    measured: float | None
    ok: bool
    message: str
    # A timed bound whose rounds cannot show which side of its limit they lie on (noise, a busy machine): why
    # (trainbench.core.records.stats.judge_bound).
    inconclusive: str | None = None


@dataclass(frozen=True)
class CaseBudget:
    device_key: str
    case: str
    bounds: tuple[Bound, ...]
    note: str | None = None
    # Per-case regression gate thresholds over the command line's (trainbench.core.records.metrics.parse_thresholds).
    compare_fail: dict[str, float] | None = None
    path: Path | None = None  # the file it came from

    @property
    def needs_baseline(self) -> bool:
        return any(b.relative for b in self.bounds)


def parse_key(key: str) -> tuple[str, str, bool]:
    """``max_activation_mib_ratio`` -> ("activation_mib", "max", True); raises KeyError if unknown."""
    if key == SPEEDUP_KEY:
        return "samples_per_s", "min", True
    bound, _, rest = key.partition("_")
    if bound not in ("min", "max") or not rest:
        raise KeyError(key)
    relative = rest.endswith("_ratio") and resolve(rest[: -len("_ratio")]) in METRICS
    metric = resolve(rest[: -len("_ratio")] if relative else rest)
    if metric not in METRICS:
        raise KeyError(key)
    return metric, bound, relative


class Budgets:
    def __init__(self, sections: dict[str, dict[str, CaseBudget]], path: Path | None = None):
        self.sections = sections
        self.path = path

    @classmethod
    def empty(cls) -> Budgets:
        return cls({})

    @classmethod
    def load(cls, path: str | Path) -> Budgets:
        path = Path(path)
        if any(unicodedata.category(c) == "Cc" for c in str(path)):  # every message names the file, in one line
            raise BudgetError(f"{str(path)!r}: not a file path (a control character in it); expected a TOML budgets file")
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise BudgetError(f"{path}: budgets file not found") from None
        except UnicodeDecodeError as e:
            raise BudgetError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start}); expected a TOML budgets file") from None
        except OSError as e:
            raise BudgetError(f"{path}: cannot read it ({e.strerror or e}); expected a TOML budgets file") from None
        except ValueError as e:  # a name the file system cannot encode
            raise BudgetError(f"{str(path)!r}: not a file path ({e}); expected a TOML budgets file") from None
        return cls.from_text(text, path)

    @classmethod
    def from_text(cls, text: str, source: str | Path = "<text>") -> Budgets:
        """Budgets from the text of a budgets file, checked as a file is; ``source`` names it in every message
        (a file's path, or a label such as "<smoke>" for budgets a program writes). Lookups treat it as configured."""
        try:
            raw = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise BudgetError(f"{source}: not valid TOML: {e}") from None
        if not raw:  # an empty file checks nothing: a wrong path or a lost edit, never intended
            raise BudgetError(f'{source}: no budgets in it; expected tables such as [cpu."<case id>"] with bounds')
        source = Path(source)
        return cls(cls._parse(raw, source), source)

    @staticmethod
    def _parse(raw: dict, path: Path) -> dict[str, dict[str, CaseBudget]]:
        sections: dict[str, dict[str, CaseBudget]] = {}
        for device_key, cases in raw.items():
            _check_device_key(device_key, path)
            if not isinstance(cases, dict):
                raise BudgetError(f"{path}: [{device_key}] must be a table of cases, got {type(cases).__name__}")
            sections[device_key] = {}
            for case, entries in cases.items():
                where = f"{path}: [{device_key}.{case}]"
                if not isinstance(entries, dict):
                    raise BudgetError(f"{where} must be a table of budget keys, got {type(entries).__name__} {entries!r}")
                bounds, note, compare_fail = [], None, None
                for key, value in entries.items():
                    if key == "compare_fail":
                        if not isinstance(value, str):
                            raise BudgetError(f"{where} compare_fail = {value!r}: expected a string like 'samples_per_s:10%'")
                        try:
                            compare_fail = parse_thresholds(value, f"{where} compare_fail")
                        except ThresholdError as e:
                            raise BudgetError(str(e)) from None
                        continue
                    if key in TEXT_KEYS:
                        if not isinstance(value, str):
                            raise BudgetError(f"{where} {key} = {value!r}: expected a string")
                        note = value
                        continue
                    try:
                        metric, bound, relative = parse_key(key)
                    except KeyError:
                        raise BudgetError(
                            f"{where} unknown budget key {key!r}: expected min_/max_<metric>[_ratio], "
                            f"{SPEEDUP_KEY} or note, with <metric> one of {', '.join(METRICS)} or "
                            f"{', '.join(ALIASES)}"
                        ) from None
                    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                        raise BudgetError(f"{where} {key} = {value!r}: expected a finite number")
                    if device_key == "cpu" and METRICS[metric].cuda_only:  # it failed only after measuring
                        raise BudgetError(f"{where} {key}: {metric} is measured on CUDA devices only (no CPU run has "
                                          "it); expected it in a GPU's section ([cuda], sm_XY or a GPU's name)")
                    if relative and value <= 0:
                        raise BudgetError(f"{where} {key} = {value!r}: expected a ratio > 0")
                    if not relative and value < 0:
                        raise BudgetError(f"{where} {key} = {value!r}: expected a value >= 0 ({metric} is never "
                                          "negative, so the bound could only always fail or always pass)")
                    bounds.append(Bound(metric, bound, relative, float(value), key))
                _check_consistent(bounds, where)
                if case == "*" and bounds:  # "*" sets the gate's thresholds only: a bound there would check nothing
                    raise BudgetError(f"{where} {bounds[0].key}: a \"*\" entry holds compare_fail (and a note) only; "
                                      "bounds apply per case: put it under each case it should check")
                sections[device_key][case] = CaseBudget(device_key, case, tuple(bounds), note, compare_fail, path)
        return sections

    def check_case_ids(self, known: set[str]) -> None:
        """A case id that is no case but one edit of a letter or punctuation from a known one is a typo:
        ``BudgetError`` with "did you mean" (``typo_edits``). ``known``: every case id this session could produce
        that is knowable before it runs (the suite's, the built-in workload x recipe pairs, the collected parameter
        ids). Other ids stand: a user's own spec or recipe names its case only when it runs, and an entry two edits
        from it fails that case then (``misspelling``)."""
        candidates = sorted(known)
        for device_key, cases in self.sections.items():
            for case in cases:
                if case == "*" or case in known:
                    continue
                close = next((k for k in candidates if typo_edits(case, k) == 1), None)
                if close:
                    raise BudgetError(f"{self.path}: [{device_key}.\"{case}\"] names no case; did you mean "
                                      f"\"{close}\"? (one edit away; case ids are <workload>-<recipe> or a ladder "
                                      "rung's id, as the summary table lists them)")

    def misspelling(self, caps: DeviceCaps, case: str, known: Collection[str] = ()) -> str | None:
        """Why ``case``, which has no entry on this device, fails for want of one: an entry of the sections it looks
        in that names no known case (``known``) is at most ``TYPO_EDITS`` edits from its id (``typo_edits``), so the
        budget meant for it checks nothing. None where there is no such entry."""
        for key in self.device_keys(caps):
            for entry in self.sections[key]:
                edits = typo_edits(entry, case) if entry != "*" and entry not in known else None
                if edits:
                    return (f"no budget for {case}, and [{key}.\"{entry}\"] of {self.path} is {edits} edit"
                            f"{'s' if edits > 1 else ''} from its id and names no case: a typo? Correct the entry's id, "
                            f"or give {case} an entry of its own")
        return None

    def device_keys(self, caps: DeviceCaps) -> list[str]:
        """The device's classes this file has a section for, most specific first."""
        return [k for k in caps.budget_keys if k in self.sections]

    def for_case(self, caps: DeviceCaps, case: str) -> CaseBudget | None:
        return self.lookup(caps, case)[0]

    def lookup(self, caps: DeviceCaps, case: str) -> tuple[CaseBudget | None, str | None]:
        """The case's budget on this device, or None and why none applies (which file and sections were looked at).

        Per case, the most specific section that has an entry for it: a GPU's name, then its
        capability, then ``cuda``; so ``[sm_70]`` entries never hide the ``[cuda]`` ones of other cases.
        """
        if self.path is None:
            return None, ("no budget: no budgets file configured (put a budgets.toml beside the tests or above them, "
                          "or pass --trainbench-budgets)")
        keys = self.device_keys(caps)
        if not keys:
            tried = ", ".join(f"[{k}]" for k in caps.budget_keys)
            return None, f"no budget: {self.path} has no section for {caps.name} (looked for {tried})"
        budget = next((self.sections[k][case] for k in keys if case in self.sections[k]), None)
        if budget is None:
            return None, f"no budget for {case} in {', '.join(f'[{k}]' for k in keys)} of {self.path}"
        return budget, None

    def compare_thresholds(self, caps: DeviceCaps, case: str) -> dict[str, float]:
        """Gate thresholds this file sets for ``case``: each section's ``"*"`` entry then the case's own, the most
        specific section last (so it wins)."""
        thresholds: dict[str, float] = {}
        for key in reversed(self.device_keys(caps)):
            for entry in (self.sections[key].get("*"), self.sections[key].get(case)):
                thresholds.update((entry.compare_fail or {}) if entry else {})
        return thresholds


# Edits of a letter or punctuation that make a budgets entry's case id a typo of a case's (``typo_edits``).
TYPO_EDITS = 2


def typo_edits(written: str, meant: str) -> int | None:
    """How many edits of a letter or punctuation turn ``written`` into ``meant`` (insert, delete or replace one, or
    swap two neighbours), from 1 to ``TYPO_EDITS``; None where they are equal, further apart, or differ in a digit: a
    number names another model (resnet50 and resnet18 are two cases, as are amp_bf16 and amp_bf61), never a typo."""
    if written == meant or abs(len(written) - len(meant)) > TYPO_EDITS:
        return None
    if [c for c in written if c.isdigit()] != [c for c in meant if c.isdigit()]:
        return None
    far = TYPO_EDITS + 1  # a digit's edit costs this: never within reach

    def cost(*chars: str) -> int:
        return far if any(c.isdigit() for c in chars) else 1

    # the optimal string alignment distance, row by row
    before, row = None, [min(far, sum(cost(c) for c in meant[:j])) for j in range(len(meant) + 1)]
    for i, a in enumerate(written, 1):
        current = [min(far, row[0] + cost(a))]
        for j, b in enumerate(meant, 1):
            best = min(row[j] + cost(a), current[j - 1] + cost(b), row[j - 1] + (0 if a == b else cost(a, b)))
            if before is not None and j > 1 and a == meant[j - 2] and written[i - 2] == b and a != b:
                best = min(best, before[j - 2] + cost(a, b))
            current.append(min(far, best))
        if min(current) > TYPO_EDITS and (before is None or min(row) > TYPO_EDITS):
            return None  # no later row can come back within reach (a swap looks back one row only)
        before, row = row, current
    return row[-1] if row[-1] <= TYPO_EDITS else None


def _check_device_key(key: str, path: Path) -> None:
    """A section is one some device answers to (``device.budget_section_problem``: ``cpu``, ``cuda``, ``sm_<XY>`` or a
    GPU's full name); any other is an error, since it could never apply: a typo or a CPU's name, never a silent skip."""
    names = [gpu.name for gpu in FLEET.values()]
    why = budget_section_problem(key, names)
    if why is None:
        return
    known = {name.lower(): name for name in [*BUDGET_SECTION_EXAMPLES, *names]}
    close = difflib.get_close_matches(key.strip().lower(), known, n=1, cutoff=0.6)
    hint = f"; did you mean [{known[close[0]]}]?" if close else ""
    raise BudgetError(f"{path}: unknown device section [{key}] ({why}): expected cpu, cuda, sm_<major><minor> or a "
                      f"GPU's full name as PyTorch reports it (e.g. \"NVIDIA H100 80GB HBM3\"){hint}")


def _check_consistent(bounds: list[Bound], where: str) -> None:
    for lo in bounds:
        for hi in bounds:
            same_metric = (lo.metric, lo.relative) == (hi.metric, hi.relative)
            if same_metric and lo.bound == "min" and hi.bound == "max" and lo.limit > hi.limit:
                raise BudgetError(f"{where} {lo.key} = {lo.limit:g} is above {hi.key} = {hi.limit:g}")


def evaluate(budget: CaseBudget, result: Result, baseline: Result | None) -> list[BoundCheck]:
    """Check every bound; a bound whose metric this run did not produce fails (never passes silently)."""
    current = result.metrics()
    base = baseline.metrics() if baseline is not None else {}
    verdicts = []
    for b in budget.bounds:
        value = current.get(b.metric)
        if b.relative:
            ref = base.get(b.metric)
            if baseline is None or ref in (None, 0) or value is None:
                verdicts.append(BoundCheck(b, None, False, f"{b.key}: cannot check, {b.metric} missing for this case or its baseline"))
                continue
            value = value / ref
        elif value is None:
            verdicts.append(BoundCheck(b, None, False, f"{b.key}: cannot check, {b.metric} was not measured on this device"))
            continue
        ok = value >= b.limit if b.bound == "min" else value <= b.limit
        verdicts.append(BoundCheck(b, value, ok, _line(b, value, ok)))
    return verdicts


def _line(b: Bound, value: float, ok: bool) -> str:
    unit = "" if b.relative else METRICS[b.metric].unit
    unit = f" {unit}" if unit else ""
    what = f"{b.metric} ratio vs baseline" if b.relative else b.metric
    op = ">=" if b.bound == "min" else "<="
    margin = (value - b.limit) / b.limit if b.limit else float("inf")
    status = "ok" if ok else ("short by" if b.bound == "min" else "over by")
    detail = f"margin {margin:+.1%}" if ok else f"{status} {abs(margin):.1%}"
    return f"{what}: measured {value:.4g}{unit} vs budget {op} {b.limit:g}{unit} ({detail})"
