"""Blob backends: where ciphertext blobs live. The store never hands them plaintext.

A backend stores whole, immutable blobs under names that pass
:func:`gantry.storage.naming.check_blob_name`. ``put_stream`` is all-or-nothing: a reader sees
the old blob or the complete new one, and an exception raised by the ``chunks`` iterator
leaves nothing behind. Errors of ``get_stream`` (e.g. :class:`ObjectNotFound`) may surface on
the first iteration rather than at the call.

A backend whose crashed writes can leave partial data behind may also offer
``sweep_partial(older_than_s) -> int``; ``ObjectStore.sweep_incomplete`` calls it when present.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Protocol

from gantry.storage.errors import ObjectNotFound
from gantry.storage.naming import check_blob_name

FILE_SUFFIX = "~"  # outside the name alphabet, so blob "a" (a~) and "a/b" (a/b~) can coexist
READ_PIECE = 4 * 1024 * 1024


class Backend(Protocol):
    """Raw (ciphertext) blob storage: a local directory, S3/MinIO, memory."""

    def put_stream(self, name: str, chunks: Iterable[bytes]) -> int:
        """Store the concatenation of ``chunks`` as blob ``name`` atomically; return its size."""
        ...

    def get_range(self, name: str, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes from ``offset`` (fewer only at the end of the blob)."""
        ...

    def get_stream(self, name: str, offset: int = 0) -> Iterator[bytes]:
        """The blob from ``offset`` to its end, in pieces of any size."""
        ...

    def size(self, name: str) -> int:
        """The blob's length in bytes."""
        ...

    def list(self, prefix: str) -> Iterator[str]:
        """Names of stored blobs starting with ``prefix``, in ascending order."""
        ...

    def delete(self, name: str) -> bool:
        """Remove the blob; ``True`` if it existed. Idempotent."""
        ...

    def exists(self, name: str) -> bool:
        """Whether a complete blob of that name is stored."""
        ...

    def mtime(self, name: str) -> float:
        """When the blob was last written, seconds since the epoch."""
        ...


class LocalBackend(Backend):
    """Blobs as files under ``root``: blob ``a/b`` is the file ``<root>/a/b~``.

    Promises: writes are atomic (temporary file, fsync, rename, fsync of the directory when
    ``durable``); a name can never address anything outside ``root``; temporary files are
    never listed. ``durable=False`` skips the fsyncs, for caches that can lose entries.
    """

    def __init__(self, root: Path, *, durable: bool = True) -> None:
        self.root = Path(root).absolute()
        self.durable = durable
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)

    def path(self, name: str) -> Path:
        """The file that holds blob ``name`` (validated to lie under ``root``)."""
        check_blob_name(name)
        path = self.root.joinpath(name + FILE_SUFFIX)
        if os.path.commonpath([self.root, path]) != str(self.root):  # defence in depth
            raise ValueError(f"blob name {name!r} escapes {self.root}")
        return path

    def put_stream(self, name: str, chunks: Iterable[bytes]) -> int:
        """Write to a temporary file beside the target, then rename it into place."""
        path = self.path(name)
        for attempt in range(5):  # a concurrent delete may prune the directory we just made
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                break
            except FileNotFoundError:
                if attempt == 4:
                    raise
        written = 0
        try:
            with os.fdopen(fd, "wb") as f:
                for chunk in chunks:
                    f.write(chunk)
                    written += len(chunk)
                if self.durable:
                    f.flush()
                    os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        if self.durable:
            self._fsync_dir(path.parent)
        return written

    def get_range(self, name: str, offset: int, length: int) -> bytes:
        """Read ``length`` bytes at ``offset`` with one ``pread``-style call."""
        try:
            with open(self.path(name), "rb") as f:
                f.seek(offset)
                return f.read(length)
        except FileNotFoundError:
            raise ObjectNotFound(name) from None

    def get_stream(self, name: str, offset: int = 0) -> Iterator[bytes]:
        """Read the file in 4 MiB pieces."""
        path = self.path(name)
        try:
            f = open(path, "rb")  # noqa: SIM115 - closed by the generator below
        except FileNotFoundError:
            raise ObjectNotFound(name) from None
        with f:
            f.seek(offset)
            while piece := f.read(READ_PIECE):
                yield piece

    def size(self, name: str) -> int:
        """The file's size."""
        return self._stat(name).st_size

    def mtime(self, name: str) -> float:
        """The file's modification time."""
        return self._stat(name).st_mtime

    def exists(self, name: str) -> bool:
        """Whether the file exists."""
        return self.path(name).is_file()

    def list(self, prefix: str) -> Iterator[str]:
        """Walk the directory under the prefix's last complete segment; sort the names."""
        base = prefix.rpartition("/")[0]
        if base:
            check_blob_name(base)
        start = self.root.joinpath(base) if base else self.root
        found: list[str] = []
        for dirpath, _dirs, files in os.walk(start):
            rel = os.path.relpath(dirpath, self.root)
            for file in files:
                if not file.endswith(FILE_SUFFIX) or file.startswith("."):
                    continue
                name = (
                    file[: -len(FILE_SUFFIX)]
                    if rel == "."
                    else f"{rel}/{file[: -len(FILE_SUFFIX)]}"
                )
                if name.startswith(prefix):
                    found.append(name.replace(os.sep, "/"))
        return iter(sorted(found))

    def delete(self, name: str) -> bool:
        """Unlink the file, then prune directories left empty (up to ``root``)."""
        path = self.path(name)
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        parent = path.parent
        while parent != self.root:
            try:
                parent.rmdir()
            except OSError:  # not empty (or already gone): stop pruning
                break
            parent = parent.parent
        return True

    def sweep_partial(self, older_than_s: float) -> int:
        """Remove temporary files of writes that crashed, older than ``older_than_s``."""
        cutoff = time.time() - older_than_s
        removed = 0
        for dirpath, _dirs, files in os.walk(self.root):
            for file in files:
                path = Path(dirpath, file)
                if not (file.startswith(".") and file.endswith(".tmp")):
                    continue
                try:
                    if path.stat().st_mtime <= cutoff:
                        path.unlink()
                        removed += 1
                except FileNotFoundError:
                    continue
        return removed

    def _stat(self, name: str) -> os.stat_result:
        try:
            return self.path(name).stat()
        except FileNotFoundError:
            raise ObjectNotFound(name) from None

    @staticmethod
    def _fsync_dir(directory: Path) -> None:
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class MemoryBackend(Backend):
    """Blobs in a dict, for tests and benchmarks. Thread-safe; nothing persists."""

    def __init__(self) -> None:
        self._blobs: dict[str, tuple[bytes, float]] = {}
        self._lock = threading.Lock()

    def blobs(self) -> dict[str, bytes]:
        """A snapshot of every stored blob (for tests that inspect or damage them)."""
        with self._lock:
            return {name: data for name, (data, _) in self._blobs.items()}

    def put_stream(self, name: str, chunks: Iterable[bytes]) -> int:
        """Join the chunks, then store the blob in one step."""
        check_blob_name(name)
        data = b"".join(chunks)
        with self._lock:
            self._blobs[name] = (data, time.time())
        return len(data)

    def _get(self, name: str) -> tuple[bytes, float]:
        with self._lock:
            try:
                return self._blobs[name]
            except KeyError:
                raise ObjectNotFound(name) from None

    def get_range(self, name: str, offset: int, length: int) -> bytes:
        """A slice of the blob."""
        return self._get(name)[0][offset : offset + length]

    def get_stream(self, name: str, offset: int = 0) -> Iterator[bytes]:
        """The blob from ``offset`` in one piece (a zero-copy view when offset is 0)."""
        data = self._get(name)[0]
        yield data if offset == 0 else data[offset:]

    def size(self, name: str) -> int:
        """The blob's length."""
        return len(self._get(name)[0])

    def mtime(self, name: str) -> float:
        """When the blob was stored."""
        return self._get(name)[1]

    def exists(self, name: str) -> bool:
        """Whether the blob is stored."""
        with self._lock:
            return name in self._blobs

    def list(self, prefix: str) -> Iterator[str]:
        """Matching names, sorted."""
        with self._lock:
            return iter(sorted(n for n in self._blobs if n.startswith(prefix)))

    def delete(self, name: str) -> bool:
        """Remove the blob if present."""
        with self._lock:
            return self._blobs.pop(name, None) is not None

    def set_mtime(self, name: str, mtime: float) -> None:
        """Backdate a blob (tests of age-based sweeping)."""
        with self._lock:
            self._blobs[name] = (self._blobs[name][0], mtime)


__all__ = ["FILE_SUFFIX", "Backend", "LocalBackend", "MemoryBackend"]
