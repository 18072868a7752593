"""DP-SGD: private training reaches its epsilon, stops at its budget, refuses what cannot work."""

from __future__ import annotations

import copy
import re

import pytest
import torch
from opacus import GradSampleModule
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from gantry.core import Conflict, InvalidInput
from gantry.sched.spec import Privacy
from gantry.training.privacy import (
    BudgetExceeded,
    PrivateTraining,
    UnreachableBudget,
    dp_overhead_ratio,
)

FEATURES = 10
BATCH = 64


def separable(n: int, *, seed: int) -> TensorDataset:
    """Two classes split by a fixed random hyperplane (the same one for every seed)."""
    plane = torch.randn(FEATURES, generator=torch.Generator().manual_seed(0))
    x = torch.randn(n, FEATURES, generator=torch.Generator().manual_seed(seed))
    return TensorDataset(x, (x @ plane > 0).long())


def classifier() -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, 2))


def private(
    model: nn.Module, *, epsilon: float = 3.0, lr: float = 0.5, **planned: int
) -> PrivateTraining:
    return PrivateTraining(
        Privacy(epsilon=epsilon, delta=1e-5, maxGradNorm=1.0),
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=lr),
        data_loader=DataLoader(separable(2000, seed=1), batch_size=BATCH),
        **(planned or {"epochs": 3}),
    )


def train_step(dp: PrivateTraining, x: torch.Tensor, y: torch.Tensor) -> None:
    dp.optimizer.zero_grad()
    dp.backward(nn.functional.cross_entropy(dp.model(x), y))
    dp.optimizer.step()


def accuracy(model: nn.Module, data: TensorDataset) -> float:
    x, y = data.tensors
    with torch.no_grad():
        return (model(x).argmax(dim=1) == y).float().mean().item()


def flat_grad(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def test_trains_privately_to_accuracy_and_spends_about_its_epsilon() -> None:
    torch.manual_seed(0)
    dp = private(classifier(), epsilon=3.0, epochs=3)
    assert dp.planned_steps == 3 * len(dp.data_loader)
    for _ in range(3):
        for x, y in dp.data_loader:
            dp.check_budget()
            train_step(dp, x, y)

    assert dp.steps_taken == dp.planned_steps
    assert 1.5 < dp.epsilon() <= 3.0
    assert accuracy(dp.model, separable(1000, seed=2)) > 0.8


def test_a_job_that_trains_past_its_budget_stops_before_exceeding_it() -> None:
    torch.manual_seed(0)
    dp = private(classifier(), epsilon=1.0, epochs=1)
    reported = 0.0
    with pytest.raises(BudgetExceeded) as stopped:
        for _ in range(10):  # ten epochs on noise sized for one
            for x, y in dp.data_loader:
                before = [p.detach().clone() for p in dp.model.parameters()]
                train_step(dp, x, y)  # no check_budget(): the optimizer refuses by itself
                reported = dp.epsilon()

    assert dp.planned_steps <= dp.steps_taken < 2 * dp.planned_steps
    assert dp.steps_left == 0
    assert reported == dp.epsilon() <= 1.0
    # the refused step changed nothing
    assert all(torch.equal(a, b) for a, b in zip(before, dp.model.parameters(), strict=True))
    error = stopped.value
    assert isinstance(error, Conflict)
    assert error.spent <= error.budget == 1.0 < error.next_epsilon
    assert error.steps == dp.steps_taken
    assert "spec.training.privacy.epsilon" in str(error)
    with pytest.raises(BudgetExceeded):
        dp.check_budget()


def test_an_unreachable_epsilon_is_refused_at_the_start_saying_what_to_change() -> None:
    model = classifier()
    with pytest.raises(UnreachableBudget) as refused:
        private(model, epsilon=0.01, epochs=3)

    error = refused.value
    assert isinstance(error, InvalidInput)
    assert error.epsilon == 0.01
    assert error.lowest > 0.01
    assert "spec.training.privacy.epsilon 0.01 cannot be reached" in error.message
    suggested = re.search(r"raise spec.training.privacy.epsilon to at least ([\d.]+)", str(error))
    assert suggested is not None
    assert error.lowest <= float(suggested[1]) < 1.1 * error.lowest
    assert not any(m._forward_hooks for m in model.modules())  # refused before wrapping it


def test_batchnorm_is_replaced_by_groupnorm_and_the_optimizer_follows() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2))
    dp = private(model)

    assert dp.replaced_layers == ("1: BatchNorm1d -> GroupNorm",)
    kinds = {type(m) for m in dp.model.modules()}
    assert nn.GroupNorm in kinds
    assert nn.BatchNorm1d not in kinds
    params = [p for group in dp.optimizer.param_groups for p in group["params"]]
    assert {id(p) for p in params} == {id(p) for p in dp.model.parameters()}
    norm_weight = dp.model.get_submodule("_module.1").weight.detach().clone()
    x, y = next(iter(dp.data_loader))
    train_step(dp, x, y)
    assert not torch.equal(norm_weight, dp.model.get_submodule("_module.1").weight)
    assert isinstance(model[1], nn.BatchNorm1d)  # the caller's model is left as it was


class _RunningScale(nn.Module):
    """A trainable layer with a buffer, which Opacus has no replacement for."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(FEATURES))
        self.register_buffer("seen", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight


def test_a_layer_opacus_cannot_handle_is_refused_with_its_reason() -> None:
    with pytest.raises(InvalidInput, match=r"privately: .*trainable layer with buffers"):
        private(nn.Sequential(_RunningScale(), nn.Linear(FEATURES, 2)))


def test_each_example_is_clipped_and_noise_is_added() -> None:
    torch.manual_seed(0)
    plain = classifier()
    dp = private(copy.deepcopy(plain), lr=0.0)  # lr 0: look at the gradients, keep the model
    x, y = separable(32, seed=3).tensors
    x = x.clone()
    x[0] *= 1e4  # one outlier whose gradient would swamp the batch

    nn.functional.cross_entropy(plain(x), y).backward()
    plain_norm = flat_grad(plain).norm().item()
    dp.optimizer.zero_grad()
    dp.backward(nn.functional.cross_entropy(dp.model(x), y))
    per_example = torch.cat(
        [p.grad_sample.flatten(start_dim=1) for p in dp.model.parameters()], dim=1
    ).norm(dim=1)
    dp.optimizer.step()
    first = flat_grad(dp.model).clone()
    train_step(dp, x, y)
    second = flat_grad(dp.model)

    assert per_example[0] > 100 * dp.max_grad_norm  # clipping had work to do
    expected_batch = 2000 * dp.sample_rate
    noise = dp.noise_multiplier * dp.max_grad_norm * first.numel() ** 0.5
    bound = (len(x) * dp.max_grad_norm + 2 * noise) / expected_batch
    assert first.norm() < bound < plain_norm / 100
    assert not torch.equal(first, second)  # the same batch, different noise


def test_privacy_spent_survives_a_restart() -> None:
    torch.manual_seed(0)
    dp = private(classifier(), epsilon=2.0, epochs=1)
    for _, (x, y) in zip(range(5), dp.data_loader, strict=False):
        train_step(dp, x, y)
    resumed = private(classifier(), epsilon=2.0, epochs=1)
    resumed.load_state_dict(dp.state_dict())

    assert resumed.steps_taken == 5
    assert resumed.epsilon() == dp.epsilon() > 0
    assert resumed.steps_left == dp.steps_left
    with pytest.raises(InvalidInput, match="accountant state"):
        resumed.load_state_dict({"accountant": {}})


def test_unwrap_gives_back_plain_objects_for_throughput_comparisons() -> None:
    model = classifier()
    dp = private(model)
    plain = dp.unwrap()

    assert plain.model is model
    assert not isinstance(plain.model, GradSampleModule)
    assert all(not hasattr(p, "grad_sample") for p in plain.model.parameters())
    assert isinstance(plain.optimizer, torch.optim.SGD)
    assert plain.data_loader.batch_size == BATCH
    assert dp_overhead_ratio(1000.0, 250.0) == 4.0
    with pytest.raises(InvalidInput):
        dp_overhead_ratio(1000.0, 0.0)


def test_training_length_must_be_planned_exactly_once() -> None:
    with pytest.raises(InvalidInput, match="exactly one of epochs or steps"):
        private(classifier(), epochs=1, steps=10)
