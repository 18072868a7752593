"""The agent's calls to the governance service: a job's data grant, its input model, its
finished model and its output dataset.

The agent authenticates with its own service token (``GANTRY_AGENT__TOKEN``, or one issued
with the platform's issuer key in the embedded default). Governance issues a service a grant
only for a job the scheduler placed, lets it download only the model version the job's
``spec.model`` names when the job's owner may read models, registers a model on a job's
behalf only when the job's owner may register it, and commits a version of the job's
``spec.output`` dataset only when the owner may update it; the workers never hold
credentials of their own beyond the grant.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from gantry.client.errors import RemoteNotFound
from gantry.client.governance import GovernanceClient
from gantry.client.model_registry import ModelVersion
from gantry.core import GantryError, InvalidInput, NotFound, Unavailable, get_logger
from gantry.core.runfile import run_file, service_address
from gantry.events.catalog import JobScheduled
from gantry.protos.v1 import governance_pb2 as pb
from gantry.security.keyring import Keyring
from gantry.security.tokens import ServiceToken
from gantry.training.export import FORMATS, ModelManifest
from gantry.training.outputs import DATASET_DIR, dataset_files
from gantry.training_agent.settings import AgentSettings

SERVICE_NAME = "training-agent"
#: How long a grant is asked for while governance has not yet seen the job's placement.
_GRANT_WAIT_S = 30.0
_log = get_logger("gantry.training_agent")
T = TypeVar("T")


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
            SERVICE_NAME,
            functools.partial(keyring.service_key, SERVICE_NAME),
            configured=settings.agent.token.get_secret_value(),
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

    def _client(self) -> GovernanceClient:
        return GovernanceClient(self.address(), self.token(), tls=self._settings.tls)

    async def _retried(self, call: Callable[[], T], *, attempts: int = 3) -> T:
        """``call()`` in a thread, again after a pause while governance is unavailable (it
        restarts); other errors at once."""
        last: GantryError | None = None
        for attempt in range(attempts):
            try:
                return await asyncio.to_thread(call)
            except Unavailable as exc:
                last = exc
                await asyncio.sleep(1.0 * (attempt + 1))
        assert last is not None
        raise last

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

        return await self._when_placed(call)

    async def _when_placed(self, call: Callable[[], T]) -> T:
        """``call()`` in a thread, asked again for a while when governance does not know the
        job: it learns of it from the same gantry.job.scheduled event, which it may not have
        read yet (or it is restarting). Call only what can be NotFound for that reason."""
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

        return await self._retried(call)

    # -- input models -------------------------------------------------------------------------

    async def download_model(self, job: JobScheduled, name: str, version: int, into: Path) -> str:
        """Download the job's input model version into ``into`` in the shape the training
        runtime exports (the artefact and ``model.json``); "name:version". Governance checks
        that the job names this version and that its owner may read models."""

        def look_up() -> ModelVersion:
            client = self._client()
            try:
                return client.get_model(name, version)  # a missing model fails at once
            finally:
                client.close()

        info = await self._retried(look_up)
        try:
            parsed = json.loads(info.signature_json) if info.signature_json else {}
        except ValueError:
            parsed = {}  # not ours to judge: the runtime loads the bytes by their format
        signature: dict[str, Any] = parsed if isinstance(parsed, dict) else {}
        fmt = str(signature.pop("format", "") or "torch.export")
        artifact = FORMATS.get(fmt, "model.bin")

        def fetch() -> ModelVersion:
            into.mkdir(parents=True, exist_ok=True)
            for old in into.iterdir():  # an earlier attempt's copy
                if old.is_file():
                    old.unlink()
            client = self._client()
            try:
                return client.download_model(
                    name, into / artifact, version=info.version, job_id=job.job_id
                )
            finally:
                client.close()

        got = await self._when_placed(fetch)
        ModelManifest(
            name=got.name,
            artifact=artifact,
            format=fmt,
            framework=got.framework,
            metrics=dict(got.metrics),
            signature=signature,
            code_version=got.code_version,
            description=got.description,
        ).write(into)
        return f"{got.name}:{got.version}"

    # -- output datasets ----------------------------------------------------------------------

    async def commit_output(
        self, job: JobScheduled, dataset: str, message: str, output_dir: Path
    ) -> str:
        """Upload the Parquet files the job left under ``<output_dir>/dataset/`` and commit
        them as a new version of ``dataset`` on the job's behalf; "dataset@version"."""
        files = dataset_files(output_dir)
        if not files:
            raise InvalidInput(
                f"the job wrote no Parquet files under {output_dir / DATASET_DIR}, so there is "
                f"nothing to commit to {dataset}",
                hint="a transform writes its table there; a module or command writes *.parquet "
                "files into $GANTRY_OUTPUT_DIR/dataset/",
            )

        def look_up() -> None:
            client = self._client()
            try:
                client.get_dataset(dataset)  # a missing dataset fails at once
            finally:
                client.close()

        def upload(path: Path) -> str:
            client = self._client()
            try:
                return client.upload_table(dataset, path, job_id=job.job_id).upload_id
            finally:
                client.close()

        await self._retried(look_up)
        uploads = [await self._when_placed(functools.partial(upload, path)) for path in files]
        text = message or f"written by job {job.name or job.job_id}"

        def commit() -> str:
            client = self._client()
            try:
                version = client.commit(dataset, uploads, text, job_id=job.job_id)
            finally:
                client.close()
            return f"{version.dataset}@{version.id}"

        return await asyncio.to_thread(commit)  # not retried: a repeat would commit twice


__all__ = ["SERVICE_NAME", "GovernanceLink", "Grant"]
