"""Access checks inside handlers (domain): RBAC with request attributes, grants, read records.

The gRPC interceptor decides on the method alone; what depends on the request — the view asked
for, the dataset named, whether a grant covers it — is decided here. Every such decision is
recorded as ``gantry.authz.decision`` (allow and deny), and every read, allowed or refused,
produces a ``gantry.data.accessed`` event through the outbox, so the audit sees each one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gantry.core import PermissionDenied
from gantry.events.catalog import AuthzDecision, DataAccessed
from gantry.governance.catalog import Catalog
from gantry.governance.changes import record
from gantry.governance.grants import GrantRecord, Grants, check_view
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
        self.sink.record(
            AuthzDecision(
                principal=principal.subject,
                roles=list(principal.roles),
                action=action,
                resource_kind=kind,
                resource_name=name or "*",
                decision="allow" if decision.allowed else "deny",
                reason=decision.reason,
                service=SERVICE_NAME,
                method=method,
            ),
            actor=principal.subject,
        )
        if not decision.allowed:
            raise PermissionDenied(
                principal.subject, action, f"{kind} {name}".strip(), reason=decision.reason
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
            record(
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
                )


__all__ = ["SERVICE_NAME", "Access", "ReadPermit"]
