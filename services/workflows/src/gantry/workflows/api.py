"""The gRPC API (``gantry.workflows.v1.WorkflowService``): handlers only.

The interceptor checks each method's rule (resource kinds ``pipeline``: create, read, list,
run, cancel, delete; ``experiment``: create, read, list, cancel; ``devsession``: create, read,
list, cancel (stop), run (resume)); replacing, deleting, cancelling, retrying, stopping or
resuming what belongs to someone else also takes ``update`` on the kind (platform admins),
checked and recorded here. A dev session's token is only ever sent to its owner.
"""

from __future__ import annotations

import asyncio
from typing import Any

from gantry.core import PermissionDenied, Unavailable
from gantry.events.catalog import AuthzDecision
from gantry.protos.v1 import workflows_pb2 as pb
from gantry.protos.v1 import workflows_pb2_grpc
from gantry.security import Authorizer, MethodRule, Principal, current_principal
from gantry.security.interceptor import DecisionSink
from gantry.security.rpc_errors import rpc_errors
from gantry.workflows.controller import Caller, Controller
from gantry.workflows.experimenter import Experimenter, ExperimentView
from gantry.workflows.platform import Owner
from gantry.workflows.registry import PipelineRecord, Registry
from gantry.workflows.runs import Run
from gantry.workflows.sessions import Sessions, SessionView

SERVICE = "gantry.workflows.v1.WorkflowService"
SERVICE_NAME = "workflows"
METHOD_RULES: dict[str, MethodRule] = {
    f"/{SERVICE}/SubmitPipeline": MethodRule("create", "pipeline"),
    f"/{SERVICE}/GetPipeline": MethodRule("read", "pipeline"),
    f"/{SERVICE}/ListPipelines": MethodRule("list", "pipeline"),
    f"/{SERVICE}/DeletePipeline": MethodRule("delete", "pipeline"),
    f"/{SERVICE}/StartRun": MethodRule("run", "pipeline"),
    f"/{SERVICE}/GetRun": MethodRule("read", "pipeline"),
    f"/{SERVICE}/ListRuns": MethodRule("list", "pipeline"),
    f"/{SERVICE}/CancelRun": MethodRule("cancel", "pipeline"),
    f"/{SERVICE}/RetryRun": MethodRule("run", "pipeline"),
    f"/{SERVICE}/SubmitExperiment": MethodRule("create", "experiment"),
    f"/{SERVICE}/GetExperiment": MethodRule("read", "experiment"),
    f"/{SERVICE}/ListExperiments": MethodRule("list", "experiment"),
    f"/{SERVICE}/CancelExperiment": MethodRule("cancel", "experiment"),
    f"/{SERVICE}/StartDevSession": MethodRule("create", "devsession"),
    f"/{SERVICE}/GetDevSession": MethodRule("read", "devsession"),
    f"/{SERVICE}/ListDevSessions": MethodRule("list", "devsession"),
    f"/{SERVICE}/StopDevSession": MethodRule("cancel", "devsession"),
    f"/{SERVICE}/ResumeDevSession": MethodRule("run", "devsession"),
}


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def pipeline_pb(record: PipelineRecord, last: Run | None = None) -> pb.Pipeline:
    p = record.pipeline
    schedule = None
    if p.schedule is not None:
        s = p.schedule
        schedule = pb.Schedule(
            cron=s.cron,
            timezone=s.timezone,
            concurrency=s.concurrency,
            next_fire_ms=0 if s.suspend else record.next_fire_ms,
            suspended=s.suspend,
            missed=record.missed,
        )
    return pb.Pipeline(
        name=p.name,
        kind=p.kind,
        owner=record.owner,
        revision=record.revision,
        spec_yaml=p.source,
        description=p.doc.metadata.description,
        steps=list(p.order),
        params={k: _text(v) for k, v in p.params.items()},
        schedule=schedule,
        created_ms=record.created_ms,
        updated_ms=record.updated_ms,
        last_run_id=last.id if last is not None else "",
        last_run_state=last.state if last is not None else "",
    )


def run_pb(run: Run, parents: dict[str, tuple[str, ...]] | None = None) -> pb.Run:
    steps = []
    for s in run.steps.values():
        steps.append(
            pb.StepRun(
                name=s.name,
                kind=s.kind,
                state=s.state,
                reason=s.reason,
                attempt=s.attempt,
                job_id=s.job_id,
                depends_on=list((parents or {}).get(s.name, ())),
                outputs=s.outputs,
                metrics=s.metrics,
                inputs=[pb.Artifact(kind=a.kind, name=a.name, version=a.version) for a in s.inputs],
                produced=[
                    pb.Artifact(kind=a.kind, name=a.name, version=a.version) for a in s.produced
                ],
                attempts=[
                    pb.StepAttempt(
                        number=a.number,
                        job_id=a.job_id,
                        state=a.state,
                        reason=a.reason,
                        started_ms=a.started_ms,
                        finished_ms=a.finished_ms,
                    )
                    for a in s.attempts
                ],
                started_ms=s.started_ms,
                finished_ms=s.finished_ms,
            )
        )
    return pb.Run(
        id=run.id,
        pipeline=run.pipeline,
        revision=run.revision,
        owner=run.owner,
        state=run.state,
        reason=run.reason,
        trigger=run.trigger,
        params={k: _text(v) for k, v in run.params.items()},
        steps=steps,
        scheduled_ms=run.scheduled_ms,
        created_ms=run.created_ms,
        started_ms=run.started_ms,
        finished_ms=run.finished_ms,
    )


def experiment_pb(e: ExperimentView) -> pb.Experiment:
    spec = e.spec
    return pb.Experiment(
        name=e.name,
        owner=e.owner,
        state=e.state,
        reason=e.reason,
        spec_yaml=e.source,
        metric=spec.objective.metric,
        goal=spec.objective.goal,
        method=spec.method,
        pruner=spec.pruner.kind,
        budget_trials=spec.budget.trials,
        budget_gpu_hours=spec.budget.gpu_hours or 0.0,
        parallelism=spec.parallelism,
        run_id=e.run_id,
        best_trial=e.best_trial,
        trials=[
            pb.Trial(
                number=t.number,
                state=t.state,
                job_id=t.job_id,
                values={k: _text(v) for k, v in t.values.items()},
                value=t.value if t.value is not None else 0.0,
                has_value=t.value is not None,
                curve=[pb.CurvePoint(epoch=ep, value=v) for ep, v in t.curve],
                metrics=t.metrics,
                model=t.model,
                reason=t.reason,
                device_s=t.device_s,
                started_ms=t.started_ms,
                finished_ms=t.finished_ms,
            )
            for t in e.trials
        ],
        device_s=e.device_s,
        created_ms=e.created_ms,
        finished_ms=e.finished_ms,
        parameters=list(spec.space),
    )


def _gpus(resources: dict[str, Any]) -> float:
    gpus = resources.get("gpus", 0) or 0
    milli = resources.get("gpuMilli", 0) or 0
    try:
        return float(gpus) + float(milli) / 1000.0
    except (TypeError, ValueError):
        return 0.0


def session_pb(v: SessionView, *, with_token: bool) -> pb.DevSession:
    """A dev session as the API shows it; ``with_token`` only for its owner."""
    spec = v.spec
    datasets = [str(d.get("dataset", "")) for d in spec.data]
    return pb.DevSession(
        name=v.name,
        owner=v.owner,
        state=v.state,
        reason=v.reason,
        spec_yaml=v.source,
        interface=spec.interface,
        url=v.url,
        token=v.token if with_token else "",
        generation=v.generation,
        job_id=v.job_id,
        endpoint=v.endpoint if v.state == "running" else "",
        active_s=v.active_s,
        history=[
            pb.SessionGeneration(
                number=g.number,
                job_id=g.job_id,
                started_ms=g.started_ms,
                ended_ms=g.ended_ms,
                how=g.how,
                active_s=g.active_s,
            )
            for g in v.history
        ],
        created_ms=v.created_ms,
        started_ms=v.started_ms,
        ended_ms=v.ended_ms,
        idle_timeout_s=float(spec.idle_timeout_s),
        lifetime_s=float(spec.lifetime_s),
        gpus=_gpus(spec.resources),
        dataset=",".join(d for d in datasets if d),
    )


class WorkflowApi(workflows_pb2_grpc.WorkflowServiceServicer):
    """Pipelines and their runs, experiments, dev sessions."""

    def __init__(
        self,
        registry: Registry,
        controller: Controller,
        experimenter: Experimenter,
        authorizer: Authorizer,
        sink: DecisionSink,
        sessions: Sessions | None = None,
    ) -> None:
        self.registry = registry
        self.controller = controller
        self.experimenter = experimenter
        self.sessions = sessions
        self.authorizer = authorizer
        self.sink = sink

    def _may_update(
        self, principal: Principal, method: str, name: str, kind: str = "pipeline"
    ) -> bool:
        """Whether ``principal`` may change others' pipelines, runs or experiments (recorded)."""
        decision = self.authorizer.decide(principal.subject, principal.roles, "update", kind)
        self.sink.record(
            AuthzDecision(
                principal=principal.subject,
                roles=list(principal.roles),
                action="update",
                resource_kind=kind,
                resource_name=name,
                decision="allow" if decision.allowed else "deny",
                reason=decision.reason,
                service=SERVICE_NAME,
                method=f"/{SERVICE}/{method}",
                via=principal.via,
                address=principal.address,
            ),
            actor=principal.subject,
        )
        return decision.allowed

    def _owner_or_admin(
        self, principal: Principal, owner: str, method: str, what: str, kind: str = "pipeline"
    ) -> None:
        if principal.subject == owner or self._may_update(principal, method, what, kind):
            return
        raise PermissionDenied(
            principal.subject,
            method.lower(),
            what,
            reason=f"it belongs to {owner}; only its owner or a principal allowed "
            f"'update {kind}' (platform admins) may change it",
        )

    def _last_run(self, name: str) -> Run | None:
        runs = self.controller.list(pipeline=name, limit=1)
        return runs[0] if runs else None

    @rpc_errors
    async def SubmitPipeline(
        self, request: pb.SubmitPipelineRequest, context: Any
    ) -> pb.SubmitPipelineResponse:
        """Check a pipeline document and store it as a new revision."""
        principal = current_principal()
        admin = request.dry_run is False and self._may_update_quietly(principal)
        record, replaced = await asyncio.to_thread(
            self.registry.submit,
            request.spec_yaml,
            owner=principal.subject,
            roles=principal.roles,
            may_replace_any=admin,
            dry_run=request.dry_run,
        )
        return pb.SubmitPipelineResponse(pipeline=pipeline_pb(record), replaced=replaced)

    def _may_update_quietly(self, principal: Principal) -> bool:
        return self.authorizer.decide(
            principal.subject, principal.roles, "update", "pipeline"
        ).allowed

    @rpc_errors
    async def GetPipeline(self, request: pb.NameRequest, context: Any) -> pb.Pipeline:
        """A pipeline's latest revision, its schedule and its last run."""
        record = await asyncio.to_thread(self.registry.get, request.name)
        last = await asyncio.to_thread(self._last_run, request.name)
        return pipeline_pb(record, last)

    @rpc_errors
    async def ListPipelines(
        self, request: pb.ListPipelinesRequest, context: Any
    ) -> pb.ListPipelinesResponse:
        """Every pipeline with its last run."""
        records = await asyncio.to_thread(self.registry.list)
        out = []
        for record in records:
            last = await asyncio.to_thread(self._last_run, record.pipeline.name)
            out.append(pipeline_pb(record, last))
        return pb.ListPipelinesResponse(pipelines=out)

    @rpc_errors
    async def DeletePipeline(self, request: pb.NameRequest, context: Any) -> pb.Pipeline:
        """Delete a pipeline with no active run (its runs' history stays)."""
        principal = current_principal()
        record = await asyncio.to_thread(self.registry.get, request.name)
        self._owner_or_admin(principal, record.owner, "DeletePipeline", f"pipeline {request.name}")
        active = await asyncio.to_thread(self.controller.active_runs, request.name)
        await asyncio.to_thread(
            self.registry.delete,
            request.name,
            caller=principal.subject,
            may_delete_any=True,
            active=active,
        )
        return pipeline_pb(record)

    @rpc_errors
    async def StartRun(self, request: pb.StartRunRequest, context: Any) -> pb.StartRunResponse:
        """Start a run as the caller (their quotas and rights apply to its steps)."""
        principal = current_principal()
        run, duplicate = await asyncio.to_thread(
            self.controller.start,
            request.pipeline,
            dict(request.params),
            caller=Caller(principal.subject, principal.roles),
            request_id=request.request_id,
        )
        return pb.StartRunResponse(run=self._run_pb(run), duplicate=duplicate)

    def _run_pb(self, run: Run) -> pb.Run:
        try:
            parents = dict(self.registry.revision(run.pipeline, run.revision).parents)
        except Exception:
            parents = {}
        return run_pb(run, parents)

    @rpc_errors
    async def GetRun(self, request: pb.RunRequest, context: Any) -> pb.Run:
        """A run with each step's state, job, outputs and lineage."""
        run = await asyncio.to_thread(self.controller.get, request.id)
        return await asyncio.to_thread(self._run_pb, run)

    @rpc_errors
    async def ListRuns(self, request: pb.ListRunsRequest, context: Any) -> pb.ListRunsResponse:
        """Runs, newest first (of one pipeline, in one state)."""
        runs = await asyncio.to_thread(
            self.controller.list,
            pipeline=request.pipeline,
            state=request.state,
            limit=request.limit or 100,
        )
        return pb.ListRunsResponse(runs=[run_pb(r) for r in runs])

    @rpc_errors
    async def CancelRun(self, request: pb.RunRequest, context: Any) -> pb.Run:
        """Cancel an active run and its running jobs."""
        principal = current_principal()
        run = await asyncio.to_thread(self.controller.get, request.id)
        self._owner_or_admin(principal, run.owner, "CancelRun", f"run {run.id}")
        run = await asyncio.to_thread(
            self.controller.cancel,
            request.id,
            request.reason,
            caller=Caller(principal.subject, principal.roles),
        )
        return await asyncio.to_thread(self._run_pb, run)

    @rpc_errors
    async def RetryRun(self, request: pb.RunRequest, context: Any) -> pb.Run:
        """Run a finished run's failed steps again, or everything from ``from_step``."""
        principal = current_principal()
        run = await asyncio.to_thread(self.controller.get, request.id)
        self._owner_or_admin(principal, run.owner, "RetryRun", f"run {run.id}")
        run = await asyncio.to_thread(
            self.controller.retry,
            request.id,
            caller=Caller(principal.subject, principal.roles),
            from_step=request.from_step,
        )
        return await asyncio.to_thread(self._run_pb, run)

    @rpc_errors
    async def SubmitExperiment(
        self, request: pb.SubmitExperimentRequest, context: Any
    ) -> pb.Experiment:
        """Check an Experiment document and start its search as the caller."""
        principal = current_principal()
        view = await asyncio.to_thread(
            self.experimenter.submit,
            request.spec_yaml,
            owner=Owner(principal.subject, principal.roles),
            dry_run=request.dry_run,
        )
        return experiment_pb(view)

    @rpc_errors
    async def GetExperiment(self, request: pb.NameRequest, context: Any) -> pb.Experiment:
        """An experiment with every trial and the best so far."""
        return experiment_pb(await asyncio.to_thread(self.experimenter.get, request.name))

    @rpc_errors
    async def ListExperiments(
        self, request: pb.ListExperimentsRequest, context: Any
    ) -> pb.ListExperimentsResponse:
        """Experiments, newest first."""
        views = await asyncio.to_thread(self.experimenter.list, state=request.state)
        return pb.ListExperimentsResponse(experiments=[experiment_pb(v) for v in views])

    @rpc_errors
    async def CancelExperiment(self, request: pb.NameRequest, context: Any) -> pb.Experiment:
        """Cancel an experiment and its running trials."""
        principal = current_principal()
        view = await asyncio.to_thread(self.experimenter.get, request.name)
        self._owner_or_admin(
            principal, view.owner, "CancelExperiment", f"experiment {view.name}", "experiment"
        )
        reason = request.reason or f"cancelled by {principal.subject}"
        return experiment_pb(
            await asyncio.to_thread(self.experimenter.cancel, request.name, reason)
        )

    def _sessions(self) -> Sessions:
        if self.sessions is None:
            raise Unavailable("dev sessions are not enabled in this workflows service")
        return self.sessions

    @rpc_errors
    async def StartDevSession(
        self, request: pb.StartDevSessionRequest, context: Any
    ) -> pb.DevSession:
        """Check a DevSession document and start it as the caller (the token comes back)."""
        principal = current_principal()
        view = await asyncio.to_thread(
            self._sessions().start,
            request.spec_yaml,
            owner=Owner(principal.subject, principal.roles),
            dry_run=request.dry_run,
        )
        return session_pb(view, with_token=not request.dry_run)

    @rpc_errors
    async def GetDevSession(self, request: pb.DevSessionRequest, context: Any) -> pb.DevSession:
        """A session's state, address and history (its token only for its owner)."""
        principal = current_principal()
        view = await asyncio.to_thread(self._sessions().get, request.name)
        return session_pb(view, with_token=principal.subject == view.owner)

    @rpc_errors
    async def ListDevSessions(
        self, request: pb.ListDevSessionsRequest, context: Any
    ) -> pb.ListDevSessionsResponse:
        """Sessions, newest first (tokens only of the caller's own)."""
        principal = current_principal()
        views = await asyncio.to_thread(self._sessions().list, state=request.state)
        return pb.ListDevSessionsResponse(
            sessions=[session_pb(v, with_token=principal.subject == v.owner) for v in views]
        )

    @rpc_errors
    async def StopDevSession(self, request: pb.DevSessionRequest, context: Any) -> pb.DevSession:
        """Stop a session: its files are saved and its GPU freed; it can be resumed."""
        principal = current_principal()
        sessions = self._sessions()
        view = await asyncio.to_thread(sessions.get, request.name)
        self._owner_or_admin(
            principal, view.owner, "StopDevSession", f"dev session {view.name}", "devsession"
        )
        reason = request.reason or f"stopped by {principal.subject}"
        view = await asyncio.to_thread(sessions.stop, request.name, reason)
        return session_pb(view, with_token=principal.subject == view.owner)

    @rpc_errors
    async def ResumeDevSession(self, request: pb.DevSessionRequest, context: Any) -> pb.DevSession:
        """Start an ended session's next generation with its files (and a new token)."""
        principal = current_principal()
        sessions = self._sessions()
        view = await asyncio.to_thread(sessions.get, request.name)
        self._owner_or_admin(
            principal, view.owner, "ResumeDevSession", f"dev session {view.name}", "devsession"
        )
        view = await asyncio.to_thread(sessions.resume, request.name)
        return session_pb(view, with_token=principal.subject == view.owner)


__all__ = [
    "METHOD_RULES",
    "SERVICE",
    "SERVICE_NAME",
    "WorkflowApi",
    "experiment_pb",
    "pipeline_pb",
    "run_pb",
    "session_pb",
]
