"""Setting up a platform data directory: the key directory and a first admin token.

This is what ``gantry admin init`` and ``gantry up`` (on a fresh data directory) run::

    <data_dir>/
      admin.token               a platform-admin token (mode 0600), renewed by every init
      keys/...                  see gantry.security.keyring
      nats/credentials.env      one NATS password per user (mode 0600; gantry.events.nats_auth)
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

from gantry.core.private_files import write_private_text
from gantry.events.nats_auth import ensure_credentials
from gantry.events.topology import SERVICE_USERS
from gantry.security.keyring import Keyring
from gantry.security.tokens import TokenIssuer

#: Every platform service's own signing key (services/<name>.pem) and the symmetric secrets
#: the services keep (secrets/<name>.key): made by init, so a cluster can put them in Secrets
#: before any service starts (a service only creates its own on first start otherwise).
PLATFORM_SERVICES = SERVICE_USERS
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
