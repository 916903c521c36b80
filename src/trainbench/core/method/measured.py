"""One setup's measurement as the method's pieces share it (``Measured``): the warm-up (``warm_up``), the timed rounds
(``rounds``) and the passes after timing (``passes``) each keep their own state and read and add to this."""

from __future__ import annotations

from typing import Protocol

import torch

from trainbench.core.method.settings import MeasureSettings
from trainbench.core.records.result import Result
from trainbench.core.setups.training import TrainingSetup
from trainbench.devices.device import Backend


class Measured(Protocol):
    """What is measured and how, the result so far, and the steps run on the setup (``measure.Measurer``)."""

    training: TrainingSetup
    backend: Backend  # whose clocks time the steps
    settings: MeasureSettings
    baseline: bool  # the case's baseline: its phases are the baseline's share of the case's cost
    result: Result
    wait_s: float  # seconds the steps on the live iterator waited on the loader
    last_loss: torch.Tensor | None  # what the last step run returned (read once, after all timing)

    def timed_step(self) -> None:
        """One step on the live iterator, its wait on the loader added to ``wait_s``."""

    def step_on(self, micro_batches: list) -> torch.Tensor:
        """One step on micro-batches fetched already."""

    def record(self, **fields) -> None:
        """The result so far with ``fields`` measured."""

    def note(self, note: str) -> None:
        """The result so far with ``note`` added."""
