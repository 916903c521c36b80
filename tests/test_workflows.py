"""The CI workflows are linted here, so that a broken one fails CI before GitHub ever runs it.

check-jsonschema validates each file against the GitHub workflow schema it vendors (no network),
shellcheck reads every shell step, ``.ci/run`` and ``.ci/ab-base``, and the steps call only what exists: make targets of
the Makefile and subcommands of ``python -m trainbench``.
"""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from trainbench.__main__ import build_parser

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
BIN = Path(sys.executable).parent


def _load(path: Path) -> dict:
    return YAML(typ="safe").load(path.read_text())


def _run_steps(workflow: dict) -> list[str]:
    return [step["run"] for job in workflow["jobs"].values() for step in job["steps"] if "run" in step]


def _schema_check(*paths: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "check-jsonschema"), "--builtin-schema", "vendor.github-workflows", *map(str, paths)],
                          check=False, capture_output=True, text=True, timeout=120)


def test_both_workflows_exist():
    assert [p.name for p in WORKFLOWS] == ["ci.yml", "nightly-gpu.yml"]


def test_the_workflows_are_valid_github_workflows():
    result = _schema_check(*WORKFLOWS)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_schema_check_fails_a_broken_workflow(tmp_path):
    broken = tmp_path / "broken.yml"
    broken.write_text((ROOT / ".github/workflows/ci.yml").read_text().replace("runs-on:", "run-on:"))
    result = _schema_check(broken)
    assert result.returncode != 0 and "run-on" in result.stdout


@pytest.mark.parametrize("path", WORKFLOWS + [ROOT / ".ci" / "run", ROOT / ".ci" / "ab-base"], ids=lambda p: p.name)
def test_every_shell_step_passes_shellcheck(path, tmp_path):
    shellcheck = shutil.which("shellcheck", path=str(BIN)) or shutil.which("shellcheck")
    assert shellcheck, "shellcheck not installed (pip install -e '.[dev]')"
    scripts = [path.read_text()] if path.suffix != ".yml" else _run_steps(_load(path))
    for i, script in enumerate(scripts):
        # GitHub substitutes ${{ ... }} before the shell sees the step: stand in a plain word.
        body = re.sub(r"\$\{\{.*?\}\}", "EXPR", script)
        file = tmp_path / f"step{i}.sh"
        file.write_text("#!/usr/bin/env bash\nset -eo pipefail\n" + body if path.suffix == ".yml" else body)
        result = subprocess.run([shellcheck, "-s", "bash", "-S", "warning", str(file)], check=False, capture_output=True,
                                text=True)
        assert result.returncode == 0, f"{path.name} step {i}:\n{script}\n{result.stdout}"


def test_steps_call_only_make_targets_and_trainbench_commands_that_exist():
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][\w-]*):", makefile, re.MULTILINE))
    commands = set(build_parser()._subparsers._group_actions[0].choices)
    ci_run = (ROOT / ".ci" / "run").read_text()
    for path in WORKFLOWS:
        for script in _run_steps(_load(path)) + [ci_run]:
            for target in re.findall(r"\bmake\s+(?:-\w+\s+)*(?:\"\$\{TRAINBENCH_CI_SUITE:-)?([a-z][\w-]*)", script):
                assert target in targets, f"{path.name}: make {target}: no such target in the Makefile"
            for command in re.findall(r"-m trainbench (\w+)", script):
                assert command in commands, f"{path.name}: python -m trainbench {command}: no such command"


def test_ci_runs_the_same_script_as_ci_here_and_gates_the_cpu_suite():
    ci = _load(ROOT / ".github/workflows/ci.yml")
    assert "pull_request" in ci["on"]
    [job] = ci["jobs"].values()
    steps = {step.get("name", ""): step for step in job["steps"]}
    suite = next(step for step in job["steps"] if step.get("run", "").strip() == "bash .ci/run")
    assert suite["env"] == {"CI": "true", "TRAINBENCH_CI_SUITE": "gate", "GATE_OUT": "results/ci",
                            "GATE_FAIL": "deterministic:0%"}  # the committed baseline gates the deterministic signals
    assert "gate:" in (ROOT / "Makefile").read_text() and "--benchmark-compare='*_baseline'" in (ROOT / "Makefile").read_text()
    assert any("GITHUB_STEP_SUMMARY" in s.get("run", "") and "trainbench verdict" in s.get("run", "")
               for s in steps.values())
    upload = next(step for step in job["steps"] if str(step.get("uses", "")).startswith("actions/upload-artifact"))
    assert upload["with"]["path"] == "results/ci/" and upload["if"] == "always()"


def test_a_pull_request_judges_timing_paired_against_its_merge_base_in_a_cached_venv():
    ci = _load(ROOT / ".github/workflows/ci.yml")
    [job] = ci["jobs"].values()
    steps = job["steps"]
    assert steps[0]["uses"].startswith("actions/checkout") and steps[0]["with"]["fetch-depth"] == 0
    suite = next(i for i, s in enumerate(steps) if s.get("run", "").strip() == "bash .ci/run")
    base = next(i for i, s in enumerate(steps) if s.get("id") == "base")
    assert "github.event_name == 'pull_request'" in steps[base]["if"]
    assert steps[base]["env"]["UPSTREAM"] == "origin/${{ github.base_ref }}"
    assert ".ci/ab-base base" in steps[base]["run"] and "make -s ab-base-key" in steps[base]["run"]
    caches = [i for i, s in enumerate(steps) if str(s.get("uses", "")).startswith("actions/cache")]
    cache = next(i for i in caches if steps[i]["with"]["path"] == ".trainbench-base/venv")
    # the memory predictions of earlier runs restored before the suite (each entry keyed by the code it came from)
    predictions = next(i for i in caches if steps[i]["with"]["path"] == ".pytest_cache/d/trainbench")
    assert predictions < suite and "restore-keys" in steps[predictions]["with"]
    assert "${{ steps.base.outputs.key }}" in steps[cache]["with"]["key"]
    ab = next(i for i, s in enumerate(steps) if s.get("run", "").strip() == "make ab-base")
    assert steps[ab]["env"]["BASE"] == "${{ steps.base.outputs.sha }}" and "step_time_ms" in steps[ab]["env"]["AB_FAIL"]
    assert suite < base < cache < ab
    for i in (cache, ab):
        assert "steps.base.outcome == 'success'" in steps[i]["if"]
    summary = next(s for s in steps if "GITHUB_STEP_SUMMARY" in s.get("run", ""))
    assert "trainbench verdict results/ci/ab-verdict.json" in summary["run"] and summary["if"] == "always()"
    assert "ab-base:" in (ROOT / "Makefile").read_text() and ".trainbench-base/" in (ROOT / ".gitignore").read_text()


def test_the_nightly_runs_doctor_then_the_gated_gpu_suite_on_a_gpu_runner():
    nightly = _load(ROOT / ".github/workflows/nightly-gpu.yml")
    assert nightly["on"]["schedule"] and "torch" in nightly["on"]["workflow_dispatch"]["inputs"]
    [job] = nightly["jobs"].values()
    assert {"self-hosted", "gpu"} <= set(job["runs-on"])
    runs = [step.get("run", "") for step in job["steps"]]
    doctor = next(i for i, r in enumerate(runs) if "-m trainbench doctor" in r)
    suite = next(i for i, r in enumerate(runs) if "-m pytest benchmarks" in r)
    assert doctor < suite
    for option in ("--trainbench-device=cuda", "--benchmark-compare", "--trainbench-compare-fail",
                   "--trainbench-compare-json", "--benchmark-storage=results-branch/benchmarks"):
        assert option in runs[suite]
    push = next(step for step in job["steps"] if "git push" in step.get("run", ""))
    assert push["if"] == "success() && inputs.torch == ''"  # a failed gate or a trial PyTorch never becomes the baseline


def _step(workflow: dict, name: str) -> str:
    [job] = workflow["jobs"].values()
    return next(step["run"] for step in job["steps"] if step.get("name", "").startswith(name))


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True, timeout=60)


def _night(runner: Path, steps: list[str]) -> subprocess.CompletedProcess:
    """One night on a persistent runner: actions/checkout reuses the clone (it cleans with -ffdx, which deletes
    the results worktree but leaves it registered in .git), then the workflow's steps, as GitHub runs them."""
    _git(runner, "clean", "-ffdx")
    _git(runner, "reset", "--hard", "HEAD")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(runner.parent), "GIT_CONFIG_NOSYSTEM": "1",
           "RESULTS_BRANCH": "trainbench-results", "GITHUB_SHA": "0" * 40, "RUNNER_NAME": "gpu-1"}
    script = "\n".join(steps)
    return subprocess.run(["bash", "-e", "-c", script], cwd=runner, env=env, check=False, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("first_night", ["failed the gate", "pushed a baseline", "failed to push"])
def test_the_nightly_sets_up_its_results_branch_again_on_the_second_night(tmp_path, first_night):
    nightly = _load(ROOT / ".github/workflows/nightly-gpu.yml")
    results, push = _step(nightly, "The results branch"), _step(nightly, "Keep the run")
    origin, runner = tmp_path / "origin.git", tmp_path / "runner"
    _git(tmp_path, "init", "-q", "--bare", str(origin))
    _git(tmp_path, "clone", "-q", str(origin), str(runner))
    (runner / "README.md").write_text("trainbench\n")
    _git(runner, "add", "README.md")
    _git(runner, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    _git(runner, "push", "-q", "origin", "HEAD")
    steps = [results]
    if first_night != "failed the gate":  # a run kept as the baseline: its saved run is committed
        steps += ["echo '{}' > results-branch/benchmarks/run.json", push]
    if first_night == "failed to push":
        _git(runner, "remote", "set-url", "--push", "origin", str(tmp_path / "gone.git"))
    first = _night(runner, steps)
    assert (first.returncode == 0) == (first_night != "failed to push"), first.stderr
    _git(runner, "remote", "set-url", "--push", "origin", str(origin))
    second = _night(runner, [results])
    assert second.returncode == 0, second.stderr
    assert (runner / "results-branch" / "benchmarks").is_dir()
    kept = (runner / "results-branch" / "benchmarks" / "run.json").exists()
    assert kept == (first_night == "pushed a baseline")  # the pushed baseline is what the second night compares with


@pytest.mark.parametrize("asv_exit", [0, 2])
def test_a_failed_asv_pass_fails_its_step_visibly_without_failing_the_nightly(tmp_path, asv_exit):
    nightly = _load(ROOT / ".github/workflows/nightly-gpu.yml")
    [job] = nightly["jobs"].values()
    [step] = [s for s in job["steps"] if s.get("name", "").startswith("asv history")]
    assert step["continue-on-error"] is True  # the gate's verdict, not asv, decides whether the run is kept
    assert float(step["env"]["TRAINBENCH_ASV_TIMEOUT"]) > 0
    (tmp_path / ".venv/bin").mkdir(parents=True)
    asv = tmp_path / ".venv/bin/asv"  # stands in for asv: `run` writes results, then exits as asv would
    asv.write_text(f'#!/bin/sh\n[ "$1" = run ] || exit 0\nmkdir -p results/asv/gpu-1\necho {{}} > results/asv/benchmarks.json\n'
                   f'[ "$1" = run ] && exit {asv_exit}\n')
    asv.chmod(0o755)
    (tmp_path / "results-branch/asv").mkdir(parents=True)
    _git(tmp_path, "init", "-q")
    summary = tmp_path / "summary.md"
    env = {"PATH": "/usr/bin:/bin", "RUNNER_NAME": "gpu-1", "GITHUB_STEP_SUMMARY": str(summary), **step["env"]}
    ran = subprocess.run(["bash", "-e", "-c", step["run"]], cwd=tmp_path, env=env, check=False, capture_output=True,
                         text=True, timeout=60)
    assert ran.returncode == asv_exit
    kept = (tmp_path / "results-branch/asv/benchmarks.json").exists()
    assert kept == (asv_exit == 0)
    if asv_exit:
        assert "::error title=asv history::asv run failed (exit 2" in ran.stdout
        assert "TRAINBENCH_ASV_TIMEOUT=7200s" in summary.read_text()


def test_every_make_target_given_an_interpreter_installs_nothing(tmp_path):
    # A GPU box's own torch must never be replaced, and it has no network: PY=python3 runs as it is.
    makefile = (ROOT / "Makefile").read_text()
    phony = re.search(r"^\.PHONY:(.*)$", makefile, re.MULTILINE).group(1).split()
    for target in sorted(set(phony) - {"install", "clean"}):
        dry = subprocess.run(["make", "-n", "-C", str(ROOT), target, "PY=python3", "VENV=" + str(tmp_path / "venv")],
                             capture_output=True, text=True, check=True).stdout
        assert "pip install" not in dry and "-m venv" not in dry and str(tmp_path) not in dry, f"make {target}:\n{dry}"
    without = subprocess.run(["make", "-n", "-C", str(ROOT), "doctor", "VENV=" + str(tmp_path / "venv")],
                             capture_output=True, text=True, check=True).stdout
    assert "pip install" in without  # without PY the project's venv is made and installed first
    night = subprocess.run(["make", "-n", "-C", str(ROOT), "gpu-night", "PY=python3", "NIGHT_BUDGET_S=300",
                            "NIGHT_ARCHIVE=night.tar.gz"], capture_output=True, text=True, check=True).stdout
    assert "python3 -m trainbench night --budget-s 300 --out results/nightly/gpu-night-" in night
    assert "--archive night.tar.gz" in night  # a new folder each night, its archive where asked
