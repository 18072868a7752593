"""The on-disk format, version 1: the header blob, the body prefix and sealed chunks.

``docs/storage-format.md`` is the normative description; this module is its only encoder and
decoder. Everything here is pure computation: no I/O, no key management.

Body::

    offset  size  field
    0       4     magic b"GTYB"
    4       1     format version (1)
    5       16    object id
    21      4     chunk size C (u32, big-endian)
    25      ...   chunk i at 25 + i*(C+16): AES-256-GCM(DEK) ciphertext || 16-byte tag

Chunk i: nonce = 4 zero bytes || i (u64); AAD = b"GTY1" || object id || i (u64) || final (u8).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from gantry.core import InvalidInput

BODY_MAGIC = b"GTYB"
HEADER_MAGIC = b"GTYH"
FORMAT_VERSION = 1
SUITE = b"GTY1"  # names format 1 + AES-256-GCM chunks; bound into every chunk's AAD
TAG_LEN = 16
DEK_LEN = 32
OBJECT_ID_LEN = 16
WRAPPED_KEY_LEN = 12 + DEK_LEN + TAG_LEN  # random nonce || wrapped DEK || tag
MIN_CHUNK_SIZE = 64 * 1024
MAX_CHUNK_SIZE = 1024 * 1024
MAX_CHUNKS = 2**32
MAX_METADATA_BYTES = 64 * 1024

_PREFIX = struct.Struct(">4sB16sI")
_FIXED = struct.Struct(">4sB16sIIQQQI")
_NONCE = struct.Struct(">4xQ")
_AAD = struct.Struct(">4s16sQB")

BODY_PREFIX_LEN = _PREFIX.size  # 25
HEADER_FIXED_LEN = _FIXED.size  # 57


class MalformedHeader(ValueError):
    """A header or body prefix cannot be parsed; the store reports it as tampering."""


def check_chunk_size(chunk_size: int) -> int:
    """Return ``chunk_size`` if format version 1 allows it (64 KiB to 1 MiB), else raise."""
    if not MIN_CHUNK_SIZE <= chunk_size <= MAX_CHUNK_SIZE:
        raise InvalidInput(
            f"chunk size {chunk_size} is outside the allowed range",
            hint=f"use {MIN_CHUNK_SIZE} (64 KiB) to {MAX_CHUNK_SIZE} (1 MiB) bytes",
        )
    return chunk_size


def chunk_count(size: int, chunk_size: int) -> int:
    """How many chunks an object of ``size`` plaintext bytes has (an empty one has one)."""
    return max(1, -(-size // chunk_size))


def record_offset(index: int, chunk_size: int) -> int:
    """Byte offset of chunk ``index`` inside the body."""
    return BODY_PREFIX_LEN + index * (chunk_size + TAG_LEN)


def body_length(size: int, chunk_size: int) -> int:
    """Exact body length in bytes of an object of ``size`` plaintext bytes."""
    return BODY_PREFIX_LEN + size + chunk_count(size, chunk_size) * TAG_LEN


def body_prefix(object_id: bytes, chunk_size: int) -> bytes:
    """The 25 bytes a body starts with."""
    return _PREFIX.pack(BODY_MAGIC, FORMAT_VERSION, object_id, chunk_size)


def parse_body_prefix(raw: bytes | bytearray | memoryview) -> tuple[bytes, int]:
    """``(object id, chunk size)`` from a body's first 25 bytes, or :class:`MalformedHeader`."""
    if len(raw) != BODY_PREFIX_LEN:
        raise MalformedHeader("the body is shorter than its 25-byte prefix")
    magic, version, object_id, chunk_size = _PREFIX.unpack(raw)
    if magic != BODY_MAGIC:
        raise MalformedHeader(f"the body magic is {magic!r}, not {BODY_MAGIC!r}")
    if version != FORMAT_VERSION:
        raise MalformedHeader(f"body format version {version} is not {FORMAT_VERSION}")
    return object_id, chunk_size


def canonical_metadata(metadata: Mapping[str, str] | None) -> bytes:
    """Metadata as canonical JSON (sorted keys, no spaces, UTF-8), at most 64 KiB."""
    items = dict(metadata or {})
    for key, value in items.items():
        if not isinstance(key, str) or not isinstance(value, str) or not key:
            raise InvalidInput(
                f"metadata entry {key!r}: {value!r} is not a non-empty string key and string value",
                hint="pass metadata as dict[str, str], e.g. {'content-type': 'application/json'}",
            )
    raw = json.dumps(items, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    if len(raw) > MAX_METADATA_BYTES:
        raise InvalidInput(
            f"metadata is {len(raw)} bytes as JSON, more than {MAX_METADATA_BYTES}",
            hint="keep metadata small (labels, content type); store large data as an object",
        )
    return raw


@dataclass(frozen=True)
class Header:
    """A parsed header. Nothing in it is trusted until its wrapped key unwraps (see wrap_aad)."""

    object_id: bytes
    kek_version: int
    chunk_size: int
    size: int
    chunks: int
    created_ms: int
    metadata_json: bytes
    wrapped_key: bytes = b""

    def prefix(self) -> bytes:
        """Every header byte before the wrapped key."""
        fixed = _FIXED.pack(
            HEADER_MAGIC,
            FORMAT_VERSION,
            self.object_id,
            self.kek_version,
            self.chunk_size,
            self.size,
            self.chunks,
            self.created_ms,
            len(self.metadata_json),
        )
        return fixed + self.metadata_json

    def wrap_aad(self, name: str) -> bytes:
        """AAD of the DEK wrap: the header prefix, then the object name (binds both)."""
        return self.prefix() + name.encode()

    def encode(self) -> bytes:
        """The header blob's bytes."""
        if len(self.wrapped_key) != WRAPPED_KEY_LEN:
            raise ValueError("a header needs its wrapped key before it is encoded")
        return self.prefix() + self.wrapped_key

    def with_key(self, kek_version: int, wrapped_key: bytes) -> Header:
        """This header wrapped by another KEK version (the body is unchanged)."""
        return replace(self, kek_version=kek_version, wrapped_key=wrapped_key)

    def metadata(self) -> dict[str, str]:
        """The metadata mapping (call only after the header authenticated)."""
        value = json.loads(self.metadata_json)
        if not isinstance(value, dict):
            raise MalformedHeader("metadata is not a JSON object")
        return {str(k): str(v) for k, v in value.items()}

    @classmethod
    def decode(cls, raw: bytes) -> Header:
        """Parse a header blob, checking structure only, or raise :class:`MalformedHeader`."""
        if len(raw) < HEADER_FIXED_LEN + WRAPPED_KEY_LEN:
            raise MalformedHeader(f"the header is {len(raw)} bytes, too short")
        magic, version, object_id, kek, chunk_size, size, chunks, created, meta_len = (
            _FIXED.unpack_from(raw)
        )
        if magic != HEADER_MAGIC:
            raise MalformedHeader(f"the header magic is {magic!r}, not {HEADER_MAGIC!r}")
        if version != FORMAT_VERSION:
            raise MalformedHeader(f"header format version {version} is not {FORMAT_VERSION}")
        if not MIN_CHUNK_SIZE <= chunk_size <= MAX_CHUNK_SIZE:
            raise MalformedHeader(f"the header's chunk size {chunk_size} is out of range")
        if meta_len > MAX_METADATA_BYTES:
            raise MalformedHeader(f"the header's metadata length {meta_len} is out of range")
        if len(raw) != HEADER_FIXED_LEN + meta_len + WRAPPED_KEY_LEN:
            raise MalformedHeader(f"the header is {len(raw)} bytes, its fields say otherwise")
        if chunks != chunk_count(size, chunk_size) or chunks > MAX_CHUNKS:
            raise MalformedHeader(f"chunk count {chunks} does not match size {size}")
        end = HEADER_FIXED_LEN + meta_len
        metadata, wrapped = raw[HEADER_FIXED_LEN:end], raw[end:]
        return cls(object_id, kek, chunk_size, size, chunks, created, metadata, wrapped)


class ChunkCipher:
    """Seals and opens the chunks of one object (one DEK, one object id)."""

    __slots__ = ("_aead", "_object_id")

    def __init__(self, dek: bytes, object_id: bytes) -> None:
        self._aead = AESGCM(dek)
        self._object_id = object_id

    def seal(self, index: int, plaintext: bytes | bytearray | memoryview, final: bool) -> bytes:
        """Chunk ``index`` as ciphertext || tag."""
        aad = _AAD.pack(SUITE, self._object_id, index, final)
        return self._aead.encrypt(_NONCE.pack(index), plaintext, aad)

    def seal_into(
        self, index: int, plaintext: bytes | bytearray | memoryview, final: bool, out: memoryview
    ) -> None:
        """Chunk ``index`` as ciphertext || tag, written into ``out`` (len(plaintext) + 16)."""
        aad = _AAD.pack(SUITE, self._object_id, index, final)
        self._aead.encrypt_into(_NONCE.pack(index), plaintext, aad, out)

    def open(self, index: int, record: bytes | bytearray | memoryview, final: bool) -> bytes:
        """Plaintext of chunk ``index``; raises ``cryptography.exceptions.InvalidTag`` if bad."""
        aad = _AAD.pack(SUITE, self._object_id, index, final)
        return self._aead.decrypt(_NONCE.pack(index), record, aad)

    def open_into(
        self, index: int, record: bytes | bytearray | memoryview, final: bool, out: memoryview
    ) -> None:
        """Like :meth:`open`, writing the plaintext into ``out`` (len(record) - 16 bytes).

        On ``InvalidTag`` the contents of ``out`` are undefined: the caller must discard it.
        """
        aad = _AAD.pack(SUITE, self._object_id, index, final)
        self._aead.decrypt_into(_NONCE.pack(index), record, aad, out)


class ChunkEncryptor:
    """Turns plaintext pieces of any sizes into a body: the prefix, then sealed chunks.

    After :meth:`body` is exhausted, ``size`` and ``chunks`` describe what was sealed. Pieces
    are sliced, not copied, so they must not change until the iterator moves past them.
    """

    def __init__(self, cipher: ChunkCipher, object_id: bytes, chunk_size: int) -> None:
        self._cipher = cipher
        self._prefix = body_prefix(object_id, chunk_size)
        self.chunk_size = chunk_size
        self.size = 0
        self.chunks = 0

    def _seal(self, plaintext: bytes | bytearray | memoryview, final: bool) -> bytes:
        if self.chunks >= MAX_CHUNKS:
            raise InvalidInput(
                f"object exceeds {MAX_CHUNKS} chunks of {self.chunk_size} bytes",
                hint="split the data into several objects",
            )
        record = self._cipher.seal(self.chunks, plaintext, final)
        self.chunks += 1
        self.size += len(plaintext)
        return record

    def whole_body(self, data: bytes | bytearray | memoryview) -> bytearray:
        """The whole body of an object already in memory, sealed into one buffer.

        Same bytes as :meth:`body` gives, but one allocation for the object instead of one
        per chunk (what a single AES-GCM call over the data would allocate).
        """
        view = memoryview(data)
        if view.ndim != 1 or view.itemsize != 1:
            view = view.cast("B")
        total, size = len(view), self.chunk_size
        count = max(1, -(-total // size))
        if count > MAX_CHUNKS:
            raise InvalidInput(
                f"object exceeds {MAX_CHUNKS} chunks of {size} bytes",
                hint="split the data into several objects",
            )
        prefix = len(self._prefix)
        body = bytearray(prefix + total + count * TAG_LEN)
        out = memoryview(body)
        out[:prefix] = self._prefix
        pos = prefix
        for index in range(count):
            piece = view[index * size : (index + 1) * size]
            end = pos + len(piece) + TAG_LEN
            self._cipher.seal_into(index, piece, index == count - 1, out[pos:end])
            pos = end
        self.chunks = count
        self.size = total
        return body

    def body(self, pieces: Iterable[bytes | bytearray | memoryview]) -> Iterator[bytes]:
        """Yield the body blob in pieces; the last chunk is sealed as final."""
        yield self._prefix
        size = self.chunk_size
        held: bytes | bytearray | memoryview | None = None  # a full chunk; is it the last?
        buf = bytearray()
        for piece in pieces:
            view = memoryview(piece)
            if view.ndim != 1 or view.itemsize != 1:
                view = view.cast("B")
            pos, end = 0, len(view)
            while pos < end:
                if buf or end - pos < size:
                    take = min(size - len(buf), end - pos)
                    buf += view[pos : pos + take]
                    pos += take
                    if len(buf) < size:
                        continue
                    full: bytes | bytearray | memoryview = buf
                    buf = bytearray()
                else:
                    full = view[pos : pos + size]
                    pos += size
                if held is not None:
                    yield self._seal(held, final=False)
                held = full
        if buf:
            if held is not None:
                yield self._seal(held, final=False)
            yield self._seal(buf, final=True)
        else:
            yield self._seal(held if held is not None else b"", final=True)


__all__ = [
    "BODY_MAGIC",
    "BODY_PREFIX_LEN",
    "DEK_LEN",
    "FORMAT_VERSION",
    "HEADER_FIXED_LEN",
    "HEADER_MAGIC",
    "MAX_CHUNKS",
    "MAX_CHUNK_SIZE",
    "MAX_METADATA_BYTES",
    "MIN_CHUNK_SIZE",
    "OBJECT_ID_LEN",
    "SUITE",
    "TAG_LEN",
    "WRAPPED_KEY_LEN",
    "ChunkCipher",
    "ChunkEncryptor",
    "Header",
    "MalformedHeader",
    "body_length",
    "body_prefix",
    "canonical_metadata",
    "check_chunk_size",
    "chunk_count",
    "parse_body_prefix",
    "record_offset",
]
