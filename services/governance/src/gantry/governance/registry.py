"""The model registry (domain): trained checkpoints and exported models as governed objects.

A model version is an encrypted artifact in the object store plus its metadata (framework,
metrics, input/output signature) and lineage (the job that produced it, the dataset versions
it was trained on, the code version that trained it). Versions are numbered 1, 2, ... per model
name and never change.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import orjson
import sqlalchemy as sa

from gantry.core import InvalidInput, NotFound, new_id
from gantry.events.catalog import ModelRegistered
from gantry.governance import store as db
from gantry.governance.catalog import now_ms
from gantry.governance.changes import record
from gantry.governance.lineage import add_edge, dataset_node, model_node
from gantry.governance.schema import check_dataset_name
from gantry.storage import ObjectReader, ObjectStore, ObjectWriter

#: Longest code version kept (the column's width): room for a git describe or an image digest.
MAX_CODE_VERSION = 256


@dataclass(frozen=True)
class ModelRecord:
    """One registered model version."""

    name: str
    version: int
    digest: str
    bytes: int
    object_name: str
    framework: str
    job_id: str
    metrics: dict[str, float]
    signature_json: str
    trained_on: tuple[tuple[str, str], ...]
    description: str
    registered_by: str
    created_ms: int
    code_version: str = ""


@dataclass
class ModelMeta:
    """What the caller says about a model version being registered."""

    name: str
    framework: str = ""
    job_id: str = ""
    metrics: Mapping[str, float] = field(default_factory=dict)
    signature_json: str = ""
    description: str = ""
    trained_on: Sequence[tuple[str, str]] = ()
    code_version: str = ""

    def check(self) -> None:
        """Refuse a bad name, a signature that is not JSON, or an unusable code version."""
        try:
            check_dataset_name(self.name)
        except InvalidInput as exc:
            raise InvalidInput(f"model name {self.name!r} is not allowed", hint=exc.hint) from None
        if self.signature_json:
            try:
                orjson.loads(self.signature_json)
            except orjson.JSONDecodeError as exc:
                raise InvalidInput(
                    f"the model signature is not valid JSON: {exc}",
                    hint='e.g. {"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]}',
                ) from None
        if len(self.code_version) > MAX_CODE_VERSION or not self.code_version.isprintable():
            what = (
                f"is {len(self.code_version)} characters long (at most {MAX_CODE_VERSION})"
                if len(self.code_version) > MAX_CODE_VERSION
                else "holds control characters"
            )
            raise InvalidInput(
                f"the code version {what}",
                hint="give a commit id, tag or image digest, e.g. 3f2a9c81d0e4 or v1.4.2",
            )


def _record(row: sa.Row[tuple[object, ...]]) -> ModelRecord:
    m = row._mapping
    return ModelRecord(
        name=str(m["name"]),
        version=int(str(m["version"])),
        digest=str(m["digest"]),
        bytes=int(str(m["bytes"])),
        object_name=str(m["object_name"]),
        framework=str(m["framework"]),
        job_id=str(m["job_id"]),
        metrics={k: float(v) for k, v in orjson.loads(str(m["metrics_json"])).items()},
        signature_json=str(m["signature_json"]),
        trained_on=tuple(
            (d["dataset"], d["version"]) for d in orjson.loads(str(m["trained_on_json"]))
        ),
        description=str(m["description"]),
        registered_by=str(m["registered_by"]),
        created_ms=int(str(m["created_ms"])),
        code_version=str(m["code_version"] or ""),
    )


class ModelUpload:
    """An artifact being streamed in; :meth:`finish` registers it, :meth:`abort` drops it."""

    def __init__(self, registry: Registry, meta: ModelMeta, principal: str, actor: str) -> None:
        self._registry = registry
        self.meta = meta
        self.principal = principal
        self.actor = actor
        self.object_name = f"models/{meta.name}/{new_id()}"
        self._writer: ObjectWriter = registry.objects.writer(
            self.object_name, metadata={"model": meta.name}
        )
        self._writer.__enter__()
        self._hash = hashlib.sha256()
        self._size = 0

    def write(self, data: bytes) -> None:
        """Append a chunk of the artifact."""
        self._writer.write(data)
        self._hash.update(data)
        self._size += len(data)

    def abort(self) -> None:
        """Nothing of the artifact becomes visible."""
        self._writer.abort()

    def finish(self, correlation_id: str | None = None) -> ModelRecord:
        """Store the artifact and register the next version of the model."""
        if self._size == 0:
            self.abort()
            raise InvalidInput("the model artifact is empty", hint="send the model's bytes")
        self._writer.__exit__(None, None, None)
        return self._registry.add(
            self.meta, self.object_name, self._hash.hexdigest(), self._size,
            principal=self.principal, actor=self.actor, correlation_id=correlation_id,
        )  # fmt: skip


class Registry:
    """Model versions over the catalog database and the encrypted object store."""

    def __init__(self, engine: sa.Engine, objects: ObjectStore) -> None:
        self.engine = engine
        self.objects = objects

    def begin(self, meta: ModelMeta, principal: str, *, actor: str = "") -> ModelUpload:
        """Start streaming a new version of ``meta.name``, to be registered by ``principal``.

        ``actor`` is who makes the call when that is someone else (a service registering for
        a job's owner); the ``gantry.model.registered`` event names it.
        """
        meta.check()
        return ModelUpload(self, meta, principal, actor or principal)

    def add(
        self,
        meta: ModelMeta,
        object_name: str,
        digest: str,
        size: int,
        *,
        principal: str,
        actor: str = "",
        correlation_id: str | None = None,
    ) -> ModelRecord:
        """Register an artifact already in the store as the model's next version.

        ``principal`` is recorded as ``registered_by``; ``actor`` (default: the principal) is
        the event's actor.
        """
        for attempt in range(5):
            try:
                return self._add(
                    meta, object_name, digest, size, principal, actor or principal, correlation_id
                )
            except sa.exc.IntegrityError:  # another registration took the same number
                if attempt == 4:
                    raise
        raise AssertionError("unreachable")

    def _add(
        self,
        meta: ModelMeta,
        object_name: str,
        digest: str,
        size: int,
        principal: str,
        actor: str,
        correlation_id: str | None,
    ) -> ModelRecord:
        created = now_ms()
        trained = [{"dataset": d, "version": v} for d, v in meta.trained_on]
        with self.engine.begin() as conn:
            last = conn.execute(
                sa.select(sa.func.max(db.models.c.version)).where(db.models.c.name == meta.name)
            ).scalar()
            version = int(last or 0) + 1
            conn.execute(
                db.models.insert().values(
                    name=meta.name,
                    version=version,
                    digest=digest,
                    bytes=size,
                    object_name=object_name,
                    framework=meta.framework,
                    job_id=meta.job_id,
                    metrics_json=orjson.dumps(dict(meta.metrics)).decode(),
                    signature_json=meta.signature_json,
                    trained_on_json=orjson.dumps(trained).decode(),
                    description=meta.description,
                    registered_by=principal,
                    created_ms=created,
                    code_version=meta.code_version,
                )
            )
            event = record(
                conn,
                "gantry.model.registered",
                ModelRegistered(
                    name=meta.name,
                    version=version,
                    digest=digest,
                    bytes=size,
                    framework=meta.framework,
                    job_id=meta.job_id,
                    metrics=dict(meta.metrics),
                    trained_on=trained,
                    code_version=meta.code_version,
                ),
                actor=actor,
                subject=f"model/{meta.name}",
                correlation_id=correlation_id,
            )
            node = model_node(meta.name, version)
            made_by = {"event_id": event.id, "event_type": event.type}
            if meta.job_id:
                add_edge(conn, "job", meta.job_id, "model_version", node, created, **made_by)
            for d, v in meta.trained_on:
                source = dataset_node(d, v)
                if meta.job_id:
                    add_edge(
                        conn, "dataset_version", source, "job", meta.job_id, created, **made_by
                    )
                else:
                    add_edge(
                        conn, "dataset_version", source, "model_version", node, created, **made_by
                    )
        return self.get(meta.name, version)

    def list(self, name: str = "") -> list[ModelRecord]:
        """Every model version (of ``name`` when given), newest first within a name."""
        query = sa.select(db.models).order_by(db.models.c.name, db.models.c.version.desc())
        if name:
            query = query.where(db.models.c.name == name)
        with self.engine.connect() as conn:
            return [_record(r) for r in conn.execute(query).all()]

    def get(self, name: str, version: int = 0) -> ModelRecord:
        """A model version (the latest when ``version`` is 0)."""
        query = sa.select(db.models).where(db.models.c.name == name)
        if version:
            query = query.where(db.models.c.version == version)
        else:
            query = query.order_by(db.models.c.version.desc()).limit(1)
        with self.engine.connect() as conn:
            row = conn.execute(query).first()
        if row is None:
            what = f"{name} version {version}" if version else name
            raise NotFound("model", what, hint="list models with `gantry models list`")
        return _record(row)

    def versions(self, nodes: Iterable[str]) -> tuple[ModelRecord, ...]:
        """The model versions behind lineage node ids (``<model>:<n>``), in the order given.

        Ids that name no registered version are skipped.
        """
        wanted: dict[tuple[str, int], None] = {}
        for node in nodes:
            name, _, number = node.rpartition(":")
            if name and number.isdigit():
                wanted[(name, int(number))] = None
        if not wanted:
            return ()
        key = sa.tuple_(db.models.c.name, db.models.c.version)
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(db.models).where(key.in_(list(wanted)))).all()
        found = {(r.name, r.version): _record(r) for r in rows}
        return tuple(found[k] for k in wanted if k in found)

    def open(self, record: ModelRecord) -> ObjectReader:
        """The artifact's verified plaintext, streamed."""
        return self.objects.open(record.object_name)

    def referenced_objects(self) -> Iterator[str]:
        """Object names the registry holds (never garbage)."""
        with self.engine.connect() as conn:
            for (name,) in conn.execute(sa.select(db.models.c.object_name)).all():
                yield str(name)


__all__ = ["MAX_CODE_VERSION", "ModelMeta", "ModelRecord", "ModelUpload", "Registry"]
