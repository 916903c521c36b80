"""Command line: ``python -m trainbench <command>``, one subcommand per tool.

Each subcommand registers its parser and a handler returning the exit status; a handler
reports a bad input as ``trainbench <command>: <file>: <problem>`` with exit status 2.
"""

from __future__ import annotations

import argparse
import sys


def _report(args: argparse.Namespace) -> int:
    from .report import ReportError, latest_run, write_ladder_report

    try:
        run_path = args.run_json if args.run_json is not None else latest_run()
        written = write_ladder_report(run_path, args.out)
    except ReportError as e:
        print(f"trainbench report: {e}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


def _add_report(subparsers) -> None:
    parser = subparsers.add_parser(
        "report", help="render the optimization-ladder tables and plots of a saved benchmark run",
        description="Render ladders.md and one PNG per ladder from a pytest-benchmark JSON run, "
                    "next to the figures the seed articles printed.")
    parser.add_argument("run_json", nargs="?", default=None, metavar="RUN_JSON",
                        help="pytest-benchmark JSON (default: the newest *.json under results/benchmarks/)")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="output folder (default: results/report/<device>)")
    parser.set_defaults(handler=_report)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m trainbench", description="trainbench tools")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_report(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "handler", None) is None:
        parser.print_help(sys.stderr)
        return 2
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
