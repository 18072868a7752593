"""One authenticated channel to the governance service, shared by the data and model clients.

It owns what every call needs: the bearer token, deadlines, the mapping of gRPC failures to
Gantry's typed errors, and the framing of client streams (the service discards a stream whose
last message does not carry ``last=true``, so a stream that fails half-way must end without it).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any, Protocol, TypeVar

import grpc

from gantry.client._rpc import ActAs, RpcClient
from gantry.core import GantryError, InvalidInput, TlsSettings
from gantry.protos.v1 import governance_pb2_grpc as pb_grpc

#: The largest message the client accepts (512 MiB). A table read answers one whole shard per
#: message, so this must exceed the service's largest shard; gRPC's own default is 4 MiB.
MAX_MESSAGE_BYTES = 512 << 20

Progress = Callable[[int], None]


class _Framed(Protocol):
    last: bool


M = TypeVar("M", bound=_Framed)


class GovernanceConnection(RpcClient):
    """A synchronous channel to the governance service, authenticated with a bearer token.

    ``timeout_s`` bounds each request/response call; ``stream_timeout_s`` bounds a whole
    upload, read or download (``None``: no deadline).
    """

    service = "governance"

    def __init__(
        self,
        address: str,
        token: str,
        *,
        timeout_s: float = 30.0,
        stream_timeout_s: float | None = 3600.0,
        act_as: ActAs | None = None,
        tls: TlsSettings | None = None,
    ) -> None:
        super().__init__(
            address,
            token,
            timeout_s=timeout_s,
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ],
            act_as=act_as,
            tls=tls,
        )
        self._stub = pb_grpc.GovernanceServiceStub(self._channel)
        self._stream_timeout = stream_timeout_s

    def _send_stream(self, method: str, messages: Iterable[M]) -> Any:
        """Send ``messages`` as one client stream, the last marked ``last=true``; the reply.

        If producing the messages fails (a file turns out unreadable half-way), the stream
        ends without the marker, so the service discards what it received, and that error
        is raised here rather than the call's.
        """
        feed = _Feed(messages)
        try:
            reply = getattr(self._stub, method)(
                iter(feed), metadata=self._metadata, timeout=self._stream_timeout
            )
        except grpc.RpcError as exc:
            if feed.error is not None:
                raise feed.error from None
            raise self._error(exc) from None
        if feed.error is not None:
            raise feed.error
        return reply

    def _receive_stream(self, method: str, request: Any) -> Generator[Any, None, None]:
        """The replies of a server stream; stopping early cancels the call."""
        call = getattr(self._stub, method)(
            request, metadata=self._metadata, timeout=self._stream_timeout
        )
        try:
            yield from call
        except grpc.RpcError as exc:
            raise self._error(exc) from None
        finally:
            call.cancel()


class _Feed:
    """Messages for a client stream: the last one is marked, a failure stops unmarked.

    gRPC pulls these from its own thread and only logs what the iterator raises, so the
    exception is kept here for the caller instead.
    """

    def __init__(self, messages: Iterable[_Framed]) -> None:
        self._messages = messages
        self.error: Exception | None = None

    def __iter__(self) -> Iterator[_Framed]:
        held: _Framed | None = None
        try:
            for message in self._messages:
                if held is not None:
                    yield held
                held = message
        except GantryError as exc:
            self.error = exc
            return
        except OSError as exc:
            where = f" {exc.filename}" if exc.filename else ""
            self.error = InvalidInput(f"upload stopped: can't read{where}: {exc.strerror or exc}")
            return
        except Exception as exc:  # e.g. a progress callback's bug: reported, not swallowed
            self.error = InvalidInput(f"upload stopped: {type(exc).__name__}: {exc}")
            self.error.__cause__ = exc
            return
        if held is not None:
            held.last = True
            yield held


__all__ = ["MAX_MESSAGE_BYTES", "GovernanceConnection", "Progress"]
