"""LocalKeyFile: a key ring in a JSON file readable by its owner only (mode 0600)."""

from __future__ import annotations

import json
import os
import secrets
import stat
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from gantry.core import ConfigError
from gantry.storage.errors import BackendUnavailable, KeyRingChanged
from gantry.storage.keyring import KeyRingState, KeySource

LOCK_TIMEOUT_S = 30.0


class LocalKeyFile(KeySource):
    """A key ring kept in one local file, created on first use with mode 0600.

    Promises: the file is replaced atomically (temporary file, fsync, rename), so a crash
    leaves the old ring or the new one, never a mix; concurrent processes serialise on
    ``<path>.lock``; a file that group or others could read is refused, never used.
    """

    read_only = False

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = FileLock(f"{self.path}.lock", timeout=LOCK_TIMEOUT_S)

    def describe(self) -> str:
        """``key file <path>``."""
        return f"key file {self.path}"

    def load(self) -> KeyRingState | None:
        """The ring in the file, or ``None`` if the file does not exist yet."""
        doc = self._read()
        if doc is None:
            return None
        revision = str(doc.get("revision", 0))
        return KeyRingState.from_document(doc, where=self.describe(), revision=revision)

    def save(self, state: KeyRingState) -> KeyRingState:
        """Write ``state`` if the file still has ``state.revision``; return it with the new one."""
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            with self._lock:
                doc = self._read()
                stored = None if doc is None else str(doc.get("revision", 0))
                if stored != state.revision:
                    raise KeyRingChanged(self.describe())
                revision = int(stored or 0) + 1
                self._write({**state.to_document(), "revision": revision})
        except Timeout:
            raise BackendUnavailable(
                self.describe(), f"{self._lock.lock_file} stayed locked for {LOCK_TIMEOUT_S}s"
            ) from None
        return KeyRingState(state.records, str(revision))

    def _read(self) -> dict[str, Any] | None:
        try:
            mode = stat.S_IMODE(self.path.stat().st_mode)
        except FileNotFoundError:
            return None
        if mode & 0o077:
            raise ConfigError(
                f"key file {self.path} has mode {mode:o}; a key ring must be readable by its "
                "owner only",
                hint=f"run: chmod 600 {self.path}",
            )
        try:
            doc = json.loads(self.path.read_bytes())
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"cannot read key file {self.path}: {exc}",
                hint="restore the key ring from backup",
            ) from None
        if not isinstance(doc, dict):
            raise ConfigError(f"key file {self.path} is not a JSON object", hint="restore it")
        return doc

    def _write(self, doc: dict[str, Any]) -> None:
        directory = self.path.parent
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = directory / f".{self.path.name}.{secrets.token_hex(6)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(json.dumps(doc, indent=1).encode())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


__all__ = ["LocalKeyFile"]
