"""The NATS server's users and permissions, written from :mod:`gantry.events.topology`.

:func:`render_auth_conf` produces the ``authorization`` block every deployment includes
(``deploy/nats/auth.conf`` for compose, ``deploy/k8s/base/nats/auth.conf`` for Kubernetes, and
the embedded platform's own copy). Passwords are never written into it: each is an environment
variable reference (``$GANTRY_NATS_AUDIT_PASSWORD``), filled from the credentials file that
``gantry admin init`` creates (:func:`ensure_credentials`) — an env file, mode 0600, usable as
a compose ``env_file`` and as a Kubernetes Secret (``--from-env-file``).
"""

from __future__ import annotations

import secrets
from pathlib import Path

from gantry.core import ConfigError
from gantry.core.private_files import write_private_text
from gantry.events.topology import USERS, env_name, permissions

HEADER = (
    "# Generated from the event catalog by `gantry admin nats-config`; do not edit.\n"
    "# Each user may publish only the event types the catalog names it a publisher of, and\n"
    "# read only the streams of the consumers it runs (gantry.events.topology).\n"
)


def _list(items: tuple[str, ...], indent: str) -> str:
    inner = "".join(f'{indent}  "{item}"\n' for item in items)
    return f"[\n{inner}{indent}]"


def render_auth_conf() -> str:
    """The ``authorization { users = [...] }`` block, passwords as env variable references."""
    blocks = []
    for user in USERS:
        lines = [
            "    {",
            f'      user: "{user}"',
            f"      password: ${env_name(user)}",
        ]
        perms = permissions(user)
        if perms is not None:
            lines += [
                "      permissions: {",
                f"        publish: {{ allow: {_list(perms.publish, '        ')} }}",
                f"        subscribe: {{ allow: {_list(perms.subscribe, '        ')} }}",
                "      }",
            ]
        lines.append("    }")
        blocks.append("\n".join(lines))
    return HEADER + "authorization {\n  users = [\n" + "\n".join(blocks) + "\n  ]\n}\n"


def read_credentials(path: Path) -> dict[str, str]:
    """The ``NAME=value`` lines of a credentials env file (raises ConfigError if unreadable)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(
            f"cannot read the NATS credentials file {path}: {exc.strerror}",
            hint="create it with 'gantry admin init --data-dir DIR'",
        ) from None
    values: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        name, _, value = line.partition("=")
        values[name.strip()] = value.strip()
    return values


def ensure_credentials(path: Path) -> dict[str, str]:
    """A random password for every NATS user in ``path`` (created 0600, kept if present).

    Users added since the file was written get a password appended; existing ones are kept.
    """
    path = Path(path)
    existing = read_credentials(path) if path.exists() else {}
    missing = [env_name(u) for u in USERS if env_name(u) not in existing]
    if not missing:
        return existing
    values = dict(existing)
    for name in missing:
        values[name] = new_password()
    write_credentials(path, values)
    return values


def write_credentials(path: Path, values: dict[str, str]) -> None:
    """Write ``values`` as ``NAME=value`` lines to ``path`` (atomically, mode 0600)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    body = "# NATS passwords, one per user (gantry admin init). Keep secret.\n" + "".join(
        f"{name}={value}\n" for name, value in values.items()
    )
    write_private_text(path, body)


def new_password() -> str:
    """A random password NATS reads back as a plain string from an environment variable.

    nats-server parses a variable's value as a configuration token, so a value starting with
    a digit (a number) or reading ``true`` (a boolean) would break the server's configuration:
    letters and digits only, starting with a letter (192 random bits).
    """
    return "n" + secrets.token_hex(24)


def password_of(credentials: dict[str, str], user: str) -> str:
    """``user``'s password from a credentials mapping (ConfigError if it is not there)."""
    name = env_name(user)
    try:
        return credentials[name]
    except KeyError:
        raise ConfigError(
            f"no NATS password for user {user!r} ({name}) in the credentials",
            hint="run 'gantry admin init --data-dir DIR' to add the missing passwords",
        ) from None


__all__ = [
    "ensure_credentials",
    "new_password",
    "password_of",
    "read_credentials",
    "render_auth_conf",
    "write_credentials",
]
