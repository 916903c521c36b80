"""The search of ``python -m trainbench bisect``: from GOOD and BAD to the first commit where a metric of the chosen
cases got worse, each step judged by ``bisect_runs.Judge``, logged as it ends (a rerun continues it) and printed."""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import trainbench
from trainbench.core.harness.files import write_json_atomic
from trainbench.core.records.metrics import deterministic_metrics
from trainbench.jobs.bisect_runs import BisectError, Checkouts, Judge, Unbuildable, commits_between, git
from trainbench.verdicts.bisect import BAD, BisectLog, Search, Step


@dataclass(frozen=True)
class BisectRequest:
    """What a search is asked: the commits, the metrics (None: those worse at BAD), how each commit is run, where
    its files go."""

    good: str
    bad: str
    metrics: list[str] | None
    threshold: float | None  # None: by the metrics' kind
    pytest_args: list[str]
    build: str | None
    repo: Path
    workdir: Path | None  # None: trainbench-bisect in the repository's git folder
    remeasure_s: float
    pairs: int | None
    json_path: str | None  # also write the answer and every step there


def bisect(request: BisectRequest) -> int:
    """The search, start to end: its exit status (0: the first bad commit found, 1: it could not tell)."""
    metrics, threshold = request.metrics, request.threshold
    repo = Path(git(request.repo, "rev-parse", "--show-toplevel"))
    good, commits = commits_between(repo, request.good, request.bad)
    if not commits:
        raise BisectError(f"{request.bad} is {request.good}: nothing to search")
    workdir = request.workdir or Path(git(repo, "rev-parse", "--path-format=absolute",
                                          "--git-common-dir")) / "trainbench-bisect"
    pytest_args = request.pytest_args
    header = {"good": good.sha, "bad": commits[-1].sha, "metrics": metrics or "worse at bad", "threshold": threshold,
              "pytest_args": pytest_args, "build": request.build, "environment": _environment()}
    digest = hashlib.sha256(json.dumps(header, sort_keys=True).encode()).hexdigest()[:12]
    log = BisectLog(workdir / f"{digest}.jsonl", header)
    checkouts = Checkouts(repo, workdir / "trees")
    # a commit's run depends on how it is run, not on what is searched for: another metric's search reads it again
    # (and on the environment: a run made under another torch or trainbench is not this search's)
    runs = hashlib.sha256(json.dumps([pytest_args, request.build, _environment()]).encode()).hexdigest()[:12]
    judge = Judge(checkouts, workdir / "runs" / runs, metrics or [], 0.0, pytest_args, request.build,
                  remeasure_s=request.remeasure_s, pairs=request.pairs)
    try:
        judge.runs.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BisectError(f"--workdir {workdir}: cannot write there ({e.strerror or e})") from None
    try:
        return _search(request, judge, log, good, commits, threshold)
    finally:
        checkouts.close()


def _environment() -> list[str]:
    """What the runs are made with, where no --build names another: this Python, its torch and trainbench."""
    try:
        torch = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch = "none"
    return [sys.executable, torch, trainbench.__version__]


def _search(request: BisectRequest, judge: Judge, log: BisectLog, good, commits, threshold: float | None) -> int:
    steps, note = log.read()
    if note:
        print(note)
    if not judge.metrics:
        try:
            judge.metrics = _worse_at_bad(judge, good, commits[-1])
        except Unbuildable as e:
            return _stopped(f"GOOD or BAD could not be measured: {e}")
        if not judge.metrics:
            return _stopped(f"no deterministic metric of the cases is worse at {commits[-1].short} than at {good.short}; "
                            "name a timed one to search by A/B (--metric step_time_ms)")
    judge.threshold = threshold if threshold is not None else (0.05 if judge.timed else 0.0)
    search = Search(commits, [s for s in steps if s.commit != commits[-1].sha])
    print(f"bisect: {len(commits)} commits after {good.line()} up to {commits[-1].short}, by "
          f"{', '.join(judge.metrics)} ({'paired A/B' if judge.timed else 'one run a commit'}; worse by more than "
          f"{judge.threshold:.1%} is bad): about {search.steps_needed()} steps; log {log.path}")
    verified = next((s for s in steps if s.commit == commits[-1].sha), None)
    if verified is None:  # the bad commit is worse than the good one, or there is nothing to find
        verified = judge.judge(commits[-1], good, good)
        log.append(verified)
    print(f"  {commits[-1].short} (BAD) against {good.short} (GOOD): {verified.seen}: {verified.verdict}")
    if verified.verdict != BAD:
        return _stopped(f"{commits[-1].short} is not worse than {good.short} by the metric ({verified.verdict}): "
                        "nothing to search")
    number = len(search.steps)
    while (commit := search.next()) is not None:
        last_good = search.answer().last_good or good
        step = judge.judge(commit, good, last_good)
        log.append(step)
        search.record(step)
        number += 1
        print(f"  step {number}: {commit.line()}: {step.seen}: {step.verdict} ({step.seconds:.1f} s)", flush=True)
    return _answer(request, judge, search, good, verified)


def _worse_at_bad(judge: Judge, good, bad) -> list[str]:
    """The deterministic metrics worse at ``bad`` than at ``good`` (both run once, kept for the search)."""
    explained = judge.explained(good, bad, {m: 0.0 for m in deterministic_metrics()})
    return sorted({c.metric for c in explained.verdict.comparisons if c.verdict == "regressed"})


def _answer(request: BisectRequest, judge: Judge, search: Search, good, verified: Step) -> int:
    answer = search.answer()
    result = {"metrics": judge.metrics, "threshold": judge.threshold, "steps": [s.to_json() for s in search.steps],
              "bad_vs_good": verified.to_json(), "first_bad": None, "open": [c.sha for c in answer.open],
              "stopped": answer.stopped}
    if answer.first_bad is None:
        _write(request.json_path, result)
        return _stopped(f"{answer.stopped}; the first bad commit is one of {len(answer.open)} after "
                        f"{(answer.last_good or good).line()}: " + ", ".join(c.short for c in answer.open))
    bad, before = answer.first_bad, answer.last_good or good
    step = next((s for s in search.steps if s.commit == bad.sha), verified)
    lines = step.details
    if not judge.timed:  # exact: the change across the commit itself, against its parent's run
        lines = tuple(judge.explained(before, bad, judge.thresholds()).lines())
    result["first_bad"] = {"sha": bad.sha, "subject": bad.subject, "against": step.against, "seen": step.seen}
    _write(request.json_path, result)
    print(f"first bad commit: {bad.line()}")
    print(f"  {step.seen} (against {step.against[:12] if step.against else good.short})")
    for line in lines:
        print(f"  {line}")
    print(f"trainbench bisect: found in {len(search.steps)} steps (after checking BAD against GOOD)")
    return 0


def _stopped(why: str) -> int:
    print(f"trainbench bisect: FAILED to find the commit: {why}")
    return 1


def _write(path: str | None, result: dict) -> None:
    if path:
        write_json_atomic(Path(path), result)

