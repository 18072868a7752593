"""``gantry-serving`` / ``python -m gantry.serving``: serve, or migrate the database."""

from __future__ import annotations

import sys

from gantry.core.entrypoint import service_main
from gantry.serving.settings import ServingSettings


def main(argv: list[str] | None = None) -> int:
    """Entry point. ``serve`` (default) runs the service; ``migrate`` only updates the schema."""
    return service_main(
        "serving",
        ServingSettings,
        app="gantry.serving.app",
        store="gantry.serving.store",
        argv=argv,
        doc=__doc__,
    )


if __name__ == "__main__":
    sys.exit(main())
