"""Domain records as protocol messages (the API's vocabulary)."""

from __future__ import annotations

from gantry.governance.catalog import DatasetRecord, VersionRecord, columns_from_json
from gantry.governance.deid import rules_to_pb
from gantry.governance.findings import SubjectFindings
from gantry.governance.grants import GrantRecord
from gantry.governance.lineage import Edge
from gantry.governance.manifest import ManifestDiff, ShardEntry
from gantry.governance.registry import ModelRecord
from gantry.governance.schema import columns_to_pb
from gantry.governance.subjects import ErasureRecord, SubjectVersion
from gantry.governance.views import PolicyRecord
from gantry.protos.v1 import governance_pb2 as pb


def dataset_pb(ds: DatasetRecord) -> pb.Dataset:
    """A dataset record as a message."""
    columns = (
        columns_to_pb(ds.columns)
        if ds.format == "table"
        else [pb.Column(name="content", type="binary", classification=str(ds.files_classification))]
    )
    return pb.Dataset(
        name=ds.name,
        owner=ds.owner,
        format=ds.format,
        columns=columns,
        description=ds.description,
        head=ds.head,
        created_ms=ds.created_ms,
        versions=ds.versions,
        policy_version=ds.policy_version,
    )


def shard_pb(s: ShardEntry) -> pb.Shard:
    """A manifest entry as a message (the object name stays inside the service)."""
    return pb.Shard(id=s.id, rows=s.rows, bytes=s.size, path=s.path)


def version_pb(v: VersionRecord, *, with_shards: bool = True) -> pb.Version:
    """A version as a message."""
    m = v.manifest
    return pb.Version(
        id=v.id,
        dataset=m.dataset,
        parents=list(m.parents),
        message=m.message,
        author=m.author,
        created_ms=m.created_ms,
        rows=m.rows,
        bytes=m.size,
        shards=[shard_pb(s) for s in m.shards] if with_shards else [],
        columns=columns_to_pb(columns_from_json(m.columns)) if m.format == "table" else [],
        rollback_of=m.rollback_of,
    )


def diff_pb(a: str, b: str, d: ManifestDiff) -> pb.DiffResponse:
    """A diff as a message."""
    return pb.DiffResponse(
        from_version=a,
        to_version=b,
        added=[shard_pb(s) for s in d.added],
        removed=[shard_pb(s) for s in d.removed],
        rows_added=d.rows_added,
        rows_removed=d.rows_removed,
        schema_changes=list(d.schema_changes),
    )


def policy_pb(p: PolicyRecord) -> pb.ViewPolicy:
    """A policy version as a message."""
    return pb.ViewPolicy(
        dataset=p.dataset,
        version=p.version,
        rules=rules_to_pb(p.policy.rules),
        author=p.author,
        created_ms=p.created_ms,
    )


def grant_pb(g: GrantRecord, token: str = "") -> pb.Grant:
    """A grant as a message (the token only when it was just issued)."""
    return pb.Grant(
        id=g.id,
        token=token,
        job_id=g.job_id,
        versions=[pb.GrantedVersion(dataset=d, version=v) for d, v in g.versions],
        view=g.view,
        expires_ms=g.expires_ms,
        issued_by=g.issued_by,
        revoked=g.revoked,
        created_ms=g.created_ms,
    )


def edge_pb(e: Edge) -> pb.LineageEdge:
    """A lineage edge as a message."""
    return pb.LineageEdge(
        from_kind=e.from_kind,
        from_id=e.from_id,
        to_kind=e.to_kind,
        to_id=e.to_id,
        time_ms=e.time_ms,
    )


def model_pb(m: ModelRecord) -> pb.ModelVersion:
    """A model version as a message."""
    return pb.ModelVersion(
        name=m.name,
        version=m.version,
        digest=m.digest,
        bytes=m.bytes,
        framework=m.framework,
        job_id=m.job_id,
        metrics=m.metrics,
        signature_json=m.signature_json,
        registered_by=m.registered_by,
        created_ms=m.created_ms,
        trained_on=[pb.GrantedVersion(dataset=d, version=v) for d, v in m.trained_on],
        description=m.description,
        code_version=m.code_version,
    )


def subject_version_pb(v: SubjectVersion) -> pb.SubjectVersion:
    """A version holding (or made without) a data subject, as a message."""
    return pb.SubjectVersion(
        dataset=v.dataset,
        version=v.version,
        rows=v.rows,
        columns=list(v.columns),
        created_ms=v.created_ms,
        author=v.author,
        event_id=v.event_id,
        is_head=v.is_head,
        erasure_id=v.erasure_id,
    )


def erasure_pb(e: ErasureRecord) -> pb.Erasure:
    """An erasure as a message."""
    return pb.Erasure(
        erasure_id=e.erasure_id,
        subject_ref=e.subject_ref,
        requested_by=e.requested_by,
        requested_ms=e.requested_ms,
        reason=e.reason,
        new_versions=[subject_version_pb(v) for v in e.new_versions],
        rows_removed=list(e.rows_removed),
        models_to_retrain=list(e.models_to_retrain),
        event_id=e.event_id,
    )


def findings_pb(f: SubjectFindings) -> pb.SubjectFindings:
    """A data subject's findings as a message (the index hits and digests stay inside)."""
    return pb.SubjectFindings(
        subject_ref=f.subject_ref,
        versions=[subject_version_pb(v) for v in f.versions],
        links=[
            pb.SubjectLink(
                from_kind=e.from_kind,
                from_id=e.from_id,
                to_kind=e.to_kind,
                to_id=e.to_id,
                time_ms=e.time_ms,
                event_id=e.event_id,
                event_type=e.event_type,
            )
            for e in f.links
        ],
        jobs=list(f.jobs),
        models=list(f.models),
        datasets_searched=list(f.datasets_searched),
        datasets_not_searchable=list(f.datasets_not_searchable),
        erasures=[erasure_pb(e) for e in f.erasures],
        searched_ms=f.searched_ms,
    )


__all__ = [
    "dataset_pb",
    "diff_pb",
    "edge_pb",
    "erasure_pb",
    "findings_pb",
    "grant_pb",
    "model_pb",
    "policy_pb",
    "shard_pb",
    "subject_version_pb",
    "version_pb",
]
