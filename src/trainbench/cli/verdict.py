"""``python -m trainbench verdict``: a gate's verdict JSON as Markdown (a CI job summary)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from trainbench.verdicts.gate import VerdictFileError, read_verdict
from trainbench.verdicts.present import verdict_markdown

NAME = "verdict"
HELP = "print a gate's verdict JSON as Markdown (a CI job summary)"
DESCRIPTION = ("Print the verdict --trainbench-compare-json wrote as Markdown: outcome, counts, every "
               "comparison that is not unchanged, and the whole table folded. Exit status 1 when the gate "
               "failed, 2 when the file is missing or is not a verdict.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("verdict_json", metavar="VERDICT_JSON")


def run(args: argparse.Namespace) -> int:
    try:
        verdict = json.loads(Path(args.verdict_json).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        print(f"trainbench verdict: {args.verdict_json}: {e}", file=sys.stderr)
        return 2
    try:
        verdict = read_verdict(verdict, args.verdict_json)
    except VerdictFileError as e:
        print(f"trainbench verdict: {e}", file=sys.stderr)
        return 2
    print(verdict_markdown(verdict), end="")
    return 1 if verdict.get("failed") else 0
