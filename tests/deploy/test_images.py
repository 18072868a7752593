"""The service images, read from their Dockerfiles (no Docker engine needed).

Each services/<name>/Dockerfile builds wheels of exactly the Gantry packages the service's
pyproject.toml needs, transitively, and installs them with constraints.txt into a slim image
that runs ``python -m gantry.<name>`` as a non-root user, with a health check on the service's
/readyz. Services that need torch get it from a build argument's index (CPU or CUDA).
"""

from __future__ import annotations

import importlib
import json
import re
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BASE_IMAGE = "python:3.11-slim"
TORCH_INDEX_DEFAULT = "https://download.pytorch.org/whl/cpu"
#: The agent's health port by the team's contract, until AgentOptions.health_port exists.
AGENT_HEALTH_PORT = 9037
#: Where a service's /readyz is, when not on its metrics port: the agent's health port, and the
#: console's one HTTP port (its pages, /healthz and /readyz; it has no metrics port).
HEALTH_OPTION = {"training_agent": "health_port", "console": "http_port"}

SERVICES = sorted(p.name for p in (ROOT / "services").iterdir() if (p / "pyproject.toml").is_file())


# -- the packages -------------------------------------------------------------------------------


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~\[;(@]", requirement, maxsplit=1)[0].lower().replace("_", "-")


@cache
def projects() -> dict[str, tuple[str, list[str], str]]:
    """Distribution name -> (repo path, dependency names, description) of every package."""
    found = {}
    for pyproject in sorted(ROOT.glob("*/*/pyproject.toml")):
        if pyproject.parent.parent.name not in ("libs", "services"):
            continue
        project = tomllib.loads(pyproject.read_text())["project"]
        found[project["name"]] = (
            pyproject.parent.relative_to(ROOT).as_posix(),
            [_name(d) for d in project.get("dependencies", [])],
            project.get("description", ""),
        )
    return found


def distribution(service: str) -> str:
    return tomllib.loads((ROOT / "services" / service / "pyproject.toml").read_text())["project"][
        "name"
    ]


def closure(service: str) -> set[str]:
    """Repo paths of the service's package and every gantry-* package it needs, transitively."""
    known = projects()
    seen: set[str] = set()
    stack = [distribution(service)]
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        assert name in known, f"{service} needs {name}, which is not a package of this repo"
        seen.add(name)
        stack += [d for d in known[name][1] if d.startswith("gantry-")]
    return {known[n][0] for n in seen}


def needs_torch(service: str) -> bool:
    known = projects()
    return any("torch" in deps for path, deps, _ in known.values() if path in closure(service))


def constraint(package: str) -> str:
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        name, sep, version = line.partition("==")
        if sep and _name(name) == package:
            return version.strip()
    raise AssertionError(f"constraints.txt pins no {package}")


# -- reading a Dockerfile -----------------------------------------------------------------------


@dataclass
class Stage:
    """One FROM ... stage: its base, its name and its instructions (upper-case keyword, rest)."""

    base: str
    name: str | None
    instructions: list[tuple[str, str]]

    def all(self, keyword: str) -> list[str]:
        return [rest for kw, rest in self.instructions if kw == keyword]


def instructions(path: Path) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) of each instruction, continuation lines joined, comments dropped."""
    result: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        keyword, _, rest = line.partition(" ")
        result.append((keyword.upper(), " ".join(rest.split())))
    assert not pending, f"{path}: a continuation runs off the end"
    return result


def stages(service: str) -> list[Stage]:
    found: list[Stage] = []
    for keyword, rest in instructions(dockerfile(service)):
        if keyword == "FROM":
            words = rest.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            found.append(Stage(words[0], name, []))
        else:
            assert found, f"{service}: {keyword} before FROM"
            found[-1].instructions.append((keyword, rest))
    return found


def dockerfile(service: str) -> Path:
    return ROOT / "services" / service / "Dockerfile"


def exec_form(rest: str) -> list[str]:
    """A JSON-array instruction argument (ENTRYPOINT, HEALTHCHECK CMD)."""
    value = json.loads(rest)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), rest
    return value


def settings_class(service: str) -> type:
    """The service's settings class (the one CommonSettings subclass of its settings module)."""
    from gantry.core import CommonSettings

    module = importlib.import_module(f"gantry.{service}.settings")
    (found,) = (
        v
        for v in vars(module).values()
        if isinstance(v, type) and issubclass(v, CommonSettings) and v is not CommonSettings
    )
    return found


def env(stage: Stage) -> dict[str, str]:
    """The stage's ENV settings (the KEY=value form)."""
    return {
        m[1]: m[2].strip("\"'")
        for rest in stage.all("ENV")
        for m in re.finditer(r"(\w+)=(\"[^\"]*\"|\S+)", rest)
    }


def resolves(model: type, path: list[str]) -> bool:
    """Whether GANTRY_A__B names a field (a.b) of the settings model (groups are models)."""
    field = model.model_fields.get(path[0])  # type: ignore[attr-defined]
    if field is None or len(path) == 1:
        return field is not None
    inner = field.annotation
    return isinstance(inner, type) and resolves(inner, path[1:])


def args(stage: Stage) -> dict[str, str]:
    found = {}
    for rest in stage.all("ARG"):
        name, _, default = rest.partition("=")
        found[name] = default.strip("\"'")
    return found


# -- tests ----------------------------------------------------------------------------------


def test_every_service_has_a_dockerfile() -> None:
    assert SERVICES, "no services found"
    for service in SERVICES:
        assert dockerfile(service).is_file(), f"services/{service}/Dockerfile is missing"
    assert not (ROOT / "deploy" / "docker" / "service.Dockerfile").exists(), (
        "one Dockerfile per service replaces the shared one"
    )


@pytest.mark.parametrize("service", SERVICES)
def test_builds_wheels_then_installs_them_into_a_slim_image(service: str) -> None:
    found = stages(service)
    assert len(found) >= 2, f"{service}: a builder stage and a runtime stage"
    for stage in found:
        assert stage.base == BASE_IMAGE, f"{service}: FROM {stage.base}, not {BASE_IMAGE}"
    builder, runtime = found[0], found[-1]
    wheel = [r for r in builder.all("RUN") if "pip wheel" in r]
    assert len(wheel) == 1, f"{service}: one `pip wheel` in the builder"
    assert "-c constraints.txt" in wheel[0] and "--no-deps" in wheel[0], service
    install = [r for r in runtime.all("RUN") if "/wheels" in r]
    assert len(install) == 1, f"{service}: one install of the builder's wheels"
    assert f"from={builder.name}" in install[0], f"{service}: wheels come from the builder"
    assert re.search(r"pip install -c \S*constraints\.txt /wheels/\*\.whl", install[0]), service
    assert not runtime.all("COPY"), f"{service}: the runtime stage copies no sources"


@pytest.mark.parametrize("service", SERVICES)
def test_installs_exactly_the_gantry_packages_the_service_needs(service: str) -> None:
    builder = stages(service)[0]
    wheel = next(r for r in builder.all("RUN") if "pip wheel" in r)
    built = set(re.findall(r"\./((?:libs|services)/\w+)", wheel))
    needed = closure(service)
    assert built == needed, (
        f"{service}: missing {sorted(needed - built)}, not needed {sorted(built - needed)}"
    )
    copied = {
        m[1] for rest in builder.all("COPY") if (m := re.match(r"((?:libs|services)/\w+)/? ", rest))
    }
    assert copied == needed, f"{service}: copies {sorted(copied ^ needed)} wrongly"


@pytest.mark.parametrize("service", SERVICES)
def test_runs_as_a_non_root_user(service: str) -> None:
    runtime = stages(service)[-1]
    users = runtime.all("USER")
    assert users, f"{service}: no USER"
    user = users[-1].split(":")[0]
    assert user.isdigit(), f"{service}: USER by uid, so Kubernetes can check runAsNonRoot"
    assert int(user) != 0, f"{service}: runs as root"
    assert any(f"--uid {user}" in r for r in runtime.all("RUN")), f"{service}: create uid {user}"


@pytest.mark.parametrize("service", SERVICES)
def test_health_check_polls_readyz_on_the_service_port(service: str) -> None:
    runtime = stages(service)[-1]
    checks = runtime.all("HEALTHCHECK")
    assert len(checks) == 1, f"{service}: one HEALTHCHECK"
    command = exec_form(checks[0].split(" CMD ", 1)[1])
    assert command[:2] == ["python", "-c"], f"{service}: slim images have no curl"
    group = "agent" if service == "training_agent" else service
    option = HEALTH_OPTION.get(service, "metrics_port")
    variable = f"GANTRY_{group.upper()}__{option.upper()}"
    fields = settings_class(service).model_fields[group].annotation.model_fields
    port = env(runtime).get(variable) or (fields[option].default if option in fields else None)
    if port is None and service == "training_agent":
        port = AGENT_HEALTH_PORT
    assert port and int(port) != 0, f"{service}: set {variable} so the health check knows it"
    assert f"http://127.0.0.1:{port}/readyz" in command[2], service


@pytest.mark.parametrize("service", SERVICES)
def test_entry_point_is_the_service_module(service: str) -> None:
    runtime = stages(service)[-1]
    (entry,) = runtime.all("ENTRYPOINT")
    assert exec_form(entry) == ["python", "-m", f"gantry.{service}"]
    main = ROOT / "services" / service / "src" / "gantry" / service / "__main__.py"
    assert main.is_file(), f"{service}: {main.relative_to(ROOT)} is missing"


@pytest.mark.parametrize("service", SERVICES)
def test_oci_labels_describe_the_image(service: str) -> None:
    runtime = stages(service)[-1]
    labels = " ".join(runtime.all("LABEL"))
    for key in ("title", "description", "version", "revision", "vendor", "base.name"):
        assert f"org.opencontainers.image.{key}=" in labels, f"{service}: no {key} label"
    title = service.replace("_", "-")
    assert f'org.opencontainers.image.title="gantry-{title}"' in labels, service
    description = projects()[distribution(service)][2]
    assert f'org.opencontainers.image.description="{description}"' in labels, (
        f"{service}: the description is the pyproject's"
    )


@pytest.mark.parametrize("service", SERVICES)
def test_torch_comes_from_a_build_argument_index(service: str) -> None:
    runtime = stages(service)[-1]
    text = " ".join(rest for _, rest in runtime.instructions)
    if not needs_torch(service):
        assert "torch" not in text.lower(), f"{service} needs no torch: keep the image slim"
        return
    declared = args(runtime)
    assert declared.get("TORCH_INDEX_URL") == TORCH_INDEX_DEFAULT, service
    assert declared.get("TORCH_VERSION") == constraint("torch"), (
        f"{service}: TORCH_VERSION is the torch pin of constraints.txt"
    )
    runs = runtime.all("RUN")
    torch_runs = [i for i, r in enumerate(runs) if '--index-url "${TORCH_INDEX_URL}"' in r]
    assert len(torch_runs) == 1, f"{service}: install torch from ${{TORCH_INDEX_URL}}"
    assert '"torch==${TORCH_VERSION}"' in runs[torch_runs[0]], service
    wheels = next(i for i, r in enumerate(runs) if "/wheels" in r)
    assert torch_runs[0] < wheels, f"{service}: torch before the Gantry wheels"


@pytest.mark.parametrize("service", SERVICES)
def test_image_environment_names_real_settings(service: str) -> None:
    settings = settings_class(service)
    for key in env(stages(service)[-1]):
        if key.startswith("GANTRY_"):
            path = key.removeprefix("GANTRY_").lower().split("__")
            assert resolves(settings, path), f"{service}: {key} is not a setting"


def test_dockerignore_keeps_local_state_out_of_the_build_context() -> None:
    patterns = {
        line.strip().rstrip("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    for path in (".git", ".venv", ".gantry", "gantry-data", "bench"):
        assert path in patterns, f".dockerignore must leave out {path}"
    for path in ("libs", "services", "constraints.txt"):
        assert path not in patterns, f".dockerignore must keep {path}"
