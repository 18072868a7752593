"""Ed25519 key files, signing, and the trust store."""

from __future__ import annotations

import base64
import json
import os
import stat
from pathlib import Path

import pytest

from gantry.core import ConfigError, InvalidInput, Unauthenticated
from gantry.security import (
    SigningKey,
    TrustStore,
    key_fingerprint,
    load_or_create_signing_key,
    write_public_key,
)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_sign_and_verify_round_trip() -> None:
    key = SigningKey.generate("k1")
    signature = key.sign(b"hello")
    assert key.kid == "k1"
    assert len(key.public_key_bytes()) == 32
    assert len(signature) == 64
    assert key.verify(b"hello", signature)
    assert not key.verify(b"hellO", signature)
    assert not SigningKey.generate().verify(b"hello", signature)


def test_default_kid_is_the_public_key_fingerprint() -> None:
    key = SigningKey.generate()
    assert key.kid == key_fingerprint(key.public_key_bytes())
    assert len(key.kid) == 16
    assert all(c in "0123456789abcdef" for c in key.kid)


def test_key_file_is_created_with_mode_0600_and_reloaded(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "dir" / "signing.pem"
    created = load_or_create_signing_key(path)
    assert path.exists()
    assert _mode(path) == 0o600
    assert path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    assert not [p for p in path.parent.iterdir() if p.name != "signing.pem"], "temp file left"

    loaded = load_or_create_signing_key(path)
    assert loaded.public_key_bytes() == created.public_key_bytes()
    assert loaded.kid == created.kid  # stable fingerprint kid across restarts
    assert loaded.verify(b"x", created.sign(b"x"))


def test_key_file_creation_ignores_a_permissive_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        load_or_create_signing_key(tmp_path / "k.pem")
    finally:
        os.umask(old)
    assert _mode(tmp_path / "k.pem") == 0o600


def test_explicit_kid_is_used(tmp_path: Path) -> None:
    key = load_or_create_signing_key(tmp_path / "k.pem", kid="svc-audit")
    assert key.kid == "svc-audit"
    assert load_or_create_signing_key(tmp_path / "k.pem", kid="svc-audit").kid == "svc-audit"


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604])
def test_key_file_readable_by_others_is_refused(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "signing.pem"
    load_or_create_signing_key(path)
    path.chmod(mode)
    with pytest.raises(ConfigError, match="chmod 600") as info:
        load_or_create_signing_key(path)
    assert str(path) in str(info.value)


def test_garbage_key_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "signing.pem"
    path.write_bytes(b"not a key")
    path.chmod(0o600)
    with pytest.raises(ConfigError, match="not an unencrypted PEM private key"):
        load_or_create_signing_key(path)


def test_trust_store_verifies_and_names_the_problem() -> None:
    key = SigningKey.generate("k1")
    store = TrustStore({"k1": key.public_key_bytes()})
    store.verify("k1", b"data", key.sign(b"data"))  # no exception

    with pytest.raises(Unauthenticated, match="unknown key id 'k2'"):
        store.verify("k2", b"data", key.sign(b"data"))
    with pytest.raises(Unauthenticated, match="bad signature"):
        store.verify("k1", b"data!", key.sign(b"data"))
    with pytest.raises(Unauthenticated, match="bad signature"):
        store.verify("k1", b"data", SigningKey.generate().sign(b"data"))


def test_trust_store_refuses_bad_keys_and_kid_rebinding() -> None:
    store = TrustStore()
    with pytest.raises(InvalidInput, match="32 bytes"):
        store.add("k", b"short")
    key = SigningKey.generate("k")
    store.add("k", key.public_key_bytes())
    store.add("k", key.public_key_bytes())  # idempotent
    with pytest.raises(InvalidInput, match="already bound"):
        store.add("k", SigningKey.generate().public_key_bytes())
    assert store.get("k") is not None
    assert store.get("nope") is None
    assert "k" in store
    assert len(store) == 1


def test_public_key_files_round_trip(tmp_path: Path) -> None:
    a, b = SigningKey.generate("alpha"), SigningKey.generate()
    path = write_public_key(tmp_path / "trusted", a)
    assert path == tmp_path / "trusted" / "alpha.pub"
    body = json.loads(path.read_text())
    assert body == {"kid": "alpha", "public_key": base64.b64encode(a.public_key_bytes()).decode()}
    write_public_key(tmp_path / "trusted", b)

    store = TrustStore.load_dir(tmp_path / "trusted")
    assert store.kids() == sorted(["alpha", b.kid])
    store.verify(b.kid, b"m", b.sign(b"m"))

    copy_dir = tmp_path / "copy"
    written = store.save_dir(copy_dir)
    assert len(written) == 2
    assert TrustStore.load_dir(copy_dir).public_key_bytes("alpha") == a.public_key_bytes()


def test_load_dir_of_missing_directory_is_empty(tmp_path: Path) -> None:
    assert len(TrustStore.load_dir(tmp_path / "absent")) == 0


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "cannot read public key file"),
        ("[1, 2]", "is not a JSON object"),
        ('{"kid": "x"}', "lacks 'kid' or 'public_key'"),
        ('{"kid": "x", "public_key": "***"}', "is not base64"),
        ('{"kid": "x", "public_key": "AAAA"}', "32 bytes"),
    ],
)
def test_malformed_public_key_file_names_the_file(
    tmp_path: Path, content: str, message: str
) -> None:
    (tmp_path / "bad.pub").write_text(content)
    with pytest.raises(ConfigError, match=message) as info:
        TrustStore.load_dir(tmp_path)
    assert "bad.pub" in str(info.value)


def test_kid_that_is_not_a_file_name_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="cannot be used as a file name"):
        write_public_key(tmp_path, SigningKey.generate("../evil"))
