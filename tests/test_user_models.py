"""Models users bring that the built-in workloads are not: an LSTM over packed sequences, a convnet with BatchNorm under
accumulation, batches that are objects moving themselves with ``.to()``, a diffusion-style noise-prediction step and
a graph network over variable node counts. Each is tiny, on the CPU, through the runner as the fixture runs it."""

import dataclasses
import functools
import math
from collections.abc import Mapping

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils.rnn import pack_padded_sequence

from trainbench import TrainingSpec
from trainbench.core.method.measure import Measurer, MeasureSettings
from trainbench.core.setups.recipes import NotApplicable, get_recipe
from trainbench.core.method.runner import Runner
from trainbench.core.setups.spec import batch_nbytes, batch_to_device, classification_loss
from trainbench.core.setups.effects import batch_statistics_norms
from trainbench.core.setups.training import TrainingSetup

SGD = functools.partial(torch.optim.SGD, lr=0.05)


@pytest.fixture
def runner(cpu, profile, quick):
    """A runner measuring just enough, without the profiler's attribution pass (seconds a case)."""
    return Runner(cpu, profile, dataclasses.replace(quick, attribution=False), predict=False)


# -- an LSTM over packed sequences ---------------------------------------------------------------------------------

class PackedClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.lstm, self.head = nn.Embedding(50, 8), nn.LSTM(8, 16, batch_first=True), nn.Linear(16, 3)

    def forward(self, tokens, lengths):
        packed = pack_padded_sequence(self.embed(tokens), lengths, batch_first=True, enforce_sorted=False)
        _, (hidden, _) = self.lstm(packed)  # the LSTM module is fed a PackedSequence
        return self.head(hidden[-1])


def padded_sentences(n, gen):
    lengths = torch.randint(1, 12, (n,), generator=gen)
    return torch.randint(0, 50, (n, 12), generator=gen), lengths, torch.randint(0, 3, (n,), generator=gen)


PACKED = TrainingSpec(name="packed_lstm", model=PackedClassifier, optimizer=SGD, batch_size=8, batches=padded_sentences,
                      loss_fn=lambda m, b: F.cross_entropy(m(b[0], b[1]), b[2]))


def test_an_lstm_over_packed_sequences_gets_its_memory_measured_by_storage_identity(runner):
    # MemTracker's module hooks rebuild a module's inputs through pytree, and a PackedSequence refuses its leaves back
    # ("Expected data to be a list or tuple of length 2"): every case of such a model failed in the memory pass.
    result = runner.run("baseline", PACKED).result
    breakdown = result.memory_breakdown_bytes
    assert breakdown["total"] > 0 and breakdown["activations"] > 0 and all(math.isfinite(v) for v in breakdown.values())
    assert breakdown["params"] == breakdown["grads"] == sum(p.numel() for p in PackedClassifier().parameters()) * 4
    assert result.memory_growth_bytes_per_step == 0
    [note] = [note for note in result.notes if "storage identity" in note]
    assert "MemTracker's module hooks failed (AssertionError: Expected data to be a list or tuple of length 2" in note
    # the tracker's hooks went with it: no module hook of it is left to slow or break later cases
    assert not torch.nn.modules.module._global_forward_pre_hooks and not torch.nn.modules.module._global_forward_hooks


def test_an_error_of_the_step_itself_is_raised_not_hidden_by_the_fallback(cpu, profile):
    def broken(model, batch):
        raise ValueError("the spec's own bug")

    spec = dataclasses.replace(PACKED, loss_fn=broken)
    with TrainingSetup(get_recipe("baseline").config(profile), spec, cpu) as training:
        with pytest.raises(ValueError, match="the spec's own bug"):
            Measurer(training, "case", "baseline", MeasureSettings()).tracked_breakdown()


# -- BatchNorm under gradient accumulation -------------------------------------------------------------------------

def small_convnet():
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(4, 2))


CONVNET = TrainingSpec(name="bn_convnet", model=small_convnet, optimizer=SGD, batch_size=4, loss_fn=classification_loss,
                       batches=lambda n, gen: (torch.randn(n, 3, 8, 8, generator=gen), torch.randint(0, 2, (n,), generator=gen)))


def test_accumulation_over_batchnorm_skips_with_the_reason_instead_of_failing_its_guard(runner):
    # It used to run, and fail the gradient guard (worst error ~1): each micro-batch is normalized by its own statistics.
    outcome = runner.run("grad_accumulation", CONVNET)
    assert outcome.skipped == ("grad_accumulation: the model's BatchNorm (1) normalizes each micro-batch by its own "
                               "statistics: accumulated micro-batches do not train as the whole batch does")
    assert not outcome.failures


def test_batch_statistics_norms_are_those_that_normalize_by_the_batch(cpu, profile):
    model = small_convnet()
    assert batch_statistics_norms(model) == ["1"]
    assert batch_statistics_norms(model.eval()) == []  # running statistics: the batch does not matter
    assert batch_statistics_norms(nn.Sequential(nn.BatchNorm1d(3, track_running_stats=False)).eval()) == ["0"]
    assert batch_statistics_norms(nn.Sequential(nn.LayerNorm(3), nn.InstanceNorm2d(3))) == []
    # the one-process reference of a DDP case splits the batch as its ranks do: BatchNorm per shard is what they compute
    config = get_recipe("grad_accumulation").config(profile)
    with pytest.raises(NotApplicable, match="BatchNorm"):
        TrainingSetup(config, CONVNET, cpu)
    with TrainingSetup(config, CONVNET, cpu, micro_batches_are_shards=True) as training:
        training.step(training.fetch(training.batches()))


def test_the_guard_of_a_ddp_case_builds_its_one_process_reference_with_batchnorm_per_shard(runner, monkeypatch):
    from trainbench.core.setups import guards

    built = {}
    monkeypatch.setattr(guards, "seeded_run", lambda config, *args, micro_batches_are_shards=False, **kwargs:
                        built.setdefault(config, micro_batches_are_shards))
    plan = runner.planner.plan("ddp_gloo", CONVNET)
    assert not plan.skipped
    runner.executor.guard.seeded_runs(plan, plan.outcome(), plan.setup_key(plan.baseline))
    reference = plan.baseline_config.one_process_equivalent(2)
    assert reference.accumulation_steps == 2 and built == {reference: True}  # its only guard: the gradients


# -- batches that move themselves ----------------------------------------------------------------------------------

@dataclasses.dataclass
class Graphs:
    """A batch of graphs of different sizes, as PyG's ``Batch`` holds them: node features, an edge list, each node's
    graph, each graph's label. Moves itself, as PyG's does; the devices it was moved to are kept for the test."""

    x: torch.Tensor
    edge_index: torch.Tensor
    graph_of_node: torch.Tensor
    y: torch.Tensor
    num_graphs: int
    moved_to: tuple = ()

    def to(self, device, non_blocking=False):
        moved = {f.name: getattr(self, f.name).to(device, non_blocking=non_blocking)
                 for f in dataclasses.fields(self) if f.name not in ("num_graphs", "moved_to")}
        return Graphs(**moved, num_graphs=self.num_graphs, moved_to=(*self.moved_to, torch.device(device)))


class Encoding(Mapping):
    """A dict-like batch that moves itself in place and returns nothing (neither a dict nor a registered pytree)."""

    def __init__(self, **tensors):
        self.data = tensors

    def __getitem__(self, key):
        return self.data[key]

    def __iter__(self):
        return iter(self.data)

    def __len__(self):
        return len(self.data)

    def to(self, device):
        self.data = {k: v.to(device) for k, v in self.data.items()}


def random_graphs(n, gen):
    """``n`` graphs of 3 to 6 nodes, each a ring: the node count varies from batch to batch."""
    sizes = torch.randint(3, 7, (n,), generator=gen)
    starts = torch.cumsum(sizes, 0) - sizes
    graph_of_node = torch.repeat_interleave(torch.arange(n), sizes)
    nodes = torch.arange(int(sizes.sum()))
    ring_next = starts[graph_of_node] + (nodes - starts[graph_of_node] + 1) % sizes[graph_of_node]
    edges = torch.stack([torch.cat([nodes, ring_next]), torch.cat([ring_next, nodes])])
    return Graphs(torch.randn(len(nodes), 4, generator=gen), edges, graph_of_node, torch.randint(0, 2, (n,), generator=gen),
                  n)


class MessagePassing(nn.Module):
    """Two rounds of sum-aggregated messages over the edges (index_add_), then a mean per graph."""

    def __init__(self):
        super().__init__()
        self.message, self.update, self.head = nn.Linear(4, 8), nn.Linear(4 + 8, 4), nn.Linear(4, 2)

    def forward(self, graphs):
        x, (source, target) = graphs.x, graphs.edge_index
        for _ in range(2):
            incoming = torch.zeros(x.shape[0], 8, device=x.device).index_add_(0, target, self.message(x)[source])
            x = torch.relu(self.update(torch.cat([x, incoming], dim=1)))
        pooled = torch.zeros(graphs.num_graphs, 4, device=x.device).index_add_(0, graphs.graph_of_node, x)
        counts = torch.bincount(graphs.graph_of_node, minlength=graphs.num_graphs).clamp(min=1)
        return self.head(pooled / counts[:, None])


GRAPHS = TrainingSpec(name="graphs", model=MessagePassing, optimizer=SGD, batch_size=4, batches=random_graphs,
                      loss_fn=lambda m, g: F.cross_entropy(m(g), g.y))


def test_objects_with_to_move_themselves_and_their_tensors_count():
    graphs = random_graphs(3, torch.Generator().manual_seed(0))
    encoding = Encoding(input_ids=torch.zeros(2, 5, dtype=torch.int64), mask=torch.ones(2, 5, dtype=torch.bool))
    batch = {"graphs": graphs, "text": encoding, "weight": torch.ones(3)}
    tensors_bytes = sum(t.nbytes for t in (graphs.x, graphs.edge_index, graphs.graph_of_node, graphs.y))
    assert batch_nbytes(batch) == tensors_bytes + 2 * 5 * 8 + 2 * 5 + 3 * 4  # every tensor, inside the objects too
    moved = batch_to_device(batch, torch.device("cpu"), non_blocking=True)
    assert moved["graphs"].moved_to == (torch.device("cpu"),)  # by its own .to(), the structure around it kept
    assert moved["text"] is encoding  # moved in place, returned nothing: kept
    assert batch_nbytes([moved, moved]) == 2 * batch_nbytes(batch)  # a step's micro-batches


def test_a_graph_network_over_variable_node_counts_trains_and_is_measured(runner, cpu, profile):
    # Moved by its own .to(), its bytes counted; the samples of a step cannot be sliced apart, so accumulation skips.
    result = runner.run("baseline", GRAPHS).result
    assert result.h2d_bytes_per_sample > 0 and result.memory_breakdown_bytes["activations"] > 0
    assert math.isfinite(result.final_loss) and result.flops_per_step > 0
    skipped = runner.run("grad_accumulation", GRAPHS).skipped
    assert skipped == ("grad_accumulation: a step's batch is split into 4 micro-batches or ranks' shares, and the "
                       "spec's batches hold a Graphs (an object with .to()), which cannot be sliced by sample")
    # As a dict of tensors it was sliced row by row: node rows for graphs, the edge list's two rows for four batches.
    as_dict = dataclasses.replace(GRAPHS, batches=lambda n, gen: dataclasses.asdict(random_graphs(n, gen)),
                                  loss_fn=lambda m, g: F.cross_entropy(m(Graphs(**g)), g["y"]))
    with TrainingSetup(get_recipe("grad_accumulation").config(profile), as_dict, cpu) as training:
        with pytest.raises(NotApplicable, match=r"hold a tensor of shape \(\d+, 4\), where every tensor's first "
                                                r"dimension must be the batch's 16 samples"):
            training.fetch(training.batches())


# -- a diffusion-style noise-prediction step -----------------------------------------------------------------------

STEPS = 50
ALPHAS = torch.cumprod(1 - torch.linspace(1e-4, 0.02, STEPS), 0)


class Denoiser(nn.Module):
    def __init__(self):
        super().__init__()
        self.time, self.net = nn.Embedding(STEPS, 16), nn.Sequential(nn.Linear(16, 32), nn.SiLU(), nn.Linear(32, 16))

    def forward(self, noisy, t):
        return self.net(noisy + self.time(t))


def noise_prediction_step(model, clean, ctx):
    """DDPM's training step: a random timestep and noise per sample, from the step's own generator, and the noise
    predicted back. One optimizer: ``ctx.zero_grad()`` and ``ctx.step()`` need no name."""
    t = torch.randint(0, STEPS, (clean.shape[0],), device=clean.device, generator=ctx.generator)
    noise = torch.randn(clean.shape, device=clean.device, generator=ctx.generator)
    alpha = ALPHAS.to(clean.device)[t][:, None]
    with ctx.autocast():
        loss = F.mse_loss(model(alpha.sqrt() * clean + (1 - alpha).sqrt() * noise, t), noise)
    ctx.zero_grad()
    ctx.backward(loss)
    ctx.step()
    return loss.detach()


DIFFUSION = TrainingSpec(name="denoiser", model=Denoiser, step=noise_prediction_step, optimizer=SGD, batch_size=8,
                         batches=lambda n, gen: torch.randn(n, 16, generator=gen))


def test_a_diffusion_step_draws_its_noise_from_the_step_generator_and_trains_as_its_baseline(runner):
    runner.run("baseline", DIFFUSION)
    outcome = runner.run("set_to_none", DIFFUSION)
    assert not outcome.failures and outcome.guard_checks and all(check.ok for check in outcome.guard_checks)
    assert outcome.result.memory_breakdown_bytes["grads"] > 0
