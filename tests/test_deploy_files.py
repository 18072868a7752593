"""Static checks of the deployment files (no Docker engine is needed to run them)."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_compose_services_build_from_files_that_exist() -> None:
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    services = compose["services"]
    assert {"nats", "postgres", "audit"} <= set(services)
    for name, spec in services.items():
        build = spec.get("build")
        if build:
            assert (ROOT / build["context"] / build["dockerfile"]).is_file(), name
            assert (ROOT / "services" / build["args"]["SERVICE"]).is_dir(), name


def test_every_service_package_has_an_image_entry_point() -> None:
    dockerfile = (ROOT / "deploy/docker/service.Dockerfile").read_text()
    assert "python -m gantry.${SERVICE}" in dockerfile
    for service in (ROOT / "services").iterdir():
        name = service.name
        assert (service / "src" / "gantry" / name / "__main__.py").is_file(), name


def test_nats_config_gives_each_service_its_own_user() -> None:
    conf = (ROOT / "deploy/nats/nats-server.conf").read_text()
    assert "jetstream" in conf
    for user in ("audit", "external"):
        assert f"user: {user}" in conf


def _settings_class(service: str) -> type:
    import importlib

    from gantry.core import CommonSettings

    module = importlib.import_module(f"gantry.{service}.settings")
    found = [
        v
        for v in vars(module).values()
        if isinstance(v, type) and issubclass(v, CommonSettings) and v is not CommonSettings
    ]
    assert len(found) == 1, service
    return found[0]


def _resolves(model: type, path: list[str]) -> bool:
    """Whether GANTRY_A__B__C names a field (a.b.c) of the settings model."""
    from pydantic import BaseModel

    field = model.model_fields.get(path[0])  # type: ignore[attr-defined]
    if field is None:
        return False
    if len(path) == 1:
        return True
    inner = field.annotation
    return isinstance(inner, type) and issubclass(inner, BaseModel) and _resolves(inner, path[1:])


def test_every_service_is_in_compose_with_settings_it_understands() -> None:
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    for service in sorted(p.name for p in (ROOT / "services").iterdir() if p.is_dir()):
        name = service.replace("_", "-")  # package training_agent, service training-agent
        assert name in compose, f"compose.yaml has no {name} service"
        env = compose[name]["environment"]
        settings = _settings_class(service)
        for key in env:
            assert key.startswith("GANTRY_"), key
            path = key.removeprefix("GANTRY_").lower().split("__")
            assert _resolves(settings, path), f"{service}: {key} is not a setting"


def test_images_install_every_gantry_library_a_service_needs() -> None:
    import re
    import tomllib

    dockerfile = (ROOT / "deploy/docker/service.Dockerfile").read_text()
    installed = set(re.findall(r"\./libs/([a-z_]+)", dockerfile))
    for service in (ROOT / "services").iterdir():
        project = tomllib.loads((service / "pyproject.toml").read_text())["project"]
        needs = {d.split(">")[0].split("[")[0] for d in project["dependencies"]}
        libs = {d.removeprefix("gantry-") for d in needs if d.startswith("gantry-")}
        assert libs <= installed, f"{service.name} needs {sorted(libs - installed)}"


def test_nats_config_has_a_user_for_every_service() -> None:
    conf = (ROOT / "deploy/nats/nats-server.conf").read_text()
    for service in (ROOT / "services").iterdir():
        name = service.name.replace("_", "-")
        assert f"user: {name}" in conf, name
