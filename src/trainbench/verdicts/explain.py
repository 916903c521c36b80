"""What accounts for a changed metric: the rows of the attribution tables (``trainbench.core.analyses.attribution``) that moved.

A metric names the tables that explain it (``Metric.where``: step time by op self time and kernel time, op
counts by op and by module, FLOPs by op, memory by allocation site). For each, ``causes`` compares the two
sides' rows:

- counted tables (ops, calls, FLOPs, memory) are exact: every row that changed is a cause, its share the
  part of the table's total change it makes;
- timed tables (self time per profiled step) carry an interval: the change of a row is the difference of
  the sides' medians (independent profiled steps: two saved runs) or the median of per-pair differences
  (A/B, whose profiled steps alternate like its rounds), with its exact 95% interval; a row whose
  interval holds zero changed within noise and is not named.

Causes are named in the direction of the table's total change, largest first, with their share of it.
Rows a saved run folded into ``(other)`` on either side are compared inside ``(other)``, never against zero.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainbench.core.records.tables import OTHER
from trainbench.core.records.metrics import METRICS
from trainbench.core.records.stats import beyond_noise, change_interval, median_change, side_of
from trainbench.verdicts.render import number

MAX_CAUSES = 4  # causes named per table under a changed verdict
MIN_SHARE = 0.02  # a row making less than this share of the change is not named
# The profiled steps show a timed change only if their time could have moved at least this share of the rounds'
# change: a profiled step costs more than a timed one, but a change inside the step moves both alike, while drift
# of a few tenths of a millisecond between two sessions must not be taken for a 5 ms regression.
SHOWN_SHARE = 0.5
WALL_TABLE = "time.ops_ms"  # its rows, ``(outside ops)`` included, add up to the profiled steps' wall time
OFFSETS = 2  # rows that moved against the change, named after its causes

# What each table is, its unit and the scale from its stored unit.
TABLES = {
    "time.ops_ms": ("op self time", "ms/step", 1.0),
    "time.kernels_ms": ("kernel time", "ms/step", 1.0),
    "time.calls": ("profiled calls", "calls/step", 1.0),
    "time.kernel_calls": ("kernel launches", "/step", 1.0),
    "ops": ("ops", "ops/step", 1.0),
    "ops_by_site": ("ops by module", "ops/step", 1.0),
    "syncs": ("syncs by call site", "syncs/step", 1.0),
    "flops": ("FLOPs by op", "GFLOP/step", 1e-9),
    "memory.peak_bytes": ("memory at the peak by site", "MiB", 1 / 2**20),
    "memory.kept_bytes_per_step": ("memory kept per step by site", "MiB/step", 1 / 2**20),
    "memory.param_bytes": ("parameters by module", "MiB", 1 / 2**20),
    "allocator_peak_bytes": ("allocator peak by call site", "MiB", 1 / 2**20),
}


@dataclass(frozen=True)
class Cause:
    table: str  # a key of TABLES
    row: str  # an op, a kernel, a module, a site
    change: float  # in the table's unit, signed (+ = larger on the current side)
    share: float | None  # of the table's total change (None: no total change to share)
    ci: tuple[float, float] | None = None  # 95% interval of the change (timed tables)
    samples: int | None = None  # profiled steps (or pairs) behind it

    def line(self) -> str:
        what, unit, _ = TABLES[self.table]
        ci = f" (95% CI {number(self.ci[0], '+.3g')}..{number(self.ci[1], '+.3g')})" if self.ci else ""
        share = f", {self.share:.0%} of the change" if self.share is not None else ""
        return f"{what}: {self.row} {number(self.change, '+.3g')} {unit}{ci}{share}"

    def to_json(self) -> dict:
        return {"table": self.table, "row": self.row, "change": self.change, "share": self.share,
                "ci": list(self.ci) if self.ci else None, "samples": self.samples, "line": self.line()}


def table(tables: dict | None, path: str) -> dict | None:
    """The table at ``path`` ("time.ops_ms") of a case's attribution, or None."""
    node = tables
    for part in path.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node if isinstance(node, dict) else None  # {}: recorded, and nothing in it (no memory kept)


class NotReproduced(Exception):
    """The profiled steps do not show the timed change: their wall time did not move, beyond noise, the same way."""


def _recorded(metric: str, baseline: dict | None, current: dict | None):
    """(path, baseline rows, current rows) of each table explaining ``metric`` that both sides recorded, with rows
    on at least one side ({} on the other: recorded, and nothing in it, as no memory kept)."""
    for path in METRICS[metric].where:
        base, cur = table(baseline, path), table(current, path)
        if base is not None and cur is not None and (base or cur):
            yield path, base, cur


def causes(metric: str, baseline: dict | None, current: dict | None, paired: bool = False,
           slower: bool | None = None, rounds_s: tuple[list[float], list[float]] | None = None) -> list[Cause]:
    """The rows that account for ``metric``'s change between two cases' attributions (``paired``: the timed
    tables' steps were profiled in alternation, pair by pair). [] where a side recorded none.

    ``slower``: the verdict says the step got slower (True) or faster (False). The profiled steps' wall time must
    show that too, beyond noise, and by at least ``SHOWN_SHARE`` of the change of the rounds' step times
    (``rounds_s``: each side's, in seconds, paired like the profiled steps), or their rows explain nothing of it
    (``NotReproduced``, naming what they show)."""
    found = []
    for path, base, cur in _recorded(metric, baseline, current):
        scale = TABLES[path][2]
        if _is_series(base) and _is_series(cur):
            if slower is not None and path == WALL_TABLE:
                _check_shown(base, cur, scale, paired, slower, rounds_s)
            found += _timed_causes(path, base, cur, scale, paired)
        elif not _is_series(base) and not _is_series(cur):  # (a timed table with no rows on one side: no samples)
            found += _counted_causes(path, base, cur, scale)
    return found


def _is_series(rows: dict) -> bool:
    """A timed table: samples per profiled step in each row (an empty table is none)."""
    return any(isinstance(v, list) for v in rows.values())


def _comparable(base: dict, cur: dict) -> tuple[dict, dict]:
    """Both sides over the same rows: a row one side folded into ``OTHER`` is folded on the other side too."""
    folded = {row for row in {*base, *cur} - {OTHER}
              if (row not in base and OTHER in base) or (row not in cur and OTHER in cur)}
    if not folded:
        return base, cur

    def fold(rows: dict) -> dict:
        kept = {row: v for row, v in rows.items() if row not in folded and row != OTHER}
        moved = [v for row, v in rows.items() if row in folded or row == OTHER]
        if moved:
            kept[OTHER] = ([sum(vs) for vs in zip(*moved)] if isinstance(moved[0], list) else sum(moved))
        return kept

    return fold(base), fold(cur)


def _counted_causes(path: str, base: dict, cur: dict, scale: float) -> list[Cause]:
    base, cur = _comparable(base, cur)
    changes = {row: (cur.get(row, 0) - base.get(row, 0)) * scale for row in {*base, *cur}}
    total = sum(changes.values())
    return _named(path, changes, total, {})


def _aligned(base: dict, cur: dict, scale: float) -> tuple[dict[str, tuple[list[float], list[float]]], int, int]:
    """Each row of two timed tables as (baseline samples, current samples) in the table's unit (0 in the steps of
    a side that lacks the row), over the rows both compare (``_comparable``), and each side's sample count."""
    base, cur = _comparable(base, cur)
    n_base, n_cur = len(next(iter(base.values()))), len(next(iter(cur.values())))
    series = {row: ([v * scale for v in base.get(row, [0.0] * n_base)], [v * scale for v in cur.get(row, [0.0] * n_cur)])
              for row in {*base, *cur}}
    return series, n_base, n_cur


def _totals(series: dict[str, tuple[list[float], list[float]]]) -> tuple[list[float], list[float]]:
    """Each side's profiled steps' total over the rows (``_aligned``'s series)."""
    return ([sum(vs) for vs in zip(*(b for b, _ in series.values()))],
            [sum(vs) for vs in zip(*(c for _, c in series.values()))])


def _check_shown(base: dict, cur: dict, scale: float, paired: bool, slower: bool,
                 rounds_s: tuple[list[float], list[float]] | None) -> None:
    """Raise ``NotReproduced`` unless the profiled steps' wall time (``WALL_TABLE``) moved the verdict's way beyond
    noise, and could have moved ``SHOWN_SHARE`` of the rounds' change."""
    series, n_base, n_cur = _aligned(base, cur, scale)
    paired = paired and n_base == n_cur
    base_total, cur_total = _totals(series)
    total = median_change(cur_total, base_total, paired, relative=False)
    ci = change_interval(cur_total, base_total, paired, relative=False)
    step_change = rounds_change_ms(rounds_s, paired)
    moved = (f"their time moved {number(total, '+.3g')} ms/step"
             + (f" (95% CI {number(ci[0], '+.3g')}..{number(ci[1], '+.3g')})" if ci else "") + f", {min(n_base, n_cur)} a side"
             + (f", against {number(step_change, '+.3g')} ms/step in the rounds" if step_change is not None else ""))
    if ci is None or side_of(ci, 0.0) != ("above" if slower else "below"):  # not beyond noise the verdict's way
        raise NotReproduced(f"where: the profiled steps do not show the change ({moved}): it comes from outside the "
                            "steps (data loading, the machine), or is too small for a few profiled steps to resolve, "
                            "or they drifted the other way (separate sessions)")
    reach = ci[1] if slower else -ci[0]  # the most the profiled steps' change could be, the verdict's way
    if step_change is not None and reach < SHOWN_SHARE * abs(step_change):
        raise NotReproduced(f"where: the profiled steps do not show the change ({moved}): it comes from outside the "
                            "profiled steps (data loading, the machine), or they drifted between the runs")


def rounds_change_ms(rounds_s: tuple[list[float], list[float]] | None, paired: bool) -> float | None:
    """The change of the step time over the rounds (``rounds_s``: each side's round step times in seconds), in
    ms/step, as the profiled steps' rows are compared (``stats.median_change``); None without rounds on both sides."""
    if not rounds_s or not all(rounds_s):
        return None
    base, cur = ([t * 1e3 for t in side] for side in rounds_s)
    return median_change(cur, base, paired and len(base) == len(cur), relative=False)


def _timed_causes(path: str, base: dict, cur: dict, scale: float, paired: bool) -> list[Cause]:
    series, n_base, n_cur = _aligned(base, cur, scale)
    if paired and n_base != n_cur:
        paired = False
    changes = {row: median_change(c, b, paired, relative=False) for row, (b, c) in series.items()}
    base_total, cur_total = _totals(series)
    total = median_change(cur_total, base_total, paired, relative=False)
    intervals = {}
    for row, change in changes.items():
        if total and abs(change) >= MIN_SHARE * abs(total):  # only rows that could be named get an interval
            b, c = series[row]
            intervals[row] = change_interval(c, b, paired, relative=False)
    return _named(path, changes, total, intervals, samples=min(n_base, n_cur))


def _named(path: str, changes: dict[str, float], total: float, intervals: dict, samples: int | None = None
           ) -> list[Cause]:
    """The rows that moved the way the table's total did, beyond noise, largest first (``MAX_CAUSES``)."""
    if not total:
        if samples is not None:
            return []  # a timed table whose total did not move: nothing to account for
        # Counted rows that traded places (as many ops gone as came): the largest movements, with no share.
        moved = sorted((row for row, change in changes.items() if change), key=lambda row: (-abs(changes[row]), row))
        return [Cause(path, row, changes[row], None) for row in moved[:MAX_CAUSES]]
    named, offsets = [], []
    for row in sorted(changes, key=lambda row: (-changes[row] * math.copysign(1, total), row)):
        change = changes[row]
        if abs(change) < MIN_SHARE * abs(total):
            continue
        if samples is not None and not beyond_noise(intervals.get(row)):
            continue  # within noise: its interval holds zero (or one profiled step a side gave none)
        (named if change * total > 0 else offsets).append(Cause(path, row, change, change / total, intervals.get(row),
                                                                samples))
    # Rows that moved against the total come after, with a negative share: why the named ones add up to over 100%.
    return named[:MAX_CAUSES] + sorted(offsets, key=lambda c: c.share)[:OFFSETS]


MOVED_SHOWN = 8  # rows of each timed table listed for a case asked about, whatever its verdict
MOVED_TABLES = ("time.ops_ms", "time.kernels_ms")  # op self time; the kernels' time where the device has kernels


LEADS = "rows that moved the verdict's way beyond noise in the profiled steps (leads, not shares of the change):"
LEAD_SHARE = 0.1  # a lead moved at least this share of the rounds' change (less is no lead to a change that size)


def leads(metric: str, baseline: dict, current: dict, paired: bool, slower: bool,
          rounds_s: tuple[list[float], list[float]] | None) -> list[Cause]:
    """Under a timed change the profiled steps do not show as a whole: the rows of its timed tables that moved the
    verdict's way beyond noise and by ``LEAD_SHARE`` of the rounds' change, largest first (``MAX_CAUSES`` a table),
    with no share (their total did not move so). [] without the rounds. A planted wait outside every op stands out
    so, beside ops that drifted the other way between sessions."""
    step_change = rounds_change_ms(rounds_s, paired)
    if step_change is None:
        return []
    found = []
    for path, base, cur in _recorded(metric, baseline, current):
        if _is_series(base) and _is_series(cur):
            found += [cause for cause in _moved(path, base, cur, paired,
                                                lambda change: (change > 0) == slower
                                                and abs(change) >= LEAD_SHARE * abs(step_change))
                      if beyond_noise(cause.ci)][:MAX_CAUSES]
    return found


def _moved(path: str, base: dict, cur: dict, paired: bool, wanted=bool) -> list[Cause]:
    """The rows of a timed table whose change ``wanted`` accepts (default: any change), largest first, each with its
    interval and no share."""
    series, n_base, n_cur = _aligned(base, cur, TABLES[path][2])
    paired = paired and n_base == n_cur
    changes = {row: median_change(c, b, paired, relative=False) for row, (b, c) in series.items()}
    rows = sorted((row for row, change in changes.items() if change and wanted(change)),
                  key=lambda row: (-abs(changes[row]), row))
    return [Cause(path, row, changes[row], None, change_interval(series[row][1], series[row][0], paired, relative=False),
                  min(n_base, n_cur)) for row in rows]


def moved_rows(baseline: dict | None, current: dict | None, n: int = MOVED_SHOWN) -> list[str]:
    """The rows of a case's timed tables (op self time, and kernel time where there are kernels) whose median per
    profiled step moved most between two runs, either way, each with its 95% interval; a row whose interval holds
    zero is marked "within noise". Asked of a case whatever its verdict: a step time that stayed put can hide an op
    that got slower and another that got faster."""
    if baseline is None or current is None:
        side = "either run" if baseline is None and current is None else "the baseline" if baseline is None else \
            "the current run"
        return [f"no attribution recorded by {side} (attribution off, or a run saved before it was recorded)"]
    lines = []
    for path in MOVED_TABLES:
        base, cur = table(baseline, path), table(current, path)
        if not base or not cur:
            continue
        for cause in _moved(path, base, cur, paired=False)[:n]:
            lines.append(cause.line() + ("" if beyond_noise(cause.ci) else " (within noise)"))
    return lines or ["no op or kernel time moved between the runs' profiled steps"]


def explanation(metric: str, baseline: dict | None, current: dict | None, paired: bool = False,
                slower: bool | None = None, rounds_s: tuple[list[float], list[float]] | None = None
                ) -> tuple[str, ...]:
    """The lines printed under a changed verdict of ``metric``: its causes, or why none can be named (``slower``:
    the verdict's direction, for a timed metric; ``rounds_s``: each side's round step times, as ``causes``)."""
    return explained(metric, baseline, current, paired, slower, rounds_s)[0]


def explained(metric: str, baseline: dict | None, current: dict | None, paired: bool = False,
              slower: bool | None = None, rounds_s: tuple[list[float], list[float]] | None = None
              ) -> tuple[tuple[str, ...], tuple[Cause, ...]]:
    """``explanation``'s lines, and the causes they name (none where they say why none can be named, or give leads
    the profiled steps did not reproduce): what a report that groups changes by their cause reads."""
    if not METRICS[metric].where:
        return (), ()
    if baseline is None or current is None:
        side = "either side" if baseline is None and current is None else "the baseline" if baseline is None else "this run"
        return (f"where: not recorded by {side} (attribution off, or a run saved before trainbench recorded it)",), ()
    # e.g. a recipe whose step is already profiled: trainbench profiled no steps
    if next(_recorded(metric, baseline, current), None) is None:
        wanted = ", ".join(TABLES[path][0] for path in METRICS[metric].where)
        return (f"where: neither side recorded the tables that explain {metric} ({wanted}) for this case",), ()
    try:
        found = causes(metric, baseline, current, paired, slower, rounds_s)
    except NotReproduced as e:
        found = leads(metric, baseline, current, paired, slower, rounds_s)
        return (str(e), *((LEADS,) if found else ()), *(f"  {cause.line()}" for cause in found)), ()
    if not found:
        return ("where: no op, kernel, module or site moved beyond noise in the attribution tables",), ()
    return tuple(cause.line() for cause in found), tuple(found)
