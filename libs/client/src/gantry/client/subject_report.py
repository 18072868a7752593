"""Checking a signed data-subject report offline, with nothing but the audit service's public key.

A report (``gantry audit subject report``) lists the dataset versions holding a person's
identifier, the jobs that read them and the models those jobs produced, each with the audit
event that recorded it, the event's bytes and its inclusion proof. :func:`check_subject_report`
checks the report's signature, the signed tree head, every inclusion proof, and that each
proven event says what the finding claims (the right dataset version, job or model).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gantry.core import IntegrityError
from gantry.security.documents import check_document
from gantry.security.keys import TrustStore
from gantry.security.merkle import leaf_hash
from gantry.security.treehead import TreeHead, check_inclusion

KIND = "gantry.subject-report"


@dataclass
class SubjectReportCheck:
    """What checking a report found."""

    digest: str = ""
    tree_size: int = 0
    proven: int = 0
    unproven: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when the signature and every proof held and every claim matched its event."""
        return not self.problems


def _head(doc: Mapping[str, Any]) -> TreeHead:
    h = doc["tree_head"]
    return TreeHead(
        int(h["tree_size"]),
        bytes.fromhex(h["root_hash"]),
        int(h["timestamp_ms"]),
        str(h["key_id"]),
        base64.b64decode(h["signature"]),
    )


def _claims(findings: Mapping[str, Any]) -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """event id -> what the findings claim it records."""
    claims: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for v in findings.get("versions", []):
        if v.get("event_id"):
            claims.setdefault(v["event_id"], []).append(("version", v))
    for link in findings.get("links", []):
        if link.get("event_id"):
            claims.setdefault(link["event_id"], []).append(("link", link))
    for e in findings.get("erasures", []):
        if e.get("event_id"):
            claims.setdefault(e["event_id"], []).append(("erasure", e))
    return claims


def _node_parts(node_id: str) -> tuple[str, str]:
    name, _, version = node_id.replace(":", "@", 1).partition("@")
    return name, version


def _mismatch(what: str, claim: Mapping[str, Any], event: Mapping[str, Any]) -> str | None:
    """Why ``event`` does not back ``claim``, or None when it does."""
    data = event.get("data") or {}
    kind = event.get("type", "")
    if what == "version":
        ok = (
            kind == "gantry.data.version.committed"
            and data.get("dataset") == claim["dataset"]
            and data.get("version") == claim["version"]
        )
        return (
            None
            if ok
            else f"does not record the commit of {claim['dataset']}@{claim['version'][:12]}"
        )
    if what == "erasure":
        ok = kind == "gantry.data.subject.erased" and data.get("erasure_id") == claim["erasure_id"]
        return None if ok else f"does not record erasure {claim['erasure_id']}"
    source, target = claim["from_id"], claim["to_id"]
    if claim["to_kind"] == "job":
        dataset, version = _node_parts(source)
        ok = (
            kind == "gantry.data.accessed"
            and data.get("job_id") == target
            and data.get("dataset") == dataset
            and str(data.get("version", "")) == version
        )
        return None if ok else f"does not record job {target} reading {dataset}@{version[:12]}"
    name, number = _node_parts(target)
    ok = kind == "gantry.model.registered" and data.get("name") == name
    ok = ok and str(data.get("version")) == number
    if claim["from_kind"] == "job":
        ok = ok and data.get("job_id") == source
    else:
        dataset, version = _node_parts(source)
        used = {(t.get("dataset"), t.get("version")) for t in data.get("trained_on", [])}
        ok = ok and (dataset, version) in used
    return None if ok else f"does not record {source} producing model {target}"


def check_subject_report(doc: Mapping[str, Any], trust: TrustStore) -> SubjectReportCheck:
    """Check a report; problems are listed in words (an altered report fails at the signature)."""
    result = SubjectReportCheck()
    try:
        result.digest = check_document(doc, trust, kind=KIND)
        head = _head(doc)
        head.check_signature(trust)
    except (IntegrityError, KeyError, ValueError, binascii.Error) as exc:
        result.problems.append(str(exc))
        return result
    result.tree_size = head.tree_size
    result.unproven = sorted(doc.get("unproven", {}))
    claims = _claims(doc.get("findings", {}))
    proofs: Mapping[str, Any] = doc.get("proofs", {})
    for event_id, proof in proofs.items():
        try:
            raw = base64.b64decode(proof["event"])
            leaf = bytes.fromhex(proof["leaf_hash"])
            if leaf_hash(raw) != leaf:
                raise IntegrityError("its bytes do not match their leaf hash")
            path = [bytes.fromhex(p) for p in proof["path"]]
            check_inclusion(head, trust, leaf_hash=leaf, index=int(proof["index"]), proof=path)
            event = json.loads(raw)
        except (IntegrityError, KeyError, ValueError, binascii.Error) as exc:
            result.problems.append(f"event {event_id}: {exc}")
            continue
        if event.get("id") != event_id:
            result.problems.append(f"event {event_id}: the proven event is {event.get('id')}")
            continue
        for what, claim in claims.get(event_id, []):
            why = _mismatch(what, claim, event)
            if why:
                result.problems.append(f"event {event_id} {why}")
        result.proven += 1
    for event_id in claims:
        if event_id not in proofs and event_id not in result.unproven:
            result.problems.append(f"event {event_id} is cited but neither proven nor explained")
    return result


__all__ = ["KIND", "SubjectReportCheck", "check_subject_report"]
