"""gantry.client: the Gantry Python SDK (audit, data governance, models, events, admin) and CLI.

::

    from gantry.client import AuditClient, Filter, GovernanceClient
    from gantry.client.emit import emit

The ``gantry`` command line lives in :mod:`gantry.client.cli`, the demo in
:mod:`gantry.client.demo`. Names are imported on first use, so that an entry point can set up
logging before the event library's loggers are created.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gantry.client.audit import AuditClient, Filter
    from gantry.client.config import ClientSettings
    from gantry.client.emit import Emitter
    from gantry.client.governance import ColumnRule, ColumnSpec, DataClient, GovernanceClient
    from gantry.client.model_registry import ModelsClient

_LAZY = {
    "AuditClient": "gantry.client.audit",
    "Filter": "gantry.client.audit",
    "ClientSettings": "gantry.client.config",
    "Emitter": "gantry.client.emit",
    "ColumnRule": "gantry.client.governance",
    "ColumnSpec": "gantry.client.governance",
    "DataClient": "gantry.client.governance",
    "GovernanceClient": "gantry.client.governance",
    "ModelsClient": "gantry.client.model_registry",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'gantry.client' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "AuditClient",
    "ClientSettings",
    "ColumnRule",
    "ColumnSpec",
    "DataClient",
    "Emitter",
    "Filter",
    "GovernanceClient",
    "ModelsClient",
]
