"""Fixtures: a real governance service (in this event loop) on a real nats-server, per test."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import nats
import orjson
import pyarrow as pa
import pytest

from gantry.client.tables import encode_arrow_stream
from gantry.core import NatsSettings
from gantry.events import EventEnvelope
from gantry.governance.app import GovernanceService
from gantry.governance.settings import GovernanceOptions, GovernanceSettings
from gantry.governance.tables import ipc_to_table
from gantry.protos.v1 import governance_pb2 as pb
from gantry.protos.v1 import governance_pb2_grpc as pb_grpc
from gantry.security import TokenIssuer
from gantry.security.keyring import Keyring
from gantry.storage import StorageSettings

PEOPLE_COLUMNS = [
    pb.Column(name="id", type="int64", classification="internal", nullable=False),
    pb.Column(name="email", type="string", classification="pii"),
    pb.Column(name="dob", type="date", classification="pii"),
    pb.Column(name="income", type="float64", classification="sensitive"),
    pb.Column(name="city", type="string", classification="public"),
]


def people(n: int = 100, start: int = 0) -> pa.Table:
    """Rows that fit PEOPLE_COLUMNS."""
    ids = list(range(start, start + n))
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "email": pa.array([f"user{i}@example.com" for i in ids]),
            "dob": pa.array([dt.date(1970 + i % 40, 1 + i % 12, 1 + i % 28) for i in ids]),
            "income": pa.array([1000.0 + i for i in ids]),
            "city": pa.array([["Oslo", "Lima", "Pune"][i % 3] for i in ids]),
        }
    )


@dataclass
class Running:
    """A running governance service and what a test needs to talk to it."""

    service: GovernanceService
    settings: GovernanceSettings
    keyring: Keyring
    issuer: TokenIssuer
    channel: grpc.aio.Channel
    stub: pb_grpc.GovernanceServiceStub

    def token(self, user: str, role: str, kind: str = "user") -> str:
        return self.issuer.issue(user, [role], dt.timedelta(minutes=10), kind=kind)  # type: ignore[arg-type]

    def md(self, user: str = "sam", role: str = "data-steward", kind: str = "user") -> Any:
        return (("authorization", f"Bearer {self.token(user, role, kind)}"),)

    async def create_people(self, name: str = "people") -> pb.Dataset:
        return await self.stub.CreateDataset(
            pb.CreateDatasetRequest(name=name, format="table", columns=PEOPLE_COLUMNS),
            metadata=self.md(),
        )

    async def upload(
        self, dataset: str, table: pa.Table, *, last: bool = True, shard_bytes: int = 0,
        fragment_bytes: int = 4096,
    ) -> pb.UploadResponse:  # fmt: skip
        def requests() -> Iterator[pb.UploadRequest]:
            yield pb.UploadRequest(
                start=pb.UploadStart(
                    dataset=dataset, source_format="arrow", shard_bytes=shard_bytes
                )
            )
            for fragment in encode_arrow_stream(table.schema, table.to_batches(), fragment_bytes):
                yield pb.UploadRequest(arrow_ipc=fragment)
            if last:
                yield pb.UploadRequest(last=True)

        return await self.stub.Upload(requests(), metadata=self.md())

    async def commit(self, dataset: str, upload_ids: Sequence[str], **kw: Any) -> pb.Version:
        return await self.stub.Commit(
            pb.CommitRequest(dataset=dataset, upload_ids=list(upload_ids), message="m", **kw),
            metadata=self.md(),
        )

    async def read(
        self, dataset: str, view: str, *, user: str = "ann", role: str = "annotator",
        version: str = "", grant: str = "", kind: str = "user",
    ) -> pa.Table:  # fmt: skip
        call = self.stub.Read(
            pb.ReadRequest(dataset=dataset, version=version, view=view, grant=grant),
            metadata=self.md(user, role, kind),
        )
        tables = [ipc_to_table(m.arrow_ipc) async for m in call]
        return pa.concat_tables(tables) if tables else pa.table({})


def governance_settings(
    data_dir: Path,
    nats_url: str,
    database_url: str | None = None,
    storage: StorageSettings | None = None,
) -> GovernanceSettings:
    return GovernanceSettings(
        data_dir=data_dir,
        nats=NatsSettings(url=nats_url, reconnect_wait_s=0.1),
        governance=GovernanceOptions(
            database_url=database_url, grpc_port=0, metrics_port=0, shard_bytes=64 << 10
        ),
        storage=storage or StorageSettings(chunk_size=64 << 10),
    )


async def start(settings: GovernanceSettings) -> tuple[GovernanceService, asyncio.Task[None]]:
    service = GovernanceService(settings)
    task = asyncio.create_task(service.run())
    async with asyncio.timeout(20):
        while (
            service.grpc_port == 0 or not (settings.data_dir / "run" / "governance.json").exists()
        ):
            if task.done():
                task.result()
            await asyncio.sleep(0.05)
    return service, task


@contextlib.asynccontextmanager
async def running(settings: GovernanceSettings) -> AsyncIterator[Running]:
    """Keys, a started service, a channel to it, and a clean stop afterwards."""
    keyring = Keyring(settings.keys_dir)
    issuer = TokenIssuer(keyring.issuer(create=True))
    service, task = await start(settings)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{service.grpc_port}")
    try:
        yield Running(
            service, settings, keyring, issuer, channel, pb_grpc.GovernanceServiceStub(channel)
        )
    finally:
        await channel.close()
        service.stop()
        await asyncio.wait_for(task, 30)


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest) -> str | None:
    if request.param == "sqlite":
        return None
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture
async def gov(tmp_path: Path, nats_url: str, database_url: str | None) -> AsyncIterator[Running]:
    """The service on SQLite and on PostgreSQL (skipped where none is reachable)."""
    async with running(governance_settings(tmp_path / "data", nats_url, database_url)) as r:
        yield r


async def stream_events(
    nats_url: str, subject: str, *, wait_s: float = 5.0, at_least: int = 1
) -> list[EventEnvelope]:
    """Events on ``subject`` stored in JetStream (waits until at least ``at_least`` arrived)."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        sub = await js.pull_subscribe(subject, durable=None)
        found: list[EventEnvelope] = []
        async with asyncio.timeout(wait_s):
            while len(found) < at_least:
                try:
                    msgs = await sub.fetch(100, timeout=0.5)
                except nats.errors.TimeoutError:
                    continue
                for m in msgs:
                    found.append(EventEnvelope.model_validate(orjson.loads(m.data)))
                    await m.ack()
        return found
    finally:
        await nc.close()


async def dead_letter_reasons(nats_url: str, subject: str, *, wait_s: float = 5.0) -> list[str]:
    """The reasons (header) of the dead letters on ``subject``; waits for at least one."""
    nc = await nats.connect(nats_url)
    try:
        sub = await nc.jetstream().pull_subscribe(subject, durable=None)
        async with asyncio.timeout(wait_s):
            while True:
                try:
                    msgs = await sub.fetch(10, timeout=0.5)
                except nats.errors.TimeoutError:
                    continue
                return [(m.headers or {}).get("Gantry-Dead-Reason", "") for m in msgs]
    finally:
        await nc.close()


async def publish_event(nats_url: str, event: EventEnvelope, signer: Any) -> None:
    """Publish a signed event the way a platform service does."""
    from gantry.events import Bus, Publisher

    bus = await Bus.connect(NatsSettings(url=nats_url), name="test-publisher")
    try:
        await Publisher(bus, signer=signer).publish(event)
    finally:
        await bus.close()
