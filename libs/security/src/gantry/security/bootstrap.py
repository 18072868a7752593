"""Setting up a platform data directory: the key directory and a first admin token.

This is what ``gantry admin init`` and ``gantry up`` (on a fresh data directory) run::

    <data_dir>/
      admin.token               a platform-admin token (mode 0600), renewed by every init
      keys/...                  see gantry.security.keyring
      nats/credentials.env      one NATS password per user (mode 0600; gantry.events.nats_auth)
"""

from __future__ import annotations

import datetime as dt
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from gantry.events.nats_auth import ensure_credentials
from gantry.security.keyring import Keyring
from gantry.security.tokens import TokenIssuer

#: Every platform service's own signing key (services/<name>.pem) and the symmetric secrets
#: the services keep (secrets/<name>.key): made by init, so a cluster can put them in Secrets
#: before any service starts (a service only creates its own on first start otherwise).
PLATFORM_SERVICES = (
    "audit",
    "governance",
    "scheduler",
    "serving",
    "profiler",
    "workflows",
    "training-agent",
)
PLATFORM_SECRETS = ("audit-seal", "governance-subjects", "workflows-sessions")
ADMIN_SUBJECT = "admin"
ADMIN_ROLE = "platform-admin"
DEFAULT_TTL = dt.timedelta(hours=12)


@dataclass(frozen=True)
class InitResult:
    """What :func:`init_data_dir` did."""

    data_dir: Path
    keys_dir: Path
    issuer_kid: str
    created_keys: bool
    token_path: Path
    nats_credentials_path: Path

    @property
    def trusted_dir(self) -> Path:
        """The directory of public keys trusted to sign events."""
        return self.keys_dir / "trusted"


def init_data_dir(data_dir: Path, *, ttl: dt.timedelta = DEFAULT_TTL) -> InitResult:
    """Create the key directory and write a fresh admin token to ``<data_dir>/admin.token``.

    Idempotent: existing keys and NATS passwords are kept; every run issues a new admin token
    (valid ``ttl``).
    """
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    ring = Keyring(data_dir / "keys")
    created = not ring.issuer_path.exists()
    issuer = ring.issuer(create=True)
    for name in PLATFORM_SERVICES:
        ring.service_key(name)
    for name in PLATFORM_SECRETS:
        ring.secret(name)
    token = TokenIssuer(issuer).issue(ADMIN_SUBJECT, [ADMIN_ROLE], ttl)
    token_path = data_dir / "admin.token"
    write_private_text(token_path, token + "\n")
    nats_credentials = data_dir / "nats" / "credentials.env"
    ensure_credentials(nats_credentials)
    return InitResult(data_dir, ring.root, issuer.kid, created, token_path, nats_credentials)


def write_private_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically, readable by its owner only (mode 0600)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


__all__ = [
    "ADMIN_ROLE",
    "ADMIN_SUBJECT",
    "DEFAULT_TTL",
    "PLATFORM_SECRETS",
    "PLATFORM_SERVICES",
    "InitResult",
    "init_data_dir",
    "write_private_text",
]
