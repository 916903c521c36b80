"""DDP over gloo: two rank processes on the CPU, the path a GPU nightly takes with NCCL."""

import pytest

from trainbench.distributed import measure_ddp
from trainbench.guards import compare_gradients, first_step_gradients
from trainbench.recipes import TrainConfig, get_recipe


def test_two_gloo_ranks_train_the_one_process_global_batch(cpu, profile, quick):
    recipe = get_recipe("ddp_gloo")
    config = recipe.config(profile, workload="mlp")
    result, grads = measure_ddp(config, "cpu", profile.name, quick, "mlp-ddp_gloo", recipe.name, want_grads=True)

    assert result.world_size == 2 and result.batch_size == 16
    assert result.samples_per_s == pytest.approx(32 * quick.rounds * quick.steps_per_round / result.timed_seconds)
    assert result.warmup_steps == quick.min_warmup_steps and "fixed warm-up" in result.notes[0]
    assert result.syncs_per_step == 0 and result.flops_per_step > 0
    # The all-reduced gradients of two half batches are the gradients of the whole batch.
    one_process = first_step_gradients(get_recipe("one_process").config(profile, workload="mlp"), cpu, profile)
    verdict = compare_gradients(grads, one_process, recipe.grad_rtol)
    assert verdict.ok, verdict.message


def test_a_failing_rank_reports_its_traceback(profile, quick):
    # Rank processes are fresh interpreters: a workload registered only here does not exist there.
    config = TrainConfig(workload="registered_in_the_parent_only", parallel="ddp", world_size=2)
    with pytest.raises(RuntimeError, match="(?s)x-ddp_gloo: a DDP rank failed.*unknown workload 'registered_in_the_parent_only'"):
        measure_ddp(config, "cpu", profile.name, quick, "x-ddp_gloo", "ddp_gloo")
