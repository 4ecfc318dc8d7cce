"""Tenant isolation (SPEC.md sections 4 and 5; migration 0003).

Two layers: autoctx's own API never crosses sessions or tenants (another tenant's session or
offload answers exactly like an unknown one), and PostgreSQL's row-level security, keyed on the
transaction-local setting `autoctx.tenant`, keeps a non-owner role scoped to one tenant from
seeing or writing another tenant's rows even with hand-written SQL.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from autoctx import (
    AutoContextMemory,
    OfflineSummarizer,
    OffloadNotFound,
    SessionNotFound,
)
from autoctx.memory import dispose_engines
from autoctx.store.tables import SESSION_TABLES
from tests.dbsql import sql
from tests.histories import SMALL, multi_round
from tests.invariants import AUDIT_VIEWS, assert_consistent, assert_every_original_reachable

CONFIG = SMALL
TABLES = [t.name for t in SESSION_TABLES]


@dataclass
class World:
    """Sessions of two tenants and one without a tenant, all compressed (offloads, lineage)."""

    a: list[str]
    b: list[str]
    untenanted: str
    offload_of: dict[str, uuid.UUID]


def _compressed(db_url: str, sid: str, tenant: str | None, seed: int) -> uuid.UUID:
    mem = AutoContextMemory.open(sid, db_url, CONFIG, tenant=tenant, summarizer=OfflineSummarizer())
    mem.add(multi_round(seed, rounds=4, steps=8))
    events = [e for e in mem.compress_if_needed() if e.status == "applied"]
    assert events and events[0].offload_uuid is not None
    return events[0].offload_uuid


@pytest.fixture(scope="module")
def world(db_url: str) -> World:
    tag = uuid.uuid4().hex[:6]
    w = World(
        a=[f"ten-a1-{tag}", f"ten-a2-{tag}"],
        b=[f"ten-b1-{tag}"],
        untenanted=f"ten-none-{tag}",
        offload_of={},
    )
    for k, sid in enumerate(w.a):
        w.offload_of[sid] = _compressed(db_url, sid, "A", 40 + k)
    w.offload_of[w.b[0]] = _compressed(db_url, w.b[0], "B", 50)
    w.offload_of[w.untenanted] = _compressed(db_url, w.untenanted, None, 60)
    return w


@pytest.fixture(scope="module")
def tenant_role(db_url: str, world: World) -> Iterator[str]:
    """A LOGIN role that is not the tables' owner (so the policies apply to it), with the
    grants a tenant-serving deployment gives; yields its URL. Roles are cluster-wide: the name
    is unique and the role is dropped at the end."""
    role = f"autoctx_tenant_{uuid.uuid4().hex[:10]}"
    owner = sa.create_engine(db_url, poolclass=sa.NullPool)
    with owner.begin() as conn:
        conn.execute(sa.text(f"CREATE ROLE {role} LOGIN NOSUPERUSER NOBYPASSRLS"))
        conn.execute(
            sa.text(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {', '.join(TABLES)} TO {role}")
        )
        conn.execute(
            sa.text(f"GRANT SELECT ON alembic_version, {', '.join(AUDIT_VIEWS)} TO {role}")
        )
    url = make_url(db_url).set(username=role, password=None)
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        dispose_engines()
        with owner.begin() as conn:
            conn.execute(
                sa.text(
                    "select pg_terminate_backend(pid) from pg_stat_activity where usename = :r"
                ),
                {"r": role},
            )
            conn.execute(sa.text(f"DROP OWNED BY {role}"))
            conn.execute(sa.text(f"DROP ROLE {role}"))
        owner.dispose()


def _scoped(conn: sa.Connection, tenant: str | None) -> None:
    if tenant is not None:
        conn.execute(sa.text("select set_config('autoctx.tenant', :t, true)"), {"t": tenant})


def _sessions_in(conn: sa.Connection, table: str) -> set[str]:
    return {r[0] for r in conn.execute(sa.text(f"select distinct session_id from {table}"))}


# ---------------------------------------------------------------------------------------------
# autoctx's API (connected as the owner: the tenant filter is autoctx's own)
# ---------------------------------------------------------------------------------------------


def _unknown_like(message: str, sid: str, offload: uuid.UUID) -> str:
    return message.replace(str(offload), "<uuid>").replace(sid, "<sid>")


def test_another_tenants_offload_answers_like_an_unknown_one(db_url: str, world: World) -> None:
    mem = AutoContextMemory.open(world.a[0], db_url, CONFIG, tenant="A", create=False)
    foreign = world.offload_of[world.b[0]]
    same_tenant_other_session = world.offload_of[world.a[1]]
    unknown = uuid.uuid4()
    answers = []
    for offload in (
        foreign,
        same_tenant_other_session,
        world.offload_of[world.untenanted],
        unknown,
    ):
        with pytest.raises(OffloadNotFound) as info:
            mem.reload(str(offload))
        answers.append(_unknown_like(str(info.value), world.a[0], offload))
    assert len(set(answers)) == 1, answers
    tool_answers = {
        mem.handle_tool_call(
            {
                "id": "c",
                "type": "function",
                "function": {"name": "context_reload", "arguments": f'{{"uuid": "{o}"}}'},
            }
        ).replace(str(o), "<uuid>")
        for o in (foreign, same_tenant_other_session, unknown)
    }
    assert len(tool_answers) == 1, tool_answers
    # Its own offload reloads.
    assert mem.reload(str(world.offload_of[world.a[0]]))


def test_another_tenants_session_answers_like_an_unknown_one(db_url: str, world: World) -> None:
    messages = []
    for sid in (world.b[0], world.untenanted, f"never-created-{uuid.uuid4().hex[:6]}"):
        with pytest.raises(SessionNotFound) as info:
            AutoContextMemory.open(sid, db_url, CONFIG, tenant="A", create=False)
        messages.append(str(info.value).replace(sid, "<sid>"))
    assert len(set(messages)) == 1, messages
    # Ids are global: tenant A cannot take B's id either, and learns nothing of B's session.
    with pytest.raises(SessionNotFound):
        AutoContextMemory.open(world.b[0], db_url, CONFIG, tenant="A")
    owner_view = AutoContextMemory.open(world.b[0], db_url, CONFIG, tenant="B", create=False)
    assert owner_view.tenant == "B"


def test_events_and_lineage_stay_in_their_session(db_url: str, world: World) -> None:
    for sid in world.a + world.b:
        tenant = "A" if sid in world.a else "B"
        mem = AutoContextMemory.open(sid, db_url, CONFIG, tenant=tenant, create=False)
        events = mem.events()
        assert events and {e.session_id for e in events} == {sid}
        for e in events:
            if e.offload_uuid is not None:
                assert {m.id for m in mem.reload(str(e.offload_uuid))} == set(e.replaced_ids)
        lineage = sql(
            mem, "select distinct session_id from autoctx_lineage where session_id = :s", s=sid
        )
        assert [r.session_id for r in lineage] == [sid]


# ---------------------------------------------------------------------------------------------
# Row-level security (a non-owner role)
# ---------------------------------------------------------------------------------------------


def test_rls_is_enabled_on_every_session_table(db_url: str) -> None:
    engine = sa.create_engine(db_url, poolclass=sa.NullPool)
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "select c.relname, c.relrowsecurity, c.relforcerowsecurity, "
                "(select count(*) from pg_policy p where p.polrelid = c.oid) as policies "
                "from pg_class c where c.relname = any(:t) and c.relkind = 'r'"
            ),
            {"t": TABLES},
        ).all()
    engine.dispose()
    assert {r.relname for r in rows} == set(TABLES)
    for r in rows:
        # Enabled, not forced: the owner bypasses the policies (see migration 0003).
        assert (r.relrowsecurity, r.relforcerowsecurity, r.policies) == (True, False, 1), r


@pytest.mark.parametrize("tenant", ["A", "B", None])
def test_hand_written_sql_sees_only_its_tenant(
    db_url: str, world: World, tenant_role: str, tenant: str | None
) -> None:
    mine = {"A": set(world.a), "B": set(world.b), None: {world.untenanted}}[tenant]
    others = set(world.a + world.b + [world.untenanted]) - mine
    owner = sa.create_engine(db_url, poolclass=sa.NullPool)
    role = sa.create_engine(tenant_role, poolclass=sa.NullPool)
    same_tenant = "coalesce(s.tenant, '') = coalesce(:t, '')"
    try:
        with owner.connect() as conn:
            # What the role should see: the owner's view, filtered by tenant by hand.
            expected = {
                t: conn.execute(
                    sa.text(
                        f"select count(*) from {t} x "
                        f"join sessions s on s.session_id = x.session_id where {same_tenant}"
                    ),
                    {"t": tenant},
                ).scalar_one()
                for t in TABLES
            }
        with role.begin() as conn:
            _scoped(conn, tenant)
            for name in TABLES + list(AUDIT_VIEWS):
                seen = _sessions_in(conn, name)
                # (autoctx_problem_sessions lists only sessions with a failure: none here.)
                assert mine & seen or name == "autoctx_problem_sessions", (name, "its own rows")
                assert not others & seen, (name, sorted(others & seen))
            for table in TABLES:
                count = conn.execute(sa.text(f"select count(*) from {table}")).scalar_one()
                assert count == expected[table], table
    finally:
        owner.dispose()
        role.dispose()


def test_a_tenant_cannot_write_another_tenants_rows(
    db_url: str, world: World, tenant_role: str
) -> None:
    role = sa.create_engine(tenant_role, poolclass=sa.NullPool)
    b = world.b[0]
    owner = sa.create_engine(db_url, poolclass=sa.NullPool)

    def b_picture() -> tuple[Any, ...]:
        with owner.connect() as conn:
            return tuple(
                conn.execute(
                    sa.text(f"select count(*) from {t} where session_id = :s"), {"s": b}
                ).scalar_one()
                for t in TABLES
            ) + tuple(
                conn.execute(
                    sa.text("select tenant, version from sessions where session_id = :s"), {"s": b}
                ).one()
            )

    before = b_picture()
    try:
        with role.connect() as conn:
            for statement in (
                "update sessions set tenant = 'A' where session_id = :s",
                "update messages set content = '[]' where session_id = :s",
                "delete from working_set where session_id = :s",
                "delete from compression_events where session_id = :s",
                "delete from sessions where session_id = :s",
            ):
                with conn.begin():
                    _scoped(conn, "A")
                    assert conn.execute(sa.text(statement), {"s": b}).rowcount == 0, statement
            for statement in (
                # A row into B's session, and A's own session handed over to B.
                "insert into lineage (session_id, summary_id, ordinal, replaced_id, event_id) "
                "values (:s, 1, 999, 1, 1)",
                "update sessions set tenant = 'B' where session_id = :a",
            ):
                with (
                    pytest.raises(sa.exc.ProgrammingError, match="row-level security"),
                    conn.begin(),
                ):
                    _scoped(conn, "A")
                    conn.execute(sa.text(statement), {"s": b, "a": world.a[0]})
        assert b_picture() == before
    finally:
        role.dispose()
        owner.dispose()


def test_memory_as_the_tenant_role_works_end_to_end(
    db_url: str, world: World, tenant_role: str
) -> None:
    sid = f"ten-role-{uuid.uuid4().hex[:6]}"
    mem = AutoContextMemory.open(
        sid, tenant_role, CONFIG, tenant="A", summarizer=OfflineSummarizer()
    )
    added = mem.add(multi_round(70, rounds=4, steps=8))
    events = mem.compress_if_needed()
    applied = [e for e in events if e.status == "applied"]
    assert applied
    for e in applied:
        assert e.offload_uuid is not None
        assert [m.id for m in mem.reload(str(e.offload_uuid))] == list(e.replaced_ids)
    assert [e.id for e in mem.events()] == [e.id for e in events]
    assert len(mem.to_openai()) == mem.message_count
    # Hand-written SQL through the memory runs in its tenant scope, so the role sees its rows.
    working = "select count(*) as n from working_set where session_id = :s"
    assert sql(mem, working, s=sid)[0].n == mem.message_count
    mem.set_plan({"goal": "ship", "steps": [{"title": "fix", "state": "in_progress"}]})
    # The same role cannot reach B's session through autoctx either.
    with pytest.raises(SessionNotFound):
        AutoContextMemory.open(world.b[0], tenant_role, CONFIG, tenant="A", create=False)
    with pytest.raises(OffloadNotFound):
        mem.reload(str(world.offload_of[world.b[0]]))
    # Checked as the owner: the role's rows are whole and consistent.
    checked = AutoContextMemory.open(sid, db_url, CONFIG, tenant="A", create=False)
    assert checked.tenant == "A"
    assert len([m for m in checked.messages()]) == mem.message_count
    assert added[0].id is not None
    assert_consistent(checked)
    assert_every_original_reachable(checked)
    mem.delete()
    assert sql(checked, "select count(*) as n from messages where session_id = :s", s=sid)[0].n == 0


@pytest.mark.parametrize("tenant", ["A", None])
def test_the_tenant_role_cannot_claim_an_id_another_tenant_holds(
    world: World, tenant_role: str, tenant: str | None
) -> None:
    with pytest.raises(SessionNotFound):
        AutoContextMemory.open(world.b[0], tenant_role, CONFIG, tenant=tenant)


def test_the_tenant_role_without_a_tenant_sees_only_untenanted_sessions(
    world: World, tenant_role: str
) -> None:
    with pytest.raises(SessionNotFound):
        AutoContextMemory.open(world.a[0], tenant_role, CONFIG, create=False)
    mem = AutoContextMemory.open(world.untenanted, tenant_role, CONFIG, create=False)
    assert mem.message_count > 0
