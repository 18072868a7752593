"""Per-dataset de-identification secrets (adapter): generated once, kept in the object store.

Each dataset has a hash key and a token key (32 random bytes each), made when it is created and
stored as the object ``datasets/<dataset>/secrets``, so they are encrypted at rest, re-wrapped
by key rotation and backed up with everything else. They are never logged, returned or rotated:
rotating them would change every hash, token and subject-index digest of the dataset.
"""

from __future__ import annotations

import base64
import secrets
import threading

import orjson

from gantry.governance.deid import DeidKeys
from gantry.storage import ObjectNotFound, ObjectStore


class DatasetKeys:
    """The datasets' :class:`DeidKeys`, loaded (or created) on first use and kept in memory."""

    def __init__(self, objects: ObjectStore) -> None:
        self.objects = objects
        self._keys: dict[str, DeidKeys] = {}
        self._lock = threading.Lock()

    def get(self, dataset: str) -> DeidKeys:
        """The dataset's keys, created on first use."""
        with self._lock:
            keys = self._keys.get(dataset)
            if keys is not None:
                return keys
            name = f"datasets/{dataset}/secrets"
            try:
                doc = orjson.loads(self.objects.get(name))
            except ObjectNotFound:
                doc = {
                    "hash_key": base64.b64encode(secrets.token_bytes(32)).decode(),
                    "token_key": base64.b64encode(secrets.token_bytes(32)).decode(),
                }
                self.objects.put(name, orjson.dumps(doc), metadata={"kind": "dataset-secrets"})
            keys = DeidKeys(base64.b64decode(doc["hash_key"]), base64.b64decode(doc["token_key"]))
            self._keys[dataset] = keys
            return keys


__all__ = ["DatasetKeys"]
