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
