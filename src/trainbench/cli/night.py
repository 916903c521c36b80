"""``python -m trainbench night``: the GPU night, from the doctor to the summary."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..night import NightError, run_night, summarize_again

NAME = "night"
HELP = "the GPU night: doctor, self-checks, the cases by what they tell, calibration, report, summary"
DESCRIPTION = ("Spend a GPU window measuring, within --budget-s, writing into --out as it goes: the doctor "
               "(doctor.json), the GPU self-checks (smoke/), the suite's cases in groups ordered by what they "
               "tell, the merged run (run.json), its device's budgets section calibrated (a diff), the ladder "
               "report, the simulated plan of the same GPU (plan.json) and summary.md beside it. Each step is a "
               "child process of this interpreter: nothing is installed, nothing is fetched. Exit 1 when a "
               "step failed, 2 when the night cannot start.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--budget-s", type=float, default=None, metavar="SECONDS",
                        help="wall time for the whole night; measuring stops early enough to merge and summarize")
    parser.add_argument("--summarize", action="store_true",
                        help="run nothing: rewrite DIR/summary.md from what the folder holds now (e.g. a plan.json "
                             "made afterwards with plan --simulate-gpu GPU --json DIR/plan.json)")
    parser.add_argument("--out", required=True, metavar="DIR", help="the night's folder (night.json, logs/, ...)")
    parser.add_argument("--simulate-gpu", default=None, metavar="GPU",
                        help="rehearse on a simulated GPU (a fleet name or spec): cases collect and skip as on it, "
                             "nothing is measured")
    parser.add_argument("--pytest-arg", action="append", default=[], metavar="ARG",
                        help="one more argument for every pytest session of the night (repeatable)")


def run(args: argparse.Namespace) -> int:
    try:
        if args.summarize:
            print(summarize_again(Path(args.out)))
            return 0
        if args.budget_s is None:
            raise NightError("--budget-s: required to run a night")
        return run_night(Path(args.out), args.budget_s, args.simulate_gpu, Path.cwd(),
                         pytest_args=tuple(args.pytest_arg))
    except NightError as e:
        print(f"trainbench night: {e}", file=sys.stderr)
        return 2

