"""Differentially private training (DP-SGD) for jobs whose spec sets ``training.privacy``.

::

    training:
      privacy: {epsilon: 3.0, delta: 1e-5, maxGradNorm: 1.0}

:class:`PrivateTraining` wraps a job's model, optimizer and data loader with Opacus so that
every optimizer step is one release of the sampled Gaussian mechanism:

- **Sampling.** The data loader is replaced by Opacus's Poisson sampler: each example joins
  each batch independently with probability ``q = 1 / len(data_loader)`` (about
  ``batch_size / dataset size``), so batch sizes vary and an "epoch" is ``1/q`` steps, not one
  pass over every example. The privacy analysis assumes exactly this sampling.
- **Clipping and noise.** Each example's gradient is clipped to ``maxGradNorm`` (L2, over all
  parameters), the clipped gradients are summed and Gaussian noise of standard deviation
  ``sigma * maxGradNorm`` is added before averaging.
- **Accounting.** Opacus's RDP accountant composes the steps taken so far and converts them to
  an ``(epsilon, delta)`` guarantee. The noise multiplier ``sigma`` is chosen once, at the
  start, with Opacus's ``get_noise_multiplier``: the smallest ``sigma`` (to 0.01 in epsilon)
  for which the *planned* steps spend at most the spec's ``epsilon`` at its ``delta``.
- **Enforcement.** From ``sigma`` and ``q`` the wrapper computes the step limit: the most steps
  whose epsilon stays within the budget (at least the planned steps). A step past the limit is
  refused before the optimizer changes the model or the accountant records it.

What users see: a log line at the start with ``sigma``, ``q``, the planned steps and the step
limit; :meth:`PrivateTraining.epsilon` for progress reports; a job that runs past its limit
stops with :class:`BudgetExceeded` (``FAILED_PRECONDITION``) and keeps the model as of its last
step, which is within budget. At the start, :class:`~gantry.core.InvalidInput` refuses what
cannot work: an epsilon the accountant cannot certify even at Opacus's largest noise
multiplier (:class:`UnreachableBudget`), layers Opacus cannot train privately, and distributed
models. BatchNorm (and the other layers Opacus has a replacement for) is replaced
automatically, GroupNorm for BatchNorm, with a warning in the log. A resumed job restores the
privacy already spent with :meth:`PrivateTraining.load_state_dict`.

Single process only for now: Opacus's DPDDP needs a distributed sampler, the distributed
optimizer and the per-worker batch size wired together, and none of that is tested here yet.
Noise and sampling use torch's default generator, not a cryptographically secure one (Opacus's
``secure_mode`` needs ``torchcsprng``, which the platform does not ship).
"""

from __future__ import annotations

import math
import warnings
from collections import defaultdict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, NamedTuple, cast

import numpy as np
import torch
from opacus import GradSampleModule
from opacus.accountants import RDPAccountant
from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent
from opacus.accountants.utils import MAX_SIGMA, get_noise_multiplier
from opacus.data_loader import DPDataLoader
from opacus.optimizers import DPOptimizer
from opacus.validators import ModuleValidator
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, IterableDataset

from gantry.core import InvalidInput, get_logger
from gantry.sched.spec import Privacy
from gantry.training.budget import BudgetExceeded

_log = get_logger("gantry.training.privacy")

#: Opacus's RDP conversion warns when the best order lies at the edge of its grid: a tighter
#: bound exists, but the epsilon it returns is still a valid (conservative) upper bound.
_EDGE_ORDER = r"Optimal order is the (largest|smallest) alpha"
#: torch warns when a full backward hook fires on a layer whose input (the batch) does not
#: require grad; Opacus's hooks only read the output gradient, which is what they get.
_INPUT_LAYER_HOOK = r"Full backward hook is firing when gradients are computed"
INPUT_LAYER_HOOK_WARNING = _INPUT_LAYER_HOOK
#: Step limits are searched up to here: "unlimited" for any real job.
_MAX_STEPS = 1 << 40


class UnreachableBudget(InvalidInput):
    """No noise multiplier Opacus can certify reaches the spec's epsilon over the planned steps."""

    def __init__(
        self, *, epsilon: float, delta: float, steps: int, sample_rate: float, lowest: float
    ) -> None:
        self.epsilon = epsilon
        self.delta = delta
        self.steps = steps
        self.sample_rate = sample_rate
        self.lowest = lowest
        super().__init__(
            f"spec.training.privacy.epsilon {epsilon:g} cannot be reached at delta {delta:g} "
            f"over {steps} planned steps at sample rate {sample_rate:.4g}: even noise "
            f"multiplier {MAX_SIGMA:g} spends epsilon {lowest:.3g}",
            hint=f"raise spec.training.privacy.epsilon to at least {_round_up(lowest)} or raise "
            "delta (keep it well below 1 / dataset size)",
        )


class Unwrapped(NamedTuple):
    """The plain training objects back from :meth:`PrivateTraining.unwrap`."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    data_loader: DataLoader[Any]


class PrivateTraining:
    """A model, optimizer and data loader made private for one job's privacy spec.

    Train with :attr:`model`, :attr:`optimizer` and :attr:`data_loader` instead of the objects
    passed in, and call :meth:`backward` (or ``loss.backward()``) as usual. Give exactly one of
    ``epochs`` (of :attr:`data_loader`, ``len(data_loader)`` steps each) or ``steps``: the noise
    is sized so that they spend the spec's epsilon. ``optimizer`` must hold only ``model``'s
    parameters; when layers are replaced it is pointed at the new ones in place.

    Raises :class:`~gantry.core.InvalidInput` (:class:`UnreachableBudget` for the budget) when
    the setup cannot be trained privately, saying what to change.
    """

    def __init__(
        self,
        privacy: Privacy,
        *,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        data_loader: DataLoader[Any],
        epochs: int | None = None,
        steps: int | None = None,
    ) -> None:
        _refuse_distributed(model)
        if isinstance(data_loader.dataset, IterableDataset):
            raise InvalidInput(
                "DP-SGD needs a map-style dataset: Poisson sampling picks each example by index",
                hint="give the data loader a dataset with __len__ and __getitem__",
            )
        self.budget = privacy.epsilon
        self.delta = privacy.delta
        self.max_grad_norm = privacy.max_grad_norm
        self._original = Unwrapped(model, optimizer, data_loader)

        # Everything that can refuse runs before anything touches the caller's objects.
        loader = DPDataLoader.from_data_loader(data_loader)
        self.sample_rate = float(loader.sample_rate)
        dataset_size = len(loader.dataset)
        self.planned_steps = _planned_steps(epochs, steps, steps_per_epoch=len(loader))
        self.noise_multiplier = self._choose_noise()
        compatible, self.replaced_layers = _compatible_model(model, optimizer)

        gsm = GradSampleModule(compatible, batch_first=True, loss_reduction="mean")
        # Poisson sampling already gives each step its batch; accumulating two would break the
        # accounting, so Opacus refuses a second backward before the step.
        gsm.forbid_grad_accumulation()
        dp_optimizer = DPOptimizer(
            optimizer,
            noise_multiplier=self.noise_multiplier,
            max_grad_norm=self.max_grad_norm,
            expected_batch_size=max(1, round(dataset_size * self.sample_rate)),
            loss_reduction="mean",
        )
        dp_optimizer.attach_step_hook(self._on_step)
        self._gsm: Any = gsm
        self._dp_optimizer: Any = dp_optimizer
        self._loader: Any = loader
        self._accountant = RDPAccountant()
        self._step_limit = self._compute_step_limit()

        if self.delta * dataset_size >= 1:
            _log.warning(
                "dp-sgd delta is not below 1/dataset size: the guarantee allows leaking a record",
                delta=self.delta,
                dataset_size=dataset_size,
            )
        _log.info(
            "dp-sgd ready",
            epsilon=self.budget,
            delta=self.delta,
            max_grad_norm=self.max_grad_norm,
            noise_multiplier=self.noise_multiplier,
            sample_rate=self.sample_rate,
            planned_steps=self.planned_steps,
            step_limit=self._step_limit,
        )

    @property
    def model(self) -> nn.Module:
        """The model to train: computes per-example gradients for the optimizer to clip."""
        return cast(nn.Module, self._gsm)

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The optimizer to step: clips, adds noise, records the step, refuses past the budget."""
        return cast(torch.optim.Optimizer, self._dp_optimizer)

    @property
    def data_loader(self) -> DataLoader[Any]:
        """The Poisson-sampling loader over the same dataset: batches of random size."""
        return cast(DataLoader[Any], self._loader)

    @property
    def steps_taken(self) -> int:
        """Optimizer steps recorded by the accountant (including ones restored from a state)."""
        return sum(int(n) for _, _, n in self._accountant.history)

    @property
    def steps_left(self) -> int:
        """Steps still within the budget."""
        return max(0, self._step_limit - self.steps_taken)

    def epsilon(self) -> float:
        """Epsilon spent so far at the spec's delta (0 before the first step)."""
        if not self._accountant.history:
            return 0.0
        with _ignoring(_EDGE_ORDER):
            return float(self._accountant.get_epsilon(delta=self.delta))

    def check_budget(self) -> None:
        """Raise :class:`BudgetExceeded` if one more step would spend more than the budget.

        The optimizer's step calls this itself; call it before fetching a batch to stop without
        computing one more gradient.
        """
        if self._dp_optimizer.noise_multiplier != self.noise_multiplier:
            # someone changed the noise (a scheduler): the limit must follow it
            self.noise_multiplier = float(self._dp_optimizer.noise_multiplier)
            self._step_limit = self._compute_step_limit()
        if self.steps_taken < self._step_limit:
            return
        history = [*self._accountant.history, (self.noise_multiplier, self.sample_rate, 1)]
        raise BudgetExceeded(
            budget=self.budget,
            delta=self.delta,
            spent=self.epsilon(),
            next_epsilon=_epsilon_of(history, self.delta),
            steps=self.steps_taken,
        )

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()`` without torch's warning about hooks on the input layer.

        The warning is harmless here (see the module's comments); plain ``loss.backward()``
        works the same.
        """
        with _ignoring(_INPUT_LAYER_HOOK):
            torch.autograd.backward(loss)

    def state_dict(self) -> dict[str, Any]:
        """The privacy spent so far, for the job's checkpoint.

        A resumed job must load it with :meth:`load_state_dict`: otherwise its epsilon starts
        again from zero and the reported guarantee is wrong.
        """
        return {"accountant": dict(self._accountant.state_dict())}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the privacy spent by an earlier run of the same job."""
        try:
            self._accountant.load_state_dict(dict(state["accountant"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidInput(
                f"not a DP-SGD accountant state: {exc}",
                hint="pass what PrivateTraining.state_dict() returned",
            ) from exc
        self._accountant.history = [tuple(entry) for entry in self._accountant.history]
        self._step_limit = self._compute_step_limit()

    def unwrap(self) -> Unwrapped:
        """The plain model, optimizer and data loader again; this wrapper is done after it.

        The model is the one trained (with replaced layers, if any) without Opacus's hooks.
        """
        self._dp_optimizer.attach_step_hook(None)
        return Unwrapped(
            self._gsm.to_standard_module(), self._original.optimizer, self._original.data_loader
        )

    def _on_step(self, optimizer: Any) -> None:
        # Runs inside DPOptimizer.step after the noise is drawn and before the wrapped
        # optimizer changes the parameters: refusing here leaves model and accountant as they
        # were after the last step within budget.
        self.check_budget()
        self._accountant.step(
            noise_multiplier=optimizer.noise_multiplier, sample_rate=self.sample_rate
        )

    def _choose_noise(self) -> float:
        try:
            with _ignoring(_EDGE_ORDER):
                sigma = get_noise_multiplier(
                    target_epsilon=self.budget,
                    target_delta=self.delta,
                    sample_rate=self.sample_rate,
                    steps=self.planned_steps,
                    accountant="rdp",
                )
        except ValueError as exc:  # Opacus: "The privacy budget is too low."
            lowest = _epsilon_of([(MAX_SIGMA, self.sample_rate, self.planned_steps)], self.delta)
            raise UnreachableBudget(
                epsilon=self.budget,
                delta=self.delta,
                steps=self.planned_steps,
                sample_rate=self.sample_rate,
                lowest=lowest,
            ) from exc
        return float(sigma)

    def _compute_step_limit(self) -> int:
        """The most total steps whose epsilon stays within the budget, at the current noise."""
        orders = RDPAccountant.DEFAULT_ALPHAS
        spent = np.zeros(len(orders))
        for sigma, q, n in self._accountant.history:
            spent = spent + compute_rdp(q=q, noise_multiplier=sigma, steps=n, orders=orders)
        # RDP adds up over steps, so k more steps cost k times one step
        one = compute_rdp(
            q=self.sample_rate, noise_multiplier=self.noise_multiplier, steps=1, orders=orders
        )

        def fits(k: int) -> bool:
            with _ignoring(_EDGE_ORDER):
                eps, _ = get_privacy_spent(orders=orders, rdp=spent + k * one, delta=self.delta)
            return float(eps) <= self.budget

        if not fits(1):
            return self.steps_taken
        low, high = 1, 2
        while high < _MAX_STEPS and fits(high):
            low, high = high, high * 2
        if high >= _MAX_STEPS:
            return self.steps_taken + low
        while high - low > 1:  # fits(low), not fits(high)
            mid = (low + high) // 2
            low, high = (mid, high) if fits(mid) else (low, mid)
        return self.steps_taken + low


def dp_overhead_ratio(plain_samples_per_s: float, private_samples_per_s: float) -> float:
    """How many times slower DP-SGD trains: plain throughput over private throughput.

    Both in samples per second over the same model, data and hardware; count the samples each
    Poisson batch really holds, since their size varies.
    """
    if plain_samples_per_s <= 0 or private_samples_per_s <= 0:
        raise InvalidInput(
            f"throughputs must be positive, got {plain_samples_per_s} (plain) and "
            f"{private_samples_per_s} (private) samples/s",
            hint="measure at least one step of each",
        )
    return plain_samples_per_s / private_samples_per_s


def _compatible_model(
    model: nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[nn.Module, tuple[str, ...]]:
    """``model`` ready for Opacus, and the layers replaced to get there (logged).

    Replacing layers makes a new model (Opacus deep-copies it); ``optimizer`` is pointed at
    the new parameters in place, so a learning-rate scheduler attached to it keeps working.
    """
    owned: dict[torch.Tensor, str] = {p: name for name, p in model.named_parameters()}
    if any(p not in owned for group in optimizer.param_groups for p in group["params"]):
        raise InvalidInput(
            "the optimizer holds parameters that are not the model's",
            hint="build the optimizer from model.parameters()",
        )
    model.train()
    if not _unsupported(model):
        return model, ()
    fixed: nn.Module = ModuleValidator.fix(model)
    errors = _unsupported(fixed)
    if errors:
        raise InvalidInput(
            "the model has layers Opacus cannot train privately: " + "; ".join(errors),
            hint="replace them with supported layers (GroupNorm for BatchNorm, no buffers in "
            "trainable layers; see opacus.validators)",
        )
    replaced = tuple(
        f"{name}: {type(old).__name__} -> {type(fixed.get_submodule(name)).__name__}"
        for name, old in model.named_modules()
        if type(old) in ModuleValidator.FIXERS and type(fixed.get_submodule(name)) is not type(old)
    )
    _repoint_optimizer(optimizer, owned, dict(fixed.named_parameters()))
    _log.warning(
        "dp-sgd replaced layers Opacus cannot train privately; the model trained is the new one",
        replaced=list(replaced),
    )
    return fixed, replaced


def _unsupported(model: nn.Module) -> list[str]:
    """Why Opacus cannot train ``model`` privately: its validators, then its per-example
    gradients (which need trainable layers without buffers)."""
    errors = ModuleValidator.validate(model, strict=False) + GradSampleModule.validate(
        model, strict=False
    )
    return [str(e) for e in errors]


def _repoint_optimizer(
    optimizer: torch.optim.Optimizer,
    names: Mapping[torch.Tensor, str],
    new: Mapping[str, nn.Parameter],
) -> None:
    moves: dict[torch.Tensor, nn.Parameter] = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            target = new.get(names[p])
            if target is None or target.shape != p.shape:
                raise InvalidInput(
                    f"parameter {names[p]!r} has no counterpart after replacing layers for "
                    "DP-SGD, so the optimizer cannot follow it",
                    hint="call opacus.validators.ModuleValidator.fix(model) before building "
                    "the optimizer",
                )
            moves[p] = target
    for group in optimizer.param_groups:
        group["params"] = [moves[p] for p in group["params"]]
    optimizer.state = defaultdict(dict, {moves[p]: s for p, s in optimizer.state.items()})


def _planned_steps(epochs: int | None, steps: int | None, *, steps_per_epoch: int) -> int:
    if (epochs is None) == (steps is None):
        raise InvalidInput(
            "DP-SGD needs the planned length of training to size its noise",
            hint="give exactly one of epochs or steps",
        )
    planned = steps if steps is not None else cast(int, epochs) * steps_per_epoch
    if planned < 1:
        raise InvalidInput(
            f"planned training is {planned} steps", hint="plan at least one epoch or step"
        )
    return planned


def _refuse_distributed(model: nn.Module) -> None:
    world = (
        torch.distributed.get_world_size()
        if torch.distributed.is_available() and torch.distributed.is_initialized()
        else 1
    )
    if isinstance(model, DistributedDataParallel) or world > 1:
        raise InvalidInput(
            f"DP-SGD runs in a single process for now (this job has {world} workers)",
            hint="run the job with spec.replicas: 1, or without spec.training.privacy",
        )


def _epsilon_of(history: list[tuple[float, float, int]], delta: float) -> float:
    accountant = RDPAccountant()
    accountant.history = history
    with _ignoring(_EDGE_ORDER):
        return float(accountant.get_epsilon(delta=delta))


def _round_up(value: float) -> float:
    """``value`` rounded up to two significant digits, for a hint a user can copy."""
    digits = 1 - math.floor(math.log10(value))
    return math.ceil(value * 10.0**digits) / 10.0**digits


@contextmanager
def _ignoring(message: str) -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=message, category=UserWarning)
        yield


__all__ = [
    "BudgetExceeded",
    "PrivateTraining",
    "UnreachableBudget",
    "Unwrapped",
    "dp_overhead_ratio",
]
