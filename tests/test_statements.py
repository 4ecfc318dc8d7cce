"""Shardable by session: every statement autoctx issues for a session filters on that one
session_id, and every key and index leads with it (docs/scaling.md relies on this test).

A full scenario runs with a listener on SQLAlchemy's `before_cursor_execute` (statement text and
bound parameters): open, add, every strategy of the ladder, a failed and a conflicting
compression, reload and the reload tool, events, set_plan, a tenant-scoped memory, delete.
Each statement that names a session table must pin every session table it reads or writes to a
bound parameter equal to the session id (directly, or through an equality join on session_id
with a table that is pinned), which is exactly what lets a sharded PostgreSQL (Citus) route it
to one shard. Statements that name no session table (connection set-up, schema version checks,
`set_config`) must be on a short known list.
"""

from __future__ import annotations

import dataclasses
import getpass
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from autoctx import (
    AutoContextClient,
    AutoContextConfig,
    AutoContextMemory,
    Msg,
    OfflineSummarizer,
    SummarizerError,
    SummaryRequest,
    SummaryResult,
    ToolUseBlock,
    UndoRefused,
)
from autoctx._store.tables import SESSION_TABLES
from tests.histories import SMALL, long_task, multi_round, one_heavy_round

TABLES = tuple(t.name for t in SESSION_TABLES)
_TABLE_RE = re.compile(r"\b(" + "|".join(TABLES) + r"|autoctx_\w+)\b")
#: A table reference: FROM/JOIN/UPDATE/INTO/DELETE FROM, the name, an optional alias.
_REF_RE = re.compile(
    r"\b(?:FROM|JOIN|UPDATE|INTO)\s+(\w+)(?:\s+(?:AS\s+)?(?!ON\b|WHERE\b|SET\b|JOIN\b|WITH\b|"
    r"ORDER\b|GROUP\b|LIMIT\b|FOR\b|VALUES\b|RETURNING\b|USING\b)(\w+))?",
    re.IGNORECASE,
)
_PIN_RE = re.compile(r"(?:(\w+)\.)?session_id\s*=\s*%\((\w+)\)s(?:::\w+)?", re.IGNORECASE)
_CALL_RE = re.compile(r"\b(autoctx_\w+)\(\s*%\((\w+)\)s", re.IGNORECASE)
_JOIN_RE = re.compile(r"(\w+)\.session_id\s*=\s*(\w+)\.session_id", re.IGNORECASE)
_ANY_SESSION_RE = re.compile(r"session_id\s*(?:=\s*ANY|IN\s*\(|<>|!=|<|>|LIKE)", re.IGNORECASE)
#: Statements that touch no session table, all of them per-connection or schema checks.
_GLOBAL_OK = (
    re.compile(r"^SELECT set_config\('autoctx\.tenant', %\(t\)s, true\)$"),
    re.compile(r"^select 1$", re.IGNORECASE),
    # Planner settings local to a transaction touch no data.
    re.compile(r"^SET LOCAL enable_nestloop = off$"),
    re.compile(r"alembic_version", re.IGNORECASE),
    re.compile(r"\bpg_catalog\b|\bcurrent_schema\(\)|^show \w+$|version\(\)", re.IGNORECASE),
)


@dataclass
class Captured:
    statement: str
    parameters: Any
    session_id: str


@dataclass
class Recorder:
    """Every statement of every engine while active, tagged with the session the scenario is
    working on at the time."""

    current: str = ""
    statements: list[Captured] = field(default_factory=list)

    def __call__(
        self,
        conn: Any,
        cursor: Any,
        statement: str,
        parameters: Any,
        context: Any,
        executemany: bool,
    ) -> None:
        self.statements.append(Captured(" ".join(statement.split()), parameters, self.current))


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    AutoContextClient.close_shared()  # so that connection set-up is captured too
    rec = Recorder()
    sa.event.listen(sa.engine.Engine, "before_cursor_execute", rec)
    try:
        yield rec
    finally:
        sa.event.remove(sa.engine.Engine, "before_cursor_execute", rec)


class FailOnce:
    """The offline summarizer, except that its first call fails (a `failed` event)."""

    def __init__(self) -> None:
        self.inner = OfflineSummarizer()
        self.calls = 0

    def summarize(self, request: SummaryRequest) -> SummaryResult:
        self.calls += 1
        if self.calls == 1:
            raise SummarizerError("http_error", "HTTP 500: scripted")
        return self.inner.summarize(request)


class RivalDuring:
    """The offline summarizer that lets a rival compress the same session mid-call (a
    `conflict` event for the loser)."""

    def __init__(self, rival: Callable[[], object]) -> None:
        self.inner = OfflineSummarizer()
        self.rival: Callable[[], object] | None = rival

    def summarize(self, request: SummaryRequest) -> SummaryResult:
        if self.rival is not None:
            rival, self.rival = self.rival, None
            rival()
        return self.inner.summarize(request)


def _small_steps(n: int) -> list[Msg]:
    msgs = [Msg.system("sys"), Msg.user("do it")]
    for s in range(n):
        msgs += [
            Msg.assistant(None, [ToolUseBlock(f"t{s}", "grep", '{"p": 1}')]),
            Msg.tool(f"t{s}", f"result line {s} " * 80),
        ]
    return msgs


def _scenario(db_url: str, rec: Recorder) -> set[int]:
    """Everything a session goes through; returns the strategies that applied."""
    applied: set[int] = set()
    tag = uuid.uuid4().hex[:6]

    def run(sid: str, msgs: list[Msg], config: AutoContextConfig, **kw: Any) -> AutoContextMemory:
        rec.current = sid
        mem = AutoContextMemory.open(
            sid, db_url, config, summarizer=kw.pop("summarizer", OfflineSummarizer()), **kw
        )
        mem.add(msgs)
        assert mem.needs_compression()
        for e in mem.compress_if_needed():
            if e.status == "applied":
                applied.add(e.strategy)
        return mem

    # S1 and S4, a failed summary, reload, the reload tool, events, plan, reading, delete.
    mem = run(
        f"st-ladder-{tag}",
        multi_round(1, rounds=4, steps=8),
        SMALL,
        summarizer=FailOnce(),
        tenant="acme",
    )
    events = mem.events()
    assert {"failed", "applied"} <= {e.status for e in events}
    offload = next(e.offload_uuid for e in events if e.offload_uuid is not None)
    mem.reload(str(offload))
    mem.handle_tool_call(
        {"id": "c", "function": {"name": "context_reload", "arguments": f'{{"uuid": "{offload}"}}'}}
    )
    mem.set_plan({"goal": "ship", "steps": [{"title": "fix", "state": "in_progress"}]})
    mem.to_openai()
    _ = (mem.token_count(), mem.message_count(), mem.version())
    mem.compress_if_needed()  # settled: nothing to do
    mem.delete()
    # The fold (no run long enough for S1; the previews of folded rounds give way to it).
    no_runs = dataclasses.replace(SMALL, min_tool_run=1000)
    run(f"st-fold-{tag}", multi_round(1, rounds=4, steps=8), no_runs)
    # S2: the large outputs of the one round (no fold).
    run(f"st-previews-{tag}", multi_round(2, rounds=1, steps=30), no_runs)
    # S4: one heavy previous round, no large output.
    heavy = dataclasses.replace(no_runs, large_payload_chars=100_000, max_tokens=2_900)
    round4 = run(f"st-round4-{tag}", one_heavy_round(8), heavy)
    # An undo (docs/design.md §7), one refused with where its replacement went, and a
    # compression that reads what undos took back.
    s4 = next(e for e in round4.events() if e.strategy == 4 and e.status == "applied")
    round4.undo(s4.id, force=True)
    with pytest.raises(UndoRefused):
        round4.undo(s4.id)
    round4.add(multi_round(9, rounds=1, steps=4)[1:])
    round4.compress_if_needed()
    # S3: large messages in the kept tail, before the latest answer (of the current round, so
    # that no fold takes them: previews give way to a fold whose range holds them).
    tail = dataclasses.replace(no_runs, last_keep=40, max_tokens=12000)
    run(f"st-tail-{tag}", multi_round(3, rounds=1, steps=10, big_every=1), tail)
    # S5 and S6: a long task under token pressure, with large and with small outputs.
    current = dataclasses.replace(SMALL, last_keep=1000, msg_threshold=1000)
    # (Few enough large outputs that S5's summaries reach the target: it does not give way.)
    large = dataclasses.replace(current, max_tokens=14_000)
    run(f"st-large-{tag}", long_task(2, steps=30, big_every=5), large)
    run(f"st-round-{tag}", _small_steps(60), dataclasses.replace(current, max_tokens=12000))
    # A conflict: a rival compresses the same session during the summary.
    sid = f"st-race-{tag}"
    rec.current = sid
    rival = AutoContextMemory.open(sid, db_url, SMALL, summarizer=OfflineSummarizer())
    loser = run(
        sid,
        multi_round(7, rounds=4, steps=8, big_every=10_000),
        SMALL,
        summarizer=RivalDuring(rival.compress_if_needed),
    )
    assert "conflict" in {e.status for e in loser.events()}
    # Reopening an existing session without a config, and with another one.
    AutoContextMemory.open(sid, db_url, create=False).messages()
    AutoContextMemory.open(sid, db_url, dataclasses.replace(SMALL, msg_threshold=70))
    return applied


def _pinned_aliases(c: Captured) -> tuple[set[str], set[str], list[str]]:
    """(aliases of session tables referenced, aliases pinned to this session, problems)."""
    problems: list[str] = []
    params = c.parameters if isinstance(c.parameters, Mapping) else {}
    refs: dict[str, str] = {}
    for m in _REF_RE.finditer(c.statement):
        table, alias = m.group(1), m.group(2)
        if table in TABLES or table.startswith("autoctx_"):
            refs[alias or table] = table
    pinned: set[str] = set()
    for m in _PIN_RE.finditer(c.statement):
        alias, param = m.group(1), m.group(2)
        if params.get(param) != c.session_id:
            problems.append(f"session_id compared with {param}={params.get(param)!r}")
        if alias is None:
            if len(refs) != 1:
                problems.append("unqualified session_id with several tables")
            pinned |= set(refs)
        else:
            pinned.add(alias)
    # A call of one of autoctx's functions whose first argument is the session id (Citus
    # routes such a call by that argument: `create_distributed_function(..., '$1')`).
    for m in _CALL_RE.finditer(c.statement):
        function, param = m.group(1), m.group(2)
        if params.get(param) != c.session_id:
            problems.append(f"{function} called for session {param}={params.get(param)!r}")
        else:
            pinned.add(function)
    # INSERT ... SELECT inside a statement (a data-modifying CTE): the inserted rows' session_id
    # (the first column) is the first selected value.
    for m in _INSERT_SELECT_ANY_RE.finditer(c.statement):
        table, param = m.group(1), m.group(2)
        if params.get(param) != c.session_id:
            problems.append(f"{table} rows inserted with session_id {param}={params.get(param)!r}")
        else:
            pinned.add(table)
    # Equality joins carry the pin from one table to another.
    joins = [(a, b) for a, b in _JOIN_RE.findall(c.statement)]
    changed = True
    while changed:
        changed = False
        for a, b in joins:
            if (a in pinned) != (b in pinned):
                pinned |= {a, b}
                changed = True
    if _ANY_SESSION_RE.search(c.statement):
        problems.append("a session_id predicate that is not one equality")
    return set(refs), pinned, problems


#: INSERT ... SELECT whose first column is session_id, alone or inside a statement.
_INSERT_SELECT_ANY_RE = re.compile(
    r"INSERT\s+INTO\s+(\w+)\s*\(\s*session_id\s*,[^)]*\)\s*SELECT\s+%\((\w+)\)s\s*,", re.I
)


def _insert_rows(c: Captured) -> Sequence[Mapping[str, Any]]:
    return c.parameters if isinstance(c.parameters, Sequence) else [c.parameters]


def _check(c: Captured) -> list[str]:
    """Why this statement is not routable to the shard of its session (empty: it is)."""
    if c.statement.upper().startswith("INSERT"):
        problems = []
        # INSERT ... SELECT: the session_id column (listed first) takes the first selected value.
        select_param = _INSERT_SELECT_ANY_RE.match(c.statement.lstrip())
        for row in _insert_rows(c):
            if select_param is not None:
                values = [row.get(select_param.group(2))]
            else:
                values = [v for k, v in row.items() if re.fullmatch(r"session_id(__\d+)?", k)]
            if not values or set(values) != {c.session_id}:
                problems.append(f"insert row with session_id {values!r}")
        return problems
    refs, pinned, problems = _pinned_aliases(c)
    if not refs:
        problems.append("names a session table but no table reference was recognized")
    if refs - pinned:
        problems.append(f"tables not pinned to the session: {sorted(refs - pinned)}")
    return problems


def test_every_statement_filters_on_one_session(db_url: str, recorder: Recorder) -> None:
    applied = _scenario(db_url, recorder)
    assert applied == {1, 2, 3, 4, 5, 6, 7}, applied
    session_statements = [c for c in recorder.statements if _TABLE_RE.search(c.statement)]
    global_statements = [c for c in recorder.statements if not _TABLE_RE.search(c.statement)]
    bad = {c.statement[:300]: p for c in session_statements if (p := _check(c))}
    assert not bad, "\n".join(f"{s}\n  -> {p}" for s, p in bad.items())
    unknown = {
        c.statement for c in global_statements if not any(r.search(c.statement) for r in _GLOBAL_OK)
    }
    assert not unknown, unknown
    distinct = {c.statement for c in session_statements}
    print(
        f"{len(recorder.statements)} statements captured, {len(session_statements)} on session "
        f"tables ({len(distinct)} distinct), every one pinned to its session"
    )
    assert len(distinct) >= 15, "the scenario should exercise most of the store"


@pytest.mark.parametrize(
    "statement, params, routable",
    [
        ("SELECT * FROM messages WHERE messages.session_id = %(s)s", {"s": "me"}, True),
        ("SELECT * FROM messages", {}, False),
        ("SELECT * FROM messages WHERE messages.session_id = %(s)s", {"s": "other"}, False),
        ("SELECT * FROM messages WHERE messages.session_id = ANY(%(s)s)", {"s": ["me"]}, False),
        (
            "SELECT * FROM working_set JOIN messages "
            "ON messages.session_id = working_set.session_id "
            "WHERE working_set.session_id = %(s)s",
            {"s": "me"},
            True,
        ),
        (
            "SELECT * FROM working_set JOIN messages ON messages.id = working_set.message_id "
            "WHERE working_set.session_id = %(s)s",
            {"s": "me"},
            False,
        ),
        (
            "INSERT INTO lineage (session_id, summary_id) VALUES (%(session_id)s, 1)",
            [{"session_id": "me"}],
            True,
        ),
        (
            "INSERT INTO working_set (session_id, position) SELECT %(sid)s, p FROM x",
            {"sid": "me"},
            True,
        ),
        (
            "INSERT INTO working_set (session_id, position) SELECT %(sid)s, p FROM x",
            {"sid": "other"},
            False,
        ),
        (
            "INSERT INTO lineage (session_id, summary_id) VALUES (%(session_id)s, 1)",
            [{"session_id": "me"}, {"session_id": "x"}],
            False,
        ),
        (
            "WITH s AS (UPDATE sessions SET version = 2 WHERE sessions.session_id = %(sid)s "
            "RETURNING version), m AS (INSERT INTO messages (session_id, id) "
            "SELECT %(sid)s, s.version FROM s) SELECT version FROM s",
            {"sid": "me"},
            True,
        ),
        (
            "WITH s AS (UPDATE sessions SET version = 2 WHERE sessions.session_id = %(sid)s "
            "RETURNING version), m AS (INSERT INTO messages (session_id, id) "
            "SELECT %(other)s, s.version FROM s) SELECT version FROM s",
            {"sid": "me", "other": "x"},
            False,
        ),
    ],
)
def test_the_checker_tells_routable_from_fan_out(
    statement: str, params: Any, routable: bool
) -> None:
    """The checker itself: it must reject what a sharded database could not route."""
    assert (not _check(Captured(statement, params, "me"))) is routable


# ---------------------------------------------------------------------------------------------
# The schema
# ---------------------------------------------------------------------------------------------


def _catalog(db_url: str, sql: str, **params: Any) -> list[Any]:
    engine = sa.create_engine(db_url, poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            return list(conn.execute(sa.text(sql), params))
    finally:
        engine.dispose()


def test_every_index_and_key_leads_with_session_id(db_url: str) -> None:
    rows = _catalog(
        db_url,
        "select c.relname as tbl, i.relname as idx, a.attname as first "
        "from pg_index x join pg_class c on c.oid = x.indrelid "
        "join pg_class i on i.oid = x.indexrelid "
        "join pg_attribute a on a.attrelid = c.oid and a.attnum = x.indkey[0] "
        "where c.relname = any(:t)",
        t=list(TABLES),
    )
    assert {r.tbl for r in rows} == set(TABLES)
    assert all(r.first == "session_id" for r in rows), [r for r in rows if r.first != "session_id"]


def test_every_foreign_key_between_session_tables_carries_session_id(db_url: str) -> None:
    """Citus colocates a foreign key only when it includes the distribution column."""
    rows = _catalog(
        db_url,
        "select conrelid::regclass::text as tbl, conname, "
        "(select attname from pg_attribute "
        " where attrelid = conrelid and attnum = conkey[1]) as col, "
        "(select attname from pg_attribute "
        " where attrelid = confrelid and attnum = confkey[1]) as ref "
        "from pg_constraint where contype = 'f' and conrelid::regclass::text = any(:t)",
        t=list(TABLES),
    )
    assert rows
    assert all((r.col, r.ref) == ("session_id", "session_id") for r in rows), rows


def test_no_global_sequence_and_every_view_exposes_session_id(db_url: str) -> None:
    sequences = _catalog(
        db_url, "select sequencename from pg_sequences where schemaname = current_schema()"
    )
    assert sequences == [], "ids are allocated per session; a global sequence would not shard"
    views = _catalog(
        db_url,
        "select c.relname, bool_or(a.attname = 'session_id') as has "
        "from pg_class c join pg_attribute a on a.attrelid = c.oid "
        "where c.relkind = 'v' and c.relname like 'autoctx\\_%' group by c.relname",
    )
    assert views and all(v.has for v in views), views


def test_row_level_security_policies_key_on_the_session(db_url: str) -> None:
    """The tenant policies of migration 0003 reach a row's tenant through its session_id (one
    primary-key probe on sessions, colocated with the row)."""
    rows = _catalog(
        db_url,
        "select c.relname, pg_get_expr(p.polqual, p.polrelid) as qual from pg_policy p "
        "join pg_class c on c.oid = p.polrelid where c.relname = any(:t)",
        t=list(TABLES),
    )
    assert {r.relname for r in rows} == set(TABLES)
    for r in rows:
        assert "autoctx.tenant" in r.qual
        if r.relname != "sessions":
            assert f"s.session_id = {r.relname}.session_id" in r.qual, r.qual


# ---------------------------------------------------------------------------------------------
# Transaction pooling (PgBouncer), when a pgbouncer binary is installed
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def pgbouncer(db_url: str) -> Iterator[str]:
    """A real PgBouncer in transaction mode in front of this module's database; yields the URL
    of the database through it. Skipped when no pgbouncer is installed (it is optional)."""
    binary = shutil.which("pgbouncer")
    if binary is None:
        pytest.skip("pgbouncer is not installed")
    url = make_url(db_url)
    host = url.host or str(url.query.get("host") or "")
    port = url.port or int(str(url.query.get("port") or 5432))
    user = url.username or getpass.getuser()
    # pgbouncer refuses to run as root; it then runs as `nobody`, which must read its files.
    workdir = Path(tempfile.mkdtemp(prefix="autoctx-pgbouncer-"))
    workdir.chmod(0o777)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        listen_port = s.getsockname()[1]
    (workdir / "users.txt").write_text(f'"{user}" ""\n')
    (workdir / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host={host} port={port}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {listen_port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {workdir / 'users.txt'}\n"
        "pool_mode = transaction\ndefault_pool_size = 4\nmax_client_conn = 100\n"
        f"logfile = {workdir / 'pgbouncer.log'}\n"
        "ignore_startup_parameters = extra_float_digits,options\n"
    )
    for f in workdir.iterdir():
        f.chmod(0o666)
    # As root it must switch user: to the owner of the server's socket directory when the
    # server listens on a Unix socket (the embedded one does, in a private directory).
    as_root: list[str] = []
    if os.geteuid() == 0:
        owner = pwd.getpwuid(Path(host).stat().st_uid).pw_name if host.startswith("/") else ""
        as_root = ["-u", owner if owner and owner != "root" else "nobody"]
    proc = subprocess.Popen(
        [binary, *as_root, str(workdir / "pgbouncer.ini")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    pooled = url.set(host="127.0.0.1", port=listen_port, username=user).difference_update_query(
        ["host", "port"]
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                engine = sa.create_engine(
                    pooled, poolclass=sa.NullPool, connect_args={"connect_timeout": 3}
                )
                with engine.connect() as conn:
                    conn.execute(sa.text("select 1"))
                engine.dispose()
                break
            except sa.exc.OperationalError as exc:
                if time.monotonic() > deadline or proc.poll() is not None:
                    log = (
                        (workdir / "pgbouncer.log").read_text()
                        if (workdir / "pgbouncer.log").exists()
                        else ""
                    )
                    pytest.skip(f"pgbouncer could not serve this server: {exc.orig} {log[-500:]}")
                time.sleep(0.1)
        yield pooled.render_as_string(hide_password=False)
    finally:
        AutoContextClient.close_shared()
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


def test_transaction_pooling_through_pgbouncer(pgbouncer: str) -> None:
    """Six threads share a pool of four server connections, each one opening, filling and
    compressing memories: statements of one client land on many server connections."""
    url = pgbouncer + ("&" if "?" in pgbouncer else "?") + "prepare_threshold=none"
    config = SMALL
    errors: list[str] = []

    def work(k: int) -> None:
        try:
            for r in range(2):
                mem = AutoContextMemory.open(
                    f"pool-{k}-{r}-{uuid.uuid4().hex[:6]}",
                    url,
                    config,
                    auto_upgrade=False,
                    summarizer=OfflineSummarizer(),
                    tenant="pooled",
                )
                mem.add(multi_round(k * 10 + r, rounds=4, steps=8))
                assert [e for e in mem.compress_if_needed() if e.status == "applied"]
                mem.events()
                mem.to_openai()
        except Exception as exc:  # collected: a thread's exception would otherwise be lost
            errors.append(f"{type(exc).__name__}: {exc}"[:300])

    threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
