"""Can this case run here: every rule through ``why_not``, on the device descriptions backends give, no GPU needed."""

import dataclasses

import pytest

from trainbench.core.setups.cases import Case, ladder_cases
from trainbench.core.setups.eligibility import Context, MemoryLimit, why_not
from trainbench.core.setups.eligibility import HEADROOM
from trainbench.core.setups.recipes import Recipe, Requirements, get_recipe
from trainbench.core.setups.workloads import PROFILES
from trainbench.devices.device import DeviceCaps

CPU = DeviceCaps("cpu", "Some CPU", bf16=True)
CPU_NO_BF16 = DeviceCaps("cpu", "Old CPU", bf16=False)
T4 = DeviceCaps("cuda", "Tesla T4", cuda=True, capability=(7, 5), gpu_count=1, bf16=False)
P100 = DeviceCaps("cuda", "Tesla P100", cuda=True, capability=(6, 0), gpu_count=1, bf16=False)
TWO_H100 = DeviceCaps("cuda", "NVIDIA H100 80GB HBM3", cuda=True, capability=(9, 0), gpu_count=2, bf16=True)
GPU = PROFILES["gpu"]
GiB = 2**30


@pytest.fixture
def cpu_profile():
    return PROFILES["cpu"]


# -- the device ------------------------------------------------------------------------------------

def test_a_gpu_recipe_on_the_cpu_says_what_it_needs_and_what_this_run_uses(cpu_profile):
    assert why_not(get_recipe("pinned_memory"), CPU, cpu_profile) == (
        "pinned_memory: needs a CUDA device; this run uses cpu (Some CPU)")
    assert why_not(get_recipe("pinned_memory"), T4, GPU) is None


def test_a_backends_own_caps_answer_as_a_recorded_identity_does(cpu, cpu_profile):
    recorded = DeviceCaps.from_identity(cpu.identity())
    for caps in (cpu.caps(), recorded):
        assert why_not(get_recipe("pinned_memory"), caps, cpu_profile).startswith(
            f"pinned_memory: needs a CUDA device; this run uses cpu ({cpu.name})")
        assert why_not(get_recipe("set_to_none"), caps, cpu_profile) is None


def test_a_recipe_needing_more_gpus_than_present_says_how_many():
    assert why_not(get_recipe("ddp"), T4, GPU) == "ddp: needs 2 GPUs; 1 present"
    assert why_not(get_recipe("ddp"), TWO_H100, GPU) is None


def test_a_compute_capability_below_the_recipes_is_named_with_both_numbers(cpu_profile):
    assert why_not(get_recipe("amp_fp16"), P100, GPU) == (
        "amp_fp16: needs compute capability >= 7.0; Tesla P100 has 6.0")
    assert why_not(get_recipe("amp_fp16"), T4, GPU) is None
    # a GPU capability binds on GPUs only: any CPU runs the CPU form of the case
    assert why_not(get_recipe("sdpa_flash"), T4, GPU) == "sdpa_flash: needs compute capability >= 8.0; Tesla T4 has 7.5"
    assert why_not(get_recipe("sdpa_flash"), CPU, cpu_profile) is None


def test_a_cpu_stand_in_is_not_run_on_a_gpu():
    assert why_not(get_recipe("ddp_gloo"), TWO_H100, GPU) == (
        "ddp_gloo: runs on the CPU only; this run uses cuda: on GPUs the ddp recipe measures the same")


def test_bfloat16_is_needed_by_the_recipe_or_by_its_autocast_and_unknown_support_does_not_skip(cpu_profile):
    assert why_not(get_recipe("amp_bf16"), CPU_NO_BF16, cpu_profile) == "amp_bf16: needs bfloat16 support; Old CPU has none"
    # channels_last_amp asks for no bf16 itself; its CPU profile autocasts to bf16
    assert get_recipe("channels_last_amp").requires == Requirements()
    assert why_not(get_recipe("channels_last_amp"), CPU_NO_BF16, cpu_profile) == (
        "channels_last_amp: needs bfloat16 support; Old CPU has none")
    unknown = dataclasses.replace(CPU_NO_BF16, bf16=None)  # an identity recorded without it
    assert why_not(get_recipe("amp_bf16"), unknown, cpu_profile) is None


def test_a_spec_without_what_the_knobs_need_is_named_with_the_recipe(cpu_profile, mlp):
    assert why_not(get_recipe("checkpointing"), CPU, cpu_profile) is None  # no spec: its side is not checked
    assert why_not(get_recipe("checkpointing"), CPU, cpu_profile, mlp) == (
        "checkpointing: the spec names no checkpoint_blocks to recompute")


def test_the_callers_config_is_the_one_judged(cpu_profile, mlp):
    # the caller's overrides decide: recomputation needs blocks the spec names
    config = get_recipe("baseline").config(cpu_profile, synthetic="host")
    assert why_not(get_recipe("baseline"), CPU, cpu_profile, mlp, config) is None
    ddp = get_recipe("ddp_gloo").config(cpu_profile, checkpointing=True)
    assert why_not(get_recipe("ddp_gloo"), CPU, cpu_profile, mlp, ddp) == (
        "ddp_gloo: the spec names no checkpoint_blocks to recompute")


def test_a_pytorch_without_fsdp2_skips_the_fsdp_case_with_the_reason(cpu, cpu_profile, monkeypatch):
    import torch.distributed.fsdp

    assert why_not(get_recipe("fsdp_gloo"), cpu.caps(), cpu_profile) is None
    monkeypatch.delattr(torch.distributed.fsdp, "fully_shard")
    assert why_not(get_recipe("fsdp_gloo"), cpu.caps(), cpu_profile) == (
        "fsdp_gloo: needs FSDP2 (torch.distributed.fsdp.fully_shard, PyTorch 2.6+); this PyTorch has none")
    assert why_not(get_recipe("ddp_gloo"), cpu.caps(), cpu_profile) is None


def test_a_recipe_without_a_name_gives_its_reason_alone(cpu_profile):
    # a test's own markers (trainbench_gpu, trainbench_min_gpus ...) become such a recipe
    marked = Recipe("", "the test's markers", requires=Requirements(cuda=True, min_gpus=2))
    assert why_not(marked, CPU, cpu_profile) == "needs a CUDA device; this run uses cpu (Some CPU)"
    assert why_not(marked, T4, GPU) == "needs 2 GPUs; 1 present"


# -- suite cases -------------------------------------------------------------------------------------

def test_a_ladder_rung_needs_what_its_own_step_needs(cpu_profile):
    rungs = {case.own_recipe().name: case for case in ladder_cases()}
    assert why_not(rungs["ladder003-2_pinned_memory"], CPU, cpu_profile) == (
        "ladder003-2_pinned_memory: needs a CUDA device; this run uses cpu (Some CPU)")
    # rung 3 composes rung 2's pinned memory, which a CPU leaves out: the rung itself runs
    assert why_not(rungs["ladder003-3_larger_batch"], CPU, cpu_profile) is None
    assert why_not(Case("resnet18", "pinned_memory"), CPU, cpu_profile).startswith("pinned_memory: needs a CUDA")


# -- the caller's mode -------------------------------------------------------------------------------

def test_a_slow_case_runs_only_where_slow_cases_were_asked_for(cpu_profile):
    compile_ = get_recipe("compile")
    assert why_not(compile_, CPU, cpu_profile) is None  # a plain measurement runs what it is given
    assert why_not(compile_, CPU, cpu_profile, context=Context(slow_allowed=False)) == (
        "slow case: run with --trainbench-slow")
    asv = Context(slow_allowed=False, slow_hint="set TRAINBENCH_ASV_SLOW=1")
    assert why_not(Case("gpt", "compile"), CPU, cpu_profile, context=asv) == "slow case: set TRAINBENCH_ASV_SLOW=1"


def test_what_the_device_lacks_comes_before_what_the_caller_chose(cpu_profile):
    slow_gpu = Recipe("slow_gpu", "a slow GPU case", requires=Requirements(cuda=True), slow=True)
    assert why_not(slow_gpu, CPU, cpu_profile, context=Context(slow_allowed=False)) == (
        "slow_gpu: needs a CUDA device; this run uses cpu (Some CPU)")  # not "--trainbench-slow": it would not run


def test_an_ab_run_compares_one_process_cases_only(cpu_profile, mlp):
    ab = Context(ab=True)
    assert why_not(get_recipe("set_to_none"), CPU, cpu_profile, mlp, context=ab) is None
    assert why_not(get_recipe("ddp_gloo"), CPU, cpu_profile, mlp, context=ab) == (
        "ddp_gloo: not in an A/B run: its ranks run in other processes")
    fresh = Context(ab=True, fresh_process=lambda config: "cuBLAS reads its workspace once" if config.deterministic
                    else None)
    assert why_not(get_recipe("deterministic"), CPU, cpu_profile, mlp, context=fresh) == (
        "deterministic: not in an A/B run: cuBLAS reads its workspace once")
    assert why_not(get_recipe("deterministic"), CPU, cpu_profile, mlp) is None  # measured alone it runs
    rung = ladder_cases()[1]
    assert why_not(rung, CPU, cpu_profile, context=ab) == (
        "A/B compares recipe cases; a ladder rung is compared through its recipe's own case")


def test_a_trace_is_taken_of_cases_that_run_in_this_process_without_a_profiler_of_their_own(cpu_profile, mlp):
    traced = Context(traced=True, fresh_process=lambda config: "cuDNN's plan cache" if config.cudnn_benchmark else None)
    assert why_not(get_recipe("baseline"), CPU, cpu_profile, mlp, context=traced) is None
    assert why_not(get_recipe("ddp_gloo"), CPU, cpu_profile, mlp, context=traced) == "DDP ranks run in other processes"
    assert why_not(get_recipe("cudnn_benchmark"), T4, GPU, context=traced) == (
        "the case runs in a fresh process (cuDNN's plan cache)")
    assert why_not(get_recipe("profiler_left_on"), CPU, cpu_profile, mlp, context=traced) == (
        "the case runs a profiler of its own (debug='profiler')")
    assert why_not(get_recipe("profiler_left_on"), CPU, cpu_profile, mlp) is None  # untraced it runs
    assert why_not(get_recipe("emit_nvtx"), T4, GPU, context=traced) == (
        "the case runs a profiler of its own (debug='emit_nvtx')")  # NVTX mode is the autograd profiler
    assert why_not(get_recipe("emit_nvtx"), T4, GPU) is None


# -- memory --------------------------------------------------------------------------------------------

def _limit(total_bytes, predicted_total, asked=None):
    def predict(config, spec):
        if asked is not None:
            asked.append(config)
        return {"breakdown_bytes": {"total": predicted_total}} if predicted_total is not None else {"reason": "x"}

    return Context(memory=MemoryLimit(total_bytes, predict))


def test_a_setup_predicted_above_the_devices_memory_says_what_it_needs(mlp):
    needs = 14 * GiB
    reason = why_not(get_recipe("larger_batch"), T4, GPU, mlp, context=_limit(15 * GiB, needs))
    assert reason == (f"larger_batch: needs ~{needs * HEADROOM / GiB:.1f} GiB (predicted tensor peak 14.0 GiB + 25% "
                      "for the allocator and workspaces); Tesla T4 has 15.0 GiB")
    assert why_not(get_recipe("larger_batch"), T4, GPU, mlp, context=_limit(32 * GiB, needs)) is None
    # a setup fake tensors cannot predict runs (and finds out)
    assert why_not(get_recipe("larger_batch"), T4, GPU, mlp, context=_limit(GiB, None)) is None


def test_memory_is_checked_last_on_the_nearest_predictable_setup(cpu_profile, mlp):
    asked = []
    assert why_not(get_recipe("pinned_memory"), CPU, cpu_profile, mlp, context=_limit(GiB, 8 * GiB, asked)).endswith(
        "needs a CUDA device; this run uses cpu (Some CPU)")
    assert asked == []  # no prediction for a case the device rules out
    assert why_not(get_recipe("compile"), CPU, cpu_profile, context=_limit(GiB, 8 * GiB, asked)) is None  # no spec
    assert why_not(get_recipe("compile"), CPU, cpu_profile, mlp, context=_limit(GiB, 8 * GiB, asked)).startswith(
        "compile: needs ~10.0 GiB")
    [config] = asked
    assert config.compile is False  # predicted without compilation (predict.without_unpredictable)


def test_a_multi_gpu_case_on_a_worker_pinned_to_one_gpu_says_so_and_how_to_run_it():
    pinned = dataclasses.replace(T4, pinned_among=4)  # an xdist worker of a 4-GPU host, pinned to its own GPU
    reason = why_not(get_recipe("ddp"), pinned, GPU)
    assert reason.startswith("ddp: needs 2 GPUs; this pytest-xdist worker sees one of the host's 4, pinned to it")
    assert "without -n" in reason
    # pinned on a host of fewer GPUs than the case needs: the pinning is not what stops it
    assert why_not(get_recipe("ddp"), dataclasses.replace(T4, pinned_among=1), GPU) == "ddp: needs 2 GPUs; 1 present"


def test_every_knob_entry_names_a_need_its_reader_knows():
    # a need the table names but no reader checks would pass silently
    from trainbench.core.setups.eligibility import BUILD_NEEDS
    from trainbench.core.setups.recipes import KNOBS, SPEC_NEEDS, TrainConfig
    from trainbench.core.setups.spec import TrainingSpec

    for name, knob in KNOBS.items():
        assert knob.spec_needs in (None, *SPEC_NEEDS), name
        needs = knob.build_needs.values() if isinstance(knob.build_needs, dict) else [knob.build_needs or ()]
        assert all(need in BUILD_NEEDS for named in needs for need in named), name
        assert knob.fresh_env is None or knob.fresh_env[1], name  # a fresh process's variable has a default
    assert set(KNOBS) == {f.name for f in dataclasses.fields(TrainConfig)} - {"user_knobs"}  # users' own: USER_KNOBS
    assert set(SPEC_NEEDS) <= {f.name for f in dataclasses.fields(TrainingSpec)}


def test_every_cpu_stand_in_names_a_gpu_recipe_that_exists():
    from trainbench.core.setups.recipes import RECIPES

    stand_ins = {name: r.requires.gpu_variant for name, r in RECIPES.items() if r.requires.cpu_only}
    assert stand_ins == {"ddp_gloo": "ddp", "fsdp_gloo": "fsdp"}
    assert all(RECIPES[variant].requires.needs_cuda for variant in stand_ins.values())
