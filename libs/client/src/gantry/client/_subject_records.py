"""What the governance service says about data subjects, as plain frozen records.

:meth:`~gantry.client.governance.DataClient.find_subject` returns :class:`SubjectFindings`:
every dataset version holding the identifier (:class:`SubjectVersion`), the lineage from those
versions to jobs and model versions (:class:`SubjectLink`), and the erasures already made for
the person (:class:`Erasure`). Each finding names the audit event that recorded it. Re-exported
by :mod:`gantry.client.governance`; import them from there.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from gantry.protos.v1 import governance_pb2 as pb


@dataclass(frozen=True)
class SubjectVersion:
    """A dataset version holding the subject (or, in an erasure, committed without them)."""

    dataset: str
    version: str
    """The full version id ("" in a dry run's planned versions)."""
    rows: int
    """Rows holding the identifier (0 for a version an erasure committed)."""
    columns: tuple[str, ...]
    """The pii columns it was found in."""
    created_ms: int
    author: str
    event_id: str
    """The audited ``gantry.data.version.committed`` event ("" for versions made before
    governance recorded it)."""
    is_head: bool
    erasure_id: str = ""
    """Set on a version an erasure committed."""

    @property
    def short_id(self) -> str:
        """The first 12 characters of the version id, as the CLI shows it."""
        return self.version[:12]

    @classmethod
    def from_pb(cls, m: pb.SubjectVersion) -> SubjectVersion:
        """From the protocol message."""
        return cls(
            dataset=m.dataset,
            version=m.version,
            rows=m.rows,
            columns=tuple(m.columns),
            created_ms=m.created_ms,
            author=m.author,
            event_id=m.event_id,
            is_head=m.is_head,
            erasure_id=m.erasure_id,
        )

    def to_json(self) -> dict[str, Any]:
        """As a JSON object."""
        return {**dataclasses.asdict(self), "columns": list(self.columns)}


@dataclass(frozen=True)
class SubjectLink:
    """A lineage step from data holding the subject: a version read by a job
    (``gantry.data.accessed``), or a model version registered from a job or a version
    (``gantry.model.registered``)."""

    from_kind: str
    """``dataset_version`` or ``job``."""
    from_id: str
    to_kind: str
    """``job`` or ``model_version``."""
    to_id: str
    time_ms: int
    event_id: str
    """The audited event that made the link ("" for links made before it was recorded)."""
    event_type: str

    @classmethod
    def from_pb(cls, m: pb.SubjectLink) -> SubjectLink:
        """From the protocol message."""
        return cls(m.from_kind, m.from_id, m.to_kind, m.to_id, m.time_ms, m.event_id, m.event_type)

    def to_json(self) -> dict[str, Any]:
        """As a JSON object."""
        return {
            "from_kind": self.from_kind,
            "from_id": self.from_id,
            "to_kind": self.to_kind,
            "to_id": self.to_id,
            "time_ms": self.time_ms,
            "event_id": self.event_id,
            "event_type": self.event_type,
        }


@dataclass(frozen=True)
class Erasure:
    """An erasure of a data subject: the versions committed without them (``rows_removed``
    per version, same order) and the model versions to retrain. A dry run has no id."""

    erasure_id: str
    subject_ref: str
    """A keyed reference to the person (not reversible); the identifier is never kept."""
    requested_by: str
    requested_ms: int
    reason: str
    new_versions: tuple[SubjectVersion, ...]
    rows_removed: tuple[int, ...]
    models_to_retrain: tuple[str, ...]
    """``<model>:<version>`` of every model version trained on data that held the subject."""
    event_id: str
    """The ``gantry.data.subject.erased`` event ("" for a dry run)."""

    @property
    def dry_run(self) -> bool:
        """Whether this is only what an erasure would do."""
        return not self.erasure_id

    @classmethod
    def from_pb(cls, m: pb.Erasure) -> Erasure:
        """From the protocol message."""
        return cls(
            erasure_id=m.erasure_id,
            subject_ref=m.subject_ref,
            requested_by=m.requested_by,
            requested_ms=m.requested_ms,
            reason=m.reason,
            new_versions=tuple(SubjectVersion.from_pb(v) for v in m.new_versions),
            rows_removed=tuple(m.rows_removed),
            models_to_retrain=tuple(m.models_to_retrain),
            event_id=m.event_id,
        )

    def to_json(self) -> dict[str, Any]:
        """As a JSON object."""
        return {
            "erasure_id": self.erasure_id,
            "subject_ref": self.subject_ref,
            "requested_by": self.requested_by,
            "requested_ms": self.requested_ms,
            "reason": self.reason,
            "new_versions": [v.to_json() for v in self.new_versions],
            "rows_removed": list(self.rows_removed),
            "models_to_retrain": list(self.models_to_retrain),
            "event_id": self.event_id,
        }


@dataclass(frozen=True)
class SubjectFindings:
    """What governance holds about one data subject, and what was searched."""

    subject_ref: str
    versions: tuple[SubjectVersion, ...]
    links: tuple[SubjectLink, ...]
    jobs: tuple[str, ...]
    models: tuple[str, ...]
    """``<model>:<version>``."""
    datasets_searched: tuple[str, ...]
    """Table datasets with pii columns."""
    datasets_not_searchable: tuple[str, ...]
    """Files datasets and tables without pii columns."""
    erasures: tuple[Erasure, ...]
    searched_ms: int

    @property
    def found(self) -> bool:
        """Whether any version holds the subject."""
        return bool(self.versions)

    @classmethod
    def from_pb(cls, m: pb.SubjectFindings) -> SubjectFindings:
        """From the protocol message."""
        return cls(
            subject_ref=m.subject_ref,
            versions=tuple(SubjectVersion.from_pb(v) for v in m.versions),
            links=tuple(SubjectLink.from_pb(link) for link in m.links),
            jobs=tuple(m.jobs),
            models=tuple(m.models),
            datasets_searched=tuple(m.datasets_searched),
            datasets_not_searchable=tuple(m.datasets_not_searchable),
            erasures=tuple(Erasure.from_pb(e) for e in m.erasures),
            searched_ms=m.searched_ms,
        )

    def to_json(self) -> dict[str, Any]:
        """As a JSON object."""
        return {
            "subject_ref": self.subject_ref,
            "versions": [v.to_json() for v in self.versions],
            "links": [link.to_json() for link in self.links],
            "jobs": list(self.jobs),
            "models": list(self.models),
            "datasets_searched": list(self.datasets_searched),
            "datasets_not_searchable": list(self.datasets_not_searchable),
            "erasures": [e.to_json() for e in self.erasures],
            "searched_ms": self.searched_ms,
        }


__all__ = ["Erasure", "SubjectFindings", "SubjectLink", "SubjectVersion"]
