"""Local files of transfers: reading in chunks, and writing so that no partial file remains."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

#: Chunk size of file and model bytes on the wire (1 MiB).
CHUNK_BYTES = 1 << 20


def read_chunks(path: str | Path, chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
    """The bytes of the file at ``path`` in chunks; at least one (empty for an empty file)."""
    with open(path, "rb") as fh:
        chunk = fh.read(chunk_bytes)
        yield chunk
        while chunk:
            chunk = fh.read(chunk_bytes)
            if chunk:
                yield chunk


class PartFile:
    """A file being received: written beside ``target`` and renamed onto it when complete.

    Parent directories are created. Until :meth:`finish`, only a hidden ``.NAME.*.part`` file
    exists, which :meth:`discard` removes; a finished file is never touched again.
    """

    def __init__(self, target: Path, *, name: str = "") -> None:
        self.target = target
        self.name = name or target.name
        target.parent.mkdir(parents=True, exist_ok=True)
        # created like any new file (the umask applies), unlike mkstemp's 0600
        self._part = target.with_name(f".{target.name}.{secrets.token_hex(4)}.part")
        self._fh = self._part.open("xb")
        self._done = False

    def write(self, data: bytes) -> None:
        """Append ``data``."""
        self._fh.write(data)

    def finish(self) -> Path:
        """Close and move the file into place; the target path."""
        self._fh.close()
        self._part.replace(self.target)
        self._done = True
        return self.target

    def discard(self) -> None:
        """Remove the unfinished file (nothing after :meth:`finish`)."""
        self._fh.close()
        if not self._done:
            self._part.unlink(missing_ok=True)


__all__ = ["CHUNK_BYTES", "PartFile", "read_chunks"]
