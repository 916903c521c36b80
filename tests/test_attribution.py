"""Where a step's ops, time, FLOPs and memory go (trainbench.core.analyses.attribution), and what a changed verdict names
from it (trainbench.verdicts.explain): the tables add up to the metrics they explain, a planted slow op is named first
with most of the change, a planted leak is named by its module, noise is not named."""

import contextlib
import dataclasses
import functools
import json
import time

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from trainbench.core.records.tables import BETWEEN_OPS, OTHER, OUTSIDE_MODULES, compact, top
from trainbench.core.records.result import CaseRecord, case_record
from trainbench.core.setups.spec import TrainingSpec
from trainbench.verdicts.compare import compare_case
from trainbench.verdicts.explain import LEADS, causes, explanation


class GeluNet(torch.nn.Module):
    def __init__(self, hidden: int = 64):
        super().__init__()
        self.fc1, self.act, self.fc2 = torch.nn.Linear(32, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, 4)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class LeakyNet(GeluNet):
    """GeluNet whose ``leaky`` block keeps every output it makes (with its graph cut): a planted leak."""

    def __init__(self, leak: bool):
        super().__init__()
        self.leaky = Keeper(leak)

    def forward(self, x):
        return self.fc2(self.leaky(self.act(self.fc1(x))))


class Keeper(torch.nn.Module):
    def __init__(self, keep: bool):
        super().__init__()
        self.keep, self.kept = keep, []

    def forward(self, x):
        out = x * 1.0
        if self.keep:
            self.kept.append(out.detach().clone())
        return out


def _spec(model, name="gelu_net") -> TrainingSpec:
    def batches(batch_size, generator):
        return torch.randn(batch_size, 32, generator=generator), torch.randint(0, 4, (batch_size,), generator=generator)

    return TrainingSpec(name, model, optimizer=functools.partial(torch.optim.SGD, lr=0.01),
                        loss_fn=lambda m, b: torch.nn.functional.cross_entropy(m(b[0]), b[1]), batches=batches,
                        batch_size=8)


@pytest.fixture(scope="session")
def quick(quick):
    """This module reads the attribution tables: its quick settings record them."""
    return dataclasses.replace(quick, attribution=True)


@pytest.fixture
def run_spec(cpu, profile, quick):
    """``run_spec(spec, recipe="baseline", settings=quick)``: the Result of the whole method on a spec."""
    from trainbench.core.method.measure import measure
    from trainbench.core.setups.recipes import get_recipe
    from trainbench.core.setups.training import TrainingSetup

    def run(spec, recipe="baseline", settings=None):
        with TrainingSetup(get_recipe(recipe).config(profile), spec, cpu) as setup:
            return measure(setup, f"{spec.name}-{recipe}", recipe, settings or quick, 0, profile.name)

    return run


@contextlib.contextmanager
def slow_gelu(ms: float):
    """``aten::gelu`` on the CPU, patched: the same values from other ops, then ``ms`` of sleep (a margin no load on
    the machine can take away, and no change to any other op)."""
    library = torch.library.Library("aten", "IMPL")

    def gelu(x, approximate="none"):
        out = 0.5 * x * (1.0 + torch.erf(x / 2**0.5))
        time.sleep(ms / 1e3)
        return out

    library.impl("gelu", gelu, "CPU")
    try:
        yield
    finally:
        library._destroy()


# -- recording -------------------------------------------------------------------------------------

def test_the_tables_add_up_to_the_metrics_they_explain(measured):
    result = measured("baseline", "mlp")
    tables = result.attribution
    assert sum(tables["ops"].values()) == result.ops_per_step
    assert sum(tables["ops_by_site"].values()) == result.ops_per_step
    assert sum(tables["flops"].values()) == result.flops_per_step
    profiled = tables["time"]
    assert sum(n for op, n in profiled["calls"].items() if op.startswith("aten::")) == result.aten_calls_per_step
    for step, wall in enumerate(profiled["wall_ms"]):  # the rows, (outside ops) included, are the step's wall time
        assert sum(series[step] for series in profiled["ops_ms"].values()) == pytest.approx(wall, rel=1e-6)
    assert "aten::mm" in profiled["ops_ms"] and BETWEEN_OPS in profiled["ops_ms"]
    # sites: the model's modules by ModTracker's names, the optimizer step, and what runs outside any module
    assert {"Sequential.1", "Sequential.1 (backward)", "optimizer step"} <= set(tables["ops_by_site"])
    assert tables["memory"]["kept_bytes_per_step"] == {}  # no leak, nothing kept
    assert sum(tables["memory"]["param_bytes"].values()) == result.memory_breakdown_bytes["params"]
    assert tables["memory"]["param_bytes"]["Sequential.1"] == (3072 * 256 + 256) * 4  # Linear(3072, 256), fp32


def test_a_leak_is_recorded_at_the_module_that_keeps_it(run_spec):
    leaking = run_spec(_spec(lambda: LeakyNet(leak=True)))
    kept = leaking.attribution["memory"]["kept_bytes_per_step"]
    assert kept == {"LeakyNet.leaky": 8 * 64 * 4}  # one (8, 64) float32 output per step
    assert leaking.memory_growth_bytes_per_step == sum(kept.values())
    assert run_spec(_spec(lambda: LeakyNet(leak=False))).attribution["memory"]["kept_bytes_per_step"] == {}


def test_attribution_off_records_nothing_and_profiles_one_step(measured, quick):
    result = measured("baseline", "mlp", settings=dataclasses.replace(quick, attribution=False))
    assert result.attribution is None
    assert result.aten_calls_per_step > 0 and result.ops_per_step > 0  # the metrics themselves are still measured
    assert case_record(result)["attribution"] is None


def test_a_compiled_setup_gets_no_module_sites(run_spec, monkeypatch):
    from trainbench.core.setups.recipes import TrainConfig

    monkeypatch.setattr(TrainConfig, "compiles", property(lambda self: True))  # as compiled, without compiling
    result = run_spec(_spec(GeluNet))
    assert "ops_by_site" not in result.attribution and "memory" not in result.attribution
    assert any("no module sites" in note for note in result.notes)
    assert result.attribution["ops"] and result.attribution["time"]["ops_ms"]


@given(st.dictionaries(st.text(min_size=1, max_size=4), st.integers(-50, 50), max_size=40), st.integers(1, 10))
def test_a_saved_table_keeps_its_top_rows_and_its_total(table, n):
    kept = top(table, n)
    assert sum(kept.values()) == sum(table.values())
    assert len(kept) <= n + 1
    assert all(kept[row] == table[row] for row in kept if row != OTHER)


def test_a_saved_case_keeps_its_tables_small(measured, quick):
    # A deep net's tables, whatever its batch: their rows are its ops and modules.
    result = measured("baseline", "resnet18", settings=dataclasses.replace(quick, rounds=1, steps_per_round=1),
                      batch_size=8)
    whole, saved = result.attribution, case_record(result)["attribution"]
    assert saved == compact(whole)
    assert len(json.dumps(saved)) < 6000 < len(json.dumps(whole))
    for step, wall in enumerate(saved["time"]["wall_ms"]):  # the folded rows still add up
        assert sum(series[step] for series in saved["time"]["ops_ms"].values()) == pytest.approx(wall, rel=1e-6)


# -- explaining -------------------------------------------------------------------------------------

def _timed(rows: dict[str, list[float]]) -> dict:
    return {"time": {"steps": len(next(iter(rows.values()))), "ops_ms": rows}}


def test_the_op_that_slowed_is_named_first_with_its_share_and_noise_is_not():
    # 4 profiled steps a side (measure's profiled_steps): the fewest whose interval can place a row's change
    base = _timed({"aten::mm": [5.0, 5.1, 4.9, 5.0], "aten::gelu": [1.0, 1.1, 0.9, 1.0],
                   "aten::add_": [2.0, 2.6, 1.4, 2.1], BETWEEN_OPS: [1.0, 1.0, 1.0, 1.0]})
    head = _timed({"aten::mm": [5.0, 5.1, 4.9, 5.0], "aten::gelu": [11.0, 11.2, 10.9, 11.0],
                   "aten::add_": [2.3, 1.5, 2.4, 2.0], BETWEEN_OPS: [1.0, 1.0, 1.0, 1.0]})
    found = causes("step_time_ms", base, head)
    assert [c.row for c in found] == ["aten::gelu"]  # add_ moved +0.3 within its scatter: not named
    gelu = found[0]
    assert gelu.change == pytest.approx(10.0) and gelu.ci[0] > 0 and gelu.share > 0.9
    assert explanation("step_time_ms", base, head)[0].startswith("op self time: aten::gelu +10 ms/step (95% CI")


def test_paired_samples_are_judged_by_their_differences():
    # Both sides drift together from pair to pair; the paired differences are steady, the sides' spread is not.
    drift = [0.0, 3.0, 6.0, 9.0, 12.0, 15.0]
    base = _timed({"aten::mm": [5.0 + d for d in drift], "aten::relu": [1.0] * 6})
    head = _timed({"aten::mm": [5.5 + d for d in drift], "aten::relu": [1.0] * 6})
    assert causes("step_time_ms", base, head) == []  # unpaired, the shift is lost in the drift
    paired = causes("step_time_ms", base, head, paired=True)
    assert [c.row for c in paired] == ["aten::mm"] and paired[0].ci == pytest.approx((0.5, 0.5))


def _steps(*ms: float) -> list[float]:
    return [t / 1e3 for t in ms]


STEADY = _timed({"aten::mm": [5.0, 5.1, 4.9, 5.0], BETWEEN_OPS: [1.0, 1.05, 0.95, 1.0]})
DRIFTED = _timed({"aten::mm": [5.3, 5.4, 5.35, 5.3], BETWEEN_OPS: [1.1, 1.15, 1.05, 1.1]})  # +0.4 ms/step, beyond noise
SLOWED = _timed({"aten::mm": [10.0, 10.1, 9.9, 10.0], BETWEEN_OPS: [1.0, 1.05, 0.95, 1.0]})  # +5 ms/step in aten::mm


@pytest.mark.parametrize("base, head, slower, shown", [
    (STEADY, STEADY, True, "their time moved +0 ms/step"),  # did not move
    (STEADY, SLOWED, False, "their time moved +5 ms/step"),  # moved, the other way
    (STEADY, DRIFTED, True, "against +5 ms/step in the rounds"),  # moved the right way, a tenth as far
])
def test_a_timed_change_the_profiled_steps_do_not_show_names_no_op(base, head, slower, shown):
    rounds_s = (_steps(6.0, 6.1, 5.9, 6.0), _steps(11.0, 11.1, 10.9, 11.0) if slower else _steps(1.0, 1.1, 0.9, 1.0))
    line, *_ = explanation("step_time_ms", base, head, slower=slower, rounds_s=rounds_s)
    assert line.startswith("where: the profiled steps do not show the change") and shown in line, line


def test_rows_that_moved_the_verdicts_way_are_leads_under_a_change_the_steps_do_not_show():
    # The gate's planted wait beside ops that drifted the other way between two sessions: the steps' total moved
    # the other way, the wait outside every op stands out; a row that moved a thirtieth as far as the rounds is no
    # lead (relu: +0.1 ms beyond its noise), and nothing is named where nothing moved the verdict's way.
    base = _timed({"aten::mm": [9.0, 9.1, 8.9, 9.0], "aten::relu": [0.5, 0.51, 0.49, 0.5],
                   BETWEEN_OPS: [1.0, 1.05, 0.95, 1.0]})
    head = _timed({"aten::mm": [5.0, 5.1, 4.9, 5.0], "aten::relu": [0.6, 0.61, 0.59, 0.6],
                   BETWEEN_OPS: [4.0, 4.05, 3.95, 4.0]})
    rounds_s = (_steps(12.0, 12.1, 11.9), _steps(15.0, 15.1, 14.9))
    assert explanation("step_time_ms", base, head, slower=True, rounds_s=rounds_s)[1:] == (
        LEADS, f"  op self time: {BETWEEN_OPS} +3 ms/step (95% CI +2.9..+3.1)")
    assert explanation("step_time_ms", STEADY, STEADY, slower=True, rounds_s=rounds_s)[1:] == ()
    assert explanation("step_time_ms", base, head, slower=True)[1:] == ()  # no rounds: no size to weigh a lead by


def test_a_timed_change_the_profiled_steps_show_as_far_as_the_rounds_is_explained():
    rounds_s = (_steps(6.0, 6.1, 5.9, 6.0), _steps(11.0, 11.1, 10.9, 11.0))
    (line,) = explanation("step_time_ms", STEADY, SLOWED, slower=True, rounds_s=rounds_s)
    assert line.startswith("op self time: aten::mm +5 ms/step (95% CI")
    # without the rounds (a caller that has none), the direction beyond noise is all that is asked
    assert explanation("step_time_ms", STEADY, DRIFTED, slower=True)[0].startswith("op self time: aten::mm +0.")


def test_kernels_that_did_not_move_do_not_hide_the_ops_that_did():
    # a host-bound step slowed on the host: the ops' wall time shows it, the kernels' device time does not
    kernels = {"gemm": [3.0, 3.05, 2.95, 3.0]}
    base = {"time": {**STEADY["time"], "kernels_ms": kernels}}
    head = {"time": {**SLOWED["time"], "kernels_ms": kernels}}
    rounds_s = (_steps(6.0, 6.1, 5.9), _steps(11.0, 11.1, 10.9))
    assert explanation("step_time_ms", base, head, slower=True, rounds_s=rounds_s)[0].startswith(
        "op self time: aten::mm +5 ms/step")


def test_counted_tables_name_every_row_that_changed_exactly():
    base = {"ops": {"aten.zero_": 4.0, "aten.mm": 3.0, "aten.add_": 12.0}}
    head = {"ops": {"aten.mm": 3.0, "aten.add_": 12.0}}
    (cause,) = causes("ops_per_step", base, head)
    assert (cause.row, cause.change, cause.share) == ("aten.zero_", -4.0, 1.0)
    assert cause.line() == "ops: aten.zero_ -4 ops/step, 100% of the change"


def test_rows_one_side_folded_are_compared_inside_other_never_against_zero():
    base = {"ops": {"aten.mm": 10.0, "aten.add": 5.0, OTHER: 3.0}}  # aten.relu folded: 3 of them
    head = {"ops": {"aten.mm": 10.0, "aten.relu": 4.0, OTHER: 5.0}}  # aten.add folded
    found = {c.row: c.change for c in causes("ops_per_step", base, head)}
    assert found == {OTHER: 1.0}  # not "aten.relu +4" and "aten.add -5"


def test_a_change_with_no_recorded_tables_says_so():
    assert explanation("step_time_ms", None, _timed({"aten::mm": [1.0]})) == (
        "where: not recorded by the baseline (attribution off, or a run saved before trainbench recorded it)",)
    assert explanation("first_step_s", None, None) == ()  # nothing explains it: no line at all


@pytest.mark.usefixtures("one_thread")
def test_the_gate_names_a_patched_op_first_with_most_of_the_change(run_spec, quick):
    # a one-sided rank test of 5 v 5 rounds can reach p < 0.05; 5 profiled steps a side place each op's change
    spec, settings = _spec(GeluNet), dataclasses.replace(quick, rounds=5, profiled_steps=5)
    base = run_spec(spec, settings=settings)
    with slow_gelu(ms=50):
        slow = run_spec(spec, settings=settings)
    records = [CaseRecord.read(case_record(result), side) for result, side in ((base, "base"), (slow, "head"))]
    comparisons = {c.metric: c for c in compare_case(records[1], records[0], {"step_time_ms": 0.10, "ops_per_step": 0.0})}
    step = comparisons["step_time_ms"]
    assert step.verdict == "regressed", step.describe()
    first = step.explanation[0]
    assert first.startswith("op self time: aten::gelu +")
    share = float(first.rsplit(", ", 1)[1].split("%")[0])
    assert share > 80
    assert all("aten::mm" not in line for line in step.explanation)
    assert comparisons["ops_per_step"].verdict == "unchanged" and comparisons["ops_per_step"].explanation == ()


def test_the_gate_names_a_planted_leak_by_its_module(run_spec):
    base = run_spec(_spec(lambda: LeakyNet(leak=False), "leaky_net"))
    leaking = run_spec(_spec(lambda: LeakyNet(leak=True), "leaky_net"))
    records = [CaseRecord.read(case_record(result), side) for result, side in ((base, "base"), (leaking, "head"))]
    (growth,) = compare_case(records[1], records[0], {"memory_growth_mib_per_step": 0.0})
    assert growth.verdict == "regressed"
    assert growth.explanation[0] == "memory kept per step by site: LeakyNet.leaky +0.00195 MiB/step, 100% of the change"  # 2048 B


def test_outside_modules_is_a_site_of_its_own(measured):
    result = measured("loss_leak", "mlp")  # the running loss keeps each step's graph: made outside any module
    assert OUTSIDE_MODULES in result.attribution["ops_by_site"]


def test_the_allocator_peak_is_split_by_the_users_line_that_asked_for_it():
    from trainbench.core.analyses.attribution import allocator_sites

    def frames(*where):
        return [{"filename": f, "line": n, "name": fn} for f, n, fn in where]

    torch_frame = ("/venv/lib/python3.12/site-packages/torch/nn/modules/linear.py", 125, "forward")
    model = frames(torch_frame, ("/project/models/net.py", 40, "forward"))
    loss = frames(("/project/train.py", 12, "loss_fn"))
    trace = [
        {"action": "alloc", "addr": 1, "size": 100, "frames": model},
        {"action": "alloc", "addr": 2, "size": 300, "frames": loss},
        {"action": "free_requested", "addr": 1, "size": 100, "frames": model},  # not yet given back: still counts
        {"action": "alloc", "addr": 3, "size": 50, "frames": model},  # the peak: 450
        {"action": "free_completed", "addr": 1, "size": 100, "frames": model},
        {"action": "free_completed", "addr": 2, "size": 300, "frames": loss},
        {"action": "alloc", "addr": 4, "size": 200, "frames": []},
        {"action": "free_completed", "addr": 99, "size": 7, "frames": []},  # allocated before the history: ignored
    ]
    assert allocator_sites(trace) == {"train.py:12 (loss_fn)": 300, "net.py:40 (forward)": 150}


def test_a_device_without_an_allocator_records_no_allocator_table(measured):
    assert "allocator_peak_bytes" not in measured("baseline", "mlp").attribution


def test_rows_that_moved_against_the_change_are_named_after_it_with_a_negative_share():
    base = {"memory": {"peak_bytes": {"Net.fc1": 10 * 2**20, "Net.act": 4 * 2**20}}}
    head = {"memory": {"peak_bytes": {"Net.fc1": 20 * 2**20, "Net.act": 0}}}
    assert explanation("tracked_peak_mib", base, head) == (
        "memory at the peak by site: Net.fc1 +10 MiB, 167% of the change",
        "memory at the peak by site: Net.act -4 MiB, -67% of the change")


def test_a_case_whose_sides_lack_the_explaining_tables_says_which():
    no_profile = {"ops": {"aten.mm": 3.0}}  # a recipe running a profiler of its own: no profiled steps of ours
    assert explanation("step_time_ms", no_profile, no_profile, slower=True) == (
        "where: neither side recorded the tables that explain step_time_ms (op self time, kernel time) for this case",)


def test_a_wider_layer_is_named_under_the_parameter_memory_it_adds(run_spec):
    base, wide = run_spec(_spec(GeluNet, "net")), run_spec(_spec(lambda: GeluNet(hidden=128), "net"))
    records = [CaseRecord.read(case_record(result), side) for result, side in ((base, "base"), (wide, "head"))]
    (params,) = compare_case(records[1], records[0], {"param_mib": 0.0})
    assert params.verdict == "regressed"
    # fc1: 64 more outputs of 32 inputs and their biases; fc2: 64 more inputs for each of its 4 outputs
    assert params.explanation[:2] == (f"parameters by module: GeluNet.fc1 +{64 * 33 * 4 / 2**20:.3g} MiB, 89% of the change",
                                      f"parameters by module: GeluNet.fc2 +{64 * 4 * 4 / 2**20:.3g} MiB, 11% of the change")


def _frames(*where):
    return [{"filename": f, "line": n, "name": fn} for f, n, fn in where]


def test_the_users_line_is_found_by_where_files_resolve_not_by_words_in_their_path():
    import sysconfig
    from pathlib import Path

    import trainbench
    from trainbench.core.analyses.attribution import allocation_site, is_framework_file

    ours = str(Path(trainbench.__file__).parent / "training.py")
    library = str(Path(sysconfig.get_paths()["purelib"]) / "timm" / "layers" / "mlp.py")
    stdlib = str(Path(sysconfig.get_paths()["stdlib"]) / "contextlib.py")
    user = "/home/me/trainbench/models/model.py"  # a checkout named after the tool is still the user's code
    assert not any(is_framework_file(f) for f in (user, "/home/me/trainbench-models/model.py", "/srv/torch/train.py"))
    assert all(is_framework_file(f) for f in (ours, library, stdlib, "<frozen runpy>",
                                              "/other/venv/lib/python3.12/site-packages/torch/nn/modules/linear.py"))
    frames = _frames((library, 10, "forward"), (ours, 700, "step"), (stdlib, 80, "inner"), (user, 21, "forward"))
    assert allocation_site(frames) == "model.py:21 (forward)"
    assert allocation_site(_frames((library, 10, "forward"), (stdlib, 80, "inner"))) == "mlp.py:10 (forward)"


def test_backward_allocations_without_python_frames_are_named_by_their_autograd_node():
    from trainbench.core.analyses.attribution import BACKWARD, NO_STACK, allocation_site, allocator_sites

    so = "/venv/lib/python3.12/site-packages/torch/lib/libtorch_cpu.so"
    # As a snapshot with C++ stacks gives an allocation on autograd's device thread: innermost first, no Python frame.
    mm_backward = _frames(("??", 0, "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(...)"),
                          (so, 0, "at::_ops::mm::call(at::Tensor const&, at::Tensor const&)"),
                          (so, 0, "torch::autograd::generated::MmBackward0::apply(std::vector<at::Tensor>&&)"),
                          (so, 0, "torch::autograd::Engine::evaluate_function(...)"),
                          (so, 0, "torch::autograd::Engine::thread_main(...)"))
    accumulate = _frames(("??", 0, "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(...)"),
                         (so, 0, "torch::autograd::AccumulateGrad::apply(std::vector<at::Tensor>&&)"),
                         (so, 0, "torch::autograd::Engine::thread_main(...)"))
    assert allocation_site(mm_backward) == f"{BACKWARD}: MmBackward0"
    assert allocation_site(accumulate) == BACKWARD
    assert allocation_site([]) == NO_STACK
    # a user's custom Function's backward is the user's line, though autograd's engine is below it
    custom = _frames(("/project/ops.py", 30, "backward"), (so, 0, "torch::autograd::PyNode::apply(...)"),
                     (so, 0, "torch::autograd::Engine::thread_main(...)"))
    assert allocation_site(custom) == "ops.py:30 (backward)"
    trace = [{"action": "alloc", "addr": 1, "size": 64, "frames": mm_backward},
             {"action": "alloc", "addr": 2, "size": 32, "frames": accumulate}]
    assert allocator_sites(trace) == {f"{BACKWARD}: MmBackward0": 64, BACKWARD: 32}


def test_a_real_backward_stack_names_its_autograd_node():
    # The frames torch's own unwinder and symbolizer give inside a backward op (CPU: the caller's Python frames below).
    from torch._C._profiler import gather_traceback, symbolize_tracebacks
    from torch.utils._python_dispatch import TorchDispatchMode

    from trainbench.core.analyses.attribution import BACKWARD, allocation_site

    stacks = []

    class Catch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten.mm.default and torch._C._current_graph_task_id() != -1 and not stacks:
                stacks.append(gather_traceback(python=True, script=False, cpp=True))
            return func(*args, **(kwargs or {}))

    layer = torch.nn.Linear(4, 4)
    try:
        with Catch():
            layer(torch.randn(2, 4)).sum().backward()
        (frames,) = symbolize_tracebacks(stacks)
    except RuntimeError as e:  # no C++ unwinder on this platform
        pytest.skip(f"C++ stacks unavailable: {e}")
    catcher = [f for f in frames if f["name"] != "__torch_dispatch__"]  # this test's frame: what an allocator lacks
    assert allocation_site(catcher) == f"{BACKWARD}: AddmmBackward0"
