"""The ladder report (``python -m trainbench report``) on synthetic pytest-benchmark runs."""

import json
import os

import pytest

from trainbench.__main__ import main
from trainbench.core.setups.ladders import LADDERS
from trainbench.core.records.result import CaseRecord
from trainbench.core.setups.workloads import PROFILES
from trainbench.devices.device import DeviceCaps
from trainbench.verdicts.report import device_slug, ladder_runs, write_ladder_report
from trainbench.verdicts.store import INCOMPLETE_KEY, RunFileError, SavedRun

CPU_DEVICE = {"kind": "cpu", "device": "cpu", "name": "Example CPU 9000", "capability": None, "bf16_supported": True,
              "torch": "2.14.1+cpu", "cpu_model": "Example CPU 9000", "cpu_threads": 2, "cpu_capability": "AVX2",
              "python": "3.12.0"}
# ladder000's "Memory Pinning" needs CUDA: a CPU run has no such benchmark.
MISSING = ("ladder000", 5)


def ladder_benchmark(ladder, rung: int, samples_per_s: float, device: dict) -> dict:
    """One benchmark entry shaped like the plugin's (TrainBench.case and _report)."""
    case = f"resnet18-{ladder.rung_name(rung)}"
    info = {
        "case": case, "workload": "resnet18", "recipe": ladder.rung_name(rung), "profile": "cpu", "batch_size": 16,
        "samples_per_s": samples_per_s, "step_time_ms": 16_000 / samples_per_s, "step_time_iqr_ms": 1.25,
        "round_step_times_s": [16 / samples_per_s] * 3,
        "peak_memory_mib": 100.0 + 10 * rung, "tracked_peak_mib": 100.0 + 10 * rung, "activation_mib": 50.0,
        "device": device,
        "ladder": ladder.rung_info(rung, DeviceCaps.from_identity(device), PROFILES["cpu"]),
    }
    if rung:
        info["speedup_vs_baseline"] = samples_per_s / 100.0
    if rung == 2:  # the GPU profile's memory as trainbench.core.analyses.predict records it (batch 128 at 224 px)
        info["predicted_memory"] = {"profile": "gpu", "device": "cpu", "batch_size": 128,
                                    "breakdown_bytes": {"total": 3_210_000_000, "activations": 2_600_000_000}}
    if rung == 1:
        info["predicted_memory"] = {"profile": "gpu", "reason": "compiled code ..."}
    return {"name": f"test_ladder[{case}]", "fullname": f"benchmarks/test_recipes.py::test_ladder[{case}]",
            "group": ladder.name, "stats": {"median": 1.0}, "extra_info": info}


def synthetic_run(missing=(MISSING,), device=CPU_DEVICE) -> dict:
    """Both ladders, rung i at 100 * (1 + i/2) samples/s (rung 2 = 2x rung 0), ``missing`` rungs left out."""
    benchmarks = [ladder_benchmark(ladder, i, 100.0 * (1 + i / 2), device)
                  for ladder in LADDERS.values() for i in range(len(ladder.steps)) if (ladder.name, i) not in missing]
    return {"machine_info": {"node": "box", "trainbench": device},
            "commit_info": {"id": "0123456789abcdef0123", "branch": "main", "dirty": False},
            "datetime": "2025-01-02T03:04:05.000000+00:00", "version": "5.1.0", "benchmarks": benchmarks}


@pytest.fixture
def run_file(tmp_path):
    path = tmp_path / "0001_run.json"
    path.write_text(json.dumps(synthetic_run()))
    return path


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """The report of the synthetic run, rendered once (figures included) for the tests that only read it."""
    folder = tmp_path_factory.mktemp("report")
    run = folder / "0001_run.json"
    run.write_text(json.dumps(synthetic_run()))
    out = folder / "report"
    written = write_ladder_report(run, out)
    return out, written, (out / "ladders.md").read_text()


def table_row(markdown: str, label: str) -> list[str]:
    rows = [line for line in markdown.splitlines() if line.startswith(f"| {label} |")]
    assert len(rows) == 1, rows
    return [cell.strip() for cell in rows[0].strip("|").split(" | ")]


def test_writes_markdown_and_one_png_per_ladder(report):
    out, written, _ = report
    assert sorted(p.name for p in written) == ["ladder000.png", "ladder003.png", "ladders.md"]
    for name in ("ladder000.png", "ladder003.png"):
        assert (out / name).read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]


def test_caption_names_device_torch_profile_run_and_commit(report):
    _, _, md = report
    caption = next(line for line in md.splitlines() if line.startswith("Device:"))
    for part in ("Example CPU 9000", "cpu", "2 CPU threads", "torch 2.14.1+cpu", "Profile: cpu", "2025-01-02T03:04:05",
                 "0123456789ab"):
        assert part in caption


def test_table_rows_show_this_machine_next_to_the_article(report):
    _, _, md = report
    assert "| Optimization | Batch | Peak memory (MiB) | Step time ms (median ± IQR) | Samples/s | Rel. to base |" in md
    base = table_row(md, "0. Base_Model")
    assert base[1:6] == ["16", "100.0", "160.0 ± 1.2", "100.0", "1.00x"]
    assert base[6:8] == ["—", "—"]  # no prediction recorded
    assert base[8:13] == ["32", "2.51", "117.1", "273.5", "1.00x"]
    # rung 2 runs at 2x rung 0's samples/s; its predicted GPU tensor peak sits next to the article's memory
    bigger = table_row(md, "2. Increase Batch Size")
    assert bigger[5] == "2.00x"
    assert bigger[6:13] == ["128", "3.21", "128", "4.95", "232.1", "551.5", "2.02x"]
    assert table_row(md, "1. Automatic Mixed Precision")[6:8] == ["—", "not predicted"]


def test_missing_rung_says_why_and_keeps_the_article_figures(report):
    _, _, md = report
    pinning = table_row(md, "5. Memory Pinning")
    assert pinning[1] == "not run on this device (needs a CUDA device; this run uses cpu (Example CPU 9000))"
    assert pinning[2:6] == ["", "", "", ""]
    assert pinning[11:13] == ["1381.6", "5.05x"]  # 505% of the article's baseline


def test_article_rungs_without_figures_show_a_dash_and_the_note(report):
    _, _, md = report
    set_to_none = table_row(md, "5. set_to_none")
    assert set_to_none[11:14] == ["—", "—", "no meaningful change"]


def test_summary_line_compares_this_machine_with_the_article(report):
    _, _, md = report
    summary = [line for line in md.splitlines() if line.startswith("**This machine:**")]
    assert len(summary) == 2
    # ladder000 tops out at rung 4 here: 300 samples/s, 3x
    ladder000 = next(line for line in summary if "Base_Model" in line)
    assert "3.00x / +200% (100.0 and 300.0 samples/s)" in ladder000
    assert "273.5 -> 1381.6 samples/s: 505% of the baseline (+405%)" in ladder000
    assert "![ladder000: " in md and "](ladder000.png)" in md


def test_slow_and_gpu_rungs_get_their_reasons(tmp_path):
    ladder003 = LADDERS["ladder003"]
    missing = {("ladder003", i) for i, s in enumerate(ladder003.steps) if s.recipe.slow or s.recipe.requires.cuda}
    assert missing, "ladder003 should have a GPU-only and a slow rung"
    lr = next(lr for lr in ladder_runs(SavedRun("run", synthetic_run(missing))) if lr.ladder.name == "ladder003")
    reasons = {r.step.label: r.not_run_reason for r in lr.rungs if r.measured is None}
    assert reasons == {"pinned memory": "needs a CUDA device; this run uses cpu (Example CPU 9000)",
                       "torch.compile": "slow case: run with --trainbench-slow"}


def test_a_rung_missing_from_a_stopped_run_was_not_reached_unless_the_device_cannot_run_it(tmp_path):
    ladder003 = LADDERS["ladder003"]
    missing = {("ladder003", i) for i, s in enumerate(ladder003.steps) if s.recipe.slow or s.recipe.requires.cuda}
    stopped = {**synthetic_run(missing), INCOMPLETE_KEY: True}  # e.g. a night's session stopped at its deadline
    lr = next(lr for lr in ladder_runs(SavedRun("run", stopped)) if lr.ladder.name == "ladder003")
    reasons = {r.step.label: r.not_run_reason for r in lr.rungs if r.measured is None}
    assert reasons == {"pinned memory": "needs a CUDA device; this run uses cpu (Example CPU 9000)",
                       "torch.compile": "not reached: the run was stopped before it"}


def test_gpu_caption_names_cuda_and_cudnn(tmp_path):
    gpu = dict(CPU_DEVICE, kind="cuda", name="NVIDIA H100 80GB HBM3", capability=[9, 0], cuda="12.8", cudnn=91000,
               driver="570.86", gpu_count=1, cpu_model="Example CPU 9000")
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(synthetic_run(missing=(), device=gpu)))
    md = (write_ladder_report(path, tmp_path / "out")[0]).read_text()
    assert "Device: NVIDIA H100 80GB HBM3 (cuda, sm 9.0, 1 GPU, driver 570.86" in md
    assert "torch 2.14.1+cpu, CUDA 12.8, cuDNN 91000" in md
    assert "not run on this device" not in md


def test_device_slug_is_short_and_filesystem_safe():
    slug = device_slug({"kind": "cpu", "name": "Intel(R) Xeon(R) Platinum 8370C CPU @ 2.80GHz"})
    assert slug == "cpu-intel-xeon-platinum-8370c"
    assert device_slug({"kind": "cuda", "name": "NVIDIA H100 80GB HBM3"}) == "cuda-nvidia-h100-80gb-hbm3"
    long = device_slug({"kind": "cpu", "name": "x/" * 100})
    assert len(long) <= 48 and "/" not in long


def test_cli_report_writes_and_prints_paths(run_file, tmp_path, capsys):
    out = tmp_path / "cli"
    assert main(["report", str(run_file), "--out", str(out)]) == 0
    printed = capsys.readouterr().out.split()
    assert printed == [str(out / "ladders.md")] + [str(out / f"{name}.png") for name in LADDERS]


def test_cli_defaults_to_the_newest_saved_run_of_this_machine(run_file, tmp_path, monkeypatch, capsys):
    from pytest_benchmark.utils import get_machine_id

    other = tmp_path / "results" / "benchmarks" / "Another-Machine-64bit" / "0009_ladders.json"
    other.parent.mkdir(parents=True)
    other.write_text(run_file.read_text())  # another machine's, numbered higher: never taken for this one's
    monkeypatch.chdir(tmp_path)
    assert main(["report"]) == 2
    assert "no run saved on this machine" in capsys.readouterr().err
    saved = tmp_path / "results" / "benchmarks" / get_machine_id()
    saved.mkdir(parents=True)
    older = saved / "0001_old.json"
    older.write_text("not json")  # would fail if it were picked
    os.utime(older, (1, 1))
    (saved / "0002_new.json").write_text(run_file.read_text())
    monkeypatch.chdir(tmp_path)
    assert main(["report"]) == 0
    assert (tmp_path / "results" / "report" / "cpu-example-9000" / "ladders.md").is_file()


@pytest.mark.parametrize("content, problem", [
    (None, "no such file"),
    ("{not json", "invalid JSON"),
    ('{"machine_info": {}}', "no 'benchmarks' list"),
    (json.dumps({"benchmarks": [{"name": "test_recipe[resnet18-baseline]", "extra_info": {"case": "resnet18-baseline"}}]}),
     "no ladder cases"),
])
def test_cli_bad_input_exits_2_naming_the_file(tmp_path, capsys, content, problem):
    path = tmp_path / "run.json"
    if content is not None:
        path.write_text(content)
    assert main(["report", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"trainbench report: {path}: ") and problem in err
    assert "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_no_saved_runs_is_a_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["report"]) == 2
    assert "results/benchmarks: no *.json run found" in capsys.readouterr().err


def test_load_errors_are_report_errors(tmp_path):
    with pytest.raises(RunFileError, match="no such file"):
        write_ladder_report(tmp_path / "absent.json", tmp_path)


def test_rel_to_base_prefers_the_interleaved_speed_up_over_a_ratio_of_two_runs():
    from trainbench.core.records.result import CaseRecord
    from trainbench.verdicts.report import LadderRun, RungResult

    def record(**info):  # rounds that give its throughput: a record whose throughput disagrees with them is refused
        rounds = [16 / info["samples_per_s"]]
        return CaseRecord.read({"case": "c", "samples_per_step": 16, "round_step_times_s": rounds, **info}, "c")

    ladder = LADDERS["ladder000"]
    rungs = [RungResult(0, ladder.steps[0], record(samples_per_s=100.0)),
             RungResult(1, ladder.steps[1], record(samples_per_s=150.0, speedup_vs_baseline=1.2)),
             RungResult(2, ladder.steps[2], record(samples_per_s=300.0))]
    lr = LadderRun(ladder, rungs)
    assert lr.relative(0) == 1.0
    assert lr.relative(1) == 1.2  # paired with rung 0, not 150 / 100
    assert lr.relative(2) == 3.0  # no paired figure: the ratio of the two runs


def test_the_session_summary_has_a_line_per_case_with_its_marks():
    from trainbench.verdicts.present import summary_table

    metrics = {"samples_per_s": 16 / 0.01296, "step_time_ms": 12.96, "step_time_iqr_ms": 0.44, "peak_memory_mib": 10.0,
               "activation_mib": 2.5, "predicted_gpu_peak_mib": 300.4, "gflops_per_sample": 0.0189,
               "round_step_times_s": [0.01296]}  # not a metric: the rounds the timed ones were measured in
    checks = [{"ok": True, "inconclusive": None}]
    rows = [CaseRecord.read({"case": "mlp-baseline", "samples_per_step": 16, **metrics,
                             "budget": {"status": "pass", "checks": checks}}, "base"),
            CaseRecord.read({"case": "mlp-set_to_none", "samples_per_step": 16, **metrics, "predicted_gpu_peak_mib": None,
                             "speedup_vs_baseline": 1.234, "paired": False,
                             "predicted_memory": {"check": {"matches": False}},
                             "budget": {"status": "none", "required": True}}, "other")]
    header, rule, base, other = summary_table(rows)
    assert header.startswith("case ") and header.endswith("vs base  budget") and set(rule) == {"-", " "}
    assert base.index("1234.6") + len("1234.6") == header.index("samples/s") + len("samples/s")  # figures align right
    assert base.split() == ["mlp-baseline", "1234.6", "13.0", "(0.4)", "10.0", "2.5", "300", "0.0189", "-", "ok", "1"]
    assert other.split() == ["mlp-set_to_none", "1234.6", "13.0", "(0.4)", "10.0", "2.5", "-!", "0.0189", "1.23x~",
                             "FAIL"]
