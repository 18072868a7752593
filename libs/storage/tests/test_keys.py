"""The key ring: LocalKeyFile permissions, wrap/unwrap, rotation, retirement, wrap counting, and
rotation of a whole store (headers rewritten, bodies untouched)."""

from __future__ import annotations

import json
import stat
import threading
from pathlib import Path
from typing import Any

import pytest

from gantry.core import ConfigError, Conflict, IntegrityError, InvalidInput
from gantry.storage import (
    KeyManager,
    KeyRingChanged,
    KeyUnavailable,
    KeyUsageExceeded,
    LocalKeyFile,
    ObjectStore,
)

DEK = bytes(range(32))


def test_key_file_is_created_on_first_use_with_mode_0600(tmp_path: Path) -> None:
    path = tmp_path / "keys" / "ring.json"
    assert not path.exists()
    manager = KeyManager(LocalKeyFile(path))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert manager.active_version == 1
    [v1] = manager.versions()
    assert (v1.version, v1.state, v1.wraps) == (1, "active", 0)
    doc = json.loads(path.read_text())
    assert doc["format"] == "gantry-storage-keyring/1" and len(doc["keys"]) == 1


def test_a_key_file_readable_by_others_is_refused_with_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "ring.json"
    KeyManager(LocalKeyFile(path))
    path.chmod(0o640)
    with pytest.raises(ConfigError) as err:
        KeyManager(LocalKeyFile(path))
    assert f"chmod 600 {path}" in str(err.value)
    assert "640" in err.value.message


def test_wrap_and_unwrap_bind_the_aad(keys: KeyManager) -> None:
    version, wrapped = keys.wrap(DEK, b"header bytes")
    assert version == 1 and len(wrapped) == 12 + 32 + 16
    assert keys.unwrap(version, wrapped, b"header bytes") == DEK
    with pytest.raises(IntegrityError, match="does not authenticate"):
        keys.unwrap(version, wrapped, b"header bytez")
    assert keys.wrap(DEK, b"x")[1] != keys.wrap(DEK, b"x")[1]  # random nonces


def test_rotate_keeps_old_versions_for_decryption_and_retire_destroys_them(
    keys: KeyManager, key_path: Path
) -> None:
    _, old = keys.wrap(DEK, b"a")
    assert keys.rotate() == 2
    assert keys.active_version == 2
    assert [(v.version, v.state) for v in keys.versions()] == [(1, "decrypt-only"), (2, "active")]
    assert keys.wrap(DEK, b"a")[0] == 2
    assert keys.unwrap(1, old, b"a") == DEK
    with pytest.raises(Conflict, match="active version and cannot be retired"):
        keys.retire(2)
    keys.retire(1)
    keys.retire(1)  # idempotent
    assert [(v.version, v.state) for v in keys.versions()] == [(1, "retired"), (2, "active")]
    with pytest.raises(KeyUnavailable, match="version 1, which was retired"):
        keys.unwrap(1, old, b"a")
    # the key material is gone from the file, not just marked
    doc = json.loads(key_path.read_text())
    assert [("key" in k) for k in doc["keys"]] == [False, True]
    with pytest.raises(InvalidInput, match="no KEK version 7"):
        keys.retire(7)


def test_an_unknown_version_is_unavailable(keys: KeyManager) -> None:
    _, wrapped = keys.wrap(DEK, b"")
    with pytest.raises(KeyUnavailable, match="does not have"):
        keys.unwrap(5, wrapped, b"")


def test_wrap_counts_persist_across_reopen_and_stop_at_the_limit(key_path: Path) -> None:
    first = KeyManager(LocalKeyFile(key_path), wrap_limit=10, reserve_block=4)
    for _ in range(3):
        first.wrap(DEK, b"")
    assert first.versions()[0].wraps == 4  # a whole block is reserved before it is used
    # the process "crashes" here: its unused reservation is never handed back
    second = KeyManager(LocalKeyFile(key_path), wrap_limit=10, reserve_block=4)
    for _ in range(6):  # 4 + 6 = 10: the persisted count never under-counts
        second.wrap(DEK, b"")
    with pytest.raises(KeyUsageExceeded) as err:
        second.wrap(DEK, b"")
    assert "reached its wrap limit of 10" in str(err.value)
    assert "rotate" in str(err.value)
    assert KeyManager(LocalKeyFile(key_path), wrap_limit=10).versions()[0].wraps == 10
    second.rotate()
    assert second.wrap(DEK, b"")[0] == 2


def test_close_hands_back_the_unused_reservation(key_path: Path) -> None:
    with KeyManager(LocalKeyFile(key_path), reserve_block=100) as manager:
        for _ in range(3):
            manager.wrap(DEK, b"")
        assert manager.versions()[0].wraps == 100
    assert KeyManager(LocalKeyFile(key_path)).versions()[0].wraps == 3


def test_managers_sharing_a_file_see_each_others_changes(key_path: Path) -> None:
    a = KeyManager(LocalKeyFile(key_path), reserve_block=2)
    b = KeyManager(LocalKeyFile(key_path), reserve_block=2)
    assert a.active_version == b.active_version == 1
    a.rotate()
    version, wrapped = a.wrap(DEK, b"x")
    assert b.unwrap(version, wrapped, b"x") == DEK  # b reloads on an unknown version
    for _ in range(3):
        b.wrap(DEK, b"")
    assert b.active_version == 2  # b picked up the rotation when it reserved a new block
    assert KeyManager(LocalKeyFile(key_path)).versions()[1].wraps == 2 + 4


def test_concurrent_first_use_creates_one_ring(tmp_path: Path) -> None:
    path = tmp_path / "ring.json"
    managers: list[KeyManager] = []
    start = threading.Barrier(4)

    def create() -> None:
        start.wait()
        managers.append(KeyManager(LocalKeyFile(path)))

    threads = [threading.Thread(target=create) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    version, wrapped = managers[0].wrap(DEK, b"")
    assert all(m.unwrap(version, wrapped, b"") == DEK for m in managers)


def test_a_stale_save_is_refused(key_path: Path) -> None:
    source = LocalKeyFile(key_path)
    KeyManager(source)
    state = source.load()
    assert state is not None
    source.save(state)
    with pytest.raises(KeyRingChanged, match="changed since it was loaded"):
        source.save(state)


def test_rotation_rewraps_headers_only(store: ObjectStore, blobs: Any, make_data: Any) -> None:
    names = [f"obj/{i}" for i in range(3)]
    for i, name in enumerate(names):
        store.put(name, make_data(70_000, seed=i), metadata={"i": str(i)})
    bodies = {n: blobs.read(blobs.body(n)) for n in names}
    heads = {n: blobs.read(blobs.head(n)) for n in names}
    assert store.keys.rotate() == 2
    seen: list[int] = []
    assert store.rewrap(progress=seen.append) == 3
    assert seen == [1, 2, 3]
    for i, name in enumerate(names):
        assert blobs.read(blobs.body(name)) == bodies[name]  # no data re-encrypted
        assert blobs.read(blobs.head(name)) != heads[name]
        info = store.stat(name)
        assert (info.kek_version, info.metadata) == (2, {"i": str(i)})
        assert store.get(name) == make_data(70_000, seed=i)
    assert store.rewrap() == 0  # nothing left on an old version
    store.keys.retire(1)
    assert store.get(names[0]) == make_data(70_000, seed=0)


def test_old_objects_read_after_rotation_until_their_version_is_retired(
    store: ObjectStore,
) -> None:
    store.put("old", b"wrapped by version 1")
    store.keys.rotate()
    store.put("new", b"wrapped by version 2")
    assert store.get("old") == b"wrapped by version 1"
    store.keys.retire(1)
    with pytest.raises(KeyUnavailable) as err:
        store.get("old")
    message = str(err.value)
    assert "object 'old' is wrapped by KEK version 1, which was retired" in message
    assert "restore the key ring" in message and "re-wrap" in message
    assert err.value.name == "old" and err.value.version == 1
    assert store.get("new") == b"wrapped by version 2"
    with pytest.raises(KeyUnavailable):
        store.rewrap()  # cannot re-wrap what no key can unwrap


def test_a_full_key_stops_writes_with_a_rotate_hint(backend: Any, key_path: Path) -> None:
    store = ObjectStore(backend, KeyManager(LocalKeyFile(key_path), wrap_limit=2), chunk_size=65536)
    store.put("a", b"1")
    store.put("b", b"2")
    with pytest.raises(KeyUsageExceeded, match="rotate"):
        store.put("c", b"3")
    assert not store.exists("c")
    assert list(store.backend.list("_body/c")) == []
    store.keys.rotate()
    store.put("c", b"3")
    assert store.get("c") == b"3"


def test_invalid_limits_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="wrap_limit"):
        KeyManager(LocalKeyFile(tmp_path / "r.json"), wrap_limit=0)
    assert not (tmp_path / "r.json").exists()
