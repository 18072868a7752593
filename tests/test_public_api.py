"""Pins the public surface of each library so it cannot drift by accident.

Changing a library's ``__all__`` is a deliberate act: update the list here in the same commit.
"""

from __future__ import annotations

import importlib

import pytest

PUBLIC = {
    "gantry.core": [
        "AlreadyExists", "Clock", "CommonSettings", "ConfigError", "Conflict", "GantryError",
        "IntegrityError", "InvalidInput", "ManualClock", "NatsSettings", "NotFound",
        "PermissionDenied", "SystemClock", "TlsSettings", "Unauthenticated", "Unavailable",
        "configure_logging", "get_logger", "is_uuid", "load_settings", "new_id", "utc",
    ],
    "gantry.events": [
        "AUDITED_STREAMS", "AuditCheckpoint", "AuditQueried", "AuthzDecision",
        "BackgroundPublisher", "BatchHandler", "Bus", "ConsumerRunner", "ConsumerSpec",
        "DEAD_LETTER_PREFIX", "DEAD_REASON_HEADER", "DEFAULT_MAX_EVENT_BYTES", "DataAccessed",
        "Delivery", "Emitter", "EventData", "EventEnvelope", "EventSigner", "EventSpec",
        "EventTooLarge", "EventVerifier", "HandlerError", "Inbox", "Outbox", "OutboxRelay",
        "PermanentError", "Publisher", "SIGNATURE_HEADER", "STREAMS", "SignaturePool", "StreamDef",
        "TemporaryError", "canonical_json", "catalog", "inbox_table", "is_temporary", "lookup",
        "outbox_table", "register", "require_source", "stream_for_type", "validate_event",
    ],
    "gantry.security": [
        "ANONYMOUS", "AuthInterceptor", "Authorizer", "Decision", "DecisionSink",
        "DirectoryTrustStore", "EventDecisionSink", "Keyring", "MAX_TTL", "MemoryDecisionSink",
        "MethodRule", "PUBLIC_METHOD_PREFIXES", "Policy", "Principal", "PrincipalKind", "Rule",
        "SigningKey", "TokenIssuer", "TokenVerifier", "TreeHead", "TrustStore",
        "check_consistency", "check_inclusion", "current_principal", "default_policy",
        "key_fingerprint", "load_or_create_secret", "load_or_create_signing_key", "parse_ttl",
        "write_public_key",
    ],
}  # fmt: skip


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_public_names_are_pinned(module: str) -> None:
    mod = importlib.import_module(module)
    assert sorted(mod.__all__) == sorted(PUBLIC[module])
    for name in mod.__all__:
        assert hasattr(mod, name), f"{module}.{name} is exported but missing"
