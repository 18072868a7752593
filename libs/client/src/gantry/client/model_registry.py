"""The model registry SDK: register model artifacts with their lineage, list, fetch, download.

Artifacts stream in 1 MiB chunks both ways, and both ways the sha256 is checked: on
registration against the digest the service reports, on download against the one it stored.
A download is written to a temporary file beside the destination and renamed only once the
digest matches, so a failed download never leaves a partial file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gantry.client._connection import GovernanceConnection, Progress
from gantry.client._files import CHUNK_BYTES, PartFile, read_chunks
from gantry.client.specs import VersionRef
from gantry.core import IntegrityError, InvalidInput
from gantry.protos.v1 import governance_pb2 as pb


@dataclass(frozen=True)
class ModelVersion:
    """A registered model version: its artifact digest and size, metrics, and lineage."""

    name: str
    version: int
    digest: str  #: sha256 of the artifact
    bytes: int
    framework: str
    job_id: str
    metrics: Mapping[str, float] = field(default_factory=dict)
    signature_json: str = ""
    registered_by: str = ""
    created_ms: int = 0
    trained_on: tuple[VersionRef, ...] = ()
    description: str = ""
    code_version: str = ""  #: the code that trained it, e.g. a commit id ("" = not given)

    @property
    def signature(self) -> Any:
        """The inputs/outputs signature, parsed from JSON (None when there is none)."""
        return json.loads(self.signature_json) if self.signature_json else None

    @classmethod
    def from_pb(cls, m: pb.ModelVersion) -> ModelVersion:
        """From the protocol message."""
        return cls(
            m.name,
            m.version,
            m.digest,
            m.bytes,
            m.framework,
            m.job_id,
            dict(m.metrics),
            m.signature_json,
            m.registered_by,
            m.created_ms,
            tuple(VersionRef(v.dataset, v.version) for v in m.trained_on),
            m.description,
            m.code_version,
        )


class ModelsClient(GovernanceConnection):
    """The model registry on the governance service."""

    def register_model(
        self,
        name: str,
        artifact: str | Path | bytes,
        *,
        framework: str,
        job_id: str = "",
        metrics: Mapping[str, float] | None = None,
        signature: Any = None,
        description: str = "",
        trained_on: Sequence[tuple[str, str]] = (),
        code_version: str = "",
        progress: Progress | None = None,
    ) -> ModelVersion:
        """Register a new version of model ``name`` from a file or bytes; the version made.

        ``job_id``, ``trained_on`` (dataset, version) pairs and ``code_version`` (e.g. the
        commit that trained it) record lineage; ``signature`` is any JSON-serialisable
        description of inputs and outputs. ``progress`` receives artifact bytes sent. Raises
        :class:`IntegrityError` if the service stored other bytes.

        A user's token needs ``register model``. A service's token (a job's training agent)
        registers only for ``job_id``, a job the scheduler placed: the version is registered
        by the job's owner, who needs ``register model``, and ``trained_on`` must be among the
        dataset versions the job was scheduled with.
        """
        if not framework:
            raise InvalidInput("say which framework made the model, e.g. framework='pytorch'")
        try:
            signature_json = json.dumps(signature, sort_keys=True) if signature is not None else ""
        except (TypeError, ValueError) as exc:
            raise InvalidInput(f"the model signature is not JSON-serialisable: {exc}") from None
        try:
            metric_values = {str(k): float(v) for k, v in (metrics or {}).items()}
        except (TypeError, ValueError) as exc:
            raise InvalidInput(f"metric values must be numbers: {exc}") from None
        if isinstance(artifact, bytes):
            chunks: Iterator[bytes] = _memory_chunks(artifact)
        else:
            if not Path(artifact).is_file():
                raise InvalidInput(f"{artifact}: no such file")
            chunks = read_chunks(artifact)
        start = pb.ModelStart(
            name=name,
            framework=framework,
            job_id=job_id,
            metrics=metric_values,
            signature_json=signature_json,
            description=description,
            trained_on=[pb.GrantedVersion(dataset=d, version=v) for d, v in trained_on],
            code_version=code_version,
        )
        digest = hashlib.sha256()
        sent = 0

        def messages() -> Iterator[pb.RegisterModelRequest]:
            nonlocal sent
            yield pb.RegisterModelRequest(start=start)
            for chunk in chunks:
                digest.update(chunk)
                sent += len(chunk)
                yield pb.RegisterModelRequest(data=chunk)
                if progress is not None:
                    progress(len(chunk))

        model = ModelVersion.from_pb(self._send_stream("RegisterModel", messages()))
        _check_artifact(model, digest.hexdigest(), sent, "registered")
        return model

    def list_models(self, name: str = "") -> list[ModelVersion]:
        """Every version of model ``name``, or of every model for ""."""
        reply = self._call("ListModels", pb.ListModelsRequest(name=name))
        return [ModelVersion.from_pb(v) for v in reply.versions]

    def get_model(self, name: str, version: int = 0) -> ModelVersion:
        """One model version; the latest for 0."""
        reply = self._call("GetModel", pb.GetModelRequest(name=name, version=version))
        return ModelVersion.from_pb(reply)

    def download_model(
        self,
        name: str,
        dest_path: str | Path,
        *,
        version: int = 0,
        progress: Progress | None = None,
        job_id: str = "",
    ) -> ModelVersion:
        """Download a model version's artifact to ``dest_path``; the version downloaded.

        The file appears only once complete and matching the registered sha256; an existing
        file at ``dest_path`` is replaced then. ``progress`` receives bytes received.
        ``job_id``: a service (a node agent) downloads for a job the scheduler placed whose
        ``spec.model`` is this version, and only when the job's owner may read models.
        """
        dest = Path(dest_path)
        if dest.is_dir():
            raise InvalidInput(
                f"{dest} is a directory", hint=f"give a file path, e.g. {dest / name}"
            )
        part = PartFile(dest)
        try:
            info, digest, size = self._receive_model(name, version, part, progress, job_id)
            _check_artifact(info, digest, size, "downloaded")
            part.finish()
        finally:
            part.discard()
        return info

    def _receive_model(
        self, name: str, version: int, sink: PartFile, progress: Progress | None, job_id: str = ""
    ) -> tuple[ModelVersion, str, int]:
        request = pb.GetModelRequest(name=name, version=version, job_id=job_id)
        info: ModelVersion | None = None
        digest = hashlib.sha256()
        size = 0
        with contextlib.closing(self._receive_stream("DownloadModel", request)) as replies:
            for reply in replies:
                if info is None:
                    if not reply.HasField("info"):
                        raise IntegrityError(
                            f"model {name!r}: the download did not start with the model's info"
                        )
                    info = ModelVersion.from_pb(reply.info)
                if reply.data:
                    sink.write(reply.data)
                    digest.update(reply.data)
                    size += len(reply.data)
                    if progress is not None:
                        progress(len(reply.data))
        if info is None:
            raise IntegrityError(f"model {name!r}: the service sent an empty download")
        return info, digest.hexdigest(), size


def _memory_chunks(data: bytes) -> Iterator[bytes]:
    view = memoryview(data)
    yield bytes(view[:CHUNK_BYTES])
    for offset in range(CHUNK_BYTES, len(data), CHUNK_BYTES):
        yield bytes(view[offset : offset + CHUNK_BYTES])


def _check_artifact(model: ModelVersion, digest: str, size: int, what: str) -> None:
    expected = model.digest.lower().removeprefix("sha256:")
    if expected and expected != digest:
        raise IntegrityError(
            f"model {model.name} v{model.version}: the {what} bytes have sha256 {digest}, "
            f"the registry says {expected}"
        )
    if model.bytes and model.bytes != size:
        raise IntegrityError(
            f"model {model.name} v{model.version}: {size:,} bytes {what}, "
            f"the registry says {model.bytes:,}"
        )


__all__ = ["ModelVersion", "ModelsClient"]
