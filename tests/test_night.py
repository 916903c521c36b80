"""The GPU night, rehearsed on the CPU: its order, its budget on a clock the test controls, what a kill leaves on
disk, and a whole night in an environment like a bare GPU box's (installed with no index, no asv, no tomlkit)."""

import json
import os
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from trainbench.cli.night import (
    CASE_GROUPS,
    FINISH_RESERVE_S,
    MIN_STEP_S,
    NightError,
    StepOutcome,
    child_environment,
    finish_reserve,
    junit_cases,
    least_budget_s,
    merge_runs,
    run_night,
)
from trainbench.verdicts.store import INCOMPLETE_KEY

ROOT = Path(__file__).parents[1]


def _record(case: str) -> dict:
    """A measured case's record: 20 ms steps of 32 samples, a 900 MiB allocator peak."""
    return {"case": case, "samples_per_step": 32, "samples_per_s": 1600.0, "step_time_ms": 20.0,
            "round_step_times_s": [0.02, 0.02, 0.02], "peak_memory_mib": 900.0}


def _group_run(cases: list[str], incomplete: bool = False) -> dict:
    run = {"machine_info": {"trainbench": {"kind": "cuda", "name": "NVIDIA H100 80GB HBM3"}}, "commit_info": {},
           "benchmarks": [{"name": f"test_recipe[{c}]", "fullname": f"benchmarks/test_recipes.py::test_recipe[{c}]",
                           "stats": {}, "extra_info": _record(c)} for c in cases]}
    if incomplete:
        run[INCOMPLETE_KEY] = True
    return run


class VirtualNight:
    """A step runner on a virtual clock: each step takes the seconds ``durations`` gives its name (default 5),
    is stopped at its deadline, and a case group writes its run and JUnit report as pytest would."""

    def __init__(self, durations: dict[str, float] | None = None, interrupt_at: str | None = None,
                 plan: dict | None = None, skips: dict[str, str] | None = None,
                 exit_codes: dict[str, int] | None = None):
        self.plan, self.skips, self.exit_codes = plan, skips or {}, exit_codes or {}
        self.now = 1000.0
        self.durations = durations or {}
        self.interrupt_at = interrupt_at
        self.started: list[str] = []

    def clock(self) -> float:
        return self.now

    def __call__(self, argv: list[str], log: Path, deadline: float) -> StepOutcome:
        name = log.stem
        if name == self.interrupt_at:
            raise KeyboardInterrupt("SIGTERM")
        self.started.append(name)
        log.write_text(" ".join(argv) + "\n")
        took = self.durations.get(name, 5.0)
        stopped = self.now + took > deadline
        self.now = min(self.now + took, deadline + 2.0)
        if name.startswith("cases-"):
            node_ids = [a for a in argv if "::" in a]
            done = [n[n.index("[") + 1:-1] for n in node_ids][:1 if stopped else None]
            out = Path(argv[argv.index("--benchmark-json") + 1])
            out.write_text(json.dumps(_group_run([c for c in done if c not in self.skips], incomplete=stopped)))
            cases = "".join(f'<testcase classname="x" name="test_recipe[{c}]"><skipped message="{self.skips[c]}"/>'
                            f'</testcase>' if c in self.skips else f'<testcase classname="x" name="test_recipe[{c}]"/>'
                            for c in done)
            Path(argv[argv.index("--junitxml") + 1]).write_text(f"<testsuites><testsuite>{cases}</testsuite></testsuites>")
        if name == "plan" and self.plan is not None:
            Path(argv[argv.index("--json") + 1]).write_text(json.dumps(self.plan))
        return StepOutcome(self.exit_codes.get(name, 0)) if not stopped else StepOutcome(-15, stopped=True)


def _night(tmp_path, virtual: VirtualNight, budget_s: float = 600.0, simulate: str | None = "h100-sxm"):
    lines: list[str] = []
    status = run_night(tmp_path / "night", budget_s, simulate, ROOT, python="python-under-test", runner=virtual,
                       clock=virtual.clock, say=lines.append)
    manifest = json.loads((tmp_path / "night" / "night.json").read_text())
    return status, manifest, lines


def test_the_night_runs_its_steps_in_the_order_of_what_they_tell(tmp_path):
    virtual = VirtualNight()
    status, manifest, lines = _night(tmp_path, virtual, simulate=None)
    groups = [f"cases-{i:02d}-{g.name}" for i, g in enumerate(CASE_GROUPS, 1)]
    assert virtual.started == ["doctor", "smoke", *groups, "calibrate", "report", "plan"]
    assert "plan --simulate-gpu NVIDIA H100 80GB HBM3" in (tmp_path / "night" / "logs" / "plan.log").read_text()
    assert [s["name"] for s in manifest["steps"]] == ["doctor", "smoke", *groups, "run", "calibrate", "report",
                                                     "plan", "summary"]
    assert status == 0 and manifest["finished"] and lines[-1].startswith("night: complete")
    first = (tmp_path / "night" / "logs" / f"{groups[0]}.log").read_text()
    assert first.index("resnet18-baseline") < first.index("resnet18-amp_fp16") < first.index("resnet18-cudnn_benchmark")
    assert "--trainbench-simulate-gpu" not in first and "--slow" not in first and "--trainbench-device=cuda" in first
    assert "--trainbench-slow" in (tmp_path / "night" / "logs" / f"{groups[3]}.log").read_text()
    # every suite case is in exactly one group
    every = [a for g in groups for a in (tmp_path / "night" / "logs" / f"{g}.log").read_text().split() if "::" in a]
    assert len(every) == len(set(every)) == 75
    run = json.loads((tmp_path / "night" / "run.json").read_text())
    assert len(run["benchmarks"]) == 75 and INCOMPLETE_KEY not in run
    summary = (tmp_path / "night" / "summary.md").read_text()
    assert summary.startswith("# GPU night:") and "| resnet18-baseline |" in summary


def test_the_budget_stops_measuring_early_enough_to_merge_and_summarize(tmp_path):
    budget = 300.0
    virtual = VirtualNight({"cases-01-resnet18": 100.0, "cases-02-gpt": 400.0})
    status, manifest, lines = _night(tmp_path, virtual, budget, simulate=None)
    steps = {s["name"]: s for s in manifest["steps"]}
    assert steps["cases-01-resnet18"]["status"] == "ok"
    assert steps["cases-02-gpt"]["status"] == "stopped"  # past the measuring deadline
    assert steps["cases-03-vit"]["status"] == "not started" and "cases-03-vit" not in virtual.started
    assert steps["summary"]["status"] == "ok"
    # the stopped group's partial run is kept and marks the merged run incomplete
    run = json.loads((tmp_path / "night" / "run.json").read_text())
    assert run[INCOMPLETE_KEY] is True and [b["extra_info"]["case"] for b in run["benchmarks"]][-1] == "gpt-baseline"
    assert virtual.now - 1000.0 <= budget
    assert lines[-1].startswith("night: PARTIAL: cases-02-gpt, cases-03-vit") and status == 0


def test_a_failed_step_fails_the_night_and_a_group_left_empty_does_not(tmp_path):
    virtual = VirtualNight(exit_codes={"cases-02-gpt": 5, "cases-03-vit": 1})
    status, manifest, lines = _night(tmp_path, virtual, simulate=None)
    steps = {s["name"]: s for s in manifest["steps"]}
    assert steps["cases-02-gpt"]["status"] == "ok" and "no case selected" in steps["cases-02-gpt"]["note"]
    assert steps["cases-03-vit"]["status"] == "failed" and steps["cases-04-ladders"]["status"] == "ok"
    assert status == 1 and lines[-1].startswith("night: FAILED: cases-03-vit;")


def test_self_checks_that_all_skipped_checked_nothing_and_fail_the_night(tmp_path):
    class NoGpu(VirtualNight):
        def __call__(self, argv, log, deadline):
            if log.stem == "smoke":  # what pytest reports where no CUDA device is usable: skipped, exit 0
                Path(argv[argv.index("--junitxml") + 1]).write_text(
                    '<testsuites><testsuite><testcase name="test_cuda_path[resnet18-baseline]">'
                    '<skipped message="GPU smoke: needs a CUDA device"/></testcase></testsuite></testsuites>')
            return super().__call__(argv, log, deadline)

    status, manifest, lines = _night(tmp_path, NoGpu(), simulate=None)
    smoke = {s["name"]: s for s in manifest["steps"]}["smoke"]
    assert smoke["status"] == "failed" and smoke["note"] == "every self-check skipped: GPU smoke: needs a CUDA device"
    assert status == 1 and lines[-1].startswith("night: FAILED: smoke;")


def test_a_kill_leaves_what_finished_merged_and_summarized(tmp_path):
    virtual = VirtualNight(interrupt_at="cases-03-vit")
    status, manifest, lines = _night(tmp_path, virtual, simulate=None)
    assert manifest["interrupted"] and manifest["finished"] and status == 1
    assert lines[-1].startswith("night: INTERRUPTED;")  # never "complete": later steps were not tried
    run = json.loads((tmp_path / "night" / "run.json").read_text())
    cases = [b["extra_info"]["case"] for b in run["benchmarks"]]
    assert cases[0] == "resnet18-baseline" and cases[-1] == "gpt-optimizer_fused"
    assert (tmp_path / "night" / "summary.md").exists()


def test_a_rehearsal_passes_the_simulated_gpu_to_every_session_and_merges_nothing(tmp_path):
    plan = {"gpu": {"name": "NVIDIA L40S"}, "cases": [{"case": "resnet18-baseline"}]}
    virtual = VirtualNight(plan=plan, skips={"resnet18-baseline": "resnet18-baseline: would run on simulated NVIDIA "
                                                                  "L40S: [cuda] ...; nothing is measured"})
    status, manifest, lines = _night(tmp_path, virtual, simulate="NVIDIA L40S")
    steps = {s["name"]: s for s in manifest["steps"]}
    assert status == 0 and lines[-1].startswith("night: complete")
    assert steps["run"]["status"] == "skipped" and "nothing is measured" in steps["run"]["note"]
    assert "calibrate" not in steps and steps["plan"]["status"] == "ok"
    assert virtual.started[:2] == ["doctor", "plan"]  # the rehearsal's measurement, before its sessions
    assert steps["smoke"]["status"] == "skipped"
    for log in ("cases-01-resnet18", "cases-05-rest"):
        assert "--trainbench-simulate-gpu NVIDIA L40S" in (tmp_path / "night" / "logs" / f"{log}.log").read_text()
    assert "doctor --simulate-gpu NVIDIA L40S" in (tmp_path / "night" / "logs" / "doctor.log").read_text()
    summary = (tmp_path / "night" / "summary.md").read_text()
    assert "(simulated: nothing measured)" in summary and "| resnet18-baseline | run | would run (simulated) |" in summary
    assert summary.split("## What differed from the plan")[1].startswith("\n\n- nothing")


def test_the_summary_sets_the_run_beside_the_plan_and_says_what_differed(tmp_path):
    plan = {"gpu": {"name": "NVIDIA H100 80GB HBM3"}, "cases": [
        {"case": "resnet18-baseline", "needed_mib": 1200.0, "roofline": "launch-bound, >= 5.0 ms/step",
         "bound_s": 0.005},
        {"case": "resnet18-amp_fp16", "needed_mib": 600.0},  # measured 900 MiB: above the prediction
        {"case": "resnet18-ddp", "skipped": "needs 2 CUDA devices"},  # skipped as planned
        {"case": "gpt-baseline", "skipped": "needs ~90 GiB"},  # yet it ran
    ]}
    _night(tmp_path, VirtualNight(plan=plan, skips={"resnet18-ddp": "needs 2 CUDA devices"}), simulate=None)
    summary = (tmp_path / "night" / "summary.md").read_text()
    assert "| resnet18-baseline | run | passed | launch-bound, >= 5.0 ms/step | 1600.0 | 900.0 | 1200.0 |" in summary
    differed = summary.split("## What differed from the plan")[1]
    assert "- resnet18-amp_fp16: measured peak 900 MiB above the predicted 600 MiB" in differed
    assert "- gpt-baseline: planned to skip (needs ~90 GiB), passed" in differed
    assert "resnet18-ddp" not in differed and "- resnet18-baseline:" not in differed.split("## Measured")[0]
    assert "- resnet18-baseline: measured 20.0 ms/step, roofline >= 5.0 ms/step (4.00x)" in summary


def test_a_plan_made_afterwards_is_summarized_again_without_running_anything(tmp_path, capsys):
    from trainbench.__main__ import main

    _night(tmp_path, VirtualNight({"plan": 500.0}), budget_s=200.0, simulate=None)  # the plan stopped
    out = tmp_path / "night"
    assert "No plan was made" in (out / "summary.md").read_text()
    (out / "plan.json").write_text(json.dumps({"gpu": {"name": "NVIDIA H100 80GB HBM3"}, "cases": [
        {"case": "resnet18-baseline", "needed_mib": 1200.0, "roofline": "launch-bound, >= 5.0 ms/step"}]}))
    assert main(["night", "--out", str(out), "--summarize"]) == 0
    summary = (out / "summary.md").read_text()
    assert "No plan was made" not in summary and "| resnet18-baseline | run | passed | launch-bound" in summary
    assert "| plan | stopped |" in summary  # the steps as the night recorded them
    assert main(["night", "--out", str(tmp_path), "--summarize"]) == 2
    assert "night.json: missing or unreadable" in capsys.readouterr().err


def test_a_gpu_nights_sessions_measure_whatever_its_doctor_said_and_a_rehearsals_do_not(tmp_path):
    assert child_environment(tmp_path, None) == {"TRAINBENCH_PREDICTIONS_FILE": str(tmp_path / "predictions.json"),
                                                 "TRAINBENCH_IGNORE_DOCTOR": "1"}
    assert "TRAINBENCH_IGNORE_DOCTOR" not in child_environment(tmp_path, "NVIDIA L40S")


def test_a_night_that_cannot_start_says_why_before_any_step(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(NightError, match="--out .*file: not a folder"):
        run_night(tmp_path / "file", 600, None, ROOT, runner=VirtualNight())
    with pytest.raises(NightError, match="--budget-s 20: too short; expected at least 45 s"):
        run_night(tmp_path / "n", 20, None, ROOT, runner=VirtualNight())
    with pytest.raises(NightError, match="--budget-s 39: too short; expected at least 40 s"):
        run_night(tmp_path / "n", 39, "NVIDIA L40S", ROOT, runner=VirtualNight())
    with pytest.raises(NightError, match="--simulate-gpu: .*unknown GPU 'NVIDIA L41S'"):
        run_night(tmp_path / "n", 600, "NVIDIA L41S", ROOT, runner=VirtualNight())
    with pytest.raises(NightError, match="benchmarks/test_recipes.py: not found"):
        run_night(tmp_path / "n", 600, None, tmp_path, runner=VirtualNight())
    assert FINISH_RESERVE_S > MIN_STEP_S
    # The least budget leaves two steps' time to measure in before the finish, and not a second more.
    for simulated in (False, True):
        least = least_budget_s(simulated)
        assert least - finish_reserve(least, simulated) == 2 * MIN_STEP_S
        assert least - 1 - finish_reserve(least - 1, simulated) < 2 * MIN_STEP_S


def test_merging_keeps_every_part_and_names_the_unreadable(tmp_path):
    (tmp_path / "01.json").write_text(json.dumps(_group_run(["a-baseline"])))
    (tmp_path / "02.json").write_text("{truncated")
    note = merge_runs([tmp_path / "01.json", tmp_path / "02.json"], tmp_path / "run.json")
    run = json.loads((tmp_path / "run.json").read_text())
    assert [b["extra_info"]["case"] for b in run["benchmarks"]] == ["a-baseline"] and run[INCOMPLETE_KEY]
    assert "02.json: invalid JSON" in note
    with pytest.raises(ValueError, match="no group saved a run"):
        merge_runs([tmp_path / "02.json"], tmp_path / "none.json")


def test_junit_cases_read_outcomes_and_skip_reasons(tmp_path):
    (tmp_path / "r.xml").write_text(
        '<testsuites><testsuite>'
        '<testcase name="test_recipe[a-baseline]"/>'
        '<testcase name="test_recipe[a-ddp]"><skipped message="needs 2 CUDA devices"/></testcase>'
        '<testcase name="test_recipe[a-amp]"><failure message="budget: min_speedup"/></testcase>'
        '</testsuite></testsuites>')
    assert [(c.case, c.outcome, c.message) for c in junit_cases(tmp_path / "r.xml")] == [
        ("a-baseline", "passed", ""), ("a-ddp", "skipped", "needs 2 CUDA devices"), ("a-amp", "failed",
                                                                                      "budget: min_speedup")]


def test_a_jobs_processes_share_predictions_and_counts_through_one_file(tmp_path, monkeypatch, cpu, profile, mlp):
    from trainbench.core import predict, roofline
    from trainbench.core.recipes import get_recipe

    monkeypatch.setenv("TRAINBENCH_PREDICTIONS_FILE", str(tmp_path / "shared.json"))
    calls = []
    real_predict, real_count = predict.predict_memory, roofline.count_step
    monkeypatch.setattr(predict, "predict_memory", lambda *a: calls.append("memory") or real_predict(*a))
    monkeypatch.setattr(roofline, "count_step", lambda *a: calls.append("counts") or real_count(*a))
    configs = [get_recipe(name).config(profile) for name in ("baseline", "larger_batch")]
    memory, counts = predict.PredictionCache(cpu), roofline.CountCache(cpu)
    first = [(memory("cpu", config, mlp), counts("cpu", config, mlp)) for config in configs]  # interleaved writes
    stored = json.loads((tmp_path / "shared.json").read_text())
    assert sorted(key.split("|")[0] for key in stored) == ["counts"] * 2 + ["memory"] * 2  # none written over
    # a second process: new caches, the same file
    second = [(predict.PredictionCache(cpu)("cpu", c, mlp), roofline.CountCache(cpu)("cpu", c, mlp)) for c in configs]
    assert calls == ["memory", "counts"] * 2 and first == second
    monkeypatch.delenv("TRAINBENCH_PREDICTIONS_FILE")
    predict.PredictionCache(cpu)("cpu", configs[0], mlp)
    assert calls[-1] == "memory" and len(calls) == 5  # off without the variable


# -- a bare GPU box, rehearsed ---------------------------------------------------------------------------

BLOCKER = """import importlib.abc, sys
class _Absent(importlib.abc.MetaPathFinder):
    # asv and tomlkit are not on the GPU box
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("asv", "tomlkit"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _Absent())
"""


@pytest.fixture(scope="module")
def bare_box(tmp_path_factory):
    """A venv whose packages are this one's (torch and pytest, as the box's python3 holds them) but for asv and
    tomlkit, with trainbench installed as on the box: no index, no dependencies, no build isolation."""
    venv = tmp_path_factory.mktemp("box") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()"
                                "['purelib'])"], check=True, capture_output=True, text=True).stdout.strip())
    (site / "box_packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\nimport box_absent\n")
    (site / "box_absent.py").write_text(BLOCKER)
    installed = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
                                "--quiet", "--no-index", "--no-deps", "--no-build-isolation", str(ROOT)],
                               capture_output=True, text=True, env=dict(os.environ, PIP_NO_INPUT="1"))
    assert installed.returncode == 0, installed.stderr[-2000:]
    python = str(venv / "bin" / "python")
    probe = subprocess.run([python, "-c", "import torch, trainbench; import tomlkit"], capture_output=True, text=True)
    assert "No module named 'tomlkit'" in probe.stderr
    return python


def test_a_whole_night_on_a_bare_box_ends_inside_its_budget_with_its_folder_filled(bare_box, tmp_path):
    out = tmp_path / "night"
    budget = least_budget_s(simulated=True)  # the least a rehearsal accepts: the plan is stopped at its deadline
    started = time.monotonic()
    done = subprocess.run([bare_box, "-m", "trainbench", "night", "--simulate-gpu", "NVIDIA L40S",
                           "--budget-s", str(budget), "--out", str(out), "--pytest-arg=-k",
                           "--pytest-arg=resnet18-baseline or gpt-baseline or resnet18-ddp"],
                          cwd=ROOT, capture_output=True, text=True, timeout=budget + 60)
    took = time.monotonic() - started
    manifest = json.loads((out / "night.json").read_text())
    steps = {s["name"]: s for s in manifest["steps"]}
    assert manifest["finished"], done.stdout[-3000:]
    assert took <= budget + 10  # the interpreter's own start and end beside the night's clock
    assert steps["doctor"]["status"] == "ok" and {c["name"] for c in json.loads((out / "doctor.json").read_text())} \
        >= {"cuda", "gpu0_arch", "gpu0_memory"}
    assert list(steps)[:4] == ["doctor", "plan", "smoke", "cases-01-resnet18"] and list(steps)[-1] == "summary"
    # every step ended as the budget allowed, none failed: asv and tomlkit were not needed
    assert {s["status"] for s in manifest["steps"]} <= {"ok", "skipped", "stopped", "not started"}, done.stdout
    assert (out / "summary.md").read_text().startswith("# GPU night: NVIDIA L40S (simulated: nothing measured)")
    assert done.stdout.splitlines()[-1].startswith(("night: complete", "night: PARTIAL"))
