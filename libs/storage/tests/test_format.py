"""The format as docs/storage-format.md describes it, checked by an independent decoder written
from the document with nothing but ``struct`` and AES-GCM."""

from __future__ import annotations

import base64
import itertools
import json
import struct
from pathlib import Path

import pytest
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from gantry.core import InvalidInput
from gantry.storage import KeyManager, LocalKeyFile, MemoryBackend, ObjectStore
from gantry.storage.format import ChunkCipher, ChunkEncryptor, Header, MalformedHeader

CHUNK = 64 * 1024


def decode_by_the_document(name: str, head: bytes, body: bytes, kek: bytes) -> bytes:
    """Decrypt an object using only the layout in docs/storage-format.md."""
    magic, version, object_id, kek_version, chunk_size, size, chunks, created, meta_len = (
        struct.unpack(">4sB16sIIQQQI", head[:57])
    )
    assert (magic, version, kek_version) == (b"GTYH", 1, 1)
    assert len(head) == 57 + meta_len + 12 + 48
    wrap_nonce = head[57 + meta_len : 69 + meta_len]
    aad = head[: 57 + meta_len] + name.encode()
    dek = AESGCM(kek).decrypt(wrap_nonce, head[69 + meta_len :], aad)
    assert body[:25] == b"GTYB\x01" + object_id + struct.pack(">I", chunk_size)
    cipher = AESGCM(dek)
    out = []
    for i in range(chunks):
        final = i == chunks - 1
        start = 25 + i * (chunk_size + 16)
        length = (size - i * chunk_size if final else chunk_size) + 16
        nonce = b"\x00" * 4 + struct.pack(">Q", i)
        chunk_aad = b"GTY1" + object_id + struct.pack(">QB", i, final)
        out.append(cipher.decrypt(nonce, body[start : start + length], chunk_aad))
    assert 25 + sum(len(c) + 16 for c in out) == len(body)
    assert created > 1_600_000_000_000
    return b"".join(out)


def test_an_independent_decoder_reads_what_the_store_writes(tmp_path: Path) -> None:
    backend = MemoryBackend()
    store = ObjectStore(backend, KeyManager(LocalKeyFile(tmp_path / "k.json")), chunk_size=CHUNK)
    data = bytes(range(256)) * 1000  # 256,000 bytes: three full chunks and a short one
    store.put("doc/object", data, metadata={"b": "2", "a": "1"})
    blobs = backend.blobs()
    [body_blob] = [b for b in blobs if b.startswith("_body/doc/object.")]
    head = blobs["_head/doc/object"]
    kek = base64.b64decode(json.loads((tmp_path / "k.json").read_text())["keys"][0]["key"])
    assert decode_by_the_document("doc/object", head, blobs[body_blob], kek) == data
    assert head[57 : 57 + 17] == b'{"a":"1","b":"2"}'  # canonical JSON: sorted, no spaces
    assert body_blob == "_body/doc/object." + store.stat("doc/object").object_id


def test_the_final_flag_is_bound_into_each_chunk() -> None:
    cipher = ChunkCipher(b"k" * 32, b"i" * 16)
    record = cipher.seal(3, b"last chunk", final=True)
    assert cipher.open(3, record, final=True) == b"last chunk"
    with pytest.raises(InvalidTag):
        cipher.open(3, record, final=False)  # a truncated object's new "last" chunk
    with pytest.raises(InvalidTag):
        cipher.open(4, record, final=True)  # a moved chunk
    with pytest.raises(InvalidTag):
        ChunkCipher(b"k" * 32, b"j" * 16).open(3, record, final=True)  # another object


@pytest.mark.parametrize("pieces", [[b""], [b"a"], [b"x" * CHUNK], [b"x" * CHUNK, b"y"]])
def test_the_encryptor_marks_only_the_last_chunk_final(pieces: list[bytes]) -> None:
    cipher = ChunkCipher(b"k" * 32, b"i" * 16)
    encryptor = ChunkEncryptor(cipher, b"i" * 16, CHUNK)
    records = list(encryptor.body(pieces))[1:]
    assert encryptor.chunks == len(records) >= 1
    assert encryptor.size == sum(map(len, pieces))
    for i, record in enumerate(records):
        cipher.open(i, record, final=i == len(records) - 1)


def test_the_encryptor_accepts_pieces_of_any_size() -> None:
    cipher = ChunkCipher(b"k" * 32, b"i" * 16)
    data = bytes(range(251)) * 1000
    cuts = [0, 1, 7, CHUNK - 3, CHUNK + 5, 2 * CHUNK, 2 * CHUNK + 1, len(data)]
    pieces = [data[a:b] for a, b in itertools.pairwise(cuts)]
    records = list(ChunkEncryptor(cipher, b"i" * 16, CHUNK).body(pieces))[1:]
    plain = [cipher.open(i, r, final=i == len(records) - 1) for i, r in enumerate(records)]
    assert [len(p) for p in plain[:-1]] == [CHUNK] * (len(plain) - 1)
    assert b"".join(plain) == data


def test_header_decoding_rejects_inconsistent_fields() -> None:
    good = Header(b"i" * 16, 1, CHUNK, 10, 1, 0, b"{}", b"w" * 60).encode()
    assert Header.decode(good).size == 10
    wrong_count = Header(b"i" * 16, 1, CHUNK, 10, 2, 0, b"{}", b"w" * 60).encode()
    with pytest.raises(MalformedHeader, match="chunk count"):
        Header.decode(wrong_count)
    with pytest.raises(MalformedHeader, match="too short"):
        Header.decode(good[:50])
    with pytest.raises(MalformedHeader, match="fields say otherwise"):
        Header.decode(good + b"x")


@pytest.mark.parametrize("chunk_size", [1024, 65535, 1024 * 1024 + 1])
def test_chunk_sizes_outside_the_format_range_are_refused(tmp_path: Path, chunk_size: int) -> None:
    keys = KeyManager(LocalKeyFile(tmp_path / "k.json"))
    with pytest.raises(InvalidInput, match="65536 \\(64 KiB\\) to 1048576 \\(1 MiB\\)"):
        ObjectStore(MemoryBackend(), keys, chunk_size=chunk_size)


def test_whole_body_is_byte_for_byte_the_streamed_body() -> None:
    """The one-buffer path (objects put from memory) writes exactly the streamed format."""
    import os as _os

    from gantry.storage.format import ChunkCipher, ChunkEncryptor

    dek, oid = _os.urandom(32), _os.urandom(16)
    for size in (0, 1, 65536, 65537, 3 * 65536, 200_001):
        data = _os.urandom(size)
        streamed = ChunkEncryptor(ChunkCipher(dek, oid), oid, 65536)
        expected = b"".join(streamed.body([data]))
        whole = ChunkEncryptor(ChunkCipher(dek, oid), oid, 65536)
        assert bytes(whole.whole_body(data)) == expected, size
        assert (whole.chunks, whole.size) == (streamed.chunks, streamed.size)
