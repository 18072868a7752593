"""Platform administration: the key directory, admin and user tokens, service accounts.

``init`` is what ``gantry admin init`` (and ``gantry up`` on a fresh data directory) runs::

    <data_dir>/
      admin.token               a platform-admin token (mode 0600), renewed by every init
      keys/issuer.pem           the token-signing key
      keys/accounts/<name>.pem  service-account signing keys (key id sa-<name>)
      keys/trusted/<kid>.pub    public keys every Gantry process trusts

``issue_certificates`` is what ``gantry admin certs`` runs: a development CA and one TLS
certificate per service, for ``GANTRY_TLS__*`` (docs/security.md#tls).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gantry.core import InvalidInput
from gantry.events.topology import SERVICE_USERS
from gantry.security import TokenIssuer, default_policy, parse_ttl
from gantry.security.bootstrap import (
    ADMIN_ROLE,
    DEFAULT_TTL,
    InitResult,
    init_data_dir,
    write_private_text,
)
from gantry.security.certificates import (
    CA_CERT,
    CertificateAuthority,
    IssuedCertificate,
    check_days,
    check_name,
    split_hosts,
)
from gantry.security.keyring import Keyring
from gantry.security.principal import SERVICE_SUBJECTS

SERVICE_ROLE = "service"
#: Names of Gantry's own services (workflows among them): an outside service account may not
#: take their keys, nor, for workflows, the right to act on behalf of users.
RESERVED_ACCOUNTS = SERVICE_SUBJECTS
_ACCOUNT_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
#: Who gets a TLS certificate by default: the services, the node agent, NATS and the CLI.
CERTIFICATE_NAMES = (*SERVICE_USERS, "console", "nats", "client")
#: Names every certificate answers to besides its own: the same machine.
LOCAL_HOSTS = ("localhost", "127.0.0.1")


def keyring(data_dir: Path) -> Keyring:
    """The key directory of the platform at ``data_dir``."""
    return Keyring(Path(data_dir) / "keys")


def init(data_dir: Path, *, ttl: dt.timedelta = DEFAULT_TTL) -> InitResult:
    """Create the key directory and a fresh admin token (see gantry.security.bootstrap)."""
    return init_data_dir(data_dir, ttl=ttl)


def create_token(
    data_dir: Path,
    user: str,
    roles: list[str] | tuple[str, ...],
    ttl: dt.timedelta | str = DEFAULT_TTL,
) -> str:
    """A token for ``user`` with ``roles`` (each defined by the RBAC policy), valid ``ttl``.

    ``ttl`` is a timedelta or a duration such as ``"12h"``. Raises :class:`InvalidInput` for an
    unknown role (naming the roles that exist) and :class:`gantry.core.ConfigError` when the
    platform has no signing key yet.
    """
    lifetime = parse_ttl(ttl) if isinstance(ttl, str) else ttl
    check_roles(roles)
    issuer = keyring(data_dir).issuer()
    return TokenIssuer(issuer).issue(user, list(roles), lifetime)


def check_roles(roles: list[str] | tuple[str, ...]) -> None:
    """Raise :class:`InvalidInput` unless every role is defined by the shipped RBAC policy."""
    known = default_policy().roles
    if not roles:
        raise InvalidInput("give at least one role", hint=f"roles: {', '.join(sorted(known))}")
    unknown = [r for r in roles if r not in known]
    if unknown:
        raise InvalidInput(
            f"unknown role{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}",
            hint=f"roles defined by the policy: {', '.join(sorted(known))}",
        )


def create_service_account(
    data_dir: Path, name: str, *, ttl: dt.timedelta | str = DEFAULT_TTL
) -> tuple[str, Path]:
    """A signing key and a ``service`` token for the outside service ``name``.

    The key (``keys/accounts/<name>.pem``, key id ``sa-<name>``) is created on first use (an
    existing one is kept) and its public half is written to ``keys/trusted/sa-<name>.pub``, so
    Gantry accepts the events it signs; an account key can never sign tokens, tree heads or
    events that claim a platform source. Returns ``(token, key_path)``.
    """
    if not isinstance(name, str) or not _ACCOUNT_NAME.match(name):
        raise InvalidInput(
            f"invalid service account name {name!r}",
            hint="use lower-case letters, digits, '-' and '_', starting with a letter",
        )
    if name in RESERVED_ACCOUNTS:
        raise InvalidInput(
            f"{name!r} is the name of a Gantry service", hint="pick another account name"
        )
    lifetime = parse_ttl(ttl) if isinstance(ttl, str) else ttl
    ring = keyring(data_dir)
    issuer = ring.issuer()
    ring.account_key(name)  # created on first use; its public key becomes trusted
    token = TokenIssuer(issuer).issue(name, [SERVICE_ROLE], lifetime, kind="service")
    return token, ring.root / "accounts" / f"{name}.pem"


@dataclass(frozen=True)
class Certificates:
    """What :func:`issue_certificates` wrote: the CA certificate (and whether the CA is new)
    and one certificate per name."""

    ca_file: Path
    created_ca: bool
    issued: tuple[IssuedCertificate, ...]


def issue_certificates(
    out: Path,
    names: Sequence[str] = CERTIFICATE_NAMES,
    *,
    hosts: Sequence[str] = (),
    days: int = 365,
) -> Certificates:
    """A CA under ``out`` (an existing ``ca.crt`` + ``ca.key`` there is reused, so earlier
    certificates stay valid) and a certificate and key per name, whose subject alternative
    names are the name, ``localhost``, ``127.0.0.1`` and ``hosts``.

    Raises :class:`InvalidInput` for a bad name or host (before anything is written) and
    :class:`gantry.core.ConfigError` for an unusable CA in ``out``.
    """
    if not names:
        raise InvalidInput("no names to issue certificates for", hint="give --name NAME")
    if len(set(names)) != len(names):
        raise InvalidInput(f"a name is given twice in {list(names)}")
    every_host = [*LOCAL_HOSTS, *hosts]
    for name in names:  # everything is checked before anything is written
        check_name(name)
    split_hosts(every_host)
    check_days(days)
    ca, created = CertificateAuthority.load_or_create(Path(out))
    issued = tuple(ca.write(Path(out), name, hosts=every_host, days=days) for name in names)
    return Certificates(Path(out) / CA_CERT, created, issued)


__all__ = [
    "ADMIN_ROLE",
    "CERTIFICATE_NAMES",
    "DEFAULT_TTL",
    "RESERVED_ACCOUNTS",
    "Certificates",
    "InitResult",
    "check_roles",
    "create_service_account",
    "create_token",
    "init",
    "issue_certificates",
    "keyring",
    "write_private_text",
]
