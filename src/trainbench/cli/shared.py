"""What more than one subcommand reads: ``--simulate-gpu`` (doctor and plan)."""

from __future__ import annotations

import argparse
import sys

from trainbench.devices.fleet import GpuSpecError, parse_gpu


def gpu_to_simulate(args: argparse.Namespace, command: str):
    """The GPU ``--simulate-gpu`` names or specifies (``fleet.parse_gpu``); None after saying why it cannot be."""
    try:
        return parse_gpu(args.simulate_gpu)
    except GpuSpecError as e:
        print(f"trainbench {command}: --simulate-gpu: {e}", file=sys.stderr)
        return None
