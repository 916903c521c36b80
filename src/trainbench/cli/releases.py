"""``python -m trainbench releases``: what the PyTorch releases recorded by asv differ in, case by case."""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

from trainbench.verdicts.asv_results import (
    AsvResultsError,
    diff_environments,
    environments_of_commit,
    format_diff,
    label_existing_environments,
)

NAME = "releases"
HELP = "what the PyTorch releases recorded by asv differ in, case by case"
DESCRIPTION = ("For one commit recorded by asv in one environment per torch release: every Memory and Work "
               "value that differs between consecutive releases, and the spread of step-time ratios.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--results", default="results/asv", help="asv results_dir (default results/asv)")
    parser.add_argument("--machine", required=True, help="asv machine name (a folder under --results)")
    parser.add_argument("--commit", default=None,
                        help="commit hash or prefix (default: the newest commit recorded in two environments)")
    parser.add_argument("--label", action="store_true",
                        help="instead: key each result of an `-E existing:PYTHON` environment by its torch release, "
                             "not the interpreter's path (what asv publish's legend shows), in place")


def run(args: argparse.Namespace) -> int:
    if args.label:
        try:
            changed = label_existing_environments(Path(args.results) / args.machine)
        except AsvResultsError as e:
            print(f"trainbench releases: {e}", file=sys.stderr)
            return 2
        for line in changed or ["every existing environment is keyed by its torch release already"]:
            print(line)
        return 0
    try:
        machine_dir = Path(args.results) / args.machine
        envs = environments_of_commit(machine_dir, args.commit)
        if len(envs) < 2:
            raise AsvResultsError(f"{machine_dir}: commit {envs[0].commit[:8]} has one environment; "
                                  "record another release first (docs/gate-and-ab.md, asv)")
    except AsvResultsError as e:
        print(f"trainbench releases: {e}", file=sys.stderr)
        return 2
    for before, after in itertools.pairwise(envs):
        print(format_diff(diff_environments(before, after)))
    return 0
