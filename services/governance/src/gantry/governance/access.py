"""Access checks inside handlers (domain): RBAC with request attributes, grants, read records.

The gRPC interceptor decides on the method alone; what depends on the request — the view asked
for, the dataset named, whether a grant covers it, whose permission a model registration needs
— is decided here. Every such decision is recorded as ``gantry.authz.decision`` (allow and
deny), and every read, allowed or refused, produces a ``gantry.data.accessed`` event through
the outbox, so the audit sees each one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NoReturn

from gantry.core import InvalidInput, NotFound, PermissionDenied
from gantry.events.catalog import AuthzDecision, DataAccessed
from gantry.governance.catalog import Catalog
from gantry.governance.changes import record
from gantry.governance.grants import GrantRecord, Grants, ScheduledJob, check_view
from gantry.governance.lineage import add_edge, dataset_node
from gantry.security import Authorizer, Principal
from gantry.security.interceptor import DecisionSink

SERVICE_NAME = "governance"


@dataclass(frozen=True)
class ReadPermit:
    """Why a read is allowed: the caller's own role, or a job's grant."""

    principal: Principal
    view: str
    grant: GrantRecord | None = None


class Access:
    """Authorises reads and records them."""

    def __init__(
        self, catalog: Catalog, grants: Grants, authorizer: Authorizer, sink: DecisionSink
    ) -> None:
        self.catalog = catalog
        self.grants = grants
        self.authorizer = authorizer
        self.sink = sink

    def check(
        self,
        principal: Principal,
        action: str,
        kind: str,
        name: str,
        attrs: dict[str, str] | None = None,
        *,
        method: str = "",
    ) -> None:
        """Decide with request attributes, record the decision, raise on deny."""
        decision = self.authorizer.decide(principal.subject, principal.roles, action, kind, attrs)
        self._record(
            principal, action, kind, name, allowed=decision.allowed, reason=decision.reason,
            actor=principal.subject, method=method,
        )  # fmt: skip
        if not decision.allowed:
            raise PermissionDenied(
                principal.subject, action, f"{kind} {name}".strip(), reason=decision.reason
            )

    def may(self, principal: Principal, action: str, kind: str) -> bool:
        """Whether ``principal`` may ``action`` on ``kind``; not recorded, so only for leaving
        something out of an answer, never for refusing a call (use :meth:`check`)."""
        return self.authorizer.decide(principal.subject, principal.roles, action, kind).allowed

    def model_registrant(
        self, caller: Principal, model: str, job_id: str, *, method: str
    ) -> tuple[str, ScheduledJob | None]:
        """Who registers a version of ``model``: the caller, or the owner of a service's job.

        A user needs ``register model`` and registers as themself (the job id is plain
        lineage). A service registers only on behalf of a job the scheduler placed: the job's
        owner needs ``register model`` and becomes ``registered_by``; the job comes back so
        its dataset versions can be checked (:meth:`check_trained_on`). The decision is
        recorded under the owner's name with the service as its actor.
        """
        if caller.kind != "service":
            self.check(caller, "register", "model", model, method=method)
            return caller.subject, None
        job = self._scheduled(
            caller, "register", "model", model, job_id, method=method,
            refusal="a service registers models only on behalf of a job the scheduler placed",
            hint="set job_id in ModelStart to the job that trained the model",
        )  # fmt: skip
        self._owner_may(
            caller, job, "register", "model", model, method=method,
            hint="the job's owner needs a role that may register models, e.g. ml-developer",
        )  # fmt: skip
        return job.owner, job

    def model_reader(
        self, caller: Principal, model: str, version: int, job_id: str, *, method: str
    ) -> None:
        """Allow a download of ``model`` ``version`` that names ``job_id``, or refuse it.

        Only a service's download for a job is decided here (the caller's own ``read model``
        was decided on the method): it must be for a job the scheduler placed whose
        ``spec.model`` is this exact version, and the job's owner needs ``read model``.
        Recorded under the owner's name with the service as its actor.
        """
        if caller.kind != "service" or not job_id:
            return
        name = f"{model}:{version}"
        job = self._scheduled(
            caller, "read", "model", name, job_id, method=method,
            refusal="", hint="give the job id of a job the scheduler placed",
        )  # fmt: skip
        if job.model != (model, version):
            named = f"{job.model[0]}:{job.model[1]}" if job.model else "no model"
            self._refuse(
                caller, "read", "model", name, method=method,
                reason=f"job {job_id} was scheduled with {named} as spec.model, not {name}",
                hint="an agent downloads only the model version its job's spec names",
            )  # fmt: skip
        self._owner_may(
            caller, job, "read", "model", name, method=method,
            hint="the job's owner needs a role that may read models, e.g. ml-developer",
        )  # fmt: skip

    def dataset_writer(
        self, caller: Principal, dataset: str, job_id: str, *, method: str
    ) -> tuple[str, ScheduledJob | None]:
        """Who uploads to and commits ``dataset``: the caller, or the owner of a service's job.

        A user needs ``update dataset`` and writes as themself. A service writes only on
        behalf of a job the scheduler placed whose ``spec.output`` names ``dataset``: the
        job's owner needs ``update dataset`` and becomes the author; the job comes back for
        the commit's lineage. Recorded under the owner's name with the service as its actor.
        """
        if caller.kind != "service":
            self.check(caller, "update", "dataset", dataset, method=method)
            return caller.subject, None
        job = self._scheduled(
            caller, "update", "dataset", dataset, job_id, method=method,
            refusal="a service writes datasets only on behalf of a job the scheduler placed",
            hint="set job_id to the job whose spec.output names the dataset",
        )  # fmt: skip
        if job.output_dataset != dataset:
            named = job.output_dataset or "none"
            self._refuse(
                caller, "update", "dataset", dataset, method=method,
                reason=f"job {job_id} was scheduled with spec.output dataset {named}, "
                f"not {dataset}",
                hint="an agent commits only the dataset its job's spec.output names",
            )  # fmt: skip
        self._owner_may(
            caller, job, "update", "dataset", dataset, method=method,
            hint="the job's owner needs a role that may update the dataset, e.g. data-steward",
        )  # fmt: skip
        return job.owner, job

    def _scheduled(
        self, caller: Principal, action: str, kind: str, name: str, job_id: str, *,
        method: str, refusal: str, hint: str,
    ) -> ScheduledJob:  # fmt: skip
        """The scheduled job a service acts for; refused (recorded) without one."""
        if not job_id:
            self._refuse(caller, action, kind, name, method=method, reason=refusal, hint=hint)
        try:
            return self.grants.scheduled_job(job_id)
        except NotFound:
            self._record(
                caller, action, kind, name, allowed=False, actor=caller.subject,
                reason=f"no scheduled job {job_id} is known here", method=method,
            )  # fmt: skip
            raise NotFound(
                "scheduled job", job_id,
                hint=f"a service may {action} a {kind} only for jobs the scheduler placed: "
                "check the job id, or retry once governance has consumed the job's "
                "gantry.job.scheduled",
            ) from None  # fmt: skip

    def _owner_may(
        self, caller: Principal, job: ScheduledJob, action: str, kind: str, name: str, *,
        method: str, hint: str,
    ) -> None:  # fmt: skip
        """Decide ``action`` for the job's owner, record it with the service as actor, raise
        :class:`PermissionDenied` if refused."""
        owner = Principal(job.owner, job.owner_roles, "", caller.expires_at)
        decision = self.authorizer.decide(owner.subject, owner.roles, action, kind)
        self._record(
            owner, action, kind, name, allowed=decision.allowed,
            reason=f"{decision.reason} (for job {job.job_id} via service {caller.subject})",
            actor=caller.subject, method=method,
        )  # fmt: skip
        if not decision.allowed:
            raise PermissionDenied(
                caller.subject, action, f"{kind} {name}",
                reason=f"it acts for job {job.job_id}, whose owner is refused: {decision.reason}",
                hint=hint,
            )  # fmt: skip

    def _refuse(
        self, caller: Principal, action: str, kind: str, name: str, *, method: str,
        reason: str, hint: str,
    ) -> NoReturn:  # fmt: skip
        self._record(
            caller, action, kind, name, allowed=False, reason=reason, actor=caller.subject,
            method=method,
        )  # fmt: skip
        raise PermissionDenied(caller.subject, action, f"{kind} {name}", reason=reason, hint=hint)

    def check_trained_on(self, job: ScheduledJob, trained_on: Sequence[tuple[str, str]]) -> None:
        """Refuse ``trained_on`` (dataset, version id) pairs the job was not scheduled with."""
        placed = {(d, self.catalog.get_version(d, v).id) for d, v, _view in job.datasets}
        outside = [f"{d}@{v[:12]}" for d, v in trained_on if (d, v) not in placed]
        if outside:
            names = ", ".join(f"{d}@{v[:12]}" for d, v in sorted(placed)) or "no dataset"
            raise InvalidInput(
                f"a model registered for job {job.job_id} cannot be trained on "
                f"{', '.join(outside)}: the job was scheduled with {names} only",
                hint="name in trained_on only dataset versions the job's spec reads "
                "(spec.data), or have a user register the model",
            )

    def _record(
        self,
        principal: Principal,
        action: str,
        kind: str,
        name: str,
        *,
        allowed: bool,
        reason: str,
        actor: str,
        method: str,
    ) -> None:
        self.sink.record(
            AuthzDecision(
                principal=principal.subject,
                roles=list(principal.roles),
                action=action,
                resource_kind=kind,
                resource_name=name or "*",
                decision="allow" if allowed else "deny",
                reason=reason,
                service=SERVICE_NAME,
                method=method,
                via=principal.via,
                address=principal.address,
            ),
            actor=actor,
        )

    def permit_read(
        self,
        principal: Principal,
        dataset: str,
        version: str,
        view: str,
        grant_token: str,
        *,
        method: str,
    ) -> ReadPermit:
        """Allow reading ``dataset@version`` in ``view``, by grant or by the caller's roles."""
        check_view(view)
        if grant_token:
            grant = self.grants.verify(grant_token, dataset, version, view)
            return ReadPermit(principal, view, grant)
        self.check(principal, "read", "dataset", dataset, {"view": view}, method=method)
        return ReadPermit(principal, view)

    def record_read(
        self,
        principal: Principal,
        dataset: str,
        version: str,
        view: str,
        *,
        shards: Sequence[str] = (),
        rows: int = 0,
        allowed: bool,
        reason: str = "",
        purpose: str = "",
        permit: ReadPermit | None = None,
        policy_version: int = 0,
        correlation_id: str | None = None,
    ) -> None:
        """Durably record one read (allowed or refused) as ``gantry.data.accessed``."""
        grant = permit.grant if permit else None
        with self.catalog.engine.begin() as conn:
            event = record(
                conn,
                "gantry.data.accessed",
                DataAccessed(
                    dataset=dataset,
                    version=version,
                    view="raw" if view == "raw" else "deidentified",
                    rows=rows,
                    decision="allow" if allowed else "deny",
                    purpose=purpose,
                    shards=list(shards),
                    grant=grant.id if grant else "",
                    job_id=grant.job_id if grant else "",
                    policy_version=policy_version,
                    reason=reason,
                    address=principal.address,
                ),
                actor=principal.subject,
                subject=f"dataset/{dataset}",
                correlation_id=correlation_id,
            )
            if grant is not None and allowed and version:
                add_edge(
                    conn,
                    "dataset_version",
                    dataset_node(dataset, version),
                    "job",
                    grant.job_id,
                    grant.created_ms,
                    event_id=event.id,
                    event_type=event.type,
                )


__all__ = ["SERVICE_NAME", "Access", "ReadPermit"]
