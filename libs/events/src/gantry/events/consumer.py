"""Durable pull consumers: explicit ack, bounded redelivery with backoff, dead-lettering.

The runner fetches a batch, checks every message (size, envelope, catalog, signature) and
dead-letters the bad ones with the reason, hands the good ones to the handler in one call, and
acks them only after the handler returned. When a batch fails, its events are retried one by
one so a single poisoned event cannot hold the others back.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import nats.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api
from nats.js.errors import APIError, FetchTimeoutError, ServiceUnavailableError

from gantry.core import GantryError, InvalidInput, get_logger
from gantry.events.bus import Bus
from gantry.events.catalog import validate_event
from gantry.events.envelope import EventEnvelope
from gantry.events.errors import EventTooLarge, PermanentError, TemporaryError, is_temporary
from gantry.events.publisher import DEFAULT_MAX_EVENT_BYTES, Publisher
from gantry.events.signature_pool import SignaturePool
from gantry.events.signing import (
    SIGNATURE_HEADER,
    EventVerifier,
    check_signature,
    parse_signature_header,
)
from gantry.events.streams import DEAD_LETTER_PREFIX

_log = get_logger("gantry.events.consumer")

DEAD_REASON_HEADER = "Gantry-Dead-Reason"

#: Events whose source starts with this come from platform services, and must be signed by
#: a platform service key (key ids starting with PLATFORM_KID_PREFIX).
PLATFORM_SOURCE_PREFIX = "gantry/"
PLATFORM_KID_PREFIX = "svc-"


@dataclass(frozen=True)
class Delivery:
    """One checked event as delivered by JetStream."""

    event: EventEnvelope
    canonical: bytes
    msg: Msg
    signer: str | None = None

    @property
    def stream(self) -> str:
        """The stream it came from."""
        return str(self.msg.metadata.stream)

    @property
    def stream_seq(self) -> int:
        """Its sequence number in the stream."""
        return int(self.msg.metadata.sequence.stream)

    @property
    def num_delivered(self) -> int:
        """How many times JetStream has delivered it (1 the first time)."""
        return int(self.msg.metadata.num_delivered)


BatchHandler = Callable[[Sequence[Delivery]], Awaitable[None]]


@dataclass(frozen=True)
class ConsumerSpec:
    """A durable consumer on one stream."""

    durable: str
    stream: str
    filter_subject: str | None = None
    max_deliver: int = 5
    ack_wait_s: float = 30.0
    batch_size: int = 500
    fetch_timeout_s: float = 1.0
    backoff_base_s: float = 0.5
    backoff_max_s: float = 30.0
    max_ack_pending: int = 20_000

    def backoff(self, num_delivered: int) -> float:
        """NAK delay before delivery number ``num_delivered + 1`` (exponential, capped)."""
        return float(
            min(self.backoff_base_s * 2.0 ** max(num_delivered - 1, 0), self.backoff_max_s)
        )


class ConsumerRunner:
    """Runs one durable consumer until :meth:`stop`; survives NATS restarts."""

    def __init__(
        self,
        bus: Bus,
        spec: ConsumerSpec,
        handler: BatchHandler,
        *,
        publisher: Publisher,
        verifier: EventVerifier | None = None,
        signature_pool: SignaturePool | None = None,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
    ) -> None:
        """``signature_pool`` moves signature checks to worker processes (needs ``verifier``
        too, which names that checks are on)."""
        self._bus = bus
        self.spec = spec
        self._handler = handler
        self._publisher = publisher
        self._verifier = verifier
        self._pool = signature_pool
        self._max = max_event_bytes
        self._stopping = asyncio.Event()
        self._sub: JetStreamContext.PullSubscription | None = None
        self.handled = 0
        self.dead_lettered = 0

    async def _subscribe(self) -> JetStreamContext.PullSubscription:
        config = api.ConsumerConfig(
            durable_name=self.spec.durable,
            ack_policy=api.AckPolicy.EXPLICIT,
            ack_wait=self.spec.ack_wait_s,
            max_deliver=self.spec.max_deliver + 1,  # the runner dead-letters at max_deliver
            filter_subject=self.spec.filter_subject,
            max_ack_pending=self.spec.max_ack_pending,
            deliver_policy=api.DeliverPolicy.ALL,
        )
        try:
            await self._bus.js.add_consumer(self.spec.stream, config)
        except APIError as exc:
            if exc.err_code != 10148:  # consumer exists with another config: keep it
                raise
        return await self._bus.js.pull_subscribe_bind(
            durable=self.spec.durable, stream=self.spec.stream
        )

    async def run(self) -> None:
        """Fetch and handle batches until stopped; connection trouble is waited out.

        Batches are pipelined: while batch N is handled (e.g. committed by a database thread),
        batch N+1 is fetched and checked. Handling stays in order, one batch at a time.
        """
        in_hand: asyncio.Task[None] | None = None
        try:
            while not self._stopping.is_set():
                msgs = await self._fetch()
                if msgs is None:
                    if self._bus.nc.is_closed:
                        return
                    continue
                good = await self._check_all(msgs)
                if in_hand is not None:
                    await in_hand
                    in_hand = None
                if good:
                    in_hand = asyncio.create_task(self._handle(good))
        finally:
            if in_hand is not None:
                await in_hand

    async def _fetch(self) -> list[Msg] | None:
        """One batch, or None when there was nothing (or the connection is down)."""
        try:
            if self._sub is None:
                self._sub = await self._subscribe()
            return list(
                await self._sub.fetch(self.spec.batch_size, timeout=self.spec.fetch_timeout_s)
            )
        except (FetchTimeoutError, nats.errors.TimeoutError, TimeoutError):
            return None
        except (
            nats.errors.ConnectionClosedError,
            nats.errors.ConnectionReconnectingError,
            nats.errors.NoRespondersError,
            ServiceUnavailableError,
            APIError,
            OSError,
        ) as exc:
            if not self._bus.nc.is_closed:
                _log.warning("fetch failed; retrying", consumer=self.spec.durable, error=repr(exc))
                await self._sleep(0.5)
            return None

    def stop(self) -> None:
        """Ask the runner to finish the batch in hand and return."""
        self._stopping.set()

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), timeout=seconds)

    async def process(self, msgs: Sequence[Msg]) -> None:
        """Check, handle and settle one fetched batch (without pipelining)."""
        good = await self._check_all(msgs)
        if good:
            await self._handle(good)

    async def _check_all(self, msgs: Sequence[Msg]) -> list[Delivery]:
        """The deliveries that pass every check; the others are dead-lettered now."""
        good: list[Delivery] = []
        inline = self._pool is None
        for msg in msgs:
            try:
                good.append(self._check(msg, verify=inline))
            except PermanentError as exc:
                await self._dead_letter(msg, str(exc))
            except Exception as exc:  # a check must never kill the consumer
                await self._dead_letter(msg, f"event could not be checked: {exc!r}")
        if inline or self._verifier is None or not good or self._pool is None:
            return good
        signed: list[Delivery] = []
        triples: list[tuple[str, bytes, bytes]] = []
        for delivery in good:
            try:
                kid, signature = parse_signature_header(
                    (delivery.msg.headers or {}).get(SIGNATURE_HEADER)
                )
            except PermanentError as exc:
                await self._dead_letter(delivery.msg, str(exc))
                continue
            signed.append(delivery)
            triples.append((kid, delivery.msg.data, signature))
        verdicts = await self._pool.verify_many(triples)
        out: list[Delivery] = []
        for delivery, (kid, _, _), problem in zip(signed, triples, verdicts, strict=True):
            try:
                if problem is not None:
                    raise PermanentError(f"bad event signature: {problem}")
                self._check_signer(delivery.event, kid)
            except PermanentError as exc:
                await self._dead_letter(delivery.msg, str(exc))
                continue
            out.append(dataclasses.replace(delivery, signer=kid))
        return out

    @staticmethod
    def _check_signer(event: EventEnvelope, kid: str) -> None:
        if event.source.startswith(PLATFORM_SOURCE_PREFIX) and not kid.startswith(
            PLATFORM_KID_PREFIX
        ):
            raise PermanentError(
                f"event claims the platform source {event.source!r} but is signed by "
                f"{kid!r}; only platform service keys ({PLATFORM_KID_PREFIX}*) may"
            )

    async def _handle(self, good: list[Delivery]) -> None:
        """Hand a checked batch to the handler; ack it, or settle each failure."""
        try:
            await self._handler(good)
        except Exception as exc:
            if len(good) == 1:
                await self._settle_failure(good[0], exc)
                return
            _log.warning("batch failed; retrying one by one", size=len(good), error=repr(exc))
            for delivery in good:
                try:
                    await self._handler([delivery])
                except Exception as single_exc:
                    await self._settle_failure(delivery, single_exc)
                else:
                    await delivery.msg.ack()
                    self.handled += 1
            return
        for delivery in good:
            await delivery.msg.ack()
        self.handled += len(good)

    def _check(self, msg: Msg, *, verify: bool = True) -> Delivery:
        if len(msg.data) > self._max:
            raise EventTooLarge(len(msg.data), self._max)
        try:
            event = EventEnvelope.from_bytes(msg.data)
            if event.type != msg.subject:
                raise PermanentError(
                    f"event type {event.type} does not match its subject {msg.subject}"
                )
            validate_event(event)
        except InvalidInput as exc:
            raise PermanentError(str(exc)) from None
        signer = None
        if verify and self._verifier is not None:
            signer = check_signature(
                self._verifier, (msg.headers or {}).get(SIGNATURE_HEADER), msg.data
            )
            self._check_signer(event, signer)
        try:
            canonical = event.canonical_bytes()
        except (TypeError, ValueError) as exc:
            raise PermanentError(f"event cannot be written as canonical JSON: {exc}") from None
        return Delivery(
            event=event,
            canonical=canonical,
            msg=msg,
            signer=signer,
        )

    async def _settle_failure(self, delivery: Delivery, exc: BaseException) -> None:
        reason = str(exc) if isinstance(exc, GantryError) else f"{type(exc).__name__}: {exc}"
        if not is_temporary(exc):
            await self._dead_letter(delivery.msg, reason)
            return
        if delivery.num_delivered >= self.spec.max_deliver:
            await self._dead_letter(
                delivery.msg, f"gave up after {delivery.num_delivered} deliveries: {reason}"
            )
            return
        delay = exc.delay_s if isinstance(exc, TemporaryError) and exc.delay_s else None
        delay = delay or self.spec.backoff(delivery.num_delivered)
        _log.warning(
            "handler failed; will retry",
            consumer=self.spec.durable,
            event_id=delivery.event.id,
            attempt=delivery.num_delivered,
            delay_s=delay,
            error=reason,
        )
        await delivery.msg.nak(delay=delay)

    async def _dead_letter(self, msg: Msg, reason: str) -> None:
        meta = msg.metadata
        headers = {
            "Nats-Msg-Id": f"dl:{self.spec.durable}:{meta.stream}:{meta.sequence.stream}",
            DEAD_REASON_HEADER: " ".join(reason.split())[:4000],
            "Gantry-Original-Subject": msg.subject,
            "Gantry-Original-Stream": meta.stream,
            "Gantry-Original-Seq": str(meta.sequence.stream),
            "Gantry-Consumer": self.spec.durable,
        }
        await self._publisher.publish_raw(
            f"{DEAD_LETTER_PREFIX}.{self.spec.durable}", msg.data, headers
        )
        await msg.term()
        self.dead_lettered += 1
        _log.warning(
            "event dead-lettered",
            consumer=self.spec.durable,
            subject=msg.subject,
            stream_seq=meta.sequence.stream,
            reason=reason[:500],
        )


def require_source(delivery: Delivery, sources: tuple[str, ...], *, consumer: str) -> None:
    """Refuse (dead-letter) an event unless it comes from one of ``sources`` and is signed by
    a platform service key: only the owner of an event type may send it."""
    event = delivery.event
    if event.source not in sources or not (delivery.signer or "").startswith(PLATFORM_KID_PREFIX):
        raise PermanentError(
            f"{event.type} from {event.source!r} signed by {delivery.signer!r} is refused: "
            f"the {consumer} takes it only from {', '.join(sources)} signed by a service key"
        )


__all__ = [
    "DEAD_REASON_HEADER",
    "BatchHandler",
    "ConsumerRunner",
    "ConsumerSpec",
    "Delivery",
    "require_source",
]
