"""Looking for leaked secrets in everything a platform run wrote: logs, databases, the NATS
store (every event), run files, exports.

The secrets are those of the run itself (its NATS passwords, its private keys and symmetric
secrets) plus anything shaped like a credential: an identity token (a JWT) or a data grant
token. The files meant to hold them (the key directory, the admin token, the credentials file)
are the only places allowed to.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

#: An identity token: a JWT whose header and payload are base64url JSON objects.
JWT = re.compile(rb"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{20,}")
#: A data grant token (gantry.governance.grants.TOKEN_PREFIX).
GRANT = re.compile(rb"ggr_[A-Za-z0-9_-]{30,}")

#: Paths under a data directory that are meant to hold secrets.
SECRET_HOLDERS = ("keys", "admin.token", "nats/credentials.env")


@dataclass(frozen=True)
class Leak:
    """A secret found where it should not be."""

    where: str
    what: str

    def __str__(self) -> str:
        return f"{self.what} in {self.where}"


def run_secrets(data_dir: Path) -> dict[str, bytes]:
    """The secrets a platform data directory holds, by name, in the forms they could leak in."""
    found: dict[str, bytes] = {}
    creds = data_dir / "nats" / "credentials.env"
    if creds.is_file():
        for line in creds.read_text().splitlines():
            name, sep, value = line.partition("=")
            if sep and value.strip() and not name.startswith("#"):
                found[f"NATS password {name}"] = value.strip().encode()
    keys = data_dir / "keys"
    for path in sorted(keys.rglob("*")) if keys.is_dir() else []:
        if not path.is_file():
            continue
        raw = path.read_bytes()
        rel = path.relative_to(data_dir)
        if b"PRIVATE KEY" in raw:
            body = b"".join(
                line.strip() for line in raw.splitlines() if line and not line.startswith(b"-----")
            )
            found[f"private key {rel}"] = body[len(body) // 3 :]  # the part after the header
        elif path.suffix == ".key":
            found[f"secret {rel}"] = raw
            found[f"secret {rel} (hex)"] = raw.hex().encode()
            found[f"secret {rel} (base64)"] = base64.b64encode(raw).rstrip(b"=")
    token = data_dir / "admin.token"
    if token.is_file():
        found["admin token"] = token.read_bytes().strip()
    return {k: v for k, v in found.items() if len(v) >= 16}


def _holds_secrets(path: Path, data_dir: Path) -> bool:
    try:
        rel = path.relative_to(data_dir).as_posix()
    except ValueError:
        return False
    return any(rel == h or rel.startswith(h + "/") for h in SECRET_HOLDERS)


def scan(
    data_dir: Path,
    *,
    texts: Iterable[tuple[str, str]] = (),
    extra_secrets: dict[str, bytes] | None = None,
) -> list[Leak]:
    """Every secret found in the files under ``data_dir`` (except the secret holders) and in
    ``texts`` (name, content) such as a run's captured output and logs."""
    secrets = {**run_secrets(data_dir), **(extra_secrets or {})}
    leaks: list[Leak] = []

    def look(where: str, blob: bytes) -> None:
        for name, value in secrets.items():
            if value in blob:
                leaks.append(Leak(where, name))
        for pattern, what in ((JWT, "an identity token"), (GRANT, "a data grant token")):
            match = pattern.search(blob)
            if match:
                leaks.append(Leak(where, f"{what} ({match.group()[:12].decode()}...)"))

    for path in sorted(data_dir.rglob("*")):
        if path.is_file() and not path.is_symlink() and not _holds_secrets(path, data_dir):
            look(str(path.relative_to(data_dir)), path.read_bytes())
    for name, text in texts:
        look(name, text.encode())
    return leaks


__all__ = ["GRANT", "JWT", "SECRET_HOLDERS", "Leak", "run_secrets", "scan"]
