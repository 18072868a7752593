"""Files only their owner may read: tokens, passwords, credentials.

Written atomically (a temporary file renamed over the target), created with mode 0600 from the
start, so a reader never sees a half-written file and nobody else ever sees its content.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def write_private_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically, readable by its owner only (mode 0600)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


__all__ = ["write_private_text"]
