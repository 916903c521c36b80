"""Counting what users count: a spec's items (a padded LM's tokens) weight accumulation and give items/s."""

import functools

import pytest
import torch
from torch import nn

from trainbench.core.setups.guards import compare_gradients, first_step_gradients, with_likely_cause
from trainbench.core.setups.recipes import get_recipe
from trainbench.core.setups.spec import SpecError, TrainingSpec

VOCAB, SEQ = 50, 12


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 16)
        self.head = nn.Linear(16, VOCAB)

    def forward(self, input_ids):
        return self.head(torch.tanh(self.embed(input_ids)))


def padded_batches(batch_size: int, generator: torch.Generator) -> dict:
    """Right-padded sequences of random lengths, labels -100 on the padding (as a Hugging Face collator makes them)."""
    ids = torch.randint(0, VOCAB, (batch_size, SEQ), generator=generator)
    lengths = torch.randint(1, SEQ + 1, (batch_size,), generator=generator)
    mask = torch.arange(SEQ)[None, :] < lengths[:, None]
    return {"input_ids": ids * mask, "attention_mask": mask.long(), "labels": torch.where(mask, ids, -100)}


def token_mean_loss(model, batch):
    """The mean over non-padding tokens, as a causal LM's loss is."""
    logits = model(batch["input_ids"])
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), batch["labels"].reshape(-1), ignore_index=-100)


def tokens(batch):
    return (batch["labels"] != -100).sum()


def lm_spec(**fields) -> TrainingSpec:
    return TrainingSpec("padded_lm", TinyLM, loss_fn=token_mean_loss, optimizer=functools.partial(torch.optim.SGD, lr=0.1), batch_size=8,
                        batches=padded_batches, **fields)


def _accumulation_verdict(spec, cpu, profile):
    accumulated = get_recipe("grad_accumulation")
    grads = first_step_gradients(accumulated.config(profile), spec, cpu)
    whole = first_step_gradients(get_recipe(accumulated.baseline).config(profile), spec, cpu)
    return with_likely_cause(compare_gradients(grads, whole, accumulated.grad_rtol), accumulated.config(profile), spec)


def test_weighting_micro_batches_by_their_tokens_gives_the_whole_batchs_gradients(cpu, profile):
    verdict = _accumulation_verdict(lm_spec(items=tokens, items_unit="tokens"), cpu, profile)
    assert verdict.ok, verdict.message
    assert verdict.max_rel_diff < 1e-5


def test_averaging_padded_micro_batches_equally_fails_the_guard_and_says_why(cpu, profile):
    verdict = _accumulation_verdict(lm_spec(), cpu, profile)
    assert not verdict.ok
    assert verdict.max_rel_diff > 1e-2
    assert "likely cause: the micro-batch losses are averaged equally" in verdict.message
    assert "TrainingSpec.items" in verdict.message


def test_items_are_counted_over_the_timed_steps_and_reported_per_second(cpu, profile):
    from trainbench.core.method.measure import Measurer, MeasureSettings
    from trainbench.core.setups.training import TrainingSetup

    spec = lm_spec(items=tokens, items_unit="tokens")
    settings = MeasureSettings(rounds=3, steps_per_round=2, min_warmup_steps=1, max_warmup_steps=1, fixed_warmup=True)
    with TrainingSetup(get_recipe("baseline").config(profile), spec, cpu) as training:
        measurer = Measurer(training, "padded_lm-baseline", "baseline", settings)
        measurer.warm_up()
        seen = []
        real_fetch = training.fetch

        def fetch(batches):
            micro_batches = real_fetch(batches)
            seen.append(int(tokens(micro_batches[0])))
            return micro_batches

        training.fetch = fetch
        measurer.time_rounds()
    result = measurer.result
    assert len(seen) == 6
    assert result.items_per_step == pytest.approx(sum(seen) / 6)
    assert result.items_unit == "tokens"
    assert result.metrics()["items_per_s"] == pytest.approx(result.items_per_step / result.step_time_s)


def test_a_spec_without_items_reports_no_items_per_s(cpu, profile):
    from trainbench.core.method.measure import Measurer, MeasureSettings
    from trainbench.core.setups.training import TrainingSetup

    settings = MeasureSettings(rounds=2, steps_per_round=1, min_warmup_steps=1, max_warmup_steps=1, fixed_warmup=True)
    with TrainingSetup(get_recipe("baseline").config(profile), lm_spec(), cpu) as training:
        measurer = Measurer(training, "padded_lm-baseline", "baseline", settings)
        measurer.time_rounds()
    assert measurer.result.items_per_step is None and measurer.result.metrics()["items_per_s"] is None


@pytest.mark.parametrize("items, expected", [(lambda b: torch.ones(2), "expected one count"),
                                             (lambda b: -1, "expected a count >= 0"),
                                             (lambda b: "many", "expected a count >= 0")])
def test_an_items_function_that_does_not_count_is_one_line(items, expected):
    spec = lm_spec(items=items)
    with pytest.raises(SpecError, match=expected):
        spec.count_items(padded_batches(2, torch.Generator().manual_seed(0)))


def test_items_unit_must_be_a_word():
    with pytest.raises(SpecError, match="items_unit must be a word"):
        lm_spec(items=tokens, items_unit="tokens/s")


def test_a_collate_fn_pads_a_datasets_samples_of_different_lengths(cpu, profile):
    from trainbench.core.setups.training import TrainingSetup

    class Sentences(torch.utils.data.Dataset):
        def __len__(self):
            return 32

        def __getitem__(self, i):
            return torch.arange(1 + i % 5)

    def pad(samples):
        ids = nn.utils.rnn.pad_sequence(samples, batch_first=True, padding_value=0)
        return {"input_ids": ids, "labels": torch.where(ids > 0, ids, -100)}

    spec = TrainingSpec("sentences", TinyLM, loss_fn=token_mean_loss, optimizer=functools.partial(torch.optim.SGD, lr=0.1), batch_size=4,
                        dataset=Sentences, collate_fn=pad, items=tokens, items_unit="tokens")
    with TrainingSetup(get_recipe("baseline").config(profile), spec, cpu) as training:
        batch = training.fetch(training.batches())
        assert isinstance(batch[0], dict) and batch[0]["input_ids"].dim() == 2
        assert float(training.last_items) == float(tokens(batch[0]))
        assert torch.isfinite(training.step(batch))


def test_weighting_micro_batches_by_their_items_copies_nothing_to_the_device(profile):
    """On a GPU a count made on the host and copied to the device per micro-batch is a sync each: the step must count
    the items where the batches are. The CPU is host and device at once, so this backend calls every copy to the
    device what a GPU's pageable host-to-device copy is, a sync."""
    from trainbench.core.method.measure import Measurer, MeasureSettings
    from trainbench.core.setups.training import TrainingSetup
    from trainbench.devices.device import CpuBackend

    class CopiesSyncAsOnAGpu(CpuBackend):
        def blocking_copy(self, src, dst_device, non_blocking):
            return True

    backend = CopiesSyncAsOnAGpu(torch.device("cpu"))
    config = get_recipe("grad_accumulation").config(profile)
    with TrainingSetup(config, lm_spec(items=tokens, items_unit="tokens"), backend) as training:
        measurer = Measurer(training, "padded_lm-grad_accumulation", "grad_accumulation", MeasureSettings())
        measurer.count_work()
    assert config.accumulation_steps > 1
    assert measurer.result.syncs_per_step == 0
