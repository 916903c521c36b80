"""``python -m trainbench report``: the optimization-ladder tables and plots of a saved run."""

from __future__ import annotations

import argparse
import sys

from trainbench.verdicts.report import write_ladder_report
from trainbench.verdicts.store import RunFileError, latest_run

NAME = "report"
HELP = "render the optimization-ladder tables and plots of a saved benchmark run"
DESCRIPTION = ("Render ladders.md and one PNG per ladder from a pytest-benchmark JSON run, "
               "next to the figures the seed articles printed.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_json", nargs="?", default=None, metavar="RUN_JSON",
                        help="pytest-benchmark JSON (default: the newest *.json under results/benchmarks/)")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="output folder (default: results/report/<device>)")


def run(args: argparse.Namespace) -> int:
    try:
        run_path = args.run_json if args.run_json is not None else latest_run()
        written = write_ladder_report(run_path, args.out)
    except RunFileError as e:
        print(f"trainbench report: {e}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0
