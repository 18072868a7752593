"""Structured logging: structlog, JSON lines on stderr, configured once per process."""

from __future__ import annotations

import logging as _stdlib_logging
import sys
from typing import Any

import structlog

_configured = False


def configure_logging(service: str, *, level: str = "INFO", json: bool = True) -> None:
    """Set up structlog for this process; later calls are ignored.

    Every line carries ``service``, ``level``, ``timestamp`` (ISO 8601 UTC) and ``event``.
    ``json=False`` renders for humans (the CLI uses it).
    """
    global _configured
    if _configured:
        return
    numeric = _stdlib_logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        numeric = _stdlib_logging.INFO
    renderer: Any = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    structlog.contextvars.bind_contextvars(service=service)
    _stdlib_logging.basicConfig(level=max(numeric, _stdlib_logging.WARNING), stream=sys.stderr)
    _configured = True


def get_logger(name: str | None = None) -> Any:
    """A structlog logger; ``name`` becomes the ``component`` field."""
    # lazy: the logger is built at first use, after configure_logging ran in main()
    return structlog.get_logger(component=name) if name else structlog.get_logger()


__all__ = ["configure_logging", "get_logger"]
