"""Executing a plan: each way of measuring a case and its baseline, the session's baselines, the guard's inputs."""

import dataclasses
import functools
import types
import weakref

import pytest
import torch

from trainbench.core.records.budgets import Budgets
from trainbench.core.method.measure import Measurer
from trainbench.core.setups.recipes import get_recipe
from trainbench.core.records.result import CaseRecord
from trainbench.core.method.runner import Runner
from trainbench.core.setups.spec import TrainingSpec, classification_loss
from trainbench.core.setups.training import InjectedFault
from trainbench.core.setups.workloads import resolve_spec
from trainbench.devices.device import CpuBackend, PeakMemory


class LoggingBackend(CpuBackend):
    has_allocator_peaks = True  # as a GPU's: the peaks pass runs (and releases cached memory first)
    caching_allocator = True  # as a GPU's: what a freed setup leaves cached is given back before the next

    def __init__(self, log):
        super().__init__(torch.device("cpu"))
        self.log = log

    def release_memory(self):
        self.log.append("release")
        super().release_memory()


@pytest.fixture
def log(monkeypatch):
    entries = []
    real = Measurer.measure_after_timing

    def logged(self):
        entries.append(f"passes {self.result.recipe}")
        real(self)

    monkeypatch.setattr(Measurer, "measure_after_timing", logged)
    return entries


@pytest.fixture
def ratio_budgets(tmp_path):
    path = tmp_path / "budgets.toml"
    path.write_text('[cpu."mlp-set_to_none"]\nmax_ops_per_step_ratio = 0.99\n'
                    '[cpu."mlp-deterministic"]\nmax_ops_per_step_ratio = 1.5\n')
    return Budgets.load(path)


def test_a_ratio_budget_pairs_the_rounds_and_measures_each_setups_memory_alone(log, ratio_budgets, profile, quick):
    runner = Runner(LoggingBackend(log), profile, quick)
    outcome = runner.run("set_to_none", "mlp", budgets=ratio_budgets)
    assert outcome.paired and outcome.speedup is not None and not outcome.failures
    assert len(outcome.result.round_step_times_s) == len(outcome.baseline.round_step_times_s) == quick.rounds
    # what earlier setups left cached goes before the first is built; the baseline's passes before the case is built,
    # the case's after the baseline is freed (each pass set releases cached memory itself before its allocator peaks)
    assert log == ["release", "passes baseline", "release", "release", "passes set_to_none", "release"]
    record = CaseRecord.read(outcome.record(), "mlp-set_to_none")
    assert record.paired and record.speedup_vs_baseline == pytest.approx(outcome.speedup)


def test_on_a_device_without_a_caching_allocator_a_paired_case_runs_no_full_collection(log, ratio_budgets, profile,
                                                                                        quick):
    class CpuLog(LoggingBackend):  # the CPU: no allocator peaks, nothing cached; a collection walks the whole heap
        has_allocator_peaks = caching_allocator = False

    outcome = Runner(CpuLog(log), profile, quick).run("set_to_none", "mlp", budgets=ratio_budgets)
    assert outcome.paired and not outcome.failures
    assert log == ["passes baseline", "passes set_to_none"]


def test_a_baseline_measured_earlier_in_the_session_lends_its_memory_and_work(log, ratio_budgets, profile, quick):
    runner = Runner(LoggingBackend(log), profile, quick)
    runner.run("baseline", "mlp")
    log.clear()
    outcome = runner.run("set_to_none", "mlp", budgets=ratio_budgets)
    # the baseline's own rounds, its earlier passes: nothing cached before its setup, nothing after it, the peaks'
    assert log == ["release", "release", "passes set_to_none", "release"]
    assert outcome.baseline.ops_per_step == runner.results[("mlp", "baseline", ())].ops_per_step
    assert any("earlier measurement" in note for note in outcome.baseline.notes)


def test_a_baseline_settled_earlier_in_the_session_warms_up_once_right_before_the_rounds(cpu, ratio_budgets, profile,
                                                                                          quick, monkeypatch):
    runner = Runner(cpu, profile, dataclasses.replace(quick, min_warmup_steps=2), predict=False)
    runner.run("baseline", "mlp")
    order = []
    for name in ("warm_up", "rewarm", "time_one_round"):
        real = getattr(Measurer, name)
        monkeypatch.setattr(Measurer, name, lambda self, *a, _real=real, _name=name, **k: (
            order.append((self.result.recipe, _name)), _real(self, *a, **k))[1])
    outcome = runner.run("set_to_none", "mlp", budgets=ratio_budgets)
    assert outcome.paired and not outcome.failures
    # its passes are the earlier measurement's: no steps before the case is built, its minimum after the case's warm-up
    assert order[:3] == [("set_to_none", "warm_up"), ("baseline", "warm_up"), ("baseline", "time_one_round")]
    assert ("baseline", "rewarm") not in order
    assert outcome.baseline.warmup_steps == 2
    assert any("settled when measured earlier" in note for note in outcome.baseline.notes)


def test_a_baseline_that_cannot_share_the_process_is_measured_right_after_and_kept(cpu, ratio_budgets, profile, quick):
    runner = Runner(cpu, profile, quick)
    outcome = runner.run("deterministic", "mlp", budgets=ratio_budgets)
    assert not outcome.paired and outcome.baseline is not None and not outcome.failures
    assert ("baseline baseline measured right after, not interleaved (deterministic changes process-wide state)"
            in outcome.result.notes)
    assert runner.results[("mlp", "baseline", ())] is outcome.baseline  # a later case's unpaired reference


def test_a_planted_regression_never_becomes_another_cases_baseline(profile, quick):
    runner = Runner(CpuBackend(torch.device("cpu")), profile, quick, fault=InjectedFault(slowdown=0.1))
    outcome = runner.run("baseline", "mlp")
    assert outcome.result is not None and runner.results == {}


def _loss_failing_after(steps: int, fault):
    """A classification loss whose step ``steps + 1`` on applies ``fault`` (raises, or turns the loss non-finite)."""
    calls = [0]

    def loss(model, batch):
        calls[0] += 1
        value = classification_loss(model, batch)
        return fault(value) if calls[0] > steps else value

    return loss


def _nan(loss):
    return loss * float("nan")


@pytest.mark.parametrize("recipe", ["baseline", "set_to_none"])  # alone, and paired with its baseline
def test_a_loss_that_turns_nan_fails_that_case_naming_the_step_and_the_next_case_runs(recipe, ratio_budgets, cpu,
                                                                                       profile, quick):
    mlp = resolve_spec("mlp", profile)
    runner = Runner(cpu, profile, quick)
    warm_up = quick.min_warmup_steps + quick.max_warmup_steps  # the most warm-up steps quick settings run
    outcome = runner.run(recipe, dataclasses.replace(mlp, loss_fn=_loss_failing_after(warm_up + 1, _nan)),
                         budgets=ratio_budgets)
    assert outcome.result is None and outcome.failures == (outcome.error,)
    assert outcome.error.startswith(f"mlp-{recipe}: the loss of training spec 'mlp' is nan at step ")
    # alone, its warm-up's end was checked too (paired, the case warms up inside the interleaved rounds)
    assert ("(the last timed step; finite when checked at step " if recipe == "baseline" else
            "(the last timed step)") in outcome.error
    assert runner.results == {}  # a diverged setup is no later case's baseline
    assert runner.run("baseline", "mlp").error is None


def test_a_loss_found_non_finite_after_the_rounds_or_in_another_process_fails_the_case(cpu, profile, quick,
                                                                                      monkeypatch):
    # fresh and rank processes return only their result: its final loss is what this process can check
    finish = Measurer.finish
    monkeypatch.setattr(Measurer, "finish", lambda self: finish(self).replace(final_loss=float("inf")))
    outcome = Runner(cpu, profile, quick).run("baseline", "mlp")
    assert outcome.error.startswith("mlp-baseline: the loss of training spec 'mlp' is inf at the end of baseline's "
                                    "measurement (")
    assert f"{quick.rounds} rounds of {quick.steps_per_round})" in outcome.error


@pytest.mark.parametrize("error", [
    RuntimeError("[enforce fail at alloc_cpu.cpp:119] data. DefaultCPUAllocator: can't allocate memory: you tried to "
                 "allocate 1099511627776 bytes. Error code 12 (Cannot allocate memory)"),
    MemoryError(),
])
def test_a_host_out_of_memory_reads_as_a_device_one(error, cpu, profile, quick):
    def out_of_memory(loss):
        raise error

    mlp = resolve_spec("mlp", profile)
    outcome = Runner(cpu, profile, quick).run("baseline", dataclasses.replace(
        mlp, loss_fn=_loss_failing_after(3, out_of_memory)))
    first = str(error).splitlines()[0][:200] if str(error) else "MemoryError"
    assert outcome.error == f"mlp-baseline: out of memory at batch {mlp.batch_size}: {first}"


class _AllocatorBackend(CpuBackend):
    """A CPU backend with allocator peaks, logging when peaks are reset and read and memory is released; at a
    release it notes whether the model ``watched`` points to is gone (after a garbage collection)."""

    def __init__(self):
        super().__init__(torch.device("cpu"))
        self.log, self.watched = [], None

    def reset_peak_memory(self):
        self.log.append("reset peaks")

    def peak_memory(self):
        self.log.append("read peaks")
        return PeakMemory(allocated_bytes=3 * 2**30)

    def release_memory(self):
        super().release_memory()
        freed = self.watched is not None and self.watched() is None
        self.log.append("release (model freed)" if freed else "release (model alive)")


def test_out_of_memory_reads_this_cases_peak_and_releases_memory_once_nothing_holds_the_setup(profile, quick):
    backend = _AllocatorBackend()

    def out_of_memory(model, batch):
        backend.watched = weakref.ref(model)  # the traceback's frames hold the setup, the model with it
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    mlp = resolve_spec("mlp", profile)
    outcome = Runner(backend, profile, quick, predict=False).run("baseline", dataclasses.replace(mlp, loss_fn=out_of_memory))
    assert backend.log == ["reset peaks", "read peaks", "release (model freed)"]
    assert outcome.error == (f"mlp-baseline: out of memory at batch {mlp.batch_size} (peak so far 3.00 GiB): "
                             "CUDA out of memory. Tried to allocate 2.00 GiB")


class KeyValueCachingModel(torch.nn.Module):
    """A causal LM's shape as Hugging Face writes it: each forward gives its blocks a fresh key/value cache when
    ``config.use_cache`` is on, and a block's attention reads the keys cached so far."""

    def __init__(self, use_cache: bool):
        super().__init__()
        self.config = types.SimpleNamespace(use_cache=use_cache)
        self.block = CachingAttention()

    def forward(self, x):
        return self.block(x, [] if self.config.use_cache else None)


class CachingAttention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x, cache):
        keys = self.proj(x)
        if cache is not None:  # a recomputation appends the same keys again: twice as many as queries
            cache.append(keys)
            keys = torch.cat(cache, dim=1)
        causal = torch.ones(x.shape[1], x.shape[1]).tril()
        return (x @ keys.transpose(1, 2) + causal).softmax(-1) @ x


def _caching_spec(use_cache: bool) -> TrainingSpec:
    return TrainingSpec(name="cached_lm", model=lambda: KeyValueCachingModel(use_cache),
                        loss_fn=lambda model, batch: model(batch).square().mean(), batch_size=2,
                        optimizer=functools.partial(torch.optim.SGD, lr=0.1), checkpoint_blocks=["block"],
                        batches=lambda n, gen: torch.randn(n, 8, 4, generator=gen, device=gen.device))


def test_checkpointing_a_model_that_caches_keys_fails_with_its_own_error_and_says_to_turn_the_cache_off(cpu, profile,
                                                                                                        quick):
    runner = Runner(cpu, profile, quick)
    with pytest.raises(RuntimeError, match=r"The size of tensor a \(16\) must match the size of tensor b \(8\)") as raised:
        runner.run("checkpointing", _caching_spec(use_cache=True))
    assert raised.value.__notes__ == [
        "trainbench: cached_lm-checkpointing: set use_cache=False in the model's config (Hugging Face models cache "
        "keys/values, which recomputation breaks)"]
    assert runner.run("checkpointing", _caching_spec(use_cache=False)).error is None  # what the note says fixes it


def _raise_before_the_model(model, batch):
    raise RuntimeError("the user's own bug")


@pytest.mark.parametrize("recipe, use_cache, loss_fn", [
    ("baseline", True, _raise_before_the_model),  # nothing recomputed
    ("checkpointing", True, _raise_before_the_model),  # raised outside the checkpointed block
    ("checkpointing", False, lambda model, batch: model(batch[..., :3]).sum()),  # inside the block, but no cache
])
def test_an_error_outside_a_recomputed_block_or_without_a_cache_gains_no_note(recipe, use_cache, loss_fn, cpu, profile,
                                                                              quick):
    spec = dataclasses.replace(_caching_spec(use_cache), loss_fn=loss_fn)
    with pytest.raises(RuntimeError) as raised:
        Runner(cpu, profile, quick).run(recipe, spec)
    assert not hasattr(raised.value, "__notes__")


class _CachingBackend(CpuBackend):
    """A CPU backend that says it caches freed blocks, logging releases, peak resets and reads in order."""

    caching_allocator = True
    has_allocator_peaks = True

    def __init__(self):
        super().__init__(torch.device("cpu"))
        self.log = []

    def release_memory(self):
        self.log.append("release")
        super().release_memory()

    def reset_peak_memory(self):
        self.log.append("reset peaks")

    def peak_memory(self):
        self.log.append("read peaks")
        return PeakMemory()


def test_each_setup_is_built_and_its_peaks_measured_after_what_earlier_cases_cached_is_released(profile, quick):
    backend = _CachingBackend()
    mlp = resolve_spec("mlp", profile)

    def logged_model():
        backend.log.append("build")
        return mlp.model()

    spec = dataclasses.replace(mlp, name="logged_mlp", model=logged_model)
    runner = Runner(backend, profile, quick, predict=False)
    for recipe in ("baseline", "set_to_none"):  # the second case's setup built after the first's
        backend.log.append(f"case {recipe}")
        runner.run(recipe, spec)
    log = backend.log
    builds = [i for i, entry in enumerate(log) if entry == "build"]
    measured = [i for i in builds if "read peaks" in log[i:]]
    assert measured and all(log[i - 1] == "release" for i in measured), log
    # before each read of the peaks: a release, then the reset, with no setup built in between
    for i, entry in enumerate(log):
        if entry == "read peaks":
            before = log[:i]
            reset = len(before) - 1 - before[::-1].index("reset peaks")
            assert before[reset - 1] == "release" and "build" not in before[reset:], log


def test_a_paired_guarded_case_builds_each_setup_once_for_its_measurement_and_once_for_its_guards(cpu, profile, quick,
                                                                                                monkeypatch):
    from trainbench.core.setups.training import TrainingSetup

    built = []
    real = TrainingSetup.__init__

    def counted(self, config, spec, backend, fault=None, **kwargs):
        built.append(config)
        real(self, config, spec, backend, fault, **kwargs)

    monkeypatch.setattr(TrainingSetup, "__init__", counted)
    budgets = Budgets.from_text('[cpu."mlp-grad_accumulation"]\nmin_speedup = 0.01\n', source="<test>")
    outcome = Runner(cpu, profile, quick, predict=False).run("grad_accumulation", "mlp", budgets=budgets)
    assert outcome.paired and not outcome.failures
    assert [v.kind for v in outcome.guard_checks] == ["loss", "gradients"] and all(v.ok for v in outcome.guard_checks)
    # The case and its baseline measured (both alive while their rounds alternate), then each built again from its
    # seeds for the guards: its first losses and first gradients from one setup (each guard built its own: six).
    assert len(built) == 4 and len(set(built)) == 2


def test_a_case_measured_again_for_its_timing_keeps_its_first_passes(log, ratio_budgets, profile, quick):
    runner = Runner(LoggingBackend(log), profile, quick)
    plan = runner.planner.plan("set_to_none", "mlp", budgets=ratio_budgets)
    first = runner.executor.execute(plan, plan.outcome())
    log.clear()
    again = runner.executor.measure_again(plan, first)
    assert not [entry for entry in log if entry.startswith("passes")]  # rounds only: the passes are exact
    assert again.result.ops_per_step == first.result.ops_per_step and again.result.round_step_times_s
    assert again.result.round_step_times_s != first.result.round_step_times_s
    assert any("earlier measurement" in note for note in again.result.notes)


@pytest.mark.parametrize("workload, recipe", [("mlp", "baseline"), ("mlp", "set_to_none"), ("mlp", "loss_item_every_n"),
                                              ("convnet", "channels_last"), ("mlp", "optimizer_foreach"),
                                              ("mlp", "multiprocess_loading")])
def test_a_fresh_setups_first_warm_up_steps_are_the_seeded_trajectory(cpu, profile, quick, workload, recipe):
    from trainbench.core.setups.guards import GUARD_STEPS, loss_trajectory
    from trainbench.core.setups.training import TrainingSetup

    spec, config = resolve_spec(workload, profile), get_recipe(recipe).config(profile)
    settings = dataclasses.replace(quick, min_warmup_steps=GUARD_STEPS)
    with TrainingSetup(config, spec, cpu) as training:
        m = Measurer(training, "c", recipe, settings)
        m.warm_up()
    assert m.result.seeded_losses == loss_trajectory(config, spec, cpu)  # exactly: the same seeds, batches and steps


def test_the_loss_guard_takes_the_measured_setups_trajectories_and_builds_none(cpu, profile, quick, monkeypatch):
    from trainbench.core.setups import guards

    built = []
    monkeypatch.setattr(guards, "loss_trajectory", lambda *a, **k: built.append(a[0]) or [])
    settings = dataclasses.replace(quick, min_warmup_steps=guards.GUARD_STEPS)
    budgets = Budgets.from_text('[cpu."mlp-set_to_none"]\nmin_speedup = 0.01\n', source="<test>")
    outcome = Runner(cpu, profile, settings, predict=False).run("set_to_none", "mlp", budgets=budgets)
    assert built == [] and outcome.paired
    assert [c.kind for c in outcome.guard_checks] == ["loss"] and outcome.guard_checks[0].ok
    assert len(outcome.result.seeded_losses) == len(outcome.baseline.seeded_losses) == guards.GUARD_STEPS


def test_a_setup_that_stepped_before_its_measurement_gives_no_trajectory(cpu, profile, quick, mlp):
    from trainbench.core.setups.guards import GUARD_STEPS
    from trainbench.core.setups.training import TrainingSetup

    with TrainingSetup(get_recipe("baseline").config(profile), mlp, cpu) as training:
        training.step(training.fetch(training.batches()))  # e.g. a DDP rank's first-step gradients
        m = Measurer(training, "c", "baseline", dataclasses.replace(quick, min_warmup_steps=GUARD_STEPS))
        m.warm_up()
    assert m.result.seeded_losses is None


def test_the_gpu_prediction_runs_with_the_heap_frozen_and_unfreezes_it(cpu, profile, quick, monkeypatch):
    import gc

    from trainbench.core.method.case_prediction import CasePrediction

    seen = []
    monkeypatch.setattr(CasePrediction, "memory", lambda self, plan, result: seen.append(gc.get_freeze_count())
                        or {"profile": "gpu", "reason": "not predicted in this test"})
    gc.unfreeze()  # this suite freezes the heap before each test (conftest): a user's session does not
    monkeypatch.setattr("trainbench.core.analyses.step_memory._HeapFreeze.elsewhere", False)
    try:
        outcome = Runner(cpu, profile, quick, predict=True).run("baseline", "mlp")
        assert seen and seen[0] > 0 and gc.get_freeze_count() == 0
        assert not outcome.failures
    finally:
        gc.freeze()
