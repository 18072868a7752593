"""The gantry CLI and the SDK against a running embedded platform (NATS on a free port)."""

from __future__ import annotations

import contextlib
import csv
import datetime as dt
import io
import json
import re
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gantry.client import cli
from gantry.client.emit import emit
from gantry.core import IntegrityError, InvalidInput
from gantry.supervisor.platform import Platform

pytestmark = pytest.mark.timeout(120)

EVENT_ID = re.compile(r"id=([0-9a-f-]{36})")


@dataclass
class Result:
    code: int
    out: str
    err: str

    @property
    def text(self) -> str:
        return self.out + self.err


Gantry = Callable[..., Result]


@pytest.fixture
def gantry(capsys: pytest.CaptureFixture[str]) -> Gantry:
    """Run ``gantry ARGS`` through cli.main and capture what it printed."""

    def run(*args: str) -> Result:
        capsys.readouterr()
        code = cli.main([str(a) for a in args])
        captured = capsys.readouterr()
        assert "Traceback" not in captured.out + captured.err
        return Result(code, captured.out, captured.err)

    return run


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    logs: list[str] = []
    data = tmp_path_factory.mktemp("platform") / "data"
    running = Platform(
        data,
        nats_port=0,
        service_env={"GANTRY_AUDIT__CHECKPOINT_EVERY_S": "0.3"},
        log_sink=logs.append,
    )
    running.start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def emitted(platform: Platform) -> list[str]:
    """Three signed gantry.data.accessed events sent with `gantry events emit`, ids returned."""
    ids = []
    data = str(platform.data_dir)
    assert (
        cli.main(["admin", "service-account", "create", "feature-store", "--data-dir", data]) == 0
    )
    for actor, decision in [("alice", "allow"), ("bob", "allow"), ("bob", "deny")]:
        payload = json.dumps({"dataset": "customers", "rows": 7, "decision": decision})
        args = ["events", "emit", "gantry.data.accessed", "--data", payload]
        args += ["--source", "feature-store", "--actor", actor, "--data-dir", data]
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert cli.main(args) == 0
        match = EVENT_ID.search(out.getvalue())
        assert match, out.getvalue()
        ids.append(match.group(1))
    return ids


def poll(
    gantry: Gantry, *args: str | Path, until: Callable[[Result], bool], timeout: float = 20
) -> Result:
    deadline = time.monotonic() + timeout
    while True:
        result = gantry(*args)
        if until(result) or time.monotonic() > deadline:
            return result
        time.sleep(0.2)


# ---------------------------------------------------------------------- admin


def test_admin_init_creates_private_files_and_is_idempotent(tmp_path: Path, gantry: Gantry) -> None:
    first = gantry("admin", "init", "--data-dir", tmp_path)
    assert first.code == 0 and "created keys" in first.out
    token_file = tmp_path / "admin.token"
    issuer = tmp_path / "keys" / "issuer.pem"
    for path in (token_file, issuer):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    key, token = issuer.read_bytes(), token_file.read_text()
    assert token.count(".") == 2

    second = gantry("admin", "init", "--data-dir", tmp_path)
    assert second.code == 0 and "kept existing keys" in second.out
    assert issuer.read_bytes() == key  # keys kept
    assert token_file.read_text() != token  # a fresh admin token
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600


def test_token_create(tmp_path: Path, gantry: Gantry) -> None:
    missing = gantry("admin", "token", "create", "--user", "u", "--role", "auditor",
                     "--data-dir", tmp_path)  # fmt: skip
    assert missing.code == 2 and "gantry: error: no token-signing key" in missing.err
    assert "gantry admin init" in missing.err

    gantry("admin", "init", "--data-dir", tmp_path)
    bad = gantry("admin", "token", "create", "--user", "u", "--role", "auditor",
                 "--role", "wizard", "--data-dir", tmp_path)  # fmt: skip
    assert bad.code == 2
    assert "gantry: error: unknown role 'wizard'" in bad.err
    assert "auditor" in bad.err and "platform-admin" in bad.err  # lists the roles that exist

    bad_ttl = gantry("admin", "token", "create", "--user", "u", "--role", "auditor",
                     "--ttl", "forever", "--data-dir", tmp_path)  # fmt: skip
    assert bad_ttl.code == 2 and "invalid duration 'forever'" in bad_ttl.err

    ok = gantry("admin", "token", "create", "--user", "carol", "--role", "auditor",
                "--ttl", "1h", "--data-dir", tmp_path)  # fmt: skip
    assert ok.code == 0 and ok.out.strip().count(".") == 2


def test_cli_runner_reports_errors_without_a_traceback(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(cli.app, ["admin", "init", "--data-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    result = runner.invoke(
        cli.app,
        ["admin", "token", "create", "--user", "u", "--role", "nope", "--data-dir", str(tmp_path)],
    )
    assert result.exit_code == 2
    assert "gantry: error: unknown role 'nope'" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_service_account_names_are_checked(tmp_path: Path, gantry: Gantry) -> None:
    gantry("admin", "init", "--data-dir", tmp_path)
    assert gantry("admin", "service-account", "create", "audit", "--data-dir", tmp_path).code == 2
    assert (
        gantry("admin", "service-account", "create", "training-agent", "--data-dir", tmp_path).code
        == 2
    )
    bad = gantry("admin", "service-account", "create", "../x", "--data-dir", tmp_path)
    assert bad.code == 2 and "invalid service account name" in bad.err
    ok = gantry("admin", "service-account", "create", "etl", "--data-dir", tmp_path)
    assert ok.code == 0 and "etl.pem" in ok.out
    assert (tmp_path / "keys" / "trusted" / "sa-etl.pub").exists()


# ---------------------------------------------------------------------- events and audit


def test_emitted_events_are_found_by_query(
    platform: Platform, emitted: list[str], gantry: Gantry
) -> None:
    data = platform.data_dir
    found = poll(
        gantry, "audit", "query", "--type", "gantry.data.accessed", "--json", "--data-dir", data,
        until=lambda r: all(i in r.out for i in emitted),
    )  # fmt: skip
    assert found.code == 0
    records = [json.loads(line) for line in found.out.splitlines()]
    assert [r["event_id"] for r in records] == emitted
    assert records[0]["resource"] == "dataset/customers" and records[0]["event"]["actor"] == "alice"

    denied = gantry("audit", "query", "--actor", "bob", "--decision", "deny", "--json",
                    "--data-dir", data)  # fmt: skip
    assert [json.loads(line)["event_id"] for line in denied.out.splitlines()] == [emitted[2]]

    table = gantry("audit", "query", "--type", "gantry.data.accessed", "--data-dir", data)
    assert table.code == 0 and "3 audit records" in table.out and "alice" in table.out

    limited = gantry("audit", "query", "--limit", "1", "--json", "--data-dir", data)
    assert len(limited.out.splitlines()) == 1 and "--limit 0" in limited.err


def test_sdk_emit_one_call(platform: Platform, emitted: list[str]) -> None:
    import asyncio

    key = platform.data_dir / "keys" / "accounts" / "feature-store.pem"
    ack = asyncio.run(
        emit(
            "ext.feature-store.refreshed",
            {"table": "users"},
            source="feature-store",
            actor="svc-feature-store",
            data_dir=platform.data_dir,
            key_path=key,
        )
    )
    assert ack.stream and ack.seq > 0
    with pytest.raises(InvalidInput, match="event type must look like"):
        asyncio.run(emit("Bad", {}, source="s", actor="a", url=platform.nats_url))


def test_emit_errors_are_clear(platform: Platform, gantry: Gantry) -> None:
    data = platform.data_dir
    base = ("events", "emit", "--source", "feature-store", "--actor", "a", "--data-dir", data)
    not_json = gantry(*base, "gantry.data.accessed", "--data", "{nope")
    assert not_json.code == 2 and "--data is not valid JSON" in not_json.err
    bad_data = gantry(*base, "gantry.data.accessed", "--data", '{"dataset": "x", "rows": -1}')
    assert bad_data.code == 2 and "data.rows" in bad_data.err
    no_key = gantry(*base, "ext.x.y", "--key", data / "missing.pem")
    assert no_key.code == 2 and "no signing key at" in no_key.err


def test_access_report_prints_rows(platform: Platform, emitted: list[str], gantry: Gantry) -> None:
    data = platform.data_dir
    report = poll(
        gantry, "audit", "report", "dataset/customers", "--json", "--data-dir", data,
        until=lambda r: r.code == 0 and json.loads(r.out)["total"] >= 3,
    )  # fmt: skip
    rows = {row["actor"]: row for row in json.loads(report.out)["rows"]}
    assert rows["alice"]["allowed"] == 1 and rows["bob"]["denied"] == 1
    table = gantry("audit", "report", "dataset/customers", "--since", "1h", "--data-dir", data)
    assert table.code == 0
    for word in ("actor", "allowed", "denied", "alice", "bob", "read"):
        assert word in table.out
    future = gantry("audit", "report", "dataset/customers", "--since", "2999-01-01T00:00:00Z",
                    "--json", "--data-dir", data)  # fmt: skip
    assert json.loads(future.out)["rows"] == []


def test_export_csv_and_jsonl_file(
    platform: Platform, emitted: list[str], gantry: Gantry, tmp_path: Path
) -> None:
    data = platform.data_dir
    poll(gantry, "audit", "query", "--json", "--data-dir", data,
         until=lambda r: emitted[-1] in r.out)  # fmt: skip
    csv_out = gantry("audit", "export", "--format", "csv", "--type", "gantry.data.accessed",
                     "--data-dir", data)  # fmt: skip
    rows = list(csv.DictReader(io.StringIO(csv_out.out)))
    assert [r["event_id"] for r in rows] == emitted
    target = tmp_path / "out.jsonl"
    to_file = gantry("audit", "export", "--format", "jsonl", "--actor", "bob", "-o", target,
                     "--data-dir", data)  # fmt: skip
    assert to_file.code == 0 and "wrote 2 records" in to_file.err
    lines = [json.loads(line) for line in target.read_text().splitlines()]
    assert [line["event"]["id"] for line in lines] == emitted[1:]


def test_verify_and_proof(platform: Platform, emitted: list[str], gantry: Gantry) -> None:
    data = platform.data_dir
    proof = poll(gantry, "audit", "proof", emitted[1], "--data-dir", data,
                 until=lambda r: r.code == 0)  # fmt: skip
    assert proof.code == 0, proof.text
    assert proof.out.startswith("OK: event " + emitted[1])
    assert "signed by svc-audit" in proof.out

    first = gantry("audit", "verify", "--data-dir", data)
    assert first.code == 0, first.text
    assert first.out.startswith("OK: the server recomputed")
    assert "head remembered" in first.out or "seen before" in first.out
    remembered = json.loads((data / "cli" / "last_head.json").read_text())

    # more events, a later checkpoint: the new head must extend the remembered one
    gantry("events", "emit", "gantry.data.accessed", "--data", '{"dataset": "transactions"}',
           "--source", "feature-store", "--actor", "carol", "--data-dir", data)  # fmt: skip
    later = poll(
        gantry, "audit", "verify", "--data-dir", data,
        until=lambda r: "consistent with the head of size" in r.out,
    )  # fmt: skip
    assert later.code == 0, later.text
    assert f"size {remembered['tree_size']:,} seen before" in later.out

    missing = gantry("audit", "proof", "01a00000-0000-7000-8000-000000000000", "--data-dir", data)
    assert missing.code == 2 and "not found" in missing.err


def test_verify_reports_rewritten_history(platform: Platform, gantry: Gantry) -> None:
    data = platform.data_dir
    store = data / "cli" / "last_head.json"
    ok = poll(gantry, "audit", "verify", "--data-dir", data, until=lambda r: r.code == 0)
    assert ok.code == 0, ok.text
    saved = store.read_text()
    try:
        head = json.loads(saved)
        head["root_hash"] = "00" * 32  # what this CLI "saw" differs from the log's past
        store.write_text(json.dumps(head))
        forged = gantry("audit", "verify", "--data-dir", data)
        assert forged.code == 1
        assert "FAILED: history rewritten" in forged.out
        head["tree_size"] = 10**9  # the log "shrank"
        store.write_text(json.dumps(head))
        shrank = gantry("audit", "verify", "--data-dir", data)
        assert shrank.code == 1 and "history rewritten" in shrank.out and "shrank" in shrank.out
    finally:
        store.write_text(saved)


def test_bad_options_give_clear_errors(platform: Platform, gantry: Gantry) -> None:
    data = platform.data_dir
    decision = gantry("audit", "query", "--decision", "maybe", "--data-dir", data)
    assert decision.code == 2
    assert "--decision" in decision.err and "'maybe' is not one of" in decision.err
    since = gantry("audit", "query", "--since", "yesterday", "--data-dir", data)
    assert since.code == 2 and "gantry: error: invalid time 'yesterday'" in since.err
    window = gantry("audit", "query", "--since", "1h", "--until", "2h", "--data-dir", data)
    assert window.code == 2 and "must be before" in window.err
    token = gantry("audit", "query", "--token", "garbage", "--data-dir", data)
    assert token.code == 2 and "gantry: error: malformed token" in token.err
    fmt = gantry("audit", "export", "--format", "xml", "--data-dir", data)
    assert fmt.code == 2 and "--format" in fmt.err


def test_no_platform_is_a_clear_error(tmp_path: Path, gantry: Gantry) -> None:
    result = gantry("audit", "query", "--data-dir", tmp_path, "--token", "x")
    assert result.code == 2
    assert "don't know where the audit service is" in result.err


def test_parse_time() -> None:
    now = dt.datetime(2026, 1, 31, 12, 0, tzinfo=dt.UTC)
    noon = int(now.timestamp() * 1000)
    assert cli.parse_time("2026-01-31T12:00:00Z") == noon
    assert cli.parse_time("2026-01-31T12:00:00") == noon
    assert cli.parse_time("30m", now=now) == noon - 30 * 60_000
    assert cli.parse_time("1h", now=now) == noon - 3_600_000
    assert cli.parse_time("2d", now=now) == noon - 2 * 86_400_000
    with pytest.raises(InvalidInput, match="invalid time"):
        cli.parse_time("soon")


# ---------------------------------------------------------------------- demo


@pytest.mark.timeout(480)
@pytest.mark.serial  # its profiler chapter names a straggler by real timings: the machine alone
def test_demo_runs_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gantry.client import demo

    assert demo.main(["--data-dir", str(tmp_path / "demo"), "--rows", "5000", "--verbose"]) == 0
    captured = capsys.readouterr()
    out = captured.out
    # No secret of the run anywhere it wrote: the services' logs (--verbose streams them), its
    # output, databases, every event in the NATS store, exports and reports.
    from gantry.testing.secret_scan import scan

    leaks = scan(tmp_path / "demo", texts=[("stdout", out), ("stderr", captured.err)])
    assert not leaks, "\n".join(map(str, leaks))
    assert "events in the audit log" in out and "1,000" in out
    assert "Access to dataset/customers" in out
    assert "ml-developer's raw read was refused" in out and "refused, " in out
    assert "5,000 rows" in out and "encrypted shards" in out
    # the scheduling story: trusted pool, idempotent submit, preemption, usage, logs
    assert "train-churn ran on onprem-1 (pool onprem): it reads customers" in out
    assert "one job, j-" in out
    assert "eval-high preempted sweep-low" in out and "resumed at step" in out
    assert "usage by user" in out and "rita-researcher" in out
    assert "w1| rank 1 of 2 on onprem-1" in out and "w0| step 6/6 loss" in out
    # training for real: preempted, resumed from its checkpoint, registered with lineage
    assert "churn-model preempted by urgent-eval" in out
    assert "churn-model resumed from its checkpoint of step" in out
    assert "its agent registered model churn-classifier:" in out
    assert "registered model and its lineage" in out and "dev-engineer" in out
    # serving: deployed, answered over REST and gRPC, canary promoted, broken one rolled back
    assert "deployed churn-classifier v1" in out and "scored them over gRPC" in out
    assert "churn probability" in out and "(answered by v1)" in out
    assert "rolled out as a 20% canary and promoted by its checks" in out
    assert "canary rolled back automatically; v2 keeps serving" in out
    assert "history in the audit log" in out and "rolled_back" in out
    # profiling: the training job's profile, a deliberately slowed worker found and reported
    assert "churn-model: ms per step, recent steps" in out
    assert "the profiler named the straggler" in out
    assert "verdict: rank 1 on" in out and "Cause: its data loader is slow." in out
    assert "slow-loader: straggler found" in out and "rank 1 (data, slow_data_loading)" in out
    assert "deep trace of 5 steps of slow-loader recorded and downloaded" in out
    traces = sorted(p.name for p in (tmp_path / "demo" / "profiles" / "traces").iterdir())
    assert traces == ["rank0.json.gz", "rank1.json.gz"]
    pictures = sorted(p.name for p in (tmp_path / "demo" / "profiles").iterdir() if p.is_file())
    assert pictures == [
        "churn-model.html", "churn-model.png", "nodes.png", "slow-loader.html", "slow-loader.png"
    ]  # fmt: skip


def test_verify_reports_a_tampered_log(tmp_path: Path, gantry: Gantry) -> None:
    import sqlite3

    data = tmp_path / "data"
    with Platform(data, nats_port=0, log_sink=lambda line: None):
        gantry("admin", "service-account", "create", "etl", "--data-dir", data)
        for n in range(2):
            sent = gantry("events", "emit", "ext.etl.loaded", "--data", f'{{"n": {n}}}',
                          "--source", "etl", "--actor", "etl", "--data-dir", data)  # fmt: skip
            assert sent.code == 0, sent.text
        found = poll(gantry, "audit", "query", "--type", "ext.etl.loaded", "--json",
                     "--data-dir", data, until=lambda r: len(r.out.splitlines()) == 2)  # fmt: skip
        index = json.loads(found.out.splitlines()[0])["index"]
        assert gantry("audit", "verify", "--data-dir", data).code == 0
        with contextlib.closing(sqlite3.connect(data / "audit.db")) as db, db:
            db.execute(
                "UPDATE audit_events SET canonical = CAST(replace(canonical, ?, ?) AS BLOB) "
                "WHERE seq = ?",
                (b'"n":0', b'"n":9', index),
            )
        tampered = gantry("audit", "verify", "--data-dir", data)
    assert tampered.code == 1
    assert tampered.out.startswith("FAILED")
    assert f"index {index}: altered" in tampered.out


def test_gantry_up_runs_until_ctrl_c(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys
    import urllib.request

    data = tmp_path / "data"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gantry.client.cli", "up", "--data-dir", str(data),
         "--nats-port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group, like a shell job
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert proc.stdout is not None
    with proc.stdout:
        seen = []
        deadline = time.monotonic() + 30
        for raw in proc.stdout:
            seen.append(raw.decode())
            if "Press Ctrl-C to stop." in seen[-1] or time.monotonic() > deadline:
                break
        text = "".join(seen)
        assert "Press Ctrl-C to stop." in text, text
        assert "audit gRPC" in text and "nats://127.0.0.1:" in text and ":4222" not in text
        console = json.loads((data / "run" / "console.json").read_text())["http"]
        assert "web console" in text and console in text
        with urllib.request.urlopen(f"{console}/login", timeout=5) as page:  # it answers
            assert "Log in to Gantry" in page.read().decode()
        pids = json.loads((data / "run" / "audit.json").read_text())["pid"]
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches the whole foreground group
        rest = proc.stdout.read().decode()
    assert proc.wait(30) == 0, rest
    assert "Gantry stopped." in rest
    assert "did not stop in time" not in rest
    with pytest.raises(ProcessLookupError):
        os.kill(pids, 0)


def test_tree_heads_are_checked_against_the_audit_key_only(tmp_path: Path) -> None:
    from gantry.client import admin
    from gantry.client.config import ClientSettings
    from gantry.core import ConfigError
    from gantry.security.treehead import TreeHead

    admin.init(tmp_path)
    admin.create_service_account(tmp_path, "feature-store")
    settings = ClientSettings(data_dir=tmp_path)
    (tmp_path / "keys" / "trusted" / "svc-audit.pub").unlink()  # init made it: take it away
    with pytest.raises(ConfigError, match=r"svc-audit\.pub is not in"):
        cli.audit_trust(settings)
    audit_key = admin.keyring(tmp_path).service_key("audit")  # publishes it again
    trust = cli.audit_trust(settings)
    assert trust.kids() == ["svc-audit"]
    head = TreeHead(3, b"\x01" * 32, 1)
    head.signed(audit_key).check_signature(trust)
    # a service account's key is trusted for its events, never for tree heads
    account_key = admin.keyring(tmp_path).service_key("feature-store")
    with pytest.raises(IntegrityError, match="invalid signature"):
        head.signed(account_key).check_signature(trust)


def test_gantry_up_gives_the_console_a_free_port_when_its_own_is_taken(tmp_path: Path) -> None:
    import os
    import signal
    import socket
    import subprocess
    import sys

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        data = tmp_path / "data"
        proc = subprocess.Popen(
            [sys.executable, "-m", "gantry.client.cli", "up", "--data-dir", str(data),
             "--nats-port", "0", "--agents", "0", "--console-port", str(port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "COLUMNS": "200"},
        )  # fmt: skip
        assert proc.stdout is not None
        with proc.stdout:
            seen = []
            deadline = time.monotonic() + 30
            for raw in proc.stdout:
                seen.append(raw.decode())
                if "Press Ctrl-C to stop." in seen[-1] or time.monotonic() > deadline:
                    break
            text = "".join(seen)
            os.killpg(proc.pid, signal.SIGINT)
            proc.stdout.read()
        assert proc.wait(30) == 0
    assert f"port {port} is taken: the web console takes a free port" in text, text
    assert "web console" in text and f":{port} " not in text
