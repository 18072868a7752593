"""Signed tree heads (STH) of the audit log, and client-side proof checking.

The signed message is ASCII, one field per line, so any language can rebuild it::

    gantry-audit-sth/v1
    <tree_size>
    <root hash, lower-case hex>
    <timestamp, Unix milliseconds>

A client that holds the audit service's public key (``keys/trusted/<kid>.pub``) checks the
signature, then checks inclusion and consistency proofs against the root — without trusting
the server that sent them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gantry.core import IntegrityError
from gantry.security.keys import SigningKey, TrustStore
from gantry.security.merkle import verify_consistency, verify_inclusion

STH_PREFIX = "gantry-audit-sth/v1"


@dataclass(frozen=True)
class TreeHead:
    """A tree head, signed or not yet."""

    tree_size: int
    root_hash: bytes
    timestamp_ms: int
    key_id: str = ""
    signature: bytes = b""

    def message(self) -> bytes:
        """The exact bytes that are signed."""
        return (
            f"{STH_PREFIX}\n{self.tree_size}\n{self.root_hash.hex()}\n{self.timestamp_ms}".encode()
        )

    def signed(self, key: SigningKey) -> TreeHead:
        """This head signed by ``key``."""
        return TreeHead(
            self.tree_size, self.root_hash, self.timestamp_ms, key.kid, key.sign(self.message())
        )

    def check_signature(self, trust: TrustStore) -> None:
        """Raise :class:`IntegrityError` unless the signature is valid for a trusted key."""
        try:
            trust.verify(self.key_id, self.message(), self.signature)
        except Exception as exc:
            raise IntegrityError(
                f"tree head of size {self.tree_size} has an invalid signature: {exc}",
                hint="the log or the response was altered, or the audit key is not trusted here",
            ) from None


def check_inclusion(
    head: TreeHead,
    trust: TrustStore,
    *,
    leaf_hash: bytes,
    index: int,
    proof: Sequence[bytes],
) -> None:
    """Check that leaf ``index`` with ``leaf_hash`` is in the signed tree; raise IntegrityError."""
    head.check_signature(trust)
    if not verify_inclusion(leaf_hash, index, head.tree_size, proof, head.root_hash):
        raise IntegrityError(
            f"inclusion proof for index {index} does not match the signed root of size "
            f"{head.tree_size}"
        )


def check_consistency(
    first: TreeHead, second: TreeHead, trust: TrustStore, proof: Sequence[bytes]
) -> None:
    """Check that ``second`` extends ``first`` (append-only); raise IntegrityError if not."""
    first.check_signature(trust)
    second.check_signature(trust)
    if not verify_consistency(
        first.tree_size, second.tree_size, first.root_hash, second.root_hash, proof
    ):
        raise IntegrityError(
            f"the log of size {second.tree_size} is not an extension of the log of size "
            f"{first.tree_size}: history was rewritten"
        )


__all__ = ["STH_PREFIX", "TreeHead", "check_consistency", "check_inclusion"]
