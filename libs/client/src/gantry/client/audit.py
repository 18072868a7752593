"""The audit SDK: compliance queries, exports, access reports, proofs checked locally."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import orjson

from gantry.client._audit_compliance import ComplianceCalls
from gantry.client._audit_tokens import TokenCalls
from gantry.client.errors import from_rpc_error
from gantry.core import IntegrityError, TlsSettings
from gantry.protos.v1 import audit_pb2 as pb
from gantry.protos.v1 import audit_pb2_grpc as pb_grpc
from gantry.security.keys import TrustStore
from gantry.security.merkle import leaf_hash
from gantry.security.tls import secure_or_insecure_channel
from gantry.security.treehead import TreeHead, check_consistency, check_inclusion


@dataclass(frozen=True)
class Filter:
    """What to select: every field is optional; they combine with AND."""

    actors: Sequence[str] = ()
    types: Sequence[str] = ()
    resource: str = ""
    action: str = ""
    decision: str = ""
    correlation_id: str = ""
    since_ms: int = 0
    until_ms: int = 0

    def to_pb(self) -> pb.EventFilter:
        """As the protocol message."""
        return pb.EventFilter(
            actors=list(self.actors),
            types=list(self.types),
            resource=self.resource,
            action=self.action,
            decision=self.decision,
            correlation_id=self.correlation_id,
            since_ms=self.since_ms,
            until_ms=self.until_ms,
        )


def head_from_pb(m: pb.SignedTreeHead) -> TreeHead:
    """A tree head from its message."""
    return TreeHead(m.tree_size, m.root_hash, m.timestamp_ms, m.key_id, m.signature)


class AuditClient(ComplianceCalls, TokenCalls):
    """A synchronous client of the audit service, authenticated with a bearer token; over TLS
    when ``tls`` (``ClientSettings().tls``, from ``GANTRY_TLS__*``) is enabled."""

    def __init__(
        self, address: str, token: str, *, timeout_s: float = 30.0, tls: TlsSettings | None = None
    ) -> None:
        self.address = address
        self._channel = secure_or_insecure_channel(address, tls)
        self._stub = pb_grpc.AuditServiceStub(self._channel)
        self._metadata = (("authorization", f"Bearer {token}"),)
        self._timeout = timeout_s

    def _call(self, method: str, request: Any) -> Any:
        try:
            return getattr(self._stub, method)(
                request, metadata=self._metadata, timeout=self._timeout
            )
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, service="audit", address=self.address) from None

    def _stream(self, method: str, request: Any) -> Iterator[Any]:
        try:
            yield from getattr(self._stub, method)(
                request, metadata=self._metadata, timeout=max(self._timeout, 300)
            )
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, service="audit", address=self.address) from None

    def query(self, flt: Filter | None = None, *, page_size: int = 500) -> Iterator[pb.AuditRecord]:
        """Every matching record, oldest first, fetched page by page."""
        token = ""
        while True:
            resp = self._call(
                "Query",
                pb.QueryRequest(
                    filter=(flt or Filter()).to_pb(), page_size=page_size, page_token=token
                ),
            )
            yield from resp.records
            token = resp.next_page_token
            if not token:
                return

    def page(
        self, flt: Filter | None = None, *, page_size: int = 100, page_token: str = ""
    ) -> pb.QueryResponse:
        """One page of records and the token of the next."""
        resp: pb.QueryResponse = self._call(
            "Query",
            pb.QueryRequest(
                filter=(flt or Filter()).to_pb(), page_size=page_size, page_token=page_token
            ),
        )
        return resp

    def export(self, flt: Filter | None = None, *, fmt: str = "jsonl") -> Iterator[bytes]:
        """The matching records as JSONL or CSV, in chunks."""
        if fmt not in ("jsonl", "csv"):
            raise ValueError("fmt must be 'jsonl' or 'csv'")
        request = pb.ExportRequest(
            filter=(flt or Filter()).to_pb(),
            format=pb.EXPORT_FORMAT_CSV if fmt == "csv" else pb.EXPORT_FORMAT_JSONL,
        )
        try:
            for chunk in self._stub.Export(request, metadata=self._metadata, timeout=600):
                yield chunk.data
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, service="audit", address=self.address) from None

    def access_report(
        self, resource: str, since_ms: int = 0, until_ms: int = 0
    ) -> pb.AccessReportResponse:
        """Who accessed ``resource`` in the window, how often, allowed or denied."""
        report: pb.AccessReportResponse = self._call(
            "AccessReport",
            pb.AccessReportRequest(resource=resource, since_ms=since_ms, until_ms=until_ms),
        )
        return report

    def checkpoint(self, tree_size: int = 0) -> TreeHead:
        """A signed tree head (the latest by default)."""
        return head_from_pb(
            self._call("GetCheckpoint", pb.GetCheckpointRequest(tree_size=tree_size))
        )

    def inclusion_proof(
        self, *, index: int | None = None, event_id: str | None = None
    ) -> pb.InclusionProofResponse:
        """The server's inclusion proof of one leaf (by index or event id), as sent: NOT checked
        (:meth:`prove_inclusion` checks it; a caller showing the audit path checks it itself)."""
        req = (
            pb.InclusionProofRequest(index=index)
            if index is not None
            else pb.InclusionProofRequest(event_id=event_id or "")
        )
        resp: pb.InclusionProofResponse = self._call("GetInclusionProof", req)
        return resp

    def prove_inclusion(
        self, trust: TrustStore, *, index: int | None = None, event_id: str | None = None
    ) -> tuple[int, bytes, TreeHead]:
        """Fetch an inclusion proof and check it locally against the signed tree head.

        Returns (index, event bytes, tree head); raises :class:`IntegrityError` if the proof,
        the event bytes or the head's signature do not check out — no trust in the server.
        """
        resp = self.inclusion_proof(index=index, event_id=event_id)
        head = head_from_pb(resp.tree_head)
        if index is not None and resp.index != index:
            raise IntegrityError(f"asked for index {index}, the server proved {resp.index}")
        if event_id is not None:
            proven = orjson.loads(resp.event_json).get("id")
            if proven != event_id:
                raise IntegrityError(f"asked for event {event_id}, the server proved {proven}")
        if leaf_hash(resp.event_json) != resp.leaf_hash:
            raise IntegrityError(f"event bytes of index {resp.index} do not match their leaf hash")
        check_inclusion(
            head, trust, leaf_hash=resp.leaf_hash, index=resp.index, proof=list(resp.path)
        )
        return resp.index, resp.event_json, head

    def prove_consistency(
        self, trust: TrustStore, first_size: int, second_size: int = 0
    ) -> tuple[TreeHead, TreeHead]:
        """Fetch and check locally that the log only grew between two signed heads."""
        resp = self._call(
            "GetConsistencyProof",
            pb.ConsistencyProofRequest(first_size=first_size, second_size=second_size),
        )
        first, second = head_from_pb(resp.first), head_from_pb(resp.second)
        if first.tree_size != first_size or (second_size and second.tree_size != second_size):
            raise IntegrityError(
                f"asked for sizes {first_size}..{second_size or 'latest'}, the server answered "
                f"{first.tree_size}..{second.tree_size}"
            )
        check_consistency(first, second, trust, list(resp.path))
        return first, second

    def verify(self) -> pb.VerifyResponse:
        """Ask the service to recompute the whole log from its stored events."""
        result: pb.VerifyResponse = self._call("Verify", pb.VerifyRequest())
        return result

    def anomalies(
        self,
        *,
        state: str = "",
        principal: str = "",
        kind: str = "",
        since_ms: int = 0,
        until_ms: int = 0,
        limit: int = 100,
    ) -> list[pb.Anomaly]:
        """Access-behaviour anomalies, newest first (auditors; the query is audited)."""
        request = pb.ListAnomaliesRequest(
            state=state,
            principal=principal,
            kind=kind,
            since_ms=since_ms,
            until_ms=until_ms,
            limit=limit,
        )
        return list(self._call("ListAnomalies", request).anomalies)

    def resolve_anomaly(self, anomaly_id: str, state: str, note: str = "") -> pb.Anomaly:
        """Acknowledge or dismiss (with a note saying why) an anomaly; audited."""
        request = pb.ResolveAnomalyRequest(anomaly_id=anomaly_id, state=state, note=note)
        result: pb.Anomaly = self._call("ResolveAnomaly", request)
        return result

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()

    def __enter__(self) -> AuditClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["AuditClient", "Filter", "head_from_pb"]
