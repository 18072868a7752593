"""NATS over mutual TLS with the certificates `gantry admin certs` makes: a service connects
with GANTRY_TLS__* settings; no client certificate, another CA or plaintext is refused."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

from gantry.core import ConfigError, NatsSettings, TlsSettings, Unavailable
from gantry.core.tls import nats_tls
from gantry.events import Bus
from gantry.events.nats_auth import ensure_credentials, password_of, render_auth_conf
from gantry.security.certificates import CertificateAuthority
from gantry.supervisor.nats_server import NatsServer, TlsFiles


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pki")
    ca = CertificateAuthority.create()
    ca.save(root)
    for name in ("nats", "scheduler"):
        ca.write(root, name, hosts=["localhost", "127.0.0.1"])
    other = CertificateAuthority.create("another CA")
    (root / "other").mkdir()
    other.save(root / "other")
    other.write(root / "other", "scheduler", hosts=["127.0.0.1"])
    return root


@pytest.fixture(scope="module")
def server(
    pki: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[NatsServer, dict[str, str]]]:
    root = tmp_path_factory.mktemp("tls-nats")
    creds = ensure_credentials(root / "credentials.env")
    tls = TlsFiles(pki / "nats.crt", pki / "nats.key", pki / "ca.crt")
    nats = NatsServer(root / "n", auth_conf=render_auth_conf(), env=creds, tls=tls).start()
    try:
        yield nats, creds
    finally:
        nats.stop()


def _settings(server: NatsServer, creds: dict[str, str], url: str | None = None) -> NatsSettings:
    return NatsSettings(
        url=url or server.url,
        user="scheduler",
        password=password_of(creds, "scheduler"),
        initial_wait_s=1,
        connect_timeout_s=1,
        max_reconnect_attempts=0,
    )


def _tls(pki: Path, *, cert: bool = True, ca: Path | None = None) -> TlsSettings:
    return TlsSettings(
        enabled=True,
        ca_file=ca or pki / "ca.crt",
        cert_file=pki / "scheduler.crt" if cert else None,
        key_file=pki / "scheduler.key" if cert else None,
    )


async def test_a_service_connects_over_mutual_tls(
    pki: Path, server: tuple[NatsServer, dict[str, str]]
) -> None:
    nats, creds = server
    assert nats.url.startswith("tls://")
    bus = await Bus.connect(_settings(nats, creds), name="t", tls=nats_tls(_tls(pki)))
    try:
        await bus.nc.flush()
        assert bus.nc.is_connected and bus.nc.connected_url is not None
    finally:
        await bus.close()


#: nats-py leaves the socket of a refused connection for the garbage collector; collected in
#: the test itself (gc.collect below), its warning is expected there and nowhere else.
_LEAKS_A_SOCKET = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


@_LEAKS_A_SOCKET
@pytest.mark.parametrize("case", ["no client certificate", "another CA", "plaintext"])
async def test_anything_less_is_refused(
    case: str, pki: Path, server: tuple[NatsServer, dict[str, str]]
) -> None:
    nats, creds = server
    if case == "no client certificate":
        url, tls = None, nats_tls(_tls(pki, cert=False))
    elif case == "another CA":
        url, tls = None, nats_tls(_tls(pki / "other", ca=pki / "other" / "ca.crt"))
    else:
        url, tls = nats.url.replace("tls://", "nats://"), None
    with pytest.raises(Unavailable):
        bus = await Bus.connect(_settings(nats, creds, url), name="t", tls=tls)
        await bus.close()
    await asyncio.sleep(0)
    gc.collect()


@_LEAKS_A_SOCKET
async def test_a_tls_client_never_talks_plaintext_to_a_server_without_tls(
    pki: Path, tmp_path: Path
) -> None:
    """Whatever answers without TLS in a server's place never sees the credentials."""
    with NatsServer(tmp_path / "plain") as plain:
        settings = NatsSettings(
            url=plain.url, user="scheduler", password="n0secret", initial_wait_s=1,
            connect_timeout_s=1, max_reconnect_attempts=0,
        )  # fmt: skip
        with pytest.raises(Unavailable):
            bus = await Bus.connect(settings, name="t", tls=nats_tls(_tls(pki)))
            await bus.close()
        await asyncio.sleep(0)
        gc.collect()


def test_tls_off_means_no_context_and_a_missing_ca_is_named(tmp_path: Path) -> None:
    assert nats_tls(TlsSettings()) is None
    assert nats_tls(None) is None
    with pytest.raises(ConfigError, match="GANTRY_TLS__CA_FILE"):
        nats_tls(TlsSettings(enabled=True, ca_file=tmp_path / "missing.crt"))
