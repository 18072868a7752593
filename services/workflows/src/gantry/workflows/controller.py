"""Runs (application): start, cancel, retry; the reconcile loop that moves them on; cron fires.

The controller is level-triggered, like a Kubernetes controller: :meth:`Controller.advance`
reads a run from the database, looks at what its in-flight steps became (the job through the
scheduler, the rollout through serving), asks :func:`~gantry.workflows.runs.plan` what to do,
does it and writes the run back with its events. Job events only say *which* run to look at
(:meth:`job_changed`); every active run is also looked at every ``resync_s`` seconds, so a
missed event delays a run but never strands it, and a service restarted mid-run carries on
from the database. A step is marked ``starting`` (and saved) before its job is submitted with
a request id made of the run, the step and the attempt, so a submission interrupted by a crash
is repeated and the scheduler answers with the same job.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
import yaml

from gantry.core import (
    Clock,
    Conflict,
    GantryError,
    InvalidInput,
    NotFound,
    SystemClock,
    Unavailable,
    get_logger,
    new_id,
)
from gantry.events.catalog import WorkflowRunChanged, WorkflowStepChanged
from gantry.workflows import store
from gantry.workflows.cron import due
from gantry.workflows.experimenter import Experimenter
from gantry.workflows.pipelines import Pipeline, Step, job_document
from gantry.workflows.platform import JobStatus, Owner, Platform, lineage_of
from gantry.workflows.references import Reference, Unresolved, substitute
from gantry.workflows.registry import Registry
from gantry.workflows.runs import (
    RUN_ACTIVE,
    Artifact,
    Attempt,
    Finish,
    Run,
    Skip,
    Start,
    StepRun,
    new_run,
    plan,
    resolve,
)

_log = get_logger("gantry.workflows.controller")


@dataclass(frozen=True)
class Caller:
    """Who asks: the subject and the roles their token carried."""

    subject: str
    roles: tuple[str, ...]


class Controller:
    """Moves runs forward; every public method is safe to call from any thread."""

    def __init__(
        self,
        engine: sa.Engine,
        registry: Registry,
        platform: Platform,
        clock: Clock = SystemClock(),
        *,
        resync_s: float = 30.0,
        poll_s: float = 2.0,
    ) -> None:
        self.engine = engine
        self.registry = registry
        self.platform = platform
        self.clock = clock
        self.resync_s = resync_s
        self.poll_s = poll_s
        self.on_change: Callable[[], None] = lambda: None
        self.experimenter: Experimenter | None = None
        """Runs the ``experiment`` steps (the service sets it)."""
        self._lock = threading.RLock()
        self._dirty: set[str] = set()
        self._last_resync = 0.0
        self._last_poll = 0.0
        self._events: list[tuple[str, Any, str, str]] = []

    def now_ms(self) -> int:
        return int(self.clock.now().timestamp() * 1000)

    # -- the API's operations -----------------------------------------------------------------

    def start(
        self,
        name: str,
        params: Mapping[str, str],
        *,
        caller: Caller,
        request_id: str = "",
        trigger: str = "manual",
        reason: str = "",
        cause: Mapping[str, str] | None = None,
    ) -> tuple[Run, bool]:
        """Start a run of pipeline ``name`` as ``caller``; (the run, whether it is a repeat of
        ``request_id``). ``cause`` is kept in the run's parameters beside the declared ones
        (``erasure.id``: not an identifier, so no ``${params...}`` can name it)."""
        record = self.registry.get(name)
        pipeline = record.pipeline
        values = {**pipeline.run_params(params), **(cause or {})}
        with self._lock:
            if request_id:
                with self.engine.connect() as conn:
                    earlier = store.run_by_request(conn, request_id)
                if earlier is not None:
                    return earlier, True
            now = self.now_ms()
            run = new_run(
                pipeline,
                id=new_id(),
                revision=record.revision,
                owner=caller.subject,
                roles=caller.roles,
                params=values,
                trigger=trigger,
                now_ms=now,
            )
            run.reason = reason
            self._run_event(run, "")
            self._save(run, request_id=request_id or None)
            self._dirty.add(run.id)
        self.advance(run.id)
        return self.get(run.id), False

    def get(self, run_id: str) -> Run:
        with self.engine.connect() as conn:
            run = store.get_run(conn, run_id)
        if run is None:
            raise NotFound("run", run_id, hint="list runs with `gantry pipelines runs list`")
        return run

    def list(self, *, pipeline: str = "", state: str = "", limit: int = 100) -> list[Run]:
        with self.engine.connect() as conn:
            return store.list_runs(conn, pipeline=pipeline, state=state, limit=limit)

    def active_runs(self, pipeline: str) -> int:
        return sum(1 for r in self.list(pipeline=pipeline, limit=10_000) if r.state in RUN_ACTIVE)

    def cancel(self, run_id: str, reason: str, *, caller: Caller) -> Run:
        """Cancel the run: its running jobs are cancelled, its pending steps never start."""
        with self._lock:
            run = self.get(run_id)
            if run.done:
                raise Conflict(
                    f"run {run_id} already {run.state}", hint="only an active run can be cancelled"
                )
            self._cancel(run, reason or f"cancelled by {caller.subject}")
        return self.get(run_id)

    def _cancel(self, run: Run, reason: str) -> None:
        owner = Owner(run.owner, run.roles)
        now = self.now_ms()
        for sr in run.steps.values():
            experiment = sr.outputs.get("experiment", "")
            if sr.state == "running" and experiment and self.experimenter is not None:
                try:
                    self.experimenter.cancel(experiment, f"pipeline run cancelled: {reason}")
                except GantryError as exc:
                    _log.warning("could not cancel a step's experiment", error=str(exc))
            if sr.state in ("running", "starting") and sr.job_id:
                try:
                    self.platform.cancel_job(
                        sr.job_id, f"pipeline run cancelled: {reason}", owner=owner
                    )
                except GantryError as exc:
                    _log.warning(
                        "could not cancel a step's job", run=run.id, job=sr.job_id, error=str(exc)
                    )
            if not sr.done:
                self._step(run, sr, "cancelled", reason, now)
        self._finish(run, "cancelled", reason, now)
        self._save(run)

    def retry(self, run_id: str, *, caller: Caller, from_step: str = "") -> Run:
        """Run a finished run's failed, cancelled and not-run steps again (from ``from_step``
        and everything after it, when given); steps that succeeded keep their outputs."""
        with self._lock:
            run = self.get(run_id)
            if not run.done:
                raise Conflict(
                    f"run {run_id} is still {run.state}",
                    hint="wait for it to end (or cancel it) before retrying it",
                )
            pipeline = self.registry.revision(run.pipeline, run.revision)
            again: set[str] = set()
            if from_step:
                if from_step not in run.steps:
                    raise InvalidInput(
                        f"run {run_id} has no step {from_step!r}",
                        hint=f"its steps: {', '.join(run.steps)}",
                    )
                again = {from_step, *pipeline.downstream(from_step)}
            else:
                for sr in run.steps.values():
                    if sr.state in ("failed", "cancelled") or (
                        sr.state == "skipped" and sr.reason.startswith("not run")
                    ):
                        again |= {sr.name, *pipeline.downstream(sr.name)}
            if not again:
                raise Conflict(
                    f"run {run_id} has nothing to retry: every step succeeded or was gated",
                    hint="name a step with --from to run it and everything after it again",
                )
            now = self.now_ms()
            for name in pipeline.order:
                if name in again:
                    sr = run.steps[name]
                    previous = sr.state
                    sr.reset()
                    self._step_event(run, sr, previous)
            previous = run.state
            run.state, run.reason, run.finished_ms = "running", f"retried by {caller.subject}", 0
            run.started_ms = run.started_ms or now
            self._run_event(run, previous)
            self._save(run)
        self.advance(run_id)
        return self.get(run_id)

    # -- the loop -----------------------------------------------------------------------------

    def job_changed(self, job_id: str) -> bool:
        """A job changed state: look at its run soon. False when no run knows the job."""
        with self.engine.connect() as conn:
            found = store.run_of_job(conn, job_id)
        if found is None:
            return False
        with self._lock:
            self._dirty.add(found[0])
        return True

    def tick(self) -> int:
        """Fire due schedules, start queued runs, advance the runs that need it; how many were
        advanced."""
        self.fire_schedules()
        self._start_queued()
        now = time.monotonic()
        with self._lock:
            with self.engine.connect() as conn:
                active = store.run_ids(conn, ("running",))
            if now - self._last_resync >= self.resync_s:
                self._last_resync = now
                self._dirty.update(active)
            if now - self._last_poll >= self.poll_s:
                self._last_poll = now
                self._dirty.update(r for r in active if self._polled(r))
            todo, self._dirty = sorted(self._dirty), set()
        for run_id in todo:
            try:
                self.advance(run_id)
            except GantryError as exc:
                _log.warning("run not advanced", run=run_id, error=str(exc))
                with self._lock:
                    self._dirty.add(run_id)
            except Exception:  # a bug with one run must not stop the others
                _log.exception("run not advanced", run=run_id)
        return len(todo)

    def _polled(self, run_id: str) -> bool:
        """Runs with a step that has no events to wait for (a rollout, a submission)."""
        run = self.get(run_id)
        return any(
            s.state == "starting" or (s.kind in ("deploy", "experiment") and s.state == "running")
            for s in run.steps.values()
        )

    def advance(self, run_id: str) -> Run:
        """Look at the run's in-flight steps, then do what :func:`plan` says until it says
        nothing more."""
        with self._lock:
            run = self.get(run_id)
            if run.state != "running":
                return run
            pipeline = self.registry.revision(run.pipeline, run.revision)
            for sr in list(run.steps.values()):
                step = pipeline.step(sr.name)
                if sr.state == "starting":
                    self._launch(run, pipeline, step, sr)
                elif sr.state == "running":
                    self._observe(run, step, sr)
            for _ in range(4 * len(run.steps) + 4):
                actions = plan(run, pipeline)
                if not actions:
                    break
                now = self.now_ms()
                for action in actions:
                    if isinstance(action, Finish):
                        self._finish(run, action.state, action.reason, now)
                    elif isinstance(action, Skip):
                        self._step(run, run.steps[action.step], "skipped", action.reason, now)
                    elif isinstance(action, Start):
                        sr = run.steps[action.step]
                        sr.reset()
                        sr.attempt = action.attempt
                        sr.started_ms = now
                        self._step(run, sr, "starting", "", now, final=False)
                        self._save(run)  # before the call: a crash repeats it, not loses it
                        self._launch(run, pipeline, pipeline.step(action.step), sr)
                if run.done:
                    break
            self._save(run)
            return run

    # -- one step -----------------------------------------------------------------------------

    def _launch(self, run: Run, pipeline: Pipeline, step: Step, sr: StepRun) -> None:
        owner = Owner(run.owner, run.roles)
        now = self.now_ms()
        try:
            if step.kind == "deploy":
                self._deploy(run, step, sr, owner, now)
                return
            if step.kind == "experiment":
                self._experiment(run, pipeline, step, sr, owner, now)
                return
            document = job_document(pipeline, step, lambda ref: resolve(run, ref), run_id=run.id)
            request_id = f"wf-{run.id}-{step.name}-{sr.attempt}"
            job_id = self.platform.submit_job(document, request_id=request_id, owner=owner)
        except Unavailable as exc:
            _log.warning("step not started yet", run=run.id, step=step.name, error=str(exc))
            with self._lock:
                self._dirty.add(run.id)
            return
        except Unresolved as exc:
            self._fail(run, sr, exc.message, now)
            return
        except GantryError as exc:
            self._fail(run, sr, f"{type(exc).__name__}: {exc.message}", now)
            return
        except Exception as exc:  # a bug here: fail the step visibly rather than loop on it
            _log.exception("step failed to start", run=run.id, step=step.name)
            self._fail(
                run,
                sr,
                f"the workflows service could not start it ({type(exc).__name__}: {exc}); "
                "retry the run once the service is fixed",
                now,
            )
            return
        sr.job_id = job_id
        if step.kind == "data":
            sr.outputs = {"dataset": str(document["spec"]["output"]["dataset"])}
        sr.inputs = [Artifact(k, n, v) for k, n, v in lineage_of(document)]  # type: ignore[arg-type]
        sr.attempts.append(Attempt(sr.attempt, job_id, "running", "", now))
        self._step(run, sr, "running", f"job {job_id}", now, final=False)

    def _deploy(self, run: Run, step: Step, sr: StepRun, owner: Owner, now: int) -> None:
        assert step.deploy is not None
        model_ref = step.deploy.model
        model = str(substitute(model_ref, lambda ref: resolve(run, ref)))
        name, _, number = model.partition(":")
        version = int(number.lstrip("v") or 0)
        rollout = self.platform.deploy(step.deploy, name, version, owner=owner)
        sr.inputs = [Artifact("model", name, str(version))]
        if not sr.attempts or sr.attempts[-1].number != sr.attempt:
            sr.attempts.append(Attempt(sr.attempt, "", "running", "", now))
        self._rolled(run, step, sr, rollout.deployment, version, rollout, now, first=True)

    def _experiment(
        self, run: Run, pipeline: Pipeline, step: Step, sr: StepRun, owner: Owner, now: int
    ) -> None:
        """Start the step's experiment (its trials' ``${trial.x}`` stay for the search)."""
        from gantry.workflows.experiments import ExperimentSpec

        if self.experimenter is None:
            raise Unavailable("this workflows service runs no experiments")

        def resolve_keeping_trials(ref: Reference) -> Any:
            return f"${{{ref.text}}}" if ref.kind == "trial" else resolve(run, ref)

        body = substitute(step.experiment or {}, resolve_keeping_trials)
        spec = ExperimentSpec.model_validate(body)
        name = f"{pipeline.name}-{step.name}-{run.id[-8:]}" + (
            f"-a{sr.attempt}" if sr.attempt > 1 else ""
        )
        source = yaml.safe_dump(
            {
                "apiVersion": "gantry/v1",
                "kind": "Experiment",
                "metadata": {"name": name[:63].rstrip("-")},
                "spec": body,
            },
            sort_keys=False,
        )
        self.experimenter.start(name, spec, source, owner=owner, run_id=f"{run.id}/{sr.attempt}")
        sr.outputs = {"experiment": name}
        if not sr.attempts or sr.attempts[-1].number != sr.attempt:
            sr.attempts.append(Attempt(sr.attempt, "", "running", "", now))
        self._step(run, sr, "running", f"experiment {name}", now, final=False)

    def _experiment_ended(self, run: Run, sr: StepRun, now: int) -> None:
        assert self.experimenter is not None
        view = self.experimenter.get(sr.outputs["experiment"])
        if not view.done:
            return
        best = view.best
        if view.state != "succeeded" or best is None:
            self._fail(run, sr, f"experiment {view.name} {view.state}: {view.reason}", now)
            return
        sr.outputs.update({"job": best.job_id, "trial": str(best.number)})
        sr.metrics = dict(best.metrics)
        if best.model:
            sr.outputs["model"] = best.model
            name, _, version = best.model.partition(":")
            sr.produced = [Artifact("model", name, version)]
        self._succeed(run, sr, view.reason, now)

    def _rolled(
        self,
        run: Run,
        step: Step,
        sr: StepRun,
        deployment: str,
        version: int,
        rollout: Any,
        now: int,
        *,
        first: bool = False,
    ) -> None:
        assert step.deploy is not None
        model = sr.inputs[0].name if sr.inputs else ""
        if rollout is None or rollout.rolled_back:
            detail = rollout.detail if rollout is not None else "it is no longer deployed"
            self._fail(run, sr, f"{model} v{version} rolled back in {deployment}: {detail}", now)
            return
        done = rollout.promoted or step.deploy.wait_for == "started"
        if done:
            sr.outputs = {
                "deployment": deployment,
                "model": f"{model}:{version}",
                "version": str(version),
            }
            sr.produced = [Artifact("deployment", deployment, str(version))]
            how = (
                "promoted"
                if rollout.promoted
                else f"{rollout.role or 'canary'} at {rollout.weight}%"
            )
            self._succeed(run, sr, f"{model} v{version} {how} in {deployment}", now)
        elif first:
            self._step(run, sr, "running", f"canary at {rollout.weight}%", now, final=False)
        elif now - sr.started_ms > step.deploy.timeout_s * 1000:
            self._fail(
                run, sr, f"not promoted within {step.deploy.timeout_s}s (at {rollout.weight}%)", now
            )

    def _observe(self, run: Run, step: Step, sr: StepRun) -> None:
        owner = Owner(run.owner, run.roles)
        now = self.now_ms()
        try:
            if step.kind == "deploy":
                version = int(sr.inputs[0].version) if sr.inputs else 0
                rollout = self.platform.rollout(
                    step.deploy.deployment if step.deploy else "", version, owner=owner
                )
                self._rolled(
                    run,
                    step,
                    sr,
                    step.deploy.deployment if step.deploy else "",
                    version,
                    rollout,
                    now,
                )
                return
            if step.kind == "experiment":
                self._experiment_ended(run, sr, now)
                return
            status = self.platform.job(sr.job_id, owner=owner)
        except Unavailable:
            return
        except GantryError as exc:
            _log.warning("step not observed", run=run.id, step=sr.name, error=str(exc))
            return
        if not status.terminal:
            return
        self._job_ended(run, sr, status, now)

    def _job_ended(self, run: Run, sr: StepRun, status: JobStatus, now: int) -> None:
        if status.state != "succeeded":
            self._fail(
                run,
                sr,
                f"job {status.id} {status.state}: {status.reason or 'no reason given'}",
                now,
            )
            return
        sr.outputs = {**sr.outputs, "job": status.id}
        sr.metrics = {k: float(v) for k, v in status.metrics.items()}
        if sr.kind in ("train", "evaluate"):
            model = status.model
            if sr.kind == "evaluate" and not model:
                model = next((f"{a.name}:{a.version}" for a in sr.inputs if a.kind == "model"), "")
            if model:
                sr.outputs["model"] = model
                if sr.kind == "train":
                    name, _, version = model.partition(":")
                    sr.produced = [Artifact("model", name, version)]
        if sr.kind == "data":
            if not status.dataset_version:
                self._fail(
                    run, sr, f"job {status.id} succeeded but committed no dataset version", now
                )
                return
            # the scheduler reports dataset@version, as a model is reported name:version
            dataset, _, version = status.dataset_version.rpartition("@")
            sr.outputs["version"] = version
            sr.outputs["dataset"] = dataset or sr.outputs.get("dataset", "")
            sr.produced = [Artifact("dataset", sr.outputs["dataset"], version)]
        shown = ", ".join(f"{k}={v:.4g}" for k, v in sorted(sr.metrics.items()))
        self._succeed(run, sr, f"job {status.id} succeeded" + (f" ({shown})" if shown else ""), now)

    # -- state changes and their events ---------------------------------------------------------

    def _succeed(self, run: Run, sr: StepRun, reason: str, now: int) -> None:
        self._step(run, sr, "succeeded", reason, now)

    def _fail(self, run: Run, sr: StepRun, reason: str, now: int) -> None:
        self._step(run, sr, "failed", reason, now)

    def _step(
        self, run: Run, sr: StepRun, state: str, reason: str, now: int, *, final: bool = True
    ) -> None:
        previous = sr.state
        sr.state, sr.reason = state, reason
        if final:
            sr.finished_ms = now
            if sr.attempts and sr.attempts[-1].number == sr.attempt:
                a = sr.attempts[-1]
                a.state, a.reason, a.finished_ms = state, reason, now
        self._step_event(run, sr, previous)

    def _finish(self, run: Run, state: str, reason: str, now: int) -> None:
        previous = run.state
        run.state, run.reason, run.finished_ms = state, reason, now
        self._run_event(run, previous)
        _log.info("run ended", run=run.id, pipeline=run.pipeline, state=state, reason=reason)

    def _run_event(self, run: Run, previous: str) -> None:
        data = WorkflowRunChanged(
            run_id=run.id,
            pipeline=run.pipeline,
            revision=run.revision,
            state=run.state,
            previous=previous,
            reason=run.reason,
            trigger=run.trigger,
            owner=run.owner,
        )
        self._events.append(("gantry.workflow.run.changed", data, run.owner, run.id))

    def _step_event(self, run: Run, sr: StepRun, previous: str) -> None:
        data = WorkflowStepChanged(
            run_id=run.id,
            pipeline=run.pipeline,
            step=sr.name,
            kind=sr.kind,
            state=sr.state,
            previous=previous,
            attempt=sr.attempt,
            job_id=sr.job_id,
            reason=sr.reason,
            outputs=sr.outputs,
            metrics=sr.metrics,
            inputs=[a.text() for a in sr.inputs],
            produced=[a.text() for a in sr.produced],
        )
        self._events.append(
            ("gantry.workflow.step.changed", data, run.owner, f"{run.id}/{sr.name}")
        )

    def _save(self, run: Run, *, request_id: str | None = None) -> None:
        events, self._events = self._events, []
        with self.engine.begin() as conn:
            store.save_run(conn, run, request_id=request_id)
            for type_, data, actor, subject in events:
                store.record(conn, type_, data, actor=actor, subject=subject)
        if events:
            self.on_change()

    # -- schedules ------------------------------------------------------------------------------

    def fire_schedules(self) -> int:
        """Start the runs of every cron pipeline whose time has come; how many fired."""
        now = self.clock.now()
        now_ms = int(now.timestamp() * 1000)
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(store.schedules).where(store.schedules.c.next_ms <= now_ms)
            ).all()
        fired = 0
        for row in rows:
            try:
                record = self.registry.get(row.name)
            except NotFound:
                continue
            schedule = record.pipeline.schedule
            if schedule is None:
                continue
            next_at = dt.datetime.fromtimestamp(row.next_ms / 1000, dt.UTC)
            d = due(
                schedule.cron,
                schedule.timezone,
                next_at,
                now,
                deadline=dt.timedelta(seconds=schedule.starting_deadline_s),
            )
            with self._lock:
                if d.missed and not schedule.suspend:
                    self._record_missed(record.pipeline, record, d.missed, d.first_missed)
                if d.fire is not None and not schedule.suspend:
                    self._fire(record.pipeline, record, d.fire)
                    fired += 1
                with self.engine.begin() as conn:
                    conn.execute(
                        store.schedules.update()
                        .where(store.schedules.c.name == row.name)
                        .values(
                            next_ms=int(d.next.timestamp() * 1000),
                            last_fire_ms=int(d.fire.timestamp() * 1000)
                            if d.fire
                            else row.last_fire_ms,
                            missed=row.missed + (0 if schedule.suspend else d.missed),
                        )
                    )
        return fired

    def _fire(self, pipeline: Pipeline, record: Any, at: dt.datetime) -> None:
        assert pipeline.schedule is not None
        policy = pipeline.schedule.concurrency
        at_ms = int(at.timestamp() * 1000)
        request_id = f"cron:{pipeline.name}:{at_ms}"
        with self.engine.connect() as conn:
            if store.run_by_request(conn, request_id) is not None:
                return
        active = [
            r for r in self.list(pipeline=pipeline.name, limit=10_000) if r.state in RUN_ACTIVE
        ]
        state = "running"
        reason = f"scheduled for {at.isoformat(timespec='seconds')} ({pipeline.schedule.cron})"
        if active and policy == "skip":
            state = "skipped"
            reason = f"skipped: run {active[0].id} is still {active[0].state} (concurrency: skip)"
        elif active and policy == "queue":
            state = "queued"
            reason = f"queued behind run {active[-1].id} (concurrency: queue)"
        elif active and policy == "replace":
            for other in active:
                self._cancel(
                    other, f"replaced by the run scheduled for {at.isoformat(timespec='seconds')}"
                )
        run = new_run(
            pipeline,
            id=new_id(),
            revision=record.revision,
            owner=record.owner,
            roles=record.roles,
            params=pipeline.params,
            trigger="schedule",
            state=state,
            now_ms=self.now_ms(),
            scheduled_ms=at_ms,
        )
        run.reason = reason
        if state == "skipped":
            run.finished_ms = run.created_ms
            for sr in run.steps.values():
                sr.state, sr.reason = "skipped", "not run: the run was skipped"
        self._run_event(run, "")
        self._save(run, request_id=request_id)
        if state == "running":
            self._dirty.add(run.id)
        _log.info(
            "schedule fired", pipeline=pipeline.name, run=run.id, state=state, at=at.isoformat()
        )

    def _record_missed(
        self, pipeline: Pipeline, record: Any, count: int, first: dt.datetime | None
    ) -> None:
        """Keep a skipped run in the history for fires missed past their deadline."""
        assert pipeline.schedule is not None and first is not None
        first_ms = int(first.timestamp() * 1000)
        request_id = f"cron-missed:{pipeline.name}:{first_ms}"
        with self.engine.connect() as conn:
            if store.run_by_request(conn, request_id) is not None:
                return
        run = new_run(
            pipeline,
            id=new_id(),
            revision=record.revision,
            owner=record.owner,
            roles=record.roles,
            params=pipeline.params,
            trigger="schedule",
            state="skipped",
            now_ms=self.now_ms(),
            scheduled_ms=first_ms,
        )
        run.reason = (
            f"missed {count} fire(s) from {first.isoformat(timespec='seconds')}: the service was "
            f"not running within their startingDeadline ({pipeline.schedule.starting_deadline_s}s)"
        )
        run.finished_ms = run.created_ms
        for sr in run.steps.values():
            sr.state, sr.reason = "skipped", "not run: the fire was missed"
        self._run_event(run, "")
        self._save(run, request_id=request_id)
        _log.warning("schedule fires missed", pipeline=pipeline.name, missed=count)

    def _start_queued(self) -> None:
        with self._lock:
            queued = self.list(state="queued", limit=10_000)
            for run in sorted(queued, key=lambda r: r.created_ms):
                busy = [r for r in self.list(pipeline=run.pipeline, state="running", limit=1)]
                if busy:
                    continue
                run.state, run.started_ms = "running", self.now_ms()
                run.reason = f"started after the run before it ended ({run.reason})"
                self._run_event(run, "queued")
                self._save(run)
                self._dirty.add(run.id)


__all__ = ["Caller", "Controller"]
