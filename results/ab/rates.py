"""Measure the A/B option's false-alarm and catch rates on this machine.

Each run is a whole `pytest benchmarks --trainbench-ab=<this python>` session (both sides the
same environment; `--inject` plants a slowdown in the head side only), gated at a step-time
threshold; every run's verdict JSON is kept under OUT/<label>/ and a summary is printed and
written to OUT/<label>.json:

    .venv/bin/python results/ab/rates.py --case resnet18-baseline --runs 20 --inject 0 --out results/ab/rates
    .venv/bin/python results/ab/rates.py --case resnet18-baseline --runs 20 --inject 10% --out results/ab/rates

A false alarm is an A/A run whose step-time verdict is "regressed"; a catch is a planted run
whose verdict is "regressed". Run one at a time: two timed runs side by side measure each other.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", required=True, help="a case id of benchmarks/ (e.g. resnet18-baseline)")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--inject", default="0", help="slowdown planted in the head side (e.g. 10%%), 0 for A/A")
    parser.add_argument("--threshold", default="5%", help="the step-time gate threshold")
    parser.add_argument("--pairs", type=int, default=12)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    label = f"{args.case}-inject{args.inject.rstrip('%')}"
    folder = args.out / label
    folder.mkdir(parents=True, exist_ok=True)
    runs = []
    for i in range(args.runs):
        verdict_path = folder / f"run{i:02d}.json"
        command = [sys.executable, "-m", "pytest", "benchmarks", "-q", "-p", "no:cacheprovider",
                   "-k", f"test_recipe and {args.case}", f"--trainbench-ab={sys.executable}",
                   f"--trainbench-ab-pairs={args.pairs}",
                   f"--trainbench-compare-fail=step_time_ms:{args.threshold}",
                   f"--trainbench-compare-json={verdict_path}"]
        if args.inject not in ("0", "0%"):
            command.append(f"--trainbench-inject-slowdown={args.inject}")
        started = time.monotonic()
        completed = subprocess.run(command, capture_output=True, text=True)
        seconds = time.monotonic() - started
        if not verdict_path.exists():
            sys.exit(f"run {i}: no verdict written (exit {completed.returncode}):\n{completed.stdout[-3000:]}")
        verdict = json.loads(verdict_path.read_text())
        step = [c for c in verdict["comparisons"] if c["metric"] == "step_time_ms" and c["case"] == args.case]
        if len(step) != 1:
            sys.exit(f"run {i}: expected one step_time_ms comparison for {args.case}, found {len(step)}")
        c = step[0]
        runs.append({"run": i, "exit": completed.returncode, "verdict": c["verdict"], "median_ratio": 1 + c["change"],
                     "ci": c["ci"], "p": c["p_value"], "seconds": round(seconds, 1)})
        print(f"{label} run {i:2d}: {c['verdict']:12s} median {1 + c['change']:.4f} "
              f"CI {c['ci'][0]:.4f}..{c['ci'][1]:.4f} p={c['p_value']:.3g} exit {completed.returncode} "
              f"({seconds:.0f} s)", flush=True)
    counts = {v: sum(r["verdict"] == v for r in runs) for v in ("regressed", "inconclusive", "unchanged", "improved")}
    ratios = [r["median_ratio"] for r in runs]
    summary = {"case": args.case, "inject": args.inject, "threshold": args.threshold, "pairs": args.pairs,
               "runs": len(runs), "counts": counts, "median_ratio_min": min(ratios), "median_ratio_max": max(ratios),
               "median_ratio_median": statistics.median(ratios),
               "seconds_median": statistics.median(r["seconds"] for r in runs), "per_run": runs}
    (args.out / f"{label}.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"{label}: {counts} over {len(runs)} runs; median ratios {min(ratios):.4f}..{max(ratios):.4f} "
          f"(median {statistics.median(ratios):.4f}); {summary['seconds_median']:.0f} s per run")


if __name__ == "__main__":
    main()
