"""The governance service killed (SIGKILL) in the middle of commits: all or nothing."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pyarrow as pa
import pytest

from gantry.client.tables import encode_arrow_stream
from gantry.governance.tables import ipc_to_table
from gantry.protos.v1 import governance_pb2 as pb
from gantry.protos.v1 import governance_pb2_grpc as pb_grpc
from gantry.security import TokenIssuer
from gantry.security.keyring import Keyring

from .conftest import PEOPLE_COLUMNS, people


class Proc:
    """The service as a child process, the way `gantry up` runs it."""

    def __init__(self, data_dir: Path, nats_url: str) -> None:
        self.data_dir = data_dir
        self.nats_url = nats_url
        self.proc: subprocess.Popen[bytes] | None = None
        self.address = ""

    def start(self) -> None:
        run_file = self.data_dir / "run" / "governance.json"
        run_file.unlink(missing_ok=True)
        env = dict(os.environ)
        env.update(
            GANTRY_DATA_DIR=str(self.data_dir),
            GANTRY_NATS__URL=self.nats_url,
            GANTRY_GOVERNANCE__GRPC_PORT="0",
            GANTRY_GOVERNANCE__METRICS_PORT="0",
            GANTRY_GOVERNANCE__SHARD_BYTES=str(64 << 10),
            GANTRY_STORAGE__CHUNK_SIZE=str(64 << 10),
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gantry.governance"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while not run_file.exists():
            assert self.proc.poll() is None, "the service exited during start-up"
            assert time.monotonic() < deadline, "the service did not start"
            time.sleep(0.05)
        self.address = json.loads(run_file.read_text())["grpc"]

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(20)


@pytest.fixture
def proc(tmp_path: Path, nats_url: str) -> Iterator[Proc]:
    p = Proc(tmp_path / "data", nats_url)
    Keyring(p.data_dir / "keys").issuer(create=True)
    p.start()
    try:
        yield p
    finally:
        p.stop()


def _upload(stub: pb_grpc.GovernanceServiceStub, md: object, table: pa.Table) -> str:
    def requests() -> Iterator[pb.UploadRequest]:
        yield pb.UploadRequest(start=pb.UploadStart(dataset="people", source_format="arrow"))
        for fragment in encode_arrow_stream(table.schema, table.to_batches(), 1 << 16):
            yield pb.UploadRequest(arrow_ipc=fragment)
        yield pb.UploadRequest(last=True)

    return str(stub.Upload(requests(), metadata=md).upload_id)


def test_a_commit_killed_midway_is_all_or_nothing(proc: Proc) -> None:
    issuer = TokenIssuer(Keyring(proc.data_dir / "keys").issuer())
    md = (
        ("authorization", f"Bearer {issuer.issue('sam', ['data-steward'], dt.timedelta(hours=1))}"),
    )
    stub = pb_grpc.GovernanceServiceStub(grpc.insecure_channel(proc.address))
    stub.CreateDataset(pb.CreateDatasetRequest(name="people", columns=PEOPLE_COLUMNS), metadata=md)
    committed_rows = 0
    outcomes = []
    for attempt, delay_s in enumerate((0.0, 0.004, 0.012, 0.03, 0.08)):
        upload_id = _upload(stub, md, people(2000, start=attempt * 2000))
        result: dict[str, object] = {}

        def commit(
            upload_id: str = upload_id,
            result: dict[str, object] = result,
            stub: pb_grpc.GovernanceServiceStub = stub,
        ) -> None:
            try:
                result["version"] = stub.Commit(
                    pb.CommitRequest(
                        dataset="people", upload_ids=[upload_id], message="m", append=True
                    ),
                    metadata=md,
                    timeout=10,
                ).id
            except grpc.RpcError as exc:
                result["error"] = exc.code()

        caller = threading.Thread(target=commit)
        caller.start()
        time.sleep(delay_s)
        proc.kill()
        caller.join(15)
        proc.start()
        stub = pb_grpc.GovernanceServiceStub(grpc.insecure_channel(proc.address))
        ds = stub.GetDataset(pb.GetDatasetRequest(name="people"), metadata=md)
        log = stub.Log(pb.LogRequest(dataset="people"), metadata=md).versions
        assert ds.versions == len(log)
        if "version" in result:  # acknowledged: it must have survived the kill
            assert ds.head == result["version"]
        landed = bool(log) and log[0].rows == committed_rows + 2000
        outcomes.append(landed)
        if landed:
            committed_rows += 2000
            assert ds.head == log[0].id
        else:  # nothing of it is visible, and the upload can still be committed
            assert not log or log[0].rows == committed_rows
        rows = 0
        if ds.head:
            reader = stub.Read(
                pb.ReadRequest(dataset="people", view="raw"), metadata=md, timeout=30
            )
            rows = sum(ipc_to_table(m.arrow_ipc).num_rows for m in reader)
        assert rows == committed_rows  # the whole version reads back, every shard
    assert len(outcomes) == 5
