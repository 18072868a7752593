"""compose.yaml checked against what the services expect, with no Docker engine.

Where Docker Compose v2 is installed, ``docker compose config`` validates the file as Compose
itself reads it. Everywhere, the file is parsed and checked here: every service builds from a
Dockerfile that exists, every ``GANTRY_*`` variable is a field of that service's settings class
(and the values load), health checks poll the ports the services serve, the start order follows
who calls whom, ports do not clash, the NATS users and databases match their configuration, and
every ``${VARIABLE}`` without a default is documented in docs/deploy-compose.md.
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
import types
import typing
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "compose.yaml"
DOC = ROOT / "docs" / "deploy-compose.md"
NATS_DIR = ROOT / "deploy" / "nats"
POSTGRES_INIT = ROOT / "deploy" / "postgres" / "initdb"
DATA_DIR = "/var/lib/gantry"

# Settings the team has agreed on whose fields have not landed in the settings classes yet:
# TLS for every process (gantry.core) and the node agent's health port. They are exempt from
# the check that a variable names a real settings field. Delete this constant, and its one use
# below, once those fields exist.
PENDING_FIELDS = frozenset(
    {
        "GANTRY_TLS__ENABLED",
        "GANTRY_TLS__CA_FILE",
        "GANTRY_TLS__CERT_FILE",
        "GANTRY_TLS__KEY_FILE",
        "GANTRY_TLS__CLIENT_AUTH",
        "GANTRY_AGENT__HEALTH_PORT",
    }
)
#: The agent's health port by the team's contract, until AgentOptions.health_port exists.
AGENT_HEALTH_PORT = 9037

#: Service packages with no NATS connection (no NATS user, no streams): the web console, which
#: calls the services' gRPC APIs with the viewer's token and nothing else.
WITHOUT_NATS = frozenset({"console"})
#: Where a service's /readyz is, when not on its metrics port: the agent's health port, and the
#: console's one HTTP port (its pages, /healthz and /readyz).
HEALTH_OPTION = {"training_agent": "health_port", "console": "http_port"}
#: The services the console calls (GANTRY_CONSOLE__<SERVICE>_ADDR), by compose name and port.
CONSOLE_PEERS = {
    "audit": 7031,
    "governance": 7032,
    "scheduler": 7033,
    "serving": 7034,
    "profiler": 7035,
    "workflows": 7036,
}

# Calls that do not hold up a start: the audit service starts first, so that it records the
# platform from its first event, and asks governance only when a data-subject report is
# requested (one channel per report).
ADDR_WITHOUT_WAIT = {("audit", "governance")}

# The start order: each pair is (earlier, later), checked through depends_on transitively.
START_ORDER = [
    ("nats", "audit"),
    ("postgres", "audit"),
    ("minio", "audit"),
    ("audit", "governance"),
    ("governance", "scheduler"),
    ("governance", "profiler"),
    ("scheduler", "serving"),
    ("profiler", "serving"),
    ("serving", "workflows"),
]

CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}
CREDENTIALS_FILE = "gantry-data/nats/credentials.env"


# -- reading compose.yaml -------------------------------------------------------------------

_VARIABLE = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}"
    r"|(?P<plain>[A-Za-z_][A-Za-z0-9_]*))"
)


class MissingVariable(Exception):
    """A ``${NAME:?message}`` whose variable is not set."""


def _strings(node: object) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, Mapping):
        for key, value in node.items():
            yield from _strings(key)
            yield from _strings(value)
    elif isinstance(node, list):
        for item in node:
            yield from _strings(item)


def variables(compose: Mapping[str, Any]) -> dict[str, bool]:
    """Every ``${NAME}`` the file interpolates, mapped to whether it has a default."""
    found: dict[str, bool] = {}
    for text in _strings(compose):
        for m in _VARIABLE.finditer(text):
            name = m["name"] or m["plain"]
            if name:
                has_default = m["op"] in (":-", "-")
                found[name] = found.get(name, False) or has_default
    return found


def interpolate(text: str, env: Mapping[str, str]) -> str:
    """``text`` with ``${NAME}``, ``${NAME:-default}``, ``${NAME:?err}`` ... filled from env."""

    def one(m: re.Match[str]) -> str:
        if m["escaped"]:
            return "$"
        name = m["name"] or m["plain"]
        op, arg = m["op"] or "", m["arg"] or ""
        value = env.get(name)
        is_set = value is not None and (value != "" or not op.startswith(":"))
        if op.endswith("-"):
            return value if is_set and value is not None else arg
        if op.endswith("?"):
            if not is_set or value is None:
                raise MissingVariable(f"{name}: {arg}")
            return value
        if op.endswith("+"):
            return arg if is_set else ""
        return value or ""

    return _VARIABLE.sub(one, text)


def dummy_env(compose: Mapping[str, Any]) -> dict[str, str]:
    """A value for every variable without a default (what the env files would provide)."""
    return {
        name: "dummy-" + name.lower().replace("_", "-")
        for name, has_default in variables(compose).items()
        if not has_default
    }


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(loaded, dict)
    return loaded


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found = compose["services"]
    assert isinstance(found, dict)
    return found


def package_of(spec: Mapping[str, Any]) -> str | None:
    """The services/<package> a compose service builds, or None for an infrastructure one."""
    build = spec.get("build")
    if not isinstance(build, Mapping):
        return None
    m = re.fullmatch(r"services/(\w+)/Dockerfile", str(build.get("dockerfile", "")))
    return m[1] if m else None


def gantry_services(services: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """Compose service name -> service package, for the Gantry services (not one-shot jobs)."""
    return {
        name: pkg
        for name, spec in services.items()
        if (pkg := package_of(spec)) is not None and "entrypoint" not in spec
    }


def jobs(services: Mapping[str, Mapping[str, Any]]) -> dict[str, list[str]]:
    """One-shot containers run from a Gantry image with another entry point -> that command."""
    return {
        name: [str(c) for c in [*spec["entrypoint"], *(spec.get("command") or [])]]
        for name, spec in services.items()
        if package_of(spec) is not None and "entrypoint" in spec
    }


def environment(spec: Mapping[str, Any], env: Mapping[str, str] | None = None) -> dict[str, str]:
    """A service's environment as a mapping, interpolated with ``env`` when given."""
    raw = spec.get("environment") or {}
    if isinstance(raw, list):
        raw = dict(item.split("=", 1) for item in raw)
    result = {str(k): "" if v is None else str(v) for k, v in raw.items()}
    if env is not None:
        result = {k: interpolate(v, env) for k, v in result.items()}
    return result


def depends_on(spec: Mapping[str, Any]) -> dict[str, str]:
    """Dependency name -> condition (the short list form means service_started)."""
    raw = spec.get("depends_on") or {}
    if isinstance(raw, list):
        return dict.fromkeys(raw, "service_started")
    return {name: (cfg or {}).get("condition", "service_started") for name, cfg in raw.items()}


def all_dependencies(services: Mapping[str, Mapping[str, Any]], name: str) -> set[str]:
    seen: set[str] = set()
    stack = list(depends_on(services[name]))
    while stack:
        dep = stack.pop()
        if dep not in seen:
            seen.add(dep)
            stack += depends_on(services[dep])
    return seen


# -- settings classes -------------------------------------------------------------------------


def settings_class(package: str) -> type:
    from gantry.core import CommonSettings

    module = importlib.import_module(f"gantry.{package}.settings")
    found = [
        v
        for v in vars(module).values()
        if isinstance(v, type) and issubclass(v, CommonSettings) and v is not CommonSettings
    ]
    assert len(found) == 1, package
    return found[0]


def _models(annotation: object) -> list[type]:
    """The pydantic models an annotation holds (``Model``, ``Model | None``)."""
    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [m for arg in typing.get_args(annotation) for m in _models(arg)]
    return []


def resolves(model: type, path: list[str]) -> bool:
    """Whether GANTRY_A__B__C names a field (a.b.c) of the settings model."""
    field = model.model_fields.get(path[0])  # type: ignore[attr-defined]
    if field is None:
        return False
    if len(path) == 1:
        return True
    return any(resolves(inner, path[1:]) for inner in _models(field.annotation))


def setting_path(variable: str) -> list[str]:
    return variable.removeprefix("GANTRY_").lower().split("__")


def port_setting(package: str, env: Mapping[str, str], name: str) -> int | None:
    """A port option of the service: from its compose environment, else the settings default."""
    group = "agent" if package == "training_agent" else package
    variable = f"GANTRY_{group.upper()}__{name.upper()}"
    if variable in env:
        return int(env[variable])
    options = settings_class(package).model_fields[group].annotation
    field = options.model_fields.get(name)
    return None if field is None else int(field.default)


def health_port(package: str, env: Mapping[str, str]) -> int:
    if package == "training_agent":
        return port_setting(package, env, "health_port") or AGENT_HEALTH_PORT
    port = port_setting(package, env, HEALTH_OPTION.get(package, "metrics_port"))
    assert port is not None, package
    return port


def on_nats(services: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """The Gantry services that connect to NATS (all but the console)."""
    return {n: p for n, p in gantry_services(services).items() if p not in WITHOUT_NATS}


# -- Docker Compose itself, where it is installed ------------------------------------------------


def compose_command() -> list[str] | None:
    """``docker compose`` where the plugin works, else a Compose v2 ``docker-compose``."""
    candidates = []
    if shutil.which("docker"):
        candidates.append(["docker", "compose"])
    if shutil.which("docker-compose"):
        candidates.append(["docker-compose"])
    for cmd in candidates:
        try:
            out = subprocess.run(
                [*cmd, "version"], capture_output=True, text=True, timeout=30, check=False
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode == 0 and re.search(r"\bv?2\.\d+", out.stdout):
            return cmd
    return None


def test_docker_compose_accepts_the_file(compose: dict[str, Any]) -> None:
    cmd = compose_command()
    if cmd is None:
        pytest.skip(
            "Docker Compose v2 is not installed (`docker compose version` fails): "
            "compose.yaml is checked by parsing alone in the other tests of this module"
        )
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPOSE_")}
    env.update(dummy_env(compose))
    run = subprocess.run(
        [*cmd, "-f", str(COMPOSE_FILE), "--project-directory", str(ROOT), "config", "-q"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    # Without the credentials Compose refuses to start, naming what is missing.
    del env["GANTRY_NATS_AUDIT_PASSWORD"]
    run = subprocess.run(
        [*cmd, "-f", str(COMPOSE_FILE), "--project-directory", str(ROOT), "config", "-q"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode != 0
    assert "GANTRY_NATS_AUDIT_PASSWORD" in run.stderr


def test_interpolation_follows_compose_rules() -> None:
    env = {"SET": "x", "EMPTY": ""}
    assert interpolate("${SET}-${UNSET:-d}-${EMPTY:-e}-${EMPTY-f}-$$", env) == "x-d-e--$"
    assert interpolate("${SET:+yes}${UNSET:+no}", env) == "yes"
    with pytest.raises(MissingVariable, match="UNSET: see"):
        interpolate("${UNSET:?see}", env)


# -- images -------------------------------------------------------------------------------------


def test_every_service_of_the_repo_runs_from_its_own_dockerfile(
    services: dict[str, dict[str, Any]],
) -> None:
    built = gantry_services(services)
    packages = sorted(
        p.name for p in (ROOT / "services").iterdir() if (p / "pyproject.toml").is_file()
    )
    assert sorted(set(built.values())) == packages, "every service package runs in compose"
    for name, spec in services.items():
        build = spec.get("build")
        if build is None:
            image = str(spec.get("image", ""))
            assert re.fullmatch(r"[\w./-]+:[\w.-]+", image), f"{name}: pin {image!r} by tag"
            assert not image.endswith(":latest"), f"{name}: pin {image!r} by tag"
            continue
        assert (ROOT / build["context"]).resolve() == ROOT, f"{name}: build from the repo root"
        assert (ROOT / build["dockerfile"]).is_file(), f"{name}: {build['dockerfile']} missing"
        assert package_of(spec), f"{name}: builds {build['dockerfile']}, not a service Dockerfile"


def test_build_arguments_are_declared_by_the_dockerfile(
    services: dict[str, dict[str, Any]],
) -> None:
    for name, spec in services.items():
        build = spec.get("build")
        if not isinstance(build, Mapping) or not build.get("args"):
            continue
        text = (ROOT / build["dockerfile"]).read_text()
        declared = set(re.findall(r"^ARG\s+(\w+)", text, re.MULTILINE))
        assert set(build["args"]) <= declared, f"{name}: {set(build['args']) - declared}"


# -- settings -----------------------------------------------------------------------------------


def test_every_gantry_variable_is_a_setting_of_its_service(
    services: dict[str, dict[str, Any]],
) -> None:
    for name, package in gantry_services(services).items():
        settings = settings_class(package)
        for key in environment(services[name]):
            assert key.startswith("GANTRY_"), f"{name}: {key} is not a Gantry setting"
            if key in PENDING_FIELDS:
                continue
            assert resolves(settings, setting_path(key)), (
                f"{name}: {key} is not a field of {settings.__name__}"
            )


def test_every_service_loads_its_compose_settings(
    compose: dict[str, Any], services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from gantry.core import load_settings

    values = dummy_env(compose)
    for name, package in gantry_services(services).items():
        env = environment(services[name], values)
        with monkeypatch.context() as m:
            for key in list(os.environ):
                if key.startswith("GANTRY_"):
                    m.delenv(key)
            for key, value in env.items():
                m.setenv(key, value)
            settings: Any = load_settings(settings_class(package))
        assert str(settings.data_dir) == DATA_DIR, name
        if package in WITHOUT_NATS:
            assert not any(k.startswith("GANTRY_NATS__") for k in env), f"{name}: no NATS"
            continue
        assert settings.nats.url == "nats://nats:4222", name
        assert settings.nats.stream_replicas == 1, f"{name}: one NATS server, one replica"
        assert settings.nats.user, f"{name}: every service connects as its own NATS user"
        assert settings.nats.password, name


def test_tls_is_off_unless_asked_for(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    for name in gantry_services(services):
        env = environment(services[name], dummy_env(compose))
        assert env["GANTRY_TLS__ENABLED"] == "false", name
        assert environment(services[name])["GANTRY_TLS__ENABLED"].startswith(
            "${GANTRY_TLS_ENABLED:-"
        ), f"{name}: GANTRY_TLS_ENABLED turns TLS on everywhere"
        for key in ("GANTRY_TLS__CA_FILE", "GANTRY_TLS__CERT_FILE", "GANTRY_TLS__KEY_FILE"):
            assert env[key].startswith(f"{DATA_DIR}/tls/"), f"{name}: {key}"


# -- health and start order -----------------------------------------------------------------


def test_every_container_has_a_health_check(services: dict[str, dict[str, Any]]) -> None:
    built = gantry_services(services)
    for name, spec in services.items():
        if name in jobs(services):
            assert spec.get("restart") == "no", f"{name} runs once"
            continue
        check = spec.get("healthcheck")
        assert check and check.get("test"), f"{name} has no health check"
        assert not check.get("disable"), name
        if name not in built:
            continue
        package = built[name]
        port = health_port(package, environment(spec))
        command = " ".join(check["test"])
        assert f"http://127.0.0.1:{port}/readyz" in command, (
            f"{name}: its health check must poll /readyz on port {port}"
        )


def test_dependencies_exist_and_wait_for_health(services: dict[str, dict[str, Any]]) -> None:
    for name, spec in services.items():
        for dep, condition in depends_on(spec).items():
            assert dep in services, f"{name} depends on {dep}, which is not a service"
            assert condition in CONDITIONS, f"{name}: {condition}"
            if dep in jobs(services):
                assert condition == "service_completed_successfully", f"{name}: {dep} must succeed"
                continue
            assert condition == "service_healthy", f"{name}: wait until {dep} is healthy"
            assert services[dep].get("healthcheck"), f"{dep} has no health check to wait on"


def test_start_order_has_no_cycle(services: dict[str, dict[str, Any]]) -> None:
    state: dict[str, str] = {}

    def visit(name: str, path: list[str]) -> None:
        if state.get(name) == "done":
            return
        assert state.get(name) != "visiting", "cycle: " + " -> ".join([*path, name])
        state[name] = "visiting"
        for dep in depends_on(services[name]):
            visit(dep, [*path, name])
        state[name] = "done"

    for name in services:
        visit(name, [])


def test_start_order_follows_who_needs_whom(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    built = gantry_services(services)
    for earlier, later in START_ORDER:
        assert earlier in all_dependencies(services, later), f"{later} starts after {earlier}"
    for name in on_nats(services):
        assert "nats" in depends_on(services[name]), f"{name} needs NATS"
        if name != "audit":
            assert "audit" in all_dependencies(services, name), f"{name} starts after audit"
    agents = [n for n, p in built.items() if p == "training_agent"]
    for agent in agents:
        # After every service on the event bus; the console is no one's dependency.
        for other in set(on_nats(services)) - set(agents):
            assert other in all_dependencies(services, agent), f"{agent} starts after {other}"
    for name in built:
        deps = depends_on(services[name])
        for key, value in environment(services[name]).items():
            if not key.endswith("_ADDR") or not value:
                continue
            target = value.rsplit(":", 1)[0]
            assert target in services, f"{name}: {key}={value} names no compose service"
            if (name, target) not in ADDR_WITHOUT_WAIT:
                assert target in deps, f"{name} calls {target} ({key}): it must wait for it"
        env = environment(services[name], dummy_env(compose))
        if any(k.endswith("DATABASE_URL") and "@postgres" in v for k, v in env.items()):
            assert "postgres" in deps, name
        if env.get("GANTRY_STORAGE__BACKEND") == "s3":
            assert "minio" in deps, name


# -- ports and agents ---------------------------------------------------------------------------


def published(spec: Mapping[str, Any]) -> list[tuple[str, int, int]]:
    """(host address, host port, container port) of each published port."""
    result = []
    for entry in spec.get("ports") or []:
        if isinstance(entry, Mapping):
            target = int(entry["target"])
            result.append((str(entry.get("host_ip", "")), int(entry["published"]), target))
            continue
        parts = str(entry).split("/")[0].split(":")
        assert len(parts) in (2, 3), f"publish {entry!r} as [IP:]HOST:CONTAINER"
        host = parts[0] if len(parts) == 3 else ""
        result.append((host, int(parts[-2]), int(parts[-1])))
    return result


def test_published_ports_are_unique_and_served(services: dict[str, dict[str, Any]]) -> None:
    built = gantry_services(services)
    owners: dict[int, str] = {}
    for name, spec in services.items():
        for _, host_port, container_port in published(spec):
            assert host_port not in owners, f"{name} and {owners[host_port]} publish {host_port}"
            owners[host_port] = name
            if name in built:
                package = built[name]
                env = environment(spec)
                served = {health_port(package, env)} | {
                    port
                    for option in ("grpc_port", "http_port", "metrics_port")
                    if (port := port_setting(package, env, option)) is not None
                }
                assert container_port in served, f"{name} serves nothing on {container_port}"


def test_streams_are_created_by_the_admin_before_any_service(
    compose: dict[str, Any], services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from gantry.core import CommonSettings, load_settings

    found = [name for name, command in jobs(services).items() if command[-1:] == ["streams"]]
    assert len(found) == 1, "one container creates the JetStream streams"
    (name,) = found
    assert jobs(services)[name] == ["python", "-m", "gantry.events.admin", "streams"]
    assert (ROOT / "libs/events/src/gantry/events/admin.py").is_file()
    spec = services[name]
    assert depends_on(spec) == {"nats": "service_healthy"}
    env = environment(spec)
    for key in env:
        assert key in PENDING_FIELDS or resolves(CommonSettings, setting_path(key)), key
    assert env["GANTRY_NATS__USER"] == "admin", "services may not create streams; admin may"
    admin_password = nats_users(nats_config())["admin"]
    assert env["GANTRY_NATS__PASSWORD"].startswith(f"${{{admin_password}")
    for service in gantry_services(services):
        assert name in all_dependencies(services, service), f"{service} starts after {name}"
    for service in on_nats(services):
        same = environment(services[service])["GANTRY_NATS__STREAM_REPLICAS"]
        assert env["GANTRY_NATS__STREAM_REPLICAS"] == same, f"{service}: streams as created"
    with monkeypatch.context() as m:
        for key in list(os.environ):
            if key.startswith("GANTRY_"):
                m.delenv(key)
        for key, value in environment(spec, dummy_env(compose)).items():
            m.setenv(key, value)
        settings = load_settings(CommonSettings)
    assert settings.nats.url == "nats://nats:4222"


def test_two_agents_are_two_distinct_nodes(services: dict[str, dict[str, Any]]) -> None:
    agents = {n: s for n, s in services.items() if package_of(s) == "training_agent"}
    assert len(agents) >= 2, "compose runs two node agents"
    nodes = []
    for name, spec in agents.items():
        command = [str(c) for c in spec.get("command") or []]
        assert "--node" in command, f"{name}: give the node a name (--node)"
        nodes.append(command[command.index("--node") + 1])
        env = environment(spec)
        assert env["GANTRY_AGENT__ADVERTISE_ADDRESS"] == name, (
            f"{name}: other nodes reach it at its compose name"
        )
        assert env["GANTRY_NATS__USER"] == "training-agent", name
        if published(spec):
            assert env["GANTRY_AGENT__HEALTH_HOST"] == "0.0.0.0", f"{name}: reachable from outside"
    assert len(set(nodes)) == len(nodes), f"node names clash: {nodes}"


def test_every_service_shares_the_data_directory(services: dict[str, dict[str, Any]]) -> None:
    for name in on_nats(services):
        volumes = [str(v) for v in services[name].get("volumes") or []]
        assert f"./gantry-data:{DATA_DIR}" in volumes, name
        assert environment(services[name])["GANTRY_DATA_DIR"] == DATA_DIR, name


# -- the web console ------------------------------------------------------------------------------


def consoles(services: Mapping[str, Mapping[str, Any]]) -> list[str]:
    found = [n for n, p in gantry_services(services).items() if p == "console"]
    assert found == ["console"], found
    return found


def test_console_gets_the_token_issuers_public_keys_and_nothing_else_of_the_data(
    services: dict[str, dict[str, Any]],
) -> None:
    # It verifies users' tokens (keys/issuers/*.pub) and signs nothing: not the whole
    # ./gantry-data (issuer.pem, the services' keys and secrets, the NATS credentials).
    for name in consoles(services):
        volumes = [str(v) for v in services[name].get("volumes") or []]
        assert volumes == [f"./gantry-data/keys/issuers:{DATA_DIR}/keys/issuers:ro"], volumes
        env = environment(services[name])
        assert env["GANTRY_DATA_DIR"] == DATA_DIR
        assert env["GANTRY_TLS__CERT_FILE"] == f"{DATA_DIR}/tls/console.crt"
        assert env["GANTRY_TLS__KEY_FILE"] == f"{DATA_DIR}/tls/console.key"
        for key, value in env.items():
            assert not key.startswith(("GANTRY_NATS__", "GANTRY_STORAGE__")), f"{name}: {key}"
            assert "DATABASE_URL" not in key and "PASSWORD" not in value, f"{name}: {key}"


def test_console_calls_the_six_services_and_waits_for_them(
    compose: dict[str, Any], services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from gantry.core import load_settings

    for name in consoles(services):
        spec = services[name]
        assert depends_on(spec) == dict.fromkeys(CONSOLE_PEERS, "service_healthy")
        for peer, port in CONSOLE_PEERS.items():
            # The port the peer really serves gRPC on, in this file.
            assert port_setting(peer, environment(services[peer]), "grpc_port") == port, peer
        with monkeypatch.context() as m:
            for key in list(os.environ):
                if key.startswith("GANTRY_"):
                    m.delenv(key)
            for key, value in environment(spec, dummy_env(compose)).items():
                m.setenv(key, value)
            settings: Any = load_settings(settings_class("console"))
        options = settings.console
        for peer, port in CONSOLE_PEERS.items():
            assert getattr(options, f"{peer}_addr") == f"{peer}:{port}", peer
        assert options.http_host == "0.0.0.0", "reachable through the published port"
        assert options.http_port == 8040
        assert published(spec) == [("127.0.0.1", 8040, 8040)], "the loopback address only"
        assert options.public_url == "http://127.0.0.1:8040", "the published address"


# -- documentation --------------------------------------------------------------------------------


def test_every_variable_without_a_default_is_documented(compose: dict[str, Any]) -> None:
    doc = DOC.read_text()
    for name, has_default in sorted(variables(compose).items()):
        if not has_default:
            assert name in doc, f"${{{name}}} has no default: document it in {DOC.name}"
    assert CREDENTIALS_FILE in doc


def test_secrets_are_required_not_defaulted(compose: dict[str, Any]) -> None:
    required = {
        m["name"]
        for text in _strings(compose)
        for m in _VARIABLE.finditer(text)
        if m["op"] in (":?", "?")
    }
    for name, has_default in variables(compose).items():
        if name.endswith("_PASSWORD"):
            assert not has_default, f"${{{name}}} must not have a default"
            assert name in required, f"${{{name}:?...}}: Compose must refuse to run without it"


# -- NATS ---------------------------------------------------------------------------------------


def nats_config() -> str:
    """nats-server.conf with its includes, comments removed."""

    def read(path: Path, depth: int = 0) -> str:
        assert depth < 5, f"include loop at {path}"
        text = "\n".join(
            re.sub(r"(^|\s)(#|//).*$", "", line) for line in path.read_text().splitlines()
        )
        for m in re.finditer(r"^\s*include\s+[\"']?([^\"'\s;]+)", text, re.MULTILINE):
            included = path.parent / m[1]
            assert included.is_file(), f"{path.name} includes {m[1]}, which is not in {path.parent}"
            text += "\n" + read(included, depth + 1)
        return text

    return read(NATS_DIR / "nats-server.conf")


def nats_users(conf: str) -> dict[str, str]:
    """NATS user -> the environment variable its password comes from."""
    pairs = re.findall(
        r"user\s*[:=]\s*[\"']?([\w.-]+)[\"']?\s*,?\s*password\s*[:=]\s*[\"']?\$(\w+)", conf
    )
    return dict(pairs)


def test_nats_runs_the_repo_config_with_jetstream(services: dict[str, dict[str, Any]]) -> None:
    nats = services["nats"]
    assert nats["image"] == "nats:2.11-alpine"
    command = [str(c) for c in nats["command"]]
    config = command[command.index("-c") + 1]
    assert config == "/etc/nats/nats-server.conf"
    mounts = [str(v) for v in nats["volumes"]]
    assert "./deploy/nats:/etc/nats:ro" in mounts, "the config directory, read-only"
    conf = nats_config()
    assert re.search(r"\bjetstream\b", conf)
    store = re.search(r"store_dir\s*[:=]\s*[\"']?([^\"'\s]+)", conf)
    assert store, "JetStream's file store needs a store_dir on a volume"
    volumes = [v.split(":")[1] for v in mounts if not v.startswith((".", "/"))]
    assert any(store[1] == v or store[1].startswith(v + "/") for v in volumes), (
        f"store_dir {store[1]} is on no named volume of the nats service"
    )
    monitor = re.search(r"http(?:_port)?\s*[:=]\s*[\"']?(?:[\w.]*:)?(\d+)", conf)
    assert monitor, "the health check needs NATS's monitoring port (http_port)"
    health = " ".join(nats["healthcheck"]["test"])
    assert f"127.0.0.1:{monitor[1]}/healthz" in health


def test_each_service_is_its_own_nats_user(services: dict[str, dict[str, Any]]) -> None:
    users = nats_users(nats_config())
    nats_env = environment(services["nats"])
    for variable in users.values():
        assert nats_env.get(variable, "").startswith(f"${{{variable}"), (
            f"the nats container needs {variable}"
        )
    for name in on_nats(services):
        env = environment(services[name])
        user = env["GANTRY_NATS__USER"]
        assert user in users, f"{name}: NATS has no user {user!r}"
        assert env["GANTRY_NATS__PASSWORD"].startswith(f"${{{users[user]}"), (
            f"{name}: the password of {user} is ${users[user]}"
        )
    service_users = {environment(services[n])["GANTRY_NATS__USER"] for n in on_nats(services)}
    assert len(service_users) == len(set(on_nats(services).values())), "one NATS user per service"


# -- PostgreSQL and MinIO -----------------------------------------------------------------------


def test_each_service_has_its_own_database(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    from sqlalchemy.engine import make_url

    values = dummy_env(compose)
    postgres = environment(services["postgres"], values)
    mounts = [str(v) for v in services["postgres"]["volumes"]]
    assert "./deploy/postgres/initdb:/docker-entrypoint-initdb.d:ro" in mounts
    created = {
        name
        for script in POSTGRES_INIT.glob("*.sql")
        for name in re.findall(r"CREATE DATABASE\s+(\w+)", script.read_text(), re.IGNORECASE)
    }
    owner: dict[str, str] = {}
    for name in gantry_services(services):
        for key, value in environment(services[name], values).items():
            if not key.endswith("DATABASE_URL"):
                continue
            url = make_url(value)
            assert url.drivername == "postgresql+psycopg", f"{name}: {key}"
            assert (url.host, url.port) == ("postgres", 5432), f"{name}: {key}"
            assert url.username == postgres["POSTGRES_USER"], f"{name}: {key}"
            assert url.password == postgres["POSTGRES_PASSWORD"], f"{name}: {key}"
            assert url.database in created, f"{name}: {url.database} is not created at init"
            assert owner.setdefault(str(url.database), name) == name, (
                f"{name} and {owner[str(url.database)]} share {url.database}"
            )


def test_object_store_services_use_minio(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    values = dummy_env(compose)
    minio = environment(services["minio"], values)
    for name, package in gantry_services(services).items():
        if "storage" not in settings_class(package).model_fields:
            continue
        env = environment(services[name], values)
        assert env.get("GANTRY_STORAGE__BACKEND") == "s3", f"{name}: one store for all"
        assert env["GANTRY_STORAGE__S3__ENDPOINT"] == "minio:9000", name
        assert env["GANTRY_STORAGE__S3__ACCESS_KEY"] == minio["MINIO_ROOT_USER"], name
        assert env["GANTRY_STORAGE__S3__SECRET_KEY"] == minio["MINIO_ROOT_PASSWORD"], name
