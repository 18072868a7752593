"""The inbox makes a redelivered event a no-op, inside the handler's own transaction."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from gantry.events import Inbox, inbox_table


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'i.db'}"
    return str(request.getfixturevalue("postgres_url"))


def test_claim_once_per_consumer_and_rolled_back_with_the_change(db_url: str) -> None:
    engine = sa.create_engine(db_url)
    md = sa.MetaData()
    table = inbox_table(md)
    counter = sa.Table("counter", md, sa.Column("n", sa.Integer, nullable=False))
    md.create_all(engine)
    with engine.begin() as conn:
        conn.execute(counter.insert().values(n=0))
    inbox = Inbox(table, "billing")

    def handle(event_id: str, fail: bool = False) -> None:
        with engine.begin() as conn:
            if inbox.claim(conn, event_id):
                conn.execute(counter.update().values(n=counter.c.n + 1))
            if fail:
                raise RuntimeError("crash after the change, before commit")

    handle("e1")
    handle("e1")  # redelivery: skipped
    with pytest.raises(RuntimeError):
        handle("e2", fail=True)  # rolled back: the claim too
    handle("e2")  # so the retry applies it once
    with engine.begin() as conn:  # another consumer has its own inbox
        assert Inbox(table, "other").claim(conn, "e1")
    with engine.connect() as conn:
        assert conn.execute(sa.select(counter.c.n)).scalar() == 2
        rows = conn.execute(sa.select(table.c.consumer, table.c.event_id)).all()
    assert sorted(rows) == [("billing", "e1"), ("billing", "e2"), ("other", "e1")]
    engine.dispose()
