"""ObjectStore: named, encrypted, verified objects over a Backend.

Each object is a body blob and a header blob (see :mod:`gantry.storage.naming` and
``docs/storage-format.md``). The header is written last, so a reader either finds the whole
new object, the whole previous one, or nothing.
"""

from __future__ import annotations

import contextlib
import io
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import BinaryIO

from cryptography.exceptions import InvalidTag

from gantry.core import Conflict, GantryError, IntegrityError, InvalidInput
from gantry.storage.backends import Backend
from gantry.storage.errors import KeyUnavailable, ObjectNotFound, TamperedObject
from gantry.storage.format import (
    OBJECT_ID_LEN,
    TAG_LEN,
    ChunkCipher,
    ChunkEncryptor,
    Header,
    MalformedHeader,
    body_length,
    canonical_metadata,
    check_chunk_size,
    record_offset,
)
from gantry.storage.key_manager import KeyManager
from gantry.storage.naming import (
    BODY_PREFIX,
    HEAD_PREFIX,
    body_name,
    check_object_name,
    check_prefix,
    head_name,
    parse_body_name,
)
from gantry.storage.streams import ObjectInfo, ObjectReader, ObjectWriter, WriteSession

PutData = bytes | bytearray | memoryview | BinaryIO | Iterable[bytes]


def _header_object_id(raw: bytes | None) -> bytes | None:
    """The object id field of a (possibly damaged) header: offsets 5..21."""
    return raw[5 : 5 + OBJECT_ID_LEN] if raw is not None and len(raw) >= 21 else None


#: Objects given to :meth:`ObjectStore.put` in memory up to this size are sealed into one body
#: buffer (one allocation, like a single AES-GCM call); larger ones stream chunk by chunk.
WHOLE_BODY_LIMIT = 512 << 20


class ObjectStore:
    """Encrypted object store over a Backend.

    Promises: objects appear atomically and completely; every byte returned was authenticated
    (a fresh AES-256-GCM data key per object, wrapped by the key ring's active KEK); any
    change to stored bytes raises :class:`TamperedObject`; memory use of streaming reads and
    writes is bounded by a few chunks. Safe to share between threads.
    """

    def __init__(self, backend: Backend, keys: KeyManager, *, chunk_size: int = 1 << 20) -> None:
        self.backend = backend
        self.chunk_size = check_chunk_size(chunk_size)
        self._keys = keys

    @property
    def keys(self) -> KeyManager:
        """The key ring's manager (rotate, retire, versions)."""
        return self._keys

    # -- writing -----------------------------------------------------------------------------

    def put(
        self, name: str, data: PutData, *, metadata: Mapping[str, str] | None = None
    ) -> ObjectInfo:
        """Store ``data`` (bytes, a binary file, or an iterable of bytes) as ``name``.

        Replaces any previous object of that name atomically.
        """
        check_object_name(name)
        meta = canonical_metadata(metadata)
        session = WriteSession.new()
        cipher = ChunkCipher(session.dek, session.object_id)
        encryptor = ChunkEncryptor(cipher, session.object_id, self.chunk_size)
        body: Iterable[bytes | bytearray | memoryview]
        if isinstance(data, bytes | bytearray | memoryview) and len(data) <= WHOLE_BODY_LIMIT:
            body = (encryptor.whole_body(data),)  # in memory already: seal in one buffer
        else:
            body = encryptor.body(self._pieces(data))
        self.backend.put_stream(body_name(name, session.object_id), body)  # type: ignore[arg-type]
        return self._commit(name, session, encryptor, meta)

    def writer(self, name: str, *, metadata: Mapping[str, str] | None = None) -> ObjectWriter:
        """A streaming writer; the object appears when it is closed (see ObjectWriter)."""
        check_object_name(name)
        meta = canonical_metadata(metadata)
        return ObjectWriter(
            self.backend,
            name,
            self.chunk_size,
            lambda session, encryptor: self._commit(name, session, encryptor, meta),
        )

    def _pieces(self, data: PutData) -> Iterable[bytes | bytearray | memoryview]:
        if isinstance(data, bytes | bytearray | memoryview):
            return (data,)
        if isinstance(data, str | io.TextIOBase):
            raise InvalidInput("put() takes bytes, not text", hint="encode the text first")
        read = getattr(data, "read", None)
        if callable(read):
            return iter(lambda: bytes(read(self.chunk_size)), b"")
        return data  # type: ignore[return-value]

    def _commit(
        self, name: str, session: WriteSession, encryptor: ChunkEncryptor, meta: bytes
    ) -> ObjectInfo:
        previous = _header_object_id(self._read_head(name))
        header = Header(
            session.object_id,
            0,
            encryptor.chunk_size,
            encryptor.size,
            encryptor.chunks,
            session.created_ms,
            meta,
        )
        try:
            header = self._wrap(name, header, session.dek)
            self.backend.put_stream(head_name(name), (header.encode(),))
        except BaseException:
            with contextlib.suppress(GantryError, OSError):  # else sweep_incomplete removes it
                self.backend.delete(body_name(name, session.object_id))
            raise
        if previous is not None and previous != session.object_id:
            self.backend.delete(body_name(name, previous))
        return ObjectInfo.from_header(name, header)

    def _wrap(self, name: str, header: Header, dek: bytes) -> Header:
        """``header`` with ``dek`` wrapped by the active KEK; the AAD names that version."""
        for _ in range(5):  # a concurrent rotation can change the version between the calls
            version = self._keys.active_version
            candidate = header.with_key(version, b"")
            used, wrapped = self._keys.wrap(dek, candidate.wrap_aad(name))
            if used == version:
                return candidate.with_key(version, wrapped)
        raise Conflict("the active KEK kept changing during a write", hint="retry the write")

    # -- reading -----------------------------------------------------------------------------

    def _read_head(self, name: str) -> bytes | None:
        try:
            return b"".join(self.backend.get_stream(head_name(name)))
        except ObjectNotFound:
            return None

    def _authenticate(self, name: str, raw: bytes | None) -> tuple[Header, bytes]:
        if raw is None:
            raise ObjectNotFound(name)
        try:
            header = Header.decode(raw)
        except MalformedHeader as exc:
            raise TamperedObject(name, None, str(exc)) from None
        try:
            dek = self._keys.unwrap(header.kek_version, header.wrapped_key, header.wrap_aad(name))
            header.metadata()
        except KeyUnavailable as exc:
            raise KeyUnavailable(exc.version, exc.reason, name=name, source=exc.source) from None
        except (IntegrityError, ValueError):
            reason = "the header does not authenticate (altered, or swapped from another object)"
            raise TamperedObject(name, None, reason) from None
        return header, dek

    def open(self, name: str) -> ObjectReader:
        """A reader of verified plaintext chunks; the header is checked before this returns."""
        check_object_name(name)
        raw = self._read_head(name)
        header, dek = self._authenticate(name, raw)
        return ObjectReader(self.backend, name, header, dek, lambda: self._read_head(name) != raw)

    def get(self, name: str) -> bytearray:
        """The whole object, verified, in one buffer (compares equal to the bytes put)."""
        with self.open(name) as reader:
            return reader.readall()

    def read_range(self, name: str, offset: int, length: int) -> bytes:
        """``length`` bytes from ``offset`` (fewer at the end of the object).

        Fetches only the chunks that overlap the range, in one ranged backend read, and
        verifies each of them.
        """
        if offset < 0 or length < 0:
            raise InvalidInput(
                f"a range needs offset >= 0 and length >= 0, got {offset} and {length}",
                hint="pass a byte offset into the object and a byte count",
            )
        check_object_name(name)
        header, dek = self._authenticate(name, self._read_head(name))
        size, cs = header.size, header.chunk_size
        end = min(offset + length, size)
        if offset >= end:
            return b""
        first, last = offset // cs, (end - 1) // cs
        start = record_offset(first, cs)
        stop = min(record_offset(last + 1, cs), body_length(size, cs))
        extra = 1 if last == header.chunks - 1 else 0  # one more byte reveals trailing data
        body = body_name(name, header.object_id)
        try:
            raw = memoryview(self.backend.get_range(body, start, stop - start + extra))
        except ObjectNotFound:
            raise TamperedObject(name, first, "the body is missing") from None
        if len(raw) > stop - start:
            raise TamperedObject(name, header.chunks, "the body has data after its last chunk")
        cipher = ChunkCipher(dek, header.object_id)
        parts: list[memoryview] = []
        pos = 0
        for index in range(first, last + 1):
            final = index == header.chunks - 1
            length_i = (size - index * cs if final else cs) + TAG_LEN
            record = raw[pos : pos + length_i]
            if len(record) < length_i:
                raise TamperedObject(name, index, "the body is truncated")
            try:
                plain = memoryview(cipher.open(index, record, final))
            except InvalidTag:
                raise TamperedObject(name, index, "the chunk does not authenticate") from None
            lo = offset - index * cs if index == first else 0
            hi = end - index * cs if index == last else len(plain)
            parts.append(plain[lo:hi])
            pos += length_i
        return b"".join(parts)

    def stat(self, name: str) -> ObjectInfo:
        """The object's authenticated description (reads only the header)."""
        check_object_name(name)
        header, _ = self._authenticate(name, self._read_head(name))
        return ObjectInfo.from_header(name, header)

    def exists(self, name: str) -> bool:
        """Whether a committed object of that name exists (its header is not verified)."""
        return self.backend.exists(head_name(check_object_name(name)))

    def names(self, prefix: str = "") -> Iterator[str]:
        """Names of committed objects starting with ``prefix``, sorted; reads no header."""
        check_prefix(prefix)
        for blob in self.backend.list(HEAD_PREFIX + prefix):
            yield blob[len(HEAD_PREFIX) :]

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Committed objects starting with ``prefix``, sorted by name, headers verified."""
        for name in self.names(prefix):
            try:
                yield self.stat(name)
            except ObjectNotFound:  # deleted while listing
                continue

    # -- removing and maintenance ------------------------------------------------------------

    def delete(self, name: str) -> bool:
        """Remove the object; ``True`` if it existed. Idempotent."""
        check_object_name(name)
        object_id = _header_object_id(self._read_head(name))
        removed = self.backend.delete(head_name(name))
        if object_id is not None:
            self.backend.delete(body_name(name, object_id))
        return removed

    def rewrap(self, *, progress: Callable[[int], None] | None = None) -> int:
        """Re-wrap every object's data key under the active KEK; bodies are not touched.

        Returns how many headers were rewritten. ``progress`` is called after each object
        with the number of objects examined so far. Run it after :meth:`KeyManager.rotate`
        and before retiring the old version.
        """
        rewritten = 0
        active = self._keys.active_version
        for examined, name in enumerate(self.names(), start=1):
            raw = self._read_head(name)
            if raw is not None:
                header, dek = self._authenticate(name, raw)
                if header.kek_version != active:
                    fresh = self._wrap(name, header, dek)
                    if self._read_head(name) == raw:  # skip objects replaced meanwhile
                        self.backend.put_stream(head_name(name), (fresh.encode(),))
                        rewritten += 1
            if progress is not None:
                progress(examined)
        return rewritten

    def sweep_incomplete(self, older_than_s: float = 3600.0) -> int:
        """Remove bodies no header points to (aborted or replaced uploads) older than this.

        Returns how many were removed. The age guard protects uploads that are between
        finishing their body and writing their header. Also removes a backend's own leftovers
        of crashed writes (LocalBackend temporary files) when it offers ``sweep_partial``.
        """
        cutoff = time.time() - older_than_s
        removed = 0
        current: tuple[str, bytes | None] | None = None
        for blob in self.backend.list(BODY_PREFIX):
            parsed = parse_body_name(blob)
            if parsed is None:
                continue
            name, object_id = parsed
            if current is None or current[0] != name:
                current = (name, _header_object_id(self._read_head(name)))
            if current[1] == object_id:
                continue
            try:
                if self.backend.mtime(blob) > cutoff:
                    continue
            except ObjectNotFound:
                continue
            if self.backend.delete(blob):
                removed += 1
        sweep_partial = getattr(self.backend, "sweep_partial", None)
        if callable(sweep_partial):
            removed += int(sweep_partial(older_than_s))
        return removed


__all__ = ["ObjectStore"]
