"""The persistent core against real PostgreSQL: append, load, totals, restart, bad input."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

import autoctx._store.store
from autoctx import (
    AsyncAutoContextMemory,
    AutoContextClient,
    AutoContextConfig,
    AutoContextMemory,
    ConfigError,
    DatabaseUnavailable,
    InvalidArgument,
    InvalidMessage,
    InvalidPage,
    InvalidSessionId,
    InvalidTenant,
    Msg,
    OfflineSummarizer,
    SessionNotFound,
    ToolUseBlock,
)
from autoctx._memory import internals
from tests.dbsql import sql
from tests.invariants import recount
from tests.test_messages import drop_none, varied_conversation

pytestmark = pytest.mark.embedded

Open = Callable[..., AutoContextMemory]


def test_add_and_load_round_trip(open_memory: Open) -> None:
    mem = open_memory()
    stored = mem.add(varied_conversation())
    assert [m.id for m in stored] == list(range(1, len(stored) + 1))
    assert drop_none(mem.to_openai()) == drop_none(varied_conversation())
    assert mem.message_count() == len(varied_conversation())


def test_round_trip_survives_a_new_process(open_memory: Open, db_url: str, session_id: str) -> None:
    mem = open_memory()
    mem.add(varied_conversation())
    mem.close()
    script = (
        "import json, sys\n"
        "from autoctx import AutoContextMemory\n"
        "mem = AutoContextMemory.open(sys.argv[1], sys.argv[2], create=False)\n"
        "print(json.dumps({'messages': mem.to_openai(), 'tokens': mem.token_count(),"
        " 'count': mem.message_count()}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, session_id, db_url],
        capture_output=True,
        text=True,
        check=True,
    )
    data = json.loads(out.stdout)
    assert drop_none(data["messages"]) == drop_none(varied_conversation())
    reopened = open_memory()
    assert data["tokens"] == reopened.token_count() == recount(reopened)
    assert data["count"] == len(varied_conversation())


def test_totals_equal_a_recount_after_many_appends(open_memory: Open) -> None:
    mem = open_memory()
    for i in range(20):
        mem.add([Msg.user(f"question {i} " * (i + 1)), Msg.assistant(f"answer {i}")])
    assert mem.message_count() == 40
    assert mem.token_count() == recount(mem)


def test_needs_compression_reads_only_the_session_row(open_memory: Open) -> None:
    mem = open_memory(config=AutoContextConfig(msg_threshold=3))
    mem.add([Msg.user("a"), Msg.assistant("b")])
    statements: list[str] = []

    def capture(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    sa.event.listen(mem.engine, "before_cursor_execute", capture)
    try:
        assert mem.needs_compression() is False
        mem.add(Msg.user("c"))
        statements.clear()
        assert mem.needs_compression() is True
    finally:
        sa.event.remove(mem.engine, "before_cursor_execute", capture)
    assert len(statements) == 1, statements
    sql = statements[0]
    assert "FROM sessions" in sql and "WHERE sessions.session_id =" in sql
    assert "messages" not in sql.split("FROM", 1)[1]


def test_rejected_batch_stores_nothing(open_memory: Open) -> None:
    mem = open_memory()
    mem.add(Msg.user("keep me"))
    before = (mem.message_count(), mem.token_count(), mem.version())
    with pytest.raises(InvalidMessage, match="message 2"):
        mem.add([Msg.user("one"), Msg.assistant("two"), {"role": "wizard", "content": "x"}])
    with pytest.raises(InvalidMessage, match="answers no open call"):
        mem.add([Msg.assistant("ok"), Msg.tool("nope", "x")])
    assert (mem.message_count(), mem.token_count(), mem.version()) == before
    assert [m.text for m in mem.messages()] == ["keep me"]
    n = sql(mem, "select count(*) from messages where session_id = :s", s=mem.session_id)[0][0]
    assert n == 1


def test_open_calls_persist_across_adds_and_processes(open_memory: Open) -> None:
    mem = open_memory()
    mem.add(Msg.assistant(None, [ToolUseBlock("c1", "ls")]))
    mem.close()
    again = open_memory()
    with pytest.raises(InvalidMessage, match="still unanswered"):
        again.add(Msg.user("skip it"))
    again.add(Msg.tool("c1", "a.py b.py"))
    assert again.messages()[-1].tool_results[0].name == "ls"


@pytest.mark.parametrize(
    ("session_id", "fragment"),
    [("", "empty"), ("x" * 256, "256 characters"), ("a\x00b", "NUL"), ("bad\ud800", "surrogate")],
)
def test_bad_session_ids_are_refused(db_url: str, session_id: str, fragment: str) -> None:
    with pytest.raises(InvalidSessionId, match=fragment):
        AutoContextMemory.open(session_id, db_url)


def test_unreachable_database_gives_one_clear_line() -> None:
    url = "postgresql+psycopg://nobody@127.0.0.1:1/nowhere"
    with pytest.raises(DatabaseUnavailable) as err:
        AutoContextMemory.open("s", url)
    message = str(err.value)
    assert "127.0.0.1:1" in message and "AUTOCTX_DATABASE_URL" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("bad", "error", "fragment"),
    [
        ({"session_id": ""}, InvalidSessionId, "empty"),
        ({"tenant": "a\x00b"}, InvalidTenant, "NUL"),
        ({"background": "thread"}, ConfigError, "background"),
        ({"config": {"max_tokens": 1000}}, ConfigError, "AutoContextConfig"),
        ({"options": {"strict": True}}, ConfigError, "RuntimeOptions"),
        ({"hooks": [print]}, ConfigError, "CompressionHooks"),
    ],
    ids=["session_id", "tenant", "background", "config", "options", "hooks"],
)
def test_each_argument_of_open_is_checked_before_anything_connects(
    bad: dict[str, Any], error: type[Exception], fragment: str
) -> None:
    """The sync and the async open refuse a bad argument with its own error, not with the
    unreachable database's: they check what they are given before they connect."""
    url = "postgresql+psycopg://nobody@127.0.0.1:1/nowhere"
    kwargs: dict[str, Any] = {"session_id": "s", **bad}
    with pytest.raises(error, match=fragment):
        AutoContextMemory.open(database_url=url, **kwargs)
    with pytest.raises(error, match=fragment):
        asyncio.run(AsyncAutoContextMemory.open(database_url=url, **kwargs))


def test_open_without_create_on_unknown_session(db_url: str) -> None:
    with pytest.raises(SessionNotFound, match="does not exist"):
        AutoContextMemory.open("never-made", db_url, create=False)


def test_sessions_of_other_tenants_look_unknown(open_memory: Open, session_id: str) -> None:
    mem = open_memory(tenant="acme")
    mem.add(Msg.user("secret"))
    with pytest.raises(SessionNotFound):
        open_memory(tenant="globex", create=False)
    with pytest.raises(SessionNotFound):
        open_memory(tenant="globex")


def test_delete_removes_everything_of_the_session(open_memory: Open) -> None:
    mem = open_memory()
    mem.add([Msg.user("a"), Msg.assistant("b")])
    sid = mem.session_id
    mem.delete()
    other = open_memory(sid="someone-else")
    for table in ("messages", "working_set", "sessions"):
        assert sql(other, f"select count(*) from {table} where session_id = :s", s=sid)[0][0] == 0


def test_the_async_twin_runs_the_same_code(db_url: str, session_id: str) -> None:
    async def scenario() -> tuple[int, list[dict[str, Any]]]:
        async with await AsyncAutoContextMemory.open(session_id, db_url) as mem:
            await mem.add([Msg.user("hi"), Msg.assistant("hello")])
            return await mem.message_count(), await mem.to_openai()

    count, messages = asyncio.run(scenario())
    assert count == 2
    assert messages == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
    ]


def test_the_no_read_trigger_check_follows_the_totals_of_the_memorys_own_append(
    open_memory: Open,
) -> None:
    mem = open_memory(config=AutoContextConfig(msg_threshold=3))
    mem.add([Msg.user("a"), Msg.assistant("b")])  # the first append: the locking path
    assert not internals(mem).appended_over_trigger() and not mem.needs_compression()
    mem.add(Msg.user("c"))  # one statement; the trigger (3 messages) now holds
    assert internals(mem).appended_over_trigger() and mem.needs_compression()


def test_the_async_twin_covers_every_public_method() -> None:
    """A method added to the memory must get its async twin (they are written by hand)."""

    def public(cls: type) -> set[str]:
        return {n for n in vars(cls) if not n.startswith("_")}

    sync_only = {"engine", "summarizer"}  # plain objects, no I/O to await
    assert public(AutoContextMemory) - sync_only <= public(AsyncAutoContextMemory)


def test_the_async_twin_pops_and_answers_reloads(db_url: str, session_id: str) -> None:
    async def scenario() -> tuple[Msg | None, int, str, int]:
        async with await AsyncAutoContextMemory.open(session_id, db_url) as mem:
            await mem.add([Msg.user("hi"), Msg.assistant("hello")])
            popped = await mem.pop_last()
            call = {"function": {"name": "context_reload", "arguments": '{"uuid": ""}'}}
            answer = await mem.handle_tool_call(call)
            return popped, (await mem.refresh()).message_count, answer, await mem.version()

    popped, count, answer, version = asyncio.run(scenario())
    assert popped is not None and popped.text == "hello"
    assert count == 1
    assert "uuid" in answer and version >= 2


def test_reopening_without_a_config_keeps_the_sessions_thresholds(open_memory: Open) -> None:
    custom = AutoContextConfig(msg_threshold=7, max_tokens=9000, model="gpt-4")
    open_memory(config=custom).close()
    again = open_memory()
    assert again.config == custom
    assert again._counter.encoding_name == "cl100k_base"
    # A later config is recorded as the thresholds in force, but the model stays fixed.
    later = open_memory(config=AutoContextConfig(msg_threshold=11))
    assert later.config.msg_threshold == 11 and later.config.model == "gpt-4"
    stored = sql(later, "select config from sessions where session_id = :s", s=later.session_id)[0][
        0
    ]
    assert stored["msg_threshold"] == 11 and stored["model"] == "gpt-4"


@pytest.mark.parametrize("tenant", ["", "  "])
def test_an_empty_tenant_is_refused(db_url: str, tenant: str) -> None:
    with pytest.raises(InvalidSessionId, match="not a tenant name"):
        AutoContextMemory.open("s-empty-tenant", db_url, tenant=tenant)


def test_pop_last_takes_the_last_message_out_and_keeps_the_original(open_memory: Open) -> None:
    mem = open_memory()
    mem.add([Msg.user("q"), Msg.assistant(None, [ToolUseBlock("c1", "ls")]), Msg.tool("c1", "a b")])
    before = mem.version()
    popped = mem.pop_last()
    assert popped is not None and popped.tool_results[0].tool_use_id == "c1"
    assert [m.role for m in mem.messages()] == ["user", "assistant"]
    assert mem.version() == before + 1 and mem.token_count() == recount(mem)
    # The popped result reopened its call: the shape rules hold again.
    with pytest.raises(InvalidMessage, match="still unanswered"):
        mem.add(Msg.user("skip"))
    mem.add(Msg.tool("c1", "a b c"))
    (event,) = [e for e in mem.events() if e.strategy == 0]
    assert (event.status, event.reason, event.replaced_ids) == ("applied", "manual", (popped.id,))
    stored = sql(mem, "select count(*) from messages where session_id = :s", s=mem.session_id)
    assert stored[0][0] == 4  # the popped original is still stored
    assert open_memory(sid="empty-session").pop_last() is None


def test_a_split_remainder_takes_the_final_answer_flag_of_the_kinds_table(
    open_memory: Open,
) -> None:
    """The store writes the `final` the pure rule (`stand_in`) decided: the rest of a final
    answer is a final answer, the rest of a tool call is not."""
    mem = open_memory()
    mem.add([Msg.user("q"), Msg.assistant("first part. second part.")])
    popped = mem.pop_last(lambda last: Msg.assistant("first part."))
    assert popped is not None and popped.text == "first part. second part."
    mem.add(
        [
            Msg.user("again"),
            Msg.assistant("look", [ToolUseBlock("c1", "ls"), ToolUseBlock("c2", "pwd")]),
        ]
    )
    mem.pop_last(lambda last: Msg.assistant("look", [ToolUseBlock("c1", "ls")]))
    rows = sql(
        mem,
        "select m.content->0->>'text', m.final from working_set w join messages m "
        "on m.session_id = w.session_id and m.id = w.message_id "
        "where w.session_id = :s and m.role = 'assistant' order by w.position",
        s=mem.session_id,
    )
    assert [(text, final) for text, final in rows] == [("first part.", True), ("look", False)]
    assert mem.token_count() == recount(mem)


def test_a_session_store_works_on_one_session_and_the_catalog_across_them(
    open_memory: Open, session_id: str
) -> None:
    """Each memory holds the store of its own session (no session id on its calls); what spans
    sessions is the catalog's, which binds to none and keeps nothing."""
    from autoctx._store.catalog import Catalog
    from autoctx._store.store import SessionStore

    first = open_memory(sid=f"{session_id}-one")
    second = open_memory(sid=f"{session_id}-two")
    first.add(Msg.user("one"))
    second.add([Msg.user("two"), Msg.assistant("2")])
    assert (first._store.session_id, second._store.session_id) == (
        first.session_id,
        second.session_id,
    )
    assert [m.text for m in first._store.load_working()] == ["one"]
    catalog = Catalog(first.engine)
    listed = catalog.list_sessions(prefix=f"{session_id}-")
    assert sorted((s.session_id, s.message_count) for s in listed) == [
        (first.session_id, 1),
        (second.session_id, 2),
    ]
    found = catalog.session(second.session_id)
    assert found is not None and found.incarnation == second._store.incarnation()
    second.delete()
    assert catalog.session(second.session_id) is None
    assert [s.session_id for s in catalog.list_sessions(prefix=f"{session_id}-")] == [
        first.session_id
    ]
    unknown = SessionStore(first.engine, f"{session_id}-never")
    assert unknown.get_session() is None
    with pytest.raises(SessionNotFound, match="does not exist"):
        unknown.incarnation()
    assert first.messages()[0].text == "one"


def test_a_memory_appends_in_one_statement_after_its_own_write(open_memory: Open) -> None:
    mem = open_memory()
    mem.add(Msg.user("first"))  # the store does not know the session's version yet: locked path
    statements: list[str] = []

    def capture(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    sa.event.listen(mem.engine, "before_cursor_execute", capture)
    try:
        mem.add([Msg.assistant("second"), Msg.user("third")])
    finally:
        sa.event.remove(mem.engine, "before_cursor_execute", capture)
    data = [s for s in statements if s.strip() != "select 1"]
    assert len(data) == 1 and "FOR UPDATE" not in data[0], data
    assert [m.text for m in mem.messages()] == ["first", "second", "third"]
    assert mem.token_count() == recount(mem)


def test_appends_interleaved_from_two_memories_fall_back_and_keep_order(open_memory: Open) -> None:
    a, b = open_memory(), open_memory()
    a.add(Msg.user("1"))
    a.add(Msg.assistant("2"))  # a's one-statement path
    b.add(Msg.user("3"))  # b's first write moves the version under a
    a.add(Msg.assistant("4"))  # a's guard fails: the locked path appends after 3
    b.add(Msg.user("5"))
    assert [m.text for m in a.messages()] == ["1", "2", "3", "4", "5"]
    assert [m.id for m in a.messages()] == [1, 2, 3, 4, 5]
    assert a.token_count() == recount(a) and a.message_count() == 5
    # A batch that is only invalid against a stale view is judged against the truth.
    a.add(Msg.assistant(None, [ToolUseBlock("c9", "ls")]))
    b.add(Msg.tool("c9", "done"))  # b learns the open call from the locked path
    assert a.messages()[-1].tool_results[0].name == "ls"


@pytest.mark.parametrize("as_texts", [False, True], ids=["one-json", "array-of-texts"])
def test_a_big_batch_after_its_own_write_is_one_statement(
    open_memory: Open, monkeypatch: pytest.MonkeyPatch, as_texts: bool
) -> None:
    """The batch travels as one JSON parameter (its content spliced in as the JSON it is), or
    past `LARGE_BATCH_CHARS` as an array of its rows' JSON texts (one jsonb value holds at most
    256 MB), so even a batch of large messages, with quotes, backslashes and non-ASCII text,
    is appended in one statement, and read back exactly."""
    if as_texts:
        monkeypatch.setattr(autoctx._store.store, "LARGE_BATCH_CHARS", 0)
    mem = open_memory()
    mem.add(Msg.user("first"))
    statements: list[str] = []

    def capture(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    tricky = 'quote " backslash \\ brace { comma , é 漢字 \n'
    big = [
        Msg.user(tricky * 2_000, name=tricky, pinned=True),
        Msg.assistant("b" * 40_000, metadata={"k": tricky, "n": [1.5, None, True]}),
        Msg.assistant(
            None, [ToolUseBlock('c"1', "l{s}", '{"q": "\\\\"}'), ToolUseBlock("c2", "ls")]
        ),
        Msg.tool('c"1', tricky),
        Msg.tool("c2", "two"),
        Msg.assistant("done"),
    ]
    sa.event.listen(mem.engine, "before_cursor_execute", capture)
    try:
        mem.add(big)
    finally:
        sa.event.remove(mem.engine, "before_cursor_execute", capture)
    data = [s.strip() for s in statements if s.strip() != "select 1"]
    assert len(data) == 1 and data[0].startswith("WITH s AS"), data
    back = mem.messages()
    assert [m.text for m in back[:3]] == ["first", tricky * 2_000, "b" * 40_000]
    assert back[1].name == tricky and back[1].pinned and not back[2].pinned
    assert back[2].metadata == {"k": tricky, "n": [1.5, None, True]}
    assert [m.to_openai() for m in back[1:]] == [m.to_openai() for m in big]
    rows = sql(
        mem,
        "select call_ids, result_ids, tool_names, final, kind, tokens, chars from messages "
        "where session_id = :s order by id",
        s=mem.session_id,
    )
    assert [(r.call_ids, r.result_ids, r.tool_names) for r in rows[3:6]] == [
        (['c"1', "c2"], [], ["l{s}", "ls"]),
        ([], ['c"1'], ["l{s}"]),
        ([], ["c2"], ["ls"]),
    ]
    # An assistant message without calls is a final answer (docs/design.md §1).
    assert [r.final for r in rows] == [False, False, True, False, False, False, True]
    assert {r.kind for r in rows} == {"original"}
    assert [r.tokens for r in rows] == [m.tokens for m in back]
    assert [r.chars for r in rows[1:]] == [m.payload_chars for m in big]
    assert mem.token_count() == recount(mem)


def test_originals_are_every_message_as_given_in_order(
    open_memory: Open, db_url: str, session_id: str
) -> None:
    """`originals()` is the record a framework reads back as its history: every message as
    given, in order, whatever a compression, a pop or a clear did to the working context."""
    mem = open_memory(config=AutoContextConfig(max_tokens=2_000), summarizer=OfflineSummarizer())
    given = [Msg.user(f"note {n}: " + "detail " * 60) for n in range(12)]
    for msg in given:
        mem.add(msg)
    mem.compress_if_needed()
    mem.clear()
    mem.add(Msg.user("after the clear"))
    assert mem.events() and len(mem.messages()) == 1
    texts = [m.text for m in mem.originals()]
    assert texts == [m.text for m in given] + ["after the clear"]
    assert [m.text for m in mem.originals(offset=11, limit=1)] == [given[11].text]
    with pytest.raises(InvalidPage, match="originals: limit"):
        mem.originals(limit=0)
    # And the client lists sessions by tenant and id prefix.
    client = AutoContextClient.shared(db_url)
    assert [i.session_id for i in client.sessions(prefix=session_id)] == [session_id]
    assert client.sessions(tenant="nobody-here", prefix=session_id) == []
    with pytest.raises(InvalidArgument, match="prefix must be a string"):
        client.sessions(prefix=3)  # type: ignore[arg-type]
