"""``gantry-workflows`` / ``python -m gantry.workflows``: serve, or migrate the database."""

from __future__ import annotations

import sys

from gantry.core.entrypoint import service_main
from gantry.workflows.settings import WorkflowSettings


def main(argv: list[str] | None = None) -> int:
    """Entry point. ``serve`` (default) runs the service; ``migrate`` only updates the schema."""
    return service_main(
        "workflows",
        WorkflowSettings,
        app="gantry.workflows.app",
        store="gantry.workflows.store",
        argv=argv,
        doc=__doc__,
    )


if __name__ == "__main__":
    sys.exit(main())
