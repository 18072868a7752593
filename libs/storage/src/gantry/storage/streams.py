"""Streaming access to one object: ObjectWriter (upload) and ObjectReader (verified download)."""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from types import TracebackType

from cryptography.exceptions import InvalidTag

from gantry.core import Conflict, GantryError, InvalidInput
from gantry.storage.backends import Backend
from gantry.storage.errors import ObjectNotFound, TamperedObject
from gantry.storage.format import (
    BODY_PREFIX_LEN,
    DEK_LEN,
    OBJECT_ID_LEN,
    TAG_LEN,
    ChunkCipher,
    ChunkEncryptor,
    Header,
    MalformedHeader,
    parse_body_prefix,
)
from gantry.storage.naming import body_name

QUEUE_PIECES = 2  # pieces waiting for the upload thread: bounds a writer's memory


@dataclass(frozen=True)
class ObjectInfo:
    """What the store knows about a committed object (from its authenticated header)."""

    name: str
    size: int  # plaintext bytes
    object_id: str  # 32 hex chars
    chunk_size: int
    kek_version: int
    created_ms: int
    metadata: dict[str, str]

    @classmethod
    def from_header(cls, name: str, header: Header) -> ObjectInfo:
        """Describe an authenticated header."""
        return cls(
            name,
            header.size,
            header.object_id.hex(),
            header.chunk_size,
            header.kek_version,
            header.created_ms,
            header.metadata(),
        )


@dataclass(frozen=True)
class WriteSession:
    """The secrets of one object being written: a fresh data key and object id."""

    dek: bytes
    object_id: bytes
    created_ms: int

    @classmethod
    def new(cls) -> WriteSession:
        """Fresh random 256-bit DEK and 128-bit object id."""
        return cls(os.urandom(DEK_LEN), os.urandom(OBJECT_ID_LEN), int(time.time() * 1000))


class _Abort(Exception):
    """Raised inside the body iterator so the backend discards the partial blob."""


_END = object()
_ABORT = object()


class ObjectWriter:
    """Uploads one object from ``write`` calls; nothing is visible until :meth:`close`.

    Promises: memory stays at a few chunks (plus the pieces passed to ``write``) whatever the
    object size, because the body streams to the backend from a thread fed by a bounded
    queue; :meth:`abort`, or an exception inside a ``with`` block, leaves nothing visible.
    """

    def __init__(
        self,
        backend: Backend,
        name: str,
        chunk_size: int,
        commit: Callable[[WriteSession, ChunkEncryptor], ObjectInfo],
    ) -> None:
        self.name = name
        self.info: ObjectInfo | None = None
        self._backend = backend
        self._session = WriteSession.new()
        self._encryptor = ChunkEncryptor(
            ChunkCipher(self._session.dek, self._session.object_id),
            self._session.object_id,
            chunk_size,
        )
        self._commit = commit
        self._queue: queue.Queue[object] = queue.Queue(maxsize=QUEUE_PIECES)
        self._thread = threading.Thread(target=self._upload, name="gantry-storage-put", daemon=True)
        self._error: BaseException | None = None
        self._finished = False

    def _pieces(self) -> Iterator[bytes]:
        while True:
            item = self._queue.get()
            if item is _END:
                return
            if item is _ABORT:
                raise _Abort
            assert isinstance(item, bytes)
            yield item

    def _upload(self) -> None:
        body = body_name(self.name, self._session.object_id)
        try:
            self._backend.put_stream(body, self._encryptor.body(self._pieces()))
        except BaseException as exc:  # handed to the writing thread
            self._error = exc

    def _send(self, item: object) -> None:
        if self._thread.ident is None:
            self._thread.start()
        while True:
            try:
                self._queue.put(item, timeout=0.05)
                return
            except queue.Full:
                if not self._thread.is_alive():
                    return  # the upload failed; the error is raised by the caller

    def write(self, data: bytes) -> None:
        """Append ``data`` (any bytes-like; mutable buffers are copied)."""
        if self._finished:
            raise Conflict(f"the writer of {self.name!r} is closed", hint="open a new writer")
        if self._error is not None:
            self._fail()
        if len(data):
            self._send(data if isinstance(data, bytes) else bytes(data))
        if self._error is not None:
            self._fail()

    def close(self) -> ObjectInfo:
        """Finish the body, then write the header: the object becomes visible atomically."""
        if self.info is not None:
            return self.info
        if self._finished:
            raise Conflict(f"the writer of {self.name!r} was aborted", hint="write it again")
        self._send(_END)
        self._thread.join()
        if self._error is not None:
            self._fail()
        self._finished = True
        self.info = self._commit(self._session, self._encryptor)
        return self.info

    def abort(self) -> None:
        """Discard everything written; the object (or its previous version) is unchanged."""
        if self._finished:
            return
        self._finished = True
        if self._thread.ident is not None:
            self._send(_ABORT)
            self._thread.join()
        # backends discard a failed put_stream themselves; this is belt and braces, and an
        # unreachable backend must not hide the error that made us abort (sweep covers it)
        with contextlib.suppress(GantryError, OSError):
            self._backend.delete(body_name(self.name, self._session.object_id))

    def _fail(self) -> None:
        error = self._error
        self.abort()
        assert error is not None
        raise error

    def __enter__(self) -> ObjectWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None:
            self.abort()
        else:
            self.close()


class RecordFramer:
    """Cuts a stream of pieces of any size into records of the sizes asked for.

    A record that lies inside one piece is returned as a view (no copy).
    """

    def __init__(self, pieces: Iterator[bytes]) -> None:
        self._pieces = pieces
        self._cur = memoryview(b"")

    def take(self, n: int) -> memoryview | bytearray:
        """The next ``n`` bytes; fewer only when the stream ends."""
        cur = self._cur
        while not cur:
            piece = next(self._pieces, None)
            if piece is None:
                return cur
            cur = memoryview(piece)
        if len(cur) >= n:
            self._cur = cur[n:]
            return cur[:n]
        buf = bytearray(cur)
        self._cur = memoryview(b"")
        while len(buf) < n:
            piece = next(self._pieces, None)
            if piece is None:
                break
            need = n - len(buf)
            if len(piece) <= need:
                buf += piece
            else:
                view = memoryview(piece)
                buf += view[:need]
                self._cur = view[need:]
        return buf

    def at_end(self) -> bool:
        """Whether the stream has no bytes left."""
        while not self._cur:
            piece = next(self._pieces, None)
            if piece is None:
                return True
            self._cur = memoryview(piece)
        return False

    def close(self) -> None:
        """Release the underlying stream (closes a generator's file or connection)."""
        close = getattr(self._pieces, "close", None)
        if close is not None:
            close()


class ObjectReader:
    """Verified plaintext of one object: an iterator of chunks, and ``read(n)``.

    Promises: every chunk is authenticated before any of its bytes are returned; on the first
    bad, missing, reordered or foreign chunk (or trailing data) it raises
    :class:`TamperedObject` naming the chunk, and returns nothing from there on.
    """

    def __init__(
        self,
        backend: Backend,
        name: str,
        header: Header,
        dek: bytes,
        header_changed: Callable[[], bool],
    ) -> None:
        self.name = name
        self.info = ObjectInfo.from_header(name, header)
        self._backend = backend
        self._header = header
        self._cipher = ChunkCipher(dek, header.object_id)
        self._header_changed = header_changed
        self._chunks = self._verified_chunks()
        self._pending = memoryview(b"")
        self._started = False

    def _verified_chunks(
        self, into: memoryview | None = None
    ) -> Generator[bytes | memoryview, None, None]:
        """Each chunk's plaintext once authenticated; written into ``into`` when given."""
        h, name = self._header, self.name
        framer = RecordFramer(self._backend.get_stream(body_name(name, h.object_id)))
        try:
            try:
                prefix = framer.take(BODY_PREFIX_LEN)
            except ObjectNotFound:
                if self._header_changed():
                    raise ObjectNotFound(
                        name, hint="it was deleted or replaced while being read; open it again"
                    ) from None
                raise TamperedObject(name, 0, "the body is missing") from None
            try:
                object_id, chunk_size = parse_body_prefix(prefix)
            except MalformedHeader as exc:
                raise TamperedObject(name, 0, f"bad body prefix: {exc}") from None
            if object_id != h.object_id or chunk_size != h.chunk_size:
                raise TamperedObject(name, 0, "the body belongs to another object or header")
            last = h.chunks - 1
            for index in range(h.chunks):
                final = index == last
                length = (h.size - index * h.chunk_size if final else h.chunk_size) + TAG_LEN
                record = framer.take(length)
                if len(record) < length:
                    raise TamperedObject(name, index, "the body is truncated")
                try:
                    if into is None:
                        plaintext: bytes | memoryview = self._cipher.open(index, record, final)
                    else:
                        start = index * h.chunk_size
                        plaintext = into[start : start + length - TAG_LEN]
                        self._cipher.open_into(index, record, final, plaintext)
                except InvalidTag:
                    reason = "the chunk does not authenticate (altered, reordered or foreign)"
                    raise TamperedObject(name, index, reason) from None
                if final and not framer.at_end():
                    raise TamperedObject(name, h.chunks, "the body has data after its last chunk")
                yield plaintext
        finally:
            framer.close()

    def __iter__(self) -> ObjectReader:
        return self

    def __next__(self) -> bytes:
        self._started = True
        if self._pending:
            out, self._pending = bytes(self._pending), memoryview(b"")
            return out
        return bytes(next(self._chunks))

    def readall(self) -> bytearray:
        """The whole object, verified, decrypted into one buffer (one allocation).

        Only before anything else was read; raises like iteration does, returning nothing.
        """
        if self._started:
            raise InvalidInput(
                f"readall() on {self.name!r} after reading from it",
                hint="call readall() on a freshly opened reader",
            )
        self._started = True
        self._chunks.close()
        out = bytearray(self._header.size)
        self._chunks = self._verified_chunks(memoryview(out))
        for _ in self._chunks:
            pass
        return out

    def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes (all remaining when ``n`` < 0); ``b""`` at the end."""
        self._started = True
        parts: list[bytes | memoryview] = []
        want = n if n >= 0 else 1 << 62
        while want > 0:
            if not self._pending:
                chunk = next(self._chunks, None)
                if chunk is None:
                    break
                self._pending = memoryview(chunk)
            piece, self._pending = self._pending[:want], self._pending[want:]
            parts.append(piece)
            want -= len(piece)
        return b"".join(parts)

    def close(self) -> None:
        """Stop reading and release the backend stream."""
        self._chunks.close()

    def __enter__(self) -> ObjectReader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


__all__ = ["ObjectInfo", "ObjectReader", "ObjectWriter", "RecordFramer", "WriteSession"]
