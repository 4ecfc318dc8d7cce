"""Tenant isolation (docs/design.md §4 and 5; migrations 0003 and 0006), in its two cases.

Application tenancy: autoctx's own API never crosses sessions or tenants (another tenant's
session or offload answers exactly like an unknown one); connected as the tables' owner, that
is autoctx's own filter.

Database tenancy: a LOGIN role granted one tenant with `grant_tenant` reads and writes only
that tenant's rows whatever SQL it sends: naming another tenant in the setting
`autoctx.tenant` (set_config, SET, the URL's connection options), the audit views, functions
that run SQL, autoctx's API and CLI on such a URL. Roles are cluster-wide and other runs share
the server: every role here has a random name and is dropped at the end.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from sqlalchemy.engine import URL, make_url
from typer.testing import CliRunner

import autoctx
from autoctx import (
    AutoContextClient,
    AutoContextMemory,
    Msg,
    OfflineSummarizer,
    OffloadNotFound,
    SessionNotFound,
)
from autoctx._cli import app
from autoctx._store.database import (
    alembic_config,
    create_engine,
    current_revision,
    head_revision,
    normalize_url,
    upgrade,
)
from autoctx._store.tables import SESSION_TABLES
from tests.dbsql import sql
from tests.histories import SMALL, multi_round
from tests.invariants import (
    AUDIT_VIEWS,
    FACT_VIEWS,
    LIFECYCLE_VIEWS,
    assert_consistent,
    assert_every_original_reachable,
)

CONFIG = SMALL
TABLES = [t.name for t in SESSION_TABLES]
RELATIONS = TABLES + list(AUDIT_VIEWS)
GRANTS = "autoctx_tenant_grants"


@dataclass
class World:
    """Sessions of two tenants and one without a tenant, all compressed (offloads, lineage)
    and each with a failed event (so that every audit view has a row of every session)."""

    a: list[str]
    b: list[str]
    untenanted: str
    offload_of: dict[str, uuid.UUID]

    @property
    def foreign(self) -> set[str]:
        """What a role granted acme only must never see."""
        return set(self.b) | {self.untenanted}


def _compressed(db_url: str, sid: str, tenant: str | None, seed: int) -> uuid.UUID:
    mem = AutoContextMemory.open(sid, db_url, CONFIG, tenant=tenant, summarizer=OfflineSummarizer())
    mem.add(multi_round(seed, rounds=4, steps=8))
    events = [e for e in mem.compress_if_needed() if e.status == "applied"]
    assert events and events[0].offload_uuid is not None
    return events[0].offload_uuid


_FAILED_EVENT = """
insert into compression_events (session_id, id, strategy, status, reason, messages_before,
    messages_after, tokens_before, tokens_after, session_version, config, error)
select session_id, next_event_id, 1, 'failed', 'manual', message_count, message_count,
    token_count, token_count, version, config, 'summarizer down (test)'
from sessions where session_id = any(:s)
"""


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
        w.offload_of[sid] = _compressed(db_url, sid, "acme", 40 + k)
    w.offload_of[w.b[0]] = _compressed(db_url, w.b[0], "globex", 50)
    w.offload_of[w.untenanted] = _compressed(db_url, w.untenanted, None, 60)
    owner = sa.create_engine(db_url, poolclass=sa.NullPool)
    every = [*w.a, *w.b, w.untenanted]
    with owner.begin() as conn:
        conn.execute(sa.text(_FAILED_EVENT), {"s": every})
        conn.execute(
            sa.text(
                "update sessions set next_event_id = next_event_id + 1 where session_id = any(:s)"
            ),
            {"s": every},
        )
    with owner.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        # Column statistics of every table exist, so that pg_stats could leak them.
        conn.execute(sa.text("analyze"))
    owner.dispose()
    return w


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@dataclass
class Role:
    name: str
    url: str

    def with_setting(self, tenant: str) -> str:
        """This role's URL with `-c autoctx.tenant=<tenant>` in its connection options."""
        url = make_url(self.url).update_query_dict({"options": f"-c autoctx.tenant={tenant}"})
        return url.render_as_string(hide_password=False)


@contextlib.contextmanager
def login_role(db_url: str, name: str | None = None, *, login: bool = True) -> Iterator[Role]:
    """A fresh role with a unique name that does not own the tables, dropped (with its
    privileges, its grant rows and its connections) at the end."""
    name = name or f"autoctx_t_{uuid.uuid4().hex[:12]}"
    owner = sa.create_engine(db_url, poolclass=sa.NullPool)
    with owner.begin() as conn:
        attributes = "LOGIN" if login else "NOLOGIN"
        conn.execute(sa.text(f"CREATE ROLE {_quoted(name)} {attributes} NOSUPERUSER NOBYPASSRLS"))
    url = make_url(db_url).set(username=name, password=None)
    try:
        yield Role(name, url.render_as_string(hide_password=False))
    finally:
        AutoContextClient.close_shared(url)  # the role's pool, before its backends end
        with owner.begin() as conn:
            conn.execute(
                sa.text(
                    "select pg_terminate_backend(pid) from pg_stat_activity where usename = :r"
                ),
                {"r": name},
            )
            conn.execute(sa.text(f"DROP OWNED BY {_quoted(name)}"))
            if conn.execute(sa.text(f"select to_regclass('{GRANTS}')")).scalar() is not None:
                conn.execute(sa.text(f"delete from {GRANTS} where grantee = :r"), {"r": name})
            conn.execute(sa.text(f"DROP ROLE {_quoted(name)}"))
        owner.dispose()


@pytest.fixture(scope="module")
def acme(db_url: str, world: World) -> Iterator[Role]:
    """A LOGIN role granted tenant acme, and nothing else."""
    with login_role(db_url) as role:
        assert autoctx.grant_tenant(role.name, "acme", db_url) is True
        yield role


def _sessions_in(conn: sa.Connection, relation: str) -> set[str]:
    return {r[0] for r in conn.execute(sa.text(f"select distinct session_id from {relation}"))}


def _set_local(conn: sa.Connection, tenant: str) -> None:
    conn.execute(sa.text("select set_config('autoctx.tenant', :t, true)"), {"t": tenant})


# ---------------------------------------------------------------------------------------------
# Application tenancy: autoctx's API, connected as the owner (the tenant filter is autoctx's own)
# ---------------------------------------------------------------------------------------------


def _unknown_like(message: str, sid: str, offload: uuid.UUID) -> str:
    return message.replace(str(offload), "<uuid>").replace(sid, "<sid>")


def test_another_tenants_offload_answers_like_an_unknown_one(db_url: str, world: World) -> None:
    mem = AutoContextMemory.open(world.a[0], db_url, CONFIG, tenant="acme", create=False)
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
            AutoContextMemory.open(sid, db_url, CONFIG, tenant="acme", create=False)
        messages.append(str(info.value).replace(sid, "<sid>"))
    assert len(set(messages)) == 1, messages
    # Ids are global: tenant A cannot take B's id either, and learns nothing of B's session.
    with pytest.raises(SessionNotFound):
        AutoContextMemory.open(world.b[0], db_url, CONFIG, tenant="acme")
    owner_view = AutoContextMemory.open(world.b[0], db_url, CONFIG, tenant="globex", create=False)
    assert owner_view.tenant == "globex"


def test_events_and_lineage_stay_in_their_session(db_url: str, world: World) -> None:
    for sid in world.a + world.b:
        tenant = "acme" if sid in world.a else "globex"
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
# Database tenancy: the schema
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


#: The functions that run with their owner's rights (migration 0014): the two that delete for
#: a role without DELETE (each checks the caller's login holds the session's tenant, tested in
#: test_claims.py) and the claim triggers (which fire only on rows the role may write).
DEFINERS = {
    "autoctx_unlink_working",
    "autoctx_delete_session",
    "autoctx_claim_created",
    "autoctx_claim_deleted",
}


def test_views_run_as_their_reader_and_only_the_delete_functions_run_as_their_owner(
    db_url: str,
) -> None:
    """A view runs with its owner's rights unless security_invoker, and a SECURITY DEFINER
    function with its definer's: either would read past the policies. The few definers have a
    fixed search path and are not PUBLIC's to call."""
    engine = sa.create_engine(db_url, poolclass=sa.NullPool)
    with engine.connect() as conn:
        schema = "(select relnamespace from pg_class where oid = 'sessions'::regclass)"
        views = conn.execute(
            sa.text(
                f"select relname, coalesce(reloptions, '{{}}') as options from pg_class "
                f"where relkind in ('v', 'm') and relnamespace = {schema}"
            )
        ).all()
        definers = conn.execute(
            sa.text(
                "select proname, proconfig, prokind, "
                "has_function_privilege('public', oid, 'EXECUTE') as public "
                f"from pg_proc where prosecdef and pronamespace = {schema}"
            )
        ).all()
    engine.dispose()
    assert {v.relname for v in views} == {*AUDIT_VIEWS, *LIFECYCLE_VIEWS, *FACT_VIEWS}
    for v in views:
        assert "security_invoker=true" in v.options, v
    assert {d.proname for d in definers} == DEFINERS
    for d in definers:
        assert d.proconfig == ["search_path=pg_catalog, pg_temp"], d
        assert not d.public or d.proname.startswith("autoctx_claim_"), d


# ---------------------------------------------------------------------------------------------
# Database tenancy: a role granted acme, sending its own SQL
# ---------------------------------------------------------------------------------------------

#: Every way a role can name a tenant in the setting the policies read.
NAMING = {
    "set_config local": "select set_config('autoctx.tenant', '{t}', true)",
    "set_config session": "select set_config('autoctx.tenant', '{t}', false)",
    "SET": "SET autoctx.tenant = '{t}'",
    "SET LOCAL": "SET LOCAL autoctx.tenant = '{t}'",
    "URL option": "",
}


@contextlib.contextmanager
def _as(role: Role, naming: str, tenant: str) -> Iterator[sa.Connection]:
    """A transaction of `role` with the setting naming `tenant` the way `naming` says."""
    url = role.with_setting(tenant) if naming == "URL option" else role.url
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    try:
        with engine.connect() as conn, conn.begin() as tx:
            if NAMING[naming]:
                conn.execute(sa.text(NAMING[naming].format(t=tenant)))
            assert conn.execute(sa.text("select current_setting('autoctx.tenant')")).scalar() == (
                tenant
            )
            yield conn
            tx.rollback()
    finally:
        engine.dispose()


@pytest.mark.parametrize("tenant", ["globex", ""], ids=["globex", "untenanted"])
@pytest.mark.parametrize("naming", list(NAMING))
def test_naming_another_tenant_shows_nothing_of_it(
    world: World, acme: Role, naming: str, tenant: str
) -> None:
    with _as(acme, naming, tenant) as conn:
        for relation in RELATIONS:
            seen = _sessions_in(conn, relation)
            assert not seen & world.foreign, (relation, sorted(seen & world.foreign))


def test_the_acme_role_reads_all_of_its_own_rows(db_url: str, world: World, acme: Role) -> None:
    owner = sa.create_engine(db_url, poolclass=sa.NullPool)
    counts = "select count(*) from {r} where session_id = any(:s)"
    with owner.connect() as conn:
        expected = {
            r: conn.execute(sa.text(counts.format(r=r)), {"s": world.a}).scalar_one()
            for r in RELATIONS
        }
    owner.dispose()
    with _as(acme, "set_config local", "acme") as conn:
        for relation in RELATIONS:
            assert _sessions_in(conn, relation) == set(world.a), relation
            got = conn.execute(sa.text(counts.format(r=relation)), {"s": world.a}).scalar_one()
            assert got == expected[relation] > 0, relation


def _picture(db_url: str, sessions: set[str]) -> tuple[Any, ...]:
    """Everything of `sessions`, read as the owner."""
    owner = sa.create_engine(db_url, poolclass=sa.NullPool)
    with owner.connect() as conn:
        picture = tuple(
            tuple(
                conn.execute(
                    sa.text(f"select * from {t} where session_id = any(:s) order by 1, 2"),
                    {"s": sorted(sessions)},
                ).all()
            )
            for t in TABLES
        )
    owner.dispose()
    return picture


@pytest.mark.parametrize("tenant", ["globex", ""], ids=["globex", "untenanted"])
def test_naming_another_tenant_writes_nothing_of_it(
    db_url: str, world: World, acme: Role, tenant: str
) -> None:
    victim = world.b[0] if tenant else world.untenanted
    fresh = f"ten-new-{uuid.uuid4().hex[:6]}"
    before = _picture(db_url, world.foreign)
    for statement in (
        "update sessions set plan = '{}' where session_id = :s",
        "update sessions set tenant = 'acme' where session_id = :s",
        # The deletes a granted role makes go through functions that run as their owner
        # (migration 0014): they delete only what the caller's login may.
        "select * from autoctx_unlink_working(:s, null)",
        "select * from autoctx_delete_session(:s, null, null, null)",
    ):
        with _as(acme, "set_config local", tenant) as conn:
            assert conn.execute(sa.text(statement), {"s": victim}).rowcount == 0, statement
    # No DELETE at all: it would let the role lock the table every tenant shares.
    for statement in (
        "delete from working_set where session_id = :s",
        "delete from sessions where session_id = :s",
    ):
        with (
            pytest.raises(sa.exc.ProgrammingError, match="permission denied"),
            _as(acme, "set_config local", tenant) as conn,
        ):
            conn.execute(sa.text(statement), {"s": victim})
    for statement in (
        # A row into the victim's session, and a session of the named tenant (or of none).
        "insert into lineage (session_id, summary_id, ordinal, replaced_id, event_id) "
        "values (:s, 1, 999, 1, 1)",
        "insert into sessions (session_id, tenant, model, encoding, config) "
        "values (:new, nullif(:t, ''), 'gpt-4o', 'o200k_base', '{}')",
    ):
        with (
            pytest.raises(sa.exc.ProgrammingError, match="row-level security"),
            _as(acme, "set_config local", tenant) as conn,
        ):
            conn.execute(sa.text(statement), {"s": victim, "new": fresh, "t": tenant})
    # Originals and the audit trail are append-only for a granted role, its own included.
    for statement in (
        "update messages set content = '[]' where session_id = :s",
        "delete from compression_events where session_id = :s",
    ):
        for target in (victim, world.a[0]):
            with (
                pytest.raises(sa.exc.ProgrammingError, match="permission denied"),
                _as(acme, "set_config local", tenant) as conn,
            ):
                conn.execute(sa.text(statement), {"s": target})
    # Its own session handed to the other tenant (the setting naming its own).
    with (
        pytest.raises(sa.exc.ProgrammingError, match="row-level security"),
        _as(acme, "set_config local", "acme") as conn,
    ):
        conn.execute(
            sa.text("update sessions set tenant = nullif(:t, '') where session_id = :a"),
            {"t": tenant, "a": world.a[0]},
        )
    assert _picture(db_url, world.foreign) == before


def test_functions_that_run_sql_see_nothing_of_another_tenant(world: World, acme: Role) -> None:
    with _as(acme, "set_config local", "globex") as conn:
        for relation in RELATIONS:
            # query_to_xml runs its query as the caller, inside the same policies.
            xml = conn.execute(
                sa.text("select query_to_xml(:q, true, false, '')"),
                {"q": f"select session_id from {relation}"},
            ).scalar_one()
            assert not any(sid in xml for sid in world.foreign), relation
        # Column statistics (most common values of content) are hidden under RLS.
        stats = conn.execute(
            sa.text("select count(*) from pg_stats where tablename = any(:t)"), {"t": TABLES}
        ).scalar_one()
        assert stats == 0


# ---------------------------------------------------------------------------------------------
# Database tenancy: the same role through autoctx's API and CLI
# ---------------------------------------------------------------------------------------------


def test_the_acme_role_runs_a_memory_end_to_end(db_url: str, world: World, acme: Role) -> None:
    sid = f"ten-role-{uuid.uuid4().hex[:6]}"
    mem = AutoContextMemory.open(
        sid, acme.url, CONFIG, tenant="acme", summarizer=OfflineSummarizer()
    )
    added = mem.add(multi_round(70, rounds=4, steps=8))
    events = mem.compress_if_needed()
    applied = [e for e in events if e.status == "applied"]
    assert applied
    for e in applied:
        assert e.offload_uuid is not None
        assert [m.id for m in mem.reload(str(e.offload_uuid))] == list(e.replaced_ids)
    assert [e.id for e in mem.events()] == [e.id for e in events]
    assert len(mem.to_openai()) == mem.message_count()
    # Its own rows through the views, in its tenant's scope.
    working = "select count(*) as n from working_set where session_id = :s"
    assert sql(mem, working, s=sid)[0].n == mem.message_count()
    cost = sql(mem, "select event_count from autoctx_session_cost where session_id = :s", s=sid)
    assert cost[0].event_count == len(events)
    lineage = sql(mem, "select count(*) as n from autoctx_lineage where session_id = :s", s=sid)
    assert lineage[0].n > 0
    mem.set_plan({"goal": "ship", "steps": [{"title": "fix", "state": "in_progress"}]})
    # Reopened (a new process would: a new client), everything is there.
    with AutoContextClient(acme.url) as fresh:
        again = fresh.open(sid, tenant="acme", create=False)
        assert again.to_openai() == mem.to_openai()
        with pytest.raises(OffloadNotFound):
            again.reload(str(world.offload_of[world.b[0]]))
        # Checked as the owner: the role's rows are whole and consistent.
        checked = AutoContextMemory.open(sid, db_url, CONFIG, tenant="acme", create=False)
        assert len(list(checked.messages())) == mem.message_count()
        assert added[0].id is not None
        assert_consistent(checked)
        assert_every_original_reachable(checked)
        again.delete()
    assert sql(checked, "select count(*) as n from messages where session_id = :s", s=sid)[0].n == 0


def test_the_acme_role_cannot_open_other_sessions_through_autoctx(world: World, acme: Role) -> None:
    b = world.b[0]
    for attempt in (
        lambda: AutoContextMemory.open(b, acme.url, CONFIG, tenant="globex", create=False),
        lambda: AutoContextMemory.open(world.untenanted, acme.url, CONFIG, create=False),
        lambda: AutoContextMemory.open(b, acme.with_setting("globex"), CONFIG, create=False),
        lambda: AutoContextMemory.open(b, acme.url, CONFIG, tenant="acme"),
    ):
        with pytest.raises(SessionNotFound):
            attempt()
    # Nor start a session of another tenant, or of none.
    for tenant in ("globex", None):
        with pytest.raises(SessionNotFound, match="not granted that tenant") as refused:
            AutoContextMemory.open(f"ten-x-{uuid.uuid4().hex[:6]}", acme.url, CONFIG, tenant=tenant)
        assert "grant-tenant" in str(refused.value)


def _show(session_id: str, url: str) -> Any:
    return CliRunner().invoke(
        app, ["show", session_id, "--database-url", url], env={"COLUMNS": "200"}
    )


def test_autoctx_show_with_the_url_option_shows_nothing_of_globex(world: World, acme: Role) -> None:
    for sid, url in ((world.b[0], acme.with_setting("globex")), (world.untenanted, acme.url)):
        result = _show(sid, url)
        assert result.exit_code == 1, result.output
        assert "does not exist" in result.stderr
        assert sid not in result.stdout
    # Its own session, with the setting naming its own tenant, shows.
    mine = _show(world.a[0], acme.with_setting("acme"))
    assert mine.exit_code == 0, mine.output + mine.stderr
    assert world.a[0] in mine.stdout


# ---------------------------------------------------------------------------------------------
# Database tenancy: granting and revoking
# ---------------------------------------------------------------------------------------------


def _visible(role: Role, tenant: str) -> set[str]:
    with _as(role, "set_config local", tenant) as conn:
        return _sessions_in(conn, "sessions")


def test_revoking_takes_one_tenant_and_the_last_revoke_everything(
    db_url: str, world: World
) -> None:
    with login_role(db_url) as role:
        assert autoctx.grant_tenant(role.name, "acme", db_url) is True
        assert autoctx.grant_tenant(role.name, "acme", db_url) is False  # harmless twice
        assert autoctx.grant_tenant(role.name, "globex", db_url) is True
        assert _visible(role, "acme") == set(world.a)
        assert _visible(role, "globex") == set(world.b)
        mem = AutoContextMemory.open(world.a[0], role.url, tenant="acme", create=False)
        mem.add(Msg.user("still here"))

        assert autoctx.revoke_tenant(role.name, "acme", db_url) is True
        assert autoctx.revoke_tenant(role.name, "acme", db_url) is False
        assert _visible(role, "acme") == set()
        assert _visible(role, "globex") == set(world.b)
        AutoContextClient.close_shared(role.url)  # the next open connects again
        with pytest.raises(SessionNotFound):
            AutoContextMemory.open(world.a[0], role.url, tenant="acme", create=False)

        assert autoctx.revoke_tenant(role.name, "globex", db_url) is True
        AutoContextClient.close_shared(role.url)
        with pytest.raises(sa.exc.ProgrammingError, match="permission denied"):
            AutoContextMemory.open(world.b[0], role.url, tenant="globex", create=False)
        for relation in [*RELATIONS, "alembic_version", GRANTS]:
            with (
                pytest.raises(sa.exc.ProgrammingError, match="permission denied"),
                _as(role, "set_config local", "globex") as conn,
            ):
                conn.execute(sa.text(f"select * from {relation}"))


def test_a_granted_role_sees_its_own_grants_only_and_cannot_write_them(
    db_url: str, world: World, acme: Role
) -> None:
    with login_role(db_url) as other:
        autoctx.grant_tenant(other.name, "globex", db_url)
        with _as(acme, "set_config local", "globex") as conn:
            rows = conn.execute(sa.text(f"select grantee, tenant from {GRANTS}")).all()
            assert [tuple(r) for r in rows] == [(acme.name, "acme")]
        for statement in (
            f"insert into {GRANTS} (grantee, tenant) values (current_user, 'globex')",
            f"update {GRANTS} set tenant = 'globex'",
            f"delete from {GRANTS}",
        ):
            with (
                pytest.raises(sa.exc.ProgrammingError, match="permission denied"),
                _as(acme, "set_config local", "globex") as conn,
            ):
                conn.execute(sa.text(statement))
        # Nor can it pass its grant on, or grant itself another tenant through autoctx.
        with pytest.raises(autoctx.TenantGrantError, match="does not own"):
            autoctx.grant_tenant(other.name, "acme", acme.url)
        with pytest.raises(autoctx.TenantGrantError, match="does not own"):
            autoctx.grant_tenant(acme.name, "globex", acme.url)


def test_membership_in_a_granted_group_counts(db_url: str, world: World) -> None:
    with login_role(db_url, login=False) as group, login_role(db_url) as member:
        autoctx.grant_tenant(group.name, "acme", db_url)
        owner = sa.create_engine(db_url, poolclass=sa.NullPool)
        with owner.begin() as conn:
            conn.execute(sa.text(f"GRANT {_quoted(group.name)} TO {_quoted(member.name)}"))
        owner.dispose()
        assert _visible(member, "acme") == set(world.a)
        assert _visible(member, "globex") == set()


def test_role_names_are_identifiers_never_sql(db_url: str, world: World) -> None:
    name = f'acme "x"; drop table messages; -- {uuid.uuid4().hex[:6]}'
    with login_role(db_url, name) as role:
        assert autoctx.grant_tenant(role.name, "acme", db_url) is True
        assert _visible(role, "acme") == set(world.a)
        assert autoctx.revoke_tenant(role.name, "acme", db_url) is True
    assert _picture(db_url, set(world.a))[TABLES.index("messages")]


def test_grant_tenant_refuses_what_it_cannot_confine(db_url: str, acme: Role) -> None:
    owner_name = make_url(db_url).username
    assert owner_name is not None
    with login_role(db_url) as member_of_owner:
        engine = sa.create_engine(db_url, poolclass=sa.NullPool)
        with engine.begin() as conn:
            conn.execute(sa.text(f"GRANT {_quoted(owner_name)} TO {_quoted(member_of_owner.name)}"))
        engine.dispose()
        for role, tenant, needle in (
            ("", "acme", "not a role name"),
            ("pg_monitor", "acme", "predefined"),
            ("r" * 64, "acme", "63 bytes"),
            (f"missing_{uuid.uuid4().hex[:8]}", "acme", "does not exist"),
            (owner_name, "acme", "BYPASSRLS"),  # the test server's owner is a superuser
            (member_of_owner.name, "acme", "owner"),
            (acme.name, "", "not a tenant name"),
            (acme.name, "   ", "not a tenant name"),
        ):
            with pytest.raises(autoctx.TenantGrantError, match=needle) as info:
                autoctx.grant_tenant(role, tenant, db_url)
            assert repr(role if needle != "not a tenant name" else tenant) in str(info.value)


def test_the_db_commands_grant_and_revoke(db_url: str, world: World) -> None:
    runner = CliRunner()
    with login_role(db_url) as role:
        args = [role.name, "acme", "--database-url", db_url]
        first = runner.invoke(app, ["db", "grant-tenant", *args])
        assert first.exit_code == 0, first.output + first.stderr
        assert f"role {role.name!r} granted tenant 'acme'" in first.stdout
        again = runner.invoke(app, ["db", "grant-tenant", *args])
        assert "already held" in again.stdout
        assert _visible(role, "acme") == set(world.a)
        gone = runner.invoke(app, ["db", "revoke-tenant", *args])
        assert gone.exit_code == 0 and "no longer holds" in gone.stdout
        assert "nothing to revoke" in runner.invoke(app, ["db", "revoke-tenant", *args]).stdout
        bad = runner.invoke(app, ["db", "grant-tenant", "pg_monitor", "acme", "-d", db_url])
        assert bad.exit_code == 1
        assert bad.stderr.startswith("autoctx: error: role 'pg_monitor' is one of")


def _privileges(db_url: str, role: str) -> set[str]:
    """The relations of autoctx on which `role` holds any privilege."""
    engine = sa.create_engine(db_url, poolclass=sa.NullPool)
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "select table_name from information_schema.role_table_grants "
                "where grantee = :r union "
                "select table_name from information_schema.table_privileges where grantee = :r"
            ),
            {"r": role},
        )
        found = {r[0] for r in rows}
    engine.dispose()
    return found


def test_downgrading_0006_revokes_what_it_granted(empty_db_url: str) -> None:
    """0003's policies trust the setting: a role granted a tenant must not keep its privileges
    under them."""
    engine = create_engine(normalize_url(empty_db_url), poolclass=sa.NullPool)
    try:
        upgrade(engine)
        with login_role(empty_db_url) as role:
            autoctx.grant_tenant(role.name, "acme", empty_db_url)
            assert set(TABLES) <= _privileges(empty_db_url, role.name)
            with engine.connect() as conn:
                cfg = alembic_config()
                cfg.attributes["connection"] = conn
                command.downgrade(cfg, "0005")
                conn.commit()
            assert current_revision(engine) == "0005"
            assert _privileges(empty_db_url, role.name) == set()
            upgrade(engine)
            assert current_revision(engine) == head_revision()
    finally:
        engine.dispose()


def test_a_forced_owner_is_held_to_the_setting(admin_url: URL, empty_db_url: str) -> None:
    """Application tenancy checked by PostgreSQL: with FORCE ROW LEVEL SECURITY the tables'
    owner (not a superuser) passes the role check and is held to the setting's tenant."""
    name = make_url(empty_db_url).database
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
    with login_role(empty_db_url) as owner:
        try:
            with admin.connect() as conn:
                conn.execute(sa.text(f'ALTER DATABASE "{name}" OWNER TO {_quoted(owner.name)}'))
            autoctx.upgrade_database(owner.url)
            acme_sid, globex_sid = (f"ten-f{k}-{uuid.uuid4().hex[:6]}" for k in (1, 2))
            _compressed(owner.url, acme_sid, "acme", 80)
            _compressed(owner.url, globex_sid, "globex", 81)
            engine = sa.create_engine(owner.url, poolclass=sa.NullPool)
            with engine.begin() as conn:
                for table in TABLES:
                    conn.execute(sa.text(f"ALTER TABLE {table} FORCE ROW LEVEL SECURITY"))
            assert _visible(owner, "acme") == {acme_sid}
            assert _visible(owner, "globex") == {globex_sid}
            assert _visible(owner, "") == set()
            AutoContextClient.close_shared(owner.url)
            mem = AutoContextMemory.open(
                acme_sid, owner.url, tenant="acme", summarizer=OfflineSummarizer(), create=False
            )
            mem.add(multi_round(82, rounds=6, steps=8)[1:])  # (its system prompt is there)
            assert [e for e in mem.compress_if_needed() if e.status == "applied"]
            with pytest.raises(SessionNotFound):
                AutoContextMemory.open(globex_sid, owner.url, tenant="acme", create=False)
            # (The invariants' totals read without a tenant scope: checked with FORCE off.)
            with engine.begin() as conn:
                for table in TABLES:
                    conn.execute(sa.text(f"ALTER TABLE {table} NO FORCE ROW LEVEL SECURITY"))
            engine.dispose()
            assert_consistent(mem)
        finally:
            AutoContextClient.close_shared(owner.url)
            with admin.connect() as conn:
                conn.execute(
                    sa.text(f'ALTER DATABASE "{name}" OWNER TO {_quoted(str(admin_url.username))}')
                )
    admin.dispose()


def test_the_acme_role_undoes_a_compression_of_its_own_tenant(
    db_url: str, world: World, acme: Role
) -> None:
    """An undo needs no privilege beyond what a memory of the tenant uses: the working set is
    spliced with INSERT and `autoctx_unlink_working`, positions moved included (in a fork,
    whose positions are dense). docs/design.md §7."""
    sid = world.a[0]
    owner = AutoContextMemory.open(sid, db_url, tenant="acme", create=False)
    applied = [e for e in owner.events() if e.status == "applied" and e.strategy]
    child_id = f"{sid}-undo-{uuid.uuid4().hex[:6]}"
    owner.fork(child_id)
    child = AutoContextMemory.open(
        child_id, acme.url, tenant="acme", summarizer=OfflineSummarizer(), create=False
    )
    target = next(
        e for e in reversed(applied) if e.summary_message_id in {m.id for m in child.messages()}
    )
    done = child.undo(target.id, force=True)
    assert done.undoes == target.id
    assert set(target.replaced_ids) <= {m.id for m in child.messages()}
    (row,) = sql(
        child, "select undone_event_id from autoctx_undos where session_id = :s", s=child_id
    )
    assert row.undone_event_id == target.id
    # A session of another tenant is an unknown one.
    with pytest.raises(SessionNotFound):
        AutoContextMemory.open(world.b[0], acme.url, tenant="acme", create=False).undo(1)
    assert_every_original_reachable(
        AutoContextMemory.open(child_id, db_url, tenant="acme", create=False)
    )
