"""How ``python -m trainbench bisect`` judges a commit: its own checkout, its environment, and its runs.

Each commit is checked out into a git worktree of its own under the search's folder (the user's working tree and
index are never touched) and run with pytest there, the commit's test modules and source folders ahead of anything
installed (``PYTHONPATH``). Its environment is the current Python, or the one a build command names (run in the
checkout; its last line of output is the Python to use; a build that fails skips the commit, as ``git bisect skip``).

- An exact signal (a deterministic metric: memory breakdown, FLOPs, ops, syncs, bytes): one run of each commit,
  its pytest-benchmark JSON kept under the search's folder, compared with the good commit's run by the gate's rules
  (``compare.explain_runs``): worse beyond the threshold is bad, anything else measured is good.
- A timed signal: a paired, interleaved A/B of the commit (head) against the newest commit known good (base), both in
  one pytest session (``--trainbench-ab`` with ``--trainbench-ab-base-root``); "regressed" is bad, "unchanged" or
  "improved" good, and "could not judge" (after measuring again within ``--remeasure-s``) stops the search.
Nothing is saved into the project's ``.benchmarks``: the runs write JSON files into the search's folder only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from trainbench.core.records.metrics import METRICS
from trainbench.verdicts.bisect import BAD, GOOD, SKIP, UNDECIDED, Commit, Step
from trainbench.verdicts.compare import CompareError, explain_runs
from trainbench.verdicts.gate import VerdictFileError, read_verdict
from trainbench.verdicts.present import terminal_lines, verdict_sections
from trainbench.verdicts.store import RunFileError


class BisectError(Exception):
    """A search that cannot start: a ref that is not a commit, a good commit that is not an ancestor of the bad one."""


def _last_line(text: str, default: str) -> str:
    """The last line of a command's output that says something, else ``default``."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else default


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise BisectError(f"git {' '.join(args)}: {_last_line(done.stderr or done.stdout, 'failed')}")
    return done.stdout.strip()


def commits_between(repo: Path, good: str, bad: str) -> tuple[Commit, list[Commit]]:
    """The good commit, and the first-parent commits after it up to the bad one (oldest first)."""
    shas = []
    for ref in (good, bad):
        try:
            shas.append(git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"))
        except BisectError:
            raise BisectError(f"{ref}: not a commit of {repo}") from None
    try:
        git(repo, "merge-base", "--is-ancestor", *shas)
    except BisectError:
        raise BisectError(f"{good} is not an ancestor of {bad}: expected the good commit before the bad one") from None
    listed = git(repo, "log", "--reverse", "--first-parent", "--format=%H%x00%s", f"{shas[0]}..{shas[1]}")
    commits = [Commit(*line.split("\0", 1)) for line in listed.splitlines() if line]
    return Commit(shas[0], git(repo, "log", "-1", "--format=%s", shas[0])), commits


@dataclass
class Checkouts:
    """Detached worktrees of commits under ``folder``, made on demand and removed at the end."""

    repo: Path
    folder: Path
    made: dict[str, Path] = field(default_factory=dict)

    def of(self, sha: str) -> Path:
        if sha not in self.made:
            tree = self.folder / sha[:12]
            if tree.exists():  # left by an interrupted search
                git(self.repo, "worktree", "remove", "--force", str(tree))
            git(self.repo, "worktree", "add", "--detach", "--force", str(tree), sha)
            self.made[sha] = tree
        return self.made[sha]

    def close(self) -> None:
        for tree in self.made.values():
            try:
                git(self.repo, "worktree", "remove", "--force", str(tree))
            except BisectError:
                pass  # already gone; pruned below
        self.made.clear()
        git(self.repo, "worktree", "prune")


class Unbuildable(Exception):
    """A commit whose environment cannot be built or whose cases cannot be run: skipped."""


def environment(tree: Path, build: str | None) -> str:
    """The Python to run ``tree``'s commit with: this one, or the last line ``build`` prints (run in ``tree``)."""
    if not build:
        return sys.executable
    done = subprocess.run(build, shell=True, cwd=tree, capture_output=True, text=True)
    if done.returncode != 0:
        last = _last_line(done.stderr or done.stdout, "no output")
        raise Unbuildable(f"the build command exited {done.returncode}: {last}")
    lines = done.stdout.strip().splitlines()
    python = (tree / lines[-1].strip()) if lines else None
    if python is None or not os.access(python, os.X_OK):
        raise Unbuildable(f"the build command's last line {lines[-1:] or ['(none)']} is not a Python executable; "
                          "expected the path of the environment's python")
    return str(python)


def run_pytest(python: str, tree: Path, args: list[str], timeout_s: float) -> subprocess.CompletedProcess:
    """pytest in ``tree`` with the commit's own test modules and source folders first on ``sys.path``."""
    paths = [str(p) for p in (tree / "src", tree) if p.is_dir()]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*paths, *filter(None, [os.environ.get("PYTHONPATH")])])}
    try:
        return subprocess.run([python, "-m", "pytest", *args], cwd=tree, env=env, capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise Unbuildable(f"pytest ran past {timeout_s:g} s") from None


def _what_stopped(done: subprocess.CompletedProcess) -> str:
    """What stopped a pytest run, in one line: its last error (pytest's short summary), else its last line."""
    output = done.stdout + "\n" + done.stderr
    errors = "\n".join(line for line in output.splitlines()
                       if line.strip().startswith(("ERROR ", "INTERNALERROR", "trainbench: ")))
    return _last_line(errors or output, f"exit status {done.returncode}")


@dataclass
class Judge:
    """Judges commits for one search: ``metrics`` (worse beyond ``threshold`` is bad) of the cases ``pytest_args``
    select, each commit checked out by ``checkouts`` and run in the environment ``build`` makes."""

    checkouts: Checkouts
    runs: Path  # where each commit's run (exact) or A/B verdict (timed) is written
    metrics: list[str]
    threshold: float
    pytest_args: list[str]
    build: str | None = None
    timeout_s: float = 1800.0
    remeasure_s: float = 120.0
    pairs: int | None = None
    pythons: dict[str, str] = field(default_factory=dict)  # each commit's environment, built once

    def python(self, commit: Commit) -> str:
        if commit.sha not in self.pythons:
            self.pythons[commit.sha] = environment(self.checkouts.of(commit.sha), self.build)
        return self.pythons[commit.sha]

    @property
    def timed(self) -> bool:
        return any(METRICS[m].timed for m in self.metrics)

    def thresholds(self) -> dict[str, float]:
        return {m: self.threshold for m in self.metrics}

    def exact_run(self, commit: Commit) -> Path:
        """The commit's run (pytest-benchmark JSON), made once: a rerun of the search reads it again."""
        path = self.runs / f"{commit.sha}.json"
        if path.exists():
            return path
        tree, python = self.checkouts.of(commit.sha), self.python(commit)
        partial = path.with_suffix(".partial.json")
        done = run_pytest(python, tree, [*self.pytest_args, f"--benchmark-json={partial}", "--trainbench-attribution",
                                         "-p", "no:cacheprovider", "-q"], self.timeout_s)
        if done.returncode not in (0, 1) or not partial.exists():  # 1: a case failed its budget, and was measured
            raise Unbuildable(f"pytest exited {done.returncode}: {_what_stopped(done)}")
        partial.replace(path)
        return path

    def judge(self, commit: Commit, good: Commit, last_good: Commit) -> Step:
        """``commit`` judged against ``good`` (exact) or ``last_good`` (timed)."""
        started = time.monotonic()
        against = last_good if self.timed else good
        try:
            verdict, seen, details = (self._timed if self.timed else self._exact)(commit, against)
        except Unbuildable as e:
            verdict, seen, details = SKIP, str(e), ()
        return Step(commit.sha, verdict, seen, against.sha, time.monotonic() - started, details)

    def explained(self, base: Commit, current: Commit, thresholds: dict[str, float]):
        """``current``'s run against ``base``'s by the gate's rules (``compare.explain_runs``; each run made once)."""
        try:
            return explain_runs(str(self.exact_run(base)), str(self.exact_run(current)), thresholds=thresholds)
        except (CompareError, RunFileError) as e:
            raise Unbuildable(str(e)) from None

    def _exact(self, commit: Commit, good: Commit) -> tuple[str, str, tuple[str, ...]]:
        explained = self.explained(good, commit, self.thresholds())
        if explained.verdict.not_run:  # judged on fewer cases than the good commit ran: a regression could hide there
            raise Unbuildable(f"{', '.join(sorted(explained.verdict.not_run))} not measured at this commit")
        return judged(explained.verdict.to_json(), self.metrics, explained.lines())

    def _timed(self, commit: Commit, base: Commit) -> tuple[str, str, tuple[str, ...]]:
        head_tree, base_tree = self.checkouts.of(commit.sha), self.checkouts.of(base.sha)
        head_python, base_python = self.python(commit), self.python(base)
        out = self.runs / f"{base.sha[:12]}-{commit.sha[:12]}-ab.json"
        fail = ",".join(f"{m}:{self.threshold:.6g}" for m in self.metrics)
        args = [*self.pytest_args, f"--trainbench-ab={head_python}", f"--trainbench-ab-base={base_python}",
                f"--trainbench-ab-base-root={base_tree}", f"--trainbench-compare-fail={fail}",
                f"--trainbench-remeasure-s={self.remeasure_s:g}", f"--trainbench-compare-json={out}",
                "--trainbench-allow-inconclusive", "-p", "no:cacheprovider", "-q"]
        if self.pairs:
            args.append(f"--trainbench-ab-pairs={self.pairs}")
        done = run_pytest(head_python, head_tree, args, self.timeout_s)
        if not out.exists():
            raise Unbuildable(f"the A/B session exited {done.returncode}: {_what_stopped(done)}")
        try:
            verdict = read_verdict(json.loads(out.read_text(encoding="utf-8")), str(out))
        except (ValueError, VerdictFileError) as e:
            raise Unbuildable(f"{out}: {e}") from None
        return judged(verdict, self.metrics, terminal_lines(verdict_sections(verdict, judged=False)))


def judged(verdict: dict, metrics: list[str], lines: list[str]) -> tuple[str, str, tuple[str, ...]]:
    """A step's verdict from a comparison's (``Verdict.to_json``): bad where a metric regressed, undecided where one
    could not be judged (or none of the metrics was compared), else good; and what was seen, one line."""
    rows = [c for c in verdict.get("comparisons", []) if c.get("metric") in metrics]
    if not rows:
        return UNDECIDED, f"no case measured {' or '.join(metrics)} in both", tuple(lines)
    # the rows that decide first (regressed, then could not judge), one in full and how many more
    order = {"regressed": 0, "inconclusive": 1, "missing": 1, "improved": 2, "unchanged": 3}
    rows.sort(key=lambda c: (order.get(c.get("verdict"), 1), -abs(c.get("change") or 0)))
    seen = _line(rows[0]) + (f" (and {len(rows) - 1} more: " + ", ".join(
        f"{n} {v}" for v, n in sorted(Counter(c.get("verdict") for c in rows[1:]).items())) + ")" if len(rows) > 1 else "")
    outcomes = {c.get("verdict") for c in rows}
    if "regressed" in outcomes:
        return BAD, seen, tuple(lines)
    if outcomes <= {"unchanged", "improved"}:
        return GOOD, seen, tuple(lines)
    return UNDECIDED, seen, tuple(lines)


def _line(c: dict) -> str:
    """A comparison's one line, as the gate prints it (``MetricComparison.describe``, kept in its JSON)."""
    return c.get("line") or f"{c.get('case')} {c.get('metric')}: {c.get('verdict')}"
