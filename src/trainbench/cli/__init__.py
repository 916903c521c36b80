"""Command line: ``python -m trainbench <command>``, one module per subcommand.

Each subcommand module gives its ``NAME``, ``HELP`` and ``DESCRIPTION``, ``add_arguments(parser)`` and
``run(args) -> int`` (the exit status); a handler reports a bad input as ``trainbench <command>: <file>: <problem>``
with exit status 2. ``COMMANDS`` is the table: the order is the order of ``--help``.
"""

from __future__ import annotations

import argparse
import sys

from . import (bisect, calibrate, doctor, error_rates, explain, night, noise, plan, releases, report, torchrun_job,
               verdict)

COMMANDS = (report, calibrate, noise, error_rates, releases, doctor, verdict, explain, bisect, torchrun_job, plan, night)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m trainbench", description="trainbench tools")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        subparser = subparsers.add_parser(command.NAME, help=command.HELP, description=command.DESCRIPTION)
        command.add_arguments(subparser)
        subparser.set_defaults(handler=command.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "handler", None) is None:
        parser.print_help(sys.stderr)
        return 2
    return args.handler(args)
