"""Damage to stored bytes is always detected, and no plaintext from the damaged chunk onward is
returned: flipped bytes, truncation, reordering, splicing, swapped headers (every backend)."""

from __future__ import annotations

from typing import Any

import pytest

from gantry.core import IntegrityError
from gantry.storage import KeyUnavailable, ObjectStore, TamperedObject
from gantry.storage.format import record_offset

CHUNK = 64 * 1024
SIZE = 3 * CHUNK + 100  # four chunks, the last one short


def collect(store: ObjectStore, name: str) -> tuple[list[bytes], BaseException | None]:
    """Chunks the reader yielded before it raised, and what it raised."""
    got: list[bytes] = []
    try:
        with store.open(name) as reader:
            for chunk in reader:
                got.append(chunk)
    except Exception as exc:
        return got, exc
    return got, None


@pytest.fixture
def original(store: ObjectStore, make_data: Any) -> bytes:
    data: bytes = make_data(SIZE, seed=42)
    store.put("victim", data, metadata={"owner": "team-a"})
    return data


def chunks_of(data: bytes) -> list[bytes]:
    return [data[i : i + CHUNK] for i in range(0, len(data), CHUNK)]


@pytest.mark.parametrize(
    ("offset", "bad_chunk"),
    [
        (0, 0),  # body magic
        (5, 0),  # object id in the body prefix
        (24, 0),  # chunk size in the body prefix
        (record_offset(0, CHUNK), 0),  # first ciphertext byte
        (record_offset(1, CHUNK) + 1000, 1),  # middle of chunk 1
        (record_offset(2, CHUNK) + CHUNK + 5, 2),  # inside chunk 2's tag
        (record_offset(3, CHUNK) + 50, 3),  # the short final chunk
        (-1, 3),  # the very last byte
    ],
)
def test_a_flipped_body_byte_stops_the_reader_at_that_chunk(
    store: ObjectStore, blobs: Any, original: bytes, offset: int, bad_chunk: int
) -> None:
    body = blobs.body("victim")
    blobs.flip(body, offset if offset >= 0 else len(blobs.read(body)) + offset)
    got, error = collect(store, "victim")
    assert isinstance(error, TamperedObject)
    assert isinstance(error, IntegrityError) and error.grpc_code == "DATA_LOSS"
    assert error.name == "victim" and error.chunk == bad_chunk
    assert f"object 'victim' failed verification at chunk {bad_chunk}" in str(error)
    assert got == chunks_of(original)[:bad_chunk]  # everything before, nothing after
    with pytest.raises(TamperedObject):
        store.get("victim")


@pytest.mark.parametrize(
    "offset",
    [
        0,  # magic
        4,  # format version
        6,  # object id
        28,  # chunk size
        36,  # plaintext size (low byte)
        44,  # chunk count
        52,  # created_ms
        56,  # metadata length
        60,  # metadata JSON
        -59,  # wrap nonce
        -20,  # wrapped DEK
        -1,  # wrap tag
    ],
)
def test_a_flipped_header_byte_is_detected_before_any_data(
    store: ObjectStore, blobs: Any, original: bytes, offset: int
) -> None:
    head = blobs.head("victim")
    blobs.flip(head, offset if offset >= 0 else len(blobs.read(head)) + offset)
    with pytest.raises(TamperedObject) as err:
        store.open("victim")
    assert err.value.chunk is None
    assert "its header" in str(err.value)
    for call in (lambda: store.stat("victim"), lambda: store.read_range("victim", 0, 10)):
        with pytest.raises(TamperedObject):
            call()


def test_a_changed_kek_version_fails_whichever_version_it_names(
    store: ObjectStore, blobs: Any, original: bytes
) -> None:
    store.keys.rotate()  # versions 1 and 2 now exist; "victim" is wrapped by 1
    head = blobs.head("victim")
    raw = bytearray(blobs.read(head))
    raw[24] = 2  # an existing version: its key does not unwrap
    blobs.write(head, bytes(raw))
    with pytest.raises(TamperedObject):
        store.get("victim")
    raw[24] = 9  # a version the ring never had
    blobs.write(head, bytes(raw))
    with pytest.raises(KeyUnavailable, match="version 9") as err:
        store.get("victim")
    assert "header is damaged" in str(err.value)


@pytest.mark.parametrize(
    ("cut", "bad_chunk"),
    [
        (record_offset(3, CHUNK), 3),  # the final chunk is missing entirely
        (record_offset(1, CHUNK) + 500, 1),  # cut inside chunk 1
        (10, 0),  # shorter than the prefix
        (0, 0),  # empty body
    ],
)
def test_truncation_is_detected(
    store: ObjectStore, blobs: Any, original: bytes, cut: int, bad_chunk: int
) -> None:
    body = blobs.body("victim")
    blobs.write(body, blobs.read(body)[:cut])
    got, error = collect(store, "victim")
    assert isinstance(error, TamperedObject) and error.chunk == bad_chunk
    assert got == chunks_of(original)[:bad_chunk]
    if cut >= record_offset(1, CHUNK):
        with pytest.raises(TamperedObject, match="truncated"):
            store.read_range("victim", SIZE - 10, 10)


def test_appended_bytes_are_detected_before_the_last_chunk_is_returned(
    store: ObjectStore, blobs: Any, original: bytes
) -> None:
    body = blobs.body("victim")
    blobs.write(body, blobs.read(body) + b"\x00")
    got, error = collect(store, "victim")
    assert isinstance(error, TamperedObject) and error.chunk == 4
    assert "after its last chunk" in str(error)
    assert got == chunks_of(original)[:3]
    with pytest.raises(TamperedObject, match="after its last chunk"):
        store.read_range("victim", SIZE - 1, 1)
    assert store.read_range("victim", 0, 5) == original[:5]  # earlier chunks stay readable


def test_a_missing_body_is_reported_as_damage(
    store: ObjectStore, blobs: Any, original: bytes
) -> None:
    store.backend.delete(blobs.body("victim"))
    with pytest.raises(TamperedObject, match="body is missing"):
        store.get("victim")


def test_reordered_chunks_are_detected(store: ObjectStore, blobs: Any, original: bytes) -> None:
    body = blobs.body("victim")
    raw = blobs.read(body)
    r1, r2 = record_offset(1, CHUNK), record_offset(2, CHUNK)
    r3 = record_offset(3, CHUNK)
    blobs.write(body, raw[:r1] + raw[r2:r3] + raw[r1:r2] + raw[r3:])
    got, error = collect(store, "victim")
    assert isinstance(error, TamperedObject) and error.chunk == 1
    assert got == chunks_of(original)[:1]


def test_a_chunk_spliced_from_another_object_is_detected(
    store: ObjectStore, blobs: Any, original: bytes, make_data: Any
) -> None:
    store.put("other", make_data(SIZE, seed=43))
    victim, other = blobs.read(blobs.body("victim")), blobs.read(blobs.body("other"))
    r2, r3 = record_offset(2, CHUNK), record_offset(3, CHUNK)
    blobs.write(blobs.body("victim"), victim[:r2] + other[r2:r3] + victim[r3:])
    got, error = collect(store, "victim")
    assert isinstance(error, TamperedObject) and error.chunk == 2
    assert got == chunks_of(original)[:2]
    with pytest.raises(TamperedObject) as err:
        store.read_range("victim", 2 * CHUNK + 1, 10)
    assert err.value.chunk == 2
    assert store.read_range("victim", 10, 10) == original[10:20]


def test_swapped_headers_are_detected(
    store: ObjectStore, blobs: Any, original: bytes, make_data: Any
) -> None:
    store.put("other", make_data(SIZE, seed=44))
    a, b = blobs.read(blobs.head("victim")), blobs.read(blobs.head("other"))
    blobs.write(blobs.head("victim"), b)
    blobs.write(blobs.head("other"), a)
    for name in ("victim", "other"):
        with pytest.raises(TamperedObject) as err:
            store.get(name)
        assert err.value.chunk is None


def test_an_object_moved_whole_to_another_name_is_detected(
    store: ObjectStore, blobs: Any, original: bytes
) -> None:
    from gantry.storage.naming import body_name

    info = store.stat("victim")
    blobs.write(blobs.head("impostor"), blobs.read(blobs.head("victim")))
    object_id = bytes.fromhex(info.object_id)
    blobs.write(body_name("impostor", object_id), blobs.read(blobs.body("victim")))
    with pytest.raises(TamperedObject, match="'impostor'"):
        store.get("impostor")  # the name is bound into the wrapped key's AAD
