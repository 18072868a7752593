"""`gantry data` and `gantry models` against the real platform (NATS, audit, governance)."""

from __future__ import annotations

import csv
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gantry.client import cli
from gantry.supervisor.platform import Platform

pytestmark = pytest.mark.timeout(180)


@dataclass
class Result:
    code: int
    out: str
    err: str


Run = Callable[..., Result]


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    data = tmp_path_factory.mktemp("gov-platform") / "data"
    logs: list[str] = []
    running = Platform(
        data,
        nats_port=0,
        service_env={"GANTRY_AUDIT__CHECKPOINT_EVERY_S": "0.3"},
        log_sink=logs.append,
    )
    running.start()
    yield running
    running.stop()


@pytest.fixture
def gantry(capsys: pytest.CaptureFixture[str], platform: Platform) -> Run:
    """Run ``gantry ARGS --data-dir D [--token T]`` and capture its output."""

    def run(*args: str | Path, token: str | None = None) -> Result:
        argv = [str(a) for a in args] + ["--data-dir", str(platform.data_dir)]
        if token:
            argv += ["--token", token]
        capsys.readouterr()
        code = cli.main(argv)
        captured = capsys.readouterr()
        assert "Traceback" not in captured.out + captured.err
        return Result(code, captured.out, captured.err)

    return run


def _token(gantry: Run, user: str, role: str) -> str:
    made = gantry("admin", "token", "create", "--user", user, "--role", role)
    assert made.code == 0, made.err
    return made.out.strip().splitlines()[-1]


def test_data_lifecycle_through_the_cli(gantry: Run, tmp_path: Path) -> None:
    steward = _token(gantry, "sam", "data-steward")
    annotator = _token(gantry, "ann", "annotator")
    developer = _token(gantry, "dev", "ml-developer")
    auditor = _token(gantry, "carol", "auditor")
    csv_path = tmp_path / "patients.csv"
    with csv_path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["pid", "email", "age", "diagnosis"])
        for i in range(500):
            w.writerow([i, f"p{i}@clinic.org", 20 + i % 60, ["flu", "cold"][i % 2]])

    created = gantry("data", "create", "patients", "--column", "pid:int64:internal",
                     "--column", "email:string:pii", "--column", "age:int64:internal",
                     "--column", "diagnosis:string:sensitive", token=steward)  # fmt: skip
    assert created.code == 0, created.err
    bad = gantry("data", "create", "../escape", "--column", "a:int64:public", token=steward)
    assert bad.code == 2 and "gantry: error:" in bad.err
    up = gantry("data", "upload", "patients", csv_path, "--commit", "-m", "first", token=steward)
    assert up.code == 0, up.err
    log = gantry("data", "log", "patients", token=steward)
    assert log.code == 0 and "first" in log.out

    raw_out = tmp_path / "raw.csv"
    raw = gantry("data", "read", "patients", "--view", "raw", "--output", raw_out, token=annotator)
    assert raw.code == 0, raw.err
    rows = list(csv.DictReader(raw_out.read_text().splitlines()))
    assert len(rows) == 500 and rows[0]["email"].endswith("@clinic.org")

    deid_out = tmp_path / "deid.csv"
    deid = gantry("data", "read", "patients", "--view", "deidentified", "--output", deid_out,
                  token=developer)  # fmt: skip
    assert deid.code == 0, deid.err
    seen = list(csv.DictReader(deid_out.read_text().splitlines()))
    assert len(seen) == 500 and "diagnosis" not in seen[0] and "@" not in seen[0]["email"]

    denied = gantry("data", "read", "patients", "--view", "raw", token=developer)
    assert denied.code == 2 and "may not read" in denied.err

    again = gantry("data", "upload", "patients", csv_path, "--commit", "-m", "more", "--append",
                   token=steward)  # fmt: skip
    assert again.code == 0, again.err
    versions = json.loads(gantry("data", "log", "patients", "--json", token=steward).out)
    assert [v["rows"] for v in versions] == [1000, 500]
    back = gantry("data", "rollback", "patients", versions[1]["id"], "-m", "undo", token=steward)
    assert back.code == 0, back.err

    granted = gantry("data", "grant", "job-7", f"patients@{versions[0]['id'][:10]}",
                     "--view", "deidentified", token=steward)  # fmt: skip
    assert granted.code == 0 and granted.out.strip().startswith("ggr_"), granted.err
    assert "secret" in granted.err
    listing = gantry("data", "grants", "--job", "job-7", token=steward)
    assert listing.code == 0 and "active" in listing.out and "ggr_" not in listing.out
    grant_id = granted.err.split()[1].rstrip(":")
    revoked = gantry("data", "revoke", grant_id, "--reason", "done", token=steward)
    assert revoked.code == 0 and "revoked" in revoked.out, revoked.err
    assert gantry("data", "revoke", grant_id, token=developer).code == 2

    # the refused raw read is in the audit trail
    def denials(out: str) -> dict[str, int]:
        totals: dict[str, int] = {}
        for r in json.loads(out)["rows"] if out.strip() else []:
            totals[r["actor"]] = totals.get(r["actor"], 0) + r["denied"]
        return totals

    deadline = time.monotonic() + 20
    while True:
        report = gantry("audit", "report", "dataset/patients", "--json", token=auditor)
        assert report.code == 0, report.err
        seen = denials(report.out)
        if seen.get("dev", 0) >= 1 or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert seen.get("dev", 0) >= 1 and seen.get("ann") == 0


def test_models_through_the_cli(gantry: Run, tmp_path: Path) -> None:
    developer = _token(gantry, "dev", "ml-developer")
    artifact = tmp_path / "model.pt"
    artifact.write_bytes(b"weights" * 10_000)
    reg = gantry("models", "register", "churn", artifact, "--framework", "pytorch",
                 "--metric", "auc=0.9", "--code-version", "3f2a9c81", token=developer)  # fmt: skip
    assert reg.code == 0, reg.err
    listed = gantry("models", "list", token=developer)
    assert listed.code == 0 and "churn" in listed.out
    shown = gantry("models", "show", "churn", token=developer)
    assert shown.code == 0 and "code version 3f2a9c81" in shown.out
    dest = tmp_path / "back.pt"
    got = gantry("models", "download", "churn", dest, token=developer)
    assert got.code == 0, got.err
    assert dest.read_bytes() == artifact.read_bytes()
    missing = gantry("models", "show", "nope", token=developer)
    assert missing.code == 2 and "gantry models list" in missing.err
