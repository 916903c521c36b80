"""The measurement method: round boundaries, arithmetic, memory breakdown, work signals."""

import contextlib
import dataclasses

import pytest
import torch

from trainbench.core.setups import training as training_module
from trainbench.core.harness.costs import case_ledger
from trainbench.core.analyses.step_memory import StepMemory
from trainbench.core.analyses.step_work import _OpCounter
from trainbench.core.method.measure import Measurer, MeasureSettings, run_rounds
from trainbench.core.setups.recipes import TrainConfig, get_recipe
from trainbench.core.records.result import MIB
from trainbench.core.setups.training import TrainingSetup
from trainbench.core.setups.workloads import resolve_spec
from trainbench.devices.device import CpuBackend

MLP_PARAMS = 3072 * 256 + 256 + 256 * 10 + 10  # Flatten -> Linear(3072, 256) -> ReLU -> Linear(256, 10)


class RecordingBackend(CpuBackend):
    """A CPU backend that logs every synchronize, to check where the harness syncs."""

    def __init__(self, log):
        super().__init__(torch.device("cpu"))
        self.log = log

    def synchronize(self):
        self.log.append("sync")


def _log_each_step(training, log, entry):
    """Wrap ``training.step`` so that each call first appends ``entry()`` to ``log``."""
    real_step = training.step

    def step(batch):
        log.append(entry())
        return real_step(batch)

    training.step = step


@contextlib.contextmanager
def _warmed_up_with_a_log(mlp, quick, backend=RecordingBackend):
    """A warmed-up Measurer of the MLP whose backend and steps write to ``log`` (cleared after the warm-up)."""
    log = []
    with TrainingSetup(TrainConfig(), mlp, backend(log)) as training:
        _log_each_step(training, log, lambda: "step")
        m = Measurer(training, "mlp-baseline", "baseline", quick)
        m.warm_up()
        log.clear()
        yield m, log


def test_rounds_sync_only_at_round_boundaries(mlp, quick):
    with _warmed_up_with_a_log(mlp, quick) as (m, log):
        m.time_rounds()

    rounds, k = quick.rounds, quick.steps_per_round
    assert log == (["sync"] + ["step"] * k + ["sync"]) * rounds
    assert m.result.rounds == rounds and len(m.result.round_step_times_s) == rounds


def test_an_ab_round_rewarms_before_its_timer_starts(mlp, quick):
    with _warmed_up_with_a_log(mlp, quick) as (m, log):
        m.time_one_round(rewarm_steps=2)

    k = quick.steps_per_round
    assert log == ["step"] * 2 + ["sync"] + ["step"] * k + ["sync"]  # the untimed steps come before the timer
    assert len(m.result.round_step_times_s) == 1


def test_passes_that_run_the_step_as_timed_come_before_any_dispatch_mode(mlp, quick, cpu):
    # After one step under a TorchDispatchMode, torch 2.9 runs torch.compile'd code eagerly for
    # good: the allocator peaks and the profiler's call count must see the code as it was timed.
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    log = []
    with TrainingSetup(TrainConfig(), mlp, cpu) as training:
        _log_each_step(training, log, lambda: "mode" if _get_current_dispatch_mode() is not None else "as timed")
        m = Measurer(training, "mlp-baseline", "baseline", quick)
        m.warm_up()
        m.time_rounds()
        log.clear()
        m.measure_after_timing()

    assert "as timed" in log and "mode" in log
    first_mode = log.index("mode")
    assert "as timed" not in log[first_mode:], log
    assert m.result.aten_calls_per_step and m.result.flops_per_step and m.result.memory_breakdown_bytes


def test_the_passes_after_timing_step_with_the_heap_frozen_and_leave_the_collector_as_they_found_it(mlp, quick, cpu,
                                                                                                      monkeypatch):
    import gc

    from trainbench.core.analyses import step_memory
    from trainbench.core.analyses.step_memory import heap_frozen

    log = []
    gc.unfreeze()  # this suite freezes the heap before each test (conftest): a user's session does not
    monkeypatch.setattr(step_memory._HeapFreeze, "elsewhere", False)  # nor has this process seen it frozen by others yet
    try:
        with TrainingSetup(TrainConfig(), mlp, cpu) as training:
            _log_each_step(training, log, gc.get_freeze_count)
            m = Measurer(training, "mlp-baseline", "baseline", quick)
            m.warm_up()
            m.time_rounds()
            timed = list(log)
            m.measure_after_timing()
            after = log[len(timed):]
            assert gc.get_freeze_count() == 0  # unfrozen again once the passes end
        assert timed and not any(timed)  # warm-up and rounds step as the user's loop would
        assert after and all(after)  # the profiler's, growth's, MemTracker's and the counters' steps
        # Objects someone else froze stay frozen, and nothing more is frozen or unfrozen.
        gc.freeze()
        frozen = gc.get_freeze_count()
        with heap_frozen():
            assert gc.get_freeze_count() == frozen
        assert gc.get_freeze_count() == frozen
        # Once seen frozen by others, the heap is not walked again to count its frozen objects (30 ms per 350k).
        monkeypatch.setattr(gc, "get_freeze_count", lambda: pytest.fail("the frozen objects counted again"))
        with heap_frozen():
            pass
        assert step_memory._HeapFreeze.elsewhere
    finally:
        gc.freeze()


def test_a_setup_running_a_profiler_of_its_own_gets_no_call_or_kernel_count(mlp, quick, cpu, monkeypatch):
    # NVTX needs CUDA: a stand-in keeps the setup's debug mode while starting nothing, so the skip
    # must come from the mode itself.
    monkeypatch.setattr(torch.autograd.profiler, "emit_nvtx", lambda **kwargs: contextlib.nullcontext())
    with TrainingSetup(TrainConfig(debug="emit_nvtx"), mlp, cpu) as training:
        m = Measurer(training, "mlp-emit_nvtx", "emit_nvtx", quick)
        m.warm_up()
        m.count_calls()
    assert m.result.aten_calls_per_step is None and m.result.kernels_per_step is None
    assert "aten call count skipped: a profiler is already running" in m.result.notes


class SteppedCpuClock(RecordingBackend):
    """A backend whose CPU clock advances 30 ms per logged step: CPU time per step is known exactly."""

    def cpu_clock(self):
        return 0.030 * self.log.count("step")


def test_cpu_time_per_step_is_read_at_each_rounds_boundaries(mlp, quick):
    with _warmed_up_with_a_log(mlp, quick, SteppedCpuClock) as (m, _):
        m.time_rounds()
        assert m.result.round_cpu_times_s == pytest.approx([0.030] * quick.rounds)
        m.time_one_round(rewarm_steps=2)  # the untimed steps are outside the round's CPU time too
        assert m.result.round_cpu_times_s == pytest.approx([0.030] * (quick.rounds + 1))
    assert m.result.metrics()["cpu_time_ms"] == pytest.approx(30.0)


def test_a_device_without_a_cpu_clock_records_no_cpu_time(mlp, quick):
    with _warmed_up_with_a_log(mlp, quick) as (m, log):
        m.backend.cpu_clock = lambda: None  # a CUDA host spins in synchronize: its CPU time is wall time
        m.time_rounds()
    assert m.result.round_cpu_times_s == [] and m.result.metrics()["cpu_time_ms"] is None


def test_run_rounds_divides_each_round_by_its_steps():
    ticks = iter([0.0, 1.0, 1.0, 4.0])  # two rounds lasting 1 s and 3 s
    calls = []
    times = run_rounds(lambda: calls.append(1), rounds=2, steps_per_round=4, timer=lambda: next(ticks))
    assert times == [0.25, 0.75]
    assert len(calls) == 8


def test_memory_breakdown_of_a_known_model(measured):
    small = measured("baseline", batch_size=16)
    large = measured("baseline", batch_size=32)
    bd = small.memory_breakdown_bytes
    # float32 parameters, one gradient each and one SGD momentum buffer each: exact.
    assert bd["params"] == MLP_PARAMS * 4
    assert bd["grads"] == MLP_PARAMS * 4
    assert bd["optimizer_state"] == MLP_PARAMS * 4
    assert large.memory_breakdown_bytes["params"] == bd["params"]
    # Activations grow exactly linearly with the batch (a few bytes of scalars aside).
    per_sample, rem = divmod(large.memory_breakdown_bytes["activations"] - bd["activations"], 16)
    assert rem == 0 and per_sample >= 256 * 4  # at least the hidden layer is kept per sample
    assert 0 <= bd["activations"] - 16 * per_sample < 64
    # Deterministic: a second run gives the same bytes.
    again = measured("baseline", batch_size=16)
    assert again.memory_breakdown_bytes == bd
    assert small.metrics()["tracked_peak_mib"] == pytest.approx(bd["total"] / MIB)


@pytest.mark.parametrize(("workload", "recipe"), [("mlp", "baseline"), ("mlp", "set_to_none"), ("transformer", "amp_bf16"),
                                                ("gpt", "optimizer_foreach")])
def test_the_breakdown_by_storage_identity_is_memtrackers_where_both_follow_the_step(cpu, profile, workload, recipe):
    # The breakdown of steps MemTracker cannot follow (a custom step, a module called again outside the root's
    # forward) is kept by storage identity, no module hooks: the same figures, category by category, as MemTracker's.
    config = get_recipe(recipe).config(profile, batch_size=4)
    if config.amp == "bf16" and not cpu.supports_bf16():
        pytest.skip("this CPU has no bfloat16")
    with TrainingSetup(config, resolve_spec(workload, profile), cpu) as training:
        batches = training.batches()
        for _ in range(2):  # optimizer state exists, gradients as the recipe leaves them between steps
            training.step(training.fetch(batches))
        memory = StepMemory(training)
        by_identity, by_memtracker = memory.storage_breakdown(), memory.memtracker_breakdown()
    assert by_memtracker.pop("other") == 0
    assert by_identity == by_memtracker and by_identity["activations"] > 0


@pytest.mark.parametrize(("workload", "recipe"), [("mlp", "baseline"), ("transformer", "checkpointing"),
                                                ("gpt", "grad_accumulation")])
def test_memtracker_updating_only_its_global_peak_gives_the_stock_trackers_breakdown(cpu, profile, workload, recipe,
                                                                                     monkeypatch):
    # The per-module peaks the stock tracker updates after every op are never read: without them, the same figures.
    from trainbench.core.analyses import step_memory

    with TrainingSetup(get_recipe(recipe).config(profile, batch_size=4), resolve_spec(workload, profile), cpu) as training:
        batches = training.batches()
        for _ in range(2):
            training.step(training.fetch(batches))
        changed = []
        monkeypatch.setattr(step_memory, "global_peak_only", lambda tracker: changed.append(tracker) or False)
        stock = StepMemory(training).memtracker_breakdown()
        monkeypatch.undo()
        fast = StepMemory(training).memtracker_breakdown()
    assert len(changed) == 1 and stock == fast and fast["activations"] > 0


def test_a_tracker_that_keeps_its_peak_under_other_names_keeps_its_own_update():
    from trainbench.core.analyses.step_memory import global_peak_only

    class Renamed:  # what a torch that renamed the tracker's modules would hand over
        def _update_peak_stats(self, peak_state):
            return "stock"

    tracker = Renamed()
    assert not global_peak_only(tracker) and tracker._update_peak_stats(None) == "stock"


def test_flops_ops_and_bytes_of_a_known_model(measured):
    r = measured("baseline", batch_size=16)
    b = 16
    forward = 2 * b * (3072 * 256 + 256 * 10)
    # backward: both weight gradients, and the input gradient of the second layer only
    # (the first layer's input is data and needs none).
    backward = 2 * b * (3072 * 256 + 256 * 10) + 2 * b * 256 * 10
    assert r.flops_per_step == forward + backward
    assert r.h2d_bytes_per_sample == 3 * 32 * 32 * 4 + 8  # float32 image + int64 label
    assert r.syncs_per_step == 0
    assert r.ops_per_step > 0

    u8 = measured("uint8_transfer", batch_size=16)
    assert u8.h2d_bytes_per_sample == 3 * 32 * 32 + 8


def test_a_step_that_runs_the_forward_twice_is_measured_with_the_extra_work(measured, monkeypatch):
    # e.g. a loss recomputed for logging: the memory tracker must not stop at the second forward
    once = measured("baseline", batch_size=16)
    single_loss = TrainingSetup._loss

    def loss_computed_twice(self, batch, **where):
        single_loss(self, batch, **where)
        return single_loss(self, batch, **where)

    monkeypatch.setattr(TrainingSetup, "_loss", loss_computed_twice)
    twice = measured("baseline", batch_size=16)
    forward = 2 * 16 * (3072 * 256 + 256 * 10)
    assert twice.flops_per_step == once.flops_per_step + forward
    assert twice.ops_per_step > once.ops_per_step
    assert twice.memory_breakdown_bytes["params"] == once.memory_breakdown_bytes["params"]
    assert twice.memory_growth_bytes_per_step == 0


def test_set_to_none_drops_one_zero_op_per_parameter(measured, attributed):
    zeros = measured("baseline", "mlp", settings=attributed)
    none = measured("set_to_none", "mlp", settings=attributed)
    assert zeros.attribution["ops"].get("aten.zero_") == 4  # two weights, two biases
    assert "aten.zero_" not in none.attribution["ops"]
    assert none.ops_per_step < zeros.ops_per_step


def test_grad_scaler_costs_a_host_sync_per_step(measured):
    r = measured("baseline", "mlp", amp="bf16", grad_scaler=True)
    assert r.syncs_per_step >= 1  # GradScaler.step reads found_inf on the host


def test_warmup_runs_recipe_extra_steps_and_reports_first_step(training):
    settings = MeasureSettings(min_warmup_steps=2, max_warmup_steps=2, steady_window=1, rounds=1,
                               steps_per_round=1, breakdown=False, work=False)
    with training() as setup:
        m = Measurer(setup, "c", "r", settings, extra_warmup_steps=3)
        m.warm_up()
    assert m.result.warmup_steps == 5
    assert m.result.first_step_s > 0
    assert not m.result.warmup_steady and m.result.notes  # never reached a steady window


def test_multiprocess_loading_starts_persistent_workers(measured, quick):
    r = measured("multiprocess_loading", "mlp")
    assert r.config["num_workers"] == 2
    assert r.samples_per_s > 0
    assert r.warmup_steps >= quick.min_warmup_steps


# -- signals the seed optimizations are judged by ----------------------------------------

@pytest.fixture
def metrics_of(measured):
    return lambda recipe, workload="mlp", **overrides: measured(recipe, workload, **overrides).metrics()


@pytest.fixture(scope="module")
def _resnet18_measured():
    return {}


@pytest.fixture
def resnet18_metrics(metrics_of, _resnet18_measured, quick):
    """``resnet18_metrics(recipe)``: the memory pass's metrics of a resnet18 case (all these tests read), measured
    once for the module after one timed step (tests only read them; a resnet18 case is most of this module's time)."""
    memory_only = dataclasses.replace(quick, passes=("memory",), rounds=1, steps_per_round=1)

    def get(recipe):
        if recipe not in _resnet18_measured:
            _resnet18_measured[recipe] = metrics_of(recipe, "resnet18", settings=memory_only)
        return _resnet18_measured[recipe]

    return get


def test_running_loss_kept_as_a_tensor_keeps_a_graph_per_step(metrics_of):
    leak = metrics_of("loss_leak")
    fixed = metrics_of("loss_detach")
    assert leak["graph_nodes_growth_per_step"] >= 4  # the MLP's backward graph: linear, relu, linear, loss, ...
    assert fixed["graph_nodes_growth_per_step"] == 0
    assert fixed["memory_growth_mib_per_step"] == 0 and fixed["syncs_per_step"] == 0


def test_item_every_step_syncs_every_step_and_every_n_once_per_n(metrics_of):
    assert metrics_of("loss_item")["syncs_per_step"] == 1
    assert metrics_of("loss_item_every_n")["syncs_per_step"] == pytest.approx(0.1)


def test_a_sum_pending_between_syncs_is_not_growth_at_any_point_of_its_cycle(training, quick):
    with training("loss_item_every_n") as setup:
        m = Measurer(setup, "mlp-loss_item_every_n", "loss_item_every_n", quick)
        m.warm_up()
        batches = setup.batches()
        for offset in range(4):  # start the growth window at different points of the N-step cycle
            for _ in range(offset):
                setup.step(setup.fetch(batches))
            m.measure_memory()
            assert m.result.memory_growth_bytes_per_step == 0, offset


def test_tensors_made_on_the_device_cross_no_bytes(metrics_of):
    assert metrics_of("host_tensors")["h2d_bytes_per_sample"] == 3 * 32 * 32 * 4 + 8
    assert metrics_of("device_tensors")["h2d_bytes_per_sample"] == 0


def test_evaluation_without_autograd_keeps_no_graph(metrics_of, resnet18_metrics):
    autograd = metrics_of("eval_autograd")
    no_grad = metrics_of("eval_no_grad")
    inference = metrics_of("eval_inference_mode")
    assert inference["ops_per_step"] <= no_grad["ops_per_step"] < autograd["ops_per_step"]
    assert no_grad["grad_mib"] in (0, None)
    # On a deep net the graph's saved activations dominate the forward's peak.
    deep_autograd = resnet18_metrics("eval_autograd")
    deep_no_grad = resnet18_metrics("eval_no_grad")
    assert deep_no_grad["activation_mib"] < 0.5 * deep_autograd["activation_mib"]


def test_a_forward_that_never_runs_backward_is_not_a_leak(resnet18_metrics):
    # MemTracker's module hooks keep such a graph alive; growth is counted without them, and the
    # breakdown tracks one step, so evaluation graphs neither show as growth nor pile up in the peak.
    evaluation = resnet18_metrics("eval_autograd")
    training = resnet18_metrics("baseline")
    assert evaluation["memory_growth_mib_per_step"] == 0
    assert evaluation["graph_nodes_growth_per_step"] == 0
    # one forward's saved activations, as in training (not several steps' worth)
    assert evaluation["activation_mib"] == pytest.approx(training["activation_mib"], rel=0.05)


def test_foreach_and_fused_optimizers_dispatch_fewer_ops(metrics_of):
    loop = metrics_of("optimizer_loop")["ops_per_step"]
    assert metrics_of("optimizer_foreach")["ops_per_step"] < loop
    assert metrics_of("optimizer_fused")["ops_per_step"] < loop


def test_anomaly_detection_adds_host_syncs(metrics_of):
    assert metrics_of("anomaly_detection")["syncs_per_step"] > 0


def test_accumulation_counts_every_micro_batch_as_samples(measured):
    r = measured("grad_accumulation", "mlp")
    assert r.batch_size == 64 and r.config["batch_multiplier"] == 4 and r.config["accumulation_steps"] == 4
    assert r.h2d_bytes_per_sample == 3 * 32 * 32 * 4 + 8


# -- what the op counter counts as a host sync ----------------------------------------------------------

class _EveryCopyBlocks(CpuBackend):
    def __init__(self):
        super().__init__(torch.device("cpu"))

    def blocking_copy(self, src, dst_device, non_blocking):
        return True


@pytest.mark.parametrize("copy", [
    lambda x: x.to("cpu", copy=True),
    lambda x: x.to(device="cpu", dtype=torch.float64),
    lambda x: torch.empty(3).copy_(x),
])
def test_the_op_counter_asks_the_backend_which_copies_sync(copy):
    x = torch.randn(3)
    with _OpCounter(_EveryCopyBlocks()) as counter:
        copy(x)
    assert counter.syncs == 1
    with _OpCounter(CpuBackend(torch.device("cpu"))) as counter:
        copy(x)
    assert counter.syncs == 0 and sum(counter.ops.values()) >= 1


def test_the_op_counter_counts_item_as_a_sync_and_a_dtype_cast_as_none():
    x = torch.randn(3)
    with _OpCounter(_EveryCopyBlocks()) as counter:
        x.sum().item()
        x.to(torch.float64)  # no device given: not a transfer
    assert counter.syncs == 1 and counter.ops["aten._to_copy"] == 1 and counter.ops["aten._local_scalar_dense"] == 1


# -- passes a setup's threads escape ---------------------------------------------------------------------

def test_data_parallel_skips_the_passes_its_replica_threads_escape(cpu, profile, quick):
    from trainbench.core.harness.costs import case_ledger
    from trainbench.core.method.measure import Measurer

    with training_module.TrainingSetup(get_recipe("baseline").config(profile), resolve_spec("mlp", profile), cpu) as training:
        # DataParallel needs 2 GPUs; the pass selection only reads the config, so the CPU setup stands in.
        training.config = dataclasses.replace(training.config, parallel="dp", replicas=2)
        m = Measurer(training, "mlp-data_parallel", "data_parallel", quick)
        m.warm_up(settle=False)
        with case_ledger() as ledger:
            m.measure_after_timing()
    assert set(ledger.seconds) == {"peaks", "calls"}
    assert m.result.memory_breakdown_bytes == {} and m.result.flops_per_step is None
    assert m.result.aten_calls_per_step > 0  # the profiler sees every thread
    assert any("DataParallel: no memory breakdown" in note for note in m.result.notes)


def _flops_by_op(model: torch.nn.Module, batch: torch.Tensor) -> dict:
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        model(batch).sum().backward()
    return counter.get_flop_counts()["Global"]


def test_the_convolution_share_of_a_step_tells_a_convnet_from_a_matmul_model():
    from trainbench.devices.caps import convolution_share

    convnet = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), torch.nn.Conv2d(16, 16, 3), torch.nn.Flatten(),
                                  torch.nn.Linear(16 * 4 * 4, 4))
    mlp = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 4))
    assert convolution_share(_flops_by_op(convnet, torch.randn(2, 3, 8, 8))) > 0.9
    assert convolution_share(_flops_by_op(mlp, torch.randn(2, 64))) == 0.0
    assert convolution_share({}) == 0.0  # a step without counted FLOPs


def test_a_mig_slice_records_why_it_has_no_mfu(training, quick):
    from trainbench.core.method.measure import Measurer
    from trainbench.devices import device
    from trainbench.devices.device import CpuBackend

    class MigSlice(CpuBackend):  # a device named as a MIG slice of an H100: the table's H100 row must not apply
        name = "NVIDIA H100 80GB HBM3 MIG 1g.10gb"

        def mfu_peak(self, amp, convolution_share=0.0):
            return "bf16", device.peak_tflops(self.name, "bf16")

    with training("baseline", "mlp", backend=MigSlice(torch.device("cpu"))) as setup:
        measurer = Measurer(setup, "mlp-baseline", "baseline", quick, 0, "cpu")
        measurer.count_work()
    assert measurer.result.peak_tflops is None and measurer.result.metrics()["mfu"] is None
    assert any("MIG slice" in note and "MFU not computed" in note for note in measurer.result.notes)


class _VirtualClock:
    """A backend whose clocks only the measurers' steps move (``drive``): step times a test controls, not the machine's.
    ``cpu``: its CPU clock reads the same time (else it has none)."""

    def __init__(self, cpu: bool = False):
        self.now, self.cpu = 0.0, cpu

    def timer(self) -> float:
        return self.now

    def cpu_clock(self) -> float | None:
        return self.now if self.cpu else None

    def drive(self, measurer: Measurer, step_times) -> None:
        """``measurer`` timed by this clock, each of its steps taking the next of ``step_times`` seconds."""
        times = list(step_times)

        def step():
            self.now += times.pop(0)

        measurer.backend, measurer.timed_step = self, step


@pytest.mark.parametrize("step_times, settings, steps, steady", [
    # steady from the second step: 1 + two windows of 3 (the minimum's steps count towards them)
    ([0.05] + [0.01] * 40, dict(min_warmup_steps=3, max_warmup_steps=30, steady_window=3), 7, True),
    # the GPU profile's: 10 minimum steps, windows of 5
    ([0.05] + [0.01] * 40, dict(min_warmup_steps=10, max_warmup_steps=200, steady_window=5, steady_tolerance=0.05), 11,
     True),
    # slowing down step after step never settles: the limit ends it
    ([0.01 + 0.005 * i for i in range(40)], dict(min_warmup_steps=3, max_warmup_steps=12, steady_window=3), 12, False),
    # a compile-like spell of slow steps after the first: settled two windows after it ends
    ([0.09, 0.04, 0.04, 0.04] + [0.01] * 40, dict(min_warmup_steps=3, max_warmup_steps=30, steady_window=3), 10, True),
    # 1 s steps: two steps already last STEADY_WINDOW_S, so windows of 2 (1 + 2 windows); 0.5 s steps keep 3
    ([5.0] + [1.0] * 40, dict(min_warmup_steps=3, max_warmup_steps=30, steady_window=3), 5, True),
    ([2.0] + [0.5] * 40, dict(min_warmup_steps=3, max_warmup_steps=30, steady_window=3), 7, True),
    # the GPU profile's minimum still holds; a window asked as 1 step stays 1
    ([5.0] + [1.0] * 40, dict(min_warmup_steps=10, max_warmup_steps=200, steady_window=5, steady_tolerance=0.05), 10,
     True),
    ([5.0] + [1.0] * 40, dict(min_warmup_steps=1, max_warmup_steps=30, steady_window=1), 3, True),
])
def test_warm_up_ends_two_steady_windows_after_the_first_step_on_a_virtual_clock(training, step_times, settings, steps,
                                                                                 steady):
    with training() as setup:
        m = Measurer(setup, "c", "r", MeasureSettings(**settings))
        _VirtualClock().drive(m, step_times)
        m.warm_up()
    assert (m.result.warmup_steps, m.result.warmup_steady) == (steps, steady)
    assert m.result.warmup_s == sum(step_times[:steps]) and m.result.first_step_s == step_times[0]


def _interleaved_on_a_virtual_clock(training, settings, case_steps, base_steps, base_in_rounds=False):
    """A case and its baseline (warmed up first) interleaved on a clock only their steps move: (case, baseline)."""
    from trainbench.core.method.measure import interleave_rounds

    clock = _VirtualClock()
    with training() as case_setup, training() as base_setup:
        case = Measurer(case_setup, "mlp-set_to_none", "set_to_none", settings)
        base = Measurer(base_setup, "mlp-baseline", "baseline", settings, baseline=True)
        for m, steps in ((case, case_steps), (base, base_steps)):
            clock.drive(m, steps)
        base.warm_up(in_rounds=base_in_rounds)
        interleave_rounds(case, base)
    return case, base


def test_a_first_time_baselines_warm_up_round_takes_the_cases_round_beside_it(training):
    settings = MeasureSettings(min_warmup_steps=4, max_warmup_steps=12, steady_window=3, rounds=3, steps_per_round=3)
    # the baseline: its minimum, 3 rewarm steps, then a slow first round; the case steady throughout
    base_steps = [0.05, 0.01, 0.01, 0.01] + [0.01] * 3 + [0.02] * 3 + [0.01] * 30
    case, base = _interleaved_on_a_virtual_clock(training, settings, [0.05] + [0.01] * 40, base_steps,
                                                 base_in_rounds=True)
    assert base.result.round_step_times_s == pytest.approx([0.01] * 3) and base.result.warmup_steps == 7
    assert case.result.rounds == 3 and case.result.warmup_steps == 7  # its minimum and the round dropped beside
    assert any("1 round dropped beside its baseline's, which were warm-up" in n for n in case.result.notes)


@pytest.mark.parametrize("case_rounds, warmup_steps, steady, kept", [
    # its first two rounds agree: steady from the minimum's 4 steps, every round timed stands
    ([0.01] * 10, 4, True, [0.01] * 3),
    # a slow first round (an allocator or cache still growing): that pair is warm-up, the next three stand
    ([0.02, 0.01, 0.01, 0.01, 0.01], 7, True, [0.01] * 3),
    # slowing down round after round never settles: the warm-up limit (12 steps) keeps the rounds as they are
    ([0.01 * 1.5 ** i for i in range(10)], 10, False, [0.01 * 1.5 ** i for i in range(2, 5)]),
])
def test_a_paired_case_warms_up_to_its_minimum_and_its_first_rounds_judge_it_steady(training, case_rounds,
                                                                                   warmup_steps, steady, kept):
    settings = MeasureSettings(min_warmup_steps=4, max_warmup_steps=12, steady_window=3, steady_tolerance=0.10,
                               rounds=3, steps_per_round=3)
    # the case: a first step of 0.05 s, three more of 0.01, then its rounds' steps; the baseline: 0.01 s throughout
    case_steps = [0.05, 0.01, 0.01, 0.01] + [t for r in case_rounds for t in [r] * 3]
    case, base = _interleaved_on_a_virtual_clock(training, settings, case_steps, [0.01] * 60)
    assert (case.result.warmup_steps, case.result.warmup_steady) == (warmup_steps, steady)
    assert case.result.round_step_times_s == pytest.approx(kept)
    assert case.result.warmup_s == pytest.approx(sum(case_steps[:warmup_steps]))
    # the baseline's rounds stay paired with the case's: as many, the pairs that were warm-up gone from both
    assert base.result.rounds == case.result.rounds == 3
    assert base.result.warmup_steps == 7 + (warmup_steps - 4)  # its own warm-up and its rounds of the pairs dropped
    dropped = (warmup_steps - 4) // 3
    assert any(f"first {dropped} timed round" in n for n in case.result.notes) == (dropped > 0)
    assert not any("dropped beside its baseline's" in n for n in case.result.notes)  # the case's own rounds were
    assert any("did not settle within 12 steps" in n for n in case.result.notes) == (not steady)


@pytest.mark.parametrize("rounds_asked, case_rounds, warmup_steps, kept", [
    (3, [0.01] * 5, 4, [0.01] * 3),  # steady from its minimum
    (3, [0.02, 0.01, 0.01, 0.01], 7, [0.01] * 3),  # a slow first round: warm-up, one more timed
    (1, [0.01] * 30, 7, [0.01]),  # one round judges nothing: the windows before it do (1 + 2 windows of 3)
])
def test_a_case_alone_is_judged_steady_by_its_rounds_too(training, rounds_asked, case_rounds, warmup_steps, kept):
    settings = MeasureSettings(min_warmup_steps=4, max_warmup_steps=12, steady_window=3, rounds=rounds_asked,
                               steps_per_round=3)
    clock = _VirtualClock(cpu=True)
    with training() as setup, case_ledger(clock=clock.timer) as ledger:
        m = Measurer(setup, "mlp-baseline", "baseline", settings)
        clock.drive(m, [0.05, 0.01, 0.01, 0.01] + [t for r in case_rounds for t in [r] * 3])
        m.warm_up(in_rounds=True)
        m.time_rounds()
    assert m.result.warmup_steps == warmup_steps and m.result.warmup_steady
    # the case's cost too: a round taken as warm-up is the warm-up's seconds, not the rounds'
    assert ledger.seconds["warm-up"] == pytest.approx(m.result.warmup_s)
    assert ledger.seconds["rounds"] == pytest.approx(sum(kept) * 3)
    assert m.result.round_step_times_s == pytest.approx(kept) and m.result.rounds == len(kept)
    assert m.result.round_cpu_times_s == pytest.approx(kept)  # the dropped round's CPU time went with it


def test_an_inference_mode_step_counts_fewer_ops_than_a_no_grad_one(measured, attributed):
    # inference_mode lets composite ops (linear) reach the counters whole; the FLOP counter, entered outside the op
    # counter, must not decompose them before it counts
    no_grad, inference = measured("eval_no_grad", "mlp", settings=attributed), \
        measured("eval_inference_mode", "mlp", settings=attributed)
    assert inference.ops_per_step < no_grad.ops_per_step and inference.flops_per_step == no_grad.flops_per_step
    assert "aten.linear" in inference.attribution["ops"] and "aten.linear" not in no_grad.attribution["ops"]
