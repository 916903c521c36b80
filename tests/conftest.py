import pytest
import torch

# pytester's in-process runs restore sys.modules afterwards; torch modules that register
# operator libraries cannot be imported twice, so import what the plugin loads lazily now.
import torch.distributed._tools.mem_tracker
import torch.utils.flop_counter
import torchvision
import torchvision.transforms  # noqa: F401

from trainbench.device import CpuBackend
from trainbench.measure import MeasureSettings
from trainbench.workloads import PROFILES

# Keep the CPU tests on the two cores the CI runner has, and deterministic.
torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture
def cpu():
    return CpuBackend(torch.device("cpu"))


@pytest.fixture
def profile():
    return PROFILES["cpu"]


@pytest.fixture
def quick():
    """Just enough measurement to exercise every path."""
    return MeasureSettings(min_warmup_steps=1, max_warmup_steps=4, steady_window=1, rounds=3, steps_per_round=2,
                           memory_steps=1)
