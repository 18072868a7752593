"""A development certificate authority: a CA and per-service certificates for (mutual) TLS.

``gantry admin certs`` and the tests use it; a production cluster would rather let
cert-manager (or its own PKI) issue the same files. Keys are EC P-256 (every TLS stack in use
takes them; Ed25519 is not), certificates carry the DNS names and IP addresses given as subject
alternative names and both the serverAuth and clientAuth extended key usages, so one
certificate serves a service as a server and as a client of the others. The layout::

    <directory>/ca.crt        the CA certificate (what GANTRY_TLS__CA_FILE names)
    <directory>/ca.key        the CA's key (mode 0600): keep it to issue more, or delete it
    <directory>/<name>.crt    a certificate for <name> (GANTRY_TLS__CERT_FILE)
    <directory>/<name>.key    its key (mode 0600; GANTRY_TLS__KEY_FILE)
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gantry.core import ConfigError, InvalidInput

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
#: Names become file names and DNS names: letters, digits, '-' and '.', starting with a letter
#: or digit.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]{0,62}$")
_BACKDATE = dt.timedelta(minutes=5)  # tolerate clocks a little behind the issuer's

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class IssuedCertificate:
    """A certificate written by :meth:`CertificateAuthority.write`: where it is, and for what."""

    name: str
    cert_file: Path
    key_file: Path
    dns_names: tuple[str, ...]
    ip_addresses: tuple[str, ...]
    not_after: dt.datetime


def check_name(name: str) -> str:
    """``name`` if it can name a certificate (its files and first DNS name), else
    :class:`InvalidInput`."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidInput(
            f"invalid certificate name {name!r}",
            hint="use letters, digits, '-' and '.', starting with a letter or digit",
        )
    return name


def check_days(days: int) -> int:
    """``days`` if it is a usable validity (at least one day), else :class:`InvalidInput`."""
    if days < 1:
        raise InvalidInput(f"a certificate valid {days} days is no use", hint="give days >= 1")
    return days


def split_hosts(hosts: Sequence[str]) -> tuple[list[str], list[IpAddress]]:
    """``hosts`` as DNS names and IP addresses, each once, in the order given."""
    names: list[str] = []
    ips: list[IpAddress] = []
    for host in hosts:
        host = host.strip()
        if not host:
            raise InvalidInput("an empty host name", hint="give a DNS name or an IP address")
        try:
            ip = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            if not re.fullmatch(r"[A-Za-z0-9*]([A-Za-z0-9.*-]{0,251}[A-Za-z0-9])?", host):
                raise InvalidInput(
                    f"{host!r} is neither a DNS name nor an IP address",
                    hint="give names like audit, audit.gantry.svc or 10.0.0.5",
                ) from None
            if host not in names:
                names.append(host)
        else:
            if ip not in ips:
                ips.append(ip)
    return names, ips


class CertificateAuthority:
    """A CA key and its self-signed certificate, which issue certificates for services."""

    def __init__(self, key: ec.EllipticCurvePrivateKey, certificate: x509.Certificate) -> None:
        self.key = key
        self.certificate = certificate

    @classmethod
    def create(
        cls, common_name: str = "Gantry development CA", *, days: int = 3650
    ) -> CertificateAuthority:
        """A new CA (basicConstraints CA:true), valid ``days`` days from now."""
        check_days(days)
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        now = dt.datetime.now(dt.UTC)
        public = key.public_key()
        certificate = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
            .sign(key, hashes.SHA256())
        )
        return cls(key, certificate)

    @classmethod
    def load(cls, directory: Path) -> CertificateAuthority:
        """The CA saved under ``directory`` (``ca.crt`` and ``ca.key``)."""
        cert_path, key_path = Path(directory) / CA_CERT, Path(directory) / CA_KEY
        try:
            certificate = x509.load_pem_x509_certificate(cert_path.read_bytes())
            key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        except OSError as exc:
            raise ConfigError(
                f"cannot read the CA in {directory}: {exc.strerror or exc}: {exc.filename}",
                hint=f"a CA directory holds {CA_CERT} and {CA_KEY}",
            ) from None
        except (ValueError, TypeError) as exc:
            raise ConfigError(
                f"the CA in {directory} is not a PEM certificate and unencrypted key: {exc}",
                hint=f"replace {CA_CERT} and {CA_KEY}, or write the certificates to a new "
                "directory",
            ) from None
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ConfigError(
                f"the CA key {key_path} is not an EC key",
                hint="use a CA made by 'gantry admin certs'",
            )
        if key.public_key().public_numbers() != _ec_public(certificate).public_numbers():
            raise ConfigError(
                f"{key_path} is not the key of {cert_path}",
                hint="put the CA's own key beside its certificate",
            )
        return cls(key, certificate)

    @classmethod
    def load_or_create(cls, directory: Path) -> tuple[CertificateAuthority, bool]:
        """The CA under ``directory``, or a new one saved there; and whether it is new."""
        if (Path(directory) / CA_CERT).exists() or (Path(directory) / CA_KEY).exists():
            return cls.load(directory), False
        ca = cls.create()
        ca.save(directory)
        return ca, True

    def save(self, directory: Path) -> Path:
        """Write ``ca.crt`` and ``ca.key`` (mode 0600) under ``directory``; the certificate's
        path."""
        directory = Path(directory)
        _write(directory / CA_KEY, _key_pem(self.key), private=True)
        return _write(directory / CA_CERT, self.certificate_pem, private=False)

    @property
    def certificate_pem(self) -> bytes:
        """The CA certificate, PEM: what clients and servers trust."""
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    def issue(
        self, name: str, *, hosts: Sequence[str] = (), days: int = 365
    ) -> tuple[bytes, bytes, x509.Certificate]:
        """A new key and certificate for ``name``: ``(cert_pem, key_pem, certificate)``.

        The subject alternative names are ``name`` and ``hosts`` (DNS names and IP
        addresses); the certificate is good for TLS servers and clients both.
        """
        check_name(name)
        check_days(days)
        dns_names, ips = split_hosts([name, *hosts])
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        not_after = min(now + dt.timedelta(days=days), self.certificate.not_valid_after_utc)
        public = key.public_key()
        sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
        sans += [x509.IPAddress(ip) for ip in ips]
        certificate = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(self.certificate.subject)
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=True,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                critical=False,
            )
            .sign(self.key, hashes.SHA256())
        )
        return certificate.public_bytes(serialization.Encoding.PEM), _key_pem(key), certificate

    def write(
        self, directory: Path, name: str, *, hosts: Sequence[str] = (), days: int = 365
    ) -> IssuedCertificate:
        """Issue a certificate for ``name`` and write ``<name>.crt`` and ``<name>.key`` (mode
        0600) under ``directory``, replacing any there."""
        cert_pem, key_pem, certificate = self.issue(name, hosts=hosts, days=days)
        directory = Path(directory)
        key_file = _write(directory / f"{name}.key", key_pem, private=True)
        cert_file = _write(directory / f"{name}.crt", cert_pem, private=False)
        dns_names, ips = split_hosts([name, *hosts])
        return IssuedCertificate(
            name,
            cert_file,
            key_file,
            tuple(dns_names),
            tuple(str(ip) for ip in ips),
            certificate.not_valid_after_utc,
        )


def _ec_public(certificate: x509.Certificate) -> ec.EllipticCurvePublicKey:
    public = certificate.public_key()
    if not isinstance(public, ec.EllipticCurvePublicKey):
        raise ConfigError("the CA certificate does not hold an EC key")
    return public


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: Path, content: bytes, *, private: bool) -> Path:
    """Write ``content`` to ``path`` atomically; a private file is readable by its owner only
    from the moment it exists."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if private else 0o644)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(content)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


__all__ = [
    "CA_CERT",
    "CA_KEY",
    "CertificateAuthority",
    "IssuedCertificate",
    "check_days",
    "check_name",
    "split_hosts",
]
