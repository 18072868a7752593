"""Experiments (application): trials started as jobs, reported to the search, pruned, ended.

:meth:`Experimenter.advance` is level-triggered like the pipeline controller: it reads an
experiment and its trials from the database, looks at the running trials' jobs, tells the
search how the finished ones ended, and starts new trials while fewer than ``parallelism`` run
and the budget (trials, device-hours) allows. The objective a trial's job reports after each
epoch (``gantry.metrics.job.evaluation``) arrives through :meth:`evaluation`, goes to the
pruner, and a trial the pruner stops is cancelled at once, freeing its devices. A trial is
marked ``starting`` before its job is submitted with a request id made of the experiment and
the trial number, so a crash between the two never runs a trial twice.

Device-seconds are what the scheduler measured: a worker's run time times its GPUs (a
CPU-only worker counts as one device), summed over the trial's workers.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
import sqlalchemy as sa

from gantry.core import (
    AlreadyExists,
    Clock,
    Conflict,
    GantryError,
    NotFound,
    SystemClock,
    Unavailable,
    get_logger,
)
from gantry.events.catalog import ExperimentChanged, TrialChanged
from gantry.workflows import store
from gantry.workflows.experiments import ExperimentSpec, parse_experiment, trial_document
from gantry.workflows.platform import Owner, Platform
from gantry.workflows.search import Search

_log = get_logger("gantry.workflows.experimenter")
ACTIVE = ("starting", "running")


@dataclass
class TrialView:
    """One trial: the values it tried, how it went, what it cost."""

    number: int
    state: str
    values: dict[str, Any]
    job_id: str = ""
    value: float | None = None
    curve: list[tuple[int, float]] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    model: str = ""
    reason: str = ""
    device_s: float = 0.0
    started_ms: int = 0
    finished_ms: int = 0

    @property
    def epochs(self) -> int:
        """Epochs it reported (a pruned trial stops early)."""
        return max((e for e, _ in self.curve), default=0)


@dataclass
class ExperimentView:
    """An experiment with its trials and the best one so far."""

    name: str
    owner: str
    roles: tuple[str, ...]
    state: str
    reason: str
    spec: ExperimentSpec
    source: str
    study: str
    run_id: str = ""
    trials: list[TrialView] = field(default_factory=list)
    best_trial: int = -1
    created_ms: int = 0
    finished_ms: int = 0

    @property
    def best(self) -> TrialView | None:
        return next((t for t in self.trials if t.number == self.best_trial), None)

    @property
    def device_s(self) -> float:
        return sum(t.device_s for t in self.trials)

    @property
    def done(self) -> bool:
        return self.state in ("succeeded", "failed", "cancelled")


class Experimenter:
    """Runs experiments; every public method is safe to call from any thread."""

    def __init__(
        self,
        engine: sa.Engine,
        platform: Platform,
        study_url: str,
        clock: Clock = SystemClock(),
    ) -> None:
        self.engine = engine
        self.platform = platform
        self.study_url = study_url
        self.clock = clock
        self.on_change: Callable[[], None] = lambda: None
        self._lock = threading.RLock()
        self._searches: dict[str, Search] = {}

    def now_ms(self) -> int:
        return int(self.clock.now().timestamp() * 1000)

    # -- the API's operations -----------------------------------------------------------------

    def submit(self, source: str, *, owner: Owner, dry_run: bool = False) -> ExperimentView:
        """Check an Experiment document and start it (unless ``dry_run``)."""
        experiment = parse_experiment(source)
        if dry_run:
            return self._view_of(experiment.name, owner, experiment.spec, source, "checked")
        return self.start(experiment.name, experiment.spec, source, owner=owner)

    def start(
        self,
        name: str,
        spec: ExperimentSpec,
        source: str,
        *,
        owner: Owner,
        run_id: str = "",
    ) -> ExperimentView:
        """Start experiment ``name`` (a repeat with the same ``run_id`` returns it)."""
        now = self.now_ms()
        with self._lock:
            with self.engine.begin() as conn:
                row = conn.execute(
                    sa.select(store.experiments).where(store.experiments.c.name == name)
                ).first()
                if row is not None:
                    if run_id and row.run_id == run_id:
                        return self._view(conn, row)
                    raise AlreadyExists(
                        f"experiment {name} already exists",
                        hint="experiments keep their history: choose another name",
                    )
                conn.execute(
                    store.experiments.insert().values(
                        name=name,
                        owner=owner.subject,
                        roles_json=store.dumps(list(owner.roles)),
                        spec_json=spec.model_dump_json(by_alias=True),
                        source=source,
                        study=f"gantry-{name}-{now}",
                        state="running",
                        reason=f"searching {spec.budget.trials} trials with {spec.method}",
                        run_id=run_id,
                        best_trial=-1,
                        created_ms=now,
                        finished_ms=0,
                    )
                )
                self._experiment_event(conn, name, owner.subject, "running", "", spec, -1, None, 0)
            self.on_change()
        self.advance(name)
        return self.get(name)

    def get(self, name: str) -> ExperimentView:
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(store.experiments).where(store.experiments.c.name == name)
            ).first()
            if row is None:
                raise NotFound(
                    "experiment", name, hint="list experiments with `gantry experiments list`"
                )
            return self._view(conn, row)

    def list(self, *, state: str = "") -> list[ExperimentView]:
        with self.engine.connect() as conn:
            query = sa.select(store.experiments).order_by(store.experiments.c.created_ms.desc())
            if state:
                query = query.where(store.experiments.c.state == state)
            return [self._view(conn, row) for row in conn.execute(query).all()]

    def cancel(self, name: str, reason: str) -> ExperimentView:
        """Cancel the experiment and its running trials."""
        with self._lock:
            exp = self.get(name)
            if exp.done:
                raise Conflict(f"experiment {name} already {exp.state}")
            owner = Owner(exp.owner, exp.roles)
            search = self._search(exp)
            for t in exp.trials:
                if t.state in ACTIVE:
                    if t.job_id:
                        try:
                            self.platform.cancel_job(
                                t.job_id, f"experiment cancelled: {reason}", owner=owner
                            )
                            # what it has cost until now: the experiment ends here and is
                            # never looked at again
                            t.device_s = self.platform.job(t.job_id, owner=owner).device_seconds
                        except GantryError as exc:
                            _log.warning("trial job not cancelled", job=t.job_id, error=str(exc))
                    search.failed(t.number)
                    self._trial(exp, t, "cancelled", reason or "the experiment was cancelled")
            self._finish(exp, "cancelled", reason or "cancelled")
        return self.get(name)

    # -- the loop -----------------------------------------------------------------------------

    def tick(self) -> int:
        """Advance every running experiment; how many."""
        names = [e.name for e in self.list(state="running")]
        for name in names:
            try:
                self.advance(name)
            except GantryError as exc:
                _log.warning("experiment not advanced", experiment=name, error=str(exc))
        return len(names)

    def knows(self, job_id: str) -> bool:
        """Whether ``job_id`` is a trial's job."""
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(store.trials.c.number).where(store.trials.c.job_id == job_id)
            ).first()
        return row is not None

    def evaluation(self, job_id: str, epoch: int, metrics: Mapping[str, float]) -> bool:
        """A trial's job evaluated after ``epoch``: report the objective; prune if the pruner
        says so. False when no running trial has this job."""
        with self._lock:
            with self.engine.connect() as conn:
                row = conn.execute(
                    sa.select(store.trials).where(store.trials.c.job_id == job_id)
                ).first()
            if row is None or row.state != "running":
                return False
            exp = self.get(row.experiment)
            if exp.done:
                return False
            trial = next(t for t in exp.trials if t.number == row.number)
            metric = exp.spec.objective.metric
            if metric not in metrics:
                return True
            value = float(metrics[metric])
            if any(e == epoch for e, _ in trial.curve):
                return True  # a redelivered event
            trial.curve.append((epoch, value))
            prune = self._search(exp).report(trial.number, epoch, value)
            if prune:
                owner = Owner(exp.owner, exp.roles)
                try:
                    self.platform.cancel_job(
                        job_id, f"pruned at epoch {epoch}: {metric} {value:.4g}", owner=owner
                    )
                except GantryError as exc:
                    _log.warning("pruned trial's job not cancelled", job=job_id, error=str(exc))
                self._search(exp).pruned(trial.number)
                trial.value = value
                self._trial(
                    exp,
                    trial,
                    "pruned",
                    f"pruned at epoch {epoch}: {metric} {value:.4g} was behind the other trials "
                    f"at that epoch ({exp.spec.pruner.kind})",
                )
            else:
                self._save_trial(trial, exp.name)
            return True

    def advance(self, name: str) -> ExperimentView:
        """Observe running trials, start new ones within the budget, end when done."""
        with self._lock:
            exp = self.get(name)
            if exp.done:
                return exp
            owner = Owner(exp.owner, exp.roles)
            search = self._search(exp)
            spec = exp.spec
            metric = spec.objective.metric
            stopping = False  # a pruned trial's job is still being cancelled
            for t in exp.trials:
                if t.state == "starting":
                    self._submit(exp, t, owner)
                elif t.state in ("running", "pruned") and t.job_id:
                    ended = self._observe(exp, t, owner, search, metric)
                    stopping = stopping or (t.state == "pruned" and not ended)
            budget_s = spec.budget.gpu_hours * 3600 if spec.budget.gpu_hours else None
            while True:
                running = [t for t in exp.trials if t.state in ACTIVE]
                over = budget_s is not None and exp.device_s >= budget_s
                if (
                    len(running) >= spec.parallelism
                    or len(exp.trials) >= spec.budget.trials
                    or over
                ):
                    break
                asked = search.ask()
                trial = TrialView(
                    number=asked.number,
                    state="starting",
                    values=dict(asked.values),
                    started_ms=self.now_ms(),
                )
                exp.trials.append(trial)
                self._trial(exp, trial, "starting", "")
                self._submit(exp, trial, owner)
                if trial.state == "starting":
                    break  # the scheduler is unavailable: try again next tick
            self._best(exp)
            running = [t for t in exp.trials if t.state in ACTIVE]
            over = budget_s is not None and exp.device_s >= budget_s
            # the last pruned jobs end before the experiment does, or their cost is lost
            if not running and not stopping and (len(exp.trials) >= spec.budget.trials or over):
                best = exp.best
                if best is None:
                    self._finish(exp, "failed", "no trial succeeded: " + _why(exp))
                else:
                    pruned = sum(1 for t in exp.trials if t.state == "pruned")
                    spent = f"{exp.device_s:.0f} device-seconds"
                    self._finish(
                        exp,
                        "succeeded",
                        f"best trial {best.number}: {metric} {best.value:.4g} with "
                        f"{_values(best.values)}; {len(exp.trials)} trials ({pruned} pruned), "
                        + spent
                        + (" (the device-hour budget ran out)" if over else ""),
                    )
            return self.get(name)

    # -- one trial ----------------------------------------------------------------------------

    def _submit(self, exp: ExperimentView, t: TrialView, owner: Owner) -> None:
        document = trial_document(
            exp.name, exp.spec, number=t.number, values=t.values, run_id=exp.run_id
        )
        try:
            job_id = self.platform.submit_job(
                document, request_id=f"exp-{exp.study}-{t.number}", owner=owner
            )
        except Unavailable as exc:
            _log.warning("trial not started yet", experiment=exp.name, error=str(exc))
            return
        except GantryError as exc:
            self._search(exp).failed(t.number)
            self._trial(exp, t, "failed", f"{type(exc).__name__}: {exc.message}")
            return
        t.job_id = job_id
        self._trial(exp, t, "running", f"job {job_id}")

    def _observe(
        self, exp: ExperimentView, t: TrialView, owner: Owner, search: Search, metric: str
    ) -> bool:
        """Record how trial ``t``'s job ended, if it has; whether there is no more to wait for
        (it ended, or the scheduler cannot say for good)."""
        try:
            status = self.platform.job(t.job_id, owner=owner)
        except Unavailable:
            return False
        except GantryError:
            return True
        if not status.terminal:
            return False
        t.device_s = status.device_seconds
        t.metrics = {k: float(v) for k, v in status.metrics.items()}
        t.model = status.model
        if t.state == "pruned":  # its job has ended now: record what it cost
            t.finished_ms = t.finished_ms or self.now_ms()
            self._save_trial(t, exp.name)
            return True
        if status.state != "succeeded":
            search.failed(t.number)
            self._trial(exp, t, "failed", f"job {status.id} {status.state}: {status.reason}")
            return True
        if metric not in t.metrics:
            search.failed(t.number)
            have = ", ".join(sorted(t.metrics)) or "none"
            self._trial(exp, t, "failed", f"the job reported no {metric!r} (it reported: {have})")
            return True
        t.value = t.metrics[metric]
        search.succeeded(t.number, t.value)
        self._trial(exp, t, "succeeded", f"{metric} {t.value:.4g}")
        return True

    def _best(self, exp: ExperimentView) -> None:
        done = [t for t in exp.trials if t.state == "succeeded" and t.value is not None]
        if not done:
            return
        sign = 1.0 if exp.spec.objective.goal == "maximize" else -1.0
        best = max(done, key=lambda t: sign * (t.value or 0.0))
        if best.number != exp.best_trial:
            exp.best_trial = best.number
            with self.engine.begin() as conn:
                conn.execute(
                    store.experiments.update()
                    .where(store.experiments.c.name == exp.name)
                    .values(best_trial=best.number)
                )

    # -- records and events -------------------------------------------------------------------

    def _search(self, exp: ExperimentView) -> Search:
        search = self._searches.get(exp.study)
        if search is None:
            search = self._searches[exp.study] = Search(self.study_url, exp.study, exp.spec)
        return search

    def _trial(self, exp: ExperimentView, t: TrialView, state: str, reason: str) -> None:
        t.state, t.reason = state, reason
        if state not in ACTIVE:
            t.finished_ms = self.now_ms()
        with self.engine.begin() as conn:
            self._write_trial(conn, t, exp.name)
            store.record(
                conn,
                "gantry.workflow.trial.changed",
                TrialChanged(
                    experiment=exp.name,
                    number=t.number,
                    state=state,
                    job_id=t.job_id,
                    values=t.values,
                    value=t.value,
                    epoch=t.epochs,
                    reason=reason,
                ),
                actor=exp.owner,
                subject=f"{exp.name}/{t.number}",
            )
        self.on_change()

    def _save_trial(self, t: TrialView, name: str) -> None:
        with self.engine.begin() as conn:
            self._write_trial(conn, t, name)

    def _write_trial(self, conn: sa.Connection, t: TrialView, name: str) -> None:
        values = {
            "state": t.state,
            "job_id": t.job_id,
            "values_json": store.dumps(t.values),
            "value": t.value,
            "curve_json": store.dumps([list(p) for p in t.curve]),
            "metrics_json": store.dumps(t.metrics),
            "model": t.model,
            "reason": t.reason,
            "device_s": t.device_s,
            "started_ms": t.started_ms,
            "finished_ms": t.finished_ms,
        }
        table = store.trials
        updated = conn.execute(
            table.update()
            .where(table.c.experiment == name, table.c.number == t.number)
            .values(**values)
        ).rowcount
        if not updated:
            conn.execute(table.insert().values(experiment=name, number=t.number, **values))

    def _finish(self, exp: ExperimentView, state: str, reason: str) -> None:
        best = exp.best
        with self.engine.begin() as conn:
            conn.execute(
                store.experiments.update()
                .where(store.experiments.c.name == exp.name)
                .values(state=state, reason=reason, finished_ms=self.now_ms())
            )
            self._experiment_event(
                conn,
                exp.name,
                exp.owner,
                state,
                exp.state,
                exp.spec,
                exp.best_trial,
                best.value if best is not None else None,
                len(exp.trials),
                reason=reason,
            )
        exp.state, exp.reason = state, reason
        self.on_change()
        _log.info("experiment ended", experiment=exp.name, state=state, reason=reason)

    def _experiment_event(
        self,
        conn: sa.Connection,
        name: str,
        owner: str,
        state: str,
        previous: str,
        spec: ExperimentSpec,
        best_trial: int,
        best_value: float | None,
        trials: int,
        *,
        reason: str = "",
    ) -> None:
        store.record(
            conn,
            "gantry.workflow.experiment.changed",
            ExperimentChanged(
                experiment=name,
                state=state,
                previous=previous,
                reason=reason,
                owner=owner,
                objective=f"{spec.objective.goal} {spec.objective.metric}",
                best_trial=best_trial,
                best_value=best_value,
                trials=trials,
            ),
            actor=owner,
            subject=name,
        )

    def _view(self, conn: sa.Connection, row: Any) -> ExperimentView:
        spec = ExperimentSpec.model_validate_json(row.spec_json)
        rows = conn.execute(
            sa.select(store.trials)
            .where(store.trials.c.experiment == row.name)
            .order_by(store.trials.c.number)
        ).all()
        trials = [
            TrialView(
                number=r.number,
                state=r.state,
                values=orjson.loads(r.values_json),
                job_id=r.job_id,
                value=r.value,
                curve=[(int(e), float(v)) for e, v in orjson.loads(r.curve_json)],
                metrics=orjson.loads(r.metrics_json),
                model=r.model,
                reason=r.reason,
                device_s=r.device_s,
                started_ms=r.started_ms,
                finished_ms=r.finished_ms,
            )
            for r in rows
        ]
        return ExperimentView(
            name=row.name,
            owner=row.owner,
            roles=tuple(orjson.loads(row.roles_json)),
            state=row.state,
            reason=row.reason,
            spec=spec,
            source=row.source,
            study=row.study,
            run_id=row.run_id,
            trials=trials,
            best_trial=row.best_trial,
            created_ms=row.created_ms,
            finished_ms=row.finished_ms,
        )

    def _view_of(
        self, name: str, owner: Owner, spec: ExperimentSpec, source: str, state: str
    ) -> ExperimentView:
        return ExperimentView(
            name, owner.subject, owner.roles, state, "", spec, source, study="", trials=[]
        )


def _values(values: Mapping[str, Any]) -> str:
    return ", ".join(
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items()
    )


def _why(exp: ExperimentView) -> str:
    reasons = [t.reason for t in exp.trials if t.state == "failed"]
    return reasons[0] if reasons else "every trial was pruned or cancelled"


__all__ = ["ExperimentView", "Experimenter", "TrialView"]
