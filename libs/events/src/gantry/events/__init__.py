"""gantry.events: the event envelope, the catalog and the NATS JetStream bus."""

from gantry.events.background import BackgroundPublisher
from gantry.events.bus import Bus
from gantry.events.catalog import (
    AuditCheckpoint,
    AuditQueried,
    AuthzDecision,
    DataAccessed,
    EventData,
    EventSpec,
    catalog,
    lookup,
    register,
    validate_event,
)
from gantry.events.consumer import (
    DEAD_REASON_HEADER,
    BatchHandler,
    ConsumerRunner,
    ConsumerSpec,
    Delivery,
    require_source,
)
from gantry.events.emitter import Emitter
from gantry.events.envelope import EventEnvelope, canonical_json
from gantry.events.errors import (
    EventTooLarge,
    HandlerError,
    PermanentError,
    TemporaryError,
    is_temporary,
)
from gantry.events.inbox import Inbox, inbox_table
from gantry.events.outbox import Outbox, OutboxRelay, outbox_table
from gantry.events.publisher import DEFAULT_MAX_EVENT_BYTES, Publisher
from gantry.events.signature_pool import SignaturePool
from gantry.events.signing import SIGNATURE_HEADER, EventSigner, EventVerifier
from gantry.events.streams import (
    AUDITED_STREAMS,
    DEAD_LETTER_PREFIX,
    STREAMS,
    StreamDef,
    stream_for_type,
)

__all__ = [
    "AUDITED_STREAMS",
    "DEAD_LETTER_PREFIX",
    "DEAD_REASON_HEADER",
    "DEFAULT_MAX_EVENT_BYTES",
    "SIGNATURE_HEADER",
    "STREAMS",
    "AuditCheckpoint",
    "AuditQueried",
    "AuthzDecision",
    "BackgroundPublisher",
    "BatchHandler",
    "Bus",
    "ConsumerRunner",
    "ConsumerSpec",
    "DataAccessed",
    "Delivery",
    "Emitter",
    "EventData",
    "EventEnvelope",
    "EventSigner",
    "EventSpec",
    "EventTooLarge",
    "EventVerifier",
    "HandlerError",
    "Inbox",
    "Outbox",
    "OutboxRelay",
    "PermanentError",
    "Publisher",
    "SignaturePool",
    "StreamDef",
    "TemporaryError",
    "canonical_json",
    "catalog",
    "inbox_table",
    "is_temporary",
    "lookup",
    "outbox_table",
    "register",
    "require_source",
    "stream_for_type",
    "validate_event",
]
