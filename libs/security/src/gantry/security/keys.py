"""Ed25519 key material: the signing key a service holds and the public keys it trusts.

A :class:`SigningKey` signs tokens and events; a :class:`TrustStore` maps key ids (``kid``) to
public keys and verifies signatures, raising :class:`gantry.core.Unauthenticated` on failure.
Private keys live in PEM (PKCS#8) files readable by their owner only (mode 0600); public keys
are shared as small JSON files (``<kid>.pub``) holding the kid and the raw key in base64.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import json
import os
import secrets
import stat
from collections.abc import Iterator, Mapping
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from gantry.core import ConfigError, InvalidInput, Unauthenticated

PUBLIC_KEY_SUFFIX = ".pub"
_RAW_KEY_LEN = 32


def key_fingerprint(public_key_bytes: bytes) -> str:
    """A stable key id for a raw public key: the first 16 hex chars of its SHA-256."""
    return hashlib.sha256(public_key_bytes).hexdigest()[:16]


class SigningKey:
    """An Ed25519 private key with its key id; signs bytes and verifies its own signatures."""

    __slots__ = ("_private", "_public", "_public_raw", "kid")

    def __init__(self, private_key: Ed25519PrivateKey, kid: str | None = None) -> None:
        self._private = private_key
        self._public = private_key.public_key()
        self._public_raw = self._public.public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        self.kid: str = kid if kid else key_fingerprint(self._public_raw)

    @classmethod
    def generate(cls, kid: str | None = None) -> SigningKey:
        """A fresh random key; ``kid`` defaults to the key's fingerprint."""
        return cls(Ed25519PrivateKey.generate(), kid)

    @classmethod
    def from_pem(cls, pem: bytes, kid: str | None = None, *, source: str = "<pem>") -> SigningKey:
        """Load an unencrypted PKCS#8 PEM Ed25519 key, or raise :class:`ConfigError`."""
        try:
            key = serialization.load_pem_private_key(pem, password=None)
        except (ValueError, TypeError) as exc:
            raise ConfigError(
                f"{source} is not an unencrypted PEM private key ({exc})",
                hint="delete it to have a new key generated, or restore the original key file",
            ) from None
        if not isinstance(key, Ed25519PrivateKey):
            raise ConfigError(
                f"{source} holds a {type(key).__name__}, not an Ed25519 key",
                hint="Gantry signs with Ed25519 only; delete the file to have a new key generated",
            )
        return cls(key, kid)

    @property
    def private_key(self) -> Ed25519PrivateKey:
        """The underlying ``cryptography`` private key (for JWT signing)."""
        return self._private

    @property
    def public_key(self) -> Ed25519PublicKey:
        """The matching ``cryptography`` public key."""
        return self._public

    def public_key_bytes(self) -> bytes:
        """The raw 32-byte public key."""
        return self._public_raw

    def sign(self, data: bytes) -> bytes:
        """The 64-byte Ed25519 signature of ``data``."""
        return self._private.sign(data)

    def verify(self, data: bytes, signature: bytes) -> bool:
        """True when ``signature`` is this key's signature of ``data``."""
        try:
            self._public.verify(signature, data)
        except InvalidSignature:
            return False
        return True

    def to_pem(self) -> bytes:
        """The private key as unencrypted PKCS#8 PEM (keep it secret)."""
        return self._private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    def __repr__(self) -> str:
        return f"SigningKey(kid={self.kid!r})"


def load_or_create_signing_key(path: Path, kid: str | None = None) -> SigningKey:
    """Load the PEM key at ``path``, or create one there (mode 0600) if there is none.

    Parent directories are created (mode 0700). An existing file readable or writable by
    group or others is refused with :class:`ConfigError` asking for ``chmod 600``. The file
    appears complete or not at all: it is written to a private temporary file and linked into
    place, so concurrent callers all end up with the same key.
    """
    path = Path(path)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        key = SigningKey.generate(kid)
        with contextlib.suppress(FileExistsError):
            _create_private_file(path, key.to_pem())
            return key
    return _load_key_file(path, kid)


def _create_private_file(path: Path, content: bytes) -> None:
    """Write ``content`` to ``path`` (mode 0600); FileExistsError if ``path`` already exists.

    The content goes to a private temporary file first, which is then hard-linked into place,
    so readers never see a half-written key. Where hard links are not supported the file is
    created in place, still with O_CREAT|O_EXCL and mode 0600.
    """
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    _write_exclusive(tmp, content)
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise
    except OSError:
        _write_exclusive(path, content)
    finally:
        tmp.unlink(missing_ok=True)


def _write_exclusive(path: Path, content: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(content)
        fh.flush()
        os.fsync(fh.fileno())


def _load_key_file(path: Path, kid: str | None) -> SigningKey:
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            raise ConfigError(
                f"private key {path} has permissions {mode:04o}; other users could read it",
                hint=f"run `chmod 600 {path}`",
            )
        pem = path.read_bytes()
    except OSError as exc:
        raise ConfigError(
            f"cannot read private key {path}: {exc.strerror}",
            hint="check the path and that this user owns the file",
        ) from None
    return SigningKey.from_pem(pem, kid, source=str(path))


def _public_key_from_bytes(raw: bytes, *, what: str) -> Ed25519PublicKey:
    if len(raw) != _RAW_KEY_LEN:
        raise InvalidInput(
            f"{what}: an Ed25519 public key is {_RAW_KEY_LEN} bytes, got {len(raw)}",
            hint="pass SigningKey.public_key_bytes() (the raw key, not PEM or DER)",
        )
    return Ed25519PublicKey.from_public_bytes(raw)


class TrustStore:
    """The public keys a process trusts, by key id; verifies signatures made with them.

    Satisfies the events library's verifier protocol:
    ``verify(kid, data, signature) -> None`` raising :class:`Unauthenticated`.
    """

    __slots__ = ("_keys", "_raw")

    def __init__(self, keys: Mapping[str, bytes] | None = None) -> None:
        self._keys: dict[str, Ed25519PublicKey] = {}
        self._raw: dict[str, bytes] = {}
        for kid, raw in (keys or {}).items():
            self.add(kid, raw)

    def add(self, kid: str, public_key_bytes: bytes) -> None:
        """Trust ``public_key_bytes`` (raw 32 bytes) under ``kid``.

        Re-adding the same key is a no-op; binding a *different* key to a known kid raises
        :class:`InvalidInput` (a kid always names one key).
        """
        if not kid:
            raise InvalidInput("a trusted key needs a non-empty key id")
        public = _public_key_from_bytes(public_key_bytes, what=f"key {kid!r}")
        existing = self._raw.get(kid)
        if existing is not None and existing != public_key_bytes:
            raise InvalidInput(
                f"key id {kid!r} is already bound to a different public key",
                hint="give the new key its own kid (the default fingerprint kid is unique)",
            )
        self._keys[kid] = public
        self._raw[kid] = bytes(public_key_bytes)

    def get(self, kid: str) -> Ed25519PublicKey | None:
        """The public key trusted under ``kid``, or None."""
        return self._keys.get(kid)

    def public_key_bytes(self, kid: str) -> bytes | None:
        """The raw public key trusted under ``kid``, or None."""
        return self._raw.get(kid)

    def kids(self) -> list[str]:
        """Every trusted key id, sorted."""
        return sorted(self._keys)

    def __contains__(self, kid: object) -> bool:
        return kid in self._keys

    def __len__(self) -> int:
        return len(self._keys)

    def __iter__(self) -> Iterator[str]:
        return iter(self.kids())

    def verify(self, kid: str, data: bytes, signature: bytes) -> None:
        """Return if ``signature`` is ``kid``'s signature of ``data``, else raise Unauthenticated.

        The message says whether the key id is unknown or the signature is bad.
        """
        public = self._keys.get(kid)
        if public is None:
            raise Unauthenticated(
                f"unknown key id {kid!r}: no trusted public key has this id",
                hint="add the signer's .pub file to this service's trusted keys directory",
            )
        try:
            public.verify(signature, data)
        except InvalidSignature:
            raise Unauthenticated(
                f"bad signature for key id {kid!r}: the data was altered after signing "
                "or was signed by a different key"
            ) from None

    @classmethod
    def load_dir(cls, path: Path) -> TrustStore:
        """Trust every ``*.pub`` file in ``path`` (none if the directory does not exist).

        A malformed file raises :class:`ConfigError` naming the file.
        """
        store = cls()
        path = Path(path)
        if not path.is_dir():
            return store
        for file in sorted(path.glob(f"*{PUBLIC_KEY_SUFFIX}")):
            kid, raw = _read_public_key_file(file)
            try:
                store.add(kid, raw)
            except InvalidInput as exc:
                raise ConfigError(f"{file}: {exc.message}", hint=exc.hint) from None
        return store

    def save_dir(self, path: Path) -> list[Path]:
        """Write one ``<kid>.pub`` file per trusted key into ``path``; return the files."""
        return [
            _write_public_key_file(Path(path), kid, raw) for kid, raw in sorted(self._raw.items())
        ]


def write_public_key(directory: Path, key: SigningKey) -> Path:
    """Write ``key``'s public half as ``<directory>/<kid>.pub`` and return the path."""
    return _write_public_key_file(Path(directory), key.kid, key.public_key_bytes())


def _write_public_key_file(directory: Path, kid: str, raw: bytes) -> Path:
    if not kid or "/" in kid or "\\" in kid or kid.startswith("."):
        raise InvalidInput(
            f"key id {kid!r} cannot be used as a file name",
            hint="use letters, digits, '-' and '_' in key ids",
        )
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"{kid}{PUBLIC_KEY_SUFFIX}"
    body = {"kid": kid, "public_key": base64.b64encode(raw).decode("ascii")}
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(8)}.tmp")
    tmp.write_text(json.dumps(body, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, target)
    return target


def _read_public_key_file(file: Path) -> tuple[str, bytes]:
    expected = 'expected JSON {"kid": "...", "public_key": "<base64 raw Ed25519 key>"}'
    try:
        body = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read public key file {file}: {exc}", hint=expected) from None
    if not isinstance(body, dict):
        raise ConfigError(f"public key file {file} is not a JSON object", hint=expected)
    kid, encoded = body.get("kid"), body.get("public_key")
    if not isinstance(kid, str) or not kid or not isinstance(encoded, str):
        raise ConfigError(f"public key file {file} lacks 'kid' or 'public_key'", hint=expected)
    try:
        raw = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError(
            f"public key file {file}: 'public_key' is not base64", hint=expected
        ) from None
    return kid, raw


__all__ = [
    "PUBLIC_KEY_SUFFIX",
    "SigningKey",
    "TrustStore",
    "key_fingerprint",
    "load_or_create_signing_key",
    "write_public_key",
]
