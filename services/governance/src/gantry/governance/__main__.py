"""``gantry-governance`` / ``python -m gantry.governance``: serve, or migrate the database."""

from __future__ import annotations

import sys

from gantry.core.entrypoint import service_main
from gantry.governance.settings import GovernanceSettings


def main(argv: list[str] | None = None) -> int:
    """Entry point. ``serve`` (default) runs the service; ``migrate`` only updates the schema."""
    return service_main(
        "governance",
        GovernanceSettings,
        app="gantry.governance.app",
        store="gantry.governance.store",
        argv=argv,
        doc=__doc__,
    )


if __name__ == "__main__":
    sys.exit(main())
