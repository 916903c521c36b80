"""The attribution tables as a saved run keeps them (``trainbench.core.analyses.attribution`` records them): the top
``TOP`` rows of each table, the rest summed into ``OTHER`` (``compact``), and what a reader finds wrong with them
(``attribution_problem``). Torch-free, so every reader of saved runs can use them."""

from __future__ import annotations

import math
import statistics

TOP = 15  # rows each table keeps in a saved run
OTHER = "(other)"  # the rows beyond TOP, summed
BETWEEN_OPS = "(outside ops)"  # profiled wall time no op accounts for
OUTSIDE_MODULES = "(outside modules)"  # a loss, a custom step's glue, the data's preparation
OPTIMIZER = "optimizer step"


def top(table: dict[str, float], n: int = TOP) -> dict[str, float]:
    """The ``n`` largest rows of a count or byte table, the rest summed under ``OTHER`` (so totals still add up)."""
    ordered = sorted(table.items(), key=lambda item: (-abs(item[1]), item[0]))
    kept = dict(ordered[:n])
    rest = sum(value for _, value in ordered[n:])
    if rest:
        kept[OTHER] = kept.get(OTHER, 0) + rest
    return kept


def top_series(table: dict[str, list[float]], n: int = TOP) -> dict[str, list[float]]:
    """The ``n`` rows of a per-step table with the largest median, the rest summed step by step under ``OTHER``."""
    ordered = sorted(table, key=lambda key: (-statistics.median(table[key]), key))
    kept = {key: table[key] for key in ordered[:n]}
    rest = ordered[n:]
    if rest:
        steps = len(next(iter(table.values())))
        kept[OTHER] = [sum(table[key][i] for key in rest) for i in range(steps)]
    return kept


def compact(tables: dict, n: int = TOP) -> dict:
    """The tables as a saved run keeps them: the top ``n`` rows of each, the rest summed, totals kept."""
    out: dict = {}
    for name, table in tables.items():
        if name == "time":
            out[name] = {**table, "ops_ms": top_series(table["ops_ms"], n), "calls": top(table["calls"], n)}
            if "kernels_ms" in table:
                out[name].update(kernels_ms=top_series(table["kernels_ms"], n),
                                 kernel_calls=top(table["kernel_calls"], n))
        elif name == "memory":
            out[name] = {kind: top(sites, n) for kind, sites in table.items()}
        elif isinstance(table, dict):
            out[name] = top(table, n)
        else:
            out[name] = table
    return out


SERIES = ("ops_ms", "kernels_ms")  # the time tables whose rows are samples per profiled step


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _table_problem(rows: object, path: str, series: bool) -> str | None:
    """What is wrong with one table of a saved run's attribution (None: rows of numbers, or of equally long lists
    of numbers per profiled step where ``series``)."""
    if not isinstance(rows, dict):
        return f"attribution.{path} = {rows!r}: expected a table (row -> {'list of ' if series else ''}number)"
    lengths = set()
    for row, value in rows.items():
        ok = (isinstance(value, list) and value and all(map(_number, value))) if series else _number(value)
        if not ok:
            expected = "a non-empty list of finite numbers (one per profiled step)" if series else "a finite number"
            return f"attribution.{path}[{row!r}] = {value!r}: expected {expected}"
        lengths.add(len(value) if series else 0)
    if len(lengths) > 1:
        return f"attribution.{path}: rows of {sorted(lengths)} profiled steps: expected one count for every row"
    return None


def attribution_problem(tables: object) -> str | None:
    """What is wrong with a saved run's attribution (``compact``'s tables, or null), as its readers would meet it:
    one line naming the table and row, or None."""
    if tables is None:
        return None
    if not isinstance(tables, dict):
        return f"attribution = {tables!r}: expected the attribution tables (a dict) or null"
    for name, table in tables.items():
        if name in ("time", "memory"):
            if not isinstance(table, dict):
                return f"attribution.{name} = {table!r}: expected a dict of tables"
            for key, rows in table.items():
                if name == "time" and key == "steps":
                    problem = None if isinstance(rows, int) and not isinstance(rows, bool) and rows >= 0 else \
                        f"attribution.time.steps = {rows!r}: expected a count"
                elif name == "time" and key == "wall_ms":
                    problem = None if isinstance(rows, list) and all(map(_number, rows)) else \
                        f"attribution.time.wall_ms = {rows!r}: expected a list of finite numbers"
                else:
                    problem = _table_problem(rows, f"{name}.{key}", name == "time" and key in SERIES)
                if problem:
                    return problem
        else:
            problem = _table_problem(table, name, False)
            if problem:
                return problem
    return None
