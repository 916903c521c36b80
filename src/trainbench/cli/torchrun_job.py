"""``python -m trainbench torchrun-job``: a DDP/FSDP case as a job for torchrun on several machines."""

from __future__ import annotations

import argparse
import shlex
import sys

NAME = "torchrun-job"
HELP = "write a DDP/FSDP case as a job for torchrun on several machines"
DESCRIPTION = ("Write the job of a DDP or FSDP case (<workload>-<recipe>, e.g. resnet18-ddp) scaled out to "
               "NNODES x NPROC_PER_NODE ranks, and print the torchrun command (c10d rendezvous) to run on "
               "every node. Rank 0 writes result.json into the job folder.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("case", metavar="CASE")
    parser.add_argument("--nnodes", type=int, default=2)
    parser.add_argument("--nproc-per-node", type=int, default=1)
    parser.add_argument("--rdzv-endpoint", default="NODE0_HOST:29500",
                        help="host:port of the c10d rendezvous (a node's address all nodes reach)")
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda (the ranks' device kind)")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds (default: the profile's)")
    parser.add_argument("--steps-per-round", type=int, default=None)
    parser.add_argument("--min-warmup", type=int, default=None)


def run(args: argparse.Namespace) -> int:
    # all of these load torch: imported when the subcommand runs, not for --help
    from trainbench.core.method.distributed import scale_out_job, torchrun_command
    from trainbench.core.method.measure import DEFAULT_SETTINGS, with_overrides
    from trainbench.core.setups.recipes import ConfigError
    from trainbench.core.setups.spec import SpecError
    from trainbench.core.setups.workloads import PROFILES
    from trainbench.devices.device import get_backend

    backend = get_backend(args.device)
    profile = PROFILES[backend.profile_name]
    settings = with_overrides(DEFAULT_SETTINGS[profile.name], rounds=args.rounds, steps_per_round=args.steps_per_round,
                              min_warmup_steps=args.min_warmup)
    try:
        job_dir = scale_out_job(args.case, args.nnodes, args.nproc_per_node, backend, profile, settings)
    except (SpecError, ConfigError, KeyError) as e:
        print(f"trainbench torchrun-job: {e}", file=sys.stderr)
        return 2
    rendezvous = [f"--nnodes={args.nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={args.rdzv_endpoint}",
                  f"--rdzv-id={job_dir.name}"]
    print(f"job: {job_dir}  ({args.nnodes * args.nproc_per_node} ranks; the same folder on every node: copy it "
          "there or use a shared filesystem)")
    print("on each node:")
    print("  " + shlex.join(torchrun_command(args.nproc_per_node, job_dir, rendezvous)))
    print(f"then rank 0's node has the case's result in {job_dir / 'result.json'} (a rank's error in rank<N>.err)")
    return 0
