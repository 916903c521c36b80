"""``python -m trainbench noise``: the false-alarm rate of a gate from repeated runs of the same code."""

from __future__ import annotations

import argparse
import sys

from trainbench.core.records.metrics import ThresholdError, parse_fraction, timed_metrics
from trainbench.verdicts.compare import CompareError, noise_study, noise_table
from trainbench.verdicts.store import RunFileError, SavedRun

NAME = "noise"
HELP = "false-alarm rate of a gate from repeated runs of the same code"
DESCRIPTION = ("Compare every pair of RUN_JSONs (repeated runs of one commit on one machine) case by case "
               "with the gate's test: every 'regressed' is a false alarm at that threshold.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", metavar="RUN_JSON")
    parser.add_argument("--metric", default="samples_per_s", choices=timed_metrics(),
                        help="a metric read round by round (default samples_per_s)")
    parser.add_argument("--thresholds", default="5%,10%,20%,30%", help="comma-separated thresholds to evaluate")


def run(args: argparse.Namespace) -> int:
    try:
        thresholds = [parse_fraction(t, "--thresholds") for t in args.thresholds.split(",")]
        runs = [SavedRun.load(path) for path in args.runs]
        rows = noise_study(runs, thresholds, args.metric)
    except (CompareError, ThresholdError, RunFileError) as e:
        print(f"trainbench noise: {e}", file=sys.stderr)
        return 2
    if not rows:
        print("trainbench noise: no case appears in two of the runs", file=sys.stderr)
        return 2
    for line in noise_table(rows, thresholds):
        print(line)
    totals = {t: sum(row["false_alarms"][t] for row in rows) for t in thresholds}
    pairs = sum(row["pairs"] for row in rows)
    print("false-alarm rate: " + ", ".join(f"{totals[t]}/{pairs} = {totals[t] / pairs:.1%} at {t:.0%}" for t in thresholds))
    return 0
