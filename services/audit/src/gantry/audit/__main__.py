"""``gantry-audit`` / ``python -m gantry.audit``: serve, verify offline, or migrate."""

from __future__ import annotations

import argparse
import asyncio
import sys

from gantry.audit.settings import AuditSettings
from gantry.core import GantryError, configure_logging, load_settings


def main(argv: list[str] | None = None) -> int:
    """Entry point. ``serve`` (default) runs the service; ``verify`` checks the log offline."""
    parser = argparse.ArgumentParser(prog="gantry-audit", description=__doc__)
    parser.add_argument(
        "command", nargs="?", default="serve", choices=["serve", "verify", "migrate"]
    )
    args = parser.parse_args(argv)
    try:
        settings = load_settings(AuditSettings)
        configure_logging("audit", level=settings.log_level, json=settings.log_json)
        if args.command == "serve":
            from gantry.audit.app import serve

            asyncio.run(serve(settings))
            return 0
        from gantry.audit.app import AuditService
        from gantry.audit.store import migrate

        service = AuditService(settings)
        migrate(service.engine)
        if args.command == "migrate":
            return 0
        report = service.ledger.verify(service.trust)
        for p in report.problems:
            print(f"index {p.index}: {p.kind}: {p.detail}")
        print(
            f"{'OK' if report.ok else 'FAILED'}: {report.events_checked} events, "
            f"{report.checkpoints_checked} signed checkpoints checked"
        )
        return 0 if report.ok else 1
    except GantryError as exc:
        print(f"gantry-audit: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
