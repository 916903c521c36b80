"""Command line: ``python -m trainbench <command>``, one subcommand per tool.

Each subcommand registers its parser and a handler returning the exit status; a handler
reports a bad input as ``trainbench <command>: <file>: <problem>`` with exit status 2.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path


def _report(args: argparse.Namespace) -> int:
    from .report import write_ladder_report
    from .store import RunFileError, latest_run

    try:
        run_path = args.run_json if args.run_json is not None else latest_run()
        written = write_ladder_report(run_path, args.out)
    except RunFileError as e:
        print(f"trainbench report: {e}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


def _run_json_argument(parser) -> None:
    parser.add_argument("run_json", nargs="?", default=None, metavar="RUN_JSON",
                        help="pytest-benchmark JSON (default: the newest *.json under results/benchmarks/)")


def _add_report(subparsers) -> None:
    parser = subparsers.add_parser(
        "report", help="render the optimization-ladder tables and plots of a saved benchmark run",
        description="Render ladders.md and one PNG per ladder from a pytest-benchmark JSON run, "
                    "next to the figures the seed articles printed.")
    _run_json_argument(parser)
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="output folder (default: results/report/<device>)")
    parser.set_defaults(handler=_report)


def _calibrate(args: argparse.Namespace) -> int:
    import shlex

    from .calibrate import CalibrationError, calibrate, write
    from .compare import CompareError, parse_fraction
    from .project import ProjectError, measure_run, read_project
    from .store import RunFileError

    chosen: dict = {}  # test file -> (budgets file, how it was chosen)
    try:
        margin = parse_fraction(args.margin, "--margin")
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
                    measure_run(project, pytest_args) if args.measure else _newest_run(project))
        print(f"run: {run_path}")
        budgets = Path(args.budgets) if args.budgets else _budgets_beside_the_tests(project, chosen)
        result = calibrate(run_path, budgets, margin, speed_margin, only)
    except (CalibrationError, CompareError, RunFileError, ProjectError) as e:
        print(f"trainbench calibrate: {e}", file=sys.stderr)
        return 2
    for change in result.files:
        tests = sorted({_shown(f) for f, (path, _) in chosen.items() if path == change.path})
        how = ({how for f, (path, how) in chosen.items() if path == change.path} or {"named by --budgets"}).pop()
        print(f"budgets: {_shown(change.path)} ({how}{' for ' + ', '.join(tests) if tests else ''}): "
              f"{_count(len(change.cases), 'case')}")
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


def _newest_run(project) -> Path:
    """The newest run saved on this machine in the project's storage: what the last ``pytest --benchmark-save``
    there wrote (never another machine's)."""
    from .project import ProjectError
    from .store import latest_run

    folder = project.runs_folder
    if folder is None:
        raise ProjectError(f"--benchmark-storage={project.storage}: not a file storage, which calibrate reads; pass "
                           "RUN_JSON (--benchmark-json=FILE)")
    return latest_run(folder.parent)


def _budgets_beside_the_tests(project, chosen: dict):
    """Each case's budgets file: the one the plugin finds for its test file (the pytest-benchmark fullname is the
    test's node id, relative to the rootdir), or a new one it will find. ``chosen`` collects the choices."""

    def targets(fullnames: list[str]) -> dict[str, Path]:
        from .project import ProjectError

        unknown = [name for name in fullnames if "::" not in name]
        if unknown:
            raise ProjectError(f"{unknown[0]}: the run does not say which test measured it (no pytest node id as its "
                               "fullname); pass --budgets FILE")
        test_files = {name: project.rootpath / name.split("::")[0] for name in fullnames}
        chosen.update(project.budgets_files(sorted(set(test_files.values()))))
        return {name: chosen[test_file][0] for name, test_file in test_files.items()}

    return targets


def _add_calibrate(subparsers) -> None:
    parser = subparsers.add_parser(
        "calibrate", help="write this device's budgets from a saved run, with a margin",
        description="Budgets for the run's device from its measured cases: max_<deterministic metric> = measured "
                    "x (1 + margin), min_speedup = measured x (1 - speed margin) where the case was timed interleaved "
                    "with its baseline. Reads the run from the project's pytest-benchmark storage and writes each "
                    "case's budgets into the file the plugin finds for its test file (a new budgets.toml beside the "
                    "tests where there is none), as the project's pytest configuration says. A case whose "
                    "correctness guard failed gives no budget. Shows the diff; other devices' sections are never "
                    "touched.")
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
    parser.add_argument("--margin", default="10%", help="headroom over deterministic signals (default 10%%)")
    parser.add_argument("--speed-margin", default="30%", help="headroom under measured speed-ups (default 30%%)")
    parser.add_argument("--metrics", default=None, metavar="LIST",
                        help="calibrate only these metrics' keys, comma-separated ('speedup' for min_speedup), "
                             "e.g. predicted_gpu_peak_mib,predicted_gpu_activation_mib")
    parser.add_argument("--write", action="store_true", help="write the files (default: show the diff only)")
    parser.set_defaults(handler=_calibrate)


def _noise(args: argparse.Namespace) -> int:
    from .compare import CompareError, noise_study, noise_table, parse_fraction
    from .store import RunFileError, SavedRun

    try:
        thresholds = [parse_fraction(t, "--thresholds") for t in args.thresholds.split(",")]
        runs = [SavedRun.load(path) for path in args.runs]
        rows = noise_study(runs, thresholds, args.metric)
    except (CompareError, RunFileError) as e:
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


def _add_noise(subparsers) -> None:
    from .metrics import timed_metrics

    parser = subparsers.add_parser(
        "noise", help="false-alarm rate of a gate from repeated runs of the same code",
        description="Compare every pair of RUN_JSONs (repeated runs of one commit on one machine) case by case "
                    "with the gate's test: every 'regressed' is a false alarm at that threshold.")
    parser.add_argument("runs", nargs="+", metavar="RUN_JSON")
    parser.add_argument("--metric", default="samples_per_s", choices=timed_metrics(),
                        help="a metric read round by round (default samples_per_s)")
    parser.add_argument("--thresholds", default="5%,10%,20%,30%", help="comma-separated thresholds to evaluate")
    parser.set_defaults(handler=_noise)


def _releases(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .asv_results import AsvResultsError, diff_environments, environments_of_commit, format_diff

    try:
        machine_dir = Path(args.results) / args.machine
        envs = environments_of_commit(machine_dir, args.commit)
        if len(envs) < 2:
            raise AsvResultsError(f"{machine_dir}: commit {envs[0].commit[:8]} has one environment; "
                                  "record another release first (docs/gate-and-ab.md, asv)")
    except AsvResultsError as e:
        print(f"trainbench releases: {e}", file=sys.stderr)
        return 2
    for before, after in itertools.pairwise(envs):
        print(format_diff(diff_environments(before, after)))
    return 0


def _add_releases(subparsers) -> None:
    parser = subparsers.add_parser(
        "releases", help="what the PyTorch releases recorded by asv differ in, case by case",
        description="For one commit recorded by asv in one environment per torch release: every Memory and Work "
                    "value that differs between consecutive releases, and the spread of step-time ratios.")
    parser.add_argument("--results", default="results/asv", help="asv results_dir (default results/asv)")
    parser.add_argument("--machine", required=True, help="asv machine name (a folder under --results)")
    parser.add_argument("--commit", default=None,
                        help="commit hash or prefix (default: the newest commit recorded in two environments)")
    parser.set_defaults(handler=_releases)


def _doctor(args: argparse.Namespace) -> int:
    from .doctor import doctor_record, format_checks, run_checks

    if args.simulate_gpu:  # the checks of a machine with a fleet GPU, as the doctor would make them there
        from .night_plan import simulated_doctor

        gpu = _gpu_to_simulate(args, "doctor")
        if gpu is None:
            return 2
        checks = simulated_doctor(gpu)
        print(f"doctor of {gpu.count} x {gpu.name} ({gpu.sm}, {gpu.memory_bytes / 2**30:.1f} GiB), simulated")
    else:
        from .host import SwitchError

        try:
            checks = run_checks(args.device, args.expect_cuda)
        except SwitchError as e:
            print(f"trainbench doctor: {e}", file=sys.stderr)
            return 2
    for line in format_checks(checks):
        print(line)
    if args.json:
        from .files import write_json_atomic

        write_json_atomic(Path(args.json), doctor_record(checks)["checks"])
    return 1 if doctor_record(checks)["blockers"] else 0


def _add_doctor(subparsers) -> None:
    parser = subparsers.add_parser(
        "doctor", help="check this machine before a benchmark run (exit status 1 on a blocker)",
        description="One line per check: STATUS  name: message, STATUS one of ok, info, warn, FAIL. "
                    "Exit status 1 when any check FAILs (the run would crash or measure nothing meaningful).")
    parser.add_argument("--device", default="auto", help="the device the run will use: auto, cpu, cuda or cuda:N "
                                                         "(a CUDA device implies --expect-cuda)")
    parser.add_argument("--expect-cuda", action="store_true",
                        help="a GPU must be usable (also set by TRAINBENCH_EXPECT_CUDA=1)")
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the checks as JSON to PATH")
    parser.add_argument("--simulate-gpu", default=None, metavar="MODEL_OR_SPEC",
                        help="check a GPU instead of this machine, with no GPU needed: its CUDA checks and the memory "
                             "the largest case that will run needs (python -m trainbench plan lists every case); a "
                             "fleet GPU or an explicit spec, as for plan")
    parser.add_argument("--budgets", default="benchmarks/budgets.toml", help=argparse.SUPPRESS)
    parser.set_defaults(handler=_doctor)


def _verdict(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from .present import verdict_markdown

    try:
        verdict = json.loads(Path(args.verdict_json).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        print(f"trainbench verdict: {args.verdict_json}: {e}", file=sys.stderr)
        return 2
    if not isinstance(verdict, dict) or not isinstance(verdict.get("comparisons"), list):
        print(f"trainbench verdict: {args.verdict_json}: no comparisons list; expected the file "
              "--trainbench-compare-json writes", file=sys.stderr)
        return 2
    print(verdict_markdown(verdict), end="")
    return 1 if verdict.get("failed") else 0


def _add_verdict(subparsers) -> None:
    parser = subparsers.add_parser(
        "verdict", help="print a gate's verdict JSON as Markdown (a CI job summary)",
        description="Print the verdict --trainbench-compare-json wrote as Markdown: outcome, counts, every "
                    "comparison that is not unchanged, and the whole table folded. Exit status 1 when the gate "
                    "failed, 2 when the file is missing or is not a verdict.")
    parser.add_argument("verdict_json", metavar="VERDICT_JSON")
    parser.set_defaults(handler=_verdict)


def _explain(args: argparse.Namespace) -> int:
    from .compare import CompareError, explain_runs, parse_spec
    from .files import write_json_atomic
    from .store import RunFileError

    try:
        thresholds = parse_spec(args.threshold, "--threshold") if args.threshold is not None else None
        explained = explain_runs(args.run_a, args.run_b, args.case, thresholds)
    except (CompareError, RunFileError) as e:
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


def _add_explain(subparsers) -> None:
    from .compare import EXPLAIN_THRESHOLDS

    parser = subparsers.add_parser(
        "explain", help="what changed between two saved runs, and where (ops, kernels, memory sites, packages)",
        description="Compare every case two saved runs both have (or CASE) by the gate's rules, RUN_B against RUN_A, "
                    "and print each regressed or improved comparison with the attribution rows that account for it "
                    "and the software that differs between the runs (device libraries, installed packages). With "
                    "CASE, also the op and kernel times that moved most, whatever its verdict. Exit status 0 once "
                    "explained (the gate decides pass or fail), 2 on a bad file or an unknown case.")
    parser.add_argument("run_a", metavar="RUN_A", help="the earlier (baseline) run: a pytest-benchmark JSON file")
    parser.add_argument("run_b", metavar="RUN_B", help="the later run, compared against RUN_A")
    parser.add_argument("case", nargs="?", default=None, metavar="CASE",
                        help="only this case (its id, e.g. resnet18-amp_bf16, or its pytest-benchmark fullname)")
    parser.add_argument("--threshold", default=None, metavar="SPEC",
                        help=f"METRIC:THRESHOLD[,...] as --trainbench-compare-fail reads it (default "
                             f"{EXPLAIN_THRESHOLDS.replace('%', '%%')})")
    parser.add_argument("--markdown", action="store_true", help="print the explanation as Markdown (a CI job summary)")
    parser.add_argument("--json", default=None, metavar="FILE", help="also write the verdict JSON, explained, to FILE")
    parser.set_defaults(handler=_explain)


def _torchrun_job(args: argparse.Namespace) -> int:
    import shlex

    from .device import get_backend
    from .distributed import scale_out_job, torchrun_command
    from .measure import DEFAULT_SETTINGS, with_overrides
    from .recipes import ConfigError
    from .spec import SpecError
    from .workloads import PROFILES

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


def _add_torchrun_job(subparsers) -> None:
    parser = subparsers.add_parser(
        "torchrun-job", help="write a DDP/FSDP case as a job for torchrun on several machines",
        description="Write the job of a DDP or FSDP case (<workload>-<recipe>, e.g. resnet18-ddp) scaled out to "
                    "NNODES x NPROC_PER_NODE ranks, and print the torchrun command (c10d rendezvous) to run on "
                    "every node. Rank 0 writes result.json into the job folder.")
    parser.add_argument("case", metavar="CASE")
    parser.add_argument("--nnodes", type=int, default=2)
    parser.add_argument("--nproc-per-node", type=int, default=1)
    parser.add_argument("--rdzv-endpoint", default="NODE0_HOST:29500",
                        help="host:port of the c10d rendezvous (a node's address all nodes reach)")
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda (the ranks' device kind)")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds (default: the profile's)")
    parser.add_argument("--steps-per-round", type=int, default=None)
    parser.add_argument("--min-warmup", type=int, default=None)
    parser.set_defaults(handler=_torchrun_job)


def _gpu_to_simulate(args: argparse.Namespace, command: str):
    """The GPU ``--simulate-gpu`` names or specifies (``fleet.parse_gpu``); None after saying why it cannot be."""
    from .fleet import GpuSpecError, parse_gpu

    try:
        return parse_gpu(args.simulate_gpu)
    except GpuSpecError as e:
        print(f"trainbench {command}: --simulate-gpu: {e}", file=sys.stderr)
        return None


def _plan(args: argparse.Namespace) -> int:
    """The night's plan on a fleet GPU."""
    from pathlib import Path

    from .night_plan import format_night, plan_night

    gpu = _gpu_to_simulate(args, "plan")
    if gpu is None:
        return 2
    night = plan_night(gpu, Path(args.budgets) if args.budgets else None)
    for line in format_night(night):
        print(line)
    if args.json:
        from .files import write_json_atomic
        from .night_plan import plan_record

        write_json_atomic(Path(args.json), plan_record(night))
    return 0 if night.ok else 1


def _add_plan(subparsers) -> None:
    parser = subparsers.add_parser(
        "plan", help="the GPU night's plan for a GPU of the fleet, made on this machine (no GPU needed)",
        description="Every suite case on a simulated GPU: run or skip (why), its budget section, predicted memory "
                    "against the GPU's, how it is measured, what bounds its step (the roofline: compute, memory "
                    "or kernel launches) and the min_speedup budgets it says cannot hold. Exit 1 where the build "
                    "cannot run on that GPU (the doctor's FAIL) or a case would crash or be refused for a reason a GPU "
                    "cannot have.")
    parser.add_argument("--simulate-gpu", required=True, metavar="MODEL_OR_SPEC",
                        help='a fleet GPU: its name as torch reports it ("NVIDIA L40S", "2xNVIDIA H100 80GB HBM3") or '
                             'its key (h100-sxm, 8xh100-sxm, l40s, t4, ...); or any GPU as an explicit spec, e.g. '
                             '"name=My GPU,memory_gib=48,capability=8.9,sms=142,bf16=1,count=2,bandwidth_gbs=864,'
                             'tflops_bf16=362,tflops_fp32=91" (fields: see docs/ci-and-gpu.md)')
    parser.add_argument("--budgets", default="benchmarks/budgets.toml", help="budgets file (default: the suite's)")
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the plan as JSON to PATH")
    parser.set_defaults(handler=_plan)


def _night(args: argparse.Namespace) -> int:
    from .night import NightError, run_night, summarize_again

    try:
        if args.summarize:
            print(summarize_again(Path(args.out)))
            return 0
        if args.budget_s is None:
            raise NightError("--budget-s: required to run a night")
        return run_night(Path(args.out), args.budget_s, args.simulate_gpu, Path.cwd(),
                         pytest_args=tuple(args.pytest_arg))
    except NightError as e:
        print(f"trainbench night: {e}", file=sys.stderr)
        return 2


def _add_night(subparsers) -> None:
    parser = subparsers.add_parser(
        "night", help="the GPU night: doctor, self-checks, the cases by what they tell, calibration, report, summary",
        description="Spend a GPU window measuring, within --budget-s, writing into --out as it goes: the doctor "
                    "(doctor.json), the GPU self-checks (smoke/), the suite's cases in groups ordered by what they "
                    "tell, the merged run (run.json), its device's budgets section calibrated (a diff), the ladder "
                    "report, the simulated plan of the same GPU (plan.json) and summary.md beside it. Each step is a "
                    "child process of this interpreter: nothing is installed, nothing is fetched. Exit 1 when a "
                    "step failed, 2 when the night cannot start.")
    parser.add_argument("--budget-s", type=float, default=None, metavar="SECONDS",
                        help="wall time for the whole night; measuring stops early enough to merge and summarize")
    parser.add_argument("--summarize", action="store_true",
                        help="run nothing: rewrite DIR/summary.md from what the folder holds now (e.g. a plan.json "
                             "made afterwards with plan --simulate-gpu GPU --json DIR/plan.json)")
    parser.add_argument("--out", required=True, metavar="DIR", help="the night's folder (night.json, logs/, ...)")
    parser.add_argument("--simulate-gpu", default=None, metavar="GPU",
                        help="rehearse on a simulated GPU (a fleet name or spec): cases collect and skip as on it, "
                             "nothing is measured")
    parser.add_argument("--pytest-arg", action="append", default=[], metavar="ARG",
                        help="one more argument for every pytest session of the night (repeatable)")
    parser.set_defaults(handler=_night)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m trainbench", description="trainbench tools")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_report(subparsers)
    _add_calibrate(subparsers)
    _add_noise(subparsers)
    _add_releases(subparsers)
    _add_doctor(subparsers)
    _add_verdict(subparsers)
    _add_explain(subparsers)
    _add_torchrun_job(subparsers)
    _add_plan(subparsers)
    _add_night(subparsers)
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
