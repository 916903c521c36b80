"""``python -m trainbench error-rates``: how often a timed verdict is wrong at its edge, by simulation."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trainbench.core.analyses.error_rates import (
    DESIGNS,
    error_rates,
    lognormal_noise,
    markdown_table,
    noise_of_rounds,
    rounds_of_runs,
    simulation_error,
)
from trainbench.core.harness.files import output_file_problem, write_json_atomic, write_text_atomic
from trainbench.core.records.result import RecordError
from trainbench.verdicts.store import RunFileError, SavedRun

NAME = "error-rates"
HELP = "how often each timed verdict is claimed wrongly where the truth sits at its edge (simulation)"
DESCRIPTION = ("Simulate cases whose true speed-up sits exactly at a budget's limit, or whose true change sits "
               "exactly at a gate's or an A/B threshold, and judge them with the suite's own rules, measured again "
               "while inconclusive: each wrong claim should stay within 2.5%% a side. Noise: lognormal rounds with "
               "shared slow spells, and the rounds of RUN_JSONs (committed runs) drawn again.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="*", metavar="RUN_JSON",
                        help="saved runs whose rounds are the real noise (each case's rounds over their median)")
    parser.add_argument("--trials", type=int, default=1000, help="simulated cases a cell (default 1000)")
    parser.add_argument("--rounds", default="least,8,10,15",
                        help="round counts, comma-separated; 'least': the least each design accepts (default "
                             "least,8,10,15)")
    parser.add_argument("--looks", default="1,2,5", help="planned looks, comma-separated (default 1,2,5)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, metavar="DIR",
                        help="write table.md and cells.json there (else the table is printed)")


def _counts(text: str, option: str, least: bool = False) -> list[int | None]:
    try:
        values = [None if least and t.strip() == "least" else int(t) for t in text.split(",")]
    except ValueError:
        raise ValueError(f"{option}={text!r}: expected comma-separated whole numbers") from None
    if any(v is not None and v < 1 for v in values):
        raise ValueError(f"{option}={text!r}: expected numbers >= 1")
    return values


def run(args: argparse.Namespace) -> int:
    try:
        rounds = _counts(args.rounds, "--rounds", least=True)
        looks = _counts(args.looks, "--looks")
        if args.trials < 10:
            raise ValueError(f"--trials={args.trials}: expected at least 10")
        unreadable: list[str] = []  # records an older run wrote that today's reader refuses: left out, counted
        records = [record for path in args.runs for record in SavedRun.load(path).cases(unreadable)]
        for name in ("table.md", "cells.json") if args.out else ():
            problem = output_file_problem(args.out / name)
            if problem:
                raise ValueError(f"--out {args.out / name}: {problem}")
    except (ValueError, RunFileError, RecordError) as e:
        print(f"trainbench error-rates: {e}", file=sys.stderr)
        return 2
    noises = {"lognormal": lognormal_noise}
    population = rounds_of_runs(records)
    if args.runs and not population:
        print("trainbench error-rates: the runs hold no case with 5 rounds or more", file=sys.stderr)
        return 2
    if population:
        noises["committed"] = noise_of_rounds(population)
    cells = error_rates(rounds, args.trials, noises, DESIGNS, looks, args.seed)
    worst = max(cells, key=lambda c: c.worst())
    slack = simulation_error(args.trials)
    header = (f"{args.trials} simulated cases a cell, seed {args.seed}; committed noise: {len(population)} rounds of "
              f"{len(records)} cases of {len(args.runs)} runs ({len(unreadable)} records left out: unreadable). "
              f"A wrong-claim rate is read with +-{slack:.1%} of simulation error (two "
              f"standard errors at 2.5%).\n\n")
    table = header + markdown_table(cells)
    last = (f"worst wrong-claim rate {worst.worst():.1%} ({worst.design}, {worst.noise} noise, {worst.rounds} rounds, "
            f"{worst.planned_looks} looks): " + ("within 2.5% + the simulation's error" if worst.worst() <= 0.025 + slack
                                                 else "ABOVE 2.5% + the simulation's error"))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        write_text_atomic(args.out / "table.md", table + "\n" + last + "\n")
        write_json_atomic(args.out / "cells.json", [c.as_dict() for c in cells])
    else:
        print(table)
    print(last)
    return 0 if worst.worst() <= 0.025 + slack else 1
