"""``python -m trainbench doctor``: check this machine (or a simulated GPU) before a benchmark run."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trainbench.core.harness.files import output_file_problem
from trainbench.devices.host import EnvError

from .shared import gpu_to_simulate

NAME = "doctor"
HELP = "check this machine before a benchmark run (exit status 1 on a blocker)"
DESCRIPTION = ("One line per check: STATUS  name: message, STATUS one of ok, info, warn, FAIL. "
               "Exit status 1 when any check FAILs (the run would crash or measure nothing meaningful).")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="auto", help="the device the run will use: auto, cpu, cuda or cuda:N "
                                                         "(a CUDA device implies --expect-cuda)")
    parser.add_argument("--expect-cuda", action="store_true",
                        help="a GPU must be usable (also set by TRAINBENCH_EXPECT_CUDA=1)")
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the checks as JSON to PATH")
    parser.add_argument("--simulate-gpu", default=None, metavar="MODEL_OR_SPEC",
                        help="check a GPU instead of this machine, with no GPU needed: its CUDA checks and the memory "
                             "the largest case that will run needs (python -m trainbench plan lists every case); a "
                             "fleet GPU or an explicit spec, as for plan")
    parser.add_argument("--budgets", default="benchmarks/budgets.toml", help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    # the doctor and the night's plan load torch: imported when the subcommand runs, not for --help
    from trainbench.jobs.doctor import doctor_record, format_checks, run_checks, write_checks

    if args.json:  # found before the checks, not after them
        problem = output_file_problem(Path(args.json))
        if problem:
            print(f"trainbench doctor: --json {args.json}: {problem}", file=sys.stderr)
            return 2
    # an empty --simulate-gpu "" is a GPU that cannot be, never this machine's doctor
    if args.simulate_gpu is not None:  # the checks of a machine with a fleet GPU, as the doctor would make them there
        from trainbench.jobs.night_plan import simulated_doctor  # the plan's machinery: only a simulated doctor loads it

        gpu = gpu_to_simulate(args, "doctor")
        if gpu is None:
            return 2
        checks = simulated_doctor(gpu)
        print(f"doctor of {gpu.count} x {gpu.name} ({gpu.sm}, {gpu.memory_bytes / 2**30:.1f} GiB), simulated")
    else:
        try:
            checks = run_checks(args.device, args.expect_cuda)
        except EnvError as e:
            print(f"trainbench doctor: {e}", file=sys.stderr)
            return 2
    for line in format_checks(checks):
        print(line)
    record = doctor_record(checks)
    if args.json:
        write_checks(Path(args.json), checks)
    return 1 if record["blockers"] else 0
