"""Local files of transfers: what to upload under which name, reading in chunks, and writing
so that no partial file remains and nothing lands outside the destination."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator, Sequence
from pathlib import Path, PurePosixPath

from gantry.core import IntegrityError, InvalidInput

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


def collect_files(
    paths: str | Path | Sequence[str | Path], *, root: str | Path | None = None
) -> list[tuple[str, Path]]:
    """(name in the dataset, local path) for each file to upload, in a stable order.

    Directories are walked (symbolic links to directories are not followed). Names use ``/``.
    Raises :class:`InvalidInput` for a missing path, a file outside ``root``, a name given
    twice, or nothing to upload.
    """
    if isinstance(paths, str | Path):
        paths = [paths]
    base = Path(os.path.abspath(root)) if root is not None else None
    found: list[tuple[str, Path]] = []
    for given in map(Path, paths):
        if given.is_dir():
            walk_base = base or Path(os.path.abspath(given))
            for dirpath, dirnames, filenames in os.walk(given):
                dirnames.sort()
                for filename in sorted(filenames):
                    path = Path(dirpath) / filename
                    if path.is_file():
                        found.append((_relative_name(path, walk_base, root), path))
        elif given.is_file():
            name = _relative_name(given, base, root) if base else given.name
            found.append((name, given))
        else:
            raise InvalidInput(f"{given}: no such file or directory")
    if not found:
        raise InvalidInput("no files to upload", hint="give files or directories that hold some")
    seen: dict[str, Path] = {}
    for name, path in found:
        if name in seen:
            raise InvalidInput(
                f"two files would be stored as {name!r}: {seen[name]} and {path}",
                hint="upload them separately, or pass a --root above both",
            )
        seen[name] = path
    return found


def _relative_name(path: Path, base: Path, root: str | Path | None) -> str:
    try:
        return Path(os.path.abspath(path)).relative_to(base).as_posix()
    except ValueError:
        raise InvalidInput(f"{path} is not under the root {root}") from None


def safe_target(dest: Path, name: str) -> Path:
    """Where the file ``name`` (a relative ``/`` path from the service) goes under ``dest``.

    Raises :class:`IntegrityError` for an absolute path, a ``..`` step, or any other path that
    would land outside ``dest``.
    """
    relative = PurePosixPath(name)
    if (
        not name
        or "\\" in name
        or "\x00" in name
        or relative.is_absolute()
        or any(part in ("..", "") for part in relative.parts)
    ):
        raise IntegrityError(f"refusing to write {name!r}: the path escapes {dest}")
    target = dest.joinpath(*relative.parts)
    if not target.resolve().is_relative_to(dest.resolve()):
        raise IntegrityError(f"refusing to write {name!r}: the path escapes {dest}")
    return target


__all__ = ["CHUNK_BYTES", "PartFile", "collect_files", "read_chunks", "safe_target"]
