"""Table locks (migration 0014): a tenant role cannot stop another tenant's work, and a foreign
lock is a `Conflict` after a bounded wait, never a hang.

Row-level security does not stop `LOCK TABLE`. A role granted one tenant held table-level
UPDATE and DELETE on tables every tenant shares, so it could lock `session_claims` or
`sessions` exclusively and make every other tenant's worker, `open()` and `add()` wait for as
long as it liked. Here a real granted role tries every lock mode on every relation it holds
any privilege on; while it holds each lock it got, another tenant opens a session, appends,
is compressed by a worker, reads and deletes, within a bound.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

import autoctx
from autoctx import AutoContextMemory, Conflict, OfflineSummarizer
from autoctx._worker import AutoContextWorker, Compressed
from tests.histories import SMALL, multi_round
from tests.test_tenants import Role, login_role

LOCK_MODES = (
    "ACCESS SHARE",
    "ROW SHARE",
    "ROW EXCLUSIVE",
    "SHARE UPDATE EXCLUSIVE",
    "SHARE",
    "SHARE ROW EXCLUSIVE",
    "EXCLUSIVE",
    "ACCESS EXCLUSIVE",
)
#: What a role's own reads and inserts take anyway; they conflict only with DDL.
HARMLESS = {"ACCESS SHARE", "ROW EXCLUSIVE"}
#: Seconds the other tenant's work may take while a lock is held (it takes well under one
#: when nothing blocks it; a blocked call would wait for the lock, or for lock_timeout twice).
BOUND_S = 8.0


@pytest.fixture(scope="module")
def acme(db_url: str) -> Iterator[Role]:
    with login_role(db_url) as role:
        assert autoctx.grant_tenant(role.name, "acme", db_url) is True
        yield role


def _relations(db_url: str, role: str) -> list[str]:
    """Every table and view of autoctx's schema the role holds any privilege on."""
    engine = sa.create_engine(db_url, poolclass=sa.NullPool)
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT c.relname FROM pg_class c "
                "WHERE c.relnamespace = (SELECT relnamespace FROM pg_class "
                "                        WHERE oid = 'sessions'::regclass) "
                "  AND c.relkind IN ('r', 'p', 'v', 'm') "
                "  AND (has_table_privilege(:r, c.oid, "
                "           'SELECT, INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER') "
                "       OR has_any_column_privilege(:r, c.oid, 'SELECT, INSERT, UPDATE')) "
                "ORDER BY c.relname"
            ),
            {"r": role},
        ).scalars()
        names = list(rows)
    engine.dispose()
    return names


def _other_tenants_work(db_url: str, tag: str) -> None:
    """What the issue saw blocked: open, add, a worker's compression, a read, a delete."""
    sid = f"lk-{tag}-{uuid.uuid4().hex[:6]}"
    mem = AutoContextMemory.open(
        sid, db_url, SMALL, tenant="globex", summarizer=OfflineSummarizer()
    )
    try:
        mem.add(multi_round(5, rounds=4, steps=8))
        assert mem.needs_compression()
        done: list[Compressed] = []
        with AutoContextWorker(
            db_url, summarizer=OfflineSummarizer(), tenant="globex", on_compressed=done.append
        ) as worker:
            worker.run(once=True)
        assert sid in {d.session_id for d in done}
        assert mem.messages()
    finally:
        mem.delete()
        mem.close()


def test_a_tenant_role_holding_any_table_lock_it_can_take_blocks_no_other_tenant(
    db_url: str, acme: Role
) -> None:
    relations = _relations(db_url, acme.name)
    assert {"sessions", "session_claims", "working_set", "messages"} <= set(relations)
    _other_tenants_work(db_url, "warm")  # the pools and the worker's first open, unlocked
    role = sa.create_engine(acme.url, poolclass=sa.NullPool)
    taken: dict[str, list[str]] = {}
    slow: list[str] = []
    for relation in relations:
        for mode in LOCK_MODES:
            with role.connect() as conn:
                conn.begin()
                conn.execute(sa.text("SELECT set_config('autoctx.tenant', 'acme', true)"))
                try:
                    conn.execute(sa.text(f"LOCK TABLE {relation} IN {mode} MODE NOWAIT"))
                except sa.exc.ProgrammingError as exc:
                    assert "permission denied" in str(exc.orig), (relation, mode)
                    conn.rollback()
                    continue
                taken.setdefault(relation, []).append(mode)
                # The lock is held: the other tenant's work must go through within the bound.
                errors: list[BaseException] = []

                def work(
                    tag: str = f"{relation[:8]}-{mode[:3]}", errors: list[BaseException] = errors
                ) -> None:
                    try:
                        _other_tenants_work(db_url, tag)
                    except BaseException as exc:  # reported below, with the lock named
                        errors.append(exc)

                thread = threading.Thread(target=work)
                started = time.monotonic()
                thread.start()
                thread.join(BOUND_S)
                if thread.is_alive() or errors:
                    slow.append(f"{mode} on {relation}: {errors or 'still waiting'}")
                conn.rollback()  # lets a blocked thread go on
                thread.join(60)
                assert time.monotonic() - started < 60 + BOUND_S
    role.dispose()
    assert not slow, slow
    # What it could take are the modes its own reads and inserts take anyway.
    assert {m for modes in taken.values() for m in modes} <= HARMLESS, taken


def test_a_foreign_lock_is_a_conflict_after_a_bounded_wait(db_url: str) -> None:
    """autoctx's connections carry a lock_timeout (here shortened through the URL's options,
    which come after autoctx's own): a call that meets a lock another connection holds is
    tried again, then raises `Conflict`, and writes nothing; once the lock is gone it works."""
    url = (
        make_url(db_url)
        .update_query_dict({"options": "-c lock_timeout=300"})
        .render_as_string(hide_password=False)
    )
    sid = f"lk-timeout-{uuid.uuid4().hex[:6]}"
    mem = AutoContextMemory.open(sid, url, SMALL, summarizer=OfflineSummarizer())
    mem.add({"role": "user", "content": "first"})
    owner = sa.create_engine(db_url, poolclass=sa.NullPool)
    with owner.connect() as conn:
        conn.begin()
        conn.execute(sa.text("LOCK TABLE sessions IN ACCESS EXCLUSIVE MODE"))
        started = time.monotonic()
        with pytest.raises(Conflict, match="lock_timeout") as info:
            mem.add({"role": "user", "content": "second"})
        waited = time.monotonic() - started
        conn.rollback()
    owner.dispose()
    assert sid in str(info.value) and "second" not in str(info.value)
    # Tried twice, each wait cut at 0.3 s: neither a hang nor an error at the first wait.
    assert 0.6 <= waited < 5.0, waited
    assert [m.text for m in mem.messages()] == ["first"]
    mem.add({"role": "user", "content": "second"})
    assert [m.text for m in mem.messages()] == ["first", "second"]
    mem.close()
