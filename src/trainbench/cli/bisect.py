"""``python -m trainbench bisect GOOD BAD``: the first commit between two where a metric of the chosen cases got worse."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from trainbench.core.records.metrics import METRICS, ThresholdError, parse_thresholds
from trainbench.jobs.bisect_runs import BisectError
from trainbench.jobs.bisect_search import BisectRequest, bisect

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
        metrics, threshold = _metrics(args)
        _check_ab_options(args)
        return bisect(BisectRequest(
            good=args.good, bad=args.bad, metrics=metrics, threshold=threshold,
            pytest_args=[*args.pytest_arg, *(["-k", args.keyword] if args.keyword else [])], build=args.build,
            repo=Path(args.repo), workdir=Path(args.workdir) if args.workdir else None, remeasure_s=args.remeasure_s,
            pairs=args.pairs, json_path=args.json))
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
    from trainbench.plugin.options import least_ab_pairs  # the plugin's options load pytest: only a search pays for it

    if not (math.isfinite(args.remeasure_s) and args.remeasure_s >= 0):
        raise BisectError(f"--remeasure-s={args.remeasure_s:g}: expected seconds >= 0")
    if args.pairs is not None and args.pairs < least_ab_pairs():
        raise BisectError(f"--pairs={args.pairs}: expected at least {least_ab_pairs()} (fewer pairs cannot place a "
                          "change in a 95% interval at the first look)")
