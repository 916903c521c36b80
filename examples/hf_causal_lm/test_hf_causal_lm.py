"""A Hugging Face Llama (random weights, nothing downloaded) on right-padded dict batches, measured in tokens/s."""

import functools

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from trainbench import TrainingSpec

transformers = pytest.importorskip("transformers")

VOCAB, SEQ, PAD = 512, 32, 0


def llama():
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=SEQ, pad_token_id=PAD,
        use_cache=False)  # the key/value cache breaks checkpointing's recomputation
    return transformers.LlamaForCausalLM(config)


class Texts(Dataset):
    """Tokenized texts of random lengths (seeded), as a tokenizer hands them to a DataCollator."""

    def __init__(self, size=256):
        rng = np.random.default_rng(0)
        self.texts = [rng.integers(1, VOCAB, n) for n in rng.integers(SEQ // 4, SEQ + 1, size)]

    def __len__(self):
        return len(self.texts)

    def __getitem__(self, i):
        return {"input_ids": torch.from_numpy(self.texts[i])}


def pad_right(samples):
    """A DataCollator's right padding (to max_length: one shape a batch): the padding masked, its labels -100."""
    ids = torch.full((len(samples), SEQ), PAD)
    for row, sample in zip(ids, samples):
        row[:len(sample["input_ids"])] = sample["input_ids"]
    mask = ids != PAD
    return {"input_ids": ids, "attention_mask": mask.long(), "labels": ids.masked_fill(~mask, -100)}


SPEC = TrainingSpec(
    name="hf_llama", model=llama, loss_fn=lambda model, batch: model(**batch).loss, batch_size=4,
    optimizer=functools.partial(torch.optim.AdamW, lr=1e-3),
    dataset=Texts, collate_fn=pad_right,
    # What HF's loss averages over: the labels shifted by one, padding (-100) left out
    items=lambda batch: (batch["labels"][:, 1:] != -100).sum(), items_unit="tokens",
    checkpoint_blocks=["model.layers.0", "model.layers.1"],
)


@pytest.mark.parametrize("recipe", ["baseline", "amp_bf16", "grad_accumulation", "checkpointing", "optimizer_fused"])
def test_hf_llama(train_bench, recipe):
    train_bench(recipe, SPEC)
