"""Erasure that follows lineage, and retention (docs/design.md §9).

The planted-secret test scans every column of every table of the schema (found in pg_catalog,
so that a column added later is scanned too), cast to text, and queries every tsvector column
through its GIN index. The module's database gets a generated tsvector column with a GIN index
over message content, as full-text search adds one: an erasure that rewrites the content must
leave nothing in it either.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from autoctx import (
    AutoContextClient,
    AutoContextConfig,
    AutoContextMemory,
    ErasureNotPermitted,
    InvalidDuration,
    InvalidErasure,
    InvalidMessageId,
    MessageNotFound,
    Msg,
    OfflineSummarizer,
    SessionExists,
    SessionNotFound,
    SummaryRequest,
    SummaryResult,
    ToolUseBlock,
    export_session,
    grant_tenant,
    import_session,
    purge_sessions,
)
from autoctx._store.database import create_engine, normalize_url
from tests.dbsql import sql
from tests.lifecycle import (
    CONFIG,
    EchoSummarizer,
    assert_valid_session,
    build,
    opaque_round,
    round_of,
    session_rows,
)
from tests.pauses import pause
from tests.test_cli import assert_one_line_error, invoke
from tests.test_tenants import login_role

Opener = Callable[..., AutoContextMemory]


@pytest.fixture
def secret() -> str:
    """A secret of the test's own (letters and digits: one lexeme for the `simple` text search
    configuration, so that a tsvector holds it whole)."""
    return f"xyzzysecret{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="module")
def search_db(db_url: str) -> str:
    """The module's database with a generated tsvector column and a GIN index on messages."""
    engine = create_engine(normalize_url(db_url), poolclass=sa.NullPool)
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "ALTER TABLE messages ADD COLUMN erase_test_tsv tsvector GENERATED ALWAYS AS "
                "(jsonb_to_tsvector('simple', content, '[\"string\"]') || "
                "jsonb_to_tsvector('simple', metadata, '[\"string\"]')) STORED"
            )
        )
        conn.execute(
            sa.text(
                "CREATE INDEX messages_erase_test_tsv_idx ON messages USING gin (erase_test_tsv)"
            )
        )
    engine.dispose()
    return db_url


@pytest.fixture
def open_mem(search_db: str, session_id: str) -> Opener:
    def _open(sid: str | None = None, **kw: Any) -> AutoContextMemory:
        kw.setdefault("summarizer", OfflineSummarizer())
        kw.setdefault("config", CONFIG)
        return AutoContextMemory.open(sid or session_id, search_db, **kw)

    return _open


# ---------------------------------------------------------------------------------------------
# The scan
# ---------------------------------------------------------------------------------------------


def _columns(conn: sa.Connection) -> list[tuple[str, str, str]]:
    """(table, column, type) of every column of every table of the schema."""
    return [
        (r[0], r[1], r[2])
        for r in conn.execute(
            sa.text(
                "SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod) "
                "FROM pg_catalog.pg_attribute a "
                "JOIN pg_catalog.pg_class c ON c.oid = a.attrelid "
                "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p', 'm') "
                "AND a.attnum > 0 AND NOT a.attisdropped ORDER BY 1, 2"
            )
        )
    ]


def holding(engine: sa.Engine, needle: str) -> dict[str, int]:
    """'table.column' -> rows whose value, as text, contains `needle` (every column of every
    table, whatever its type); and 'table.column@@index' -> rows a tsvector column's index
    finds for it."""
    found: dict[str, int] = {}
    q = engine.dialect.identifier_preparer.quote
    with engine.connect() as conn:
        columns = _columns(conn)
        # Every table, every column: what an erasure rewrites, and what it must not leave
        # anything in (event errors and configs, the session row, columns added later).
        assert {
            ("messages", "content"),
            ("messages", "metadata"),
            ("messages", "tool_names"),
            ("compression_events", "error"),
            ("compression_events", "config"),
            ("compression_events", "note"),
            ("sessions", "plan"),
            ("sessions", "open_calls"),
            ("messages", "erase_test_tsv"),
        } <= {(t, c) for t, c, _ in columns}
        for table, column, type_ in columns:
            n = conn.execute(
                sa.text(f"SELECT count(*) FROM {q(table)} WHERE {q(column)}::text ILIKE :p"),
                {"p": f"%{needle}%"},
            ).scalar_one()
            if n:
                found[f"{table}.{column}"] = n
            if type_ == "tsvector":
                # Through the index: a lookup the planner must answer from the GIN entries.
                conn.exec_driver_sql("SET enable_seqscan = off")
                query = (
                    f"SELECT count(*) FROM {q(table)} "
                    f"WHERE {q(column)} @@ plainto_tsquery('simple', :p)"
                )
                plan = "\n".join(
                    r[0] for r in conn.execute(sa.text(f"EXPLAIN {query}"), {"p": needle})
                )
                assert "Index Scan" in plan, plan
                n = conn.execute(sa.text(query), {"p": needle}).scalar_one()
                conn.exec_driver_sql("RESET enable_seqscan")
                if n:
                    found[f"{table}.{column}@@index"] = n
        conn.rollback()
    return found


def test_a_planted_secret_is_gone_from_every_row_and_index(open_mem: Opener, secret: str) -> None:
    mem = open_mem(summarizer=EchoSummarizer(secret))
    build(mem, 20, secret=secret, at=1)  # round 1: ids 5-8
    mem.add(opaque_round(50, secret))  # ids 49.., in the working context
    planted = [
        m.id
        for m in sql(
            mem,
            "SELECT id FROM messages WHERE session_id = :s AND kind = "
            "'original' AND content::text || metadata::text LIKE :p ORDER BY id",
            s=mem.session_id,
            p=f"%{secret}%",
        )
    ]
    before = holding(mem.engine, secret)
    # Planted in originals, and carried by lineage into summaries and previews, and indexed.
    assert "messages.content" in before and "messages.erase_test_tsv@@index" in before, before
    derived = sql(
        mem,
        "SELECT count(*) AS n FROM messages WHERE session_id = :s AND kind <> 'original' "
        "AND content::text LIKE :p",
        s=mem.session_id,
        p=f"%{secret}%",
    )[0].n
    assert derived >= 3, "the secret should be in several summaries before the erasure"
    deep = sql(
        mem,
        "SELECT max(l.depth) AS d FROM autoctx_lineage l JOIN messages m "
        "ON m.session_id = l.session_id AND m.id = l.summary_id "
        "WHERE l.session_id = :s AND l.message_id = ANY(:ids) AND m.content::text LIKE :p",
        s=mem.session_id,
        ids=planted,
        p=f"%{secret}%",
    )[0].d
    assert deep >= 2, "a summary of a summary should carry the secret"
    tokens_before = mem.token_count()

    done = mem.erase([m for m in planted if m is not None], reason="user request #5521")

    assert holding(mem.engine, secret) == {}
    assert done.erased_ids == tuple(planted)
    assert len(done.rewritten_ids) >= derived
    assert_valid_session(mem)  # valid chat, totals equal a recount, every reload works
    assert done.event.reason == "erase" and done.event.replaced_ids == tuple(planted)
    assert done.event.tokens_before == tokens_before
    assert done.event.tokens_after == mem.token_count() <= tokens_before
    (note,) = sql(
        mem,
        "SELECT note FROM compression_events WHERE session_id = :s AND id = :e",
        s=mem.session_id,
        e=done.event.id,
    )
    assert note.note == "user request #5521"
    # Tombstones keep role, ids, time and lineage; the audit says which erasure touched what.
    for m in mem._store.load_messages(planted).values():
        assert m.kind == "original"
        assert all(b.output_text == "[erased]" for b in m.tool_results)
        assert all(b.arguments == "{}" for b in m.tool_uses)
    touched = sql(
        mem,
        "SELECT id FROM messages WHERE session_id = :s AND erased_by = :e ORDER BY id",
        s=mem.session_id,
        e=done.event.id,
    )
    assert [r.id for r in touched] == sorted([*planted, *done.rewritten_ids])
    # The session goes on: appends, compression, reloads.
    build(mem, 3)
    assert_valid_session(mem)


def test_erasing_a_working_tool_group_keeps_it_paired(open_mem: Opener, secret: str) -> None:
    mem = open_mem()
    mem.add(round_of(0, secret))
    ids = [m.id for m in mem.messages()]
    done = mem.erase([i for i in ids if i is not None], reason="test")
    assert done.working_ids == tuple(ids)
    chat = mem.to_openai()
    assert chat[1]["tool_calls"][0]["id"] == "c0"
    assert chat[1]["tool_calls"][0]["function"] == {"name": "read_file", "arguments": "{}"}
    assert chat[2] == {"role": "tool", "tool_call_id": "c0", "content": "[erased]"}
    assert chat[0]["content"] == "[erased]" and chat[3]["content"] == "[erased]"
    assert_valid_session(mem)
    assert holding(mem.engine, secret) == {}


def test_bad_erasures_erase_nothing(open_mem: Opener) -> None:
    mem = open_mem()
    build(mem, 10)
    rows = session_rows(mem)
    summary = next(m.id for m in mem.messages() if m.kind != "original")
    with pytest.raises(MessageNotFound, match="no message with id 99999"):
        mem.erase([1, 99999], reason="x")
    with pytest.raises(InvalidErasure, match=f"message {summary} .* is a .*summary|preview"):
        mem.erase([1, summary], reason="x")
    with pytest.raises(InvalidErasure, match="reason is empty"):
        mem.erase([1], reason="   ")
    with pytest.raises(InvalidErasure, match="message_ids is empty"):
        mem.erase([], reason="x")
    with pytest.raises(InvalidErasure, match="list of message ids"):
        mem.erase(1, reason="x")  # type: ignore[arg-type]
    with pytest.raises(InvalidMessageId, match="an int"):
        mem.erase(["1"], reason="x")  # type: ignore[list-item]
    assert session_rows(mem) == rows


def test_cli_erase_and_a_foreign_session(open_mem: Opener, search_db: str, secret: str) -> None:
    mem = open_mem(tenant="acme")
    mem.add(round_of(0, secret))
    rows = session_rows(mem)
    assert_one_line_error(
        invoke(
            ["erase", mem.session_id, "1", "--reason", "x", "--tenant", "beta", "-d", search_db]
        ),
        "does not exist for tenant 'beta'",
    )
    assert_one_line_error(
        invoke(["erase", mem.session_id, "7", "--reason", "x", "-d", search_db]),
        "no message with id 7",
    )
    assert session_rows(mem) == rows
    result = invoke(["erase", mem.session_id, "1", "3", "--reason", "gdpr", "-d", search_db])
    assert result.exit_code == 0, result.stderr
    assert "erased 2 original(s)" in result.stdout
    text = {m.id: m for m in mem.messages()}
    assert text[1].text == "[erased]" and text[3].tool_results[0].output_text == "[erased]"
    assert secret in text[2].tool_uses[0].arguments  # not named: kept


def test_a_compression_racing_an_erasure_gives_way(
    open_mem: Opener, session_id: str, secret: str
) -> None:
    """A summary written from content read before an erasure committed is never applied."""
    first = open_mem()
    for i in range(12):
        first.add(round_of(i, secret if i == 0 else None))
    planted = [1, 2, 3, 4]
    other = open_mem()
    requests: list[str] = []

    class Racing:
        """An 'LLM' that echoes the start of what it is sent; during its first call, another
        memory erases the planted messages."""

        def summarize(self, request: SummaryRequest) -> SummaryResult:
            requests.append(request.transcript)
            if len(requests) == 1:
                other.erase(planted, reason="race")
            return SummaryResult(text=request.transcript[:300], model="racing")

    racer = open_mem(summarizer=Racing())
    events = racer.compress_if_needed()
    assert secret in requests[0]
    conflicts = [e for e in events if e.status == "conflict"]
    assert conflicts and conflicts[0].error == "an erasure rewrote messages since the snapshot"
    assert holding(racer.engine, secret) == {}
    assert_valid_session(racer)


# ---------------------------------------------------------------------------------------------
# A crash during the erasure: all or nothing
# ---------------------------------------------------------------------------------------------


def _pause_in_erase(engine: sa.Engine, phase: str) -> None:
    """Pause (until killed) inside the erasure's transaction: after its first rewrite of a
    message ("rewrite"), or with everything written and the COMMIT about to go ("commit")."""
    state = {"rewrote": False}

    def after(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if " ".join(statement.split()).upper().startswith("UPDATE MESSAGES"):
            state["rewrote"] = True
            if phase == "rewrite":
                pause(phase)

    def commit(conn: Any) -> None:
        if state["rewrote"] and phase == "commit":
            pause(phase)

    sa.event.listen(engine, "after_cursor_execute", after)
    sa.event.listen(engine, "commit", commit)


def _erase_in_child(db: str, sid: str, ids: list[int], phase: str) -> tuple[int, int]:
    # The child forgets the parent's pooled connections (the client's at-fork handler,
    # docs/design.md §5) and opens the session through a client of its own.
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.close(read_end)
            os.dup2(write_end, 2)
            sys.stderr = os.fdopen(2, "w", buffering=1)
            mem = AutoContextClient(db).open(sid, CONFIG, summarizer=OfflineSummarizer())
            _pause_in_erase(mem.engine, phase)
            mem.erase(ids, reason="crash")
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            with contextlib.suppress(BaseException):
                sys.stderr.flush()
            os._exit(code)
    os.close(write_end)
    return pid, read_end


def _wait_for(fd: int, needle: bytes, seconds: float) -> bytes:
    buf = b""
    deadline = time.monotonic() + seconds
    while needle not in buf and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.05)
        if ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            buf += chunk
    return buf


@pytest.mark.parametrize("phase", ["rewrite", "commit"])
def test_a_crash_during_an_erasure_leaves_all_or_nothing(
    phase: str, open_mem: Opener, search_db: str, secret: str
) -> None:
    mem = open_mem()
    build(mem, 10, secret=secret, at=1)
    planted = [5, 6, 7, 8]
    rows = session_rows(mem)
    held = holding(mem.engine, secret)
    pid, fd = _erase_in_child(search_db, mem.session_id, planted, phase)
    try:
        out = _wait_for(fd, f"PAUSED {phase}".encode(), 60)
        assert f"PAUSED {phase}".encode() in out, out.decode(errors="replace")
        # Inside the transaction: the session row is locked, and nothing of it is visible.
        engine = create_engine(normalize_url(search_db), poolclass=sa.NullPool)
        with engine.connect() as conn, pytest.raises(sa.exc.OperationalError):
            conn.execute(
                sa.text("SELECT 1 FROM sessions WHERE session_id = :s FOR UPDATE NOWAIT"),
                {"s": mem.session_id},
            )
        engine.dispose()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(fd)
    AutoContextClient.close_shared()  # reopened through a new client: a fresh pool
    mem = open_mem()
    assert session_rows(mem) == rows  # nothing
    assert holding(mem.engine, secret) == held
    assert_valid_session(mem)
    mem.erase(planted, reason="again")  # and then all
    assert holding(mem.engine, secret) == {}
    assert_valid_session(mem)


# ---------------------------------------------------------------------------------------------
# Retention
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def aged(open_mem: Opener, session_id: str) -> Iterator[list[AutoContextMemory]]:
    """Three sessions last updated 40, 20 and 0 days ago (two tenants)."""
    mems = []
    for days, tenant in ((40, "acme"), (20, "beta"), (0, "acme")):
        mem = open_mem(f"{session_id}-{days}", tenant=tenant)
        mem.add(Msg.user(f"{days} days"))
        with mem.engine.begin() as conn:
            conn.execute(
                sa.text(
                    "UPDATE sessions SET updated_at = now() - make_interval(days => :d) "
                    "WHERE session_id = :s"
                ),
                {"d": days, "s": mem.session_id},
            )
        mems.append(mem)
    yield mems


def _ours(infos: list[Any], mems: list[AutoContextMemory]) -> list[str]:
    names = {m.session_id for m in mems}
    return [i.session_id for i in infos if i.session_id in names]


def test_purge_dry_run_then_for_real(aged: list[AutoContextMemory], search_db: str) -> None:
    old, middle, new = aged
    dry = purge_sessions("30d", search_db, dry_run=True)
    assert _ours(dry, aged) == [old.session_id]
    assert old.message_count() == 1  # still there
    by_tenant = purge_sessions("10d", search_db, tenant="beta", dry_run=True)
    assert _ours(by_tenant, aged) == [middle.session_id]
    gone = purge_sessions(timedelta(days=10), search_db, tenant="acme")
    assert _ours(gone, aged) == [old.session_id]
    with pytest.raises(SessionNotFound):
        old.messages()
    assert middle.messages()[0].text == "20 days" and new.messages()[0].text == "0 days"
    assert not sql(new, "SELECT 1 FROM messages WHERE session_id = :s", s=old.session_id)
    # Nothing is old enough any more but the beta one.
    later = purge_sessions("15d", search_db, now=datetime.now(UTC) + timedelta(seconds=1))
    assert _ours(later, aged) == [middle.session_id]


def test_purge_cli_and_bad_ages(aged: list[AutoContextMemory], search_db: str) -> None:
    result = invoke(["purge", "--older-than", "30d", "--dry-run", "-d", search_db])
    assert result.exit_code == 0, result.stderr
    assert aged[0].session_id in result.stdout and "would delete" in result.stdout
    assert aged[0].message_count() == 1
    result = invoke(["purge", "--older-than", "4w", "-d", search_db])
    assert result.exit_code == 0 and aged[0].session_id in result.stdout
    with pytest.raises(SessionNotFound):
        aged[0].messages()
    for bad in ("30", "-3d", "0d", "thirty days", "3y"):
        with pytest.raises(InvalidDuration):
            purge_sessions(bad, search_db)
    assert_one_line_error(
        invoke(["purge", "--older-than", "soon", "-d", search_db]), "cannot read the age"
    )
    assert aged[1].message_count() == 1


# ---------------------------------------------------------------------------------------------
# Database tenancy: a role granted one tenant
# ---------------------------------------------------------------------------------------------


def test_a_tenant_role_runs_the_lifecycle_on_its_own_sessions_only(
    open_mem: Opener, search_db: str, session_id: str, secret: str
) -> None:
    """A role granted tenant acme forks, exports, restores and purges acme's sessions and
    reaches nothing of globex's; it may not erase (its history is append-only for it): the
    tables' owner erases in acme's session."""
    foreign = open_mem(f"{session_id}-globex", tenant="globex")
    foreign.add(round_of(0, secret))
    foreign_fork = foreign.fork(f"{session_id}-globex-fork")
    foreign_rows = session_rows(foreign)
    with login_role(search_db) as role:
        assert grant_tenant(role.name, "acme", search_db)
        mem = AutoContextMemory.open(
            f"{session_id}-acme", role.url, CONFIG, tenant="acme", summarizer=OfflineSummarizer()
        )
        build(mem, 8, secret=secret, at=1)
        child = mem.fork(f"{session_id}-acme-fork")
        # The audit view of forks shows the role its own fork, and not globex's.
        forks = {r.session_id for r in sql(mem, "SELECT session_id FROM autoctx_forks")}
        assert child.session_id in forks and foreign_fork.session_id not in forks
        rows = session_rows(mem)
        with pytest.raises(ErasureNotPermitted, match="owner of autoctx's tables"):
            mem.erase([5, 6, 7, 8], reason="user request")
        assert session_rows(mem) == rows
        owner = AutoContextMemory.open(
            mem.session_id, search_db, tenant="acme", summarizer=OfflineSummarizer(), create=False
        )
        owner.erase([5, 6, 7, 8], reason="user request")
        exported = json.dumps(export_session(mem.session_id, role.url, tenant="acme"))
        assert secret not in exported and "user request" in exported
        document = export_session(child.session_id, role.url, tenant="acme")
        assert secret in json.dumps(document)  # the fork's own copy
        child.delete()
        import_session(document, role.url)
        assert export_session(child.session_id, role.url, tenant="acme") == document
        # Nothing of the other tenant, through any of them.
        for tenant in ("acme", "globex", None):
            with pytest.raises(SessionNotFound):
                export_session(foreign.session_id, role.url, tenant=tenant)
        with pytest.raises(SessionExists, match="cannot see"):
            mem.fork(foreign.session_id)
        later = datetime.now(UTC) + timedelta(minutes=1)
        listed = {
            s.session_id
            for s in purge_sessions("1s", role.url, tenant="acme", dry_run=True, now=later)
        }
        assert mem.session_id in listed and foreign.session_id not in listed
        # Without its tenant, a confined role sees no session at all (fail closed).
        assert purge_sessions("1s", role.url, dry_run=True, now=later) == []
        purge_sessions("1s", role.url, tenant="acme", now=later)
        with pytest.raises(SessionNotFound):
            mem.messages()
    assert session_rows(foreign) == foreign_rows


def test_forks_own_their_copies_and_are_named(open_mem: Opener, secret: str) -> None:
    mem = open_mem()
    build(mem, 6, secret=secret, at=1)
    child = mem.fork(f"{mem.session_id}-fork")
    grandchild = child.fork(f"{mem.session_id}-fork-fork")
    done = mem.erase([5, 6, 7, 8], reason="user request")
    assert done.forks == tuple(sorted([child.session_id, grandchild.session_id]))
    assert set(holding(mem.engine, secret)) >= {"messages.content"}  # the forks' copies
    for fork in (child, grandchild):
        assert fork.erase([5, 6, 7, 8], reason="user request").forks == (
            () if fork is grandchild else (grandchild.session_id,)
        )
        assert_valid_session(fork)
    assert holding(mem.engine, secret) == {}


def test_a_tombstone_keeps_no_name(open_mem: Opener, secret: str) -> None:
    """The participant name is free text the caller chose: it goes with the content."""
    mem = open_mem()
    mem.add([Msg.user(f"hello {secret}", name=f"agent_{secret}"), Msg.assistant("hi")])
    done = mem.erase([1], reason="user request")
    assert holding(mem.engine, secret) == {}
    (m,) = mem._store.load_messages(done.erased_ids).values()
    assert m.name is None and m.text == "[erased]"
    assert_valid_session(mem)


class _Thorough:
    """A summarizer that keeps as much of the transcript as its budget allows (as a thorough
    LLM does): a current-round summary ten thousand tokens long."""

    def summarize(self, request: SummaryRequest) -> SummaryResult:
        return SummaryResult(text=request.transcript[: request.char_budget or 4000], model="t")


def test_a_rewritten_summary_keeps_what_was_not_erased(open_mem: Opener, secret: str) -> None:
    """Erasing two tool outputs that a large current-round summary covered rewrites it without
    them and keeps the rest: within its own size, not the offline summarizer's default of a
    quarter of its input (a 9,040-token summary went down to 1,668 tokens before; now about
    8,000 to 7,000: S6 leaves the latest step out of its summary)."""
    config = AutoContextConfig(
        max_tokens=40000,
        msg_threshold=1000,
        large_payload_chars=100000,
        last_keep=2,
        min_tool_run=100,  # no tool-run summaries: the round stays whole for S6
        min_compress_tokens=300,
        # No masking, and room for a large S6 summary (S6's budget is at most the fold's).
        mask_min_chars=2**31 - 1,
        fold_budget_tokens=12_000,
    )
    mem = open_mem(summarizer=_Thorough(), config=config)
    mem.add([Msg.user("refactor the parser")])
    for i in range(12):
        mark = f" {secret}" if i in (0, 1) else ""
        mem.add(
            [
                Msg.assistant(
                    None, [ToolUseBlock(f"c{i}", "read_file", json.dumps({"path": f"/m{i}.py"}))]
                ),
                Msg.tool(
                    f"c{i}",
                    "\n".join(
                        f"{n:4d} def f{n}_{i}(x): return x * {n}  # w{i}x{n}{mark}"
                        for n in range(120)
                    ),
                ),
            ]
        )
        mem.compress_if_needed()
    (summary,) = [m for m in mem.messages() if m.kind == "current_round_summary"]
    assert summary.tokens is not None and summary.tokens > 7000
    assert secret in summary.text and "w2x" in summary.text  # it covers outputs 0 to 2 at least
    done = mem.erase([3, 5], reason="user request")  # the outputs of calls c0 and c1
    assert summary.id in done.rewritten_ids
    (after,) = [m for m in mem.messages() if m.id == summary.id]
    assert after.tokens is not None
    assert secret not in after.text and "w0x" not in after.text and "w1x" not in after.text
    assert "w2x" in after.text  # what was not erased stays
    print(f"summary tokens {summary.tokens} -> {after.tokens}")
    # It keeps most of its size: the erased outputs were two of the several it covered.
    assert summary.tokens * 0.7 <= after.tokens <= summary.tokens, (summary.tokens, after.tokens)
    assert holding(mem.engine, secret) == {}
    assert_valid_session(mem)


def test_a_fork_in_flight_when_an_erasure_runs_is_named(open_mem: Opener, secret: str) -> None:
    """A fork whose snapshot predates an erasure and that commits after it would keep the
    erased content unnamed: the erasure waits for it, then names it. The fork is held inside
    its transaction (copies written, not committed) while the erasure starts."""
    mem = open_mem()
    build(mem, 6, secret=secret, at=1)
    forker = open_mem()  # another memory object on the session, as another process has
    child_id = f"{mem.session_id}-inflight"
    in_fork, release = threading.Event(), threading.Event()

    def hold(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        # The fork's last copy (its working set), before its commit.
        if "INSERT INTO working_set" in statement and "%(child)s" in statement:
            in_fork.set()
            release.wait(30)

    sa.event.listen(forker.engine, "before_cursor_execute", hold)
    forked: list[AutoContextMemory] = []
    erased: list[Any] = []
    try:
        fork_thread = threading.Thread(target=lambda: forked.append(forker.fork(child_id)))
        fork_thread.start()
        assert in_fork.wait(30)
        erase_thread = threading.Thread(
            target=lambda: erased.append(mem.erase([5, 6, 7, 8], reason="user request"))
        )
        erase_thread.start()
        # The erasure either finishes (without waiting for the fork) or waits on a lock.
        deadline = time.monotonic() + 20
        while erase_thread.is_alive() and time.monotonic() < deadline:
            waiting = sql(
                mem,
                "SELECT count(*) AS n FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND wait_event = 'advisory' AND datname = current_database()",
            )[0].n
            if waiting:
                break
            time.sleep(0.05)
    finally:
        release.set()
        fork_thread.join(30)
        erase_thread.join(30)
        sa.event.remove(forker.engine, "before_cursor_execute", hold)
    (child,) = forked
    (done,) = erased
    assert done.forks == (child_id,)
    # The fork took its copies before the erasure: they hold the secret, and erasing the same
    # ids there, as the result says to, leaves none.
    assert "messages.content" in holding(mem.engine, secret)
    child.erase([5, 6, 7, 8], reason="user request")
    assert holding(mem.engine, secret) == {}
    assert_valid_session(child)


def test_the_fork_of_a_deleted_fork_is_named(open_mem: Opener, secret: str) -> None:
    """Forks record every session they descend from: deleting the middle fork of a chain does
    not hide its own fork from an erasure of the root."""
    mem = open_mem()
    build(mem, 6, secret=secret, at=1)
    child = mem.fork(f"{mem.session_id}-child")
    grandchild = child.fork(f"{mem.session_id}-grandchild")
    child.delete()
    done = mem.erase([5, 6, 7, 8], reason="user request")
    assert done.forks == (grandchild.session_id,)
    assert grandchild.erase([5, 6, 7, 8], reason="user request").forks == ()
    assert holding(mem.engine, secret) == {}


def _ask(mem: AutoContextMemory, call_id: str, tool: str, args: dict[str, Any]) -> int:
    """The model calls one of autoctx's context tools; the agent stores the call and the
    answer autoctx gave, as an agent loop does. Returns the answer's message id."""
    call = ToolUseBlock(call_id, tool, json.dumps(args))
    answer = mem.handle_tool_call(call)
    stored = mem.add([Msg.assistant(None, [call]), Msg.tool(call_id, answer)])
    assert stored[-1].id is not None
    return stored[-1].id


def test_context_tool_answers_that_quoted_erased_text_are_erased_and_named(
    open_mem: Opener, secret: str
) -> None:
    """autoctx's own answers to context_search and context_reload are copies of what they
    quoted: an erasure finds them (in this session and in another of the tenant), tombstones
    them with what derives from them, and names them; an answer that quoted other messages
    stays."""
    tenant = f"acme-{uuid.uuid4().hex[:8]}"  # the module's other sessions are not its own
    mem = open_mem(tenant=tenant)
    build(mem, 4, secret=secret, at=1)  # round 1: ids 5-8, the secret in each
    other = open_mem(f"{mem.session_id}-other", tenant=tenant)
    other.add([Msg.user("what did I do before?")])
    asked = [
        (mem.session_id, _ask(mem, "q1", "context_search", {"query": "task 1"})),
        (mem.session_id, _ask(mem, "q2", "context_reload", {"message_id": 7})),
        (
            other.session_id,
            _ask(other, "q3", "context_search", {"query": "look module 1", "scope": "tenant"}),
        ),
        (
            other.session_id,
            _ask(other, "q4", "context_reload", {"message_id": 6, "session_id": mem.session_id}),
        ),
    ]
    kept = _ask(other, "q5", "context_reload", {"message_id": 11, "session_id": mem.session_id})
    for sid, answer in asked:
        owner = mem if sid == mem.session_id else other
        (msg,) = owner._store.load_messages([answer]).values()
        assert secret in msg.tool_results[0].output_text, msg.tool_results[0].output_text
    assert "m2.py" in other._store.load_messages([kept])[kept].tool_results[0].output_text

    done = mem.erase([5, 6, 7, 8], reason="user request")

    assert done.answers == tuple(sorted(asked))
    assert holding(mem.engine, secret) == {}
    (still,) = other._store.load_messages([kept]).values()
    assert "m2.py" in still.tool_results[0].output_text  # quoted no erased message: kept
    # Each other session's answers went by an erasure event of its own, with the same reason.
    (event,) = [e for e in other.events() if e.reason == "erase"]
    assert event.replaced_ids == tuple(sorted(a for s, a in asked if s == other.session_id))
    for m in (mem, other):
        assert_valid_session(m)
    # The command names them too: erasing what the kept answer quoted takes it along.
    url = mem.engine.url.render_as_string(hide_password=False)
    result = invoke(["erase", mem.session_id, "11", "--reason", "x", "-d", url])
    assert result.exit_code == 0, result.stderr
    assert f"also erased 1 context-tool answer(s) that quoted it: {other.session_id!r} " in (
        result.stdout
    )


def test_two_erasures_that_reach_into_each_others_sessions_both_succeed(
    open_mem: Opener, secret: str
) -> None:
    """Each session holds an answer that quoted the other's message: erasing both at once
    locks the two sessions in opposite orders, PostgreSQL fails one to break the deadlock, and
    that one starts over. Erasure A is held just before it locks B, until B waits on A."""
    tenant = f"acme-{uuid.uuid4().hex[:8]}"
    a = open_mem(tenant=tenant)
    b = open_mem(f"{a.session_id}-b", tenant=tenant)
    for mem in (a, b):
        mem.add([Msg.user(f"note of {mem.session_id}: {secret}"), Msg.assistant("noted")])
    _ask(a, "ra", "context_reload", {"message_id": 1, "session_id": b.session_id})
    _ask(b, "rb", "context_reload", {"message_id": 1, "session_id": a.session_id})
    at_b, release = threading.Event(), threading.Event()

    def hold(conn: Any, cursor: Any, statement: str, parameters: Any, *args: Any) -> None:
        if (
            threading.current_thread().name == "erase-a"
            and "FROM sessions" in statement
            and isinstance(parameters, dict)
            and b.session_id in parameters.values()
        ):
            at_b.set()
            release.wait(30)

    sa.event.listen(a.engine, "before_cursor_execute", hold)
    results: dict[str, Any] = {}

    def erase(mem: AutoContextMemory, key: str) -> None:
        try:
            results[key] = mem.erase([1], reason="user request")
        except Exception as exc:  # the test reports what the erasure raised
            results[key] = exc

    first = threading.Thread(target=erase, args=(a, "a"), name="erase-a")
    second = threading.Thread(target=erase, args=(b, "b"), name="erase-b")
    try:
        first.start()
        assert at_b.wait(30)
        second.start()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            waiting = sql(
                a,
                "SELECT count(*) AS n FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database()",
            )[0].n
            if waiting:
                break
            time.sleep(0.05)
    finally:
        release.set()
        first.join(60)
        second.join(60)
        sa.event.remove(a.engine, "before_cursor_execute", hold)
    assert all(not isinstance(r, Exception) for r in results.values()), results
    assert sorted(results) == ["a", "b"]
    assert holding(a.engine, secret) == {}
    for mem in (a, b):
        assert_valid_session(mem)
