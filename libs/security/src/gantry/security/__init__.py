"""gantry.security: identity tokens (Ed25519 JWTs), the RBAC policy engine and the gRPC auth
interceptor.

Typical service wiring::

    key = load_or_create_signing_key(data_dir / "keys" / "signing.pem")
    trust = TrustStore.load_dir(data_dir / "keys" / "trusted")
    policy = default_policy()
    interceptor = AuthInterceptor(
        TokenVerifier(trust, known_roles=policy.roles), Authorizer(policy), RULES, sink, "audit"
    )
"""

from gantry.security.decisions import EventDecisionSink
from gantry.security.interceptor import (
    PUBLIC_METHOD_PREFIXES,
    AuthInterceptor,
    DecisionSink,
    MemoryDecisionSink,
    MethodRule,
    current_principal,
)
from gantry.security.keyring import DirectoryTrustStore, Keyring, load_or_create_secret
from gantry.security.keys import (
    SigningKey,
    TrustStore,
    key_fingerprint,
    load_or_create_signing_key,
    write_public_key,
)
from gantry.security.policy import Policy, Rule
from gantry.security.principal import ANONYMOUS, Principal, PrincipalKind
from gantry.security.rbac import Authorizer, Decision, default_policy
from gantry.security.tokens import MAX_TTL, TokenIssuer, TokenVerifier, parse_ttl
from gantry.security.treehead import TreeHead, check_consistency, check_inclusion

__all__ = [
    "ANONYMOUS",
    "MAX_TTL",
    "PUBLIC_METHOD_PREFIXES",
    "AuthInterceptor",
    "Authorizer",
    "Decision",
    "DecisionSink",
    "DirectoryTrustStore",
    "EventDecisionSink",
    "Keyring",
    "MemoryDecisionSink",
    "MethodRule",
    "Policy",
    "Principal",
    "PrincipalKind",
    "Rule",
    "SigningKey",
    "TokenIssuer",
    "TokenVerifier",
    "TreeHead",
    "TrustStore",
    "check_consistency",
    "check_inclusion",
    "current_principal",
    "default_policy",
    "key_fingerprint",
    "load_or_create_secret",
    "load_or_create_signing_key",
    "parse_ttl",
    "write_public_key",
]
