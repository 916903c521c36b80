"""``python -m trainbench bisect GOOD BAD``: the first commit between two where a metric of the chosen cases got worse."""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from trainbench.core.records.metrics import METRICS, ThresholdError, deterministic_metrics, parse_thresholds
from trainbench.verdicts.bisect import BAD, BisectLog, Search, Step
from trainbench.jobs.bisect_runs import BisectError, Checkouts, Judge, Unbuildable, commits_between, git

NAME = "bisect"
HELP = "find the commit between GOOD and BAD where a metric of the chosen cases got worse"
DESCRIPTION = (
    "Binary search over the first-parent commits after GOOD up to BAD of the git repository here, each commit "
    "checked out into a worktree of its own (the working tree is never touched) and its cases run with pytest. On "
    "an exact signal (a deterministic metric: memory breakdown, FLOPs, ops, syncs, bytes) a step is one run of the "
    "commit, compared with GOOD's by the gate's rules; on a timed one (step_time_ms, samples_per_s, ...) a paired "
    "A/B against the newest commit known good, measured again within --remeasure-s while it cannot tell, and the "
    "search stops where it still cannot, saying where it stands. A commit whose environment does not build or "
    "whose cases do not run is skipped. Steps are logged as they end: a rerun continues the search. Exit status 0 "
    "with the first bad commit found, 1 when the search could not tell, 2 on a bad input.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("good", metavar="GOOD", help="a commit (any git ref) where the cases are as they should be")
    parser.add_argument("bad", metavar="BAD", help="a later commit where they are worse")
    parser.add_argument("-k", dest="keyword", default=None, metavar="EXPR",
                        help="only the cases this pytest -k expression selects (default: every case pytest collects)")
    parser.add_argument("--metric", action="append", default=None, metavar="M",
                        help="the metric that got worse (repeatable); default: every deterministic metric worse at "
                             "BAD than at GOOD (a timed one, e.g. step_time_ms, is searched by A/B)")
    parser.add_argument("--threshold", default=None, metavar="T",
                        help="how much worse is bad, e.g. 5%% (default 0%% for deterministic metrics, 5%% for timed)")
    parser.add_argument("--pytest-arg", action="append", default=[], metavar="ARG",
                        help="passed to each commit's pytest run (repeatable), e.g. --pytest-arg=tests/test_speed.py")
    parser.add_argument("--build", default=None, metavar="CMD",
                        help="a shell command run in each commit's checkout that builds its environment and prints "
                             "its python's path as its last line (default: this Python, the commit's code first on "
                             "sys.path); a commit whose build fails is skipped")
    parser.add_argument("--repo", default=".", metavar="DIR", help="the git repository (default: the one here)")
    parser.add_argument("--workdir", default=None, metavar="DIR",
                        help="where the checkouts, runs and the log go (default: trainbench-bisect in the "
                             "repository's git folder, which git status never shows)")
    parser.add_argument("--remeasure-s", type=float, default=120.0, metavar="S",
                        help="a timed step that cannot tell is measured again for up to S seconds (default 120)")
    parser.add_argument("--pairs", type=int, default=None, metavar="N", help="A/B pairs of timed rounds per case")
    parser.add_argument("--json", default=None, metavar="FILE", help="also write the answer and every step to FILE")


def run(args: argparse.Namespace) -> int:
    try:
        return _bisect(args)
    except (BisectError, ThresholdError) as e:
        print(f"trainbench bisect: {e}", file=sys.stderr)
        return 2


def _metrics(args: argparse.Namespace) -> tuple[list[str] | None, float | None]:
    """The metrics named (None: found from GOOD and BAD) and the threshold given (None: by the metrics' kind)."""
    threshold = None
    if args.threshold is not None:
        threshold = next(iter(parse_thresholds(f"step_time_ms:{args.threshold}", "--threshold").values()))
    if not args.metric:
        return None, threshold
    named = list(parse_thresholds(",".join(f"{m}:0%" for m in args.metric), "--metric"))
    if len({METRICS[m].timed for m in named}) > 1:
        raise ThresholdError(f"--metric {' '.join(args.metric)}: name timed or deterministic metrics, not both "
                             "(a timed one is searched by A/B, a deterministic one by single runs)")
    return named, threshold


def _check_ab_options(args: argparse.Namespace) -> None:
    """The timed steps' A/B options, checked before anything runs (each A/B session would refuse them)."""
    import math

    from trainbench.plugin.options import least_ab_pairs

    if not (math.isfinite(args.remeasure_s) and args.remeasure_s >= 0):
        raise BisectError(f"--remeasure-s={args.remeasure_s:g}: expected seconds >= 0")
    if args.pairs is not None and args.pairs < least_ab_pairs():
        raise BisectError(f"--pairs={args.pairs}: expected at least {least_ab_pairs()} (fewer pairs cannot place a "
                          "change in a 95% interval at the first look)")


def _bisect(args: argparse.Namespace) -> int:
    metrics, threshold = _metrics(args)
    _check_ab_options(args)
    repo = Path(git(Path(args.repo), "rev-parse", "--show-toplevel"))
    good, commits = commits_between(repo, args.good, args.bad)
    if not commits:
        raise BisectError(f"{args.bad} is {args.good}: nothing to search")
    workdir = Path(args.workdir) if args.workdir else Path(git(repo, "rev-parse", "--path-format=absolute",
                                                              "--git-common-dir")) / "trainbench-bisect"
    pytest_args = [*args.pytest_arg, *(["-k", args.keyword] if args.keyword else [])]
    header = {"good": good.sha, "bad": commits[-1].sha, "metrics": metrics or "worse at bad", "threshold": threshold,
              "pytest_args": pytest_args, "build": args.build, "environment": _environment()}
    digest = hashlib.sha256(json.dumps(header, sort_keys=True).encode()).hexdigest()[:12]
    log = BisectLog(workdir / f"{digest}.jsonl", header)
    checkouts = Checkouts(repo, workdir / "trees")
    # a commit's run depends on how it is run, not on what is searched for: another metric's search reads it again
    # (and on the environment: a run made under another torch or trainbench is not this search's)
    runs = hashlib.sha256(json.dumps([pytest_args, args.build, _environment()]).encode()).hexdigest()[:12]
    judge = Judge(checkouts, workdir / "runs" / runs, metrics or [], 0.0, pytest_args, args.build,
                  remeasure_s=args.remeasure_s, pairs=args.pairs)
    try:
        judge.runs.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BisectError(f"--workdir {workdir}: cannot write there ({e.strerror or e})") from None
    try:
        return _search(args, judge, log, good, commits, threshold)
    finally:
        checkouts.close()


def _environment() -> list[str]:
    """What the runs are made with, where no --build names another: this Python, its torch and trainbench."""
    from importlib import metadata

    import trainbench

    try:
        torch = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch = "none"
    return [sys.executable, torch, trainbench.__version__]


def _search(args, judge: Judge, log: BisectLog, good, commits, threshold: float | None) -> int:
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
    return _answer(args, judge, search, good, verified)


def _worse_at_bad(judge: Judge, good, bad) -> list[str]:
    """The deterministic metrics worse at ``bad`` than at ``good`` (both run once, kept for the search)."""
    explained = judge.explained(good, bad, {m: 0.0 for m in deterministic_metrics()})
    return sorted({c.metric for c in explained.verdict.comparisons if c.verdict == "regressed"})


def _answer(args, judge: Judge, search: Search, good, verified: Step) -> int:
    answer = search.answer()
    result = {"metrics": judge.metrics, "threshold": judge.threshold, "steps": [s.to_json() for s in search.steps],
              "bad_vs_good": verified.to_json(), "first_bad": None, "open": [c.sha for c in answer.open],
              "stopped": answer.stopped}
    if answer.first_bad is None:
        _write(args.json, result)
        return _stopped(f"{answer.stopped}; the first bad commit is one of {len(answer.open)} after "
                        f"{(answer.last_good or good).line()}: " + ", ".join(c.short for c in answer.open))
    bad, before = answer.first_bad, answer.last_good or good
    step = next((s for s in search.steps if s.commit == bad.sha), verified)
    lines = step.details
    if not judge.timed:  # exact: the change across the commit itself, against its parent's run
        lines = tuple(judge.explained(before, bad, judge.thresholds()).lines())
    result["first_bad"] = {"sha": bad.sha, "subject": bad.subject, "against": step.against, "seen": step.seen}
    _write(args.json, result)
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
        from trainbench.core.harness.files import write_json_atomic

        write_json_atomic(Path(path), result)

