"""Budgets file parsing, device fall-back and the one-line verdicts."""

import pytest
import torch

from trainbench.core.records.budgets import BudgetError, Budgets, evaluate, typo_edits
from trainbench.core.records.result import Result
from trainbench.devices.device import CpuBackend, DeviceCaps


def write(tmp_path, text):
    path = tmp_path / "budgets.toml"
    path.write_text(text)
    return path


def result(samples_per_round_time=0.1, activations=10 * 2**20, ops=500, batch=16):
    return Result("mlp-x", "mlp", "x", "cpu", batch_size=batch, config={}, device={}, steps_per_round=1,
                  round_step_times_s=[samples_per_round_time] * 3,
                  memory_breakdown_bytes={"activations": activations, "total": 4 * activations},
                  ops_per_step=ops, flops_per_step=10**9, syncs_per_step=0, h2d_bytes_per_sample=100.0)


H100 = DeviceCaps("cuda", "NVIDIA H100 80GB HBM3", cuda=True, capability=(9, 0), gpu_count=1, bf16=True)
CPU = CpuBackend(torch.device("cpu")).caps()


def test_absolute_and_relative_budgets_pass_and_fail_with_one_line(tmp_path):
    path = write(tmp_path, """
[cpu."mlp-x"]
max_activation_mib = 8
min_speedup = 1.5
max_ops_per_step_ratio = 1.0
""")
    budget = Budgets.load(path).for_case(CPU, "mlp-x")
    current = result(samples_per_round_time=0.1, activations=10 * 2**20, ops=450)
    baseline = result(samples_per_round_time=0.125, activations=10 * 2**20, ops=500)
    verdicts = {v.bound.key: v for v in evaluate(budget, current, baseline)}

    act = verdicts["max_activation_mib"]
    assert not act.ok and act.measured == pytest.approx(10.0)
    assert act.message == "activation_mib: measured 10 MiB vs budget <= 8 MiB (over by 25.0%)"
    speed = verdicts["min_speedup"]
    assert not speed.ok and speed.measured == pytest.approx(1.25)
    assert "samples_per_s ratio vs baseline: measured 1.25 vs budget >= 1.5 (short by 16.7%)" == speed.message
    ops = verdicts["max_ops_per_step_ratio"]
    assert ops.ok and ops.measured == pytest.approx(0.9)
    assert all("\n" not in v.message for v in verdicts.values())


def test_relative_budget_without_a_baseline_fails_instead_of_passing(tmp_path):
    budget = Budgets.load(write(tmp_path, '[cpu."mlp-x"]\nmin_speedup = 1.1\n')).sections["cpu"]["mlp-x"]
    (verdict,) = evaluate(budget, result(), None)
    assert not verdict.ok and "cannot check" in verdict.message


def test_metric_not_measured_on_this_device_fails(tmp_path):
    budget = Budgets.load(write(tmp_path, '[cuda."mlp-x"]\nmax_peak_reserved_mib = 100\n')).sections["cuda"]["mlp-x"]
    (verdict,) = evaluate(budget, result(), None)
    assert not verdict.ok and "not measured on this device" in verdict.message


def test_device_sections_fall_through_per_case_from_name_to_capability_to_cuda(tmp_path):
    path = write(tmp_path, '[sm_90."a"]\nmax_ops_per_step = 1\n[cuda."a"]\nmax_ops_per_step = 9\n'
                           '[cuda."b"]\nmax_ops_per_step = 2\n[cpu."a"]\nmax_ops_per_step = 3\n')
    budgets = Budgets.load(path)
    assert budgets.device_keys(H100) == ["sm_90", "cuda"]
    assert budgets.for_case(H100, "a").bounds[0].limit == 1  # the most specific entry for the case
    assert budgets.for_case(H100, "b").bounds[0].limit == 2  # [sm_90] has no "b": [cuda]'s holds
    assert budgets.device_keys(CPU) == ["cpu"] and budgets.for_case(CPU, "a").bounds[0].limit == 3
    assert Budgets.load(write(tmp_path, '[cpu."a"]\nmax_ops_per_step = 3\n')).device_keys(H100) == []


def test_gate_thresholds_merge_from_cuda_to_the_gpus_own_section(tmp_path):
    path = write(tmp_path, '[cuda."*"]\ncompare_fail = "samples_per_s:10%,peak_memory:5%"\n'
                           '[sm_90."*"]\ncompare_fail = "samples_per_s:3%"\n')
    thresholds = Budgets.load(path).compare_thresholds(H100, "a")
    assert thresholds["samples_per_s"] == pytest.approx(0.03) and thresholds["peak_memory_mib"] == pytest.approx(0.05)


def test_a_missing_budget_says_which_file_and_sections_were_looked_at(tmp_path):
    path = write(tmp_path, '[cpu."a"]\nmax_ops_per_step = 3\n')
    budgets = Budgets.load(path)
    assert budgets.lookup(CPU, "b") == (None, f"no budget for b in [cpu] of {path}")  # every section present, named
    assert budgets.lookup(H100, "a") == (
        None, f"no budget: {path} has no section for NVIDIA H100 80GB HBM3 (looked for [NVIDIA H100 80GB HBM3], [sm_90], [cuda])")
    assert "no budgets file configured" in Budgets.empty().lookup(CPU, "a")[1]


@pytest.mark.parametrize(
    "text, expected",
    [
        ('[cpu."mlp-x"]\nmax_bogus = 1\n', r"\[cpu\.mlp-x\] unknown budget key 'max_bogus'"),
        ('[cpu."mlp-x"]\nmin_speedup = "fast"\n', r"\[cpu\.mlp-x\] min_speedup = 'fast': expected a finite number"),
        ('[cpu."mlp-x"]\nmin_speedup = true\n', r"min_speedup = True: expected a finite number"),
        ('[cpu."mlp-x"]\nmin_speedup = -1\n', r"expected a ratio > 0"),
        ('[cpu."mlp-x"]\nmin_ops_per_step = 9\nmax_ops_per_step = 3\n', r"min_ops_per_step = 9 is above max_ops_per_step = 3"),
        ('[cpu]\n"mlp-x" = 3\n', r"\[cpu\.mlp-x\] must be a table of budget keys"),
        ('cpu = 1\n', r"\[cpu\] must be a table of cases"),
        ('[cpu\n', r"not valid TOML"),
        ('[cpu."mlp-x"]\nnote = 3\n', r"note = 3: expected a string"),
        ('[cpuu."mlp-x"]\nmax_ops_per_step = 3\n', r"unknown device section \[cpuu\].*did you mean \[cpu\]\?"),
        ('[gpu."mlp-x"]\nmax_ops_per_step = 3\n', r"unknown device section \[gpu\] \(.*\): expected cpu, cuda, sm_"),
        # the name a CPU run's "no section for ..." line shows: accepted, it never applied (a CPU answers to [cpu])
        ('["AMD EPYC 7B13"."mlp-x"]\nmax_ops_per_step = 3\n',
         r"unknown device section \[AMD EPYC 7B13\] \(a CPU's name: a CPU answers to \[cpu\] only\)"),
        ('["Intel(R) Xeon(R) CPU @ 2.20GHz"."mlp-x"]\nmax_ops_per_step = 3\n', r"\(a CPU's name: a CPU answers to"),
        ('["nvidia l4"."mlp-x"]\nmax_ops_per_step = 3\n', r"\[nvidia l4\] \(a GPU's name written otherwise: sections "
                                                          r"match it exactly\).*did you mean \[NVIDIA L4\]\?"),
        ('[" NVIDIA L4"."mlp-x"]\nmax_ops_per_step = 3\n', r"did you mean \[NVIDIA L4\]\?"),
        ('["cuda:0"."mlp-x"]\nmax_ops_per_step = 3\n', r"\[cuda:0\] \(neither a device class .*did you mean \[cuda\]\?"),
        ('[cpu."mlp-x"]\nmax_peak_memory_mib = -5\n', r"max_peak_memory_mib = -5: expected a value >= 0"),
        ('[cpu."mlp-x"]\nmin_ops_per_step = -100\n', r"min_ops_per_step = -100: expected a value >= 0"),
        # a CUDA-only metric under [cpu]: no CPU run measures it, so it failed only after measuring
        ('[cpu."mlp-x"]\nmax_kernels_per_step = 500\n', r"max_kernels_per_step: kernels_per_step is measured on CUDA "
                                                       r"devices only .*expected it in a GPU's section"),
        ('[cpu."mlp-x"]\nmax_peak_reserved_mib_ratio = 1.1\n', r"peak_reserved_mib is measured on CUDA devices only"),
    ],
)
def test_malformed_files_name_the_file_and_entry(tmp_path, text, expected):
    path = write(tmp_path, text)
    with pytest.raises(BudgetError, match=expected) as info:
        Budgets.load(path)
    assert str(path) in str(info.value)


def test_budgets_from_text_are_configured_and_found_like_a_files():
    budgets = Budgets.from_text('[cuda."resnet18-amp_bf16"]\nmin_speedup = 0.01\n', source="<smoke>")
    budget, missing = budgets.lookup(H100, "resnet18-amp_bf16")
    assert missing is None and budget.needs_baseline and budget.device_key == "cuda"
    assert "no budget for resnet18-baseline in [cuda] of <smoke>" == budgets.lookup(H100, "resnet18-baseline")[1]
    with pytest.raises(BudgetError, match=r"^<smoke>: \[cuda.x\] unknown budget key 'min_sped'"):
        Budgets.from_text('[cuda.x]\nmin_sped = 1\n', source="<smoke>")
    with pytest.raises(BudgetError, match="^<smoke>: no budgets in it"):
        Budgets.from_text("", source="<smoke>")


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(BudgetError, match="budgets file not found"):
        Budgets.load(tmp_path / "nope.toml")


def test_unreadable_or_empty_files_are_one_line_errors_naming_the_path(tmp_path):
    folder = tmp_path / "budgets.toml"
    folder.mkdir()
    latin1 = tmp_path / "latin1.toml"
    latin1.write_bytes('# caf\xe9\n[cpu."mlp-x"]\nmax_ops_per_step = 3\n'.encode("latin-1"))
    empty, comments = tmp_path / "empty.toml", tmp_path / "comments.toml"
    empty.write_text("")
    comments.write_text("# budgets to come\n")
    for path, expected in [(folder, "cannot read it"), (latin1, "not UTF-8 text"),
                           (empty, "no budgets in it"), (comments, "no budgets in it")]:
        with pytest.raises(BudgetError, match=expected) as info:
            Budgets.load(path)
        message = str(info.value)
        assert message.startswith(f"{path}: ") and "\n" not in message


def test_the_shipped_budgets_file_parses():
    from pathlib import Path

    budgets = Budgets.load(Path(__file__).parents[1] / "benchmarks" / "budgets.toml")
    assert "resnet18-baseline" in budgets.sections["cpu"]
    assert budgets.sections["sm_70"]["resnet18-amp_fp16"].needs_baseline



def test_gpu_names_capabilities_and_cuda_are_device_sections(tmp_path):
    path = write(tmp_path, '["NVIDIA H100 80GB HBM3"."mlp-x"]\nmax_ops_per_step = 3\n[sm_120."mlp-x"]\n'
                           'max_ops_per_step = 3\n[cuda."mlp-x"]\nmax_ops_per_step = 3\n')
    assert set(Budgets.load(path).sections) == {"NVIDIA H100 80GB HBM3", "sm_120", "cuda"}


def test_a_section_is_accepted_exactly_when_some_device_answers_to_it(tmp_path):
    from trainbench.devices.fleet import FLEET

    # every section a device of the fleet, a GPU beyond it (its name as the driver gives it) or this CPU looks for
    outside = [DeviceCaps("cuda", name, cuda=True, capability=(8, 6)) for name in ("NVIDIA RTX A6000", "AMD Instinct MI300X")]
    devices = [DeviceCaps("cuda", gpu.name, cuda=True, capability=gpu.capability) for gpu in FLEET.values()]
    for caps in [*devices, *outside, CPU]:
        text = "".join(f'["{key}"."mlp-x"]\nmax_ops_per_step = 3\n' for key in caps.budget_keys)
        budgets = Budgets.load(write(tmp_path, text))
        assert budgets.device_keys(caps) == caps.budget_keys and caps.budget_keys[0] in (caps.name, "cpu")
    # a GPU whose name can be no section (one word, as some drivers give) looks for none by its name
    assert DeviceCaps("cuda", "gfx90a", cuda=True, capability=(9, 0)).budget_keys == ["sm_90", "cuda"]
    with pytest.raises(BudgetError, match=r"\[gfx90a\] \(neither a device class nor a GPU's full name"):
        Budgets.load(write(tmp_path, '[gfx90a."mlp-x"]\nmax_ops_per_step = 3\n'))
    # this machine's CPU by its own name (what its "no section for ..." line shows): refused, whatever words it has
    with pytest.raises(BudgetError, match=r"unknown device section"):
        Budgets.load(write(tmp_path, f'["{CPU.name}"."mlp-x"]\nmax_ops_per_step = 3\n'))


def test_a_case_id_one_typo_from_a_known_one_is_an_error_and_others_stand(tmp_path):
    from trainbench.core.setups.cases import known_case_ids

    known = known_case_ids()
    assert "gelu_mlp-baseline" in known and "resnet18-ladder003-3_larger_batch" in known
    typo = Budgets.load(write(tmp_path, '[cpu."gelu_mlp-basline"]\nmax_ops_per_step = 3\n'))
    with pytest.raises(BudgetError, match=r'\[cpu\."gelu_mlp-basline"\] names no case; did you mean "gelu_mlp-baseline"'):
        typo.check_case_ids(known)
    fine = Budgets.load(write(tmp_path, '[cpu."*"]\ncompare_fail = "samples_per_s:50%"\n[cpu."gelu_mlp-baseline"]\n'
                                        'max_ops_per_step = 3\n[cpu."my_model-my_recipe"]\nmax_ops_per_step = 3\n'
                                        '[cpu."timm_resnet18-uint8_transfer"]\nmax_ops_per_step = 3\n'
                                        '[cpu."resnet50-baseline"]\nmax_ops_per_step = 3\n'
                                        '[cpu."gpt2-amp_bf16"]\nmax_ops_per_step = 3\n'
                                        '[cpu."mlp-baslin"]\nmax_ops_per_step = 3\n'))
    # the suite's, the wildcard, and users' own cases (known only when they run), one named after a built-in workload,
    # others a number away from a built-in one (another model, not a typo), and one two edits away: it stands until
    # the case it nearly names runs (test_an_entry_two_edits_from_a_case_that_runs_without_a_budget_fails_it)
    fine.check_case_ids(known)


@pytest.mark.parametrize(("written", "meant", "edits"), [
    ("gelu_mlp-basline", "gelu_mlp-baseline", 1), ("mlp-baesline", "mlp-baseline", 1),  # a letter lost, two swapped
    ("mlp-bsaelnie", "mlp-baseline", 2), ("mlp-baslin", "mlp-baseline", 2), ("mlp-amp_fp16", "mlp-amp_bf16", 2),
    ("mlp-basln", "mlp-baseline", None),  # three edits: another name
    ("resnet50-baseline", "resnet18-baseline", None), ("gpt2-baseline", "gpt-baseline", None),  # a number: a model
    ("mlp-amp_bf61", "mlp-amp_bf16", None), ("mlp-baseline", "mlp-baseline", None),
])
def test_a_typo_is_at_most_two_edits_of_letters_or_punctuation(written, meant, edits):
    assert typo_edits(written, meant) == edits
    assert typo_edits(meant, written) == edits


def test_an_entry_two_edits_from_a_case_that_runs_without_a_budget_fails_it(tmp_path):
    from trainbench.core.setups.cases import known_case_ids

    budgets = Budgets.load(write(tmp_path, '[cpu."mlp-baslin"]\nmax_ops_per_step = 3\n[cpu."resnet50-baseline"]\n'
                                           'max_ops_per_step = 3\n[cpu."mlp-amp_bf16"]\nmax_ops_per_step = 3\n'))
    known = known_case_ids()
    assert budgets.misspelling(CPU, "mlp-baseline", known) == (
        f'no budget for mlp-baseline, and [cpu."mlp-baslin"] of {budgets.path} is 2 edits from its id and names no '
        "case: a typo? Correct the entry's id, or give mlp-baseline an entry of its own")
    assert budgets.misspelling(CPU, "resnet18-baseline", known) is None  # resnet50's entry is another model's
    assert budgets.misspelling(CPU, "mlp-amp_fp16", known) is None  # amp_bf16's is a case's own
    assert budgets.misspelling(H100, "mlp-baseline", known) is None  # a GPU looks in no [cpu] entry


def test_a_bound_under_the_wildcard_entry_is_refused_not_silently_unapplied(tmp_path):
    # "*" sets the gate's thresholds for every case; a bound there was accepted and never checked any case
    path = write(tmp_path, '[cpu."*"]\ncompare_fail = "samples_per_s:50%"\nmax_ops_per_step = 3\n')
    with pytest.raises(BudgetError) as raised:
        Budgets.load(path)
    message = str(raised.value)
    assert message.startswith(f'{path}: [cpu.*] max_ops_per_step: a "*" entry holds compare_fail')
    assert "put it under each case" in message and "\n" not in message
    kept = Budgets.load(write(tmp_path, '[cpu."*"]\ncompare_fail = "samples_per_s:50%"\nnote = "why 50%"\n'))
    assert kept.sections["cpu"]["*"].bounds == () and kept.sections["cpu"]["*"].compare_fail


def _non_view_ops_per_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: dict) -> int:
    """aten ops that write data in one training step: a rough count of the kernels a device would launch."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from trainbench.core.setups.workloads import next_token_loss

    class Count(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops += not func.is_view
            return func(*args, **(kwargs or {}))

    def step():
        next_token_loss(model, batch).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # the optimizer's state exists before the counted step
    with Count() as counted:
        step()
    return counted.ops


def test_the_uncalibrated_fused_optimizer_kernel_bound_says_so_and_lies_between_a_rough_count_and_the_loop():
    from pathlib import Path

    from trainbench.core.setups.workloads import _GPT_SIZES, GPT

    entry = Budgets.load(Path(__file__).parents[1] / "benchmarks" / "budgets.toml").sections["cuda"]["gpt-optimizer_fused"]
    assert "not yet calibrated" in entry.note
    [bound] = [b.limit for b in entry.bounds if b.key == "max_kernels_per_step_ratio"]
    # Kernel counts depend on the number of layers and parameters, not on widths: GPT-2 small's depth, narrow.
    gpu = _GPT_SIZES["gpu"]
    counts = {}
    for impl in ("foreach", "fused"):
        torch.manual_seed(0)
        model = GPT(256, 64, gpu["layers"], 4, 32)
        optimizer = torch.optim.AdamW(model.parameters(), **({"foreach": False} if impl == "foreach" else {"fused": True}))
        counts[impl] = _non_view_ops_per_step(model, optimizer, {"input_ids": torch.randint(0, 256, (2, 33))})
    rough = counts["fused"] / counts["foreach"]  # "foreach": False is the per-parameter loop
    assert rough < bound < 1.0, (counts, bound)
