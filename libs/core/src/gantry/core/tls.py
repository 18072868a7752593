"""TLS settings turned into an ``ssl`` context: the client side of a NATS connection.

Every process builds its NATS TLS from :class:`gantry.core.TlsSettings` here (gRPC channels
and servers are made in :mod:`gantry.security.tls`, which reads the same files the same way).
A file that is missing or unreadable raises :class:`~gantry.core.ConfigError` naming the
setting and the path.
"""

from __future__ import annotations

import ssl
from pathlib import Path

from gantry.core.errors import ConfigError
from gantry.core.settings import TlsSettings

_ENV = {
    "ca_file": "GANTRY_TLS__CA_FILE",
    "cert_file": "GANTRY_TLS__CERT_FILE",
    "key_file": "GANTRY_TLS__KEY_FILE",
}


def is_enabled(tls: TlsSettings | None) -> bool:
    """Whether ``tls`` asks for TLS (None and disabled settings mean plaintext)."""
    return tls is not None and tls.enabled


def setting_path(tls: TlsSettings, field: str, *, needed_for: str) -> Path:
    """The path setting ``field`` names (ConfigError naming the variable when unset)."""
    path: Path | None = getattr(tls, field)
    if path is None:
        raise ConfigError(
            f"{needed_for} needs {_ENV[field]}, which is not set",
            hint=f"set {_ENV[field]} to a PEM file (make them with 'gantry admin certs')",
        )
    return path


def read_pem(tls: TlsSettings, field: str, *, needed_for: str) -> bytes:
    """The PEM file setting ``field`` names (ConfigError when missing, unreadable, not PEM)."""
    path = setting_path(tls, field, needed_for=needed_for)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(
            f"cannot read {_ENV[field]} {path}: {exc.strerror or exc}",
            hint=f"point {_ENV[field]} at a readable PEM file",
        ) from None
    if b"-----BEGIN " not in data:
        raise ConfigError(
            f"{_ENV[field]} {path} is not a PEM file",
            hint="give a PEM certificate or key (-----BEGIN ...-----)",
        )
    return data


def nats_tls(tls: TlsSettings | None) -> ssl.SSLContext | None:
    """The TLS context of a NATS connection, or None when TLS is off."""
    return ssl_context(tls) if tls is not None and is_enabled(tls) else None


def ssl_context(tls: TlsSettings) -> ssl.SSLContext:
    """A client-side context for NATS: verify the server against ``ca_file`` (host name
    checked), present ``cert_file``/``key_file`` when set."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ca = read_pem(tls, "ca_file", needed_for="a TLS connection to NATS")
    try:
        context.load_verify_locations(cadata=ca.decode("ascii", errors="replace"))
    except ssl.SSLError as exc:
        raise ConfigError(
            f"GANTRY_TLS__CA_FILE {tls.ca_file} holds no usable CA certificate: {exc}",
            hint="point it at the PEM CA certificate",
        ) from None
    if tls.cert_file is not None or tls.key_file is not None:
        needed_for = "a client certificate"
        cert = setting_path(tls, "cert_file", needed_for=needed_for)
        key = setting_path(tls, "key_file", needed_for=needed_for)
        read_pem(tls, "cert_file", needed_for=needed_for)  # a clear error for a missing file
        read_pem(tls, "key_file", needed_for=needed_for)
        try:
            context.load_cert_chain(certfile=str(cert), keyfile=str(key))
        except ssl.SSLError as exc:
            raise ConfigError(
                f"GANTRY_TLS__CERT_FILE {cert} and GANTRY_TLS__KEY_FILE {key} do not make a "
                f"usable certificate and key: {exc}",
                hint="check that the key belongs to the certificate",
            ) from None
    return context


__all__ = ["is_enabled", "nats_tls", "read_pem", "setting_path", "ssl_context"]
