"""gantry.core: settings, logging, errors, ids and clocks shared by every Gantry package."""

from gantry.core.clock import Clock, ManualClock, SystemClock, utc
from gantry.core.errors import (
    AlreadyExists,
    ConfigError,
    Conflict,
    GantryError,
    IntegrityError,
    InvalidInput,
    NotFound,
    PermissionDenied,
    Unauthenticated,
    Unavailable,
)
from gantry.core.ids import is_uuid, new_id
from gantry.core.logging import configure_logging, get_logger
from gantry.core.settings import CommonSettings, NatsSettings, TlsSettings, load_settings

__all__ = [
    "AlreadyExists",
    "Clock",
    "CommonSettings",
    "ConfigError",
    "Conflict",
    "GantryError",
    "IntegrityError",
    "InvalidInput",
    "ManualClock",
    "NatsSettings",
    "NotFound",
    "PermissionDenied",
    "SystemClock",
    "TlsSettings",
    "Unauthenticated",
    "Unavailable",
    "configure_logging",
    "get_logger",
    "is_uuid",
    "load_settings",
    "new_id",
    "utc",
]
