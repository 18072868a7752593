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

from collections.abc import Sequence
from typing import Any

import grpc

from gantry.core import TlsSettings
from gantry.core.tls import is_enabled, nats_tls, ssl_context
from gantry.core.tls import read_pem as _read

ChannelOptions = Sequence[tuple[str, Any]]

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


__all__ = [
    "add_port",
    "channel_credentials",
    "channel_options",
    "is_enabled",
    "nats_tls",
    "secure_or_insecure_aio_channel",
    "secure_or_insecure_channel",
    "server_credentials",
    "ssl_context",
]
