"""``gantry-console`` / ``python -m gantry.console``: serve the web console."""

from __future__ import annotations

import argparse
import asyncio
import sys

from gantry.core.errors import GantryError
from gantry.core.logging import configure_logging
from gantry.core.settings import load_settings


def main(argv: list[str] | None = None) -> int:
    """Entry point: serve until SIGTERM/SIGINT (the console keeps no database to migrate)."""
    parser = argparse.ArgumentParser(prog="gantry-console", description=__doc__)
    parser.add_argument("command", nargs="?", default="serve", choices=["serve"])
    parser.parse_args(argv)
    try:
        from gantry.console.app import serve
        from gantry.console.settings import ConsoleSettings

        settings = load_settings(ConsoleSettings)
        configure_logging("console", level=settings.log_level, json=settings.log_json)
        asyncio.run(serve(settings))
        return 0
    except GantryError as exc:
        print(f"gantry-console: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
