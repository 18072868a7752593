"""``gantry admin init | nats-config | streams``: NATS users and streams for deployments."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
from pathlib import Path

import pytest

from gantry.client import cli
from gantry.core import NatsSettings
from gantry.events import Bus
from gantry.events.nats_auth import password_of, read_credentials, render_auth_conf
from gantry.events.streams import STREAMS
from gantry.supervisor.nats_server import NatsServer, find_nats_server

ROOT = Path(__file__).resolve().parents[3]
GENERATED = (ROOT / "deploy/nats/auth.conf", ROOT / "deploy/k8s/base/nats/auth.conf")


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    capsys.readouterr()
    code = cli.main([str(a) for a in args])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    return code, captured.out + captured.err


def test_committed_nats_users_match_the_event_catalog(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["admin", "nats-config", "--check"]
    for path in GENERATED:
        args += ["--out", str(path)]
    code, text = _run(capsys, *args)
    assert code == 0, text


def test_check_names_a_stale_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stale = tmp_path / "auth.conf"
    stale.write_text(render_auth_conf().replace('"gantry.job.scheduled"', '"gantry.>"'))
    code, text = _run(capsys, "admin", "nats-config", "--check", "--out", str(stale))
    assert code != 0
    assert str(stale) in text and "gantry admin nats-config --out" in text


def test_compose_nats_config_is_accepted_by_nats_server(tmp_path: Path) -> None:
    """nats-server itself parses the compose configuration with the generated users."""
    conf_dir = tmp_path / "nats"
    conf_dir.mkdir()
    text = (ROOT / "deploy/nats/nats-server.conf").read_text()
    assert "sync_interval: always" in text
    (conf_dir / "nats-server.conf").write_text(
        text.replace("/data/jetstream", str(tmp_path / "js"))
    )
    (conf_dir / "auth.conf").write_text((ROOT / "deploy/nats/auth.conf").read_text())
    env = {**os.environ, **{name: "n0secret" for name in _password_names()}}
    result = subprocess.run(
        [find_nats_server(), "-c", str(conf_dir / "nats-server.conf"), "-t"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _password_names() -> list[str]:
    from gantry.events.topology import USERS, env_name

    return [env_name(u) for u in USERS]


def test_init_writes_private_nats_credentials_and_streams_creates_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    code, text = _run(capsys, "admin", "init", "--data-dir", str(data))
    assert code == 0, text
    creds_path = data / "nats" / "credentials.env"
    assert str(creds_path) in text
    from gantry.security.bootstrap import PLATFORM_SECRETS, PLATFORM_SERVICES

    for name in PLATFORM_SERVICES:  # made up front, so a cluster can hold them in Secrets
        assert (data / "keys" / "services" / f"{name}.pem").is_file(), name
        assert (data / "keys" / "trusted" / f"svc-{name}.pub").is_file(), name
    for name in PLATFORM_SECRETS:
        assert (data / "keys" / "secrets" / f"{name}.key").is_file(), name
    assert stat.S_IMODE(os.stat(creds_path).st_mode) == 0o600
    creds = read_credentials(creds_path)
    for secret in creds.values():
        assert secret not in text  # the passwords are never printed
    server = NatsServer(tmp_path / "server", auth_conf=render_auth_conf(), env=creds).start()
    try:
        code, text = _run(capsys, "admin", "streams", "--url", server.url, "--data-dir", str(data))
        assert code == 0, text
        for definition in STREAMS:
            assert definition.name in text

        async def scheduler_starts() -> None:
            settings = NatsSettings(
                url=server.url, user="scheduler", password=password_of(creds, "scheduler")
            )
            bus = await Bus.connect(settings, name="t")
            try:
                await bus.ensure_streams()  # already as defined: nothing it may not do
                assert not bus.denied
            finally:
                await bus.close()

        asyncio.run(scheduler_starts())
    finally:
        server.stop()


def test_streams_without_credentials_says_what_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, text = _run(
        capsys, "admin", "streams", "--url", "nats://127.0.0.1:1", "--data-dir", str(tmp_path)
    )
    assert code != 0
    assert "credentials" in text and "gantry admin init" in text
