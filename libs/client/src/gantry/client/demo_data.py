"""The demo's data-governance story: one dataset with PII, three roles, one refused read.

A data steward registers ``customers`` (columns classified public / internal / pii /
sensitive) and uploads rows, which the governance service shards and encrypts; an annotator
reads them raw; an ml-developer reads the same version de-identified (PII hashed, the
sensitive column gone); the ml-developer's attempt to read it raw is refused — and each of
these reads, the refusal included, lands in the audit log.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn
from rich.table import Table

from gantry.client.admin import create_token
from gantry.client.errors import RemotePermissionDenied
from gantry.client.governance import GovernanceClient
from gantry.client.specs import ColumnRule, ColumnSpec
from gantry.core import IntegrityError

DATASET = "customers"
STEWARD, ANNOTATOR, DEVELOPER = "sam-steward", "ann-annotator", "dev-engineer"
COLUMNS = (
    ColumnSpec("customer_id", "int64", "internal", nullable=False),
    ColumnSpec("email", "string", "pii"),
    ColumnSpec("name", "string", "pii"),
    ColumnSpec("birth_date", "date", "pii"),
    ColumnSpec("income", "float64", "sensitive"),
    ColumnSpec("city", "string", "public"),
    ColumnSpec("churned", "bool", "public"),
)
POLICY = (
    ColumnRule(classification="public", transform="keep"),
    ColumnRule(classification="internal", transform="keep"),
    ColumnRule(classification="pii", transform="hash"),
    ColumnRule(column="birth_date", transform="generalize", params={"date": "year"}),
    ColumnRule(classification="sensitive", transform="drop"),
)
_FIRST = ("Ada", "Grace", "Alan", "Edsger", "Barbara", "Ken", "Radia", "Linus")
_LAST = ("Lovelace", "Hopper", "Turing", "Dijkstra", "Liskov", "Thompson", "Perlman")
_CITIES = ("Oslo", "Lima", "Pune", "Accra", "Kyoto", "Quito")


@dataclass
class DataSummary:
    """What the governance story did."""

    rows: int = 0
    shards: int = 0
    version: str = ""
    raw_sample: list[dict[str, object]] = field(default_factory=list)
    deidentified_sample: list[dict[str, object]] = field(default_factory=list)
    deidentified_columns: list[str] = field(default_factory=list)
    denied: str = ""


def customers(rows: int, seed: int = 7) -> pa.Table:
    """Synthetic customers with personal data (what a CRM export looks like)."""
    rng = random.Random(seed)
    first = [rng.choice(_FIRST) for _ in range(rows)]
    last = [rng.choice(_LAST) for _ in range(rows)]
    return pa.table(
        {
            "customer_id": pa.array(range(100_000, 100_000 + rows), pa.int64()),
            "email": [
                f"{f}.{s}{i}@example.com".lower()
                for i, (f, s) in enumerate(zip(first, last, strict=True))
            ],
            "name": [f"{f} {s}" for f, s in zip(first, last, strict=True)],
            "birth_date": pa.array(
                [
                    dt.date(1950 + rng.randrange(55), 1 + rng.randrange(12), 1 + rng.randrange(28))
                    for _ in range(rows)
                ]
            ),
            "income": [round(rng.lognormvariate(10.5, 0.5), 2) for _ in range(rows)],
            "city": [rng.choice(_CITIES) for _ in range(rows)],
            "churned": [rng.random() < 0.2 for _ in range(rows)],
        }
    )


@contextlib.contextmanager
def _progress(console: Console, what: str) -> Iterator[Callable[[int], None]]:
    bar = Progress(
        TextColumn(what),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=console,
        transient=True,
    )
    with bar:
        task = bar.add_task(what, total=None)
        yield lambda n: bar.advance(task, n)


def governance_story(
    address: str,
    data_dir: Path,
    step: Callable[[str], contextlib.AbstractContextManager[None]],
    console: Console,
    *,
    rows: int = 20_000,
) -> DataSummary:
    """Run the story against the governance service at ``address``; raise on any surprise."""
    summary = DataSummary()
    token = {
        role: create_token(data_dir, user, [role], dt.timedelta(hours=1))
        for user, role in (
            (STEWARD, "data-steward"),
            (ANNOTATOR, "annotator"),
            (DEVELOPER, "ml-developer"),
        )
    }
    with GovernanceClient(address, token["data-steward"]) as steward:
        with step(f"data steward registered {DATASET!r} with PII columns"):
            steward.create_dataset(
                DATASET, columns=COLUMNS, description="CRM export with personal data"
            )
        with step(f"{rows:,} rows uploaded, sharded and encrypted (AES-256-GCM), committed"):
            with _progress(console, "uploading") as advance:
                up = steward.upload_table(
                    DATASET, customers(rows), shard_bytes=256 << 10, progress=advance
                )
            version = steward.commit(DATASET, [up.upload_id], "first CRM export")
            summary.rows, summary.shards, summary.version = version.rows, up.shards, version.id
        with step("data steward set the view policy: PII hashed, birth dates to the year"):
            steward.set_view_policy(DATASET, POLICY)
    with (
        GovernanceClient(address, token["annotator"]) as annotator,
        step("annotator read the version raw"),
    ):
        raw = annotator.read(DATASET, version.id, view="raw", purpose="labelling")
        if raw.num_rows != rows:
            raise IntegrityError(f"the raw read returned {raw.num_rows} of {rows} rows")
        summary.raw_sample = raw.slice(0, 3).to_pylist()
    with GovernanceClient(address, token["ml-developer"]) as developer:
        with step("ml-developer read the same version de-identified"):
            deid = developer.read(DATASET, version.id, view="deidentified", purpose="training")
            summary.deidentified_columns = deid.column_names
            summary.deidentified_sample = deid.slice(0, 3).to_pylist()
            leaked = {"income"} & set(deid.column_names)
            emails = set(raw.column("email").to_pylist()) & set(deid.column("email").to_pylist())
            if leaked or emails:
                raise IntegrityError("the de-identified view showed raw personal data")
        with step("ml-developer's raw read was refused"):
            try:
                developer.read(DATASET, version.id, view="raw", purpose="curiosity")
            except RemotePermissionDenied as exc:
                summary.denied = str(exc)
            else:
                raise IntegrityError("an ml-developer was allowed to read raw personal data")
    return summary


def samples_table(title: str, rows: list[dict[str, object]]) -> Table:
    """A few rows as a table."""
    table = Table(title=title)
    for name in rows[0] if rows else ():
        table.add_column(name, overflow="fold", max_width=24)
    for row in rows:
        table.add_row(*(str(v) for v in row.values()))
    return table


__all__ = ["DATASET", "DataSummary", "customers", "governance_story", "samples_table"]
