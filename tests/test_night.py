"""The GPU night, rehearsed on the CPU: its order, its budget on a clock the test controls, what a kill leaves on
disk, and a whole night in an environment like a bare GPU box's (installed with no index, no asv, no tomlkit)."""

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from trainbench.core.setups.cases import all_cases
from trainbench.jobs.doctor import Check, write_checks
from trainbench.jobs.night import child_environment, run_night, summarize_again, write_archive
from trainbench.jobs.night_manifest import Night, NightError
from trainbench.jobs.night_processes import StepOutcome
from trainbench.jobs.night_results import junit_cases, keep_run
from trainbench.jobs.night_schedule import (
    FINISH_RESERVE_S,
    MIN_STEP_S,
    SHORT_NIGHT_S,
    SMOKE_CAP_S,
    finish_reserve,
    least_budget_s,
    night_node_ids,
    smoke_node_ids,
    window_profile,
)
from trainbench.verdicts.store import INCOMPLETE_KEY, PLANTED_KEY

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
                 exit_codes: dict[str, int] | None = None, crash_at: str | None = None):
        self.plan, self.skips, self.exit_codes, self.crash_at = plan, skips or {}, exit_codes or {}, crash_at
        self.deadlines: dict[str, float] = {}
        self.now = 1000.0
        self.durations = durations or {}
        self.interrupt_at = interrupt_at
        self.started: list[str] = []

    def clock(self) -> float:
        return self.now

    def __call__(self, argv: list[str], log: Path, deadline: float) -> StepOutcome:
        name = log.stem
        self.deadlines[name] = deadline
        if name == self.interrupt_at:
            if name == "cases":  # killed after its first two cases: only the run after each case is on disk
                self._progress(argv, self._case_ids(argv)[:2])
            raise KeyboardInterrupt("SIGTERM")
        self.started.append(name)
        log.write_text(" ".join(argv) + "\n")
        took = self.durations.get(name, 5.0)
        stopped = self.now + took > deadline
        self.now = min(self.now + took, deadline + 2.0)
        if name == "cases":
            done = self._case_ids(argv)[:1 if stopped else None]
            self._progress(argv, done)
            out = Path(argv[argv.index("--benchmark-json") + 1])
            out.write_text(json.dumps(_group_run([c for c in done if c not in self.skips], incomplete=stopped)))
            cases = "".join(f'<testcase classname="x" name="test_recipe[{c}]"><skipped message="{self.skips[c]}"/>'
                            f'</testcase>' if c in self.skips else f'<testcase classname="x" name="test_recipe[{c}]"/>'
                            for c in done)
            Path(argv[argv.index("--junitxml") + 1]).write_text(f"<testsuites><testsuite>{cases}</testsuite></testsuites>")
        if name == "plan" and self.plan is not None:
            Path(argv[argv.index("--json") + 1]).write_text(json.dumps(self.plan))
        if self.crash_at == name:
            raise RuntimeError("the night's own code broke")
        return StepOutcome(self.exit_codes.get(name, 0)) if not stopped else StepOutcome(-15, stopped=True)

    @staticmethod
    def _case_ids(argv: list[str]) -> list[str]:
        return [a[a.index("[") + 1:-1] for a in argv if "::" in a]

    def _progress(self, argv: list[str], done: list[str]) -> None:
        path = Path(argv[argv.index("--trainbench-save-progress") + 1])
        path.write_text(json.dumps(_group_run([c for c in done if c not in self.skips], incomplete=True)))


def _night(tmp_path, virtual: VirtualNight, budget_s: float = 600.0, simulate: str | None = "h100-sxm", **options):
    lines: list[str] = []
    status = run_night(tmp_path / "night", budget_s, simulate, ROOT, python="python-under-test", runner=virtual,
                       clock=virtual.clock, say=lines.append, **options)
    manifest = json.loads((tmp_path / "night" / "night.json").read_text())
    return status, manifest, lines


def _cases_argv(tmp_path) -> list[str]:
    return (tmp_path / "night" / "logs" / "cases.log").read_text().split()


def test_the_night_measures_its_cases_in_one_session_in_the_order_of_what_they_tell(tmp_path):
    virtual = VirtualNight()
    status, manifest, lines = _night(tmp_path, virtual, simulate=None)
    assert virtual.started == ["doctor", "smoke", "cases", "calibrate"]  # no plan on the GPU's clock
    assert [s["name"] for s in manifest["steps"]] == ["doctor", "smoke", "cases", "run", "calibrate", "report",
                                                     "summary"]
    assert status == 0 and manifest["finished"] and lines[-1].startswith("night: complete")
    argv = _cases_argv(tmp_path)
    cases = [a[a.index("[") + 1:-1] for a in argv if "::" in a]
    assert len(cases) == len(set(cases)) == len(all_cases())  # every suite case once
    assert cases.index("resnet18-baseline") < cases.index("resnet18-amp_fp16") < cases.index("gpt-baseline") \
        < cases.index("resnet18-larger_batch") < cases.index("resnet18-compile") < cases.index(
            "resnet18-ladder003-0_baseline")
    ladders = [i for i, c in enumerate(cases) if "-ladder" in c]
    assert ladders == list(range(75 - len(ladders), 75))  # the slowest last
    compiling = [i for i, c in enumerate(cases) if c.endswith("compile") and "-ladder" not in c]
    assert min(compiling) > cases.index("transformer-baseline")  # after every case that compiles nothing
    assert "--trainbench-simulate-gpu" not in argv and "--trainbench-device=cuda" in argv
    assert "--trainbench-slow" in argv and "--trainbench-save-progress" in argv
    run = json.loads((tmp_path / "night" / "run.json").read_text())
    assert len(run["benchmarks"]) == 75 and INCOMPLETE_KEY not in run
    assert {s["name"]: s for s in manifest["steps"]}["report"]["note"] == "no ladder rung was measured"
    summary = (tmp_path / "night" / "summary.md").read_text()
    assert summary.startswith("# GPU night: NVIDIA H100 80GB HBM3 (measured)") and "| resnet18-baseline |" in summary


def test_the_window_profile_is_chosen_by_the_budget_and_recorded(tmp_path):
    short, full = window_profile(SHORT_NIGHT_S - 1, "cuda"), window_profile(SHORT_NIGHT_S, "cuda")
    assert short.pytest_args() == ("--trainbench-rounds=10", "--trainbench-steps-per-round=5",
                                   "--trainbench-min-warmup=5", "--trainbench-no-attribution")
    assert full.pytest_args() == () and "as is" in full.why
    assert window_profile(240, "cpu").pytest_args() == ("--trainbench-rounds=8", "--trainbench-steps-per-round=2",
                                                        "--trainbench-no-attribution")
    # the rounds never drop below the count a first look of a budget measured again can decide from
    from trainbench.core.records.stats import least_rounds

    assert all(p.rounds is None or p.rounds > least_rounds("paired", 2) for p in (short, window_profile(60, "cpu")))
    _, manifest, _ = _night(tmp_path, VirtualNight(), simulate=None)
    assert manifest["profile"]["name"] == "short" and manifest["profile"]["rounds"] == 10
    assert "--trainbench-rounds=10" in _cases_argv(tmp_path)
    assert "Profile: short (a budget of 600 s < 900 s" in (tmp_path / "night" / "summary.md").read_text()


def test_the_smoke_step_is_capped_and_checks_the_method_before_any_path_the_cases_measure(tmp_path):
    virtual = VirtualNight({"smoke": 500.0})
    _, manifest, _ = _night(tmp_path, virtual, simulate=None)
    steps = {s["name"]: s for s in manifest["steps"]}
    assert steps["smoke"]["status"] == "stopped" and f"cap of {SMOKE_CAP_S:g} s" in steps["smoke"]["note"]
    assert virtual.deadlines["smoke"] == 1000.0 + 5.0 + SMOKE_CAP_S  # after the 5 s doctor
    assert steps["cases"]["status"] == "ok"
    ids = smoke_node_ids(ROOT, night_node_ids({}))
    names = [i.split("::")[1] for i in ids]
    paths = [n for n in names if n.startswith(("test_cuda_path", "test_multi_gpu_path"))]
    assert names[:len(names) - len(paths)] and all(not n.startswith("test_cuda_path") for n in names[:3])
    assert names.index(paths[0]) == len(names) - len(paths)  # the self-checks first, every path after them
    assert "test_cuda_path[resnet18-amp_fp16]" not in names  # the night's own cases measure it


def test_the_budget_stops_measuring_early_enough_to_merge_and_summarize(tmp_path):
    budget = 300.0
    virtual = VirtualNight({"cases": 400.0})
    status, manifest, lines = _night(tmp_path, virtual, budget, simulate=None)
    steps = {s["name"]: s for s in manifest["steps"]}
    assert steps["cases"]["status"] == "stopped" and steps["summary"]["status"] == "ok"
    # the stopped session's partial run is kept, marked incomplete
    run = json.loads((tmp_path / "night" / "run.json").read_text())
    assert run[INCOMPLETE_KEY] is True and [b["extra_info"]["case"] for b in run["benchmarks"]] == ["resnet18-baseline"]
    assert virtual.now - 1000.0 <= budget
    assert lines[-1].startswith("night: PARTIAL: cases did not finish") and status == 0


def test_a_failed_step_fails_the_night_and_a_session_that_selected_nothing_does_not(tmp_path):
    status, manifest, lines = _night(tmp_path, VirtualNight(exit_codes={"cases": 5}), simulate=None)
    cases = {s["name"]: s for s in manifest["steps"]}["cases"]
    assert cases["status"] == "ok" and "no case selected" in cases["note"] and status == 0
    status, manifest, lines = _night(tmp_path / "again", VirtualNight(exit_codes={"cases": 1}), simulate=None)
    assert status == 1 and lines[-1].startswith("night: FAILED: cases;")


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


def test_a_kill_keeps_every_case_finished_before_it_merged_summarized_and_archived(tmp_path):
    virtual = VirtualNight(interrupt_at="cases")
    archive = tmp_path / "home" / "night.tar.gz"
    status, manifest, lines = _night(tmp_path, virtual, simulate=None, archive=archive)
    assert manifest["interrupted"] and manifest["finished"] and status == 1
    assert any(line.startswith("night: INTERRUPTED;") for line in lines)  # never "complete"
    run = json.loads((tmp_path / "night" / "run.json").read_text())
    assert [b["extra_info"]["case"] for b in run["benchmarks"]] == ["resnet18-baseline", "resnet18-amp_fp16"]
    assert run[INCOMPLETE_KEY] is True
    members = _archived(archive)
    assert {"night/run.json", "night/summary.md", "night/night.json", "night/logs/doctor.log"} <= set(members)
    assert json.loads(members["night/night.json"])["verdict"].startswith("INTERRUPTED")
    assert lines[-1].startswith(f"night: archive {archive}")
    # the step the kill ended is "stopped" in the manifest and the summary, never left "running"
    steps = {s["name"]: s for s in manifest["steps"]}
    assert steps["cases"]["status"] == "stopped" and "interrupted" in steps["cases"]["note"]
    assert "| cases | stopped |" in (tmp_path / "night" / "summary.md").read_text()


def _archived(archive: Path) -> dict[str, bytes]:
    import tarfile

    with tarfile.open(archive) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


@pytest.mark.parametrize("ending", ["complete", "failed budgets", "a crash of the night's own code"])
def test_the_archive_is_written_in_every_ending(tmp_path, ending):
    virtual = {"complete": VirtualNight(), "failed budgets": VirtualNight(exit_codes={"cases": 1}),
               "a crash of the night's own code": VirtualNight(crash_at="cases")}[ending]
    archive = tmp_path / "night.tar.gz"
    if ending.startswith("a crash"):
        with pytest.raises(RuntimeError, match="the night's own code broke"):
            _night(tmp_path, virtual, simulate=None, archive=archive)
    else:
        status, _, _ = _night(tmp_path, virtual, simulate=None, archive=archive)
        assert status == (1 if ending == "failed budgets" else 0)
    assert "night/night.json" in _archived(archive) and not list(tmp_path.glob(".night.tar.gz.*"))


def test_an_archive_over_its_limit_leaves_traces_out_first_and_the_summary_says_so(tmp_path):
    out = tmp_path / "night"
    (out / "logs").mkdir(parents=True)
    (out / "run.json").write_text(json.dumps(_group_run(["resnet18-baseline"])))
    (out / "logs" / "cases.log").write_bytes(os.urandom(30_000))  # random bytes: gzip cannot shrink them
    (out / "traces").mkdir()
    (out / "traces" / "resnet18-baseline.trace.json").write_bytes(os.urandom(60_000))
    night = Night(out, 600.0, None, "python")
    night.save()
    left_out = write_archive(night, tmp_path / "a.tar.gz", limit=50_000)
    assert left_out == ["traces/resnet18-baseline.trace.json"] and (tmp_path / "a.tar.gz").stat().st_size <= 50_000
    members = _archived(tmp_path / "a.tar.gz")
    assert "night/logs/cases.log" in members and "night/run.json" in members
    assert b"Left out of the archive" in members["night/summary.md"] and b"resnet18-baseline.trace.json" in \
        members["night/summary.md"]
    with pytest.raises(ValueError, match="over the 0 MiB limit"):
        write_archive(night, tmp_path / "b.tar.gz", limit=100)
    assert not (tmp_path / "b.tar.gz").exists()


def test_the_doctors_shared_memory_blocker_deselects_the_cases_it_would_kill(tmp_path):
    class SmallShm(VirtualNight):
        def __call__(self, argv, log, deadline):
            if log.stem == "doctor":
                write_checks(Path(argv[argv.index("--json") + 1]),  # as doctor --json writes it
                             [Check("shm", "FAIL", "64 MiB free: DataLoader workers would die")])
            return super().__call__(argv, log, deadline)

    _, manifest, _ = _night(tmp_path, SmallShm(), simulate=None)
    argv = " ".join(_cases_argv(tmp_path))
    assert "resnet18-multiprocess_loading]" not in argv and "resnet18-ladder003-1_multiprocess_loading]" not in argv
    assert "resnet18-baseline]" in argv
    assert "64 MiB free" in manifest["deselected"]["resnet18-multiprocess_loading"]
    assert "- resnet18-multiprocess_loading: deselected: the doctor's shm check failed" in (
        tmp_path / "night" / "summary.md").read_text()


def test_a_cpu_night_measures_the_cpu_cases_and_skips_the_gpu_self_checks(tmp_path):
    _, manifest, _ = _night(tmp_path, VirtualNight(), simulate=None, device="cpu")
    steps = {s["name"]: s for s in manifest["steps"]}
    assert steps["smoke"]["status"] == "skipped" and "--trainbench-device=cpu" in _cases_argv(tmp_path)
    assert "doctor --device cpu" in (tmp_path / "night" / "logs" / "doctor.log").read_text()
    assert (tmp_path / "night" / "summary.md").read_text().startswith("# CPU night:")


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
    assert "--trainbench-simulate-gpu NVIDIA L40S" in (tmp_path / "night" / "logs" / "cases.log").read_text()
    assert "doctor --simulate-gpu NVIDIA L40S" in (tmp_path / "night" / "logs" / "doctor.log").read_text()
    summary = (tmp_path / "night" / "summary.md").read_text()
    assert "(simulated: nothing measured)" in summary and "| resnet18-baseline | run | would run (simulated) |" in summary
    assert summary.split("## What differed from the plan")[1].startswith("\n\n- nothing")


PLAN = {"gpu": {"name": "NVIDIA H100 80GB HBM3"}, "cases": [
    {"case": "resnet18-baseline", "needed_mib": 1200.0, "peak_mib": 960.0, "roofline": "launch-bound, >= 5.0 ms/step",
     "bound_s": 0.005},
    {"case": "resnet18-amp_fp16", "needed_mib": 1200.0, "peak_mib": 480.0},  # measured 900 MiB: above 480 x 1.25
    {"case": "resnet18-ddp", "skipped": "needs 2 CUDA devices"},  # skipped as planned
    {"case": "gpt-baseline", "skipped": "needs ~90 GiB"},  # yet it ran
]}


def test_the_summary_sets_the_run_beside_a_plan_made_before_the_night(tmp_path):
    (tmp_path / "plan.json").write_text(json.dumps(PLAN))
    _night(tmp_path, VirtualNight(skips={"resnet18-ddp": "needs 2 CUDA devices"}), simulate=None,
           plan=tmp_path / "plan.json")
    summary = (tmp_path / "night" / "summary.md").read_text()
    assert "| resnet18-baseline | run | passed | launch-bound, >= 5.0 ms/step | — | — | 1600.0 | 900.0 | 960.0 |" in summary
    differed = summary.split("## What differed from the plan")[1]
    assert "- resnet18-amp_fp16: measured peak 900 MiB above the predicted 600 MiB" in differed
    assert "- gpt-baseline: planned to skip (needs ~90 GiB), passed" in differed
    assert "resnet18-ddp" not in differed and "- resnet18-baseline:" not in differed.split("## Measured")[0]
    assert "- resnet18-baseline: measured 20.0 ms/step, roofline >= 5.0 ms/step (4.00x)" in summary


def test_a_plan_saved_before_rows_carried_their_own_peak_compares_no_peak(tmp_path):
    # needed_mib is the larger of the case and its baseline, with headroom: a checkpointing case's own peak is not it
    old = {**PLAN, "cases": [{k: v for k, v in c.items() if k != "peak_mib"} for c in PLAN["cases"]]}
    (tmp_path / "plan.json").write_text(json.dumps(old))
    _night(tmp_path, VirtualNight(), simulate=None, plan=tmp_path / "plan.json")
    summary = (tmp_path / "night" / "summary.md").read_text()
    assert "| resnet18-baseline | run | passed | launch-bound, >= 5.0 ms/step | — | — | 1600.0 | 900.0 | — |" in summary
    assert "measured peak" not in summary


H200_NIGHT = ROOT / "results" / "gpu-night" / "nvidia-h200-2026-11-28" / "run.json"


def test_the_summary_says_which_cases_the_budget_fits_by_the_plans_seconds(tmp_path):
    plan = {"gpu": {"name": "NVIDIA H100 80GB HBM3"}, "cases": [
        {"case": "resnet18-baseline", "predicted_s": 200.0}, {"case": "resnet18-amp_fp16", "predicted_s": 200.0},
        {"case": "resnet18-amp_bf16", "predicted_s": 100.0}, {"case": "resnet18-ddp", "skipped": "needs 2 GPUs"}]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    _night(tmp_path, VirtualNight(), simulate=None, plan=tmp_path / "plan.json")
    summary = (tmp_path / "night" / "summary.md").read_text()
    # 600 s less the 60 s reserve, 20 s of doctor and the 60 s smoke cap: 460 s for 200 + 200 + 100 s
    assert ("a 600 s night's cases step (~460 s: the budget less the finish reserve, ~20 s of doctor and the smoke "
            "step's 60 s cap) fits 2 of the 3 cases that run, through resnet18-amp_fp16; then resnet18-amp_bf16 would "
            "end at ~500 s.") in summary
    assert "| resnet18-baseline | run | passed |  | 200.0 | — | 1600.0 |" in summary


def test_a_plan_made_afterwards_is_summarized_again_without_running_anything(tmp_path, capsys):
    from trainbench.__main__ import main

    _night(tmp_path, VirtualNight(), simulate=None)  # no --plan: none is made on the GPU's clock
    out = tmp_path / "night"
    assert "No plan was made" in (out / "summary.md").read_text()
    (out / "plan.json").write_text(json.dumps(PLAN))
    assert main(["night", "--out", str(out), "--summarize"]) == 0
    summary = (out / "summary.md").read_text()
    assert "No plan was made" not in summary and "| resnet18-baseline | run | passed | launch-bound" in summary
    assert "| cases | ok |" in summary  # the steps as the night recorded them
    assert main(["night", "--out", str(tmp_path), "--summarize"]) == 2
    assert "night.json: missing or unreadable" in capsys.readouterr().err


def test_a_gpu_nights_sessions_measure_whatever_its_doctor_said_and_a_rehearsals_do_not(tmp_path):
    assert child_environment(tmp_path, None) == {"TRAINBENCH_PREDICTIONS_FILE": str(tmp_path / "predictions.json"),
                                                 "TRAINBENCH_IGNORE_DOCTOR": "1"}
    assert "TRAINBENCH_IGNORE_DOCTOR" not in child_environment(tmp_path, "NVIDIA L40S")


def test_a_night_that_cannot_start_says_why_before_any_step(tmp_path):
    (tmp_path / "file").write_text("")
    refusals = [
        (dict(out=tmp_path / "file"), "--out .*file: not a folder"),
        (dict(budget_s=20), r"--budget-s 20: expected a number of seconds, at least 45"),
        (dict(budget_s=float("nan")), r"--budget-s nan: expected a number of seconds"),
        (dict(budget_s=float("inf")), r"--budget-s inf: expected a number of seconds"),
        (dict(budget_s=39, simulate_gpu="NVIDIA L40S"), r"--budget-s 39: expected a number of seconds, at least 40"),
        (dict(simulate_gpu="NVIDIA L41S"), "--simulate-gpu: .*unknown GPU 'NVIDIA L41S'"),
        (dict(simulate_gpu="NVIDIA L40S", device="cpu"), "--simulate-gpu rehearses a GPU night: not with --device cpu"),
        (dict(device="tpu"), "--device tpu: expected cuda or cpu"),
        (dict(root=tmp_path), "benchmarks/test_recipes.py: not found"),
        (dict(archive=tmp_path / "night.zip"), "--archive .*night.zip: expected a file name ending in .tar.gz"),
        (dict(archive=tmp_path / "n" / "in.tar.gz"), "--archive .*in.tar.gz: inside --out"),
        (dict(plan=tmp_path / "file"), "--plan .*file: not (a plan|readable as JSON).*expected the JSON of python -m "
                                       "trainbench plan"),
        (dict(seconds_from=H200_NIGHT), "--seconds-from: only a rehearsal .--simulate-gpu. makes a plan"),
        (dict(seconds_from=H200_NIGHT, simulate_gpu="NVIDIA L40S"),
         "--seconds-from: .*run.json: measured on NVIDIA H200, not NVIDIA L40S"),
    ]
    for options, refusal in refusals:
        arguments = dict(out=tmp_path / "n", budget_s=600, simulate_gpu=None, root=ROOT) | options
        with pytest.raises(NightError, match=refusal):
            run_night(runner=VirtualNight(), **arguments)
        assert not (tmp_path / "n" / "night.json").exists()
    # an earlier night's folder is never read as tonight's
    _night(tmp_path, VirtualNight(), simulate=None)
    with pytest.raises(NightError, match="holds an earlier night .night.json.; expected a new or empty folder"):
        _night(tmp_path, VirtualNight(), simulate=None)
    assert FINISH_RESERVE_S > MIN_STEP_S
    # The least budget leaves two steps' time to measure in before the finish, and not a second more.
    for simulated in (False, True):
        least = least_budget_s(simulated)
        assert least - finish_reserve(least, simulated) == 2 * MIN_STEP_S
        assert least - 1 - finish_reserve(least - 1, simulated) < 2 * MIN_STEP_S


def test_the_run_kept_is_the_sessions_own_or_else_the_one_saved_after_its_last_case(tmp_path):
    groups = tmp_path / "groups"
    groups.mkdir()
    (groups / "cases.progress.json").write_text(json.dumps(_group_run(["a-baseline"], incomplete=True)))
    (groups / "cases.json").write_text("")  # what --benchmark-json leaves when the session is killed
    assert "1 cases: the run after its last finished case" in keep_run(groups, tmp_path / "run.json")
    assert json.loads((tmp_path / "run.json").read_text())[INCOMPLETE_KEY] is True
    (groups / "cases.json").write_text(json.dumps(_group_run(["a-baseline", "a-amp"])))
    assert keep_run(groups, tmp_path / "run.json") == "2 cases: the session's run"
    for path in groups.iterdir():
        path.unlink()
    with pytest.raises(ValueError, match="saved no run"):
        keep_run(groups, tmp_path / "run.json")


def test_junit_cases_read_outcomes_skip_reasons_and_seconds(tmp_path):
    (tmp_path / "r.xml").write_text(
        '<testsuites><testsuite>'
        '<testcase name="test_recipe[a-baseline]" time="12.5"/>'
        '<testcase name="test_recipe[a-ddp]"><skipped message="needs 2 CUDA devices"/></testcase>'
        '<testcase name="test_recipe[a-amp]"><failure message="budget: min_speedup"/></testcase>'
        '</testsuite></testsuites>')
    assert [(c.case, c.outcome, c.message, c.seconds) for c in junit_cases(tmp_path / "r.xml")] == [
        ("a-baseline", "passed", "", 12.5), ("a-ddp", "skipped", "needs 2 CUDA devices", None),
        ("a-amp", "failed", "budget: min_speedup", None)]


def test_a_step_at_its_deadline_is_interrupted_as_ctrl_c_would_before_it_is_killed(tmp_path):
    """SIGINT first: pytest then reports the failures so far and writes its JUnit XML (a plain SIGTERM kills a
    session that has no handler for it, its report unwritten)."""
    from trainbench.jobs.night_processes import subprocess_runner

    script = ("import sys, time\ntry:\n    time.sleep(60)\nexcept KeyboardInterrupt:\n"
              f"    open({str(tmp_path / 'said')!r}, 'w').write('interrupted')\n    sys.exit(2)\n")
    import signal

    started = time.monotonic()
    # as in the background of a shell script, which starts its jobs with SIGINT ignored
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        outcome = subprocess_runner()([sys.executable, "-c", script], tmp_path / "log", time.monotonic() + 2.0)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert outcome.stopped and outcome.exit_code == 2 and (tmp_path / "said").read_text() == "interrupted"
    assert time.monotonic() - started < 14  # within the grace after SIGINT: no SIGTERM was needed


def test_a_jobs_processes_share_predictions_and_counts_through_one_file(tmp_path, monkeypatch, cpu, profile, mlp):
    from trainbench.core.analyses import predict, roofline
    from trainbench.core.setups.recipes import get_recipe

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


def test_a_session_killed_mid_case_keeps_every_case_it_finished(tmp_path):
    """The cases session saves its run after every case (--trainbench-save-progress): SIGKILL in the middle of a
    case, past any handler's reach, still leaves every case before it on disk, and the night keeps them."""
    import signal

    groups = tmp_path / "groups"
    cases = ["gelu_mlp-baseline", "convnet-baseline", "transformer-baseline", "resnet18-baseline"]
    session = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "--trainbench-device=cpu",
         "--trainbench-no-predict", "--trainbench-no-attribution", "--trainbench-rounds=3",
         "--trainbench-steps-per-round=1", "--trainbench-save-progress", str(groups / "cases.progress.json"),
         "--benchmark-json", str(groups / "cases.json"),
         *[f"benchmarks/test_recipes.py::test_recipe[{case}]" for case in cases]],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while not (groups / "cases.progress.json").exists() and session.poll() is None:
            assert time.monotonic() < deadline, "no case finished in 180 s"
            time.sleep(0.05)
    finally:
        os.killpg(session.pid, signal.SIGKILL)  # the second case is running (or its fixtures closing)
        session.wait()
    note = keep_run(groups, tmp_path / "run.json")
    run = json.loads((tmp_path / "run.json").read_text())
    kept = [b["extra_info"]["case"] for b in run["benchmarks"]]
    assert kept and kept == cases[:len(kept)] and len(kept) < len(cases), note
    assert run[INCOMPLETE_KEY] is True and all(b["extra_info"]["samples_per_s"] > 0 for b in run["benchmarks"])
    assert "the run after its last finished case" in note


def test_a_cpu_night_on_a_bare_box_measures_and_brings_its_archive_home(bare_box, tmp_path):
    out, archive = tmp_path / "night", tmp_path / "home" / "night.tar.gz"
    done = subprocess.run([bare_box, "-m", "trainbench", "night", "--device", "cpu", "--budget-s", "120",
                           "--out", str(out), "--archive", str(archive), "--pytest-arg=-k",
                           "--pytest-arg=gelu_mlp-baseline"],  # the suite's cheapest case: ~3 s, convnet's ~15 s
                          cwd=ROOT, capture_output=True, text=True, timeout=240,
                          env=dict(os.environ, TRAINBENCH_PREDICT_MEMORY="1"))  # the budgets ask for predictions
    members = _archived(archive)
    run = json.loads(members["night/run.json"])
    measured = {b["extra_info"]["case"]: b["extra_info"]["samples_per_s"] for b in run["benchmarks"]}
    assert set(measured) == {"gelu_mlp-baseline"} and min(measured.values()) > 0, done.stdout
    summary = members["night/summary.md"].decode()
    assert summary.startswith("# CPU night:") and "Profile: short (a budget of 120 s" in summary
    assert "| gelu_mlp-baseline | — | passed |" in summary
    steps = {s["name"]: s["status"] for s in json.loads(members["night/night.json"])["steps"]}
    assert steps["cases"] == "ok" and steps["smoke"] == "skipped", (steps, done.stdout[-2000:])
    assert steps["calibrate"] == "skipped"  # no tomlkit on the box: said, not failed
    assert done.stdout.splitlines()[-1].startswith(f"night: archive {archive}")


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
    assert list(steps)[:4] == ["doctor", "plan", "smoke", "cases"] and list(steps)[-1] == "summary"
    # every step ended as the budget allowed, none failed: asv and tomlkit were not needed
    assert {s["status"] for s in manifest["steps"]} <= {"ok", "skipped", "stopped", "not started"}, done.stdout
    assert (out / "summary.md").read_text().startswith("# GPU night: NVIDIA L40S (simulated: nothing measured)")
    assert done.stdout.splitlines()[-1].startswith(("night: complete", "night: PARTIAL"))


def test_a_night_after_an_earlier_one_measures_first_what_that_one_did_not(tmp_path):
    earlier = tmp_path / "earlier-run.json"
    earlier.write_text(json.dumps(_group_run(["resnet18-baseline", "gpt-baseline", "vit-amp_bf16"], incomplete=True)))
    status, manifest, _ = _night(tmp_path, VirtualNight(), simulate=None, after=earlier)
    cases = VirtualNight._case_ids(_cases_argv(tmp_path))
    assert status == 0 and len(cases) == len(set(cases)) == len(all_cases())
    assert cases[-3:] == ["resnet18-baseline", "gpt-baseline", "vit-amp_bf16"]  # last, in the night's own order
    assert cases[0] == "resnet18-amp_fp16" and cases.index("resnet18-compile") < cases.index(
        "resnet18-ladder003-0_baseline") < cases.index("resnet18-baseline")
    assert manifest["after"] == str(earlier) and manifest["measured_before"] == sorted(cases[-3:])
    steps = {s["name"]: s for s in manifest["steps"]}
    assert f"the 3 that {earlier} measured after the 72 it did not" in steps["cases"]["why"]
    assert f"After {earlier}: the 3 cases it measured went last" in (tmp_path / "night" / "summary.md").read_text()


@pytest.mark.parametrize("content, expected", [
    ("{", "invalid JSON"),
    (json.dumps({**_group_run(["resnet18-baseline"]), PLANTED_KEY: {"leak_mib": 1.0}}), "fault planted on purpose"),
    (json.dumps(_group_run([])), "measured no trainbench case"),
])
def test_a_night_refuses_at_start_up_an_after_run_that_is_not_a_nights_own(tmp_path, content, expected):
    earlier = tmp_path / "earlier-run.json"
    earlier.write_text(content)
    virtual = VirtualNight()
    with pytest.raises(NightError, match=expected) as refused:
        run_night(tmp_path / "night", 600.0, None, ROOT, runner=virtual, clock=virtual.clock, after=earlier)
    assert str(refused.value).startswith(f"--after {earlier}") and virtual.started == []


@pytest.mark.parametrize("left", ["plan.json", "groups/05-rest.json", "predictions.json"])
def test_a_night_refuses_an_out_folder_holding_anything_of_another_night(tmp_path, left):
    """A T4 night's plan.json in the folder headed an H100 rehearsal's summary "GPU night: Tesla T4"; an old group run
    was merged into run.json and calibrated; an old predictions file was used."""
    out = tmp_path / "night"
    (out / left).parent.mkdir(parents=True, exist_ok=True)
    (out / left).write_text('{"gpu": {"name": "Tesla T4"}, "cases": []}')
    virtual = VirtualNight()
    with pytest.raises(NightError, match=f"--out {out}: holds .*; expected a new or empty folder") as refused:
        run_night(out, 600.0, "h100-sxm", ROOT, runner=virtual, clock=virtual.clock)
    assert left.split("/")[0] in str(refused.value) and virtual.started == []
    assert not (out / "night.json").exists()


def test_a_shared_prediction_of_other_code_is_never_read_as_this_codes(tmp_path, monkeypatch, cpu, profile):
    """A night's reused --out kept its predictions file: a budget max_predicted_gpu_peak_mib = 10 passed on the old
    figure where the code measured 60.6 MiB. Shared predictions are keyed by the spec's code as well now."""
    import functools
    import importlib.util

    import torch

    from trainbench import TrainingSpec
    from trainbench.core.analyses import predict
    from trainbench.core.setups.recipes import get_recipe

    source = tmp_path / "user_model.py"
    source.write_text("import torch\nfrom torch import nn\n\ndef model():\n    return nn.Linear(8, 8)\n")

    def user_spec():  # as a new process imports it
        module_spec = importlib.util.spec_from_file_location("user_model", source)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        return TrainingSpec(name="user", model=module.model, loss_fn=lambda m, b: m(b).sum(), batch_size=4,
                            optimizer=functools.partial(torch.optim.SGD, lr=0.1),
                            batches=lambda n, gen: torch.randn(n, 8, generator=gen))

    monkeypatch.setenv("TRAINBENCH_PREDICTIONS_FILE", str(tmp_path / "shared.json"))
    calls = []
    real_predict = predict.predict_memory
    monkeypatch.setattr(predict, "predict_memory", lambda *a: calls.append(1) or real_predict(*a))
    config = get_recipe("baseline").config(profile)
    before = predict.PredictionCache(cpu)("cpu", config, user_spec())
    predict.PredictionCache(cpu)("cpu", config, user_spec())  # the same code in another process: read, not made
    assert len(calls) == 1
    source.write_text(source.read_text().replace("nn.Linear(8, 8)", "nn.Sequential(nn.Linear(8, 64), nn.Linear(64, 8))"))
    after = predict.PredictionCache(cpu)("cpu", config, user_spec())
    assert len(calls) == 2 and after["breakdown_bytes"]["total"] > before["breakdown_bytes"]["total"]


@pytest.mark.parametrize("rows, said", [
    ([{"case": "resnet18-baseline", "needed_mib": "lots"}], "cases[0].needed_mib = 'lots': expected a finite number"),
    (["resnet18-baseline"], "cases[0] = 'resnet18-baseline': expected a row with its case id"),
])
def test_a_plan_of_another_shape_is_refused_at_start_up_and_left_out_of_a_summary(tmp_path, rows, said):
    """A measuring night whose plan.json had another shape measured, wrote run.json, then crashed in its summary
    (AttributeError): no summary.md, no verdict line; --summarize over it raised TypeError/KeyError."""
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"gpu": {"name": "NVIDIA H100 80GB HBM3"}, "cases": rows}))
    virtual = VirtualNight()
    with pytest.raises(NightError, match=re.escape(said)):
        run_night(tmp_path / "refused", 600.0, None, ROOT, runner=virtual, clock=virtual.clock, plan=plan)
    assert virtual.started == []
    _night(tmp_path, VirtualNight(), simulate=None)  # a night, then a malformed plan put beside it afterwards
    shutil.copyfile(plan, tmp_path / "night" / "plan.json")
    summarize_again(tmp_path / "night")
    summary = (tmp_path / "night" / "summary.md").read_text()
    assert f"The plan is left out: {tmp_path / 'night' / 'plan.json'}: {said}" in summary
    assert "| resnet18-baseline |" in summary  # the run's own rows stand


@pytest.mark.parametrize("under", ["a_file", "/proc"])
def test_a_night_refuses_an_out_folder_it_cannot_make_in_one_line(tmp_path, under):
    (tmp_path / "a_file").write_text("")
    out = (tmp_path / under if under == "a_file" else Path(under)) / "night"
    virtual = VirtualNight()
    with pytest.raises(NightError, match=f"--out {re.escape(str(out))}: cannot be made or written into"):
        run_night(out, 600.0, None, ROOT, runner=virtual, clock=virtual.clock)
    assert virtual.started == []


@pytest.mark.parametrize("arg", ["--trainbench-device=cpu", "--benchmark-json=elsewhere.json", "--trainbench-rounds=3"])
def test_a_night_refuses_a_pytest_arg_that_sets_what_the_night_sets(tmp_path, arg):
    """A GPU night given --pytest-arg=--trainbench-device=cpu measured the CPU under a "GPU night: this GPU" heading."""
    virtual = VirtualNight()
    with pytest.raises(NightError, match=f"--pytest-arg {re.escape(arg)}: the night sets"):
        run_night(tmp_path / "night", 600.0, None, ROOT, runner=virtual, clock=virtual.clock, pytest_args=(arg,))
    assert virtual.started == []
