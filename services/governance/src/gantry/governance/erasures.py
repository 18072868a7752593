"""Erasure of a data subject (domain): new versions without their rows, and what to retrain.

Committed versions never change, so an erasure does not rewrite history: for every dataset whose
HEAD holds the subject it rewrites only the head's shards that hold them, without those rows,
and commits the result as a new version (parent: the head; author: the requester; message:
``erasure <id>: <reason>``) through the ordinary commit path — manifest, version id, shard
index, subject index and event as for any commit. The subject's digests are kept per dataset
so every later upload drops their rows. Every model version linked to ANY version that held
the subject (through the jobs that read it, or directly) is named for retraining. The new
versions, the erasure record and its ``gantry.data.subject.erased`` event (keyed reference,
never the identifier) commit in one transaction. Old versions stay as they were: FindSubject
still lists them, and reading them still works for whoever may.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa

from gantry.core import InvalidInput, new_id
from gantry.events.catalog import SUBJECT_ERASED, SubjectErased
from gantry.governance.catalog import Catalog, now_ms
from gantry.governance.changes import record
from gantry.governance.deid import KeyedDigests
from gantry.governance.findings import SubjectFinder, SubjectFindings
from gantry.governance.manifest import Manifest, ShardEntry
from gantry.governance.schema import Column
from gantry.governance.subjects import (
    ErasureRecord,
    SubjectVersion,
    erasure_records,
    insert_erasure,
    matching_rows,
    pii_columns,
)
from gantry.governance.tables import shard_to_table
from gantry.governance.uploads import Uploads

#: The longest reason kept (a ticket reference and a sentence or two).
MAX_REASON = 1000


@dataclass(frozen=True)
class _Plan:
    """One dataset to erase from: its head (as found), the head's manifest, the shards holding
    the subject, and the dataset's pii columns."""

    dataset: str
    head: SubjectVersion
    manifest: Manifest
    shards: frozenset[str]
    pii: tuple[Column, ...]


def _reason(text: str) -> str:
    reason = text.strip()
    if not reason:
        raise InvalidInput(
            "an erasure needs a reason",
            hint="say why, e.g. the request's ticket: --reason 'DSR-2041: art. 17 request'",
        )
    if len(reason) > MAX_REASON:
        raise InvalidInput(f"the reason is {len(reason)} characters long (at most {MAX_REASON})")
    return reason


class Erasures:
    """Erases data subjects from the heads of table datasets; lists erasures made."""

    def __init__(
        self, catalog: Catalog, uploads: Uploads, finder: SubjectFinder, *, shard_bytes: int
    ) -> None:
        self.catalog = catalog
        self.engine = catalog.engine
        self.uploads = uploads
        self.finder = finder
        self.shard_bytes = shard_bytes

    def erase(
        self,
        identifier: str,
        reason: str,
        *,
        requested_by: str,
        dry_run: bool = False,
        correlation_id: str | None = None,
    ) -> ErasureRecord:
        """Erase the subject from every dataset whose head holds them; return the erasure.

        ``dry_run`` returns what would be done (the datasets, the rows and the models to
        retrain, no version ids) and changes nothing.
        """
        reason = _reason(reason)
        found = self.finder.find(identifier)
        plans = self._plans(found)
        requested_ms = now_ms()
        models = found.models
        if dry_run:
            planned = tuple(
                SubjectVersion(p.dataset, "", 0, p.head.columns, 0, requested_by, "", is_head=False)
                for p in plans
            )
            return ErasureRecord(
                erasure_id="", subject_ref=found.subject_ref, requested_by=requested_by,
                requested_ms=requested_ms, reason=reason, new_versions=planned,
                rows_removed=tuple(p.head.rows for p in plans), models_to_retrain=models,
            )  # fmt: skip
        erasure_id = new_id()
        written = [self._rewrite(p, found.digests[p.dataset], requested_by) for p in plans]
        message = f"erasure {erasure_id}: {reason}"
        with self.engine.begin() as conn:
            new_versions: list[SubjectVersion] = []
            for plan, (upload_id, shards, _removed) in zip(plans, written, strict=True):
                version = self.catalog.commit_in(
                    conn, plan.dataset, shards, upload_ids=[upload_id], author=requested_by,
                    message=message, parent=plan.head.version, columns=plan.manifest.columns,
                    correlation_id=correlation_id,
                )  # fmt: skip
                new = SubjectVersion(
                    plan.dataset, version.id, 0, plan.head.columns, version.manifest.created_ms,
                    requested_by, version.event_id, is_head=True, erasure_id=erasure_id,
                )  # fmt: skip
                new_versions.append(new)
            removed = tuple(n for _, _, n in written)
            event = record(
                conn,
                SUBJECT_ERASED.type,
                SubjectErased(
                    erasure_id=erasure_id,
                    subject_ref=found.subject_ref,
                    requested_by=requested_by,
                    reason=reason,
                    datasets=[
                        {
                            "dataset": p.dataset,
                            "old_version": p.head.version,
                            "new_version": v.version,
                            "rows_removed": n,
                        }
                        for p, v, n in zip(plans, new_versions, removed, strict=True)
                    ],
                    models_to_retrain=list(models),
                ),
                actor=requested_by,
                subject=f"subject/{found.subject_ref}",
                correlation_id=correlation_id,
            )
            erasure = ErasureRecord(
                erasure_id=erasure_id, subject_ref=found.subject_ref, requested_by=requested_by,
                requested_ms=requested_ms, reason=reason, new_versions=tuple(new_versions),
                rows_removed=removed, models_to_retrain=models, event_id=event.id,
            )  # fmt: skip
            insert_erasure(conn, erasure, dict(found.digests))
        return erasure

    # ------------------------------------------------------------------ steps

    def _plans(self, found: SubjectFindings) -> list[_Plan]:
        plans = []
        for head in found.versions:
            if not head.is_head:
                continue
            ds = self.catalog.get_dataset(head.dataset)
            manifest = self.catalog.get_version(head.dataset, head.version).manifest
            shards = frozenset(h.shard_id for h in found.hits.get(head.dataset, ()))
            pii = tuple(pii_columns(ds.columns))
            plans.append(_Plan(head.dataset, head, manifest, shards, pii))
        return plans

    def _rewrite(
        self, plan: _Plan, digest: bytes, principal: str
    ) -> tuple[str, list[ShardEntry], int]:
        """Write the head's affected shards again without the subject's rows; return the upload,
        the new version's shards (head order, each affected shard replaced in place) and the
        rows removed."""
        keyed = KeyedDigests(self.finder.keys.get(plan.dataset))
        affected = list(dict.fromkeys(s.id for s in plan.manifest.shards if s.id in plan.shards))
        by_id = {s.id: s for s in plan.manifest.shards}
        removed = 0

        def tables() -> Iterator[pa.Table]:
            nonlocal removed
            for shard_id in affected:
                table = shard_to_table(self.finder.objects.get(by_id[shard_id].object))
                hit = matching_rows(table, plan.pii, keyed, {digest})
                removed += int(hit.sum())
                yield table.filter(pa.array(~hit))

        upload_id, written = self.uploads.write_tables(
            plan.dataset, principal, tables(), shard_bytes=self.shard_bytes
        )
        replaced = dict(zip(affected, written, strict=True))
        shards: list[ShardEntry] = []
        for s in plan.manifest.shards:
            shards.extend(replaced.get(s.id, [s]))
        return upload_id, shards, removed

    # Last in the class: after it, ``list`` names this method in the class body.
    def list(self, limit: int = 50) -> list[ErasureRecord]:
        """Erasures made, newest first."""
        with self.engine.connect() as conn:
            return erasure_records(conn, limit=max(1, min(limit or 50, 1000)))


__all__ = ["MAX_REASON", "Erasures"]
