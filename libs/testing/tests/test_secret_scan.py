"""The secret scanner finds what leaked, names where, and leaves the secret holders alone."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from gantry.security.bootstrap import init_data_dir
from gantry.testing.secret_scan import run_secrets, scan


def test_a_clean_run_has_no_leaks_and_each_kind_of_leak_is_found(tmp_path: Path) -> None:
    data = tmp_path / "data"
    init_data_dir(data, ttl=dt.timedelta(minutes=5))
    secrets = run_secrets(data)
    assert any(k.startswith("NATS password") for k in secrets)
    assert any(k.startswith("private key") for k in secrets)
    assert "admin token" in secrets
    (data / "service.log").write_text('{"event": "started", "user": "audit"}\n')
    assert scan(data) == []  # keys/, admin.token and the credentials file may hold secrets

    token = (data / "admin.token").read_text().strip()
    password = next(v for k, v in secrets.items() if k.startswith("NATS password"))
    (data / "service.log").write_text(f"called with {token}\n")
    (data / "db.sqlite").write_bytes(b"\x00\x01" + password + b"\x00")
    (data / "grant.txt").write_text("ggr_" + "A" * 43)
    leaks = {str(leak) for leak in scan(data, texts=[("stdout", "nothing here")])}
    assert any(s == "admin token in service.log" for s in leaks), leaks
    assert any("an identity token" in s and "service.log" in s for s in leaks), leaks
    assert any(s.startswith("NATS password") and s.endswith("db.sqlite") for s in leaks), leaks
    assert any("data grant token" in s and "grant.txt" in s for s in leaks), leaks
    assert [str(x) for x in scan(data, texts=[("stdout", f"x {token} y")]) if "stdout" in str(x)]
