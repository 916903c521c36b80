"""The public training spec: any batch structure, any loss and optimizer, and clear words when something is off."""

import dataclasses
import functools

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from trainbench.core.setups.recipes import NotApplicable, TrainConfig
from trainbench.core.setups.spec import SpecError, TrainingSpec, batch_nbytes, batch_to_device
from trainbench.core.setups.training import TrainingSetup
from trainbench.core.setups.workloads import resolve_spec


class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 8), nn.Linear(6, 8)

    def forward(self, x, y):
        return self.a(x) + self.b(y)


def nested_batches(n, gen):
    return {"x": torch.randn(n, 4, generator=gen),
            "rest": [torch.randn(n, 6, generator=gen), {"target": torch.randn(n, 8, generator=gen)}]}


NESTED = TrainingSpec(
    name="nested", model=TwoInputs, batch_size=4,
    loss_fn=lambda model, batch: F.mse_loss(model(batch["x"], batch["rest"][0]), batch["rest"][1]["target"]),
    optimizer=functools.partial(torch.optim.Adam, lr=1e-3), batches=nested_batches)


def test_nested_batches_move_leaf_by_leaf_and_count_every_tensor():
    batch = nested_batches(4, torch.Generator().manual_seed(0))
    moved = batch_to_device(batch, torch.device("cpu"))
    assert set(moved) == {"x", "rest"} and isinstance(moved["rest"][1], dict)
    assert batch_nbytes(batch) == 4 * (4 + 6 + 8) * 4  # float32, every leaf
    assert batch_nbytes([batch, batch]) == 2 * batch_nbytes(batch)  # micro-batches


def test_a_two_input_model_with_its_own_loss_and_float_targets_trains(cpu):
    from trainbench.core.method.measure import measure

    with TrainingSetup(TrainConfig(), NESTED, cpu) as setup:
        same_batch = setup.fetch(setup.batches())
        losses = [float(setup.step(same_batch)) for _ in range(20)]
        result = measure(setup, "nested-baseline", "baseline", _quick(), 0, "cpu")
    assert losses[-1] < losses[0]  # MSE on float targets goes down: nothing assumed a classification loss
    assert result.h2d_bytes_per_sample == (4 + 6 + 8) * 4
    assert result.memory_breakdown_bytes["optimizer_state"] > 0  # Adam's moments


def _quick():
    from trainbench.core.method.measure import MeasureSettings

    return MeasureSettings(min_warmup_steps=1, max_warmup_steps=2, steady_window=1, rounds=2, steps_per_round=2,
                           memory_steps=1)


def test_a_spec_states_what_it_needs():
    with pytest.raises(SpecError, match="give a dataset .* or a batches factory"):
        dataclasses.replace(NESTED, batches=None)
    with pytest.raises(SpecError, match="batch_size must be a positive int"):
        dataclasses.replace(NESTED, batch_size=0)
    with pytest.raises(SpecError, match="unknown workload 'nope'"):
        resolve_spec("nope", None)


def test_a_loss_that_is_not_a_scalar_is_a_clear_error(cpu):
    bad = dataclasses.replace(NESTED, loss_fn=lambda model, batch: model(batch["x"], batch["rest"][0]))
    with TrainingSetup(TrainConfig(), bad, cpu) as setup, pytest.raises(SpecError, match="loss_fn returned a tensor of shape"):
        setup.step(setup.fetch(setup.batches()))


def test_an_optimizer_that_ignores_fused_is_not_applicable(cpu):
    class Quiet(torch.optim.SGD):
        def __init__(self, params, lr=0.1, **ignored):
            super().__init__(params, lr=lr)

    with pytest.raises(NotApplicable, match="Quiet did not take fused=True"):
        TrainingSetup(TrainConfig(optimizer_impl="fused"), dataclasses.replace(NESTED, optimizer=Quiet), cpu)


def test_accumulation_needs_micro_batches_that_divide_the_batch():
    with pytest.raises(ValueError, match="a batch of 4 does not split into 3 equal micro-batches"):
        TrainConfig(accumulation_steps=3).loader_batch_size(NESTED)


def test_ddp_shards_synthetic_batches_where_the_spec_has_no_dataset(profile):
    from trainbench.core.setups.recipes import get_recipe, spec_unmet

    assert spec_unmet(NESTED, get_recipe("ddp_gloo").config(profile)) is None
