"""A sentence classifier: an LSTM over padded sentences of different lengths, packed (pack_padded_sequence) so it
skips the padding. Sentences are 4 to 24 tokens long, unsorted in a batch; each batch holds the same mix of lengths,
so its work and memory are the same from batch to batch and deterministic budgets hold."""

import functools

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils.rnn import pack_padded_sequence

from trainbench import TrainingSpec

VOCAB, LONGEST = 1000, 24


class SentenceClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.lstm, self.head = nn.Embedding(VOCAB, 32), nn.LSTM(32, 64, batch_first=True), nn.Linear(64, 4)

    def forward(self, tokens, lengths):
        packed = pack_padded_sequence(self.embed(tokens), lengths.cpu(), batch_first=True, enforce_sorted=False)
        _, (hidden, _) = self.lstm(packed)
        return self.head(hidden[-1])


def sentences(n, gen):
    """``n`` padded sentences (0 pads), their lengths shuffled, and a label each."""
    lengths = torch.linspace(LONGEST, 4, n).round().long()[torch.randperm(n, generator=gen, device=gen.device).cpu()]
    tokens = torch.randint(1, VOCAB, (n, LONGEST), generator=gen, device=gen.device)
    tokens = tokens * (torch.arange(LONGEST, device=gen.device) < lengths.to(gen.device)[:, None])
    return tokens, lengths.to(gen.device), torch.randint(0, 4, (n,), generator=gen, device=gen.device)


SPEC = TrainingSpec(
    name="packed_lstm", model=SentenceClassifier, batch_size=16, batches=sentences, checkpoint_blocks=["lstm"],
    loss_fn=lambda model, batch: F.cross_entropy(model(batch[0], batch[1]), batch[2]),
    optimizer=functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9),
)


@pytest.mark.parametrize("recipe", ["baseline", "set_to_none", "checkpointing"])
def test_packed_lstm(train_bench, recipe):
    train_bench(recipe, SPEC)
