"""Pooled connections: checked before use when idle, taken as is when just used.

autoctx pings a pooled connection only when it has been idle longer than
`PING_AFTER_IDLE_S` (SQLAlchemy's `pool_pre_ping` pays a round trip on every checkout). These
tests kill the server side of a pooled connection with `pg_terminate_backend` and check both
sides of that trade: past the idle window the next call reconnects without an error; inside it
one call fails with the database's error and the next one works, with nothing lost either way.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from autoctx import AutoContextClient, AutoContextMemory, Msg, OfflineSummarizer
from autoctx._store import database
from tests.invariants import assert_totals_match


@pytest.fixture
def mem(client: AutoContextClient, session_id: str) -> AutoContextMemory:
    # The test's own client: a pool of its own, closed when the test ends.
    memory = client.open(session_id, summarizer=OfflineSummarizer())
    memory.add(Msg.user("first"))
    return memory


def _kill_pooled_backend(mem: AutoContextMemory, db_url: str) -> None:
    """Terminate the server process of the memory's pooled connection (the pool holds one:
    every call so far ran on it, one at a time)."""
    with mem.engine.connect() as conn:
        pid = conn.exec_driver_sql("select pg_backend_pid()").scalar_one()
    admin = sa.create_engine(db_url, poolclass=sa.NullPool)
    try:
        with admin.connect() as conn:
            killed = conn.execute(
                sa.text("select pg_terminate_backend(:pid)"), {"pid": pid}
            ).scalar_one()
    finally:
        admin.dispose()
    assert killed


def test_a_connection_killed_while_idle_is_replaced_without_an_error(
    mem: AutoContextMemory, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _kill_pooled_backend(mem, db_url)
    # Every checkout counts as idle: the ping finds the dead connection and the pool opens
    # another before the append runs.
    monkeypatch.setattr(database, "PING_AFTER_IDLE_S", -1.0)
    mem.add(Msg.user("second"))
    assert [m.text for m in mem.messages()] == ["first", "second"]
    assert_totals_match(mem)


def test_a_connection_killed_inside_the_idle_window_fails_one_call_then_recovers(
    mem: AutoContextMemory, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _kill_pooled_backend(mem, db_url)
    monkeypatch.setattr(database, "PING_AFTER_IDLE_S", 3600.0)
    with pytest.raises(sa.exc.OperationalError):
        mem.add(Msg.user("lost with its connection"))
    # The failed call wrote nothing (its server process was gone) and invalidated the pool:
    # the next call gets a fresh connection.
    mem.add(Msg.user("second"))
    assert [m.text for m in mem.messages()] == ["first", "second"]
    assert_totals_match(mem)


def test_a_database_error_carries_no_statement_parameters(db_url: str) -> None:
    """Parameters are message content; an error raised through autoctx's engine names the
    statement, never what was bound to it."""
    engine = database.create_engine(database.normalize_url(db_url), poolclass=sa.NullPool)
    secret = "SECRET-7f3a9 the user's password"
    with pytest.raises(sa.exc.DBAPIError) as info, engine.connect() as conn:
        conn.execute(sa.text("insert into no_such_table values (:v)"), {"v": secret})
    assert secret not in str(info.value) and "hidden" in str(info.value)
    engine.dispose()
