"""The pytest plugin, driven through inner pytest sessions (pytester)."""

import json
import sys
import time
from pathlib import Path

import pytest
import torch

from trainbench.devices.device import CpuBackend

CASES = """
import pytest
from trainbench.plugin import recipe_params

@pytest.mark.parametrize("recipe", recipe_params("baseline", "set_to_none", "pinned_memory", "amp_fp16"))
def test_mlp(train_bench, recipe):
    train_bench(recipe, "mlp")
"""


def budgets(pytester, text):
    return str(pytester.makefile(".toml", budgets=text))


@pytest.fixture(scope="module")
def _sessions():
    """Inner sessions that several tests read, by name: run once for the module."""
    return {}


@pytest.fixture
def baseline_without_budgets(pytester, quick_options, _sessions):
    """(result, saved JSON) of one inner session measuring the MLP baseline with no budgets file and
    --benchmark-json: the first test to ask runs it, the others read that same session."""
    if "baseline" not in _sessions:
        pytester.makepyfile(test_cases=CASES)
        result = pytester.runpytest("-k", "baseline", "--benchmark-json=out.json", *quick_options)
        _sessions["baseline"] = result, json.loads((pytester.path / "out.json").read_text())
    return _sessions["baseline"]


def test_markers_are_listed_and_namespaced(pytester):
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.trainbench_gpu(what=...):*", "@pytest.mark.trainbench_min_gpus(n):*",
                                 "@pytest.mark.trainbench_min_capability(major, minor):*", "@pytest.mark.trainbench_slow:*"])
    assert "@pytest.mark.slow:" not in result.stdout.str() and "@pytest.mark.gpu:" not in result.stdout.str()


def test_gpu_cases_are_collected_and_skipped_with_a_reason(pytester):
    pytester.makepyfile(test_m="""
import pytest

@pytest.mark.trainbench_gpu
def test_needs_gpu():
    pass

@pytest.mark.trainbench_min_gpus(2)
def test_needs_two():
    pass

@pytest.mark.trainbench_slow
def test_slow():
    pass
""")
    collected = pytester.runpytest("--collect-only", "-q", "--trainbench-device=cpu")
    collected.stdout.fnmatch_lines(["*test_needs_gpu*", "*test_needs_two*", "*test_slow*"])
    result = pytester.runpytest("-rs", "--trainbench-device=cpu")
    result.assert_outcomes(skipped=3)
    result.stdout.fnmatch_lines(["*needs a CUDA device; this run uses cpu*", "*slow case: run with --trainbench-slow*"])


def test_a_projects_own_slow_and_gpu_markers_are_left_alone(pytester):
    pytester.makeini("[pytest]\nmarkers =\n    slow: the project's own\n    gpu: the project's own\n")
    pytester.makepyfile(test_own="""
import pytest

@pytest.mark.slow
def test_slow():
    pass

@pytest.mark.gpu
def test_gpu():
    pass
""")
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=2)
    pytester.runpytest("-m", "slow", "-p", "no:cacheprovider").assert_outcomes(passed=1, deselected=1)


def test_budgets_pass_fail_and_gpu_recipes_skip(pytester, quick_options):
    pytester.makepyfile(test_cases=CASES)
    path = budgets(pytester, """
[cpu."mlp-baseline"]
max_syncs_per_step = 0
max_ops_per_step = 1
[cpu."mlp-set_to_none"]
max_ops_per_step_ratio = 0.99
max_gflops_per_sample_ratio = 1.0001
""")
    result = pytester.runpytest("-rs", f"--trainbench-budgets={path}", *quick_options)
    result.assert_outcomes(passed=1, failed=1, skipped=2)
    result.stdout.fnmatch_lines([
        "*mlp-baseline [[]cpu[]]: ops_per_step: measured * vs budget <= 1 (over by *%)*",
        "*trainbench summary*",
        "*mlp-baseline*FAIL 1/2*",
        "*mlp-set_to_none*ok 2*",
        "SKIPPED*pinned_memory (*): needs a CUDA device; this run uses cpu*",
    ])


def test_relative_budget_measures_the_baseline_when_it_did_not_run(pytester, quick_options):
    pytester.makepyfile(test_cases=CASES)
    path = budgets(pytester, '[cpu."mlp-set_to_none"]\nmax_ops_per_step_ratio = 0.99\n')
    result = pytester.runpytest("-k", "set_to_none", f"--trainbench-budgets={path}", *quick_options)
    result.assert_outcomes(passed=1, deselected=3)


def test_malformed_budgets_file_fails_at_start_up(pytester, quick_options):
    pytester.makepyfile(test_cases=CASES)
    path = budgets(pytester, '[cpu."mlp-baseline"]\nmax_ops_per_stepp = 1\n')
    result = pytester.runpytest(f"--trainbench-budgets={path}", *quick_options)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*trainbench: {path}: [[]cpu.mlp-baseline[]] unknown budget key 'max_ops_per_stepp'*"])
    folder, empty = pytester.mkdir("budgets_dir"), budgets(pytester, "")
    for bad, expected in [(folder, "cannot read it"), (empty, "no budgets in it")]:
        result = pytester.runpytest(f"--trainbench-budgets={bad}", *quick_options)
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        result.stderr.fnmatch_lines([f"*trainbench: {bad}: {expected}*"])
        assert "INTERNALERROR" not in result.stderr.str() + result.stdout.str()


def test_a_budget_entry_one_typo_from_a_case_fails_at_start_up_and_a_case_of_ones_own_stands(pytester, quick_options):
    pytester.makepyfile(test_cases=CASES)
    path = budgets(pytester, '[cpu."mlp-basline"]\nmax_ops_per_step = 1000\n')
    result = pytester.runpytest(f"--trainbench-budgets={path}", "-k", "baseline", *quick_options)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([(f'*trainbench: {path}: [[]cpu."mlp-basline"[]] names no case; did you mean '
                                  '"mlp-baseline"?*')])
    path = budgets(pytester, '[cpu."mlp-baseline"]\nmax_ops_per_step = 1000\n'
                             '[cpu."my_own_spec-my_own_recipe"]\nmax_ops_per_step = 1000\n')
    pytester.runpytest(f"--trainbench-budgets={path}", "-k", "baseline", *quick_options).assert_outcomes(passed=1,
                                                                                              deselected=3)


def test_case_without_budget_runs_and_says_so(pytester, quick_options, baseline_without_budgets):
    result, _ = baseline_without_budgets
    result.assert_outcomes(passed=1, deselected=3, warnings=1)
    result.stdout.fnmatch_lines(["*NoBudgetWarning: 1 case ran with no budget; nothing was checked:",
                                 "*mlp-baseline: no budget: no budgets file configured*"])
    pytester.makepyfile(test_cases=CASES)
    pytester.makefile(".toml", budgets='[cuda."mlp-baseline"]\nmax_ops_per_step = 1\n')
    # As an error, the file's warning fails its last test at its teardown.
    other_device = pytester.runpytest("-k", "baseline", "-W", "error::trainbench.plugin.NoBudgetWarning", *quick_options)
    other_device.assert_outcomes(passed=1, deselected=3, errors=1)
    other_device.stdout.fnmatch_lines(["*ERROR at teardown of test_mlp[[]baseline[]]*",
                                       "*NoBudgetWarning: 1 case ran with no budget; nothing was checked:",
                                       "*mlp-baseline: no budget: *budgets.toml has no section for * (looked for [[]cpu[]])*"])
    strict = pytester.runpytest("-k", "baseline", "--trainbench-require-budgets", *quick_options)
    strict.assert_outcomes(failed=1, deselected=3)
    strict.stdout.fnmatch_lines(["*mlp-baseline: no budget* (--trainbench-require-budgets)*", "*trainbench summary*",
                                 "mlp-baseline * FAIL"])


def test_benchmark_json_carries_every_metric(baseline_without_budgets):
    result, data = baseline_without_budgets
    result.assert_outcomes(passed=1, deselected=3, warnings=1)
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


def test_the_complete_attribution_goes_to_its_side_file_and_can_be_turned_off(pytester, attributed_options):
    from trainbench.core.records.tables import compact

    pytester.makepyfile(test_cases=CASES)
    result = pytester.runpytest("-k", "baseline or set_to_none", "--benchmark-json=out.json",
                                "--trainbench-attribution-json=where/attribution.json", *attributed_options)
    result.assert_outcomes(passed=2, deselected=2, warnings=1)  # one NoBudgetWarning for the file, naming both
    result.stdout.fnmatch_lines(["*NoBudgetWarning: 2 cases ran with no budget; nothing was checked:",
                                 "*mlp-baseline, mlp-set_to_none: no budget: no budgets file configured*"])
    side = json.loads((pytester.path / "where" / "attribution.json").read_text())
    assert side["complete"] and set(side["cases"]) == {"mlp-baseline", "mlp-set_to_none"}
    whole = side["cases"]["mlp-baseline"]
    saved = {b["extra_info"]["case"]: b["extra_info"] for b in json.loads((pytester.path / "out.json").read_text())["benchmarks"]}
    assert saved["mlp-baseline"]["attribution"] == compact(whole)  # the run keeps each table's top rows
    assert len(whole["time"]["ops_ms"]) > len(saved["mlp-baseline"]["attribution"]["time"]["ops_ms"])
    # a plain run explains no verdict: it leaves the attribution out and says how to get it
    plain = [o for o in attributed_options if o != "--trainbench-attribution"]
    off = pytester.runpytest("-k", "baseline", "--benchmark-json=off.json", *plain)
    off.assert_outcomes(passed=1, deselected=3, warnings=1)
    (bench,) = json.loads((pytester.path / "off.json").read_text())["benchmarks"]
    assert bench["extra_info"]["attribution"] is None and bench["extra_info"]["ops_per_step"] > 0
    off.stdout.fnmatch_lines(["attribution: not taken (a plain run explains no verdict, *--trainbench-attribution*"])
    both = pytester.runpytest("--trainbench-no-attribution", *attributed_options)
    assert both.ret == 4
    both.stderr.fnmatch_lines(["*--trainbench-attribution and --trainbench-no-attribution contradict each other*"])


def test_cuda_requested_without_cuda_is_a_usage_error(pytester):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    pytester.makepyfile(test_cases=CASES)
    result = pytester.runpytest("--trainbench-device=cuda")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*device 'cuda' requested but torch.cuda.is_available() is False*"])


def test_a_gpu_job_that_finds_no_gpu_fails_before_any_case(pytester, monkeypatch):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    pytester.makepyfile(test_cases=CASES)
    result = pytester.runpytest("--trainbench-expect-cuda", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*the runner is not ready*", "FAIL  cuda: CUDA expected*"])
    monkeypatch.setenv("TRAINBENCH_EXPECT_CUDA", "1")  # what a GPU job's environment says instead
    assert pytester.runpytest("-p", "no:cacheprovider").ret == pytest.ExitCode.USAGE_ERROR
    monkeypatch.setenv("TRAINBENCH_IGNORE_DOCTOR", "0")  # off: the blocker still stops it (any value used to skip it)
    assert pytester.runpytest("-p", "no:cacheprovider").ret == pytest.ExitCode.USAGE_ERROR
    monkeypatch.setenv("TRAINBENCH_EXPECT_CUDA", "sure")
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*TRAINBENCH_EXPECT_CUDA='sure': expected 1 or 0*"])


def test_the_doctors_checks_are_saved_with_the_run(baseline_without_budgets):
    result, data = baseline_without_budgets
    result.assert_outcomes(passed=1, deselected=3, warnings=1)
    doctor = data["machine_info"]["trainbench"]["doctor"]
    assert doctor["blockers"] == 0
    names = {check["name"] for check in doctor["checks"]}
    assert {"cuda", "shm", "timing", "cpu"} <= names


def test_the_gpu_smoke_run_skips_with_its_reason_without_cuda(pytester):
    import shutil
    from pathlib import Path

    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    shutil.copy(Path(__file__).parents[1] / "smoke" / "test_gpu_smoke.py", pytester.path / "test_gpu_smoke.py")
    result = pytester.runpytest("-rs", "-p", "no:cacheprovider")
    outcomes = result.parseoutcomes()
    assert outcomes.get("skipped", 0) >= 20 and "passed" not in outcomes and "failed" not in outcomes
    result.stdout.fnmatch_lines(["*GPU smoke: needs a CUDA device; this run uses cpu*"])


OWN = """
import functools

import torch
from torch import nn
from trainbench.core.setups.recipes import Recipe
from trainbench.core.setups.spec import TrainingSpec, classification_loss
from trainbench.core.setups.workloads import FakeTokens

SPEC = TrainingSpec(
    name="my_bag_of_words",
    model=lambda: nn.Sequential(nn.EmbeddingBag(1000, 64), nn.Linear(64, 10)),
    loss_fn=classification_loss,
    optimizer=functools.partial(torch.optim.SGD, lr=0.01),
    dataset=lambda: FakeTokens(512, 32, 1000),
    batch_size=16,
)
BIG_BATCH = Recipe("big_batch", "4x batch", {"batch_multiplier": 4})
"""


def test_own_spec_and_recipe(pytester, quick_options):
    pytester.makepyfile(test_own=OWN + """
def test_mine(train_bench):
    result = train_bench(BIG_BATCH, SPEC)
    assert result.batch_size == 64
    assert result.memory_breakdown_bytes["params"] == (1000 * 64 + 64 * 10 + 10) * 4
""")
    pytester.makefile(".toml", budgets='[cpu."my_bag_of_words-big_batch"]\nmin_gflops_per_sample_ratio = 0.99\n'
                                       'max_gflops_per_sample_ratio = 1.01\n')
    result = pytester.runpytest(*quick_options)  # budgets.toml beside the test is found without options
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*my_bag_of_words-big_batch*ok 2*"])


def test_the_command_line_and_the_ini_override_the_budgets_beside_the_tests(pytester, quick_options):
    pytester.makepyfile(test_own=OWN + "\ndef test_mine(train_bench):\n    train_bench('baseline', SPEC)\n")
    pytester.makefile(".toml", budgets='[cpu."my_bag_of_words-baseline"]\nmax_ops_per_step = 1\n')
    pytester.runpytest(*quick_options).assert_outcomes(failed=1)
    other = pytester.makefile(".toml", other='[cpu."my_bag_of_words-baseline"]\nmax_ops_per_step = 100000\n')
    pytester.runpytest(f"--trainbench-budgets={other}", *quick_options).assert_outcomes(passed=1)
    pytester.makeini("[pytest]\ntrainbench_budgets = other.toml\n")
    pytester.runpytest(*quick_options).assert_outcomes(passed=1)


def test_an_override_composes_with_the_recipe_or_is_refused(pytester, quick_options):
    pytester.makepyfile(test_own=OWN + """
def test_composes(train_bench):
    assert train_bench("larger_batch", SPEC, batch_size=8).batch_size == 32  # 4x the overridden batch

def test_cancels(train_bench):
    train_bench(BIG_BATCH, SPEC, batch_multiplier=1)
""")
    result = pytester.runpytest(*quick_options)
    result.assert_outcomes(passed=1, failed=1, warnings=1)
    result.stdout.fnmatch_lines(["*the override batch_multiplier=1 would cancel recipe 'big_batch'*batch_multiplier=4*"])


def test_a_recipe_that_cannot_apply_to_a_spec_is_skipped_with_what_is_missing(pytester, quick_options):
    pytester.makepyfile(test_own=OWN + """
import pytest

@pytest.mark.parametrize("recipe", ["checkpointing", "uint8_transfer", "device_tensors", "channels_last"])
def test_mine(train_bench, recipe):
    train_bench(recipe, SPEC)
""")
    result = pytester.runpytest("-rs", *quick_options)
    result.assert_outcomes(skipped=4)
    # located at the user's test, not at trainbench's fixture that skipped it
    result.stdout.fnmatch_lines(["SKIPPED [[]1[]] test_own.py:*: checkpointing: the spec names no checkpoint_blocks*",
                                 "SKIPPED [[]1[]] test_own.py:*: uint8_transfer: the spec's dataset serves no uint8 pixels*",
                                 "SKIPPED [[]1[]] test_own.py:*: device_tensors: the spec has no batches factory*",
                                 "SKIPPED [[]1[]] test_own.py:*: channels_last: the model has no 2-D convolution*"])


PLAIN = """
def test_plain(benchmark):
    benchmark(sum, range(100))
"""
# pytest-benchmark times a plain benchmark for up to a second by default; where it stores and what it compares
# does not depend on how long.
PLAIN_OPTIONS = ["--benchmark-max-time=0.01", "-p", "no:cacheprovider"]


def _saved(pytester, *args):
    result = pytester.runpytest("--benchmark-autosave", "--benchmark-save=plain", *PLAIN_OPTIONS, *args)
    result.assert_outcomes(passed=1)
    return sorted(str(p.relative_to(pytester.path)) for p in (pytester.path / ".benchmarks").rglob("*.json"))


def test_plain_pytest_benchmark_tests_store_and_compare_as_without_trainbench(pytester):
    import json

    pytester.makepyfile(test_plain=PLAIN)
    without = _saved(pytester, "-p", "no:trainbench")
    with_plugin = sorted(set(_saved(pytester)) - set(without))
    assert [p.replace("0001", "0002") for p in without] == with_plugin  # same folder, the next number
    machine_info = [json.loads((pytester.path / p).read_text())["machine_info"] for p in with_plugin + without]
    assert all("trainbench" not in info for info in machine_info)  # the plugin adds nothing to a plain run
    compared = pytester.runpytest("--benchmark-compare", *PLAIN_OPTIONS)
    compared.assert_outcomes(passed=1)
    assert "(0002_plain)" in compared.stdout.str()  # pytest-benchmark's own choice: the latest run
    assert "trainbench summary" not in compared.stdout.str() and "trainbench compare" not in compared.stdout.str()


def test_a_session_without_trainbench_cases_does_not_import_torch(pytester):
    # nor what its statistics take (numpy, scipy): a plain session of the user's project loads what it did without
    pytester.makepyfile(test_plain='def test_x():\n    import sys\n    assert "torch" not in sys.modules\n'
                                   '    assert "numpy" not in sys.modules and "scipy" not in sys.modules\n')
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_a_malformed_budgets_file_beside_the_tests_stops_the_run_before_any_case(pytester, quick_options):
    pytester.makepyfile(test_cases=CASES)
    path = pytester.makefile(".toml", budgets='[cpu."mlp-baseline"]\nmax_bogus = 1\n')
    result = pytester.runpytest(*quick_options)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*trainbench: {path}: [[]cpu.mlp-baseline[]] unknown budget key 'max_bogus'*"])


OOM = """
import functools

import torch
from torch import nn
from trainbench.core.setups.spec import TrainingSpec, classification_loss
from trainbench.core.setups.workloads import FakeTokens

CALLS = [0]


def loss_that_runs_out_of_memory(model, batch):
    CALLS[0] += 1
    if CALLS[0] > 3:  # past the first steps, as a batch that grows its activations would
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (planted)")
    return classification_loss(model, batch)


def spec(loss):
    return TrainingSpec(name="bag", model=lambda: nn.Sequential(nn.EmbeddingBag(100, 8), nn.Linear(8, 10)),
                        loss_fn=loss, optimizer=functools.partial(torch.optim.SGD, lr=0.01),
                        dataset=lambda: FakeTokens(256, 8, 100), batch_size=16)


def test_a_oom(train_bench):
    train_bench("baseline", spec(loss_that_runs_out_of_memory))


def test_b_after(train_bench):
    train_bench("baseline", spec(classification_loss))
"""


def test_out_of_memory_fails_that_case_alone_and_is_kept_in_the_run(pytester, quick_options):
    pytester.makepyfile(test_oom=OOM)
    result = pytester.runpytest("--benchmark-json=out.json", *quick_options)
    result.assert_outcomes(passed=1, failed=1, warnings=1)
    result.stdout.fnmatch_lines([("*trainbench: bag-baseline: out of memory at batch 16: CUDA out of memory. Tried to "
                                 "allocate 20.00 GiB (planted)*")])
    result.stdout.fnmatch_lines(["*trainbench summary*", "*FAILED bag-baseline: out of memory at batch 16*"])
    assert "Traceback" not in result.stdout.str() and "fixture was not used" not in result.stdout.str()
    data = json.loads((pytester.path / "out.json").read_text())
    assert [b["name"] for b in data["benchmarks"]] == ["test_b_after"]
    (failed,) = data["trainbench_failed_cases"]
    assert failed["case"] == "bag-baseline" and "out of memory at batch 16" in failed["error"]


HUNG = """
import functools
import time

import torch
from torch import nn
from torch.utils.data import Dataset
from trainbench.core.setups.spec import TrainingSpec, classification_loss


class Hangs(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        time.sleep(3600)  # a dataset that never returns (a stuck network read, a deadlocked transform)


SPEC = TrainingSpec(name="hung", model=lambda: nn.Sequential(nn.EmbeddingBag(100, 8), nn.Linear(8, 10)),
                    loss_fn=classification_loss, optimizer=functools.partial(torch.optim.SGD, lr=0.01),
                    dataset=Hangs, batch_size=4)


def test_hung(train_bench):
    train_bench("multiprocess_loading", SPEC, loader_timeout_s=1)
"""


def test_a_hung_dataset_fails_that_case_after_the_loader_timeout(pytester, quick_options, monkeypatch):
    import torch.utils.data._utils

    # Closing the loader, torch waits this long for each stuck worker to exit before it terminates it (5 s by
    # default): the same shutdown, without 10 s of waiting in every test run.
    monkeypatch.setattr(torch.utils.data._utils, "MP_STATUS_CHECK_INTERVAL", 0.5)
    pytester.makepyfile(test_hung=HUNG)
    started = time.monotonic()
    result = pytester.runpytest(*quick_options)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*hung-multiprocess_loading: no progress for 1 s in the DataLoader*"])
    assert time.monotonic() - started < 120  # not forever: the limit, then the workers are shut down


HUNG_IN_MAIN = HUNG.replace('train_bench("multiprocess_loading", SPEC, loader_timeout_s=1)',
                            'train_bench("baseline", SPEC)') + """

def test_z_after(train_bench):
    import dataclasses
    from trainbench.core.setups.workloads import FakeTokens

    train_bench("baseline", dataclasses.replace(SPEC, name="fine", dataset=lambda: FakeTokens(64, 8, 100)))
"""


def test_a_case_hung_in_the_main_process_fails_alone_after_the_progress_limit_and_the_session_goes_on(pytester, quick_options):
    pytester.makepyfile(test_hung=HUNG_IN_MAIN)
    started = time.monotonic()
    result = pytester.runpytest(*quick_options, "--trainbench-timeout=2", "--benchmark-json=out.json")
    result.assert_outcomes(failed=1, passed=1)


    assert time.monotonic() - started < 120  # 2 s, not the hour the dataset sleeps
    failed = json.loads((pytester.path / "out.json").read_text())["trainbench_failed_cases"]
    assert [f["case"] for f in failed] == ["hung-baseline"]


def test_a_negative_timeout_is_refused(pytester, quick_options):
    pytester.makepyfile(test_hung=HUNG_IN_MAIN)
    result = pytester.runpytest(*quick_options, "--trainbench-timeout=-1")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--trainbench-timeout must be a number of seconds >= 0 (0: no limit), got -1.0*"])


USER_FAULTS = """
import dataclasses

import torch
from torch import nn
from trainbench.core.setups.spec import classification_loss
from trainbench.core.setups.workloads import PROFILES, resolve_spec

MLP = resolve_spec("mlp", PROFILES["cpu"])
STEPS = [0]


def diverging(model, batch):
    STEPS[0] += 1
    return classification_loss(model, batch) * (float("nan") if STEPS[0] > 2 else 1.0)


def host_out_of_memory(model, batch):
    raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1099511627776 bytes.")


def test_a_no_grad_loss(train_bench):
    train_bench("baseline", dataclasses.replace(MLP, loss_fn=lambda m, b: classification_loss(m, b).detach()))


def test_b_no_parameters(train_bench):
    train_bench("baseline", dataclasses.replace(MLP, model=nn.Flatten))


def test_c_empty_dataset(train_bench):
    empty = torch.utils.data.TensorDataset(torch.zeros(0, 3, 32, 32), torch.zeros(0, dtype=torch.long))
    train_bench("baseline", dataclasses.replace(MLP, dataset=lambda: empty))


def test_d_host_out_of_memory(train_bench):
    train_bench("baseline", dataclasses.replace(MLP, loss_fn=host_out_of_memory))


def test_e_nan_loss(train_bench):
    train_bench("baseline", dataclasses.replace(MLP, loss_fn=diverging))


def test_f_after(train_bench):
    train_bench("baseline", MLP)
"""


def test_user_faults_fail_their_case_alone_in_one_line_and_the_session_goes_on(pytester, quick_options):
    pytester.makepyfile(test_faults=USER_FAULTS)
    result = pytester.runpytest(*quick_options)
    result.assert_outcomes(passed=1, failed=5, warnings=1)
    result.stdout.fnmatch_lines([
        "*_ test_a_no_grad_loss _*", "trainbench: training spec 'mlp': loss_fn returned a loss that does not require grad*",
        "*_ test_b_no_parameters _*", "trainbench: training spec 'mlp': the model has no parameters to train",
        "*_ test_c_empty_dataset _*", "trainbench: the dataset of training spec 'mlp' yields no batches (its length is 0)",
        "*_ test_d_host_out_of_memory _*", "trainbench: mlp-baseline: out of memory at batch 16: DefaultCPUAllocator: *",
        "*_ test_e_nan_loss _*", "trainbench: mlp-baseline: the loss of training spec 'mlp' is nan at step *",
    ])
    assert "Traceback" not in result.stdout.str() and "Error code" not in result.stdout.str()
    # each said once: the spec's error was printed again under "During handling of the above exception"
    assert "During handling" not in result.stdout.str()


STRAY = OWN + """
import pytest


def broken(model, batch):
    raise ValueError("the user's loss function has a bug")


def test_step_raises(train_bench):
    import dataclasses

    train_bench("baseline", dataclasses.replace(SPEC, loss_fn=broken))


def test_fails_before_calling(train_bench):
    assert False, "the test's own set-up"


def test_plain_benchmark_unused(benchmark):
    assert False, "a user's own benchmark test"
"""


def test_a_failed_case_has_no_stray_fixture_not_used_warning_and_a_users_benchmark_test_keeps_it(pytester,
                                                                                                quick_options):
    pytester.makepyfile(test_stray=STRAY)
    result = pytester.runpytest("-rw", *quick_options)
    result.assert_outcomes(failed=3, warnings=1)
    out = result.stdout.str()
    assert "the user's loss function has a bug" in out
    # the one warning left is the plain benchmark test's own
    result.stdout.fnmatch_lines(["*test_plain_benchmark_unused*", "*Benchmark fixture was not used at all*"])
    assert out.count("Benchmark fixture was not used at all") == 1


SIMULATED = """
import pytest
from trainbench.plugin import recipe_params

@pytest.mark.parametrize("recipe", recipe_params("ddp", "amp_bf16"))
def test_mlp(train_bench, recipe):
    train_bench(recipe, "mlp")
"""


def test_a_simulated_gpu_skips_as_that_gpu_would_and_measures_nothing(pytester):
    pytester.makepyfile(test_sim=SIMULATED)
    result = pytester.runpytest("-rs", "-p", "no:cacheprovider", "--trainbench-simulate-gpu", "NVIDIA L40S")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.assert_outcomes(skipped=2)
    out = result.stdout.str()
    assert "): needs 2 GPUs; 1 present" in out  # eligibility.why_not's reason on that GPU (the marker names ddp)
    assert "would run on simulated NVIDIA L40S: [no budget]" in out and "nothing is measured on a simulated GPU" in out
    # two GPUs: the DDP case would run there (and is not run here)
    result = pytester.runpytest("-rs", "-p", "no:cacheprovider", "-k", "ddp", "--trainbench-simulate-gpu", "2xh100-sxm")
    result.assert_outcomes(skipped=1)
    assert "would run on simulated NVIDIA H100 80GB HBM3: [no budget]" in result.stdout.str()


SIMULATED_USER_MODEL = """
import functools
import pytest
import torch
from torch import nn
from trainbench import TrainingSpec, classification_loss
from trainbench.plugin import recipe_params

SPEC = TrainingSpec(name="user_mlp", model=lambda: nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 10)),
                    loss_fn=classification_loss, batch_size=16, optimizer=functools.partial(torch.optim.SGD, lr=0.1),
                    batches=lambda n, gen: (torch.randn(n, 32, generator=gen), torch.randint(0, 10, (n,), generator=gen)))


@pytest.mark.parametrize("recipe", recipe_params("baseline", "channels_last", "ddp_gloo"))
def test_user(train_bench, recipe):
    train_bench(recipe, SPEC)
"""


def test_a_simulated_gpu_skips_what_the_users_model_makes_not_applicable_as_the_cpu_run_does(pytester):
    """A user's MLP: channels-last has no convolution to change, so the CPU run skips it; the simulated GPU said it
    "would run"; and ddp_gloo pointed at "the GPU variant of this case", which a user project does not have."""
    pytester.makepyfile(test_user=SIMULATED_USER_MODEL)
    result = pytester.runpytest("-rs", "-p", "no:cacheprovider", "--trainbench-simulate-gpu", "h100-sxm")
    result.assert_outcomes(skipped=3)
    out = result.stdout.str()
    assert "channels_last: the model has no 2-D convolution (channels-last changes nothing)" in out
    assert "user_mlp-channels_last: would run" not in out and "user_mlp-baseline: would run on simulated" in out
    assert "launch-bound, >= " in out  # the user's case gets its roofline, as a suite case's plan does
    assert "ddp_gloo: runs on the CPU only; this run uses cuda: on GPUs the ddp recipe measures the same" in out


def test_an_unknown_simulated_gpu_or_a_bad_spec_is_a_usage_error_at_start_up(pytester):
    pytester.makepyfile(test_sim=SIMULATED)
    for given, said in (("NVIDIA B300", "trainbench: --trainbench-simulate-gpu: unknown GPU 'NVIDIA B300'"),
                        ("name=X,memory_gib=big,capability=8.9,sms=1",
                         "trainbench: --trainbench-simulate-gpu: GPU spec: memory_gib='big': expected GiB > 0")):
        result = pytester.runpytest("-p", "no:cacheprovider", "--trainbench-simulate-gpu", given)
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        assert said in result.stderr.str()
    result = pytester.runpytest("-p", "no:cacheprovider", "--trainbench-simulate-gpu", "l40s", "--trainbench-device=cpu")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--trainbench-simulate-gpu with --trainbench-device=cpu" in result.stderr.str()


@pytest.mark.parametrize(("options", "expected"), [
    (["--trainbench-min-warmup=-1"], "*trainbench: --trainbench-min-warmup must be >= 1, got -1"),
    (["--trainbench-ab-pairs=8"], "*--trainbench-ab-pairs=8 needs --trainbench-ab=PYTHON (the head)"),
    (["--trainbench-ab-base-root={tmp}"], "*--trainbench-ab-base-root needs --trainbench-ab=PYTHON (the head)"),
    ([f"--trainbench-ab={sys.executable}", "--trainbench-ab-base-root={file}"],
     "*--trainbench-ab-base-root={file}: no such folder; expected another checkout of the project*"),
    (["--trainbench-inject-leak-mib=nan"], "*--trainbench-inject-leak-mib must be a finite number of MiB >= 0, got nan"),
    (["--trainbench-ab=/etc/passwd"], "*--trainbench-ab=/etc/passwd: not an executable Python*"),
    (["--benchmark-compare", "--trainbench-compare-fail=samples_per_s:5%,samples_per_s:10%"],
     "*'samples_per_s:10%': samples_per_s has a threshold already in*expected one threshold per metric"),
    (["--trainbench-compare-json={tmp}"], "*--trainbench-compare-json={tmp}: is a folder; expected a file path*"),
    (["--trainbench-attribution-json={tmp}"], "*--trainbench-attribution-json={tmp}: is a folder; expected a file*"),
    (["--benchmark-json={tmp}"], "*--benchmark-json={tmp}: is a folder; expected a file path*"),
    (["--trainbench-save-progress={tmp}"], "*--trainbench-save-progress={tmp}: is a folder; expected a file path*"),
    (["--benchmark-json={file}/out.json"], "*--benchmark-json: cannot write into {file}*"),
    (["--benchmark-save=" + "x" * 300], "*--benchmark-save=xxxx*: the run's file name (310 bytes) is longer than*"),
])
def test_an_option_that_would_fail_only_after_the_run_is_refused_before_any_case(pytester, quick_options, options,
                                                                                 expected):
    # each of these used to run the whole suite and then crash (or be silently ignored)
    pytester.makepyfile(test_case="def test_mine(train_bench):\n    raise AssertionError('a case ran')\n")
    in_the_way = pytester.path / "a_file"
    in_the_way.write_text("in the way of a folder")
    fill = {"tmp": pytester.path, "file": in_the_way}
    result = pytester.runpytest(*quick_options, *(o.format(**fill) for o in options))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([expected.format(**fill)])
    assert "a case ran" not in result.stdout.str()


def test_an_output_file_pytest_benchmark_opened_itself_is_left_to_it(tmp_path):
    """pytest-benchmark < 5.3 (5.2.3 on a GPU box) opens --benchmark-json at start-up and hands the option a file:
    checking it as a path stopped every session there with an INTERNALERROR."""
    from trainbench.plugin.startup import check_output_files

    with open(tmp_path / "out.json", "wb") as opened:
        check_output_files([("--benchmark-json", opened)])


def test_a_missing_folder_of_an_output_file_is_made_at_start_up(pytester, quick_options):
    pytester.makepyfile(test_case="def test_mine():\n    pass\n\ndef test_tb(train_bench):\n    pass\n")
    result = pytester.runpytest(*quick_options, "--benchmark-json=new/folder/out.json", "--collect-only")
    assert result.ret == pytest.ExitCode.OK
    assert (pytester.path / "new" / "folder").is_dir()


SPARSE_RECOMMENDER = """import functools
import torch
from torch import nn
import pytest
from trainbench import TrainingSpec


class Rec(nn.Module):
    def __init__(self):
        super().__init__()
        self.bag = nn.EmbeddingBag(1000, 16, mode="sum", sparse=True)
        self.head = nn.Linear(16, 1)

    def forward(self, ids, offsets):
        return self.head(self.bag(ids, offsets)).squeeze(-1)


def batches(n, gen):
    ids = torch.randint(0, 1000, (n * 4,), generator=gen)
    return {"ids": ids, "offsets": torch.arange(0, n * 4, 4), "y": torch.rand(n, generator=gen)}


def loss_fn(model, b):
    return nn.functional.mse_loss(model(b["ids"], b["offsets"]), b["y"])


def optimizers(model):
    return {"sparse": torch.optim.SparseAdam(list(model.bag.parameters()), lr=1e-2),
            "dense": torch.optim.Adam(model.head.parameters(), lr=1e-2)}


SPEC = TrainingSpec(name="rec", model=Rec, loss_fn=loss_fn, batch_size=32, optimizers=optimizers, batches=batches)


@pytest.mark.parametrize("recipe", ["baseline", "set_to_none", "larger_batch"])
def test_rec(train_bench, recipe):
    train_bench(recipe, SPEC)
"""


def test_a_sparse_embedding_with_sparse_adam_is_measured_in_every_pass(pytester, quick_options, monkeypatch):
    """``nn.EmbeddingBag(sparse=True)`` with ``SparseAdam``: every measured case failed in the growth pass
    (``Cannot access storage of SparseTensorImpl``); sparse tensors are now counted by their parts, the breakdown says
    why it tracks by storage identity, and the prediction says why it is not made."""
    monkeypatch.setenv("TRAINBENCH_PREDICT_MEMORY", "1")
    pytester.makepyfile(test_rec=SPARSE_RECOMMENDER)
    result = pytester.runpytest(*quick_options, "--benchmark-json=out.json")
    result.assert_outcomes(passed=3)
    out = result.stdout.str()
    assert "GPU pred n/a for rec-baseline, rec-set_to_none, rec-larger_batch: sparse gradients" in out
    import json

    records = {b["extra_info"]["case"]: b["extra_info"] for b in json.loads((pytester.path / "out.json").read_text())[
        "benchmarks"]}
    breakdown = records["rec-baseline"]["memory_breakdown_bytes"]
    assert breakdown["grads"] > 16 * 4 and breakdown["optimizer_state"] > 0  # the sparse gradient and Adam's state
    assert any("sparse gradients" in note for note in records["rec-baseline"]["notes"])


def test_sparse_gradients_are_all_reduced_by_ddp_and_fsdp2_which_cannot_shard_them_is_skipped(pytester, quick_options):
    """ddp_gloo failed in the ranks' gradient check (``reshape is not implemented for sparse tensors``); fsdp_gloo
    failed inside FSDP2 (``fsdp::chunk_cat`` has no sparse kernel), a raw rank traceback either way."""
    example = (Path(__file__).parents[1] / "examples" / "sparse_recommender" / "test_sparse_recommender.py").read_text()
    recipes = example[example.index("@pytest.mark.parametrize"):example.index("def test_two_tower")]
    # a smaller batch: sparse gradients all the same, and the one process's baseline measured in a fraction of the time
    example = example.replace(recipes, '@pytest.mark.parametrize("recipe", ["ddp_gloo", "fsdp_gloo"])\n')
    pytester.makepyfile(test_rec=example.replace("batch_size=256", "batch_size=32"))
    result = pytester.runpytest(*quick_options, "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    out = result.stdout.str()
    assert "ranks two_tower-ddp_gloo: 2 under" in out and "gradients identical on every rank" in out
    assert "fsdp_gloo: FSDP2 shards dense gradients only" in out and "Traceback" not in out


def test_ranks_of_a_model_with_dropout_take_their_guard_gradients_with_it_off(pytester, quick_options):
    """ddp_gloo on a model with dropout failed its gradient guard (worst relative error 0.58): each rank's share of
    the batch draws other masks than the one process's whole batch. The ranks now take the guard's first-step
    gradients with dropout off, as the one-process reference does, and measure with it on."""
    spec = WITH_DROPOUT.replace('["baseline", "grad_accumulation", "set_to_none"]', '["ddp_gloo"]').replace(
        "batch_size=16,", "batch_size=16, dataset=lambda: torch.utils.data.TensorDataset(torch.randn(512, 32), "
        "torch.randint(0, 10, (512,))),")
    pytester.makepyfile(test_dropout=spec)
    result = pytester.runpytest(*quick_options, "--benchmark-json=out.json")
    result.assert_outcomes(passed=1)
    import json

    [record] = [b["extra_info"] for b in json.loads((pytester.path / "out.json").read_text())["benchmarks"]]
    [check] = record["guard"]["checks"]
    assert check["kind"] == "gradients" and check["ok"] and "with dropout off on both sides" in check["message"]


def test_a_compiled_model_with_dropout_is_guarded_with_its_masks_out_of_the_way(pytester, quick_options):
    """compile on a model with dropout (a standard BERT) failed its loss guard (0.0672 at step 1): Inductor's kernels
    draw their masks from another random stream than eager code. The guard now compares with dropout off."""
    pytester.makepyfile(test_dropout=WITH_DROPOUT.replace('["baseline", "grad_accumulation", "set_to_none"]',
                                                          '["compile"]'))
    result = pytester.runpytest(*quick_options, "--trainbench-slow", "--benchmark-json=out.json")
    result.assert_outcomes(passed=1)
    [record] = [b["extra_info"] for b in json.loads((pytester.path / "out.json").read_text())["benchmarks"]]
    [check] = record["guard"]["checks"]
    assert check["ok"] and "draws its masks in the compiled kernels from another random stream" in check["message"]


ATTENTION_WITH_DROPOUT = """
import functools
import pytest
import torch
from torch import nn
from trainbench import TrainingSpec, classification_loss


class Attend(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv, self.head = nn.Linear(16, 48), nn.Linear(16, 4)

    def forward(self, x):
        q, k, v = self.qkv(x).unsqueeze(1).chunk(3, dim=-1)
        # attention dropout in training, as a Hugging Face BERT passes it: no flash kernel on the CPU takes it
        out = nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=0.1 if self.training else 0.0)
        return self.head(out.squeeze(1).mean(1))


SPEC = TrainingSpec(name="masked", model=Attend, loss_fn=classification_loss, batch_size=8,
                    optimizer=functools.partial(torch.optim.SGD, lr=0.1),
                    batches=lambda n, gen: (torch.randn(n, 12, 16, generator=gen), torch.randint(0, 4, (n,), generator=gen)))


@pytest.mark.parametrize("recipe", ["sdpa_flash"])
def test_masked(train_bench, recipe):
    train_bench(recipe, SPEC)
"""


def test_an_attention_kernel_that_cannot_run_the_models_attention_is_skipped_with_why(pytester, quick_options):
    """sdpa_flash on a BERT (its attention has dropout) failed with a raw "No available kernel" traceback."""
    pytester.makepyfile(test_masked=ATTENTION_WITH_DROPOUT)
    result = pytester.runpytest("-rs", *quick_options)
    result.assert_outcomes(skipped=1)
    assert "sdpa_flash: scaled_dot_product_attention has no flash kernel for this model's attention on cpu" in \
        result.stdout.str()


WITH_DROPOUT = """
import functools
import pytest
import torch
from torch import nn
from trainbench import TrainingSpec, classification_loss


def net():
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Dropout(0.3), nn.Linear(64, 10))


SPEC = TrainingSpec(name="dropout_mlp", model=net, loss_fn=classification_loss, batch_size=16,
                    optimizer=functools.partial(torch.optim.SGD, lr=0.1),
                    batches=lambda n, gen: (torch.randn(n, 32, generator=gen), torch.randint(0, 10, (n,), generator=gen)))


@pytest.mark.parametrize("recipe", ["baseline", "grad_accumulation", "set_to_none"])
def test_dropout(train_bench, recipe):
    train_bench(recipe, SPEC)
"""


def test_accumulation_on_a_model_with_dropout_is_guarded_with_its_masks_out_of_the_way(pytester, quick_options):
    """A batch split into micro-batches draws other dropout masks than the batch whole: the accumulation guard failed
    on any model with dropout (a standard BERT), naming neither. Its seeded runs now switch dropout off on both
    sides, and its checks say so; a recipe that splits nothing keeps its dropout."""
    pytester.makepyfile(test_dropout=WITH_DROPOUT)
    result = pytester.runpytest(*quick_options, "--benchmark-json=out.json")
    result.assert_outcomes(passed=3)
    import json

    records = {b["extra_info"]["case"]: b["extra_info"] for b in json.loads((pytester.path / "out.json").read_text())[
        "benchmarks"]}
    checks = records["dropout_mlp-grad_accumulation"]["guard"]["checks"]
    assert {c["kind"] for c in checks} == {"loss", "gradients"} and all(c["ok"] for c in checks), checks
    assert all("with dropout off on both sides: the model's dropout (2) draws other random masks for a batch split "
               "into 4" in c["message"] for c in checks)
    assert all("dropout" not in c["message"] for c in records["dropout_mlp-set_to_none"]["guard"]["checks"])


def test_recipe_params_take_names_or_a_list_of_them():
    from trainbench.plugin import recipe_params

    assert [p.id for p in recipe_params(["baseline", "compile"])] == ["baseline", "compile"]  # was unhashable: list
    assert [p.id for p in recipe_params("baseline", "compile")] == ["baseline", "compile"]
    with pytest.raises(TypeError, match="recipe_params: 3: expected recipe names"):
        recipe_params(["baseline", 3])


CHECKPOINTS_ALREADY = """
import functools
import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from trainbench import TrainingSpec, classification_loss


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(32, 32), nn.GELU()) for _ in range(3))
        self.gradient_checkpointing = True  # as Hugging Face's gradient_checkpointing_enable() leaves an encoder

    def forward(self, x):
        for layer in self.layers:
            x = checkpoint(layer, x, use_reentrant=False) if self.gradient_checkpointing else layer(x)
        return x


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder, self.head = Encoder(), nn.Linear(32, 10)

    def forward(self, x):
        return self.head(self.encoder(x))


SPEC = TrainingSpec(name="ckpt_mlp", model=Net, loss_fn=classification_loss, batch_size=16,
                    optimizer=functools.partial(torch.optim.SGD, lr=0.1), checkpoint_blocks=["encoder.layers.0"],
                    batches=lambda n, gen: (torch.randn(n, 32, generator=gen), torch.randint(0, 10, (n,), generator=gen)))


@pytest.mark.parametrize("recipe", ["baseline", "checkpointing"])
def test_ckpt(train_bench, recipe):
    train_bench(recipe, SPEC)
"""


CHANNELS_LAST_ALREADY = """
import functools
import pytest
import torch
from torch import nn
from trainbench import TrainingSpec, classification_loss


def net():
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))
    return model.to(memory_format=torch.channels_last)  # as the project trains it


SPEC = TrainingSpec(name="nhwc", model=net, loss_fn=classification_loss, batch_size=8,
                    optimizer=functools.partial(torch.optim.SGD, lr=0.1),
                    batches=lambda n, gen: (torch.randn(n, 3, 16, 16, generator=gen), torch.randint(0, 10, (n,), generator=gen)))


@pytest.mark.parametrize("recipe", ["baseline", "channels_last", "channels_last_amp"])
def test_nhwc(train_bench, recipe):
    train_bench(recipe, SPEC)
"""


def test_channels_last_on_a_model_that_is_channels_last_already_is_skipped_with_why(pytester, quick_options):
    pytester.makepyfile(test_nhwc=CHANNELS_LAST_ALREADY)
    result = pytester.runpytest("-rs", *quick_options)
    bf16 = CpuBackend(torch.device("cpu")).supports_bf16()  # channels_last_amp: autocast to bf16 on the CPU
    result.assert_outcomes(passed=2 if bf16 else 1, skipped=1 if bf16 else 2)
    assert "channels_last: the model is channels-last already (its convolution weights are NHWC)" in \
        result.stdout.str()


MODULE_MADE_IN_FORWARD = """
import functools
import torch
from torch import nn
from trainbench import TrainingSpec, classification_loss


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body, self.head = nn.Linear(32, 32), nn.Linear(32, 10)

    def forward(self, x):
        scale = nn.Linear(32, 32)  # made in forward, gone by backward (as a model's own checkpointing can leave it)
        return self.head(scale(self.body(x)))


SPEC = TrainingSpec(name="temp_mlp", model=Net, loss_fn=classification_loss, batch_size=16,
                    optimizer=functools.partial(torch.optim.SGD, lr=0.1),
                    batches=lambda n, gen: (torch.randn(n, 32, generator=gen), torch.randint(0, 10, (n,), generator=gen)))


def test_temp(train_bench):
    train_bench("baseline", SPEC)
"""


def test_a_module_gone_by_backward_prints_no_tracker_warnings(pytester, attributed_options):
    """PyTorch's module tracker warned "Module is None. Skipping PRE_BW hook" for each such module and step, in the
    memory breakdown and the op sites alike (17 lines a case on a Hugging Face model that checkpoints)."""
    pytester.makepyfile(test_temp=MODULE_MADE_IN_FORWARD)
    result = pytester.runpytest("-rs", *attributed_options)
    result.assert_outcomes(passed=1)
    assert "Module is None" not in result.stdout.str()


def test_checkpointing_a_model_that_checkpoints_already_is_skipped_with_why(pytester, quick_options):
    """A Hugging Face model after gradient_checkpointing_enable(): the recipe measured the same activations as its
    baseline and said nothing."""
    pytester.makepyfile(test_ckpt=CHECKPOINTS_ALREADY)
    result = pytester.runpytest("-rs", *quick_options)
    result.assert_outcomes(passed=1, skipped=1)
    assert ("the model checkpoints already (gradient_checkpointing on encoder): recomputing its blocks again changes "
            "nothing the baseline does not do") in result.stdout.str()
