"""Pipeline definitions (application): submit (a new revision), read, list, delete.

Every submission is checked in full (:func:`~gantry.workflows.pipelines.parse_pipeline`) and
stored as a new revision; runs keep the revision they started with. A CronPipeline's schedule
row is (re)computed from its cron when it is submitted, so an edited schedule takes effect at
once. Only the owner (or a principal allowed to ``update`` pipelines) may replace or delete one.
"""

from __future__ import annotations

import datetime as dt
import functools
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from gantry.core import Clock, Conflict, NotFound, PermissionDenied, SystemClock
from gantry.workflows import store
from gantry.workflows.cron import next_fire
from gantry.workflows.pipelines import Pipeline, parse_pipeline


@dataclass(frozen=True)
class PipelineRecord:
    """A stored pipeline: its latest revision, parsed, and its bookkeeping."""

    pipeline: Pipeline
    owner: str
    roles: tuple[str, ...]
    revision: int
    created_ms: int
    updated_ms: int
    next_fire_ms: int = 0
    missed: int = 0


class Registry:
    """The pipelines table."""

    def __init__(self, engine: sa.Engine, clock: Clock = SystemClock()) -> None:
        self.engine = engine
        self.clock = clock

    def now_ms(self) -> int:
        return int(self.clock.now().timestamp() * 1000)

    def submit(
        self,
        source: str,
        *,
        owner: str,
        roles: tuple[str, ...],
        may_replace_any: bool = False,
        dry_run: bool = False,
    ) -> tuple[PipelineRecord, bool]:
        """Check and store ``source``; the record and whether it replaced an earlier one."""
        pipeline = parse_pipeline(source)
        if dry_run:
            now = self.now_ms()
            return PipelineRecord(pipeline, owner, roles, 0, now, now), False
        now = self.now_ms()
        name = pipeline.name
        with self.engine.begin() as conn:
            row = conn.execute(
                sa.select(store.pipelines).where(store.pipelines.c.name == name)
            ).first()
            replaced = row is not None and not row.deleted
            if row is not None and replaced and row.owner != owner and not may_replace_any:
                raise PermissionDenied(
                    owner,
                    "update",
                    f"pipeline/{name}",
                    reason=f"pipeline {name} belongs to {row.owner}",
                    hint="choose another name, or ask its owner or a platform admin",
                )
            revision = (row.revision + 1) if row is not None else 1
            keep_owner, keep_roles = owner, roles
            if row is not None and replaced and row.owner != owner:  # an admin's edit
                keep_owner, keep_roles = row.owner, tuple(store_roles(row))
            values = {
                "kind": pipeline.kind,
                "owner": keep_owner,
                "roles_json": store.dumps(list(keep_roles)),
                "revision": revision,
                "updated_ms": now,
                "deleted": False,
            }
            if row is None:
                conn.execute(store.pipelines.insert().values(name=name, created_ms=now, **values))
            else:
                conn.execute(
                    store.pipelines.update().where(store.pipelines.c.name == name).values(**values)
                )
            conn.execute(
                store.revisions.insert().values(
                    name=name, revision=revision, source=source, author=owner, created_ms=now
                )
            )
            conn.execute(store.schedules.delete().where(store.schedules.c.name == name))
            if pipeline.schedule is not None:
                first = next_fire(
                    pipeline.schedule.cron, pipeline.schedule.timezone, self.clock.now()
                )
                conn.execute(
                    store.schedules.insert().values(
                        name=name, next_ms=int(first.timestamp() * 1000), last_fire_ms=0, missed=0
                    )
                )
        return self.get(name), replaced

    def get(self, name: str) -> PipelineRecord:
        """The pipeline ``name``; :class:`NotFound` if there is none."""
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(store.pipelines).where(
                    store.pipelines.c.name == name, store.pipelines.c.deleted.is_(False)
                )
            ).first()
            if row is None:
                raise NotFound("pipeline", name, hint="list pipelines with `gantry pipelines list`")
            sched = conn.execute(
                sa.select(store.schedules).where(store.schedules.c.name == name)
            ).first()
        return PipelineRecord(
            self.revision(name, row.revision),
            row.owner,
            tuple(store_roles(row)),
            row.revision,
            row.created_ms,
            row.updated_ms,
            sched.next_ms if sched is not None else 0,
            sched.missed if sched is not None else 0,
        )

    def list(self) -> list[PipelineRecord]:
        with self.engine.connect() as conn:
            names = conn.execute(
                sa.select(store.pipelines.c.name)
                .where(store.pipelines.c.deleted.is_(False))
                .order_by(store.pipelines.c.name)
            ).scalars()
            found = list(names)
        return [self.get(n) for n in found]

    def delete(self, name: str, *, caller: str, may_delete_any: bool, active: int) -> None:
        """Delete ``name`` (its runs and their history stay); refused while runs are active."""
        record = self.get(name)
        if record.owner != caller and not may_delete_any:
            raise PermissionDenied(
                caller, "delete", f"pipeline/{name}", reason=f"it belongs to {record.owner}"
            )
        if active:
            raise Conflict(
                f"pipeline {name} has {active} active run(s)",
                hint=f"cancel them first: gantry pipelines runs list --pipeline {name}",
            )
        with self.engine.begin() as conn:
            conn.execute(
                store.pipelines.update()
                .where(store.pipelines.c.name == name)
                .values(deleted=True, updated_ms=self.now_ms())
            )
            conn.execute(store.schedules.delete().where(store.schedules.c.name == name))

    def revision(self, name: str, revision: int) -> Pipeline:
        """Revision ``revision`` of ``name``, parsed (cached: revisions never change)."""
        return _parsed(self.engine, name, revision)


@functools.lru_cache(maxsize=512)
def _parsed_source(source: str) -> Pipeline:
    return parse_pipeline(source)


def _parsed(engine: sa.Engine, name: str, revision: int) -> Pipeline:
    with engine.connect() as conn:
        source = conn.execute(
            sa.select(store.revisions.c.source).where(
                store.revisions.c.name == name, store.revisions.c.revision == revision
            )
        ).scalar()
    if source is None:
        raise NotFound("pipeline revision", f"{name}@{revision}")
    return _parsed_source(source)


def store_roles(row: Any) -> list[str]:
    import orjson

    return [str(r) for r in orjson.loads(row.roles_json)]


def ms(at: dt.datetime) -> int:
    return int(at.timestamp() * 1000)


__all__ = ["PipelineRecord", "Registry"]
