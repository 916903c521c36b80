"""What two asv environments of one commit differ in: a PyTorch upgrade, case by case.

``asv compare`` compares commits within one environment; an upgrade is the other axis:
one commit measured in one environment per torch release (``results/asv/<machine>/``).
Exact tracks (``Memory``, ``Work``) are listed wherever they differ; ``Speed`` is summed
up as the spread of step-time ratios, since one run per side cannot separate a few
percent from runner noise.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

from trainbench.core.harness.files import write_text_atomic

EXACT_CLASSES = ("Memory", "Work")
STEP_TIME = "Speed.track_step_time"


class AsvResultsError(Exception):
    """A results folder or file that cannot be compared; the message names it."""


@dataclass
class EnvResults:
    path: Path
    commit: str
    env_name: str
    date: int
    values: dict[tuple[str, str], float]  # (Class.track_name, case) -> value, measured ones only

    @property
    def torch(self) -> str:
        """The torch release in the environment's name (matrix entry or venv path), else the name."""
        found = re.search(r"torch-?(\d+(?:\.\d+)+)", self.env_name)
        return found.group(1) if found else self.env_name


def _version_key(env: EnvResults) -> tuple:
    parts = re.findall(r"\d+", env.torch)
    return tuple(int(p) for p in parts) if parts else (math.inf,)


def load_env_results(path: Path) -> EnvResults:
    """One asv result file (one commit x one environment)."""
    try:
        data = json.loads(path.read_text())
        columns = data["result_columns"]
        result_at, params_at = columns.index("result"), columns.index("params")
        values = {}
        for name, row in data["results"].items():
            benchmark = name.split(".", 1)[1] if "." in name else name  # drop the module name
            results, [cases] = row[result_at], row[params_at]
            if results is None:  # the benchmark failed as a whole
                continue
            for case, value in zip(cases, results, strict=True):
                if value is not None and not (isinstance(value, float) and math.isnan(value)):
                    values[(benchmark, case.strip("'"))] = float(value)
        return EnvResults(path, data["commit_hash"], data["env_name"], int(data.get("date") or 0), values)
    except FileNotFoundError:
        raise AsvResultsError(f"{path}: no such file") from None
    except json.JSONDecodeError as e:
        raise AsvResultsError(f"{path}: not valid JSON: {e}") from None
    except (KeyError, ValueError, TypeError) as e:
        raise AsvResultsError(f"{path}: not an asv result file (expected result_columns with 'result' and "
                              f"'params', results, commit_hash, env_name): {e!r}") from None


# What an ``-E existing:PYTHON`` environment's results name it by: asv keys them (and the dashboard's legend) by the
# interpreter's path, e.g. /work/.venv-torch2.9.1/bin/python, where a reader wants the torch release.
EXISTING = "existing"


def label_existing_environments(machine_dir: Path) -> list[str]:
    """Each result file of an ``existing`` environment under ``machine_dir`` keyed by its torch release instead of its
    interpreter's path: its ``params`` become ``{"machine": ..., "torch": "2.9.1"}`` (the release its environment's
    name gives, ``EnvResults.torch``), written whole; the files already so labelled are left alone. Returns one line
    per file changed; raises ``AsvResultsError`` (before changing any file) where a name gives no release."""
    changes = []
    for path in sorted(machine_dir.glob("*.json")):
        if path.name == "machine.json":
            continue
        data = json.loads(path.read_text())
        params = data.get("params") or {}
        if not str(data.get("env_name", "")).startswith(EXISTING) or "torch" in params:
            continue
        env = load_env_results(path)
        if not re.fullmatch(r"\d+(?:\.\d+)+", env.torch):
            raise AsvResultsError(f"{path}: environment {env.env_name!r} names no torch release; expected an "
                                  "interpreter under a folder such as .venv-torch2.9.1 (docs/gate-and-ab.md, asv)")
        changes.append((path, data, {"machine": params.get("machine"), "torch": env.torch}))
    lines = []
    for path, data, labelled in changes:
        # as asv writes them: one line, keys in their order (a diff shows the params alone)
        write_text_atomic(path, json.dumps({**data, "params": labelled}))
        lines.append(f"{path.name}: python {data['params'].get('python')} -> torch {labelled['torch']}")
    return lines


def environments_of_commit(machine_dir: Path, commit: str | None = None) -> list[EnvResults]:
    """The result files of ``commit`` (a prefix), or of the newest commit measured in 2+ environments."""
    if not machine_dir.is_dir():
        raise AsvResultsError(f"{machine_dir}: no asv results folder (expected results/asv/<machine>)")
    envs = [load_env_results(p) for p in sorted(machine_dir.glob("*.json")) if p.name != "machine.json"]
    by_commit: dict[str, list[EnvResults]] = {}
    for env in envs:
        by_commit.setdefault(env.commit, []).append(env)
    if commit is not None:
        chosen = [envs for full, envs in by_commit.items() if full.startswith(commit)]
        if len(chosen) != 1:
            raise AsvResultsError(f"{machine_dir}: commit {commit!r} matches {len(chosen)} recorded commits "
                                  f"(recorded: {', '.join(sorted(c[:8] for c in by_commit)) or 'none'})")
        return sorted(chosen[0], key=_version_key)
    several = [envs for envs in by_commit.values() if len(envs) >= 2]
    if not several:
        raise AsvResultsError(f"{machine_dir}: no commit is recorded in two environments or more")
    return sorted(max(several, key=lambda envs: max(e.date for e in envs)), key=_version_key)


@dataclass
class EnvDiff:
    before: EnvResults
    after: EnvResults
    exact_equal: int
    exact_changed: list[tuple[str, str, float, float]]  # benchmark, case, before, after
    step_time_ratios: dict[str, float]  # case -> after / before


def diff_environments(before: EnvResults, after: EnvResults) -> EnvDiff:
    equal, changed, ratios = 0, [], {}
    for key in sorted(before.values.keys() & after.values.keys()):
        benchmark, case = key
        a, b = before.values[key], after.values[key]
        if benchmark.split(".")[0] in EXACT_CLASSES:
            if a == b:
                equal += 1
            else:
                changed.append((benchmark, case, a, b))
        elif benchmark == STEP_TIME and a > 0:
            ratios[case] = b / a
    return EnvDiff(before, after, equal, changed, ratios)


def _change(a: float, b: float) -> str:
    return f"{(b - a) / abs(a):+.1%}" if a else "new"


def format_diff(diff: EnvDiff) -> str:
    before, after = diff.before, diff.after
    lines = [(f"commit {before.commit[:8]}: torch {before.torch} ({before.path.name}) -> "
              f"torch {after.torch} ({after.path.name})"),
             f"Memory and Work (exact): {diff.exact_equal} values equal, {len(diff.exact_changed)} differ"]
    width = max((len(f"{b} {c}") for b, c, _, _ in diff.exact_changed), default=0)
    for benchmark, case, a, b in sorted(diff.exact_changed, key=lambda d: (d[0], -abs(d[3] - d[2]) / (abs(d[2]) or 1))):
        lines.append(f"  {f'{benchmark} {case}':<{width}}  {a:.6g} -> {b:.6g} ({_change(a, b)})")
    if diff.step_time_ratios:
        ratios = sorted(diff.step_time_ratios.items(), key=lambda kv: kv[1])
        values = [r for _, r in ratios]
        lines.append(f"Step time, torch {after.torch} / {before.torch}: median {statistics.median(values):.3f}, "
                     f"{values[0]:.2f} ({ratios[0][0]}) to {values[-1]:.2f} ({ratios[-1][0]}) over {len(values)} "
                     "cases; one run per side, so the spread is this runner's noise plus any real change")
    return "\n".join(lines)
