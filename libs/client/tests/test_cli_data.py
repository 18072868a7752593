"""``gantry data`` and ``gantry models`` against the in-memory fake service of conftest.py."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from gantry.client import cli

pytestmark = pytest.mark.timeout(30)

SCHEMA = """\
columns:
  - {name: id, type: int64, class: internal, nullable: false}
  - {name: email, type: string, class: pii}
  - {name: zip, type: string, class: internal}
"""
ROWS = "id,email,zip\n" + "".join(f"{i},u{i}@example.com,{i:05d}\n" for i in range(50))


@dataclass
class Result:
    code: int
    out: str
    err: str


Gantry = Callable[..., Result]


@pytest.fixture
def gantry(
    governance: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Gantry:
    """Run ``gantry ARGS`` through cli.main against the fake service; capture the output."""
    monkeypatch.setenv("GANTRY_GOVERNANCE_ADDR", governance.address)
    monkeypatch.setenv("GANTRY_TOKEN", "admin-token")
    monkeypatch.setenv("COLUMNS", "200")

    def run(*args: str | Path) -> Result:
        capsys.readouterr()
        code = cli.main([str(a) for a in args])
        captured = capsys.readouterr()
        assert "Traceback" not in captured.out + captured.err
        return Result(code, captured.out, captured.err)

    return run


@pytest.fixture
def loaded(gantry: Gantry, tmp_path: Path) -> Path:
    """A committed 'customers' dataset; its CSV file returned."""
    schema = tmp_path / "schema.yaml"
    schema.write_text(SCHEMA)
    assert gantry("data", "create", "customers", "--schema", schema).code == 0
    data = tmp_path / "customers.csv"
    data.write_text(ROWS)
    up = gantry("data", "upload", "customers", data, "--commit", "-m", "first load")
    assert up.code == 0, up.err
    return data


def test_create_with_columns_and_column_syntax_errors(governance: Any, gantry: Gantry) -> None:
    ok = gantry("data", "create", "people", "--column", "email:string:pii",
                "-c", "id:int64:internal:required", "--description", "who")  # fmt: skip
    assert ok.code == 0 and "created dataset people (table, 2 columns)" in ok.out
    cols = governance.service.datasets["people"].info.columns
    assert [(c.name, c.type, c.classification, c.nullable) for c in cols] == [
        ("email", "string", "pii", True), ("id", "int64", "internal", False),
    ]  # fmt: skip
    for bad in (
        "email",
        "email:str:pii",
        "email:string:secret",
        "a:string:pii:maybe",
        ":int64:pii",
    ):
        result = gantry("data", "create", "x", "--column", bad)
        assert result.code == 2, bad
        assert f"gantry: error: invalid column '{bad}': expected name:type:class" in result.err
        assert "e.g. email:string:pii" in result.err
        assert (
            "types: string, int64" in result.err and "classes: public, internal, pii" in result.err
        )
    none = gantry("data", "create", "x")
    assert none.code == 2 and "needs columns" in none.err and "--schema" in none.err
    both = gantry("data", "create", "x", "--files", "--column", "a:string:pii")
    assert both.code == 2 and "a files dataset has no columns" in both.err
    files = gantry("data", "create", "scans", "--files", "--class", "sensitive")
    assert files.code == 0 and "created dataset scans (files, sensitive)" in files.out
    again = gantry("data", "create", "scans", "--files")
    assert again.code == 2 and "gantry: error: dataset 'scans' exists" in again.err


def test_schema_files(governance: Any, gantry: Gantry, tmp_path: Path) -> None:
    schema = tmp_path / "schema.yaml"
    schema.write_text(SCHEMA)
    assert gantry("data", "create", "customers", "--schema", schema).code == 0
    cols = governance.service.datasets["customers"].info.columns
    assert [c.name for c in cols] == ["id", "email", "zip"] and cols[0].nullable is False
    row = "  - {name: a, type: string, class: pii}\n"
    two = "columns:\n" + row + row
    cases = {
        "columns:\n  - {name: a, type: text, class: pii}\n":
            "columns[0]: column 'a': unknown type 'text'",
        "columns:\n  - {name: a, type: string}\n": "columns[0]: 'class' is missing",
        "columns:\n  - {name: a, type: string, class: pii, classification: pii}\n":
            "columns[0]: unknown key 'classification'",
        "columns:\n  - {name: a, type: string, class: pii, nullable: maybe}\n":
            "nullable must be true or false",
        "cols: []\n": "expected a mapping with a 'columns' list",
        "columns: [\n": "is not valid YAML (line 2",
        two: "column 'a' is declared twice",
    }  # fmt: skip
    for text, message in cases.items():
        schema.write_text(text)
        result = gantry("data", "create", "bad", "--schema", schema)
        assert result.code == 2 and result.err.startswith("gantry: error: "), text
        assert message in result.err, (text, result.err)
    missing = gantry("data", "create", "bad", "--schema", tmp_path / "nope.yaml")
    assert missing.code == 2 and "can't read" in missing.err and "nope.yaml" in missing.err


def test_policy_files_set_and_show(governance: Any, gantry: Gantry, loaded: Path) -> None:
    policy = loaded.parent / "policy.yaml"
    policy.write_text(
        "rules:\n"
        "  - {class: pii, transform: hash}\n"
        "  - {column: zip, transform: generalize, params: {prefix: 3}}\n"
    )
    done = gantry("data", "policy", "set", "customers", policy)
    assert done.code == 0 and "version 1 (2 rules)" in done.out
    rules = governance.service.datasets["customers"].policy.rules
    assert [(r.column, r.classification, r.transform, dict(r.params)) for r in rules] == [
        ("", "pii", "hash", {}), ("zip", "", "generalize", {"prefix": "3"}),
    ]  # fmt: skip
    shown = gantry("data", "policy", "show", "customers")
    assert shown.code == 0 and "class pii" in shown.out and "prefix=3" in shown.out
    as_yaml = gantry("data", "policy", "show", "customers", "--yaml")
    policy.write_text(as_yaml.out)
    assert gantry("data", "policy", "set", "customers", policy).code == 0
    assert governance.service.datasets["customers"].policy.rules == rules
    cases = {
        "rules:\n  - {class: pii, transform: scramble}\n": "unknown transform 'scramble'",
        "rules:\n  - {class: pii, column: zip, transform: hash}\n": "not both",
        "rules:\n  - {transform: hash}\n": "not neither",
        "rules:\n  - {class: secret, transform: hash}\n": "unknown class 'secret'",
        "rules:\n  - {column: dob, transform: generalize, params: [year]}\n": "params must map",
        "policy: []\n": "unknown key 'policy'",
        "rules:\n  - {class: pii, transform: hash}\n  - {class: pii, transform: drop}\n": (
            "two rules for class pii"
        ),
    }
    for text, message in cases.items():
        policy.write_text(text)
        result = gantry("data", "policy", "set", "customers", policy)
        assert result.code == 2 and "gantry: error:" in result.err and message in result.err, text


def test_upload_commit_log_diff_rollback(governance: Any, gantry: Gantry, loaded: Path) -> None:
    more = loaded.with_name("more.csv")
    more.write_text(ROWS.replace("example.com", "example.org"))
    up = gantry("data", "upload", "customers", more, "--shard-mb", "0")
    assert up.code == 0 and "50 rows" in up.out and "upload id up-2" in up.out
    committed = gantry("data", "commit", "customers", "up-2", "-m", "more", "--append")
    assert committed.code == 0 and "100 rows" in committed.out
    log = gantry("data", "log", "customers")
    versions = governance.service.datasets["customers"].versions
    assert log.code == 0 and versions[0].id[:12] in log.out and versions[0].id not in log.out
    assert "first load" in log.out and "more" in log.out and "admin" in log.out
    diff = gantry("data", "diff", "customers", versions[0].id[:8], versions[1].id[:8])
    assert diff.code == 0 and "rows: +50 -0" in diff.out
    back = gantry("data", "rollback", "customers", versions[0].id[:8], "-m", "undo")
    assert back.code == 0 and f"restores {versions[0].id}" in back.out
    assert f"rollback of {versions[0].id[:12]}" in gantry("data", "log", "customers").out
    no_msg = gantry("data", "upload", "customers", loaded, "--commit")
    assert no_msg.code == 2 and "--commit needs a message" in no_msg.err
    stray = gantry("data", "upload", "customers", loaded, "-m", "x")
    assert stray.code == 2 and "add --commit" in stray.err
    bad_file = gantry("data", "upload", "customers", loaded.with_suffix(".txt"))
    assert bad_file.code == 2 and "unknown suffix '.txt'" in bad_file.err
    listing = gantry("data", "list")
    assert listing.code == 0 and "customers" in listing.out


def test_read_output_csv_round_trip(gantry: Gantry, loaded: Path, tmp_path: Path) -> None:
    out = tmp_path / "x.csv"
    result = gantry("data", "read", "customers", "--view", "raw", "--output", out)
    assert result.code == 0 and "wrote 50 rows" in result.err
    assert list(csv.DictReader(io.StringIO(out.read_text()))) == list(
        csv.DictReader(io.StringIO(ROWS))
    )
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no .part left
    parquet = tmp_path / "x.parquet"
    assert (
        gantry("data", "read", "customers", "--view", "raw", "-o", parquet, "--limit", "7").code
        == 0
    )
    assert pq.read_table(parquet).num_rows == 7
    wrong = gantry("data", "read", "customers", "--output", tmp_path / "x.xlsx")
    assert wrong.code == 2 and "name the file .csv, .parquet or .pq" in wrong.err


def test_read_prints_tables_csv_and_json(gantry: Gantry, loaded: Path) -> None:
    shown = gantry("data", "read", "customers", "--view", "raw")
    assert shown.code == 0 and "u0@example.com" in shown.out and "u19@example.com" in shown.out
    assert "u20@example.com" not in shown.out and "--limit 0" in shown.err
    deid = gantry("data", "read", "customers", "--limit", "3")
    assert deid.code == 0 and "u0@example.com" not in deid.out and "deidentified view" in deid.out
    as_csv = gantry("data", "read", "customers", "--view", "raw", "--format", "csv")
    assert list(csv.DictReader(io.StringIO(as_csv.out))) == list(csv.DictReader(io.StringIO(ROWS)))
    as_json = gantry(
        "data", "read", "customers", "--view", "raw", "--format", "json", "--limit", "2"
    )
    assert [json.loads(line) for line in as_json.out.splitlines()] == [
        {"id": 0, "email": "u0@example.com", "zip": "00000"},
        {"id": 1, "email": "u1@example.com", "zip": "00001"},
    ]
    missing = gantry("data", "read", "nope")
    assert missing.code == 2 and "gantry: error: dataset 'nope' not found" in missing.err


def test_permission_denied_is_an_error_not_a_traceback(
    gantry: Gantry, loaded: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GANTRY_TOKEN", "viewer-token")
    denied = gantry("data", "read", "customers", "--view", "raw")
    assert denied.code == 2 and "gantry: error: 'viewer' may not read_raw" in denied.err


def test_files_upload_and_download(gantry: Gantry, tmp_path: Path) -> None:
    assert gantry("data", "create", "scans", "--files").code == 0
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    (src / "a" / "1.png").write_bytes(b"png")
    (src / "2.png").write_bytes(b"png2")
    up = gantry("data", "upload", "scans", src, "--commit", "-m", "scans")
    assert up.code == 0 and "uploaded 2 files" in up.out and "committed version" in up.out
    got = gantry("data", "download", "scans", tmp_path / "dest", "--view", "raw")
    assert got.code == 0 and "downloaded 2 files" in got.out
    assert (tmp_path / "dest" / "a" / "1.png").read_bytes() == b"png"
    as_table = gantry("data", "read", "scans", "--view", "raw")
    assert as_table.code == 2 and "holds files" in as_table.err


def test_grant_prints_the_token_once_with_a_warning(gantry: Gantry, loaded: Path) -> None:
    result = gantry(
        "data", "grant", "job-9", "customers@abc", "--view", "deidentified", "--ttl", "2h"
    )
    assert result.code == 0
    assert result.out.strip() == "secret-grant-token-1"  # only the token on stdout
    assert "secret" in result.err and "not shown again" in result.err
    assert "job job-9 may read customers@abc" in result.err
    bad = gantry("data", "grant", "job-9", "customers")
    assert bad.code == 2 and "write NAME@VERSION" in bad.err
    ttl = gantry("data", "grant", "job-9", "customers@abc", "--ttl", "forever")
    assert ttl.code == 2 and "invalid duration 'forever'" in ttl.err
    lineage = gantry("data", "lineage", "--job", "job-9")
    assert lineage.code == 0 and "customers@abc" in lineage.out and "1 edge" in lineage.out
    for args in ([], ["--job", "j", "--dataset", "d"], ["--dataset", "d"], ["--model", "m"]):
        wrong = gantry("data", "lineage", *args)
        assert wrong.code == 2 and "gantry: error:" in wrong.err, args


def test_models_register_show_download(gantry: Gantry, tmp_path: Path) -> None:
    artifact = tmp_path / "model.pt"
    artifact.write_bytes(b"weights" * 1000)
    (tmp_path / "sig.json").write_text('{"inputs": ["x"]}')
    reg = gantry("models", "register", "churn", artifact, "--framework", "pytorch",
                 "--job", "job-9", "--metric", "auc=0.91", "--metric", "loss=0.2",
                 "--trained-on", "customers@abc", "--signature", tmp_path / "sig.json")  # fmt: skip
    assert reg.code == 0 and "registered churn v1" in reg.out
    listed = gantry("models", "list")
    assert listed.code == 0 and "churn" in listed.out and "auc=0.91" in listed.out
    shown = gantry("models", "show", "churn", "--version", "1")
    assert shown.code == 0 and "trained on customers@abc" in shown.out and '"inputs"' in shown.out
    dest = tmp_path / "out" / "churn.pt"
    got = gantry("models", "download", "churn", dest)
    assert got.code == 0 and dest.read_bytes() == artifact.read_bytes()
    bad_metric = gantry("models", "register", "churn", artifact, "--framework", "pytorch",
                        "--metric", "auc")  # fmt: skip
    assert bad_metric.code == 2 and "expected name=number, e.g. accuracy=0.93" in bad_metric.err
    into_dir = gantry("models", "download", "churn", tmp_path)
    assert into_dir.code == 2 and "is a directory" in into_dir.err
    missing = gantry("models", "show", "nope")
    assert missing.code == 2 and "model 'nope' not found" in missing.err


def test_the_address_comes_from_the_run_file(
    governance: Any, gantry: Gantry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GANTRY_GOVERNANCE_ADDR")
    nowhere = gantry("data", "list", "--data-dir", tmp_path)
    assert nowhere.code == 2
    assert "don't know where the governance service is" in nowhere.err
    assert "GANTRY_GOVERNANCE_ADDR" in nowhere.err
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "governance.json").write_text(json.dumps({"grpc": governance.address}))
    assert gantry("data", "list", "--data-dir", tmp_path).code == 0
