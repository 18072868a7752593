"""What every service process does at its entry point: settings once, logging, serve or migrate.

``python -m gantry.<service>`` runs :func:`service_main`: it loads the service's settings (the
one place they are read), configures JSON logging, then either serves until SIGTERM/SIGINT
(:func:`run_until_signalled`) or only migrates the database. A Gantry error is printed as one
line with its hint (exit 2), never as a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from gantry.core.errors import GantryError
from gantry.core.logging import configure_logging
from gantry.core.settings import CommonSettings, load_settings

S = TypeVar("S", bound=CommonSettings)


class Stoppable(Protocol):
    """A service object: ``run()`` serves until ``stop()`` is called."""

    def run(self) -> Awaitable[None]:
        """Serve until stopped."""
        ...

    def stop(self) -> None:
        """Begin a graceful shutdown."""
        ...


async def run_until_signalled(service: Stoppable) -> None:
    """Run ``service`` until SIGTERM or SIGINT asks it to stop."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, service.stop)
    await service.run()


def service_main(
    name: str,
    settings_cls: type[S],
    *,
    app: str,
    store: str,
    argv: list[str] | None = None,
    doc: str | None = None,
) -> int:
    """Entry point of service ``name``: ``serve`` (default) or ``migrate``.

    ``app`` names the module with ``async def serve(settings)``, ``store`` the one with
    ``connect(url)`` and ``migrate(engine)``; both are imported only when needed.
    """
    parser = argparse.ArgumentParser(prog=f"gantry-{name}", description=doc)
    parser.add_argument("command", nargs="?", default="serve", choices=["serve", "migrate"])
    args = parser.parse_args(argv)
    try:
        settings = load_settings(settings_cls)
        configure_logging(name, level=settings.log_level, json=settings.log_json)
        if args.command == "serve":
            serve: Callable[[S], Awaitable[None]] = importlib.import_module(app).serve
            asyncio.run(serve(settings))  # type: ignore[arg-type]
            return 0
        module: Any = importlib.import_module(store)
        module.migrate(module.connect(getattr(settings, "database_url")))  # noqa: B009
        return 0
    except GantryError as exc:
        print(f"gantry-{name}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


__all__ = ["Stoppable", "run_until_signalled", "service_main"]
