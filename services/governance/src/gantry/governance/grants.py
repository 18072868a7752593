"""Grants (domain): short-lived tokens that let a job's workers read exactly what its spec names.

When the scheduler places a job it publishes ``gantry.job.scheduled`` with the dataset versions
and view the job's spec names; governance remembers them. The node agent then asks for the
job's grant with its own service identity and receives a token for exactly those versions in
that view, valid for a few hours. Workers present the token on every read; nothing else (not a
user's token) opens data to them. Only the SHA-256 of a token is stored.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import orjson
import sqlalchemy as sa

from gantry.core import InvalidInput, NotFound, PermissionDenied, new_id
from gantry.events.catalog import GrantIssued, GrantRevoked, JobScheduled
from gantry.governance import store as db
from gantry.governance.catalog import Catalog, now_ms
from gantry.governance.changes import record

TOKEN_PREFIX = "ggr_"  # noqa: S105 -- a marker, not a secret
VIEWS = ("raw", "deidentified")


def check_view(view: str) -> str:
    """``raw`` or ``deidentified``; anything else is refused with the choices."""
    if view not in VIEWS:
        raise InvalidInput(f"view {view!r} is not known", hint="use 'raw' or 'deidentified'")
    return view


def _token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class GrantRecord:
    """A grant as stored (never the token)."""

    id: str
    job_id: str
    view: str
    versions: tuple[tuple[str, str], ...]
    issued_by: str
    created_ms: int
    expires_ms: int
    revoked: bool = False

    def covers(self, dataset: str, version: str) -> bool:
        """Whether the grant names this dataset version."""
        return (dataset, version) in self.versions


@dataclass(frozen=True)
class ScheduledJob:
    """What the scheduler said a job may read, and write."""

    job_id: str
    owner: str
    owner_roles: tuple[str, ...]
    datasets: tuple[tuple[str, str, str], ...]  # (dataset, version, view)
    model: tuple[str, int] | None = None  # spec.model: the model version it evaluates
    output_dataset: str = ""  # spec.output.dataset: the dataset it commits a version of


def _spec_model(spec: dict[str, Any]) -> str:
    """``name:version`` of a job spec's input model ("" for none or a malformed one: the
    scheduler validated the spec, so only a foreign event can carry one, and it gets nothing)."""
    model = spec.get("model")
    if not isinstance(model, dict):
        return ""
    name, version = model.get("name"), model.get("version")
    if not isinstance(name, str) or not name or isinstance(version, bool):
        return ""
    if not isinstance(version, int) or version < 1:
        return ""
    return f"{name}:{version}"


def _spec_output(spec: dict[str, Any]) -> str:
    output = spec.get("output")
    dataset = output.get("dataset") if isinstance(output, dict) else None
    return dataset if isinstance(dataset, str) else ""


def _grant(row: Any) -> GrantRecord:
    return GrantRecord(
        id=row.id,
        job_id=row.job_id,
        view=row.view,
        versions=tuple((d["dataset"], d["version"]) for d in orjson.loads(row.versions_json)),
        issued_by=row.issued_by,
        created_ms=row.created_ms,
        expires_ms=row.expires_ms,
        revoked=bool(row.revoked),
    )


class Grants:
    """Issues, checks, lists and revokes grants."""

    def __init__(self, catalog: Catalog, *, default_ttl_s: int, max_ttl_s: int) -> None:
        self.catalog = catalog
        self.engine = catalog.engine
        self.default_ttl_s = default_ttl_s
        self.max_ttl_s = max_ttl_s

    def issue(
        self,
        job_id: str,
        versions: Sequence[tuple[str, str]],
        view: str,
        *,
        issued_by: str,
        ttl_s: int = 0,
        correlation_id: str | None = None,
    ) -> tuple[GrantRecord, str]:
        """A new grant and its token (the only time the token exists in clear)."""
        check_view(view)
        if not job_id.strip():
            raise InvalidInput("a grant is for a job: give its job id")
        if not versions:
            raise InvalidInput("a grant needs at least one dataset version")
        ttl = ttl_s or self.default_ttl_s
        if not 1 <= ttl <= self.max_ttl_s:
            raise InvalidInput(
                f"grant lifetime {ttl} s is out of range", hint=f"use 1..{self.max_ttl_s} s"
            )
        resolved = tuple(sorted({(ds, self.catalog.get_version(ds, v).id) for ds, v in versions}))
        token = TOKEN_PREFIX + base64.urlsafe_b64encode(secrets.token_bytes(32)).decode().rstrip(
            "="
        )
        created = now_ms()
        grant = GrantRecord(
            id=new_id(),
            job_id=job_id,
            view=view,
            versions=resolved,
            issued_by=issued_by,
            created_ms=created,
            expires_ms=created + ttl * 1000,
        )
        listed = [{"dataset": d, "version": v} for d, v in resolved]
        with self.engine.begin() as conn:
            conn.execute(
                db.grants.insert().values(
                    id=grant.id,
                    token_hash=_token_hash(token),
                    job_id=job_id,
                    view=view,
                    versions_json=orjson.dumps(listed).decode(),
                    issued_by=issued_by,
                    created_ms=created,
                    expires_ms=grant.expires_ms,
                    revoked=False,
                )
            )
            record(
                conn,
                "gantry.data.grant.issued",
                GrantIssued(
                    grant_id=grant.id,
                    job_id=job_id,
                    view="raw" if view == "raw" else "deidentified",
                    versions=listed,
                    expires_ms=grant.expires_ms,
                ),
                actor=issued_by,
                subject=f"job/{job_id}",
                correlation_id=correlation_id,
            )
        return grant, token

    def verify(self, token: str, dataset: str, version: str, view: str) -> GrantRecord:
        """The grant behind ``token`` if it allows reading ``dataset@version`` in ``view``.

        Refusals (:class:`PermissionDenied`) say exactly why: unknown, expired, revoked, or
        issued for other data or another view.
        """
        grant = self.lookup(token)
        subject = f"job {grant.job_id}"
        if now_ms() >= grant.expires_ms:
            raise PermissionDenied(
                subject, "read", f"dataset {dataset}",
                reason=f"grant {grant.id} expired at {grant.expires_ms} (Unix ms)",
                hint="the job must obtain a new grant",
            )  # fmt: skip
        if not grant.covers(dataset, version):
            names = ", ".join(f"{d}@{v[:12]}" for d, v in grant.versions)
            raise PermissionDenied(
                subject, "read", f"dataset {dataset}@{version[:12]}",
                reason=f"grant {grant.id} covers only {names}",
                hint="a job may read only the dataset versions its spec names",
            )  # fmt: skip
        if view != grant.view:
            raise PermissionDenied(
                subject, "read", f"dataset {dataset}",
                reason=f"grant {grant.id} is for the {grant.view} view, not {view}",
            )  # fmt: skip
        return grant

    def lookup(self, token: str) -> GrantRecord:
        """The live grant behind a token; :class:`PermissionDenied` if unknown or revoked."""
        if not token.startswith(TOKEN_PREFIX):
            raise PermissionDenied(
                "anonymous", "read", "dataset", reason="the grant token is malformed",
                hint="pass the token exactly as issued (it starts with 'ggr_')",
            )  # fmt: skip
        digest = _token_hash(token)
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(db.grants).where(db.grants.c.token_hash == digest)).first()
        if row is None or not hmac.compare_digest(row.token_hash, digest):
            raise PermissionDenied(
                "anonymous", "read", "dataset", reason="the grant token is not known",
                hint="grants are issued per job; ask for the job's grant again",
            )  # fmt: skip
        if row.revoked:
            raise PermissionDenied(
                f"job {row.job_id}", "read", "dataset", reason=f"grant {row.id} was revoked"
            )
        return _grant(row)

    def revoke(
        self, grant_id: str, *, actor: str, reason: str = "", correlation_id: str | None = None
    ) -> GrantRecord:
        """Revoke a grant now (idempotent); its token opens nothing afterwards."""
        with self.engine.begin() as conn:
            row = conn.execute(sa.select(db.grants).where(db.grants.c.id == grant_id)).first()
            if row is None:
                raise NotFound("grant", grant_id, hint="list grants with `gantry data grants`")
            if not row.revoked:
                conn.execute(
                    db.grants.update().where(db.grants.c.id == grant_id).values(revoked=True)
                )
                record(
                    conn,
                    "gantry.data.grant.revoked",
                    GrantRevoked(grant_id=grant_id, job_id=row.job_id, reason=reason),
                    actor=actor,
                    subject=f"job/{row.job_id}",
                    correlation_id=correlation_id,
                )
        return replace(_grant(row), revoked=True)

    def list(self, job_id: str = "", *, include_expired: bool = False) -> list[GrantRecord]:
        """Grants (never their tokens), newest first."""
        query = sa.select(db.grants).order_by(db.grants.c.created_ms.desc()).limit(1000)
        if job_id:
            query = query.where(db.grants.c.job_id == job_id)
        if not include_expired:
            query = query.where(db.grants.c.expires_ms > now_ms())
        with self.engine.connect() as conn:
            return [_grant(r) for r in conn.execute(query).all()]

    # ------------------------------------------------------------------ scheduled jobs

    def remember_job(self, conn: sa.Connection, job: JobScheduled) -> None:
        """Store what a scheduled job may read (from ``gantry.job.scheduled``), idempotently."""
        conn.execute(db.scheduled_jobs.delete().where(db.scheduled_jobs.c.job_id == job.job_id))
        conn.execute(
            db.scheduled_jobs.insert().values(
                job_id=job.job_id,
                owner=job.owner,
                owner_roles_json=orjson.dumps(job.owner_roles).decode(),
                datasets_json=orjson.dumps([d.model_dump() for d in job.datasets]).decode(),
                nodes_json=orjson.dumps(job.nodes).decode(),
                scheduled_ms=now_ms(),
                input_model=_spec_model(job.spec),
                output_dataset=_spec_output(job.spec),
            )
        )

    def scheduled_job(self, job_id: str) -> ScheduledJob:
        """What the scheduler said ``job_id`` may read; :class:`NotFound` if never scheduled."""
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(db.scheduled_jobs).where(db.scheduled_jobs.c.job_id == job_id)
            ).first()
        if row is None:
            raise NotFound(
                "scheduled job",
                job_id,
                hint="grants for jobs are issued after the scheduler places them",
            )
        name, _, version = row.input_model.rpartition(":")
        return ScheduledJob(
            job_id=row.job_id,
            owner=row.owner,
            owner_roles=tuple(orjson.loads(row.owner_roles_json)),
            datasets=tuple(
                (d["dataset"], d["version"], d.get("view", "deidentified"))
                for d in orjson.loads(row.datasets_json)
            ),
            model=(name, int(version)) if name and version.isdigit() else None,
            output_dataset=row.output_dataset,
        )


__all__ = ["TOKEN_PREFIX", "VIEWS", "GrantRecord", "Grants", "ScheduledJob", "check_view"]
