"""``gantry-scheduler`` / ``python -m gantry.scheduler``: serve, or migrate the database."""

from __future__ import annotations

import sys

from gantry.core.entrypoint import service_main
from gantry.scheduler.settings import SchedulerSettings


def main(argv: list[str] | None = None) -> int:
    """Entry point. ``serve`` (default) runs the service; ``migrate`` only updates the schema."""
    return service_main(
        "scheduler",
        SchedulerSettings,
        app="gantry.scheduler.app",
        store="gantry.scheduler.store",
        argv=argv,
        doc=__doc__,
    )


if __name__ == "__main__":
    sys.exit(main())
