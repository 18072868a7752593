"""The generated code is importable, matches the .proto files, and carries the audit API."""

from __future__ import annotations

from pathlib import Path

from gantry.protos import _generate
from gantry.protos.v1 import audit_pb2, audit_pb2_grpc

ROOT = Path(__file__).resolve().parents[3]


def test_generated_code_is_up_to_date() -> None:
    assert _generate.main(["--check", str(ROOT / "protos"), str(ROOT / "libs/protos/src")]) == 0


def test_audit_service_has_every_method() -> None:
    service = audit_pb2.DESCRIPTOR.services_by_name["AuditService"]
    assert service.full_name == "gantry.audit.v1.AuditService"
    assert {m.name for m in service.methods} == {
        "Query", "Export", "AccessReport", "GetInclusionProof", "GetConsistencyProof",
        "GetCheckpoint", "Verify", "ListAnomalies", "ResolveAnomaly", "SubjectReport",
        "GenerateReport", "ListReports", "DownloadReport", "VerifyReport", "SetRetention",
        "ListRetention", "PlaceHold", "ReleaseHold", "ListHolds", "Archive", "ListSegments",
        "VerifySegment", "Purge", "RevokeToken", "ListRevokedTokens",
    }  # fmt: skip
    assert hasattr(audit_pb2_grpc, "AuditServiceStub")


def test_a_changed_proto_is_detected(tmp_path: Path) -> None:
    protos = tmp_path / "protos" / "gantry" / "protos" / "v1"
    protos.mkdir(parents=True)
    source = (ROOT / "protos/gantry/protos/v1/audit.proto").read_text()
    (protos / "audit.proto").write_text(
        source.replace("int32 page_size = 2;", "int64 page_size = 2;")
    )
    assert _generate.main(["--check", str(tmp_path / "protos"), str(ROOT / "libs/protos/src")]) == 1
