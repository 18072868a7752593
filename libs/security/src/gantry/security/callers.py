"""How a platform service checks who calls it: the verifier every service builds the same way.

A caller proves itself with a token signed by the platform's token issuer (users, service
accounts), or — for platform services calling each other — with a token the calling service
signed with its own key, valid for that service alone (gantry.security.tokens). Every token is
also checked against the revocation list the service keeps up to date from the bus.
"""

from __future__ import annotations

from gantry.events import Bus
from gantry.security.keyring import Keyring
from gantry.security.revocations import RevocationList, RevocationWatcher
from gantry.security.tokens import TokenVerifier


async def watch_revocations(bus: Bus) -> RevocationWatcher:
    """Read the whole revocation list, then keep it current (stop it before closing ``bus``)."""
    watcher = RevocationWatcher(bus, RevocationList())
    await watcher.start()
    return watcher


def caller_verifier(
    keyring: Keyring, known_roles: frozenset[str], revocations: RevocationList
) -> TokenVerifier:
    """The verifier of a service's API: issuer tokens, services' own tokens, revocations."""
    return TokenVerifier(
        keyring.token_trust(),
        known_roles=known_roles,
        service_trust=keyring.trust(),
        revocations=revocations,
    )


__all__ = ["caller_verifier", "watch_revocations"]
