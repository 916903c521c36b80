"""``python -m trainbench calibrate``: this device's budgets from a saved run, with a margin."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from trainbench.core.records.metrics import ThresholdError, parse_fraction
from trainbench.verdicts.calibrate import CalibrationError, calibrate, write
from trainbench.verdicts.store import RunFileError

NAME = "calibrate"
HELP = "write this device's budgets from a saved run, with a margin"
DESCRIPTION = ("Budgets for the run's device from its measured cases: max_<metric> = measured x (1 + margin), "
               "each kind's margin from the metric table (deterministic signals none: the bound is what was "
               "measured; GPU allocator peaks and kernel counts 10%), counts of ops, syncs, calls and kernels "
               "rounded up to whole numbers; min_speedup = measured x (1 - speed margin) where the case was timed "
               "interleaved with its baseline. Reads the run from the project's pytest-benchmark storage and writes each "
               "case's budgets into the file the plugin finds for its test file (a new budgets.toml beside the "
               "tests where there is none), as the project's pytest configuration says. A case whose "
               "correctness guard failed gives no budget. Shows the diff; other devices' sections are never "
               "touched.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_json", nargs="?", default=None, metavar="RUN_JSON",
                        help="pytest-benchmark JSON (default: the newest run in the project's storage)")
    parser.add_argument("--measure", action="store_true",
                        help="first run the project's tests with every case timed interleaved with its baseline "
                             "(pytest --trainbench-pair-baselines --benchmark-save=calibrate), then calibrate from "
                             "that run: min_speedup budgets for a project that has none")
    parser.add_argument("--pytest-args", default="", metavar="ARGS",
                        help="arguments for the project's pytest, as one string (e.g. \"tests -k amp\"): what "
                             "--measure runs and how the project's configuration is read")
    parser.add_argument("--budgets", default=None, metavar="FILE",
                        help="write every case into this budgets file (default: the one the plugin finds beside each "
                             "case's tests)")
    parser.add_argument("--margin", default=None,
                        help="one headroom over every calibrated signal (default: each kind's from the metric table: "
                             "none over deterministic signals, 10%% over GPU allocator peaks and kernel counts)")
    parser.add_argument("--speed-margin", default="30%", help="headroom under measured speed-ups (default 30%%)")
    parser.add_argument("--metrics", default=None, metavar="LIST",
                        help="calibrate only these metrics' keys, comma-separated ('speedup' for min_speedup), "
                             "e.g. predicted_gpu_peak_mib,predicted_gpu_activation_mib")
    parser.add_argument("--write", action="store_true", help="write the files (default: show the diff only)")


def run(args: argparse.Namespace) -> int:
    from trainbench.plugin.project import ProjectError, measure_run, read_project  # loads pytest: only calibrate pays for it

    chosen: dict = {}  # test file -> (budgets file, how it was chosen)
    try:
        margin = None if args.margin is None else parse_fraction(args.margin, "--margin")
        speed_margin = parse_fraction(args.speed_margin, "--speed-margin")
        only = tuple(m.strip() for m in args.metrics.split(",") if m.strip()) if args.metrics else None
        pytest_args = shlex.split(args.pytest_args)
        if args.measure and args.run_json is not None:
            raise ProjectError("--measure measures a new run: give no RUN_JSON")
        project = read_project(pytest_args) if args.run_json is None or args.budgets is None else None
        if project is not None:
            print(f"project: pytest rootdir {project.rootpath}"
                  + (f", configured by {project.inipath}" if project.inipath else ", no pytest configuration file"))
        if args.run_json is None:
            print(f"storage: {project.describe_storage()}")
        run_path = (args.run_json if args.run_json is not None else
                    measure_run(project, pytest_args) if args.measure else project.newest_run())
        print(f"run: {run_path}")
        budgets = Path(args.budgets) if args.budgets else project.budgets_targets(chosen)
        result = calibrate(run_path, budgets, margin, speed_margin, only)
    except (CalibrationError, ThresholdError, RunFileError, ProjectError) as e:
        print(f"trainbench calibrate: {e}", file=sys.stderr)
        return 2
    for change in result.files:
        tests = sorted({_shown(f) for f, (path, _) in chosen.items() if path == change.path})
        how = ({how for f, (path, how) in chosen.items() if path == change.path} or {"named by --budgets"}).pop()
        print(f"budgets: {_shown(change.path)} ({how}{' for ' + ', '.join(tests) if tests else ''}): "
              f"{_count(len(change.cases), 'case')}")
    print(f"margins: {result.margins}")
    if result.stopped:
        print(f"run: {result.stopped}")
    for line in result.left_out:
        print(f"left out: {line}")
    if result.unpaired:
        print(f"no min_speedup for {_count(len(result.unpaired), 'case')} whose rounds were not interleaved with "
              f"their baseline's ({', '.join(result.unpaired)}): calibrate --measure interleaves every case that can "
              "share a process with its baseline")
    if not result.diff:
        print(f"[{result.device_key}]: {_count(result.cases, 'case')}, budgets already match {run_path}")
        return 0
    print(result.diff, end="")
    if args.write:
        for path in write(result):
            print(f"wrote {_shown(path)}: [{result.device_key}] calibrated from {run_path}")
    else:
        print(f"dry run: [{result.device_key}] would be calibrated from {run_path} ({_count(result.cases, 'case')}); "
              "pass --write to write it")
    return 0


def _shown(path: Path) -> str:
    """``path`` relative to the current folder where it is below it: as the user would type it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"
