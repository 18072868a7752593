"""Compliance-report figures (domain): what the audit log says happened in a period, counted.

:func:`compute_figures` is pure and deterministic: the same events give the same JSON-able
dict (lists in a fixed order; canonical JSON sorts the keys), so a verifier that recomputes
the figures from the same stretch of the log gets byte-identical JSON. Events whose bytes are
gone (purged after their retention) are only counted, under ``totals.purged_events``.

Sections (each documented in ``docs/compliance.md#compliance-reports``): ``totals``,
``datasets`` (reads and authorisation decisions per dataset), ``denials``, ``anomalies``,
``key_rotations``, ``deployments``, ``erasures``, ``holds``, ``retention``, ``purges``,
``archives``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from gantry.audit.store import StoredEvent

#: Bumped when the figures change shape; a verifier compares like with like.
FIGURES_VERSION = 1
#: Denials listed one by one (the rest are in the totals).
TOP_DENIALS = 50

DATA_ACCESSED = "gantry.data.accessed"
AUTHZ_DECISION = "gantry.authz.decision"
ANOMALY = "gantry.audit.anomaly"
KEYS_ROTATED = "gantry.data.keys.rotated"
DEPLOYMENT_CHANGED = "gantry.serving.deployment.changed"
VERSION_STATE = "gantry.serving.version.state"
SUBJECT_ERASED = "gantry.data.subject.erased"
HOLD_CHANGED = "gantry.audit.hold.changed"
RETENTION_CHANGED = "gantry.audit.retention.changed"
PURGED = "gantry.audit.purged"
ARCHIVED = "gantry.audit.archived"


def _int(value: object) -> int:
    """An integer field of event data; anything else counts as 0."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value == value and abs(value) < 2**62:
        return int(value)
    return 0


def _str(value: object) -> str:
    return "" if value is None else str(value)


def _strs(value: object) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else []


@dataclass
class _Dataset:
    reads_allowed: int = 0
    reads_denied: int = 0
    rows_read: int = 0
    raw_reads: int = 0
    deidentified_reads: int = 0
    authz_allowed: int = 0
    authz_denied: int = 0
    readers: set[str] = field(default_factory=set)

    def as_dict(self, name: str) -> dict[str, Any]:
        return {
            "dataset": name,
            "reads_allowed": self.reads_allowed,
            "reads_denied": self.reads_denied,
            "rows_read": self.rows_read,
            "raw_reads": self.raw_reads,
            "deidentified_reads": self.deidentified_reads,
            "principals": len(self.readers),
            "readers": sorted(self.readers),
            "authz_allowed": self.authz_allowed,
            "authz_denied": self.authz_denied,
        }


@dataclass
class _Anomaly:
    seq: int
    first_ms: int
    updated_ms: int
    data: Mapping[str, Any]
    events: int = 1


class _Tally:
    """Accumulates the figures of one period, event by event."""

    def __init__(self) -> None:
        self.by_type: Counter[str] = Counter()
        self.principals: set[str] = set()
        self.purged = 0
        self.archived_unread = 0
        self.malformed = 0
        self.datasets: dict[str, _Dataset] = {}
        self.denials: Counter[tuple[str, str, str]] = Counter()
        self.anomalies: dict[str, _Anomaly] = {}
        self.lists: dict[str, list[dict[str, Any]]] = {
            name: []
            for name in (
                "key_rotations",
                "deployments",
                "erasures",
                "holds",
                "retention",
                "purges",
                "archives",
            )
        }

    def add(self, ev: StoredEvent) -> None:
        if ev.canonical is None:
            if ev.state == "archived":
                self.archived_unread += 1
            else:
                self.purged += 1
            return
        handler = _HANDLERS.get(ev.type)
        data = None
        if handler is not None:  # only the types a section reads are parsed (months are big)
            try:
                doc = orjson.loads(ev.canonical)
            except orjson.JSONDecodeError:
                doc = None
            data = doc.get("data") if isinstance(doc, dict) else None
            if not isinstance(data, dict):
                self.malformed += 1
                return
        self.by_type[ev.type] += 1
        self.principals.add(ev.actor)
        if ev.decision == "deny" and ev.type in (AUTHZ_DECISION, DATA_ACCESSED):
            self.denials[(ev.actor, ev.action, ev.resource)] += 1
        if handler is not None and data is not None:
            handler(self, ev, data)

    def dataset(self, name: str) -> _Dataset:
        entry = self.datasets.get(name)
        if entry is None:
            entry = self.datasets[name] = _Dataset()
        return entry

    def figures(self) -> dict[str, Any]:
        top = sorted(self.denials.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_DENIALS]
        items = sorted(
            (_anomaly_item(aid, a) for aid, a in self.anomalies.items()),
            key=lambda item: (item["time_ms"], item["anomaly_id"]),
        )
        by_kind: dict[str, Counter[str]] = {}
        for item in items:
            by_kind.setdefault(item["kind"], Counter())[item["state"]] += 1
        return {
            "version": FIGURES_VERSION,
            "totals": {
                "events": sum(self.by_type.values()),
                "by_type": dict(sorted(self.by_type.items())),
                "principals": len(self.principals),
                "purged_events": self.purged,
                "archived_unread": self.archived_unread,
                "malformed_events": self.malformed,
            },
            "datasets": [self.datasets[n].as_dict(n) for n in sorted(self.datasets)],
            "denials": {
                "total": sum(self.denials.values()),
                "distinct": len(self.denials),
                "top": [
                    {"principal": p, "action": a, "resource": r, "count": n} for (p, a, r), n in top
                ],
            },
            "anomalies": {
                "by_kind": {k: dict(sorted(c.items())) for k, c in sorted(by_kind.items())},
                "by_state": dict(sorted(Counter(i["state"] for i in items).items())),
                "items": items,
            },
            **{name: sorted(rows, key=_seq_key) for name, rows in self.lists.items()},
        }


def _seq_key(row: Mapping[str, Any]) -> tuple[int, int]:
    return (int(row["time_ms"]), int(row["seq"]))


def _anomaly_item(anomaly_id: str, a: _Anomaly) -> dict[str, Any]:
    d = a.data
    severity = d.get("severity", 0)
    return {
        "anomaly_id": anomaly_id,
        "kind": _str(d.get("kind")),
        "principal": _str(d.get("principal")),
        "state": _str(d.get("state")) or "raised",
        "severity": round(float(severity), 3) if isinstance(severity, int | float) else 0.0,
        "reason": _str(d.get("reason")),
        "by": _str(d.get("by")),
        "note": _str(d.get("note")),
        "time_ms": a.first_ms,
        "updated_ms": a.updated_ms,
        "events": a.events,
    }


def _base(ev: StoredEvent) -> dict[str, Any]:
    return {"time_ms": ev.time_ms, "seq": ev.seq, "event_id": ev.event_id, "actor": ev.actor}


def _on_accessed(t: _Tally, ev: StoredEvent, data: dict[str, Any]) -> None:
    ds = t.dataset(_str(data.get("dataset")))
    if ev.decision == "deny":
        ds.reads_denied += 1
        return
    ds.reads_allowed += 1
    ds.rows_read += _int(data.get("rows"))
    ds.readers.add(ev.actor)
    if data.get("view") == "raw":
        ds.raw_reads += 1
    else:
        ds.deidentified_reads += 1


def _on_authz(t: _Tally, ev: StoredEvent, data: dict[str, Any]) -> None:
    if data.get("resource_kind") != "dataset":
        return
    ds = t.dataset(_str(data.get("resource_name")) or "*")
    if ev.decision == "deny":
        ds.authz_denied += 1
    else:
        ds.authz_allowed += 1


def _on_anomaly(t: _Tally, ev: StoredEvent, data: dict[str, Any]) -> None:
    aid = _str(data.get("anomaly_id"))
    known = t.anomalies.get(aid)
    if known is None:
        t.anomalies[aid] = _Anomaly(ev.seq, ev.time_ms, ev.time_ms, data)
        return
    known.events += 1
    known.first_ms = min(known.first_ms, ev.time_ms)
    if ev.seq > known.seq:  # the log's order decides which state is the latest
        known.seq, known.updated_ms, known.data = ev.seq, ev.time_ms, data


def _on_keys_rotated(t: _Tally, ev: StoredEvent, data: dict[str, Any]) -> None:
    t.lists["key_rotations"].append({**_base(ev), "data": data})


def _on_deployment(t: _Tally, ev: StoredEvent, data: dict[str, Any]) -> None:
    raw = data.get("versions")
    versions = [
        {
            "version": _int(v.get("version")),
            "weight": _int(v.get("weight")),
            "role": _str(v.get("role")),
        }
        for v in (raw if isinstance(raw, list) else [])
        if isinstance(v, dict)
    ]
    t.lists["deployments"].append(
        {
            **_base(ev),
            "deployment": _str(data.get("deployment")),
            "model": _str(data.get("model")),
            "action": _str(data.get("action")),
            "versions": versions,
            "detail": _str(data.get("detail")),
        }
    )


def _on_version_state(t: _Tally, ev: StoredEvent, data: dict[str, Any]) -> None:
    t.lists["deployments"].append(
        {
            **_base(ev),
            "deployment": _str(data.get("deployment")),
            "model": _str(data.get("model")),
            "action": f"version {_str(data.get('state'))}",
            "versions": [{"version": _int(data.get("version")), "weight": 0, "role": ""}],
            "detail": _str(data.get("reason")),
        }
    )


def _on_erased(t: _Tally, ev: StoredEvent, data: dict[str, Any]) -> None:
    raw = data.get("datasets")
    datasets = [d for d in (raw if isinstance(raw, list) else []) if isinstance(d, dict)]
    t.lists["erasures"].append(
        {
            **_base(ev),
            "erasure_id": _str(data.get("erasure_id")),
            "subject_ref": _str(data.get("subject_ref")),
            "requested_by": _str(data.get("requested_by")),
            "reason": _str(data.get("reason")),
            "datasets": sorted({_str(d.get("dataset")) for d in datasets}),
            "rows_removed": sum(_int(d.get("rows_removed")) for d in datasets),
            "models_to_retrain": sorted(_strs(data.get("models_to_retrain"))),
        }
    )


def _on_hold(t: _Tally, ev: StoredEvent, data: dict[str, Any]) -> None:
    t.lists["holds"].append(
        {
            **_base(ev),
            "hold_id": _str(data.get("hold_id")),
            "name": _str(data.get("name")),
            "state": _str(data.get("state")),
            "by": _str(data.get("by")),
            "reason": _str(data.get("reason")),
            "principals": sorted(_strs(data.get("principals"))),
            "datasets": sorted(_strs(data.get("datasets"))),
        }
    )


def _on_retention(t: _Tally, ev: StoredEvent, data: dict[str, Any]) -> None:
    t.lists["retention"].append(
        {
            **_base(ev),
            "event_type": _str(data.get("event_type")),
            "keep_days": _int(data.get("keep_days")),
            "by": _str(data.get("by")),
        }
    )


def _on_purged(t: _Tally, ev: StoredEvent, data: dict[str, Any]) -> None:
    by_type = data.get("by_type")
    t.lists["purges"].append(
        {
            **_base(ev),
            "purge_id": _str(data.get("purge_id")),
            "by": _str(data.get("by")),
            "events": _int(data.get("events")),
            "held_back": _int(data.get("held_back")),
            "by_type": (
                {str(k): _int(v) for k, v in sorted(by_type.items())}
                if isinstance(by_type, dict)
                else {}
            ),
        }
    )


def _on_archived(t: _Tally, ev: StoredEvent, data: dict[str, Any]) -> None:
    t.lists["archives"].append(
        {
            **_base(ev),
            "first_seq": _int(data.get("first_seq")),
            "end_seq": _int(data.get("end_seq")),
            "events": _int(data.get("events")),
            "object": _str(data.get("object")),
            "tree_size": _int(data.get("tree_size")),
        }
    )


_HANDLERS = {
    DATA_ACCESSED: _on_accessed,
    AUTHZ_DECISION: _on_authz,
    ANOMALY: _on_anomaly,
    KEYS_ROTATED: _on_keys_rotated,
    DEPLOYMENT_CHANGED: _on_deployment,
    VERSION_STATE: _on_version_state,
    SUBJECT_ERASED: _on_erased,
    HOLD_CHANGED: _on_hold,
    RETENTION_CHANGED: _on_retention,
    PURGED: _on_purged,
    ARCHIVED: _on_archived,
}


def compute_figures(events: Iterable[StoredEvent], since_ms: int, until_ms: int) -> dict[str, Any]:
    """The figures of the events with ``since_ms <= time < until_ms`` among ``events``.

    Deterministic and JSON-able. Events outside the range are ignored; events without bytes
    are counted (``purged_events``, or ``archived_unread`` when the caller did not fetch an
    archived event's bytes) and contribute nothing else.
    """
    tally = _Tally()
    for ev in events:
        if since_ms <= ev.time_ms < until_ms:
            tally.add(ev)
    return tally.figures()


def summary_of(figures: Mapping[str, Any]) -> dict[str, int]:
    """The headline figures of a report (``ComplianceReport.summary_json``)."""
    datasets = figures.get("datasets", [])
    anomalies = figures.get("anomalies", {})
    states = anomalies.get("by_state", {})
    totals = figures.get("totals", {})
    return {
        "events": int(totals.get("events", 0)),
        "purged_events": int(totals.get("purged_events", 0)),
        "datasets_read": sum(1 for d in datasets if d["reads_allowed"]),
        "reads_allowed": sum(int(d["reads_allowed"]) for d in datasets),
        "reads_denied": sum(int(d["reads_denied"]) for d in datasets),
        "rows_read": sum(int(d["rows_read"]) for d in datasets),
        "raw_reads": sum(int(d["raw_reads"]) for d in datasets),
        "denials": int(figures.get("denials", {}).get("total", 0)),
        "anomalies": len(anomalies.get("items", [])),
        "anomalies_open": int(states.get("raised", 0)),
        "key_rotations": len(figures.get("key_rotations", [])),
        "deployment_changes": len(figures.get("deployments", [])),
        "erasures": len(figures.get("erasures", [])),
        "hold_changes": len(figures.get("holds", [])),
        "retention_changes": len(figures.get("retention", [])),
        "purges": len(figures.get("purges", [])),
        "archives": len(figures.get("archives", [])),
    }


__all__ = ["FIGURES_VERSION", "TOP_DENIALS", "compute_figures", "summary_of"]
