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
        import sqlalchemy as sa

        from gantry.audit.ledger import Ledger
        from gantry.audit.store import Store, connect, migrate
        from gantry.core import ConfigError
        from gantry.security.keyring import Keyring
        from gantry.storage import open_store

        engine = connect(settings.database_url)
        if args.command == "migrate":
            migrate(engine)
            return 0
        keyring = Keyring(settings.keys_dir)
        if not keyring.has_secret("audit-seal"):
            raise ConfigError(
                f"no audit seal key under {settings.keys_dir}: this is not an audit data directory",
                hint="set GANTRY_DATA_DIR to the directory the audit service runs with",
            )
        store = Store(engine)
        if not sa.inspect(engine).has_table("audit_events") or (
            store.size() == 0 and store.checkpoint() is None
        ):
            raise ConfigError(
                f"the audit log at {settings.database_url} is empty or missing",
                hint="check GANTRY_DATA_DIR / GANTRY_AUDIT__DATABASE_URL",
            )
        ledger = Ledger(
            store,
            seal_key=keyring.secret("audit-seal"),
            signer=keyring.service_key("audit"),
            objects=open_store(settings.storage, data_dir=settings.data_dir),
        )
        report = ledger.verify(keyring.tree_head_trust())
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
