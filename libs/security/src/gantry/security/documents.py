"""Signed JSON documents (reports handed to compliance staff and regulators).

A document is a JSON object. Its **digest** is SHA-256 over its canonical form (keys sorted,
no spaces, UTF-8) without the ``signature`` member; the signature is Ed25519 over an ASCII
message naming the document's kind, so a signature over one kind of document can never pass
for another::

    gantry-document/v1
    <kind>
    <digest, lower-case hex>

Anyone holding the signer's public key (``keys/trusted/<kid>.pub``) checks it offline with
:func:`check_document`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from gantry.core import IntegrityError
from gantry.security.keys import SigningKey, TrustStore

PREFIX = "gantry-document/v1"


def canonical_document(doc: Mapping[str, Any]) -> bytes:
    """The bytes the digest covers: ``doc`` without its signature, canonical JSON."""
    body = {k: v for k, v in doc.items() if k != "signature"}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def document_digest(doc: Mapping[str, Any]) -> str:
    """SHA-256 of :func:`canonical_document`, hex."""
    return hashlib.sha256(canonical_document(doc)).hexdigest()


def _message(kind: str, digest: str) -> bytes:
    return f"{PREFIX}\n{kind}\n{digest}".encode()


def sign_document(doc: Mapping[str, Any], key: SigningKey, *, kind: str) -> dict[str, Any]:
    """A copy of ``doc`` with ``kind`` and ``key_id`` set and its ``signature`` added."""
    body = {k: v for k, v in doc.items() if k != "signature"}
    body["kind"] = kind
    body["key_id"] = key.kid
    digest = document_digest(body)
    body["signature"] = {
        "digest": digest,
        "value": base64.b64encode(key.sign(_message(kind, digest))).decode(),
    }
    return body


def check_document(doc: Mapping[str, Any], trust: TrustStore, *, kind: str) -> str:
    """Check ``doc``'s signature by a trusted key; return its digest or raise IntegrityError."""
    hint = "the document was altered after it was signed, or the signer's key is not trusted here"
    if doc.get("kind") != kind:
        raise IntegrityError(f"this is not a {kind} (its kind is {doc.get('kind')!r})")
    signature = doc.get("signature")
    if not isinstance(signature, Mapping):
        raise IntegrityError("the document carries no signature", hint=hint)
    digest = document_digest(doc)
    if signature.get("digest") != digest:
        raise IntegrityError(
            f"the document's content does not match its signed digest "
            f"({str(signature.get('digest'))[:16]}..., recomputed {digest[:16]}...)",
            hint=hint,
        )
    try:
        raw = base64.b64decode(str(signature.get("value", "")), validate=True)
        trust.verify(str(doc.get("key_id", "")), _message(kind, digest), raw)
    except (binascii.Error, ValueError) as exc:
        raise IntegrityError(f"the document's signature is not valid: {exc}", hint=hint) from None
    except IntegrityError:
        raise
    except Exception as exc:
        raise IntegrityError(f"the document's signature is not valid: {exc}", hint=hint) from None
    return digest


__all__ = ["canonical_document", "check_document", "document_digest", "sign_document"]
