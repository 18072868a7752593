"""The governance SDK against the in-memory fake service of conftest.py, and the table helpers."""

from __future__ import annotations

import datetime as dt
import hashlib
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gantry.client.errors import RemoteNotFound, RemotePermissionDenied
from gantry.client.governance import ColumnSpec, GovernanceClient, VersionRef
from gantry.client.tables import decode_ipc, encode_arrow_stream, read_table_file
from gantry.core import IntegrityError, InvalidInput, Unavailable

pytestmark = pytest.mark.timeout(30)

COLUMNS = [
    ColumnSpec("id", "int64", "internal", nullable=False),
    ColumnSpec("email", "string", "pii"),
    ColumnSpec("zip", "string", "internal"),
    ColumnSpec("signup", "date", "internal"),
    ColumnSpec("score", "float64", "public"),
]
CSV = "id,email,zip,signup,score\n" + "".join(
    f"{i},user{i}@example.com,{i:05d},2026-01-{1 + i % 28:02d},{i / 4}\n" for i in range(300)
)


@pytest.fixture
def client(governance: Any) -> Iterator[GovernanceClient]:
    with GovernanceClient(governance.address, "admin-token", timeout_s=10) as c:
        yield c


@pytest.fixture
def customers(client: GovernanceClient, tmp_path: Path) -> Path:
    client.create_dataset("customers", columns=COLUMNS, description="people")
    path = tmp_path / "customers.csv"
    path.write_text(CSV)
    return path


def test_datasets_are_plain_dataclasses(client: GovernanceClient) -> None:
    created = client.create_dataset("customers", columns=COLUMNS, description="people")
    assert created.columns == tuple(COLUMNS) and created.owner == "admin"
    assert client.get_dataset("customers") == created
    scans = client.create_dataset("scans", format="files", files_classification="sensitive")
    assert scans.columns == (ColumnSpec("content", "binary", "sensitive"),)
    assert [d.name for d in client.list_datasets()] == ["customers", "scans"]
    with pytest.raises(InvalidInput, match="needs columns"):
        client.create_dataset("empty")
    with pytest.raises(InvalidInput, match="unknown type 'varchar'"):
        client.create_dataset("bad", columns=[ColumnSpec("a", "varchar", "pii")])


def test_server_errors_map_to_typed_errors_with_the_message(
    governance: Any, customers: Path, client: GovernanceClient
) -> None:
    with pytest.raises(RemoteNotFound, match="dataset 'nope' not found"):
        client.get_dataset("nope")
    up = client.upload_table("customers", customers)
    client.commit("customers", [up.upload_id], "load")
    with GovernanceClient(governance.address, "viewer-token") as viewer:
        assert viewer.read("customers").num_rows == 300  # the de-identified view is fine
        with pytest.raises(RemotePermissionDenied, match="may not read_raw dataset/customers"):
            viewer.read("customers", view="raw")


def test_an_unreachable_service_says_so() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening
        with GovernanceClient(f"127.0.0.1:{port}", "t", timeout_s=5) as c:
            with pytest.raises(Unavailable, match=r"governance service at .* is unreachable"):
                c.list_datasets()


def test_upload_table_streams_one_arrow_stream_in_fragments(
    governance: Any, customers: Path, client: GovernanceClient
) -> None:
    seen: list[int] = []
    result = client.upload_table("customers", customers, fragment_bytes=512, progress=seen.append)
    assert result.rows == 300 and result.upload_id == "up-1"
    messages = governance.service.upload_messages
    assert messages[0].start.dataset == "customers" and messages[0].start.source_format == "arrow"
    fragments = [m.arrow_ipc for m in messages[1:]]
    assert len(fragments) > 5 and all(len(f) == 512 for f in fragments[:-1])
    assert [m.last for m in messages] == [False] * (len(messages) - 1) + [True]
    assert sum(seen) == customers.stat().st_size  # progress counts the file's bytes
    (table,) = governance.service.uploaded_tables
    assert table.schema.field("zip").type == pa.string()  # declared, not guessed as int
    assert table.schema.field("signup").type == pa.date32()
    assert table.column("zip").to_pylist()[:3] == ["00000", "00001", "00002"]
    assert table.column("email").to_pylist()[299] == "user299@example.com"


def test_upload_parquet_and_tables(
    governance: Any, customers: Path, client: GovernanceClient, tmp_path: Path
) -> None:
    source = pa.table(
        {
            "id": pa.array([1, 2], pa.int32()),  # cast to the declared int64
            "email": ["a@x", None],
            "zip": ["01234", "99999"],
            "signup": [dt.date(2026, 1, 1), dt.date(2026, 2, 1)],
            "score": [1.5, 2.0],
        }
    )
    path = tmp_path / "c.parquet"
    pq.write_table(source, path)
    assert client.upload_table("customers", path).rows == 2
    sent: list[int] = []
    assert client.upload_table("customers", source, progress=sent.append).rows == 2
    first, second = governance.service.uploaded_tables
    assert first.equals(second) and first.schema.field("id").type == pa.int64()
    assert sum(sent) == sum(len(m.arrow_ipc) for m in governance.service.upload_messages)


def test_a_failing_upload_ends_without_last_and_raises_the_cause(
    governance: Any, customers: Path, client: GovernanceClient
) -> None:
    good = pa.record_batch({"id": ["1"], "email": ["a"], "zip": ["1"], "signup": ["2026-01-01"],
                            "score": ["1"]})  # fmt: skip
    bad = pa.record_batch({"id": ["x"], "email": ["b"], "zip": ["2"], "signup": ["2026-01-02"],
                           "score": ["2"]})  # fmt: skip
    with pytest.raises(InvalidInput, match="column 'id' does not convert"):
        client.upload_table("customers", pa.Table.from_batches([good, bad]), fragment_bytes=64)
    assert len(governance.service.upload_messages) > 2  # data went out before the failure
    assert governance.service.discarded == 1 and governance.service.uploaded_tables == []
    with pytest.raises(InvalidInput, match=r"unknown suffix '\.json'"):
        client.upload_table("customers", customers.with_suffix(".json"))


def test_commit_log_diff_rollback(customers: Path, client: GovernanceClient) -> None:
    first = client.commit("customers", [client.upload_table("customers", customers).upload_id],
                          "first load")  # fmt: skip
    assert first.rows == 300 and first.author == "admin" and first.columns == tuple(COLUMNS)
    more = client.upload_table("customers", customers, shard_bytes=10_000)
    assert more.shards == 3
    second = client.commit(
        "customers", [more.upload_id], "again", parent=first.id[:12], append=True
    )
    assert second.rows == 600 and second.parents == (first.id,)
    assert [v.id for v in client.log("customers")] == [second.id, first.id]
    assert client.get_version("customers").id == second.id
    assert client.get_version("customers", first.short_id) == first
    diff = client.diff("customers", first.id, second.id)
    assert diff.rows_added == 300 and len(diff.added) == 3 and diff.removed == ()
    back = client.rollback("customers", first.id, "undo")
    assert back.rollback_of == first.id and back.rows == 300
    with pytest.raises(InvalidInput, match="needs a message"):
        client.commit("customers", ["up-9"], "  ")


def test_read_concatenates_shards_and_streams_them(
    customers: Path, client: GovernanceClient
) -> None:
    up = client.upload_table("customers", customers, shard_bytes=5_000)
    version = client.commit("customers", [up.upload_id], "load")
    raw = client.read("customers", view="raw")
    expected = read_table_file(customers, columns=COLUMNS)
    assert raw.num_rows == 300
    assert (
        raw.column("email").to_pylist()
        == pa.Table.from_batches(list(expected[1]), schema=expected[0]).column("email").to_pylist()
    )
    pieces = list(client.read_batches("customers", version.id, view="raw"))
    assert [shard for shard, _ in pieces] == [s.id for s in version.shards]
    assert len(pieces) == up.shards > 1
    deid = client.read("customers")
    assert deid.column("email")[0].as_py() == hashlib.sha256(b"user0@example.com").hexdigest()[:16]
    some = client.read("customers", view="raw", shards=[version.shards[1].id])
    assert some.num_rows == version.shards[1].rows


def test_reading_an_empty_version_gives_the_view_columns(client: GovernanceClient) -> None:
    client.create_dataset("empty", columns=COLUMNS)
    client.commit("empty", [client.upload_table("empty", pa.table({
        "id": pa.array([], pa.int64()), "email": pa.array([], pa.string()),
        "zip": pa.array([], pa.string()), "signup": pa.array([], pa.date32()),
        "score": pa.array([], pa.float64()),
    })).upload_id], "nothing")  # fmt: skip
    table = client.read("empty", view="raw")
    assert table.num_rows == 0 and table.column_names == [c.name for c in COLUMNS]


def test_files_upload_and_download(
    governance: Any, client: GovernanceClient, tmp_path: Path
) -> None:
    client.create_dataset("scans", format="files")
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    (src / "a" / "one.bin").write_bytes(b"1" * 10)
    (src / "two.txt").write_text("two")
    (src / "empty").write_bytes(b"")
    sent: list[int] = []
    up = client.upload_files("scans", src, progress=sent.append)
    assert sum(sent) == 13
    names = [m.file_chunk.path for m in governance.service.upload_messages[1:]]
    assert sorted(set(names)) == ["a/one.bin", "empty", "two.txt"]
    client.commit("scans", [up.upload_id], "scans")
    dest = tmp_path / "dest"
    written = client.download_files("scans", dest, view="raw")
    assert sorted(p.relative_to(dest).as_posix() for p in written) == sorted(set(names))
    assert (dest / "a" / "one.bin").read_bytes() == b"1" * 10 and (
        dest / "empty"
    ).read_bytes() == b""
    with pytest.raises(InvalidInput, match="holds files, not a table"):
        client.read("scans", view="raw")
    with pytest.raises(RemoteNotFound, match="dataset 'missing' not found"):
        client.upload_files("missing", src)


def test_downloads_refuse_paths_escaping_the_destination(
    governance: Any, client: GovernanceClient, tmp_path: Path
) -> None:
    client.create_dataset("scans", format="files")
    (tmp_path / "f").write_bytes(b"data")
    client.commit("scans", [client.upload_files("scans", [tmp_path / "f"]).upload_id], "one")
    dest = tmp_path / "dest"
    for evil in ("../escaped", "/etc/passwd", "a/../../escaped"):
        governance.service.inject_file_path = evil
        with pytest.raises(IntegrityError, match="escapes"):
            client.download_files("scans", dest, view="raw")
    assert not (tmp_path / "escaped").exists()
    assert list(dest.iterdir()) == []


def test_upload_files_names_and_checks(client: GovernanceClient, tmp_path: Path) -> None:
    client.create_dataset("customers", columns=COLUMNS)
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "f").write_bytes(b"1")
    (tmp_path / "y").mkdir()
    (tmp_path / "y" / "f").write_bytes(b"2")
    with pytest.raises(InvalidInput, match="two files would be stored as 'f'"):
        client.upload_files("customers", [tmp_path / "x", tmp_path / "y"])
    with pytest.raises(InvalidInput, match="is a table"):
        client.upload_files("customers", [tmp_path / "x", tmp_path / "y"], root=tmp_path)
    with pytest.raises(InvalidInput, match="no such file"):
        client.upload_files("customers", tmp_path / "missing")


def test_policy_grants_and_lineage(customers: Path, client: GovernanceClient) -> None:
    from gantry.client.specs import ColumnRule

    rules = [ColumnRule("hash", classification="pii"),
             ColumnRule("generalize", column="signup", params={"date": "year"})]  # fmt: skip
    policy = client.set_view_policy("customers", rules)
    assert policy.version == 1 and policy.rules == tuple(rules)
    assert client.get_view_policy("customers") == policy
    version = client.commit("customers", [client.upload_table("customers", customers).upload_id],
                            "load")  # fmt: skip
    grant = client.issue_grant("job-7", [VersionRef("customers", version.id)], ttl_s=3600)
    assert grant.token.startswith("secret-") and grant.token not in repr(grant)
    assert grant.versions == (("customers", version.id),) and grant.view == "deidentified"
    edges = client.lineage(job_id="job-7")
    assert [(e.from_id, e.to_id) for e in edges] == [(f"customers@{version.id}", "job-7")]
    assert client.lineage(dataset="customers", version=version.id) == edges
    with pytest.raises(InvalidInput, match="exactly one"):
        client.lineage(job_id="j", model="m", model_version=1)
    with pytest.raises(InvalidInput, match="both the dataset and the version"):
        client.lineage(dataset="customers")


def test_models_register_list_download(
    governance: Any, client: GovernanceClient, tmp_path: Path
) -> None:
    artifact = bytes(range(256)) * 9000  # a bit over 2 MiB: three chunks
    sent: list[int] = []
    model = client.register_model(
        "churn", artifact, framework="pytorch", job_id="job-7", metrics={"auc": 0.91},
        signature={"inputs": ["x"]}, trained_on=[("customers", "abc")], code_version="3f2a9c8",
        progress=sent.append,
    )  # fmt: skip
    assert sent == [1 << 20, 1 << 20, len(artifact) - 2 * (1 << 20)]
    assert model.version == 1 and model.digest == hashlib.sha256(artifact).hexdigest()
    assert model.signature == {"inputs": ["x"]} and model.trained_on == (("customers", "abc"),)
    assert model.code_version == "3f2a9c8"
    path = tmp_path / "model.pt"
    path.write_bytes(b"v2")
    assert client.register_model("churn", path, framework="pytorch").version == 2
    assert [m.version for m in client.list_models("churn")] == [1, 2]
    assert client.get_model("churn").version == 2 and client.get_model("churn").code_version == ""
    assert client.get_model("churn", 1).code_version == "3f2a9c8"

    dest = tmp_path / "out" / "churn.pt"
    got = client.download_model("churn", dest, version=1)
    assert got.version == 1 and dest.read_bytes() == artifact
    assert [p.name for p in dest.parent.iterdir()] == ["churn.pt"]


def test_model_downloads_never_leave_partial_files(
    governance: Any, client: GovernanceClient, tmp_path: Path
) -> None:
    client.register_model("churn", b"z" * (3 << 20), framework="pytorch")
    dest = tmp_path / "churn.pt"
    governance.service.break_download_after = 2
    with pytest.raises(IntegrityError, match="short read"):
        client.download_model("churn", dest)
    assert list(tmp_path.iterdir()) == []
    governance.service.break_download_after = -1
    governance.service.wrong_digest = True
    with pytest.raises(IntegrityError, match="sha256"):
        client.download_model("churn", dest)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(IntegrityError, match="registry says"):
        client.register_model("churn", b"abc", framework="pytorch")
    with pytest.raises(RemoteNotFound, match="model 'nope' not found"):
        client.download_model("nope", dest)
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------- tables


def test_encode_arrow_stream_fragments_join_into_one_stream() -> None:
    table = pa.table({"n": list(range(10_000)), "s": [str(i) for i in range(10_000)]})
    fragments = list(encode_arrow_stream(table.schema, table.to_batches(max_chunksize=1000), 4096))
    assert all(len(f) == 4096 for f in fragments[:-1]) and 0 < len(fragments[-1]) <= 4096
    assert decode_ipc(b"".join(fragments)).equals(table)
    empty = list(encode_arrow_stream(table.schema, []))
    assert len(empty) == 1 and decode_ipc(empty[0]).num_rows == 0
    with pytest.raises(InvalidInput, match="not a valid Arrow IPC stream"):
        decode_ipc(b"nonsense")


def test_read_table_file_errors(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="unknown suffix"):
        read_table_file(tmp_path / "x.xlsx")
    with pytest.raises(InvalidInput, match=r"can't read .*missing.csv"):
        read_table_file(tmp_path / "missing.csv")
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"not parquet")
    with pytest.raises(InvalidInput, match=r"can't read .*broken.parquet"):
        read_table_file(broken)
    typed = tmp_path / "typed.csv"
    typed.write_text("id,when\n1,2026-01-31 12:00:00\nx,2026-01-31T13:00:00Z\n")
    with pytest.raises(InvalidInput, match=r"can't read .*typed.csv"):
        schema, batches = read_table_file(typed, columns=[ColumnSpec("id", "int64", "public")])
        list(batches)
    schema, batches = read_table_file(typed, columns=[ColumnSpec("when", "timestamp", "public")])
    when = pa.Table.from_batches(list(batches), schema=schema).column("when").to_pylist()
    assert schema.field("when").type == pa.timestamp("ms", tz="UTC")
    assert [w.hour for w in when] == [12, 13]
    fine = tmp_path / "fine.parquet"
    moment = dt.datetime(2026, 1, 31, 12, 0, 0, 123456)
    pq.write_table(pa.table({"when": pa.array([moment], pa.timestamp("ns"))}), fine)
    schema, batches = read_table_file(fine, columns=[ColumnSpec("when", "timestamp", "public")])
    (value,) = pa.Table.from_batches(list(batches), schema=schema).column("when").to_pylist()
    assert value == moment.replace(microsecond=123000, tzinfo=dt.UTC)  # kept to the millisecond
