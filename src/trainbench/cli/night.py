"""``python -m trainbench night``: the GPU night within a time budget, its archive in every ending
(``trainbench.jobs.night``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trainbench.jobs.night_manifest import NightError

NAME = "night"
HELP = "the GPU night: doctor, self-checks, the cases by what they tell, calibration, report, summary"
DESCRIPTION = ("Spend a GPU window measuring, within --budget-s, writing into --out as it goes: the doctor "
               "(doctor.json), the GPU self-checks (smoke/, capped), the suite's cases in one session in the order "
               "of what they tell, the run (run.json), its device's budgets section calibrated (a diff), the ladder "
               "report and summary.md beside the plan made before the night (--plan); --archive packs it all into "
               "one .tar.gz whatever the ending. Each step is a child process of this interpreter: nothing is "
               "installed, nothing is fetched. Exit 1 when a step failed or the night was interrupted, 2 when it "
               "cannot start.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--budget-s", type=float, default=None, metavar="SECONDS",
                        help="wall time for the whole night; measuring stops early enough to merge and summarize")
    parser.add_argument("--summarize", action="store_true",
                        help="run nothing: rewrite DIR/summary.md from what the folder holds now (e.g. a plan.json "
                             "made afterwards with plan --simulate-gpu GPU --json DIR/plan.json)")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="the night's folder (night.json, logs/, ...): a new or empty one")
    parser.add_argument("--archive", default=None, metavar="FILE.tar.gz",
                        help="pack the night's folder into FILE (at most 16 MiB; traces left out first) in every "
                             "ending: complete, partial, failed budgets, interrupted or crashed")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                        help="cuda (default): the GPU night; cpu: the same night measuring the CPU cases")
    parser.add_argument("--plan", default=None, metavar="PLAN.json",
                        help="a plan made before the night, on any machine (python -m trainbench plan --simulate-gpu "
                             "GPU --json PLAN.json), set beside the run in summary.md; no plan is made on the "
                             "night's clock")
    parser.add_argument("--simulate-gpu", default=None, metavar="GPU",
                        help="rehearse on a simulated GPU (a fleet name or spec): cases collect and skip as on it, "
                             "nothing is measured")
    parser.add_argument("--seconds-from", default=None, metavar="RUN.json",
                        help="with --simulate-gpu: an earlier night's run of that GPU, which the plan's predicted "
                             "seconds per case come from (the summary then says which cases the budget fits)")
    parser.add_argument("--after", default=None, metavar="RUN.json",
                        help="an earlier night's run (its run.json): the cases it did not measure go first tonight, "
                             "those it measured after them, so that a second window goes to what the first did not "
                             "reach")
    parser.add_argument("--pytest-arg", action="append", default=[], metavar="ARG",
                        help="one more argument for every pytest session of the night (repeatable)")


def run(args: argparse.Namespace) -> int:
    # the night's job loads torch (the suite's cases, the plan's predictions): imported when a night runs, not for
    # --help (the command line imports every subcommand's module to build its parser)
    from trainbench.jobs.night import run_night, summarize_again

    try:
        if args.summarize:
            print(summarize_again(Path(args.out)))
            return 0
        if args.budget_s is None:
            raise NightError("--budget-s: required to run a night")
        return run_night(Path(args.out), args.budget_s, args.simulate_gpu, Path.cwd(),
                         pytest_args=tuple(args.pytest_arg), device=args.device,
                         archive=Path(args.archive) if args.archive else None,
                         plan=Path(args.plan) if args.plan else None,
                         seconds_from=Path(args.seconds_from) if args.seconds_from else None,
                         after=Path(args.after) if args.after else None)
    except NightError as e:
        print(f"trainbench night: {e}", file=sys.stderr)
        return 2

