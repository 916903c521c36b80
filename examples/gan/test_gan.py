"""A DCGAN-style GAN: alternating discriminator and generator updates with two Adams, written as a custom step."""

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from trainbench import TrainingSpec

NOISE = 16


class GAN(nn.Module):
    def __init__(self):
        super().__init__()
        self.G = nn.Sequential(nn.Linear(NOISE, 32 * 4 * 4), nn.Unflatten(1, (32, 4, 4)), nn.ReLU(),
                               nn.ConvTranspose2d(32, 16, 4, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                               nn.ConvTranspose2d(16, 3, 4, 2, 1), nn.Tanh())
        self.D = nn.Sequential(nn.Conv2d(3, 16, 4, 2, 1), nn.LeakyReLU(0.2), nn.Conv2d(16, 32, 4, 2, 1, bias=False),
                               nn.BatchNorm2d(32), nn.LeakyReLU(0.2), nn.Flatten(), nn.Linear(32 * 4 * 4, 1))


def bce(logits, target):
    return F.binary_cross_entropy_with_logits(logits, torch.full_like(logits, target))


def gan_step(model, real, ctx):
    """One batch: a discriminator update on real and generated images, then a generator update through D."""
    z = torch.randn(real.shape[0], NOISE, device=real.device, generator=ctx.generator)
    with ctx.autocast():
        fake = model.G(z)
        d_loss = bce(model.D(real), 1.0) + bce(model.D(fake.detach()), 0.0)
    ctx.zero_grad("D"), ctx.backward(d_loss), ctx.step("D")
    with ctx.autocast():
        g_loss = bce(model.D(fake), 1.0)
    ctx.zero_grad("G"), ctx.backward(g_loss), ctx.step("G")
    return g_loss.detach()


SPEC = TrainingSpec(
    name="dcgan", model=GAN, step=gan_step, batch_size=32, checkpoint_blocks=["G"],
    optimizers=lambda m: {"D": torch.optim.Adam(m.D.parameters(), lr=2e-4, betas=(0.5, 0.999)),
                          "G": torch.optim.Adam(m.G.parameters(), lr=2e-4, betas=(0.5, 0.999))},
    batches=lambda n, gen: torch.rand(n, 3, 16, 16, generator=gen, device=gen.device) * 2 - 1,
)

RECIPES = ["baseline", "amp_bf16", "set_to_none", "optimizer_fused", "channels_last", "checkpointing", "grad_accumulation"]


@pytest.mark.parametrize("recipe", RECIPES)
def test_dcgan(train_bench, recipe):
    train_bench(recipe, SPEC)
