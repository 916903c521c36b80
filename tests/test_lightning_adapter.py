"""A LightningModule as a spec: automatic optimization (training_step's loss, configure_optimizers' optimizer in any
of Lightning's shapes, a datamodule's data) and manual optimization (a GAN's alternating updates through the step
context)."""

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from trainbench import from_lightning
from trainbench.core.setups.guards import compare_trajectories, first_step_gradients, loss_trajectory
from trainbench.core.setups.recipes import get_recipe
from trainbench.core.setups.spec import SpecError
from trainbench.core.setups.training import TrainingSetup

L = pytest.importorskip("lightning.pytorch")


class Regressor(L.LightningModule):
    def __init__(self, returns="dict"):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
        self.returns = returns

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self.net(x), y)
        self.log("loss", loss)
        return {"loss": loss} if self.returns == "dict" else loss if self.returns == "tensor" else None

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=1e-2)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=10)]


class Data(L.LightningDataModule):
    def setup(self, stage):
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(64, 8, generator=generator)
        self.train = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))

    def train_dataloader(self):
        return torch.utils.data.DataLoader(self.train, batch_size=16)


class GAN(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.G = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 8))
        self.D = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        opt_g, opt_d = self.optimizers()
        real = batch[0]
        fake = self.G(torch.randn(real.shape[0], 4))
        ones, zeros = torch.ones(real.shape[0], 1), torch.zeros(real.shape[0], 1)
        self.toggle_optimizer(opt_d)
        d_loss = (F.binary_cross_entropy_with_logits(self.D(real), ones)
                  + F.binary_cross_entropy_with_logits(self.D(fake.detach()), zeros))
        opt_d.zero_grad()
        self.manual_backward(d_loss)
        opt_d.step()
        self.untoggle_optimizer(opt_d)
        self.toggle_optimizer(opt_g)
        g_loss = F.binary_cross_entropy_with_logits(self.D(fake), ones)
        opt_g.zero_grad()
        self.manual_backward(g_loss)
        opt_g.step()
        self.untoggle_optimizer(opt_g)
        return g_loss

    def configure_optimizers(self):
        return ({"optimizer": torch.optim.Adam(self.G.parameters(), lr=2e-4)},
                {"optimizer": torch.optim.Adam(self.D.parameters(), lr=2e-4)})


def test_automatic_optimization_trains_the_modules_own_step_and_optimizer(cpu, profile):
    spec = from_lightning(Regressor, name="regressor", datamodule=Data)
    assert spec.batch_size == 16 and spec.dataset is not None
    with TrainingSetup(get_recipe("baseline").config(profile), spec, cpu) as training:
        [optimizer] = training.optimizers.values()
        assert isinstance(optimizer, torch.optim.Adam)
        losses = [float(training.step(training.fetch(training.batches()))) for _ in range(20)]
    assert losses[-1] < losses[0]  # it trains


def test_the_foreach_recipe_rebuilds_the_modules_optimizer(cpu, profile):
    spec = from_lightning(Regressor, name="regressor", datamodule=Data)
    with TrainingSetup(get_recipe("optimizer_foreach").config(profile), spec, cpu) as training:
        [optimizer] = training.optimizers.values()
        assert optimizer.defaults["foreach"] is True
    base = loss_trajectory(get_recipe("optimizer_loop").config(profile), spec, cpu)
    assert compare_trajectories(loss_trajectory(get_recipe("optimizer_foreach").config(profile), spec, cpu), base,
                                1e-5).ok


def test_a_training_step_returning_nothing_is_one_line(cpu, profile):
    spec = from_lightning(lambda: Regressor("none"), name="regressor", datamodule=Data)
    with TrainingSetup(get_recipe("baseline").config(profile), spec, cpu) as training, \
            pytest.raises(SpecError, match="Regressor.training_step returned NoneType"):
        training.step(training.fetch(training.batches()))


def test_a_module_that_is_not_a_lightning_module_is_one_line():
    with pytest.raises(SpecError, match="expected a LightningModule"):
        from_lightning(lambda: nn.Linear(2, 2), name="plain", batch_size=4, batches=lambda n, g: torch.randn(n, 2))


def test_manual_optimization_runs_the_gan_step_through_the_step_context(cpu, profile):
    spec = from_lightning(GAN, name="lightning_gan", batch_size=8,
                          batches=lambda n, g: (torch.randn(n, 8, generator=g, device=g.device),))
    with TrainingSetup(get_recipe("baseline").config(profile), spec, cpu) as training:
        gan = training.model.module
        d_before = [p.detach().clone() for p in gan.D.parameters()]
        loss = training.step(training.fetch(training.batches()))
        assert torch.isfinite(loss) and loss > 0
        assert all(not torch.equal(a, b) for a, b in zip(d_before, gan.D.parameters()))
        assert all(p.requires_grad for p in gan.parameters())  # untoggled
        assert "optimizers" not in vars(gan)  # the stand-ins are gone after the step
    grads = first_step_gradients(get_recipe("set_to_none").config(profile), spec, cpu)
    assert grads and all(torch.isfinite(g).all() for g in grads.values())


def test_the_root_forward_is_the_training_step_so_compile_and_checkpointing_wrap_it(cpu, profile):
    spec = from_lightning(Regressor, name="regressor", datamodule=Data, checkpoint_blocks=["net"])
    assert spec.checkpoint_blocks == ["module.net"]
    base = loss_trajectory(get_recipe("baseline").config(profile), spec, cpu)
    checkpointed = loss_trajectory(get_recipe("checkpointing").config(profile), spec, cpu)
    assert compare_trajectories(checkpointed, base, 1e-6).ok
    calls = []
    with TrainingSetup(get_recipe("baseline").config(profile), spec, cpu) as training:
        training.model.module.training_step = lambda batch, index: calls.append(index) or torch.ones((), requires_grad=True)
        training.step(training.fetch(training.batches()))
    assert calls == [0]  # through the root's forward


class DeviceReader(Regressor):
    def training_step(self, batch, batch_idx):
        x, y = batch
        noise = torch.zeros(x.shape, device=self.device, dtype=self.dtype)  # as Lightning users write it
        return F.mse_loss(self.net(x + noise), y)


def test_moving_the_setups_model_moves_the_lightning_modules_own_device():
    # The setup moves its model with module_to (nn.Module.to on the root): Lightning's device must follow it.
    from trainbench.core.setups.effects import module_to

    spec = from_lightning(DeviceReader, name="reader", batch_size=4,
                          batches=lambda n, g: (torch.randn(n, 8, generator=g), torch.randn(n, 1, generator=g)))
    meta = torch.device("meta")
    root = module_to(spec.model(), meta)
    assert root.module.device == meta and next(root.parameters()).device == meta
    loss = spec.loss_fn(root, (torch.randn(4, 8, device=meta), torch.randn(4, 1, device=meta)))
    assert loss.device == meta
    assert module_to(root, torch.float64).module.dtype == torch.float64
