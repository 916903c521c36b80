"""The GPU night planned for every GPU of the fleet on the CPU: what must run, what must skip and why.

The plan is the runner's own (``Runner.plan_case`` on a ``SimulatedGpu``); only the memory
predictions are stood in for (a prediction at the GPU profile's sizes takes seconds), except in
the test that checks the real one for the case known to outgrow an 80 GB card.
"""

import json
from pathlib import Path

import pytest

from trainbench.core.setups.cases import all_cases
from trainbench.core.analyses.plan import ALONE, BASELINE_AFTER, FRESH_PROCESSES, PAIRED
from trainbench.core.analyses.predict import PredictionCache
from trainbench.core.setups.eligibility import HEADROOM
from trainbench.core.analyses.roofline import StepCounts
from trainbench.devices.fleet import FLEET, H100_SXM, T4, find_gpu
from trainbench.devices.simulated import NothingRunsHere, SimulatedGpu, prediction_backend
from trainbench.jobs.night_plan import format_night, plan_night, plan_record, planned_peak_mib

ROOT = Path(__file__).parents[1]

BUDGETS = Path(__file__).parent.parent / "benchmarks" / "budgets.toml"
MiB, GiB = 2**20, 2**30
GPT_LARGER_BATCH_MIB = 155_000  # the GPU profile's predicted tensor peak of gpt-larger_batch


@pytest.fixture(scope="module", autouse=True)
def _shared_predictions(tmp_path_factory):
    """The doctors here predict the same built-in GPU-profile setups: one predictions file shares them between
    runs, as it does between a night's steps (``predict.SharedPredictions``)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRAINBENCH_PREDICTIONS_FILE", str(tmp_path_factory.mktemp("fleet") / "predictions.json"))
        yield


class StandInPredictions:
    """1 GiB for every setup but GPT at 16x its batch in one step (gpt-larger_batch), at its figure; the NVTX case
    cannot be faked on a CPU (as the real prediction says)."""

    def __init__(self):
        self.asked = 0

    def __call__(self, profile_name, config, spec):
        self.asked += 1
        if config.debug == "emit_nvtx":
            return {"reason": "FakeTensorMode could not run the step: RuntimeError: Found no NVIDIA driver"}
        big = spec.name == "gpt" and config.batch_multiplier == 16 and config.accumulation_steps == 1
        return {"breakdown_bytes": {"total": (GPT_LARGER_BATCH_MIB * MiB) if big else GiB}}


class StandInCounts:
    """A step's counts without a fake step (one takes seconds at the GPU profile's sizes): 1 TFLOP and 1 GB a step in
    1,000 launches; under autocast the same FLOPs, half the bytes and 1,200 launches (its casts). Every GPU then draws
    the same bound kind for a case and its baseline; the transformer's are launch-bound (20,000 launches)."""

    def __call__(self, profile_name, config, spec):
        launches = 20_000 if spec.name == "transformer" else 1_000
        return StepCounts(flops=10**12, convolution_flops=0, bytes_moved=10**9 // (2 if config.amp else 1),
                          launches=int(launches * (1.2 if config.amp else 1)), samples=spec.batch_size)


@pytest.fixture(scope="module")
def nights():
    predictions, counts = StandInPredictions(), StandInCounts()
    return {key: plan_night(gpu, BUDGETS, predictions, counts=counts) for key, gpu in FLEET.items()}


def _by_case(night):
    return {c.case: c for c in night.cases}


# Every GPU skips the two CPU-only cases (ddp_gloo, fsdp_gloo) and gpt-larger_batch with gpt-grad_accumulation (its
# baseline) for memory; one GPU also DDP and FSDP; the T4 also its four bf16 recipes and both fused SDPA kernels.
# What a GPU runs is the suite (its table, all_cases) less these: a recipe added to the suite changes no count here.
_EVERY_GPU_SKIPS = {"transformer-ddp_gloo", "transformer-fsdp_gloo", "gpt-larger_batch", "gpt-grad_accumulation"}
_ONE_GPU_SKIPS = _EVERY_GPU_SKIPS | {"resnet18-ddp", "resnet18-fsdp"}
SKIPS = {**{key: _ONE_GPU_SKIPS for key in ("h100-sxm", "h100-pcie", "a100-40gb", "a100-80gb", "l4", "l40s", "a10g",
                                            "rtx4090", "h200", "b200")},
         "t4": _ONE_GPU_SKIPS | {"gpt-amp_bf16", "resnet18-amp_bf16", "transformer-amp_bf16", "vit-amp_bf16",
                                 "gpt-sdpa_efficient", "gpt-sdpa_flash"},
         "2xh100-sxm": _EVERY_GPU_SKIPS, "8xh100-sxm": _EVERY_GPU_SKIPS}
RUNS = {key: len(all_cases()) - len(skipped) for key, skipped in SKIPS.items()}


def test_every_fleet_member_but_the_v100_plans_every_case_without_a_problem(nights):
    for key, night in nights.items():
        if key == "v100-16gb":
            continue
        assert night.ok, f"{key}: " + "\n".join(format_night(night))
        assert len(night.cases) == len(all_cases())
    counts = {key: len(night.runs) for key, night in nights.items() if key != "v100-16gb"}
    assert counts == RUNS
    assert {key: {c.case for c in nights[key].skips} for key in SKIPS} == SKIPS
    for key in RUNS:
        for case in ("transformer-ddp_gloo", "transformer-fsdp_gloo"):
            assert "runs on the CPU only" in _by_case(nights[key])[case].skipped


def test_the_v100_is_refused_by_the_default_wheel_with_the_readme_advice(nights):
    night = nights["v100-16gb"]
    assert night.refused and not night.cases and not night.ok
    (fail,) = [c for c in night.checks if c.status == "FAIL"]
    assert "none that runs on sm_70" in fail.message and "whl/cu126" in fail.message
    assert 'docs/ci-and-gpu.md, "A GPU runner"' in fail.message
    with pytest.raises(RuntimeError, match="none that runs on sm_70"):
        SimulatedGpu(FLEET["v100-16gb"])
    # a CUDA 12.6 build carries sm_70: the same GPU plans
    assert plan_night(FLEET["v100-16gb"], BUDGETS, StandInPredictions(), arch_list=["sm_50", "sm_70", "sm_90"],
                      counts=StandInCounts()).ok


def test_bf16_recipes_are_skipped_on_the_t4_with_the_reason(nights):
    t4 = _by_case(nights["t4"])
    for case in ("resnet18-amp_bf16", "transformer-amp_bf16", "gpt-amp_bf16", "vit-amp_bf16"):
        assert t4[case].skipped.endswith("needs bfloat16 support; Tesla T4 has none"), t4[case].skipped
        assert _by_case(nights["a100-40gb"])[case].skipped is None
    assert t4["resnet18-amp_fp16"].skipped is None


def test_ddp_and_fsdp_need_two_gpus(nights):
    for case in ("resnet18-ddp", "resnet18-fsdp"):
        assert "needs 2 GPUs; 1 present" in _by_case(nights["h100-sxm"])[case].skipped
        planned = _by_case(nights["2xh100-sxm"])[case]
        assert planned.skipped is None and planned.measuring in (BASELINE_AFTER, ALONE)
    two, eight = SimulatedGpu(FLEET["2xh100-sxm"], index=1), SimulatedGpu(FLEET["8xh100-sxm"], index=6)
    assert two.parallel_device_ids(2) == [1, 0] and two.rank_device_spec(1) == "cuda:0"
    assert eight.parallel_device_ids(4) == [6, 7, 0, 1] and eight.ddp_device_ids() == [6]
    with pytest.raises(RuntimeError, match="2 GPUs needed, 1 present"):
        SimulatedGpu(H100_SXM).parallel_device_ids(2)


def test_gpt_larger_batch_is_skipped_for_memory_on_an_80_gb_card_with_its_figure(nights):
    for key in ("h100-sxm", "h100-pcie", "a100-40gb", "l4", "t4"):
        planned = _by_case(nights[key])
        assert "needs ~189.2 GiB" in planned["gpt-larger_batch"].skipped
        assert planned["gpt-grad_accumulation"].skipped.startswith("larger_batch: needs ~189.2 GiB")  # its baseline
    assert "NVIDIA H100 80GB HBM3 has 79.1 GiB" in _by_case(nights["h100-sxm"])["gpt-larger_batch"].skipped


def test_a_planned_case_carries_its_own_peak_beside_what_it_and_its_baseline_need(nights):
    # gpt-grad_accumulation's baseline is gpt-larger_batch: it needs the baseline's memory, its own peak is 1 GiB
    case = _by_case(nights["b200"])["gpt-grad_accumulation"]
    assert case.peak_bytes == GiB and case.needed_bytes == int(GPT_LARGER_BATCH_MIB * MiB * HEADROOM)
    row = next(r for r in plan_record(nights["b200"])["cases"] if r["case"] == "gpt-grad_accumulation")
    assert planned_peak_mib(row) == 1024.0 and row["needed_mib"] > 100 * 1024


def test_budget_sections_and_how_each_case_is_measured(nights):
    h100 = _by_case(nights["h100-sxm"])
    assert h100["resnet18-cudnn_benchmark"].measuring == FRESH_PROCESSES
    assert "cuDNN's plan cache" in h100["resnet18-cudnn_benchmark"].why_measuring
    assert h100["resnet18-deterministic"].measuring == FRESH_PROCESSES
    assert {c.measuring for c in nights["h100-sxm"].runs} >= {PAIRED, FRESH_PROCESSES}
    sections = {c.section for c in nights["h100-sxm"].runs if c.section}
    assert sections and sections <= {"NVIDIA H100 80GB HBM3", "sm_90", "cuda"}
    assert "sm_75" not in sections
    t4 = _by_case(nights["t4"])
    assert t4["gpt-sdpa_flash"].skipped == "sdpa_flash: needs compute capability >= 8.0; Tesla T4 has 7.5"
    assert h100["gpt-amp_bf16"].mfu_peaks == (("bf16", 989.4),)
    assert h100["gpt-baseline"].mfu_peaks == (("fp32", 67.0), ("tf32", 494.7))  # by its share of convolutions
    assert _by_case(nights["t4"])["resnet18-amp_fp16"].mfu_peaks == (("fp16", 65.0),)
    assert _by_case(nights["t4"])["resnet18-baseline"].mfu_peaks == (("fp32", 8.1),)  # no TF32 before sm_80
    memory = [line for line in format_night(nights["h100-sxm"]) if line.startswith("memory:")]
    assert memory == ["memory: the largest case that runs, resnet18-baseline, needs ~1.2 GiB of 79.1 GiB; cases that "
                      "would not fit are skipped with their figures (python -m trainbench plan lists every case)"]
    nvtx = h100["resnet18-emit_nvtx"]  # a prediction that fails here lets the case run, as the memory gate does
    assert nvtx.skipped is None and nvtx.problem is None and "no NVIDIA driver" in nvtx.unpredicted


def test_the_simulated_gpu_answers_what_the_driver_would_and_times_nothing():
    gpu = SimulatedGpu(find_gpu("NVIDIA H100 80GB HBM3"))
    caps = gpu.caps()
    assert (caps.kind, caps.cuda, caps.capability, caps.gpu_count, caps.bf16) == ("cuda", True, (9, 0), 1, True)
    assert gpu.budget_keys() == ["NVIDIA H100 80GB HBM3", "sm_90", "cuda"]
    assert gpu.mfu_peak("bf16") == ("bf16", 989.4)
    # torch's defaults: matmuls in fp32, cuDNN convolutions in TF32
    assert gpu.mfu_peak(None) == ("fp32", 67.0) and gpu.mfu_peak(None, convolution_share=0.9) == ("tf32", 494.7)
    assert SimulatedGpu(T4).mfu_peak(None) == ("fp32", 8.1)
    identity = gpu.identity()
    assert identity["device"] == "cuda:0" and identity["simulated"] and identity["multiprocessors"] == 132
    with pytest.raises(NothingRunsHere, match="nothing runs or is timed"):
        gpu.timer()
    with pytest.raises(NothingRunsHere):
        gpu.peak_memory()
    assert find_gpu("8xNVIDIA H100 80GB HBM3").count == 8
    with pytest.raises(KeyError, match="the fleet"):
        find_gpu("NVIDIA B300")


def test_the_real_prediction_skips_gpt_larger_batch_on_an_h100():
    # the one real prediction at the GPU profile's sizes (a few seconds): the stand-in's figure is the real one
    from trainbench.core.method.measure import DEFAULT_SETTINGS
    from trainbench.core.method.runner import Runner
    from trainbench.core.setups.workloads import PROFILES

    (case,) = [c for c in all_cases() if c.id == "gpt-larger_batch"]
    runner = Runner(SimulatedGpu(H100_SXM), PROFILES["gpu"], DEFAULT_SETTINGS["gpu"],
                    predictions=PredictionCache(prediction_backend()))
    plan = runner.plan_case(case)
    assert "NVIDIA H100 80GB HBM3 has 79.1 GiB" in plan.skipped
    needed = float(plan.skipped.split("needs ~")[1].split(" GiB")[0])
    assert needed == pytest.approx(GPT_LARGER_BATCH_MIB * 1.25 / 1024, rel=0.05)


def test_the_doctor_checks_a_fleet_gpu_as_on_it_without_its_case_list(tmp_path, capsys):
    from trainbench import __main__ as cli

    assert cli.main(["doctor", "--simulate-gpu", "NVIDIA H100 80GB HBM3", "--json", str(tmp_path / "d.json")]) == 0
    out = capsys.readouterr().out
    assert not any(line.startswith(("run ", "skip ")) for line in out.splitlines())
    assert "doctor of 1 x NVIDIA H100 80GB HBM3" in out and "gpu0_memory: NVIDIA H100 80GB HBM3 has 80,998 MiB" in out
    checks = json.loads((tmp_path / "d.json").read_text())
    assert {"cuda", "gpu0_arch", "gpu0_memory"} <= {check["name"] for check in checks}
    assert cli.main(["doctor", "--simulate-gpu", "v100-16gb"]) == 1  # refused by the default wheel
    assert "FAIL" in capsys.readouterr().out


def test_the_roofline_says_what_bounds_each_case_and_flags_a_speedup_it_rules_out(nights):
    h100 = _by_case(nights["h100-sxm"])
    # 1 TFLOP at fp32's 67 TFLOP/s, over 1,000 launches' 5 ms and 1 GB's 0.3 ms
    assert h100["resnet18-baseline"].roofline == "compute-bound, >= 14.9 ms/step"
    assert h100["resnet18-amp_fp16"].roofline == "launch-bound, >= 6.0 ms/step"  # fp16's peak, 1,200 launches
    assert h100["resnet18-amp_fp16"].speedup_flag is None  # 14.9 / 6.0: 2.5x allowed, 1.2 asked
    # the transformer: both launch-bound, AMP's casts add launches; its min_speedup 1.2 cannot hold
    flag = h100["transformer-amp_fp16"].speedup_flag
    assert flag.startswith("min_speedup 1.2 cannot hold by the roofline: both launch-bound") and "~0.83x" in flag
    lines = format_night(nights["h100-sxm"])
    assert f"flag  transformer-amp_fp16: {flag}" in lines
    assert any(line.startswith("run   resnet18-amp_fp16: ") and line.endswith("; launch-bound, >= 6.0 ms/step")
               for line in lines)
    assert "min_speedup budget(s) the roofline says cannot hold" in lines[-1]
    # a slower GPU moves the bound: the T4's fp32 peak (8.1 TFLOP/s)
    assert _by_case(nights["t4"])["resnet18-baseline"].roofline == "compute-bound, >= 123 ms/step"


def test_any_gpu_by_name_or_explicit_spec_is_planned():
    from trainbench.devices.fleet import GpuSpecError, parse_gpu

    for name, sm, sms in (("NVIDIA L40S", (8, 9), 142), ("NVIDIA A10G", (8, 6), 80), ("NVIDIA GeForce RTX 4090", (8, 9), 128),
                          ("NVIDIA A100-SXM4-80GB", (8, 0), 108), ("NVIDIA B200", (10, 0), 148)):
        gpu = parse_gpu(name)
        assert (gpu.name, gpu.capability, gpu.multiprocessors) == (name, sm, sms)
        assert gpu.bandwidth_gbs and gpu.peak_tflops("bf16") and gpu.peak_tflops("fp32")
    assert parse_gpu("NVIDIA A10G").peak_tflops("bf16") == 70.0  # not the A10's 125
    spec = parse_gpu("name=My GPU,memory_gib=48,capability=8.9,sms=142,bf16=1,count=2,bandwidth_gbs=864,"
                     "tflops_bf16=362,tflops_fp32=91,tflops_tf32=181,tflops_fp16=362")
    assert (spec.name, spec.count, spec.memory_bytes, spec.capability, spec.bf16) == ("My GPU", 2, 48 * GiB, (8, 9), True)
    assert SimulatedGpu(spec).mfu_peak("bf16") == ("bf16", 362.0) and SimulatedGpu(spec).memory_bandwidth_gbs() == 864
    # its own peaks answer before the name table's: an "H100" with other figures
    assert parse_gpu("name=NVIDIA H100 80GB HBM3,memory_gib=80,capability=9.0,sms=132,tflops_bf16=500").peak_tflops(
        "bf16") == 500.0
    assert parse_gpu("name=Old,memory_gib=16,capability=7.0,sms=80").bf16 is False  # default: bf16 from sm_80
    for bad, said in (("name=X,memory_gib=big,capability=8.9,sms=1", "memory_gib='big': expected GiB > 0"),
                      ("name=X,memory_gib=8,capability=89,sms=1", "capability='89': expected MAJOR.MINOR"),
                      ("name=X,memory_gib=8,capability=8.9", "sms missing: expected a whole number > 0"),
                      ("name=X,memory_gib=8,capability=8.9,sms=1,speed=9", "'speed=9' is not a field"),
                      ("name=X,memory_gib=8,capability=8.9,sms=1,count=0", "count='0': expected a whole number > 0"),
                      ("NVIDIA B300", "unknown GPU 'NVIDIA B300'"),
                      # what the options' property test found: a machine of no GPU, a count int() cannot read, a
                      # size 0 bytes or past a float (OverflowError)
                      ("0xl4", "'0xl4': a machine has 1 or more GPUs, got 0"), ("²xl4", "unknown GPU '²xl4'"),
                      ("name=X,memory_gib=1e-300,capability=8.9,sms=1", "memory_gib='1e-300': expected GiB > 0, from 1 "
                                                                        "byte to under 2**63 bytes"),
                      ("name=X,memory_gib=1e308,capability=8.9,sms=1", "memory_gib='1e308': expected GiB > 0")):
        with pytest.raises(GpuSpecError) as raised:
            parse_gpu(bad)
        assert said in str(raised.value) and "\n" not in str(raised.value)


def test_plan_and_doctor_accept_any_gpu_and_refuse_a_bad_spec_with_one_line(monkeypatch, capsys):
    from trainbench import __main__ as cli
    from trainbench.jobs import night_plan

    real = night_plan.plan_night
    monkeypatch.setattr(night_plan, "plan_night", lambda gpu, budgets, **_: real(
        gpu, budgets, StandInPredictions(), counts=StandInCounts()))
    assert cli.main(["doctor", "--simulate-gpu", "NVIDIA L40S"]) == 0
    assert "doctor of 1 x NVIDIA L40S (sm_89, 44.4 GiB), simulated" in capsys.readouterr().out
    spec = "name=My GPU,memory_gib=48,capability=8.9,sms=142,bf16=1,count=2,bandwidth_gbs=864,tflops_bf16=362,tflops_fp32=91"
    assert cli.main(["plan", "--simulate-gpu", spec]) == 0
    out = capsys.readouterr().out
    assert "night plan for 2 x My GPU" in out and "run   resnet18-ddp: " in out and "-bound, >= " in out
    assert cli.main(["plan", "--simulate-gpu", "name=My GPU,memory_gib=48,capability=89,sms=1"]) == 2
    err = capsys.readouterr().err
    assert err == "trainbench plan: --simulate-gpu: GPU spec: capability='89': expected MAJOR.MINOR, e.g. 8.9\n"


def test_plan_refuses_a_missing_budgets_file_or_an_unwritable_json_before_planning(monkeypatch, capsys, tmp_path):
    from trainbench import __main__ as cli
    from trainbench.jobs import night_plan

    planned = []
    real = night_plan.plan_night
    monkeypatch.setattr(night_plan, "plan_night", lambda gpu, budgets, **_: planned.append(gpu) or real(
        gpu, budgets, StandInPredictions(), counts=StandInCounts()))
    missing = tmp_path / "missing.toml"
    assert cli.main(["plan", "--simulate-gpu", "NVIDIA L4", "--budgets", str(missing)]) == 2
    assert capsys.readouterr().err == f"trainbench plan: --budgets: {missing}: budgets file not found\n"
    (tmp_path / "a_file").write_text("")
    assert cli.main(["plan", "--simulate-gpu", "NVIDIA L4", "--json", str(tmp_path / "a_file" / "plan.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"trainbench plan: --json {tmp_path / 'a_file' / 'plan.json'}: cannot write into ")
    assert err.count("\n") == 1 and len(planned) == 1  # the JSON's folder is refused before any case is planned
    assert cli.main(["plan", "--simulate-gpu", "NVIDIA L4", "--json", str(tmp_path)]) == 2  # a folder: 76 s of work lost
    assert capsys.readouterr().err == f"trainbench plan: --json {tmp_path}: is a folder; expected a file path\n"
    assert len(planned) == 1
    h200 = ROOT / "results" / "gpu-night" / "nvidia-h200-2026-11-28" / "run.json"
    assert cli.main(["plan", "--simulate-gpu", "NVIDIA L4", "--seconds-from", str(h200)]) == 2
    assert capsys.readouterr().err == (f"trainbench plan: --seconds-from: {h200}: measured on NVIDIA H200, not NVIDIA "
                                       "L4; expected a run of the GPU planned for\n")
    assert len(planned) == 1  # refused before planning
    planted = json.loads(h200.read_text()) | {"trainbench_planted_fault": {"slowdown": 0.1}}
    (tmp_path / "planted.json").write_text(json.dumps(planted))
    assert cli.main(["plan", "--simulate-gpu", "NVIDIA H200", "--seconds-from", str(tmp_path / "planted.json")]) == 2
    assert "measured with a fault planted on purpose ({'slowdown': 0.1})" in capsys.readouterr().err
    assert len(planned) == 1


def _seconds_run(costs: dict[str, dict], folder: str = "night") -> "SavedRun":
    from trainbench.verdicts.store import SavedRun

    device = {"kind": "cuda", "name": "NVIDIA H200"}
    return SavedRun(f"{folder}/run.json", {"machine_info": {"trainbench": device}, "benchmarks": [
        {"name": f"test_recipe[{case}]", "fullname": f"benchmarks/test_recipes.py::test_recipe[{case}]", "stats": {},
         "extra_info": {"case": case, "samples_per_step": 32, "samples_per_s": 1600.0, "step_time_ms": 20.0,
                        "round_step_times_s": [0.02] * 3, "phase_seconds": phases, "device": device}}
        for case, phases in costs.items()]})


def test_a_plans_seconds_come_from_an_earlier_night_of_the_gpu(tmp_path):
    from trainbench.jobs.night_plan import PASS_STEPS, PlannedCase, predict_seconds

    run = _seconds_run({"resnet18-baseline": {"rounds": 2.0, "total": 9.0},  # 7 s beside its rounds
                        "resnet18-amp_bf16": {"rounds": 1.0, "baseline rounds": 1.0, "total": 5.0},  # 3 s beside
                        "resnet18-set_to_none": {"rounds": 1.0, "total": 4.0}})  # 3 s beside
    cases = [PlannedCase("resnet18-baseline", measuring="alone", bound_s=0.005),
             PlannedCase("resnet18-channels_last", measuring="alone", bound_s=0.005),
             PlannedCase("resnet18-amp_fp16", measuring="paired", bound_s=0.006),
             PlannedCase("resnet18-compile", measuring="alone", bound_s=0.002),
             PlannedCase("gelu_mlp-fuse_pointwise_compile", measuring="alone", bound_s=0.001),
             PlannedCase("resnet18-cudnn_benchmark", measuring="fresh processes", bound_s=0.005),
             PlannedCase("resnet18-ddp", skipped="needs 2 GPUs")]
    cases[2:2] = [PlannedCase("resnet18-amp_bf16", measuring="paired", bound_s=0.006),
                  PlannedCase("resnet18-set_to_none", measuring="alone", bound_s=0.005)]
    predicted = {c.case: c for c in predict_seconds(cases, run)}
    assert predicted["resnet18-baseline"].predicted_s == 9.0  # measured: what it cost then
    assert predicted["resnet18-baseline"].predicted_from == "measured in night"
    settings_steps = 10 + 10 * 10 + PASS_STEPS  # the GPU profile's warm-up and rounds, the passes
    assert predicted["resnet18-channels_last"].predicted_s == round(5.0 + settings_steps * 0.005, 1)  # median 7, 3
    assert predicted["resnet18-amp_fp16"].predicted_s == round(3.0 + (10 + 200 + PASS_STEPS) * 0.006, 1)
    assert predicted["resnet18-compile"].predicted_s is None and "compiles" in predicted["resnet18-compile"].predicted_from
    assert predicted["gelu_mlp-fuse_pointwise_compile"].predicted_s is None  # it compiles, though not marked slow
    assert "no case measured fresh processes" in predicted["resnet18-cudnn_benchmark"].predicted_from
    assert predicted["resnet18-ddp"].predicted_s is None and predicted["resnet18-ddp"].predicted_from is None


def test_a_plans_seconds_come_from_every_earlier_night_given_the_last_one_first():
    from dataclasses import replace

    from trainbench.jobs.night_plan import PlannedCase, predict_seconds

    first = _seconds_run({"resnet18-baseline": {"rounds": 2.0, "total": 9.0}}, "night-1")
    second = _seconds_run({"resnet18-baseline": {"rounds": 2.0, "total": 11.0},  # measured again: this one counts
                           "resnet18-compile": {"rounds": 1.0, "total": 25.5}}, "night-2")  # its warm-up included
    cases = [PlannedCase("resnet18-baseline", measuring="alone", bound_s=0.005),
             PlannedCase("resnet18-compile", measuring="alone", bound_s=0.002),
             PlannedCase("gpt-compile", measuring="alone", bound_s=0.09)]
    predicted = {c.case: c for c in predict_seconds(cases, [first, second])}
    assert (predicted["resnet18-baseline"].predicted_s, predicted["resnet18-baseline"].predicted_from) == (
        11.0, "measured in night-2")
    assert (predicted["resnet18-compile"].predicted_s, predicted["resnet18-compile"].predicted_from) == (
        25.5, "measured in night-2")
    assert predicted["gpt-compile"].predicted_s is None and "compiles" in predicted["gpt-compile"].predicted_from
    # a plan's row already carrying seconds (a plan read back) is not predicted again from what it carried
    again = {c.case: c for c in predict_seconds([replace(cases[2], predicted_s=34.1)], [first])}
    assert again["gpt-compile"].predicted_s is None
