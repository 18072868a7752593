"""The profiler started with ``GANTRY_TLS__*`` (mutual TLS, the cluster profile): the SDK with
the cluster's CA and a client certificate is served, a plaintext client is not."""

from __future__ import annotations

import asyncio
import datetime as dt
from pathlib import Path

import pytest

from gantry.client.config import ClientSettings
from gantry.client.profiler import ProfilerClient
from gantry.core import NatsSettings, TlsSettings, Unavailable, load_settings
from gantry.profiler.settings import ProfilerOptions, ProfilerSettings
from gantry.security.certificates import CertificateAuthority
from gantry.supervisor.nats_server import NatsServer, TlsFiles
from gantry.testing.probes import readyz

from .conftest import running

pytestmark = pytest.mark.timeout(60)


async def test_the_profiler_serves_mutual_tls_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    certs = tmp_path / "certs"
    ca, _ = CertificateAuthority.load_or_create(certs)
    ca.write(certs, "profiler", hosts=["localhost", "127.0.0.1"])
    ca.write(certs, "client")
    # With TLS on, the bus is TLS too (from the first byte): NATS gets the cluster's CA.
    ca.write(certs, "nats", hosts=["localhost", "127.0.0.1"])
    nats = NatsServer(
        tmp_path / "nats",
        tls=TlsFiles(certs / "nats.crt", certs / "nats.key", certs / "ca.crt"),
    ).start()
    nats_url = nats.url
    monkeypatch.setenv("GANTRY_TLS__ENABLED", "true")
    monkeypatch.setenv("GANTRY_TLS__CLIENT_AUTH", "true")
    monkeypatch.setenv("GANTRY_TLS__CA_FILE", str(certs / "ca.crt"))
    monkeypatch.setenv("GANTRY_TLS__CERT_FILE", str(certs / "profiler.crt"))
    monkeypatch.setenv("GANTRY_TLS__KEY_FILE", str(certs / "profiler.key"))
    settings = load_settings(
        ProfilerSettings,
        data_dir=tmp_path / "data",
        nats=NatsSettings(url=nats_url, reconnect_wait_s=0.1),
        profiler=ProfilerOptions(grpc_port=0, metrics_port=0),
    )
    assert settings.tls.enabled and settings.tls.client_auth

    monkeypatch.setenv("GANTRY_TLS__CERT_FILE", str(certs / "client.crt"))
    monkeypatch.setenv("GANTRY_TLS__KEY_FILE", str(certs / "client.key"))
    monkeypatch.delenv("GANTRY_TLS__CLIENT_AUTH")
    client_tls = load_settings(ClientSettings).tls  # as the CLI loads it

    try:
        await _serves_mutual_tls_only(settings, client_tls)
    finally:
        nats.stop()


async def _serves_mutual_tls_only(settings: ProfilerSettings, client_tls: TlsSettings) -> None:
    async with running(settings) as profiler:
        address = f"127.0.0.1:{profiler.service.grpc_port}"
        token = profiler.issuer.issue("root", ["platform-admin"], dt.timedelta(minutes=5))

        def ask(tls: TlsSettings | None) -> int:
            with ProfilerClient(address, token, tls=tls) as client:
                nodes, _ = client.nodes()
                return len(nodes)

        assert await asyncio.to_thread(ask, client_tls) == 0
        with pytest.raises(Unavailable, match="unreachable"):
            await asyncio.to_thread(ask, None)
        without_cert = client_tls.model_copy(update={"cert_file": None, "key_file": None})
        with pytest.raises(Unavailable):
            await asyncio.to_thread(ask, without_cert)
        # the probes stay plain HTTP, for the kubelet
        assert await readyz(profiler.service.metrics_port) == "200 ready\n"
