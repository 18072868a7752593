"""``gantry-scheduler`` / ``python -m gantry.scheduler``: serve, or migrate the database."""

from __future__ import annotations

import argparse
import asyncio
import sys

from gantry.core import GantryError, configure_logging, load_settings
from gantry.scheduler.settings import SchedulerSettings


def main(argv: list[str] | None = None) -> int:
    """Entry point. ``serve`` (default) runs the service; ``migrate`` only updates the schema."""
    parser = argparse.ArgumentParser(prog="gantry-scheduler", description=__doc__)
    parser.add_argument("command", nargs="?", default="serve", choices=["serve", "migrate"])
    args = parser.parse_args(argv)
    try:
        settings = load_settings(SchedulerSettings)
        configure_logging("scheduler", level=settings.log_level, json=settings.log_json)
        if args.command == "serve":
            from gantry.scheduler.app import serve

            asyncio.run(serve(settings))
            return 0
        from gantry.scheduler.store import connect, migrate

        migrate(connect(settings.database_url))
        return 0
    except GantryError as exc:
        print(f"gantry-scheduler: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
