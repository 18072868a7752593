"""Service databases: one engine per URL (SQLite by default, PostgreSQL on clusters), migrations.

Every service keeps its own database and brings its schema up to date at start-up with
:func:`migrate`, a list of numbered steps recorded in a one-column version table.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import sqlalchemy as sa

from gantry.core.errors import ConfigError
from gantry.core.logging import get_logger

_log = get_logger("gantry.core.database")

Migration = Callable[[sa.Connection], None]


def connect_database(url: str, *, example: str = "service.db") -> sa.Engine:
    """An engine for ``url``; SQLite gets WAL and full fsync so a committed change is durable.

    ``example`` names the file in the hint shown when the URL is malformed.
    """
    try:
        # pre-ping guards against server-side disconnects; a SQLite file has none to guard
        engine = sa.create_engine(url, pool_pre_ping=not url.startswith("sqlite"))
    except (sa.exc.ArgumentError, ImportError) as exc:
        raise ConfigError(
            f"bad database URL {url!r}: {exc}",
            hint=f"use sqlite:///path/{example} or postgresql+psycopg://user@host/db",
        ) from None
    if engine.dialect.name == "sqlite":

        @sa.event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=FULL")
            cur.execute("PRAGMA busy_timeout=10000")
            cur.close()

    return engine


def migrate_schema(
    engine: sa.Engine, version_table: sa.Table, migrations: Mapping[int, Migration]
) -> int:
    """Run the steps of ``migrations`` (1, 2, ...) not yet recorded; return the version before.

    ``version_table`` has one integer column ``version``; each step and its record commit
    together, so a crash leaves the schema at a whole step.
    """
    target = max(migrations, default=0)
    with engine.begin() as conn:
        before = 0
        if sa.inspect(conn).has_table(version_table.name):
            before = conn.execute(sa.select(sa.func.max(version_table.c.version))).scalar() or 0
        for version in range(before + 1, target + 1):
            migrations[version](conn)
            conn.execute(version_table.insert().values(version=version))
            _log.info("schema migrated", table=version_table.name, version=version)
    return int(before)


def add_column(conn: sa.Connection, column: sa.Column[Any]) -> None:
    """``ALTER TABLE ... ADD COLUMN`` unless the column is there already.

    A schema's first migration step creates today's tables, so on a new database a later step
    finds its column made.
    """
    table = column.table
    if column.name in {c["name"] for c in sa.inspect(conn).get_columns(table.name)}:
        return
    ddl = sa.schema.CreateColumn(column).compile(dialect=conn.dialect)
    name = conn.dialect.identifier_preparer.format_table(table)
    conn.execute(sa.text(f"ALTER TABLE {name} ADD COLUMN {ddl}"))


__all__ = ["Migration", "add_column", "connect_database", "migrate_schema"]
