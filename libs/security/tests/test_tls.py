"""TLS and mutual TLS on real grpc.aio servers, with certificates from the development CA."""

from __future__ import annotations

import asyncio
import ssl
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from gantry.core import CommonSettings, ConfigError, InvalidInput, TlsSettings, load_settings
from gantry.security.certificates import CertificateAuthority
from gantry.security.tls import (
    add_port,
    channel_credentials,
    secure_or_insecure_aio_channel,
    secure_or_insecure_channel,
    ssl_context,
)

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA with a server and a client certificate, and a second, unrelated CA."""
    root = tmp_path_factory.mktemp("pki")
    ca, created = CertificateAuthority.load_or_create(root / "ca")
    assert created
    ca.write(root / "ca", "server", hosts=["localhost", "127.0.0.1"])
    ca.write(root / "ca", "client")
    other = CertificateAuthority.create("another CA")
    other.save(root / "other")
    other.write(root / "other", "client")
    return root


def server_tls(pki: Path, *, client_auth: bool = True) -> TlsSettings:
    d = pki / "ca"
    return TlsSettings(
        enabled=True,
        ca_file=d / "ca.crt",
        cert_file=d / "server.crt",
        key_file=d / "server.key",
        client_auth=client_auth,
    )


def client_tls(pki: Path, *, ca: str = "ca", cert_from: str | None = "ca") -> TlsSettings:
    if cert_from is None:
        return TlsSettings(enabled=True, ca_file=pki / ca / "ca.crt")
    return TlsSettings(
        enabled=True,
        ca_file=pki / ca / "ca.crt",
        cert_file=pki / cert_from / "client.crt",
        key_file=pki / cert_from / "client.key",
    )


async def serve(tls: TlsSettings | None) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server()
    servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = add_port(server, "127.0.0.1:0", tls)
    await server.start()
    await servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    return server, port


@pytest.fixture
async def mtls_port(pki: Path) -> AsyncIterator[int]:
    server, port = await serve(server_tls(pki))
    yield port
    await server.stop(None)


async def check(port: int, tls: TlsSettings | None, *, host: str = "127.0.0.1") -> int:
    """The health status, over ``tls``; raises grpc.aio.AioRpcError when the call fails."""
    async with secure_or_insecure_aio_channel(f"{host}:{port}", tls) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=5
        )
        return int(reply.status)


# ---------------------------------------------------------------------- the CA


def test_certificates_are_for_servers_and_clients(pki: Path) -> None:
    d = pki / "ca"
    ca = x509.load_pem_x509_certificate((d / "ca.crt").read_bytes())
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    cert = x509.load_pem_x509_certificate((d / "server.crt").read_bytes())
    assert cert.issuer == ca.subject
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["server", "localhost"]
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(usages) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    for key in ("ca.key", "server.key", "client.key"):
        assert stat.S_IMODE((d / key).stat().st_mode) == 0o600


def test_an_existing_ca_is_reused(pki: Path) -> None:
    again, created = CertificateAuthority.load_or_create(pki / "ca")
    assert not created
    assert again.certificate_pem == (pki / "ca" / "ca.crt").read_bytes()


def test_bad_names_and_hosts_are_refused(tmp_path: Path) -> None:
    ca = CertificateAuthority.create()
    with pytest.raises(InvalidInput, match="invalid certificate name"):
        ca.write(tmp_path, "../evil")
    with pytest.raises(InvalidInput, match="neither a DNS name nor an IP address"):
        ca.issue("audit", hosts=["not a host"])
    (tmp_path / "ca.crt").write_text("junk")
    (tmp_path / "ca.key").write_text("junk")
    with pytest.raises(ConfigError, match="not a PEM certificate"):
        CertificateAuthority.load(tmp_path)


# ---------------------------------------------------------------------- mutual TLS


async def test_a_client_with_a_certificate_of_the_ca_is_served(mtls_port: int, pki: Path) -> None:
    assert await check(mtls_port, client_tls(pki)) == health_pb2.HealthCheckResponse.SERVING
    # the certificate names localhost too
    assert (
        await check(mtls_port, client_tls(pki), host="localhost")
        == health_pb2.HealthCheckResponse.SERVING
    )


async def test_the_synchronous_channel_works_too(mtls_port: int, pki: Path) -> None:
    def call() -> int:
        with secure_or_insecure_channel(f"127.0.0.1:{mtls_port}", client_tls(pki)) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=5
            )
        return int(reply.status)

    assert await asyncio.to_thread(call) == health_pb2.HealthCheckResponse.SERVING


async def test_a_client_without_a_certificate_is_refused(mtls_port: int, pki: Path) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await check(mtls_port, client_tls(pki, cert_from=None))
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_a_client_certificate_of_another_ca_is_refused(mtls_port: int, pki: Path) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await check(mtls_port, client_tls(pki, cert_from="other"))
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_a_client_trusting_another_ca_is_refused(mtls_port: int, pki: Path) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await check(mtls_port, client_tls(pki, ca="other", cert_from="ca"))
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_plaintext_to_a_tls_port_fails(mtls_port: int) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await check(mtls_port, None)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_a_wrong_server_name_is_refused_and_the_override_accepted(
    mtls_port: int, pki: Path
) -> None:
    wrong = client_tls(pki).model_copy(update={"server_name": "governance"})
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await check(mtls_port, wrong)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    right = client_tls(pki).model_copy(update={"server_name": "server"})
    assert await check(mtls_port, right) == health_pb2.HealthCheckResponse.SERVING


# ---------------------------------------------------------------------- TLS without client auth


async def test_server_tls_without_client_auth_takes_any_trusting_client(pki: Path) -> None:
    server, port = await serve(server_tls(pki, client_auth=False))
    try:
        no_cert = client_tls(pki, cert_from=None)
        assert await check(port, no_cert) == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.aio.AioRpcError):
            await check(port, None)
    finally:
        await server.stop(None)


async def test_tls_off_is_plaintext(pki: Path) -> None:
    off = TlsSettings(ca_file=pki / "ca" / "ca.crt")  # files named, but not enabled
    server, port = await serve(off)
    try:
        assert await check(port, off) == health_pb2.HealthCheckResponse.SERVING
        assert await check(port, None) == health_pb2.HealthCheckResponse.SERVING
    finally:
        await server.stop(None)


# ---------------------------------------------------------------------- settings and files


def test_enabled_without_a_ca_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GANTRY_TLS__ENABLED", "true")
    with pytest.raises(ConfigError, match="GANTRY_TLS__CA_FILE"):
        load_settings(CommonSettings)


def test_client_auth_needs_a_certificate(monkeypatch: pytest.MonkeyPatch, pki: Path) -> None:
    monkeypatch.setenv("GANTRY_TLS__ENABLED", "true")
    monkeypatch.setenv("GANTRY_TLS__CA_FILE", str(pki / "ca" / "ca.crt"))
    monkeypatch.setenv("GANTRY_TLS__CLIENT_AUTH", "true")
    with pytest.raises(ConfigError, match="GANTRY_TLS__CERT_FILE and GANTRY_TLS__KEY_FILE"):
        load_settings(CommonSettings)
    monkeypatch.setenv("GANTRY_TLS__CERT_FILE", str(pki / "ca" / "server.crt"))
    with pytest.raises(ConfigError, match="go together"):
        load_settings(CommonSettings)
    monkeypatch.setenv("GANTRY_TLS__KEY_FILE", str(pki / "ca" / "server.key"))
    tls = load_settings(CommonSettings).tls
    assert tls.enabled and tls.client_auth and tls.key_file == pki / "ca" / "server.key"


def test_tls_is_off_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ENABLED", "CA_FILE", "CERT_FILE", "KEY_FILE", "CLIENT_AUTH", "SERVER_NAME"):
        monkeypatch.delenv(f"GANTRY_TLS__{name}", raising=False)
    assert load_settings(CommonSettings).tls == TlsSettings()


def test_a_missing_file_names_the_setting_and_the_path(tmp_path: Path, pki: Path) -> None:
    missing = tmp_path / "nope.crt"
    tls = TlsSettings(enabled=True, ca_file=missing)
    with pytest.raises(ConfigError, match=f"GANTRY_TLS__CA_FILE {missing}"):
        channel_credentials(tls)
    server = grpc.server(thread_pool=None)  # type: ignore[arg-type]
    no_cert = TlsSettings(enabled=True, ca_file=pki / "ca" / "ca.crt")
    with pytest.raises(ConfigError, match="needs GANTRY_TLS__CERT_FILE"):
        add_port(server, "127.0.0.1:0", no_cert)
    junk = tmp_path / "junk.key"
    junk.write_text("not a key")
    bad_key = server_tls(pki).model_copy(update={"key_file": junk})
    with pytest.raises(ConfigError, match=r"GANTRY_TLS__KEY_FILE .* is not a PEM file"):
        add_port(server, "127.0.0.1:0", bad_key)


def test_ssl_context_for_nats(pki: Path, tmp_path: Path) -> None:
    context = ssl_context(client_tls(pki))
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    mismatched = client_tls(pki).model_copy(update={"key_file": pki / "other" / "client.key"})
    with pytest.raises(ConfigError, match="do not make a usable certificate and key"):
        ssl_context(mismatched)
    with pytest.raises(ConfigError, match="GANTRY_TLS__CA_FILE"):
        ssl_context(TlsSettings(enabled=True, ca_file=tmp_path / "missing.crt"))
