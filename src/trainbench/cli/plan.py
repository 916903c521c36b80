"""``python -m trainbench plan``: the GPU night's plan for a GPU of the fleet, made on this machine."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trainbench.core.harness.files import output_file_problem, write_json_atomic
from trainbench.core.records.budgets import BudgetError
from trainbench.verdicts.store import RunFileError

from .shared import gpu_to_simulate

NAME = "plan"
HELP = "the GPU night's plan for a GPU of the fleet, made on this machine (no GPU needed)"
DESCRIPTION = ("Every built-in suite case on a simulated GPU (your own tests: pytest --trainbench-simulate-gpu GPU): "
               "run or skip (why), its budget section, predicted memory "
               "against the GPU's, how it is measured, what bounds its step (the roofline: compute, memory "
               "or kernel launches) and the min_speedup budgets it says cannot hold. Exit 1 where the build "
               "cannot run on that GPU (the doctor's FAIL) or a case would crash or be refused for a reason a GPU "
               "cannot have.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--simulate-gpu", required=True, metavar="MODEL_OR_SPEC",
                        help='a fleet GPU: its name as torch reports it ("NVIDIA L40S", "2xNVIDIA H100 80GB HBM3") or '
                             'its key (h100-sxm, 8xh100-sxm, l40s, t4, ...); or any GPU as an explicit spec, e.g. '
                             '"name=My GPU,memory_gib=48,capability=8.9,sms=142,bf16=1,count=2,bandwidth_gbs=864,'
                             'tflops_bf16=362,tflops_fp32=91" (fields: see docs/ci-and-gpu.md)')
    parser.add_argument("--budgets", default="benchmarks/budgets.toml", help="budgets file (default: the suite's)")
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the plan as JSON to PATH")
    parser.add_argument("--seconds-from", action="append", default=[], metavar="RUN.json",
                        help="an earlier night's run of the same GPU (repeatable; a case in more than one: the last "
                             "one's): each case's predicted seconds in a night come from them (what a case they "
                             "measured cost then; the others, what the cases measured as they are cost beside their "
                             "rounds, plus their steps at the roofline's bound)")


def run(args: argparse.Namespace) -> int:
    """The night's plan on a fleet GPU."""
    # the plan loads torch (the cases, their predictions): imported when planning, not for --help
    from trainbench.jobs.night_plan import format_night, plan_night, plan_record, seconds_source

    gpu = gpu_to_simulate(args, "plan")
    if gpu is None:
        return 2
    # Both inputs are checked before a minute of planning: the budgets file as it loads, the JSON's folder here.
    why = output_file_problem(Path(args.json)) if args.json else None
    if why is not None:
        print(f"trainbench plan: --json {args.json}: {why}", file=sys.stderr)
        return 2
    seconds_from = []
    for path in args.seconds_from:  # refused in one line before a minute of planning, not after it
        try:
            seconds_from.append(seconds_source(Path(path), gpu))
        except RunFileError as e:
            print(f"trainbench plan: --seconds-from: {e}", file=sys.stderr)
            return 2
    try:
        night = plan_night(gpu, Path(args.budgets) if args.budgets else None, seconds_from=seconds_from)
    except BudgetError as e:
        print(f"trainbench plan: --budgets: {e}", file=sys.stderr)
        return 2
    for line in format_night(night):
        print(line)
    if args.json:
        write_json_atomic(Path(args.json), plan_record(night))
    return 0 if night.ok else 1
