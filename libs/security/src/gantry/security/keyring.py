"""A process's key files laid out under one directory, as ``gantry admin init`` creates them.

    <keys_dir>/
      issuer.pem              token-signing key (platform admins only)
      services/<name>.pem     each service's own signing key (events, tree heads)
      trusted/<kid>.pub       public keys every process trusts
      secrets/<name>.key      symmetric secrets (e.g. the audit log's row-seal key)

Every private file is mode 0600.
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


class Keyring:
    """Paths and loaders for the key directory."""

    def __init__(self, keys_dir: Path) -> None:
        self.root = Path(keys_dir)
        self.trusted_dir = self.root / "trusted"

    @property
    def issuer_path(self) -> Path:
        """The token-signing key file."""
        return self.root / "issuer.pem"

    def service_key(self, name: str) -> SigningKey:
        """The signing key of service ``name`` (created on first use, public half trusted)."""
        key = load_or_create_signing_key(self.root / "services" / f"{name}.pem", kid=f"svc-{name}")
        if not (self.trusted_dir / f"{key.kid}.pub").exists():
            write_public_key(self.trusted_dir, key)
        return key

    def issuer(self, *, create: bool = False) -> SigningKey:
        """The token-signing key; created only when ``create`` (``gantry admin init``)."""
        if not create and not self.issuer_path.exists():
            raise ConfigError(
                f"no token-signing key at {self.issuer_path}",
                hint="run 'gantry admin init' first",
            )
        key = load_or_create_signing_key(self.issuer_path)
        if not (self.trusted_dir / f"{key.kid}.pub").exists():
            write_public_key(self.trusted_dir, key)
        return key

    def secret(self, name: str) -> bytes:
        """A 32-byte secret (created on first use)."""
        return load_or_create_secret(self.root / "secrets" / f"{name}.key")

    def trust(self) -> DirectoryTrustStore:
        """The trusted public keys (re-read when an unknown key id appears)."""
        return DirectoryTrustStore(self.trusted_dir)


__all__ = ["DirectoryTrustStore", "Keyring", "load_or_create_secret"]
