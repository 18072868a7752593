"""``gantry-profiler`` / ``python -m gantry.profiler``: serve, or migrate the database."""

from __future__ import annotations

import sys

from gantry.core.entrypoint import service_main
from gantry.profiler.settings import ProfilerSettings


def main(argv: list[str] | None = None) -> int:
    """Entry point. ``serve`` (default) runs the service; ``migrate`` only updates the schema."""
    return service_main(
        "profiler",
        ProfilerSettings,
        app="gantry.profiler.app",
        store="gantry.profiler.store",
        argv=argv,
        doc=__doc__,
    )


if __name__ == "__main__":
    sys.exit(main())
