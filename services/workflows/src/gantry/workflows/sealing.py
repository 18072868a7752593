"""Secrets at rest in the workflows database: AES-256-GCM, bound to the row they belong to.

A dev session's login token has to be kept (it is shown to its owner again with ``gantry
sessions get``), so it is stored sealed: ``v1:`` and the base64 of a random 96-bit nonce and
the ciphertext with its tag, the session's name as associated data (a sealed token copied to
another row does not open). The key is the platform key ring's secret
``workflows-sessions`` (32 random bytes, made on first use, readable by the service alone).
"""

from __future__ import annotations

import base64
import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from gantry.core import GantryError

PREFIX = "v1:"
KEY_NAME = "workflows-sessions"


class SealBroken(GantryError):
    """A sealed value that does not open with this key (another key, or tampered)."""


class Sealer:
    """Seals and opens short secrets with one AES-256-GCM key."""

    def __init__(self, key: bytes) -> None:
        if len(key) != 32:
            raise ValueError("an AES-256 key is 32 bytes")
        self._aead = AESGCM(key)

    @classmethod
    def ephemeral(cls) -> Sealer:
        """A sealer with a random key that lives as long as this object (tests)."""
        return cls(os.urandom(32))

    def seal(self, secret: str, *, bound_to: str) -> str:
        if not secret:
            return ""
        nonce = os.urandom(12)
        sealed = self._aead.encrypt(nonce, secret.encode(), bound_to.encode())
        return PREFIX + base64.urlsafe_b64encode(nonce + sealed).decode()

    def open(self, value: str, *, bound_to: str) -> str:
        if not value.startswith(PREFIX):
            return value  # empty, or written before sealing (read as it is, sealed when saved)
        raw = base64.urlsafe_b64decode(value[len(PREFIX) :])
        try:
            return self._aead.decrypt(raw[:12], raw[12:], bound_to.encode()).decode()
        except InvalidTag:
            raise SealBroken(
                f"the sealed secret of {bound_to} does not open with this service's key",
                hint=f"the key ring's secret {KEY_NAME} changed; stop and resume the session "
                "for a new token",
            ) from None


__all__ = ["KEY_NAME", "PREFIX", "SealBroken", "Sealer"]
