"""The serving service's link to the governance model registry (adapter).

A version is downloaded once into ``<data_dir>/serving/models/<model>/<version>`` — the
registry decrypts it and the SDK checks its sha256 against the registered digest before the
file appears — and read from there; a cached file is checked against the digest again before
every load, so a file changed on disk is downloaded afresh rather than served.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from typing import Any

from gantry.client.model_registry import ModelsClient, ModelVersion
from gantry.core import get_logger
from gantry.core.runfile import service_address
from gantry.security.keyring import Keyring
from gantry.security.tokens import ServiceToken
from gantry.serving.settings import ServingSettings

SERVICE_NAME = "serving"
_log = get_logger("gantry.serving")


@dataclass(frozen=True)
class Fetched:
    """A registered version's record and its verified bytes."""

    info: ModelVersion
    data: bytes

    @property
    def format(self) -> str:
        """The artefact's format from its signature ("" when not said)."""
        signature = self.signature
        return str(signature.get("format", "")) if isinstance(signature, dict) else ""

    @property
    def signature(self) -> dict[str, Any]:
        """The registered signature (empty when none)."""
        parsed = self.info.signature
        return parsed if isinstance(parsed, dict) else {}


class RegistryLink:
    """Fetches model versions from the governance service with the service's own token."""

    def __init__(self, settings: ServingSettings, keyring: Keyring) -> None:
        self._settings = settings
        self._keyring = keyring
        self._service_token = ServiceToken(
            SERVICE_NAME,
            functools.partial(keyring.service_key, SERVICE_NAME),
            configured=settings.serving.token.get_secret_value(),
        )
        self.cache_dir = settings.data_dir / "serving" / "models"

    def address(self) -> str:
        """The governance address (setting, else the embedded platform's run file)."""
        return service_address(
            self._settings.data_dir,
            "governance",
            configured=self._settings.serving.governance_addr,
            setting="GANTRY_SERVING__GOVERNANCE_ADDR",
        )

    def token(self) -> str:
        """The service token (issued here, and renewed, when none is configured)."""
        return self._service_token.get()

    def info(self, model: str, version: int = 0) -> ModelVersion:
        """The registry's record of ``model`` ``version`` (0 = the latest)."""
        client = ModelsClient(self.address(), self.token(), tls=self._settings.tls)
        try:
            return client.get_model(model, version)
        finally:
            client.close()

    def fetch(self, model: str, version: int) -> Fetched:
        """The version's record and bytes (from the verified cache, else downloaded)."""
        client = ModelsClient(self.address(), self.token(), tls=self._settings.tls)
        try:
            info = client.get_model(model, version)
            path = self.cache_dir / model / str(info.version)
            if path.is_file():
                data = path.read_bytes()
                if hashlib.sha256(data).hexdigest() == info.digest.removeprefix("sha256:"):
                    return Fetched(info, data)
                _log.warning("cached model changed on disk; downloading again", path=str(path))
            path.parent.mkdir(parents=True, exist_ok=True)
            info = client.download_model(model, path, version=info.version)
            return Fetched(info, path.read_bytes())
        finally:
            client.close()


__all__ = ["SERVICE_NAME", "Fetched", "RegistryLink"]
