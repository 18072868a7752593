"""Checking a signed compliance report (domain): its signatures, the consistency of its tree
head with the log of the day, and its figures recomputed from the first ``tree_size`` events —
every mismatch explained in words. :mod:`gantry.audit.reports` makes and stores the reports.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gantry.audit.report_figures import compute_figures
from gantry.audit.store import StoredEvent
from gantry.core import GantryError, InvalidInput
from gantry.events import canonical_json
from gantry.security.keys import TrustStore
from gantry.security.merkle import verify_consistency
from gantry.security.treehead import TreeHead

#: Prefix of the signed message: a report signature can never pass for any other signature.
SIGNATURE_DOMAIN = b"gantry.audit.report.v1\n"
_MAX_DIFFS = 20

#: ``events(since_ms, until_ms, below_seq)``: the log's events in a time range, seq < below_seq.
EventSource = Callable[[int, int, int], Iterable[StoredEvent]]
#: ``consistency(first_size)``: (proof, signed head of first_size, latest signed head).
ConsistencySource = Callable[[int], tuple[Sequence[bytes], TreeHead, TreeHead]]


def report_digest(document: dict[str, Any]) -> str:
    """SHA-256 (hex) of the canonical JSON of a report document."""
    return hashlib.sha256(canonical_json(document)).hexdigest()


def signed_message(digest: str) -> bytes:
    """The exact bytes a report signature covers."""
    return SIGNATURE_DOMAIN + digest.encode()


@dataclass(frozen=True)
class ReportVerification:
    """What checking a report against its signature and the log found
    (``VerifyReportResponse``)."""

    ok: bool
    signature_ok: bool
    consistent: bool
    figures_match: bool
    problems: tuple[str, ...]
    digest: str
    tree_head: TreeHead | None = None


class _Malformed(Exception):
    pass


def _field(obj: object, name: str, kind: type, where: str) -> Any:
    value = obj.get(name) if isinstance(obj, dict) else None
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise _Malformed(f"{where}.{name} is missing or not a {kind.__name__}")
    return value


def _head_of(doc: dict[str, Any]) -> TreeHead:
    h = _field(doc, "tree_head", dict, "report")
    try:
        return TreeHead(
            _field(h, "tree_size", int, "tree_head"),
            bytes.fromhex(_field(h, "root_hash", str, "tree_head")),
            _field(h, "timestamp_ms", int, "tree_head"),
            _field(h, "key_id", str, "tree_head"),
            base64.b64decode(_field(h, "signature", str, "tree_head"), validate=True),
        )
    except (ValueError, binascii.Error) as exc:
        raise _Malformed(f"the tree head is malformed: {exc}") from None


def verify_report(
    signed: dict[str, Any],
    *,
    trust: TrustStore,
    current_events: EventSource,
    consistency: ConsistencySource,
) -> ReportVerification:
    """Check a signed report three ways and explain every mismatch in words.

    ``signature_ok``: the report's digest is that of its content and is signed by a key in
    ``trust``, and its tree head carries a valid signature. ``consistent``: the log of today
    extends the tree head the report was read from (a consistency proof from
    ``consistency(tree_size)``, checked here). ``figures_match``: the figures recomputed from
    the first ``tree_size`` events (``current_events``) equal the report's.

    A document that is not a report at all raises :class:`InvalidInput`.
    """
    try:
        doc = _field(signed, "report", dict, "document")
        since_ms = _field(doc, "since_ms", int, "report")
        until_ms = _field(doc, "until_ms", int, "report")
        figures = _field(doc, "figures", dict, "report")
        head = _head_of(doc)
        claimed = _field(signed, "digest", str, "document")
        key_id = _field(signed, "key_id", str, "document")
        signature = base64.b64decode(_field(signed, "signature", str, "document"), validate=True)
    except (_Malformed, binascii.Error, ValueError) as exc:
        raise InvalidInput(
            f"not a signed compliance report: {exc}",
            hint="pass the .json rendering of a report, unchanged",
        ) from None
    problems: list[str] = []
    digest = report_digest(doc)
    signature_ok = _check_signatures(digest, claimed, key_id, signature, head, trust, problems)
    consistent = _check_consistency(head, trust, consistency, problems)
    events = current_events(since_ms, until_ms, head.tree_size)
    recomputed = compute_figures(events, since_ms, until_ms)
    figures_match = recomputed == figures
    if not figures_match:
        problems.extend(_explain_figures(figures, recomputed))
    return ReportVerification(
        ok=signature_ok and consistent and figures_match,
        signature_ok=signature_ok,
        consistent=consistent,
        figures_match=figures_match,
        problems=tuple(problems),
        digest=digest,
        tree_head=head,
    )


def _check_signatures(
    digest: str,
    claimed: str,
    key_id: str,
    signature: bytes,
    head: TreeHead,
    trust: TrustStore,
    problems: list[str],
) -> bool:
    ok = True
    if digest != claimed:
        ok = False
        problems.append(
            f"the report's content hashes to {digest}, not to the digest it carries "
            f"({claimed}): it was altered after it was signed"
        )
    try:
        trust.verify(key_id, signed_message(digest), signature)
    except GantryError as exc:
        ok = False
        problems.append(f"the report signature does not verify: {exc.message}")
    try:
        head.check_signature(trust)
    except GantryError as exc:
        ok = False
        problems.append(exc.message)
    return ok


def _check_consistency(
    head: TreeHead, trust: TrustStore, consistency: ConsistencySource, problems: list[str]
) -> bool:
    try:
        proof, _first, latest = consistency(head.tree_size)
    except GantryError as exc:
        problems.append(
            f"the log has no signed tree head of size {head.tree_size} to prove the report's "
            f"against: {exc.message}"
        )
        return False
    try:
        latest.check_signature(trust)
    except GantryError as exc:
        problems.append(f"the log's latest tree head does not verify: {exc.message}")
        return False
    if not verify_consistency(
        head.tree_size, latest.tree_size, head.root_hash, latest.root_hash, proof
    ):
        problems.append(
            f"the report's tree head (size {head.tree_size}, root "
            f"{head.root_hash.hex()[:16]}...) is not a prefix of the log's latest signed tree "
            f"head (size {latest.tree_size}): the report was not read from this log, or the "
            "log's history was rewritten"
        )
        return False
    return True


def _explain_figures(reported: dict[str, Any], now: dict[str, Any]) -> list[str]:
    out = []
    r_tot, n_tot = reported.get("totals", {}), now.get("totals", {})
    purged = int(n_tot.get("purged_events", 0)) - int(r_tot.get("purged_events", 0))
    if purged > 0:
        out.append(
            f"{purged} events in the period were purged since the report was made (their "
            "retention ended), so the figures read from them cannot be recomputed"
        )
    unread = int(n_tot.get("archived_unread", 0)) - int(r_tot.get("archived_unread", 0))
    if unread > 0:
        out.append(
            f"{unread} events in the period were archived and their bytes were not read back "
            "for this check"
        )
    diffs: list[str] = []
    _diff("figures", reported, now, diffs)
    shown = diffs[:_MAX_DIFFS]
    if len(diffs) > _MAX_DIFFS:
        shown.append(f"... and {len(diffs) - _MAX_DIFFS} more differences")
    out.append("the figures recomputed from the log differ from the report's: " + "; ".join(shown))
    return out


def _label(item: object, index: int) -> str:
    if isinstance(item, dict):
        for key in ("dataset", "anomaly_id", "event_id"):
            if key in item:
                return f"{key}={item[key]}"
        if "principal" in item and "resource" in item:
            return f"{item['principal']} {item.get('action', '')} {item['resource']}"
    return str(index)


def _short(value: object) -> str:
    text = canonical_json(value).decode() if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _diff(path: str, a: object, b: object, out: list[str]) -> None:
    """Where ``a`` (the report) and ``b`` (recomputed) differ, as 'path: report X, log Y'."""
    if len(out) > _MAX_DIFFS * 5 or a == b:
        return
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key not in b:
                out.append(f"{path}.{key} is in the report but not in the log")
            elif key not in a:
                out.append(f"{path}.{key} is in the log but not in the report")
            else:
                _diff(f"{path}.{key}", a[key], b[key], out)
        return
    if isinstance(a, list) and isinstance(b, list):
        la = {_label(x, i): x for i, x in enumerate(a)}
        lb = {_label(x, i): x for i, x in enumerate(b)}
        for key in la.keys() - lb.keys():
            out.append(f"{path}[{key}] is in the report but not in the log")
        for key in lb.keys() - la.keys():
            out.append(f"{path}[{key}] is in the log but not in the report")
        for key in sorted(la.keys() & lb.keys()):
            _diff(f"{path}[{key}]", la[key], lb[key], out)
        if la.keys() == lb.keys() and list(la) != list(lb) and all(la[k] == lb[k] for k in la):
            out.append(f"{path} lists the same entries in another order")
        return
    out.append(f"{path}: report {_short(a)}, log {_short(b)}")


__all__ = [
    "SIGNATURE_DOMAIN",
    "ConsistencySource",
    "EventSource",
    "ReportVerification",
    "report_digest",
    "signed_message",
    "verify_report",
]
