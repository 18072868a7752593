"""The reference task of ``bench/training.py``: a teacher-labelled classification problem.

A fixed random two-layer "teacher" labels Gaussian inputs with one of ten classes; a three-layer
MLP (about 330 k parameters, 1.3 MB of fp32 gradients per step) learns it with cross-entropy.
Everything is generated from fixed seeds, so every run, rank and compression mode sees the same
data. The benchmark imports it directly, and the resume measurement runs it as a real job
(``python -m gantry.training.run _training_task:task`` with ``bench/`` on ``PYTHONPATH``).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

from gantry.training import Task
from gantry.training.task import DataContext

FEATURES = 128
HIDDEN = 512
CLASSES = 10
SAMPLES = 16384
BATCH = 64  # per worker and step
LR = 1e-3


def build_model() -> nn.Module:
    """The student MLP (same initial weights whenever the caller seeds torch the same)."""
    return nn.Sequential(
        nn.Linear(FEATURES, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, CLASSES),
    )


def reference_data(samples: int = SAMPLES) -> TensorDataset:
    """``samples`` Gaussian inputs and the teacher's labels for them (deterministic)."""
    g = torch.Generator().manual_seed(2024)
    inputs = torch.randn(samples, FEATURES, generator=g)
    w1 = torch.randn(FEATURES, 64, generator=g) / FEATURES**0.5
    w2 = torch.randn(64, CLASSES, generator=g)
    labels = (torch.tanh(inputs @ w1) @ w2).argmax(dim=1)
    return TensorDataset(inputs, labels)


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy, averaged over the batch."""
    return nn.functional.cross_entropy(output, target)


def full_loss(model: nn.Module, data: TensorDataset) -> float:
    """The loss of ``model`` over all of ``data`` (what "final loss" means in the benchmark)."""
    inputs, labels = data.tensors
    was_training = model.training
    model.eval()
    with torch.no_grad():
        loss = float(loss_fn(model(inputs), labels))
    model.train(was_training)
    return loss


def _dataset(ctx: DataContext) -> TensorDataset:
    return reference_data()


task = Task(
    model=build_model,
    loss=loss_fn,
    dataset=_dataset,
    # long enough that the resume measurement kills it mid-run
    options={"micro_batch_size": BATCH, "epochs": 10_000, "lr": LR},
    register=False,
    description="bench/training.py reference task",
)
