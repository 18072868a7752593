"""TLS for gRPC (and an ``ssl`` context for NATS) from :class:`gantry.core.TlsSettings`.

Every gRPC server and every channel between Gantry processes is made here, so that with
``GANTRY_TLS__ENABLED=false`` (the default) everything stays plaintext exactly as before, and
with it true everything is TLS — mutual TLS when ``GANTRY_TLS__CLIENT_AUTH=true``, the cluster
profile. A ``tls`` of None means plaintext too (an SDK caller who passed nothing).

The certificate files are read when a server port, a channel or a context is made, not when
the settings load: a rotated certificate is used by the next channel. A file that is missing
or unreadable raises :class:`~gantry.core.ConfigError` naming the setting and the path.
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc

from gantry.core import ConfigError, TlsSettings

ChannelOptions = Sequence[tuple[str, Any]]

_ENV = {
    "ca_file": "GANTRY_TLS__CA_FILE",
    "cert_file": "GANTRY_TLS__CERT_FILE",
    "key_file": "GANTRY_TLS__KEY_FILE",
}


def is_enabled(tls: TlsSettings | None) -> bool:
    """Whether ``tls`` asks for TLS (None and disabled settings mean plaintext)."""
    return tls is not None and tls.enabled


def _path(tls: TlsSettings, field: str, *, needed_for: str) -> Path:
    path: Path | None = getattr(tls, field)
    if path is None:
        raise ConfigError(
            f"{needed_for} needs {_ENV[field]}, which is not set",
            hint=f"set {_ENV[field]} to a PEM file (make them with 'gantry admin certs')",
        )
    return path


def _read(tls: TlsSettings, field: str, *, needed_for: str) -> bytes:
    path = _path(tls, field, needed_for=needed_for)
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


# ---------------------------------------------------------------------- gRPC servers


def server_credentials(tls: TlsSettings) -> grpc.ServerCredentials:
    """This process's certificate and key; with ``client_auth``, the CA that every client's
    certificate must chain to (a client without one is refused during the handshake)."""
    needed_for = "a gRPC server with GANTRY_TLS__ENABLED=true"
    cert = _read(tls, "cert_file", needed_for=needed_for)
    key = _read(tls, "key_file", needed_for=needed_for)
    root = _read(tls, "ca_file", needed_for="GANTRY_TLS__CLIENT_AUTH") if tls.client_auth else None
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=root, require_client_auth=tls.client_auth
    )


def add_port(server: grpc.Server | grpc.aio.Server, address: str, tls: TlsSettings | None) -> int:
    """Listen on ``address`` (``host:port``, port 0 = any free one), over TLS when ``tls`` is
    enabled; the port bound. Raises :class:`ConfigError` when the files cannot be read."""
    if is_enabled(tls):
        assert tls is not None
        return int(server.add_secure_port(address, server_credentials(tls)))
    return int(server.add_insecure_port(address))


# ---------------------------------------------------------------------- gRPC channels


def channel_credentials(tls: TlsSettings) -> grpc.ChannelCredentials:
    """Trust ``ca_file``; present ``cert_file``/``key_file`` when set (mutual TLS)."""
    root = _read(tls, "ca_file", needed_for="a TLS channel")
    key = cert = None
    if tls.cert_file is not None or tls.key_file is not None:
        needed_for = "a client certificate"
        cert = _read(tls, "cert_file", needed_for=needed_for)
        key = _read(tls, "key_file", needed_for=needed_for)
    return grpc.ssl_channel_credentials(
        root_certificates=root, private_key=key, certificate_chain=cert
    )


def channel_options(tls: TlsSettings | None, options: ChannelOptions = ()) -> list[tuple[str, Any]]:
    """``options`` plus, when ``server_name`` is set, the name to expect in the server's
    certificate instead of the address's host."""
    out = list(options)
    if is_enabled(tls) and tls is not None and tls.server_name:
        out.append(("grpc.ssl_target_name_override", tls.server_name))
    return out


def secure_or_insecure_channel(
    address: str, tls: TlsSettings | None, options: ChannelOptions = ()
) -> grpc.Channel:
    """A synchronous channel to ``address``: TLS when ``tls`` is enabled, else plaintext."""
    if is_enabled(tls):
        assert tls is not None
        return grpc.secure_channel(
            address, channel_credentials(tls), options=channel_options(tls, options)
        )
    return grpc.insecure_channel(address, options=list(options))


def secure_or_insecure_aio_channel(
    address: str, tls: TlsSettings | None, options: ChannelOptions = ()
) -> grpc.aio.Channel:
    """An asyncio channel to ``address``: TLS when ``tls`` is enabled, else plaintext."""
    if is_enabled(tls):
        assert tls is not None
        return grpc.aio.secure_channel(
            address, channel_credentials(tls), options=channel_options(tls, options)
        )
    return grpc.aio.insecure_channel(address, options=list(options))


# ---------------------------------------------------------------------- NATS


def ssl_context(tls: TlsSettings) -> ssl.SSLContext:
    """A client-side context for NATS: verify the server against ``ca_file`` (host name
    checked), present ``cert_file``/``key_file`` when set."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ca = _read(tls, "ca_file", needed_for="a TLS connection to NATS")
    try:
        context.load_verify_locations(cadata=ca.decode("ascii", errors="replace"))
    except ssl.SSLError as exc:
        raise ConfigError(
            f"GANTRY_TLS__CA_FILE {tls.ca_file} holds no usable CA certificate: {exc}",
            hint="point it at the PEM CA certificate",
        ) from None
    if tls.cert_file is not None or tls.key_file is not None:
        needed_for = "a client certificate"
        cert = _path(tls, "cert_file", needed_for=needed_for)
        key = _path(tls, "key_file", needed_for=needed_for)
        _read(tls, "cert_file", needed_for=needed_for)  # a clear error for a missing file
        _read(tls, "key_file", needed_for=needed_for)
        try:
            context.load_cert_chain(certfile=str(cert), keyfile=str(key))
        except ssl.SSLError as exc:
            raise ConfigError(
                f"GANTRY_TLS__CERT_FILE {cert} and GANTRY_TLS__KEY_FILE {key} do not make a "
                f"usable certificate and key: {exc}",
                hint="check that the key belongs to the certificate",
            ) from None
    return context


__all__ = [
    "add_port",
    "channel_credentials",
    "channel_options",
    "is_enabled",
    "secure_or_insecure_aio_channel",
    "secure_or_insecure_channel",
    "server_credentials",
    "ssl_context",
]
