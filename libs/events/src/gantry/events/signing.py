"""Event signatures: a header ``Gantry-Signature: <kid>:<base64 Ed25519 signature>``.

The signature covers the canonical bytes of the envelope. The key material lives in
``gantry.security`` (``SigningKey``, ``TrustStore``); this module only needs their shape.
"""

from __future__ import annotations

import base64
import binascii
from typing import Protocol

from gantry.events.errors import PermanentError

SIGNATURE_HEADER = "Gantry-Signature"


class EventSigner(Protocol):
    """Signs canonical event bytes (``gantry.security.SigningKey`` is one)."""

    @property
    def kid(self) -> str:
        """Key id the verifier looks the public key up by."""
        ...

    def sign(self, data: bytes) -> bytes:
        """Ed25519 signature over ``data``."""
        ...


class EventVerifier(Protocol):
    """Checks signatures (``gantry.security.TrustStore`` is one); raises on failure."""

    def verify(self, kid: str, data: bytes, signature: bytes) -> None:
        """Raise if ``signature`` is not a valid signature of ``data`` by key ``kid``."""
        ...


def signature_header(signer: EventSigner, canonical: bytes) -> str:
    """The header value for ``canonical`` signed by ``signer``."""
    return f"{signer.kid}:{base64.b64encode(signer.sign(canonical)).decode()}"


def check_signature(verifier: EventVerifier, header: str | None, canonical: bytes) -> str:
    """Verify a header value against ``canonical``; return the key id or raise PermanentError."""
    kid, signature = parse_signature_header(header)
    try:
        verifier.verify(kid, canonical, signature)
    except Exception as exc:
        raise PermanentError(f"bad event signature: {exc}") from None
    return kid


def parse_signature_header(header: str | None) -> tuple[str, bytes]:
    """(key id, signature) from a header value, or raise PermanentError saying what is wrong."""
    if not header:
        raise PermanentError(f"event is not signed (no {SIGNATURE_HEADER} header)")
    kid, sep, b64 = header.partition(":")
    if not sep or not kid:
        raise PermanentError(f"malformed {SIGNATURE_HEADER} header: expected '<kid>:<base64>'")
    try:
        signature = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        raise PermanentError(f"malformed {SIGNATURE_HEADER} header: bad base64") from None
    return kid, signature


__all__ = [
    "SIGNATURE_HEADER",
    "EventSigner",
    "EventVerifier",
    "check_signature",
    "parse_signature_header",
    "signature_header",
]
