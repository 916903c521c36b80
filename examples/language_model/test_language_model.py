"""A decoder LM with dict batches and fused AdamW, benchmarked with trainbench's recipes."""

import functools

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from trainbench import TrainingSpec

VOCAB, SEQ, WIDTH = 512, 32, 64


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.qkv, self.head = nn.Embedding(VOCAB, WIDTH), nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, VOCAB)
        self.block = nn.Sequential(nn.LayerNorm(WIDTH), nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, ids):
        x = self.embed(ids)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        x = x + F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.head(x + self.block(x))


def next_token_loss(model, batch):
    ids = batch["input_ids"]
    return F.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())


SPEC = TrainingSpec(
    name="tiny_lm", model=TinyLM, loss_fn=next_token_loss, batch_size=8,
    optimizer=functools.partial(torch.optim.AdamW, lr=1e-3, fused=True),
    batches=lambda n, gen: {"input_ids": torch.randint(0, VOCAB, (n, SEQ + 1), generator=gen, device=gen.device)},
    checkpoint_blocks=["block"],
)


@pytest.mark.parametrize("recipe", ["baseline", "amp_bf16", "optimizer_foreach", "checkpointing", "larger_batch"])
def test_tiny_lm(train_bench, recipe):
    train_bench(recipe, SPEC)
