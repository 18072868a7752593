"""The agent's calls to the governance service: a job's data grant and its finished model.

The agent authenticates with its own service token (``GANTRY_AGENT__TOKEN``, or one issued
with the platform's issuer key in the embedded default). Governance issues a service a grant
only for a job the scheduler placed, and registers a model on a job's behalf only when the
job's owner may register it; the workers never hold credentials of their own beyond the grant.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

from gantry.client.errors import RemoteNotFound
from gantry.client.model_registry import ModelsClient
from gantry.core import GantryError, NotFound, Unavailable, get_logger
from gantry.core.runfile import run_file, service_address
from gantry.events.catalog import JobScheduled
from gantry.protos.v1 import governance_pb2 as pb
from gantry.security.keyring import Keyring
from gantry.security.tokens import ServiceToken
from gantry.training.export import ModelManifest
from gantry.training_agent.settings import AgentSettings

SERVICE_NAME = "training-agent"
#: How long a grant is asked for while governance has not yet seen the job's placement.
_GRANT_WAIT_S = 30.0
_log = get_logger("gantry.training_agent")


@dataclass(frozen=True)
class Grant:
    """A job's read grant: the token the workers send, and when it expires."""

    token: str
    expires_ms: int


class GovernanceLink:
    """Grants and model registration, over the governance gRPC API."""

    def __init__(self, settings: AgentSettings, keyring: Keyring) -> None:
        self._settings = settings
        self._keyring = keyring
        self._service_token = ServiceToken(
            SERVICE_NAME, keyring.issuer, configured=settings.agent.token.get_secret_value()
        )

    def address(self) -> str:
        """The governance address (setting, else the embedded platform's run file)."""
        return service_address(
            self._settings.data_dir,
            "governance",
            configured=self._settings.agent.governance_addr,
            setting="GANTRY_AGENT__GOVERNANCE_ADDR",
        )

    def known(self) -> bool:
        """Whether a governance service is configured or runs on this platform."""
        return bool(self._settings.agent.governance_addr) or (
            run_file(self._settings.data_dir, "governance").exists()
        )

    def token(self) -> str:
        """The agent's service token (issued here, and renewed, when none is configured)."""
        return self._service_token.get()

    def _client(self) -> ModelsClient:
        return ModelsClient(self.address(), self.token())

    # -- grants -------------------------------------------------------------------------------

    async def issue_grant(self, job: JobScheduled) -> Grant:
        """A read grant for the datasets the scheduler placed ``job`` with."""
        ttl = self._settings.agent.grant_ttl_s

        def call() -> Grant:
            client = self._client()
            try:
                reply = client._call(
                    "IssueGrant", pb.IssueGrantRequest(job_id=job.job_id, ttl_s=ttl)
                )
            finally:
                client.close()
            return Grant(token=reply.token, expires_ms=int(reply.expires_ms))

        # governance learns of the job from the same gantry.job.scheduled event, which it may
        # not have read yet: a job it does not know (or a restarting governance) is asked again
        deadline = time.monotonic() + _GRANT_WAIT_S
        delay = 0.2
        while True:
            try:
                return await asyncio.to_thread(call)
            except (RemoteNotFound, NotFound, Unavailable):
                if time.monotonic() + delay > deadline:
                    raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    # -- models -------------------------------------------------------------------------------

    async def register_model(self, job: JobScheduled, output_dir: Path) -> str | None:
        """Register the model the job exported into ``output_dir``; "name:version", or None
        when the job exported none."""
        manifest = ModelManifest.read(output_dir)
        if manifest is None:
            return None

        def call() -> str:
            client = self._client()
            try:
                version = client.register_model(
                    manifest.name,
                    output_dir / manifest.artifact,
                    framework=manifest.framework,
                    job_id=job.job_id,
                    metrics=manifest.metrics,
                    signature={**manifest.signature, "format": manifest.format},
                    description=manifest.description
                    or f"trained by job {job.name or job.job_id} (attempt {job.attempt})",
                    trained_on=[(d.dataset, d.version) for d in job.datasets],
                    code_version=manifest.code_version,
                )
            finally:
                client.close()
            return f"{version.name}:{version.version}"

        last: GantryError | None = None
        for attempt in range(3):
            try:
                return await asyncio.to_thread(call)
            except Unavailable as exc:  # governance restarting: try again shortly
                last = exc
                await asyncio.sleep(1.0 * (attempt + 1))
        assert last is not None
        raise last


__all__ = ["SERVICE_NAME", "GovernanceLink", "Grant"]
