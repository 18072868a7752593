"""ObjectStore behaviour, identical on every backend: round trips, ranges, listing, deleting,
streaming writes with bounded memory, aborted writes, and name rules."""

from __future__ import annotations

import hashlib
import io
import os
import tracemalloc
from typing import Any

import pytest

from gantry.core import InvalidInput
from gantry.storage import (
    BackendUnavailable,
    InvalidObjectName,
    LocalBackend,
    MemoryBackend,
    ObjectNotFound,
    ObjectStore,
)
from gantry.storage.format import TAG_LEN, body_length, chunk_count
from gantry.storage.naming import body_name

CHUNK = 64 * 1024
SIZES = [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK, 3 * CHUNK + 5]


@pytest.mark.parametrize("size", SIZES)
def test_round_trip(store: ObjectStore, blobs: Any, make_data: Any, size: int) -> None:
    data = make_data(size, seed=size)
    info = store.put("data/object.bin", data)
    assert info.size == size
    assert info.chunk_size == CHUNK
    assert len(info.object_id) == 32
    assert store.get("data/object.bin") == data
    assert store.stat("data/object.bin") == info
    # the body is exactly prefix + plaintext + one tag per chunk (one chunk when empty)
    body = blobs.read(blobs.body("data/object.bin"))
    assert len(body) == body_length(size, CHUNK) == 25 + size + chunk_count(size, CHUNK) * TAG_LEN
    if size >= 32:
        assert data[:32] not in body  # ciphertext only


def test_put_accepts_files_iterables_and_buffers(store: ObjectStore, make_data: Any) -> None:
    data = make_data(2 * CHUNK + 300, seed=7)
    pieces = [data[:10], data[10 : CHUNK + 7], b"", data[CHUNK + 7 :]]
    store.put("from/iterable", iter(pieces))
    store.put("from/file", io.BytesIO(data))
    store.put("from/bytearray", bytearray(data))
    store.put("from/memoryview", memoryview(data))
    for name in ("from/iterable", "from/file", "from/bytearray", "from/memoryview"):
        assert store.get(name) == data, name
    with pytest.raises(InvalidInput, match="not text"):
        store.put("from/text", "some text")  # type: ignore[arg-type]


def test_reader_yields_verified_chunks_and_reads_any_amount(
    store: ObjectStore, make_data: Any
) -> None:
    data = make_data(2 * CHUNK + 100, seed=3)
    store.put("r", data)
    with store.open("r") as reader:
        assert reader.info.size == len(data)
        chunks = list(reader)
    assert [len(c) for c in chunks] == [CHUNK, CHUNK, 100]
    assert b"".join(chunks) == data
    with store.open("r") as reader:
        assert reader.read(10) == data[:10]
        assert reader.read(CHUNK) == data[10 : CHUNK + 10]
        assert next(reader) == data[CHUNK + 10 : 2 * CHUNK]  # the rest of the current chunk
        assert reader.read() == data[2 * CHUNK :]
        assert reader.read(5) == b""


def test_writer_streams_a_large_object_with_bounded_memory(
    store: ObjectStore, make_data: Any
) -> None:
    block = make_data(1024 * 1024, seed=11)
    total_blocks = 64  # 64 MiB, written and read back without ever holding it whole
    digest = hashlib.sha256()
    tracemalloc.start()
    try:
        with store.writer("big/weights.bin", metadata={"kind": "weights"}) as writer:
            for i in range(total_blocks):
                piece = i.to_bytes(8, "big") + block[8:]
                digest.update(piece)
                writer.write(piece)
        _, peak_write = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        check = hashlib.sha256()
        with store.open("big/weights.bin") as reader:
            for chunk in reader:
                check.update(chunk)
        _, peak_read = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert writer.info is not None and writer.info.size == total_blocks * len(block)
    assert writer.info.metadata == {"kind": "weights"}
    assert check.digest() == digest.digest()
    if isinstance(store.backend, MemoryBackend):
        return  # that backend holds every blob in memory by design
    assert peak_write < 32 * 1024 * 1024, f"writer peaked at {peak_write / 2**20:.1f} MiB"
    assert peak_read < 16 * 1024 * 1024, f"reader peaked at {peak_read / 2**20:.1f} MiB"


@pytest.mark.parametrize(
    ("offset", "length"),
    [
        (0, 10),  # inside the first chunk
        (CHUNK - 5, 10),  # across the first boundary
        (CHUNK, CHUNK),  # exactly the second chunk
        (10, 3 * CHUNK),  # across every chunk
        (3 * CHUNK + 100 - 7, 7),  # the last bytes
        (3 * CHUNK + 90, 1000),  # runs past the end: clamped
        (3 * CHUNK + 100, 5),  # at the end: empty
        (10**9, 5),  # far past the end: empty
        (5, 0),  # empty range
    ],
)
def test_read_range(store: ObjectStore, make_data: Any, offset: int, length: int) -> None:
    data = make_data(3 * CHUNK + 100, seed=5)
    store.put("ranged", data)
    assert store.read_range("ranged", offset, length) == data[offset : offset + length]


def test_read_range_fetches_only_the_needed_chunks(store: ObjectStore, make_data: Any) -> None:
    data = make_data(8 * CHUNK, seed=9)
    store.put("ranged", data)
    calls: list[tuple[str, int, int]] = []
    real = store.backend.get_range

    def spy(name: str, offset: int, length: int) -> bytes:
        calls.append((name, offset, length))
        return real(name, offset, length)

    store.backend.get_range = spy  # type: ignore[method-assign]
    assert (
        store.read_range("ranged", 3 * CHUNK + 10, CHUNK) == data[3 * CHUNK + 10 : 4 * CHUNK + 10]
    )
    body_calls = [c for c in calls if c[0].startswith("_body/")]
    assert body_calls == [
        ("_body/" + body_calls[0][0][6:], 25 + 3 * (CHUNK + 16), 2 * (CHUNK + 16))
    ]


def test_read_range_rejects_negative_values(store: ObjectStore) -> None:
    store.put("x", b"abc")
    with pytest.raises(InvalidInput, match="offset >= 0"):
        store.read_range("x", -1, 2)


def test_metadata_round_trips_and_is_validated(store: ObjectStore) -> None:
    meta = {"content-type": "application/json", "ünïcode": "✓", "empty": ""}
    info = store.put("meta", b"{}", metadata=meta)
    assert info.metadata == meta
    assert store.stat("meta").metadata == meta
    with pytest.raises(InvalidInput, match="metadata"):
        store.put("meta2", b"", metadata={"n": 1})  # type: ignore[dict-item]
    with pytest.raises(InvalidInput, match="more than 65536"):
        store.put("meta3", b"", metadata={"big": "x" * 70_000})
    assert not store.exists("meta2")
    assert not store.exists("meta3")


def test_list_is_sorted_by_name_and_filtered_by_prefix(store: ObjectStore) -> None:
    for name in ["b/2", "a", "b/1", "a/b", "a.c", "a0", "c"]:
        store.put(name, name.encode())
    assert [i.name for i in store.list()] == ["a", "a.c", "a/b", "a0", "b/1", "b/2", "c"]
    assert [i.name for i in store.list("a")] == ["a", "a.c", "a/b", "a0"]
    assert [i.name for i in store.list("b/")] == ["b/1", "b/2"]
    assert list(store.names("b/")) == ["b/1", "b/2"]
    assert list(store.list("zzz")) == []
    assert [i.size for i in store.list("b/")] == [3, 3]
    with pytest.raises(InvalidObjectName):
        list(store.list("../"))


def test_an_object_and_a_deeper_one_can_share_a_prefix(store: ObjectStore) -> None:
    store.put("a", b"top")
    store.put("a/b", b"deeper")  # on a file system "a" and "a/" must not collide
    assert store.get("a") == b"top"
    assert store.get("a/b") == b"deeper"
    assert store.delete("a")
    assert store.get("a/b") == b"deeper"


def test_delete_is_idempotent_and_removes_both_blobs(store: ObjectStore, blobs: Any) -> None:
    store.put("gone", b"x" * 1000)
    store.put("kept", b"y")
    assert store.delete("gone") is True
    assert store.delete("gone") is False
    assert not store.exists("gone")
    with pytest.raises(ObjectNotFound, match="'gone' not found"):
        store.get("gone")
    with pytest.raises(ObjectNotFound):
        store.stat("gone")
    assert [b for b in blobs.all() if "gone" in b] == []
    assert store.get("kept") == b"y"


def test_overwrite_replaces_atomically_and_drops_the_old_body(
    store: ObjectStore, blobs: Any
) -> None:
    first = store.put("obj", b"first" * 1000)
    second = store.put("obj", b"second")
    assert first.object_id != second.object_id
    assert store.get("obj") == b"second"
    assert [b for b in blobs.all() if b.startswith("_body/")] == [
        body_name("obj", bytes.fromhex(second.object_id))
    ]


def test_abort_and_exceptions_leave_nothing_visible(store: ObjectStore, blobs: Any) -> None:
    writer = store.writer("aborted")
    writer.write(b"a" * (3 * CHUNK))
    writer.abort()
    with pytest.raises(RuntimeError, match="boom"), store.writer("raised") as w:
        w.write(b"b" * (2 * CHUNK + 1))
        raise RuntimeError("boom")
    assert not store.exists("aborted")
    assert not store.exists("raised")
    assert list(store.list()) == []
    assert blobs.all() == []


def test_aborting_a_replacement_keeps_the_previous_version(store: ObjectStore) -> None:
    store.put("model", b"v1")
    with pytest.raises(KeyError), store.writer("model") as w:
        w.write(b"v2" * CHUNK)
        raise KeyError("interrupted")
    assert store.get("model") == b"v1"


class FailingUploads:
    """Wraps a backend; every upload dies after ``after`` pieces, like a dropped connection."""

    def __init__(self, inner: Any, after: int) -> None:
        self.inner = inner
        self.after = after

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def put_stream(self, name: str, chunks: Any) -> int:
        def cut() -> Any:
            for i, chunk in enumerate(chunks):
                if i == self.after:
                    raise BackendUnavailable("test backend", "connection reset")
                yield chunk

        result: int = self.inner.put_stream(name, cut())
        return result


def test_a_failed_upload_surfaces_in_the_writer_and_leaves_nothing(
    store: ObjectStore, blobs: Any
) -> None:
    flaky = ObjectStore(FailingUploads(store.backend, after=3), store.keys, chunk_size=CHUNK)
    with pytest.raises(BackendUnavailable, match="connection reset"):
        with flaky.writer("doomed") as writer:
            for _ in range(20):
                writer.write(b"d" * CHUNK)
    with pytest.raises(BackendUnavailable):  # streamed pieces (bytes go in one body buffer)
        flaky.put("doomed", iter([b"e" * CHUNK] * 5))
    assert not store.exists("doomed")
    assert blobs.all() == []


def test_object_is_invisible_until_the_writer_closes(store: ObjectStore) -> None:
    writer = store.writer("pending")
    writer.write(b"z" * (2 * CHUNK))
    assert not store.exists("pending")
    assert list(store.names()) == []
    info = writer.close()
    assert store.exists("pending")
    assert writer.close() == info  # closing twice returns the same info
    with pytest.raises(InvalidInput.__mro__[1]):  # GantryError: writing after close
        writer.write(b"more")


def test_sweep_incomplete_removes_only_old_orphan_bodies(store: ObjectStore, blobs: Any) -> None:
    store.put("committed", b"c" * 100)
    orphan = body_name("crashed", b"\x01" * 16)  # a body whose header never got written
    stale = body_name("committed", b"\x02" * 16)  # a replaced body that was never removed
    blobs.write(orphan, b"ciphertext")
    blobs.write(stale, b"ciphertext")
    assert store.sweep_incomplete(older_than_s=3600) == 0  # too young: maybe still uploading
    assert store.sweep_incomplete(older_than_s=-60) == 2
    assert orphan not in blobs.all() and stale not in blobs.all()
    assert store.get("committed") == b"c" * 100


def test_sweep_incomplete_removes_temporary_files_of_crashed_local_writes(
    tmp_path: Any, keys: Any
) -> None:
    backend = LocalBackend(tmp_path / "objects")
    store = ObjectStore(backend, keys, chunk_size=CHUNK)
    store.put("a/b", b"kept")
    crashed = tmp_path / "objects" / "_body" / "a" / ".c~.1234.tmp"
    crashed.write_bytes(b"half a body")
    assert store.sweep_incomplete() == 0  # young: it may be a write in progress
    os.utime(crashed, (0, 0))
    assert store.sweep_incomplete() == 1
    assert not crashed.exists()
    assert store.get("a/b") == b"kept"


@pytest.mark.parametrize(
    "name",
    [
        "../escape",
        "a/../../etc/passwd",
        "/absolute",
        "a\\b",
        "a//b",
        "trailing/",
        "",
        ".",
        "a/./b",
        "_head/x",
        "_body/x",
        "_anything",
        "spaces here",
        "ünïcode",
        "x" * 1025,
    ],
)
def test_bad_names_are_refused_before_touching_the_backend(
    store: ObjectStore, blobs: Any, name: str
) -> None:
    for call in (
        lambda: store.put(name, b"x"),
        lambda: store.get(name),
        lambda: store.stat(name),
        lambda: store.delete(name),
        lambda: store.writer(name),
    ):
        with pytest.raises(InvalidObjectName) as err:
            call()
        assert err.value.grpc_code == "INVALID_ARGUMENT"
        assert "A-Z a-z 0-9" in str(err.value)  # the hint says what is allowed
    assert blobs.all() == []


def test_the_longest_allowed_name_works(store: ObjectStore) -> None:
    name = "/".join(["d" * 200] * 5)[:1024].rstrip("/")
    store.put(name, b"ok")
    assert store.get(name) == b"ok"


def test_readall_is_one_verified_buffer_and_only_from_the_start(store: ObjectStore) -> None:
    data = bytes(range(256)) * (3 * CHUNK // 256 + 7)
    store.put("whole", data)
    with store.open("whole") as reader:
        assert reader.readall() == data
    with store.open("whole") as reader:
        reader.read(10)
        with pytest.raises(InvalidInput, match="after reading"):
            reader.readall()
