"""StorageSettings from the environment, and open_store() for each backend and key source."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from pydantic import BaseModel, Field

from gantry.core import CommonSettings, ConfigError, load_settings
from gantry.storage import (
    KeySettings,
    LocalBackend,
    LocalKeyFile,
    MountedSecretKeys,
    S3Backend,
    S3Settings,
    StorageSettings,
    open_store,
)
from gantry.storage.settings import open_key_source
from gantry.testing.s3 import S3Endpoint


class ExampleOptions(BaseModel):
    storage: StorageSettings = Field(default_factory=StorageSettings)


class ExampleSettings(CommonSettings):
    example: ExampleOptions = Field(default_factory=ExampleOptions)


def test_defaults_are_a_local_store_under_the_data_dir(tmp_path: Path) -> None:
    settings = StorageSettings()
    assert (settings.backend, settings.chunk_size, settings.keys.source) == ("local", 2**20, "file")
    store = open_store(settings, data_dir=tmp_path)
    assert isinstance(store.backend, LocalBackend)
    assert store.backend.root == tmp_path / "objects"
    store.put("hello", b"world")
    key_file = tmp_path / "keys" / "storage-kek.json"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert open_store(settings, data_dir=tmp_path).get("hello") == b"world"


def test_settings_come_from_nested_environment_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GANTRY_EXAMPLE__STORAGE__BACKEND", "s3")
    monkeypatch.setenv("GANTRY_EXAMPLE__STORAGE__CHUNK_SIZE", "131072")
    monkeypatch.setenv("GANTRY_EXAMPLE__STORAGE__S3__ENDPOINT", "minio.internal:9000")
    monkeypatch.setenv("GANTRY_EXAMPLE__STORAGE__S3__SECRET_KEY", "hunter2")
    monkeypatch.setenv("GANTRY_EXAMPLE__STORAGE__KEYS__SOURCE", "kubernetes")
    monkeypatch.setenv("GANTRY_EXAMPLE__STORAGE__KEYS__WRAP_LIMIT", "1000")
    storage = load_settings(ExampleSettings).example.storage
    assert storage.backend == "s3" and storage.chunk_size == 131072
    assert storage.s3.endpoint == "minio.internal:9000"
    assert storage.s3.secret_key.get_secret_value() == "hunter2"
    assert "hunter2" not in repr(storage)
    assert (storage.keys.source, storage.keys.wrap_limit) == ("kubernetes", 1000)


@pytest.mark.parametrize("value", ["1024", "2097152"])
def test_a_chunk_size_out_of_range_says_the_allowed_range(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("GANTRY_EXAMPLE__STORAGE__CHUNK_SIZE", value)
    with pytest.raises(ConfigError) as err:
        load_settings(ExampleSettings)
    message = str(err.value)
    assert "GANTRY_EXAMPLE__STORAGE__CHUNK_SIZE" in message
    assert "between 65536 (64 KiB) and 1048576 (1 MiB) bytes" in message


def test_a_part_size_below_the_s3_minimum_is_refused() -> None:
    with pytest.raises(ValueError, match="greater than or equal to 5242880"):
        S3Settings(part_size=1024)


def test_key_sources_follow_the_settings(tmp_path: Path) -> None:
    file_source = open_key_source(KeySettings(), data_dir=tmp_path)
    assert isinstance(file_source, LocalKeyFile)
    assert file_source.path == tmp_path / "keys" / "storage-kek.json"
    mounted = open_key_source(
        KeySettings(source="mounted", mounted_dir=tmp_path / "m"), data_dir=tmp_path
    )
    assert isinstance(mounted, MountedSecretKeys) and mounted.directory == tmp_path / "m"


def test_open_store_on_s3(s3_server: S3Endpoint, tmp_path: Path) -> None:
    settings = StorageSettings(
        backend="s3",
        chunk_size=65536,
        s3=S3Settings(
            endpoint=s3_server.url,  # an http:// prefix turns TLS off
            bucket="settings-test",
            access_key=s3_server.access_key,
            secret_key=s3_server.secret_key,  # type: ignore[arg-type]
            part_size=5 * 1024 * 1024,
        ),
    )
    store = open_store(settings, data_dir=tmp_path)
    assert isinstance(store.backend, S3Backend) and store.backend.bucket == "settings-test"
    store.put("x/y", b"over S3")
    assert open_store(settings, data_dir=tmp_path).get("x/y") == b"over S3"
