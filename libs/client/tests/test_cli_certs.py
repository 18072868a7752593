"""``gantry admin certs``: a development CA and one TLS certificate per name."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from cryptography import x509

from gantry.client import cli
from gantry.client.admin import CERTIFICATE_NAMES

pytestmark = pytest.mark.timeout(30)


def sans(path: Path) -> list[str]:
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return [str(v) for v in names.get_values_for_type(x509.DNSName)] + [
        str(v) for v in names.get_values_for_type(x509.IPAddress)
    ]


def test_writes_a_ca_and_a_certificate_per_service(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "certs"
    assert cli.main(["admin", "certs", "--out", str(out), "--host", "gantry.example"]) == 0
    printed = capsys.readouterr().out
    assert "created the CA" in printed and "training-agent.crt" in printed
    assert len(CERTIFICATE_NAMES) == 10 and {"client", "console"} <= set(CERTIFICATE_NAMES)
    for name in CERTIFICATE_NAMES:
        assert sans(out / f"{name}.crt") == [name, "localhost", "gantry.example", "127.0.0.1"]
        assert stat.S_IMODE((out / f"{name}.key").stat().st_mode) == 0o600
    assert stat.S_IMODE((out / "ca.key").stat().st_mode) == 0o600
    ca = (out / "ca.crt").read_bytes()

    # a second run reuses the CA: the first certificates stay valid
    assert cli.main(["admin", "certs", "--out", str(out), "--name", "audit"]) == 0
    assert "reused the CA" in capsys.readouterr().out
    assert (out / "ca.crt").read_bytes() == ca
    assert sans(out / "audit.crt") == ["audit", "localhost", "127.0.0.1"]


def test_bad_names_and_hosts_are_refused_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "certs"
    assert cli.main(["admin", "certs", "--out", str(out), "--name", "../x"]) == 2
    assert "invalid certificate name '../x'" in capsys.readouterr().err
    bad_host = ["admin", "certs", "--out", str(out), "--name", "audit", "--host", "a b"]
    assert cli.main(bad_host) == 2
    assert "neither a DNS name nor an IP address" in capsys.readouterr().err
    assert not out.exists()
