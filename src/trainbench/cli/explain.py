"""``python -m trainbench explain``: what changed between two saved runs, and where."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trainbench.core.harness.files import write_json_atomic
from trainbench.core.records.metrics import ThresholdError, parse_thresholds
from trainbench.verdicts.compare import EXPLAIN_THRESHOLDS, CompareError, explain_runs
from trainbench.verdicts.store import RunFileError

NAME = "explain"
HELP = "what changed between two saved runs, and where (ops, kernels, memory sites, packages)"
DESCRIPTION = ("Compare every case two saved runs both have (or CASE) by the gate's rules, RUN_B against RUN_A, "
               "and print each regressed or improved comparison with the attribution rows that account for it "
               "and the software that differs between the runs (device libraries, installed packages). With "
               "CASE, also the op and kernel times that moved most, whatever its verdict. Exit status 0 once "
               "explained (the gate decides pass or fail), 2 on a bad file or an unknown case.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_a", metavar="RUN_A", help="the earlier (baseline) run: a pytest-benchmark JSON file")
    parser.add_argument("run_b", metavar="RUN_B", help="the later run, compared against RUN_A")
    parser.add_argument("case", nargs="?", default=None, metavar="CASE",
                        help="only this case (its id, e.g. resnet18-amp_bf16, or its pytest-benchmark fullname)")
    parser.add_argument("--threshold", default=None, metavar="SPEC",
                        help=f"METRIC:THRESHOLD[,...] as --trainbench-compare-fail reads it (default "
                             f"{EXPLAIN_THRESHOLDS.replace('%', '%%')})")
    parser.add_argument("--markdown", action="store_true", help="print the explanation as Markdown (a CI job summary)")
    parser.add_argument("--json", default=None, metavar="FILE", help="also write the verdict JSON, explained, to FILE")


def run(args: argparse.Namespace) -> int:
    try:
        thresholds = parse_thresholds(args.threshold, "--threshold") if args.threshold is not None else None
        explained = explain_runs(args.run_a, args.run_b, args.case, thresholds)
    except (CompareError, ThresholdError, RunFileError) as e:
        print(f"trainbench explain: {e}", file=sys.stderr)
        return 2
    print(explained.markdown() if args.markdown else "\n".join(explained.lines()), end="" if args.markdown else "\n")
    if args.json:
        try:
            write_json_atomic(Path(args.json), explained.to_json())
        except OSError as e:
            print(f"trainbench explain: {args.json}: cannot write it ({e})", file=sys.stderr)
            return 2
    return 0
