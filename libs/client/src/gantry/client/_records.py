"""The governance service's answers as plain frozen dataclasses, built from its messages.

Re-exported by :mod:`gantry.client.governance`; import them from there.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gantry.client.specs import ColumnRule, ColumnSpec, VersionRef
from gantry.protos.v1 import governance_pb2 as pb


@dataclass(frozen=True)
class Dataset:
    """A dataset: its format (table or files), columns, owner and latest version."""

    name: str
    owner: str
    format: str
    columns: tuple[ColumnSpec, ...]
    description: str
    head: str  #: the latest version id; "" before the first commit
    created_ms: int
    versions: int
    policy_version: int  #: the current view policy's version

    @classmethod
    def from_pb(cls, m: pb.Dataset) -> Dataset:
        """From the protocol message."""
        return cls(
            m.name,
            m.owner,
            m.format,
            tuple(ColumnSpec.from_pb(c) for c in m.columns),
            m.description,
            m.head,
            m.created_ms,
            m.versions,
            m.policy_version,
        )


@dataclass(frozen=True)
class Shard:
    """A piece of a version: a run of rows, or one file (``path``). ``id`` is its sha256."""

    id: str
    rows: int
    bytes: int
    path: str = ""

    @classmethod
    def from_pb(cls, m: pb.Shard) -> Shard:
        """From the protocol message."""
        return cls(m.id, m.rows, m.bytes, m.path)


@dataclass(frozen=True)
class Version:
    """An immutable dataset version; ``id`` is the sha256 of its manifest."""

    id: str
    dataset: str
    parents: tuple[str, ...]
    message: str
    author: str
    created_ms: int
    rows: int
    bytes: int
    shards: tuple[Shard, ...]
    columns: tuple[ColumnSpec, ...]
    rollback_of: str = ""  #: set when this version restores an earlier one

    @property
    def short_id(self) -> str:
        """The first 12 characters of the id, as the CLI shows it (any unique prefix works)."""
        return self.id[:12]

    @classmethod
    def from_pb(cls, m: pb.Version) -> Version:
        """From the protocol message."""
        return cls(
            m.id,
            m.dataset,
            tuple(m.parents),
            m.message,
            m.author,
            m.created_ms,
            m.rows,
            m.bytes,
            tuple(Shard.from_pb(s) for s in m.shards),
            tuple(ColumnSpec.from_pb(c) for c in m.columns),
            m.rollback_of,
        )


@dataclass(frozen=True)
class Diff:
    """What changed between two versions: shards and rows added and removed, schema changes."""

    from_version: str
    to_version: str
    added: tuple[Shard, ...]
    removed: tuple[Shard, ...]
    rows_added: int
    rows_removed: int
    schema_changes: tuple[str, ...]

    @classmethod
    def from_pb(cls, m: pb.DiffResponse) -> Diff:
        """From the protocol message."""
        return cls(
            m.from_version,
            m.to_version,
            tuple(Shard.from_pb(s) for s in m.added),
            tuple(Shard.from_pb(s) for s in m.removed),
            m.rows_added,
            m.rows_removed,
            tuple(m.schema_changes),
        )


@dataclass(frozen=True)
class ShardList:
    """The shards of a version and its columns as the caller's view shows them."""

    version: str
    view: str
    shards: tuple[Shard, ...]
    columns: tuple[ColumnSpec, ...]

    @classmethod
    def from_pb(cls, m: pb.ListShardsResponse) -> ShardList:
        """From the protocol message."""
        return cls(
            m.version,
            m.view,
            tuple(Shard.from_pb(s) for s in m.shards),
            tuple(ColumnSpec.from_pb(c) for c in m.columns),
        )


@dataclass(frozen=True)
class UploadResult:
    """An upload the service has stored, ready to be committed by ``upload_id``."""

    upload_id: str
    rows: int
    bytes: int
    shards: int
    files: int = 0
    rows_erased: int = 0  #: rows dropped: they hold a data subject erased from the dataset

    @classmethod
    def from_pb(cls, m: pb.UploadResponse) -> UploadResult:
        """From the protocol message."""
        return cls(m.upload_id, m.rows, m.bytes, m.shards, m.files, m.rows_erased)


@dataclass(frozen=True)
class ViewPolicy:
    """How the de-identified view transforms a dataset's columns, and who set it when."""

    dataset: str
    version: int
    rules: tuple[ColumnRule, ...]
    author: str
    created_ms: int

    @classmethod
    def from_pb(cls, m: pb.ViewPolicy) -> ViewPolicy:
        """From the protocol message."""
        return cls(
            m.dataset,
            m.version,
            tuple(ColumnRule.from_pb(r) for r in m.rules),
            m.author,
            m.created_ms,
        )


@dataclass(frozen=True)
class Grant:
    """A job's right to read given dataset versions in one view until ``expires_ms``.

    ``token`` is a secret, returned only when the grant is issued; it is left out of ``repr``.
    """

    id: str
    token: str = field(repr=False)
    job_id: str = ""
    versions: tuple[VersionRef, ...] = ()
    view: str = ""
    expires_ms: int = 0
    issued_by: str = ""
    revoked: bool = False
    created_ms: int = 0

    @classmethod
    def from_pb(cls, m: pb.Grant) -> Grant:
        """From the protocol message."""
        return cls(
            m.id,
            m.token,
            m.job_id,
            tuple(VersionRef(v.dataset, v.version) for v in m.versions),
            m.view,
            m.expires_ms,
            m.issued_by,
            m.revoked,
            m.created_ms,
        )


@dataclass(frozen=True)
class LineageEdge:
    """One step of lineage: ``from`` (kind, id) fed ``to`` (kind, id) at ``time_ms``.

    Kinds are ``dataset_version`` (id ``NAME@VERSION``), ``job`` and ``model_version``.
    """

    from_kind: str
    from_id: str
    to_kind: str
    to_id: str
    time_ms: int

    @classmethod
    def from_pb(cls, m: pb.LineageEdge) -> LineageEdge:
        """From the protocol message."""
        return cls(m.from_kind, m.from_id, m.to_kind, m.to_id, m.time_ms)


__all__ = [
    "Dataset",
    "Diff",
    "Grant",
    "LineageEdge",
    "Shard",
    "ShardList",
    "UploadResult",
    "Version",
    "ViewPolicy",
]
