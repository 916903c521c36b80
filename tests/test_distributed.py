"""DDP over gloo: two rank processes on the CPU, the path a GPU nightly takes with NCCL."""

import dataclasses

import pytest
import torch

from trainbench.distributed import ProcessFailed, measure_ddp
from trainbench.guards import compare_gradients, first_step_gradients
from trainbench.recipes import TrainConfig, get_recipe
from trainbench.spec import SpecError
from trainbench.workloads import PROFILES, resolve_spec


def test_two_gloo_ranks_train_the_one_process_global_batch(cpu, profile, mlp, quick):
    recipe = get_recipe("ddp_gloo")
    config = recipe.config(profile)
    result, grads = measure_ddp(config, mlp, cpu, profile, quick, "mlp-ddp_gloo", recipe.name, want_grads=True)

    assert result.world_size == 2 and result.batch_size == 16
    assert result.samples_per_s == pytest.approx(32 / result.step_time_s)  # both ranks' samples per median step
    assert result.warmup_steps == quick.min_warmup_steps and "fixed warm-up" in result.notes[0]
    assert result.syncs_per_step == 0 and result.flops_per_step > 0
    # The all-reduced gradients of two half batches are the gradients of the whole batch.
    one_process = first_step_gradients(get_recipe("one_process").config(profile), mlp, cpu)
    verdict = compare_gradients(grads, one_process, recipe.grad_rtol)
    assert verdict.ok, verdict.message


def _model_that_fails():
    raise RuntimeError("no model in this process")


# Rank processes are fresh interpreters: they import the spec from the module-level name it is bound to.
BROKEN = dataclasses.replace(resolve_spec("mlp", PROFILES["cpu"]), name="broken", model=_model_that_fails)


def test_a_failing_rank_reports_its_traceback(cpu, profile, quick):
    config = TrainConfig(parallel="ddp", world_size=2)
    with pytest.raises(RuntimeError, match="(?s)x-ddp_gloo: a DDP rank failed.*no model in this process"):
        measure_ddp(config, BROKEN, cpu, profile, quick, "x-ddp_gloo", "ddp_gloo")


def test_a_spec_the_ranks_cannot_import_is_a_clear_error(cpu, profile, mlp, quick):
    local = dataclasses.replace(mlp, name="made_in_a_function")
    with pytest.raises(SpecError, match="bind it to a module-level name"):
        measure_ddp(TrainConfig(parallel="ddp", world_size=2), local, cpu, profile, quick, "x-ddp_gloo", "ddp_gloo")


class _HangsOnRank1(torch.utils.data.Dataset):
    """Rank 1's data never arrives (a stuck read on one node); rank 0 trains on and waits in the all-reduce."""

    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        import time

        import torch.distributed as dist

        if dist.is_initialized() and dist.get_rank() == 1:
            time.sleep(3600)
        return self.items[i]


HANGS_ON_RANK_1 = dataclasses.replace(resolve_spec("mlp", PROFILES["cpu"]), name="hangs_on_rank_1",
                                      dataset=lambda: _HangsOnRank1(resolve_spec("mlp", PROFILES["cpu"]).dataset()))


def test_a_rank_that_stops_making_progress_fails_the_case_within_the_limit(cpu, profile, quick):
    import time

    started = time.monotonic()
    with pytest.raises(ProcessFailed, match=r"(?s)x-ddp_gloo: a DDP rank failed.*no progress for 3 s in"):
        measure_ddp(TrainConfig(parallel="ddp", world_size=2), HANGS_ON_RANK_1, cpu, profile,
                    dataclasses.replace(quick, no_progress_s=3), "x-ddp_gloo", "ddp_gloo")
    assert time.monotonic() - started < 180  # the limit and interpreter start-up, never the hour rank 1 sleeps
