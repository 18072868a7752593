"""Find a PostgreSQL server for tests, and give each test its own empty database."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

DEFAULT_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


def admin_url() -> str:
    """The server to use: ``GANTRY_TEST_POSTGRES_URL`` or the local default (trust auth)."""
    return os.environ.get("GANTRY_TEST_POSTGRES_URL", DEFAULT_ADMIN_URL)


def reachable(host: str = "127.0.0.1", port: int = 5432) -> bool:
    """True when something accepts TCP connections at host:port."""
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


@contextmanager
def temporary_database(url: str | None = None) -> Iterator[str]:
    """Create an empty database, yield its SQLAlchemy URL, drop it afterwards."""
    import sqlalchemy as sa

    base = sa.make_url(url or admin_url())
    name = f"gantry_test_{uuid.uuid4().hex[:12]}"
    engine = sa.create_engine(base, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
        yield base.set(database=name).render_as_string(hide_password=False)
    finally:
        with engine.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        engine.dispose()


__all__ = ["DEFAULT_ADMIN_URL", "admin_url", "reachable", "temporary_database"]
