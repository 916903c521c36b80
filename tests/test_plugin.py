"""The pytest plugin, driven through inner pytest sessions (pytester)."""

import json

import pytest

QUICK = ["--trainbench-device=cpu", "--trainbench-rounds=2", "--trainbench-steps-per-round=2",
         "--trainbench-min-warmup=1", "-p", "no:cacheprovider"]

CASES = """
import pytest
from trainbench.plugin import recipe_params

@pytest.mark.parametrize("recipe", recipe_params("baseline", "set_to_none", "pinned_memory", "amp_fp16"))
def test_mlp(train_bench, recipe):
    train_bench(recipe, workload="mlp")
"""


def budgets(pytester, text):
    return str(pytester.makefile(".toml", budgets=text))


def test_markers_are_listed(pytester):
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.gpu:*", "@pytest.mark.min_gpus(n):*",
                                 "@pytest.mark.min_capability(major, minor):*", "@pytest.mark.slow:*"])


def test_gpu_cases_are_collected_and_skipped_with_a_reason(pytester):
    pytester.makepyfile(test_m="""
import pytest

@pytest.mark.gpu
def test_needs_gpu():
    pass

@pytest.mark.min_gpus(2)
def test_needs_two():
    pass

@pytest.mark.slow
def test_slow():
    pass
""")
    collected = pytester.runpytest("--collect-only", "-q", "--trainbench-device=cpu")
    collected.stdout.fnmatch_lines(["*test_needs_gpu*", "*test_needs_two*", "*test_slow*"])
    result = pytester.runpytest("-rs", "--trainbench-device=cpu")
    result.assert_outcomes(skipped=3)
    result.stdout.fnmatch_lines(["*needs a CUDA device; this run uses cpu*", "*slow case: run with --trainbench-slow*"])


def test_budgets_pass_fail_and_gpu_recipes_skip(pytester):
    pytester.makepyfile(test_cases=CASES)
    path = budgets(pytester, """
[cpu."mlp-baseline"]
max_syncs_per_step = 0
max_ops_per_step = 1
[cpu."mlp-set_to_none"]
max_ops_per_step_ratio = 0.99
max_gflops_per_sample_ratio = 1.0001
""")
    result = pytester.runpytest("-rs", f"--trainbench-budgets={path}", *QUICK)
    result.assert_outcomes(passed=1, failed=1, skipped=2)
    result.stdout.fnmatch_lines([
        "*mlp-baseline [[]cpu[]]: ops_per_step: measured * vs budget <= 1 (over by *%)*",
        "*trainbench summary*",
        "*mlp-baseline*FAIL 1/2*",
        "*mlp-set_to_none*ok 2*",
        "SKIPPED*pinned_memory (*): needs a CUDA device; this run uses cpu*",
    ])


def test_relative_budget_measures_the_baseline_when_it_did_not_run(pytester):
    pytester.makepyfile(test_cases=CASES)
    path = budgets(pytester, '[cpu."mlp-set_to_none"]\nmax_ops_per_step_ratio = 0.99\n')
    result = pytester.runpytest("-k", "set_to_none", f"--trainbench-budgets={path}", *QUICK)
    result.assert_outcomes(passed=1, deselected=3)


def test_malformed_budgets_file_fails_at_start_up(pytester):
    pytester.makepyfile(test_cases=CASES)
    path = budgets(pytester, '[cpu."mlp-baseline"]\nmax_ops_per_stepp = 1\n')
    result = pytester.runpytest(f"--trainbench-budgets={path}", *QUICK)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*trainbench: {path}: [[]cpu.mlp-baseline[]] unknown budget key 'max_ops_per_stepp'*"])


def test_case_without_budget_runs_and_says_so(pytester):
    pytester.makepyfile(test_cases=CASES)
    result = pytester.runpytest("-k", "baseline", *QUICK)
    result.assert_outcomes(passed=1, deselected=3, warnings=1)
    result.stdout.fnmatch_lines(["*mlp-baseline: no budget for *; nothing was checked*"])
    strict = pytester.runpytest("-k", "baseline", "--trainbench-require-budgets", *QUICK)
    strict.assert_outcomes(failed=1, deselected=3)
    strict.stdout.fnmatch_lines(["*mlp-baseline: no budget for * (--trainbench-require-budgets)*", "*trainbench summary*",
                                 "mlp-baseline * FAIL"])


def test_benchmark_json_carries_every_metric(pytester):
    pytester.makepyfile(test_cases=CASES)
    result = pytester.runpytest("-k", "baseline", "--benchmark-json=out.json", *QUICK)
    result.assert_outcomes(passed=1, deselected=3, warnings=1)
    data = json.loads((pytester.path / "out.json").read_text())
    (bench,) = data["benchmarks"]
    info = bench["extra_info"]
    for key in ["samples_per_s", "step_time_ms", "step_time_iqr_ms", "peak_memory_mib", "activation_mib",
                "memory_breakdown_bytes", "flops_per_step", "gflops_per_sample", "ops_per_step", "syncs_per_step",
                "h2d_bytes_per_sample", "device", "config", "warmup", "budget"]:
        assert key in info, key
    assert set(info["memory_breakdown_bytes"]) >= {"params", "grads", "optimizer_state", "activations", "total"}
    assert info["device"]["kind"] == "cpu" and info["device"]["torch"]
    # pytest-benchmark's own stats are per step: rounds x steps_per_round iterations.
    assert bench["stats"]["rounds"] == 2 and bench["stats"]["iterations"] == 2
    assert info["step_time_ms"] == pytest.approx(bench["stats"]["median"] * 1e3)
    assert data["machine_info"]["trainbench"]["kind"] == "cpu"


def test_cuda_requested_without_cuda_is_a_usage_error(pytester):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    pytester.makepyfile(test_cases=CASES)
    result = pytester.runpytest("--trainbench-device=cuda")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*device 'cuda' requested but torch.cuda.is_available() is False*"])


def test_own_workload_and_recipe_as_in_the_readme(pytester):
    pytester.makepyfile(test_own="""
import torch
from torch import nn
from trainbench.recipes import Recipe
from trainbench.workloads import FakeTokens, Workload, register_workload

register_workload(Workload(
    name="my_bag_of_words",
    description="EmbeddingBag classifier on random tokens",
    input_kind="tokens",
    build_model=lambda profile: nn.Sequential(nn.EmbeddingBag(1000, 64), nn.Linear(64, 10)),
    build_dataset=lambda profile, uint8, seed: FakeTokens(512, 32, 1000, seed=seed),
))

BIG_BATCH = Recipe("big_batch", "4x batch", {"batch_size": 64})

def test_mine(train_bench):
    result = train_bench(BIG_BATCH, workload="my_bag_of_words")
    assert result.batch_size == 64
    assert result.memory_breakdown_bytes["params"] == (1000 * 64 + 64 * 10 + 10) * 4
""")
    path = budgets(pytester, '[cpu."my_bag_of_words-big_batch"]\nmin_gflops_per_sample_ratio = 0.99\nmax_gflops_per_sample_ratio = 1.01\n')
    result = pytester.runpytest(f"--trainbench-budgets={path}", *QUICK)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*my_bag_of_words-big_batch*ok 2*"])
