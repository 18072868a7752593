"""Key rings in a Kubernetes Secret: read/written through the API, or read from a mount.

Secret layout (each data key is also a file name when the Secret is mounted as a volume)::

    kek-v1, kek-v2, ...   the KEK of each version that is not retired: 32 raw bytes
                          (64 hex chars or base64 text are accepted too, for hand-made Secrets)
    active                the active version number, e.g. "2"
    ring.json             states, creation times and wrap counts (no key material)

A Secret holding only ``kek-vN`` files (and optionally ``active``) is a valid hand-made ring:
the highest version (or ``active``) is active, the others decrypt-only.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gantry.core import ConfigError
from gantry.storage.errors import BackendUnavailable, KeyRingChanged, ReadOnlyKeySource
from gantry.storage.keyring import KEK_LEN, KeyRecord, KeyRingState, KeySource

_KEK_FILE = re.compile(r"kek-v([1-9][0-9]{0,8})")
RING_FILE = "ring.json"
ACTIVE_FILE = "active"


def _decode_key(raw: bytes, where: str) -> bytes:
    if len(raw) == KEK_LEN:
        return raw
    text = raw.strip()
    try:
        key = bytes.fromhex(text.decode()) if len(text) == 2 * KEK_LEN else base64.b64decode(text)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        key = b""
    if len(key) != KEK_LEN:
        raise ConfigError(
            f"{where} is not a {KEK_LEN}-byte key (raw, hex or base64)",
            hint="create it with: openssl rand 32 > kek-vN",
        )
    return key


def ring_from_files(
    files: Mapping[str, bytes], *, where: str, revision: str | None = None
) -> KeyRingState | None:
    """Parse the Secret layout above; ``None`` when it holds no ring at all."""
    keys = {}
    for name, content in files.items():
        match = _KEK_FILE.fullmatch(name)
        if match:
            keys[int(match.group(1))] = _decode_key(content, f"{where}: {name}")
    active: int | None = None
    if ACTIVE_FILE in files:
        try:
            active = int(files[ACTIVE_FILE].strip())
        except ValueError:
            raise ConfigError(f"{where}: 'active' is not a version number", hint="fix it") from None
    if RING_FILE in files:
        try:
            doc: Any = json.loads(files[RING_FILE])
        except ValueError:
            doc = None
        ring = KeyRingState.from_document(doc, where=where, keys=keys, revision=revision)
        if active is not None and active != ring.active.version:
            raise ConfigError(
                f"{where}: 'active' says version {active} but ring.json says {ring.active.version}",
                hint="restore the Secret from backup; never edit one half of it",
            )
        return ring
    if not keys:
        return None
    active = active if active is not None else max(keys)
    if active not in keys:
        raise ConfigError(f"{where}: active version {active} has no kek-v{active}", hint="add it")
    records = tuple(
        KeyRecord(v, "active" if v == active else "decrypt-only", 0, 0, keys[v])
        for v in sorted(keys)
    )
    return KeyRingState(records, revision)


def ring_to_files(state: KeyRingState) -> dict[str, bytes]:
    """The Secret layout above for ``state``."""
    files = {f"kek-v{r.version}": r.key for r in state.records if r.key is not None}
    files[ACTIVE_FILE] = str(state.active.version).encode()
    files[RING_FILE] = json.dumps(state.to_document(include_keys=False), indent=1).encode()
    return files


class MountedSecretKeys(KeySource):
    """A key ring read from a Secret mounted as a volume (read-only).

    Re-read on every load, so a kubelet update of the volume (after a rotation elsewhere)
    is picked up by :meth:`KeyManager.refresh`. Wrap counts cannot be persisted here.
    """

    read_only = True

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)

    def describe(self) -> str:
        """``mounted Secret <dir>``."""
        return f"mounted Secret {self.directory}"

    def load(self) -> KeyRingState | None:
        """The ring in the mounted files; a missing directory is a configuration error."""
        if not self.directory.is_dir():
            raise ConfigError(
                f"no key ring is mounted at {self.directory}",
                hint="mount the key-ring Secret there (volumes: secret: secretName: ...) or "
                "set keys.mounted_dir",
            )
        files = {
            p.name: p.read_bytes()
            for p in self.directory.iterdir()
            if not p.name.startswith(".") and p.is_file()
        }
        return ring_from_files(files, where=self.describe())

    def save(self, state: KeyRingState) -> KeyRingState:
        """Always refuses: a mounted Secret is read-only."""
        raise ReadOnlyKeySource(self.describe(), "save the key ring")


class KubernetesSecretKeys(KeySource):
    """A key ring kept in a Kubernetes Secret, read and written through the API.

    Saves are conditional on the Secret's ``resourceVersion``, so concurrent writers never
    lose each other's changes. The service account needs get, create and update on the
    Secret. Without ``api_client`` the in-cluster config is used, else ``~/.kube/config``.
    """

    read_only = False

    def __init__(self, namespace: str, name: str, *, api_client: Any | None = None) -> None:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        self._failures: tuple[type[Exception], ...] = (ApiException, HTTPError, OSError)
        self.namespace = namespace
        self.name = name
        self._client = client
        self._api = client.CoreV1Api(api_client if api_client is not None else _api_client())

    @classmethod
    def from_mounted(cls, directory: Path) -> MountedSecretKeys:
        """A read-only source over the same Secret mounted as a volume at ``directory``."""
        return MountedSecretKeys(directory)

    def describe(self) -> str:
        """``Kubernetes Secret <namespace>/<name>``."""
        return f"Kubernetes Secret {self.namespace}/{self.name}"

    def load(self) -> KeyRingState | None:
        """The ring in the Secret, or ``None`` when the Secret does not exist."""
        try:
            secret = self._api.read_namespaced_secret(self.name, self.namespace)
        except self._failures as exc:
            if getattr(exc, "status", None) == 404:
                return None
            raise self._error(exc, "read") from None
        files = {k: base64.b64decode(v) for k, v in (secret.data or {}).items()}
        return ring_from_files(files, where=self.describe(), revision=_resource_version(secret))

    def save(self, state: KeyRingState) -> KeyRingState:
        """Create or replace the Secret, conditional on ``state.revision``."""
        c = self._client
        body = c.V1Secret(
            api_version="v1",
            kind="Secret",
            type="Opaque",
            metadata=c.V1ObjectMeta(
                name=self.name,
                namespace=self.namespace,
                resource_version=state.revision,
                labels={"app.kubernetes.io/managed-by": "gantry"},
            ),
            data={k: base64.b64encode(v).decode() for k, v in ring_to_files(state).items()},
        )
        try:
            if state.revision is None:
                saved = self._api.create_namespaced_secret(self.namespace, body)
            else:
                saved = self._api.replace_namespaced_secret(self.name, self.namespace, body)
        except self._failures as exc:
            if getattr(exc, "status", None) in (404, 409):
                raise KeyRingChanged(self.describe()) from None
            raise self._error(exc, "write") from None
        return KeyRingState(state.records, _resource_version(saved))

    def _error(self, exc: Exception, action: str) -> Exception:
        status = getattr(exc, "status", None)
        if status in (401, 403):
            return ConfigError(
                f"the Kubernetes API refused to {action} {self.describe()} (HTTP {status})",
                hint="grant this service account get, create and update on that Secret",
            )
        reason = getattr(exc, "reason", None) or exc
        return BackendUnavailable(self.describe(), f"cannot {action} it: {reason}")


def _resource_version(secret: Any) -> str | None:
    metadata = secret.metadata
    return None if metadata is None else metadata.resource_version


def _api_client() -> Any:
    from kubernetes import client
    from kubernetes import config as kube_config

    config: Any = kube_config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        try:
            config.load_kube_config()
        except Exception as exc:
            raise ConfigError(
                f"cannot configure the Kubernetes client: {exc}",
                hint="run inside a pod with a service account, or provide ~/.kube/config",
            ) from None
    return client.ApiClient()


__all__ = ["KubernetesSecretKeys", "MountedSecretKeys", "ring_from_files", "ring_to_files"]
