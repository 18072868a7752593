"""The workflows SDK: pipelines and their runs, step by step; experiments and their trials; dev
sessions.

::

    from pathlib import Path
    from gantry.client.workflows import WorkflowsClient

    with WorkflowsClient("127.0.0.1:7036", token) as workflows:
        workflows.submit(Path("churn.yaml").read_text())
        run = workflows.start("churn", {"epochs": "20"}, request_id="churn-2026-01-31").run
        run = workflows.wait(run.id, timeout_s=3600, on_update=lambda r: print(r.state))
        for step in run.steps:
            print(step.name, step.state, step.reason, dict(step.outputs))

An experiment (a hyperparameter search) is submitted and followed the same way::

        exp = workflows.submit_experiment(Path("churn-hpo.yaml").read_text())
        exp = workflows.wait_experiment(exp.name, timeout_s=7200)
        if exp.best is not None:
            print(exp.best.number, exp.best.value, dict(exp.best.values), exp.best.model)

and a dev session (a Jupyter server on a slice of a GPU) is started and waited for::

        session = workflows.start_session(Path("scratch.yaml").read_text())
        session = workflows.wait_session(session.name, timeout_s=600)
        if session.running:
            print(session.url, session.token)  # the token: only ever sent to its owner

Calls go to ``gantry.workflows.v1.WorkflowService``. Every call returns plain frozen dataclasses
(:class:`PipelineInfo`, :class:`RunInfo`, :class:`ExperimentInfo`, :class:`SessionInfo`, ...;
they live in ``_pipeline_records``, ``_experiment_records`` and ``_session_records`` and are
re-exported here), never protocol messages; failures raise Gantry's typed errors (see
:mod:`gantry.client.errors`), and a wait that gives up raises a :class:`WaitTimeout`::

    Unavailable
    └── WaitTimeout          .last: what was waited for, as last seen; .timeout_s
        ├── RunWaitTimeout
        ├── ExperimentWaitTimeout
        └── SessionWaitTimeout

The pipeline, experiment and dev session formats are described in ``docs/workflows.md``.
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar

from gantry.client._experiment_records import (
    EXPERIMENT_DONE,
    EXPERIMENT_STATES,
    TRIAL_ACTIVE,
    TRIAL_STATES,
    ExperimentInfo,
    ParameterInfo,
    TrialInfo,
)
from gantry.client._pipeline_records import (
    RUN_DONE,
    RUN_STATES,
    STEP_DONE,
    STEP_KINDS,
    STEP_STATES,
    ArtifactInfo,
    PipelineInfo,
    PipelineStepInfo,
    RunInfo,
    ScheduleInfo,
    StartRunResult,
    StepAttemptInfo,
    StepRunInfo,
    SubmitPipelineResult,
    param_text,
)
from gantry.client._rpc import ActAs, RpcClient
from gantry.client._session_records import (
    SESSION_ACTIVE,
    SESSION_DONE,
    SESSION_STATES,
    SessionGenerationInfo,
    SessionInfo,
)
from gantry.core import InvalidInput, TlsSettings, Unavailable
from gantry.protos.v1 import workflows_pb2 as pb
from gantry.protos.v1 import workflows_pb2_grpc as pb_grpc

_T = TypeVar("_T")


# ---------------------------------------------------------------------- waits that give up


class WaitTimeout(Unavailable, Generic[_T]):
    """A ``wait`` gave up after ``timeout_s``: what it waited for had not happened yet.

    ``last`` is the run, experiment or session as last seen; the service carries on with it.
    """

    def __init__(self, last: _T, timeout_s: float, message: str, *, hint: str) -> None:
        self.last = last
        self.timeout_s = timeout_s
        super().__init__(message, hint=hint)


class RunWaitTimeout(WaitTimeout[RunInfo]):
    """:meth:`WorkflowsClient.wait` gave up: the run was still active after ``timeout_s``.

    ``last`` is the run as last seen.
    """

    def __init__(self, last: RunInfo, timeout_s: float) -> None:
        super().__init__(
            last,
            timeout_s,
            f"run {last.id} of {last.pipeline} is still {last.state} after {timeout_s:g}s",
            hint=f"look at it with 'gantry pipelines runs get {last.id}', or wait longer",
        )


class ExperimentWaitTimeout(WaitTimeout[ExperimentInfo]):
    """:meth:`WorkflowsClient.wait_experiment` gave up: the experiment was still running after
    ``timeout_s``. ``last`` is the experiment as last seen."""

    def __init__(self, last: ExperimentInfo, timeout_s: float) -> None:
        super().__init__(
            last,
            timeout_s,
            f"experiment {last.name} is still {last.state} after {timeout_s:g}s "
            f"({len(last.trials)} of {last.budget_trials} trials started)",
            hint=f"look at it with 'gantry experiments get {last.name}', or wait longer",
        )


class SessionWaitTimeout(WaitTimeout[SessionInfo]):
    """:meth:`WorkflowsClient.wait_session` gave up: after ``timeout_s`` the session was in none
    of ``states`` and had not ended. ``last`` is the session as last seen."""

    def __init__(
        self, last: SessionInfo, timeout_s: float, states: Sequence[str] = ("running",)
    ) -> None:
        self.states = tuple(states)
        why = f" ({last.reason})" if last.reason else ""
        super().__init__(
            last,
            timeout_s,
            f"dev session {last.name} is still {last.state}{why} after {timeout_s:g}s, "
            f"not {' or '.join(self.states)}",
            hint=f"look at it with 'gantry sessions get {last.name}', or wait longer",
        )


# ---------------------------------------------------------------------- what a poll looks at


def _change(run: RunInfo) -> tuple[Any, ...]:
    """What makes a polled run worth an update."""
    return (
        run.state,
        run.reason,
        tuple((s.state, s.reason, s.attempt, s.job_id) for s in run.steps),
    )


def _experiment_change(e: ExperimentInfo) -> tuple[Any, ...]:
    """What makes a polled experiment worth an update."""
    return (
        e.state,
        e.reason,
        e.best_trial,
        tuple((t.number, t.state, t.epochs, t.value) for t in e.trials),
    )


def _session_change(s: SessionInfo) -> tuple[Any, ...]:
    """What makes a polled session worth an update (not its activity counter, which moves
    while it is used)."""
    return (s.state, s.reason, s.generation, s.job_id, s.url)


# ---------------------------------------------------------------------- the client


class WorkflowsClient(RpcClient):
    """A synchronous client of the workflows service (pipelines, runs, experiments, dev
    sessions), authenticated with a bearer token.

    ``timeout_s`` bounds each call; :meth:`wait`, :meth:`wait_experiment` and
    :meth:`wait_session` have their own.
    """

    service = "workflows"

    def __init__(
        self,
        address: str,
        bearer: str | None,
        *,
        timeout_s: float = 30.0,
        act_as: ActAs | None = None,
        tls: TlsSettings | None = None,
    ) -> None:
        super().__init__(address, bearer, timeout_s=timeout_s, act_as=act_as, tls=tls)
        self._stub = pb_grpc.WorkflowServiceStub(self._channel)

    # ------------------------------------------------------------------ pipelines

    def submit(self, spec_yaml: str, *, dry_run: bool = False) -> SubmitPipelineResult:
        """Check a ``kind: Pipeline`` or ``kind: CronPipeline`` document (YAML text) and store
        it as the pipeline's next revision; ``dry_run`` only checks it.

        A document with problems raises :class:`InvalidInput` listing every one with its
        place (``spec.steps[2] (evaluate).evaluate.model: ...``).
        """
        if not spec_yaml.strip():
            raise InvalidInput(
                "the pipeline document is empty",
                hint="write a Pipeline document (see docs/workflows.md)",
            )
        request = pb.SubmitPipelineRequest(spec_yaml=spec_yaml, dry_run=dry_run)
        reply: pb.SubmitPipelineResponse = self._call("SubmitPipeline", request)
        return SubmitPipelineResult(PipelineInfo.from_pb(reply.pipeline), reply.replaced)

    def get(self, name: str) -> PipelineInfo:
        """A pipeline's latest revision, its schedule and its last run."""
        request = pb.NameRequest(name=_needed(name, "a pipeline name"))
        return PipelineInfo.from_pb(self._call("GetPipeline", request))

    def list(self) -> builtins.list[PipelineInfo]:
        """Every pipeline, by name, each with its last run."""
        reply: pb.ListPipelinesResponse = self._call("ListPipelines", pb.ListPipelinesRequest())
        return [PipelineInfo.from_pb(p) for p in reply.pipelines]

    def delete(self, name: str) -> PipelineInfo:
        """Delete a pipeline with no active run (its runs stay in the history); the pipeline
        as it was. Only its owner or a platform admin may."""
        request = pb.NameRequest(name=_needed(name, "a pipeline name"))
        return PipelineInfo.from_pb(self._call("DeletePipeline", request))

    # ------------------------------------------------------------------ runs

    def start(
        self,
        pipeline: str,
        params: Mapping[str, str] | None = None,
        *,
        request_id: str = "",
    ) -> StartRunResult:
        """Start a run of ``pipeline`` as the caller, with ``params`` overriding its defaults
        (text, typed by the service like the defaults).

        ``request_id`` makes the start idempotent: a repeat returns the first run with
        ``duplicate=True``.
        """
        given: dict[str, str] = {}
        for key, value in (params or {}).items():
            if not isinstance(key, str) or not key.strip():
                raise InvalidInput(
                    f"a parameter needs a name, got {key!r}", hint="e.g. {'epochs': '20'}"
                )
            given[key] = param_text(value)
        request = pb.StartRunRequest(
            pipeline=_needed(pipeline, "a pipeline name"), params=given, request_id=request_id
        )
        reply: pb.StartRunResponse = self._call("StartRun", request)
        return StartRunResult(RunInfo.from_pb(reply.run), reply.duplicate)

    def run(self, run_id: str) -> RunInfo:
        """One run with each step's state, job, outputs, metrics and lineage."""
        return RunInfo.from_pb(self._call("GetRun", pb.RunRequest(id=_needed(run_id, "a run id"))))

    def runs(self, pipeline: str = "", state: str = "", limit: int = 100) -> builtins.list[RunInfo]:
        """Runs, newest first: of one ``pipeline`` and in one ``state`` ("" = any); at most
        ``limit`` (0: the service's default of 100)."""
        if state and state not in RUN_STATES:
            raise InvalidInput(
                f"unknown run state {state!r}", hint=f"one of {', '.join(RUN_STATES)}"
            )
        if limit < 0:
            raise InvalidInput(f"limit must be 0 or more, not {limit}")
        request = pb.ListRunsRequest(pipeline=pipeline, state=state, limit=limit)
        reply: pb.ListRunsResponse = self._call("ListRuns", request)
        return [RunInfo.from_pb(r) for r in reply.runs]

    def cancel(self, run_id: str, reason: str = "") -> RunInfo:
        """Cancel an active run: its running jobs are cancelled, its pending steps never start.
        ``reason`` is kept on the run and its steps."""
        request = pb.RunRequest(id=_needed(run_id, "a run id"), reason=reason)
        return RunInfo.from_pb(self._call("CancelRun", request))

    def retry(self, run_id: str, from_step: str = "") -> RunInfo:
        """Run a finished run's failed, cancelled and not-run steps again, or ``from_step`` and
        every step after it; steps that succeeded keep their outputs."""
        request = pb.RunRequest(id=_needed(run_id, "a run id"), from_step=from_step)
        return RunInfo.from_pb(self._call("RetryRun", request))

    def wait(
        self,
        run_id: str,
        *,
        timeout_s: float,
        poll_s: float = 0.5,
        on_update: Callable[[RunInfo], None] | None = None,
    ) -> RunInfo:
        """Poll the run until it is no longer queued or running; the run as it ended.

        ``on_update`` is called with the run the first time and whenever a state, a reason, an
        attempt or a job changes. Once the run was seen, a service that becomes unreachable
        (restarting: runs carry on from its database) does not end the wait; after
        ``timeout_s`` it raises :class:`RunWaitTimeout`, an :class:`~gantry.core.Unavailable`.
        """
        return _poll(
            lambda: self.run(run_id),
            done=lambda r: r.done,
            change=_change,
            timeout_s=timeout_s,
            poll_s=poll_s,
            on_update=on_update,
            timed_out=lambda r: RunWaitTimeout(r, timeout_s),
        )

    # ------------------------------------------------------------------ experiments

    def submit_experiment(self, spec_yaml: str, *, dry_run: bool = False) -> ExperimentInfo:
        """Check a ``kind: Experiment`` document (YAML text) and start its search as the caller;
        ``dry_run`` only checks it (the answer's state is ``checked`` and it has no trials).

        A document with problems raises :class:`InvalidInput` listing every one with its
        place (``spec.space.lr: logUniform [0.0, 1.0] has no values on a log scale: ...``); a
        name already used raises :class:`~gantry.core.AlreadyExists` (experiments keep their
        history).
        """
        if not spec_yaml.strip():
            raise InvalidInput(
                "the experiment document is empty",
                hint="write an Experiment document (see docs/workflows.md)",
            )
        request = pb.SubmitExperimentRequest(spec_yaml=spec_yaml, dry_run=dry_run)
        return ExperimentInfo.from_pb(self._call("SubmitExperiment", request))

    def experiment(self, name: str) -> ExperimentInfo:
        """An experiment with every trial, its learning curve and the best so far."""
        request = pb.NameRequest(name=_needed(name, "an experiment name"))
        return ExperimentInfo.from_pb(self._call("GetExperiment", request))

    def experiments(self, state: str = "") -> builtins.list[ExperimentInfo]:
        """Experiments, newest first; only those in ``state`` unless it is ""."""
        if state and state not in EXPERIMENT_STATES:
            raise InvalidInput(
                f"unknown experiment state {state!r}",
                hint=f"one of {', '.join(EXPERIMENT_STATES)}",
            )
        reply: pb.ListExperimentsResponse = self._call(
            "ListExperiments", pb.ListExperimentsRequest(state=state)
        )
        return [ExperimentInfo.from_pb(e) for e in reply.experiments]

    def cancel_experiment(self, name: str, reason: str = "") -> ExperimentInfo:
        """Cancel a running experiment: its running trials' jobs are cancelled (freeing their
        devices) and no trial starts any more. ``reason`` is kept on it. Only its owner or a
        platform admin may."""
        request = pb.NameRequest(name=_needed(name, "an experiment name"), reason=reason)
        return ExperimentInfo.from_pb(self._call("CancelExperiment", request))

    def wait_experiment(
        self,
        name: str,
        *,
        timeout_s: float,
        poll_s: float = 1.0,
        on_update: Callable[[ExperimentInfo], None] | None = None,
    ) -> ExperimentInfo:
        """Poll the experiment until its search has ended; the experiment as it ended.

        ``on_update`` is called with the experiment the first time and whenever its state, a
        trial (started, reported an epoch, ended) or the best trial changes. A service that
        becomes unreachable after the first look does not end the wait (the search carries on
        from its database); after ``timeout_s`` it raises :class:`ExperimentWaitTimeout`, an
        :class:`~gantry.core.Unavailable`.
        """
        return _poll(
            lambda: self.experiment(name),
            done=lambda e: e.done,
            change=_experiment_change,
            timeout_s=timeout_s,
            poll_s=poll_s,
            on_update=on_update,
            timed_out=lambda e: ExperimentWaitTimeout(e, timeout_s),
        )

    # ------------------------------------------------------------------ dev sessions

    def start_session(self, spec_yaml: str, *, dry_run: bool = False) -> SessionInfo:
        """Check a ``kind: DevSession`` document (YAML text) and start the session as the
        caller; ``dry_run`` only checks it (nothing is started and no token is made).

        The session comes back ``starting``, with its login token (the caller is its owner);
        :meth:`wait_session` waits until its server answers at :attr:`SessionInfo.url`. A
        document with problems raises :class:`InvalidInput` listing every one with its place;
        a name already used raises :class:`~gantry.core.AlreadyExists` (resume that session
        instead).
        """
        if not spec_yaml.strip():
            raise InvalidInput(
                "the dev session document is empty",
                hint="write a DevSession document (see docs/workflows.md)",
            )
        request = pb.StartDevSessionRequest(spec_yaml=spec_yaml, dry_run=dry_run)
        return SessionInfo.from_pb(self._call("StartDevSession", request))

    def session(self, name: str) -> SessionInfo:
        """A session's state, address and history; its token only if the caller owns it."""
        request = pb.DevSessionRequest(name=_needed(name, "a dev session name"))
        return SessionInfo.from_pb(self._call("GetDevSession", request))

    def sessions(self, state: str = "") -> builtins.list[SessionInfo]:
        """Dev sessions, newest first; only those in ``state`` unless it is "". Tokens come
        only with the caller's own sessions."""
        if state and state not in SESSION_STATES:
            raise InvalidInput(
                f"unknown dev session state {state!r}",
                hint=f"one of {', '.join(SESSION_STATES)}",
            )
        reply: pb.ListDevSessionsResponse = self._call(
            "ListDevSessions", pb.ListDevSessionsRequest(state=state)
        )
        return [SessionInfo.from_pb(s) for s in reply.sessions]

    def stop_session(self, name: str, reason: str = "") -> SessionInfo:
        """Stop an active session: its files are saved and its GPU is freed; it can be resumed.
        ``reason`` is kept on it. Only its owner or a platform admin may."""
        request = pb.DevSessionRequest(name=_needed(name, "a dev session name"), reason=reason)
        return SessionInfo.from_pb(self._call("StopDevSession", request))

    def resume_session(self, name: str) -> SessionInfo:
        """Start the next generation of an ended (culled, expired, stopped or failed) session
        with its files; it comes back ``starting``, with a new token. Only its owner or a
        platform admin may."""
        request = pb.DevSessionRequest(name=_needed(name, "a dev session name"))
        return SessionInfo.from_pb(self._call("ResumeDevSession", request))

    def wait_session(
        self,
        name: str,
        *,
        states: Sequence[str] = ("running",),
        timeout_s: float = 300.0,
        poll_s: float = 1.0,
        on_change: Callable[[SessionInfo], None] | None = None,
    ) -> SessionInfo:
        """Poll the session until it is in one of ``states`` or has ended (a session that was
        culled or failed while starting never runs); the session as it is then.

        ``on_change`` is called with the session the first time and whenever its state, its
        reason, its generation or its job changes. A service that becomes unreachable after
        the first look does not end the wait; after ``timeout_s`` it raises
        :class:`SessionWaitTimeout`, an :class:`~gantry.core.Unavailable`.
        """
        if isinstance(states, str):  # a str is a Sequence[str] too, and would be read by letter
            raise InvalidInput(
                f"states must be a list of session states, got the string {states!r}",
                hint=f"pass states=({states!r},)",
            )
        unknown = [s for s in states if s not in SESSION_STATES]
        if unknown or not states:
            raise InvalidInput(
                f"unknown dev session state(s) {unknown!r}" if unknown else "states is empty",
                hint=f"wait for some of {', '.join(SESSION_STATES)}",
            )
        wanted = frozenset(states)
        return _poll(
            lambda: self.session(name),
            done=lambda s: s.state in wanted or s.done,
            change=_session_change,
            timeout_s=timeout_s,
            poll_s=poll_s,
            on_update=on_change,
            timed_out=lambda s: SessionWaitTimeout(s, timeout_s, tuple(states)),
        )


def _poll(
    fetch: Callable[[], _T],
    *,
    done: Callable[[_T], bool],
    change: Callable[[_T], Any],
    timeout_s: float,
    poll_s: float,
    on_update: Callable[[_T], None] | None,
    timed_out: Callable[[_T], Exception],
) -> _T:
    """``fetch`` until ``done``, calling ``on_update`` on the first answer and each ``change``;
    a service unreachable after the first answer is tried again (it is restarting)."""
    if timeout_s <= 0:
        raise InvalidInput(f"timeout_s must be more than 0, not {timeout_s:g}")
    if poll_s <= 0:
        raise InvalidInput(f"poll_s must be more than 0, not {poll_s:g}")
    last = fetch()  # an unreachable service or an unknown name: said at once
    deadline = time.monotonic() + timeout_s
    seen = change(last)
    if on_update is not None:
        on_update(last)
    while not done(last):
        left = deadline - time.monotonic()
        if left <= 0:
            raise timed_out(last)
        time.sleep(min(poll_s, left))
        try:
            current = fetch()
        except Unavailable:
            continue  # the service is restarting (everything carries on from its database)
        last = current
        if change(current) != seen:
            seen = change(current)
            if on_update is not None:
                on_update(current)
    return last


def _needed(value: str, what: str) -> str:
    if not value.strip():
        raise InvalidInput(f"{what} is needed")
    return value


__all__ = [
    "EXPERIMENT_DONE",
    "EXPERIMENT_STATES",
    "RUN_DONE",
    "RUN_STATES",
    "SESSION_ACTIVE",
    "SESSION_DONE",
    "SESSION_STATES",
    "STEP_DONE",
    "STEP_KINDS",
    "STEP_STATES",
    "TRIAL_ACTIVE",
    "TRIAL_STATES",
    "ArtifactInfo",
    "ExperimentInfo",
    "ExperimentWaitTimeout",
    "ParameterInfo",
    "PipelineInfo",
    "PipelineStepInfo",
    "RunInfo",
    "RunWaitTimeout",
    "ScheduleInfo",
    "SessionGenerationInfo",
    "SessionInfo",
    "SessionWaitTimeout",
    "StartRunResult",
    "StepAttemptInfo",
    "StepRunInfo",
    "SubmitPipelineResult",
    "TrialInfo",
    "WaitTimeout",
    "WorkflowsClient",
]
