"""Example job: a sequence regressor, with knobs that make one rank slow (for the profiler).

Each sample is a sequence of ``length`` steps of 16 features; the model runs a small MLP over
every position and averages them into one prediction, so a rank's compute grows with the
length of its sequences. The target is a fixed function of the inputs, so the loss falls.

Parameters (``entrypoint.args: [key=value, ...]``) that show what the profiler finds:

=============== ====================================================================
``slow_rank``   this rank's data loader sleeps ``slow_ms`` per sample (-1: none)
``slow_after``  ...after it has loaded this many samples (a slowdown mid-run)
``long_rank``   this rank's sequences are ``long_factor`` times longer (-1: none):
                data imbalance, as unbucketed variable-length text gives
=============== ====================================================================
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn
from torch.nn import functional
from torch.utils.data import Dataset

from gantry.training import DataContext, Task

FEATURES = 16
HIDDEN = 128
SAMPLES = 4096
_WEIGHTS = torch.linspace(-1.0, 1.0, FEATURES)


class Sequences(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Deterministic random sequences (``length`` x FEATURES) and their targets."""

    def __init__(
        self, length: int, *, delay_s: float = 0.0, slow_after: int = 0, size: int = SAMPLES
    ) -> None:
        self.length = length
        self.delay_s = delay_s
        self.slow_after = slow_after
        self.size = size
        self.loaded = 0

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.loaded += 1
        if self.delay_s and self.loaded > self.slow_after:
            time.sleep(self.delay_s)
        generator = torch.Generator().manual_seed(index)
        x = torch.randn(self.length, FEATURES, generator=generator)
        y = torch.tanh(x @ _WEIGHTS).mean().reshape(1)
        return x, y


class PositionwiseRegressor(nn.Module):
    """An MLP over every position of a sequence, averaged into one output."""

    def __init__(self) -> None:
        super().__init__()
        self.mlp = nn.Sequential(
            nn.Linear(FEATURES, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, HIDDEN), nn.GELU()
        )
        self.head = nn.Linear(HIDDEN, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` (batch, length, FEATURES) to (batch, 1)."""
        out: torch.Tensor = self.head(self.mlp(x).mean(dim=1))
        return out


def dataset(ctx: DataContext) -> Sequences:
    """This rank's sequences, slowed or lengthened as the parameters say."""
    p: dict[str, Any] = dict(ctx.params)
    rank = ctx.env.rank
    length = int(p["length"]) * (int(p["long_factor"]) if rank == p["long_rank"] else 1)
    delay = float(p["slow_ms"]) / 1000 if rank == p["slow_rank"] else 0.0
    return Sequences(length, delay_s=delay, slow_after=int(p["slow_after"]))


task = Task(
    model=PositionwiseRegressor,
    loss=functional.mse_loss,
    dataset=dataset,
    example_input=lambda: torch.zeros(2, 32, FEATURES),
    options={"epochs": 1, "micro_batch_size": 16, "lr": 1e-3, "max_steps": 200},
    params={
        "length": 32,
        "slow_rank": -1,
        "slow_ms": 2.0,
        "slow_after": 0,
        "long_rank": -1,
        "long_factor": 4,
    },
    model_name="sequence-regressor",
    register=False,
    description="A position-wise MLP sequence regressor with knobs to slow one rank.",
)
"""The job's task: ``entrypoint: {task: gantry.training.examples.sequences:task}``."""
