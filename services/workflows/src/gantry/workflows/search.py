"""The search (adapter over Optuna): one study per experiment, kept in a database.

:class:`Search` asks the study's sampler (TPE or random) for the next trial's values, reports
each trial's objective per epoch to its pruner (successive halving, Hyperband or median) and
tells the study how each trial ended. The study lives in an Optuna RDB storage (SQLite by
default, PostgreSQL on clusters), so a restarted service carries on with the same history:
the sampler still knows every trial, the pruner every reported value.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gantry.workflows.experiments import Experiment, ExperimentSpec

_lock = threading.Lock()


@dataclass(frozen=True)
class Asked:
    """A new trial: Optuna's number for it and the values to try."""

    number: int
    values: Mapping[str, Any]


def _optuna() -> Any:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


class Search:
    """The study of one experiment."""

    def __init__(self, storage_url: str, study: str, spec: ExperimentSpec) -> None:
        optuna = _optuna()
        self.spec = spec
        self._storage = _storage(storage_url)
        self.study = optuna.create_study(
            study_name=study,
            storage=self._storage,
            direction=spec.objective.goal,
            sampler=spec.sampler(),
            pruner=spec.pruner.optuna(),
            load_if_exists=True,
        )
        self._distributions = Experiment.distributions_of(spec)

    def ask(self) -> Asked:
        """The next trial's values (from everything the study knows so far)."""
        trial = self.study.ask(self._distributions)
        return Asked(trial.number, dict(trial.params))

    def _trial(self, number: int) -> Any:
        optuna = _optuna()
        study_id = self._storage.get_study_id_from_name(self.study.study_name)
        trial_id = self._storage.get_trial_id_from_study_id_trial_number(study_id, number)
        return optuna.trial.Trial(self.study, trial_id)

    def report(self, number: int, epoch: int, value: float) -> bool:
        """Record ``value`` at ``epoch``; whether the pruner says to stop the trial now."""
        if not math.isfinite(value):
            return False
        trial = self._trial(number)
        trial.report(value, epoch)
        return bool(trial.should_prune())

    def succeeded(self, number: int, value: float) -> None:
        self.study.tell(number, value, skip_if_finished=True)

    def pruned(self, number: int) -> None:
        optuna = _optuna()
        self.study.tell(number, state=optuna.trial.TrialState.PRUNED, skip_if_finished=True)

    def failed(self, number: int) -> None:
        optuna = _optuna()
        self.study.tell(number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)


_storages: dict[str, Any] = {}


def _storage(url: str) -> Any:
    with _lock:
        if url not in _storages:
            _storages[url] = _optuna().storages.RDBStorage(url)
        return _storages[url]


__all__ = ["Asked", "Search"]
