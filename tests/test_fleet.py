"""The GPU night planned for every GPU of the fleet on the CPU: what must run, what must skip and why.

The plan is the runner's own (``Runner.plan_case`` on a ``SimulatedGpu``); only the memory
predictions are stood in for (a prediction at the GPU profile's sizes takes seconds), except in
the test that checks the real one for the case known to outgrow an 80 GB card.
"""

import json
from pathlib import Path

import pytest

from trainbench.cases import all_cases
from trainbench.fleet import FLEET, H100_SXM, T4, find_gpu
from trainbench.night_plan import format_night, plan_night
from trainbench.plan import ALONE, BASELINE_AFTER, FRESH_PROCESSES, PAIRED
from trainbench.predict import PredictionCache
from trainbench.simulated import NothingRunsHere, SimulatedGpu, prediction_backend

BUDGETS = Path(__file__).parent.parent / "benchmarks" / "budgets.toml"
MiB, GiB = 2**20, 2**30
GPT_LARGER_BATCH_MIB = 155_000  # the GPU profile's predicted tensor peak of gpt-larger_batch


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


@pytest.fixture(scope="module")
def nights():
    predictions = StandInPredictions()
    return {key: plan_night(gpu, BUDGETS, predictions) for key, gpu in FLEET.items()}


def _by_case(night):
    return {c.case: c for c in night.cases}


# Every GPU skips the two CPU-only cases (ddp_gloo, fsdp_gloo) and gpt-larger_batch with gpt-grad_accumulation (its
# baseline) for memory; one GPU also DDP and FSDP; the T4 also its four bf16 recipes and both fused SDPA kernels.
RUNS = {"h100-sxm": 69, "h100-pcie": 69, "a100-40gb": 69, "l4": 69, "t4": 63, "h200": 69, "2xh100-sxm": 71,
        "8xh100-sxm": 71}


def test_every_fleet_member_but_the_v100_plans_every_case_without_a_problem(nights):
    for key, night in nights.items():
        if key == "v100-16gb":
            continue
        assert night.ok, f"{key}: " + "\n".join(format_night(night))
        assert len(night.cases) == len(all_cases())
    counts = {key: len(night.runs) for key, night in nights.items() if key != "v100-16gb"}
    assert counts == RUNS
    assert {key: len(nights[key].skips) for key in RUNS} == {key: len(all_cases()) - runs for key, runs in RUNS.items()}
    for key in RUNS:
        for case in ("transformer-ddp_gloo", "transformer-fsdp_gloo"):
            assert "runs on the CPU only" in _by_case(nights[key])[case].skipped


def test_the_v100_is_refused_by_the_default_wheel_with_the_readme_advice(nights):
    night = nights["v100-16gb"]
    assert night.refused and not night.cases and not night.ok
    (fail,) = [c for c in night.checks if c.status == "FAIL"]
    assert "none that runs on sm_70" in fail.message and "whl/cu126" in fail.message
    assert "README's GPU runner section" in fail.message
    with pytest.raises(RuntimeError, match="none that runs on sm_70"):
        SimulatedGpu(FLEET["v100-16gb"])
    # a CUDA 12.6 build carries sm_70: the same GPU plans
    assert plan_night(FLEET["v100-16gb"], BUDGETS, StandInPredictions(), arch_list=["sm_50", "sm_70", "sm_90"]).ok


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
    from trainbench.measure import DEFAULT_SETTINGS
    from trainbench.runner import Runner
    from trainbench.workloads import PROFILES

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
