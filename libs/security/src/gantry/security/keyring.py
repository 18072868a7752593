"""A process's key files laid out under one directory, as ``gantry admin init`` creates them.

    <keys_dir>/
      issuer.pem              token-signing key (platform admins only)
      issuers/<kid>.pub       public keys trusted to sign identity TOKENS (issuers only)
      services/<name>.pem     each platform service's signing key, kid ``svc-<name>``
      accounts/<name>.pem     outside services' keys (service accounts), kid ``sa-<name>``
      trusted/<kid>.pub       public keys trusted to sign EVENTS (services and accounts)
      secrets/<name>.key      symmetric secrets (e.g. the audit log's row-seal key)

Trust is split by purpose: a service-account key can sign events, never a token or a tree
head. Tree heads are trusted only from the audit service's own key (``svc-audit``). Every
private file is mode 0600 and every directory holding one 0700.
"""

from __future__ import annotations

import contextlib
import secrets
import stat
from pathlib import Path

from gantry.core import ConfigError
from gantry.security.keys import (
    SigningKey,
    TrustStore,
    _create_private_file,
    load_or_create_signing_key,
    write_public_key,
)


class DirectoryTrustStore(TrustStore):
    """A trust store backed by a ``trusted/`` directory, re-read when an unknown kid shows up.

    New service accounts and rotated keys are picked up without a restart: the directory is
    re-read when its modification time changed since the last read.
    """

    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.directory = Path(directory)
        self._seen_mtime = -1
        self.reload()

    def _mtime(self) -> int:
        try:
            return self.directory.stat().st_mtime_ns
        except FileNotFoundError:
            return 0

    def reload(self) -> None:
        """Trust every key file in the directory now."""
        self._seen_mtime = self._mtime()
        fresh = TrustStore.load_dir(self.directory)
        for kid in fresh.kids():
            raw = fresh.public_key_bytes(kid)
            if raw is not None and kid not in self:
                self.add(kid, raw)

    def verify(self, kid: str, data: bytes, signature: bytes) -> None:
        """Verify, re-reading the directory first if ``kid`` is unknown."""
        if kid not in self and self._mtime() != self._seen_mtime:
            self.reload()
        super().verify(kid, data, signature)


def load_or_create_secret(path: Path, nbytes: int = 32) -> bytes:
    """A random secret kept in a 0600 file, created on first use."""
    path = Path(path)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):  # another process created it first
            _create_private_file(path, secrets.token_bytes(nbytes))
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise ConfigError(
            f"secret file {path} has mode {mode:o}; it must be readable by its owner only",
            hint=f"run: chmod 600 {path}",
        )
    data = path.read_bytes()
    if len(data) != nbytes:
        raise ConfigError(f"secret file {path} holds {len(data)} bytes, expected {nbytes}")
    return data


SERVICE_KID_PREFIX = "svc-"
ACCOUNT_KID_PREFIX = "sa-"
AUDIT_KID = "svc-audit"


def _private_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o700)
    return path


class Keyring:
    """Paths and loaders for the key directory."""

    def __init__(self, keys_dir: Path) -> None:
        self.root = Path(keys_dir)
        self.trusted_dir = self.root / "trusted"
        self.issuers_dir = self.root / "issuers"

    @property
    def issuer_path(self) -> Path:
        """The token-signing key file."""
        return self.root / "issuer.pem"

    def _signing_key(self, folder: str, name: str, kid: str) -> SigningKey:
        if not name or not name.replace("-", "").replace("_", "").isalnum():
            raise ConfigError(
                f"bad key name {name!r}", hint="use letters, digits, '-' and '_' only"
            )
        _private_dir(self.root)
        key = load_or_create_signing_key(_private_dir(self.root / folder) / f"{name}.pem", kid=kid)
        published = TrustStore.load_dir(self.trusted_dir).public_key_bytes(kid)
        if published != key.public_key_bytes():
            write_public_key(self.trusted_dir, key)  # first use, or the key was replaced
        return key

    def service_key(self, name: str) -> SigningKey:
        """The signing key of platform service ``name`` (kid ``svc-<name>``), created on first use.

        Its public half is trusted for events; a ``svc-`` key may sign events whose source
        is ``gantry/...``.
        """
        return self._signing_key("services", name, f"{SERVICE_KID_PREFIX}{name}")

    def account_key(self, name: str) -> SigningKey:
        """The signing key of outside service account ``name`` (kid ``sa-<name>``)."""
        return self._signing_key("accounts", name, f"{ACCOUNT_KID_PREFIX}{name}")

    def issuer(self, *, create: bool = False) -> SigningKey:
        """The token-signing key; created only when ``create`` (``gantry admin init``)."""
        if not create and not self.issuer_path.exists():
            raise ConfigError(
                f"no token-signing key at {self.issuer_path}",
                hint="run 'gantry admin init' first",
            )
        _private_dir(self.root)
        key = load_or_create_signing_key(self.issuer_path)
        if not (self.issuers_dir / f"{key.kid}.pub").exists():
            write_public_key(self.issuers_dir, key)
        return key

    def secret(self, name: str) -> bytes:
        """A 32-byte secret (created on first use)."""
        return load_or_create_secret(_private_dir(self.root / "secrets") / f"{name}.key")

    def has_secret(self, name: str) -> bool:
        """Whether secret ``name`` exists (offline tools must not invent one)."""
        return (self.root / "secrets" / f"{name}.key").exists()

    def trust(self) -> DirectoryTrustStore:
        """Keys trusted to sign EVENTS (re-read when an unknown key id appears)."""
        return DirectoryTrustStore(self.trusted_dir)

    def token_trust(self) -> DirectoryTrustStore:
        """Keys trusted to sign identity TOKENS: the issuers only."""
        return DirectoryTrustStore(self.issuers_dir)

    def tree_head_trust(self) -> TrustStore:
        """Keys trusted to sign audit tree heads: the audit service's key only."""
        raw = TrustStore.load_dir(self.trusted_dir).public_key_bytes(AUDIT_KID)
        store = TrustStore()
        if raw is not None:
            store.add(AUDIT_KID, raw)
        return store


__all__ = [
    "ACCOUNT_KID_PREFIX",
    "AUDIT_KID",
    "SERVICE_KID_PREFIX",
    "DirectoryTrustStore",
    "Keyring",
    "load_or_create_secret",
]
