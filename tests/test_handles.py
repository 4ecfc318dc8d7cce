"""Offload handles (docs/design.md §4): the short number an offload tag shows the model, given
per session in the transaction that applies the compression, accepted wherever an offload id
is, and given to the offloads of sessions written before handles by migration 0015."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command

from autoctx import (
    AutoContextMemory,
    Msg,
    OfflineSummarizer,
    OffloadNotFound,
    export_session,
    import_session,
)
from autoctx._intake import count_tokens
from autoctx._store.database import alembic_config, create_engine, normalize_url, upgrade
from autoctx._store.rows import msg_from_columns
from autoctx._tags import OFFLOAD_TAG_RE, tag_ids
from autoctx._tokens import TokenCounter
from autoctx._transcript import render_transcript
from tests.dbsql import handle_of, sql
from tests.invariants import (
    assert_every_handle_reloads,
    assert_totals_match,
    assert_valid_openai_chat,
    originals,
)
from tests.lifecycle import CONFIG, build, round_of
from tests.test_cli import invoke

Opener = Callable[..., AutoContextMemory]


def _offloads(mem: AutoContextMemory) -> list[Any]:
    return sql(
        mem,
        "select o.uuid, o.handle, o.event_id, o.message_ids from offloads o "
        "where o.session_id = :s order by o.event_id",
        s=mem.session_id,
    )


def _next_handle(mem: AutoContextMemory) -> int:
    (row,) = sql(mem, "select next_handle from sessions where session_id = :s", s=mem.session_id)
    return int(row.next_handle)


def _reach_by_tags(mem: AutoContextMemory) -> set[int]:
    """The message ids the tags lead to from the working context, whatever form each tag has
    (a handle, or a uuid of a tag written before handles)."""
    frontier = mem.messages()
    reached = {m.id for m in frontier if m.id is not None}
    seen: set[str] = set()
    while frontier:
        msg = frontier.pop()
        for tag in tag_ids(render_transcript([msg], keep_tags=True)):
            if tag in seen:
                continue
            seen.add(tag)
            for m in mem.reload(int(tag) if tag.isdigit() else tag):
                assert m.id is not None
                reached.add(m.id)
                frontier.append(m)
    return reached


def test_handles_are_per_session_numbers_given_in_order(open_memory: Opener) -> None:
    mem = open_memory(config=CONFIG)
    build(mem, 10)
    rows = _offloads(mem)
    assert len(rows) >= 3, "the build should compress several times"
    handles = [r.handle for r in rows]
    # Given in the order the offloads were applied, each once; the counter is past them all.
    assert handles == sorted(handles) and len(set(handles)) == len(handles)
    assert handles[0] == 1 and _next_handle(mem) == handles[-1] + 1
    for r in rows:
        assert [m.id for m in mem.reload(r.handle)] == list(r.message_ids)
        assert mem.reload(r.handle) == mem.reload(r.uuid) == mem.reload(f"offload {r.handle}")
    # Another session numbers its own from 1: a handle is unique within its session only.
    other = open_memory(f"{mem.session_id}-other", config=CONFIG)
    build(other, 6)
    theirs = _offloads(other)[0]
    assert theirs.handle == 1 and theirs.uuid != rows[0].uuid
    assert other.reload(1) == other.reload(theirs.uuid)
    with pytest.raises(OffloadNotFound):
        other.reload(str(rows[0].uuid))
    # The database keeps them unique.
    with pytest.raises(sa.exc.IntegrityError), mem.engine.begin() as conn:
        conn.execute(
            sa.text(
                "insert into offloads (session_id, uuid, handle, event_id, message_ids) "
                "values (:s, :u, :h, :e, '{1}')"
            ),
            {"s": mem.session_id, "u": uuid.uuid4(), "h": rows[0].handle, "e": rows[0].event_id},
        )
    assert_every_handle_reloads(mem)


def test_clearing_offloads_under_the_next_handle(open_memory: Opener) -> None:
    mem = open_memory(config=CONFIG)
    build(mem, 6)
    working = [m.id for m in mem.messages()]
    before = _next_handle(mem)
    event = mem.clear()
    assert handle_of(mem, event.offload_uuid) == before and _next_handle(mem) == before + 1
    assert [m.id for m in mem.reload(before)] == working
    build(mem, 6)
    assert min(r.handle for r in _offloads(mem) if r.handle > before) == before + 1


def test_search_hits_name_the_handle_and_the_tool_answer_reloads_by_it(
    open_memory: Opener,
) -> None:
    mem = open_memory(config=CONFIG)
    build(mem, 10)
    hits = [h for h in mem.search("module", limit=20) if h.offload_uuid is not None]
    assert hits, "the build compresses the early rounds: their originals are offloaded"
    for hit in hits:
        assert hit.offload_handle == handle_of(mem, hit.offload_uuid)
        assert hit.message_id in [m.id for m in mem.reload(hit.offload_handle)]
    # The first round's request: compressed long ago.
    args = json.dumps({"query": '"look at module 0"'})
    answer = mem.handle_tool_call({"function": {"name": "context_search", "arguments": args}})
    suggested = [json.loads(s) for s in _suggested_offloads(answer)]
    assert suggested and all(set(s) == {"offload"} for s in suggested)
    reloaded = mem.handle_tool_call(
        {"function": {"name": "context_reload", "arguments": json.dumps(suggested[0])}}
    )
    assert not reloaded.startswith(("No offloaded", "Invalid", "Missing"))


def _suggested_offloads(answer: str) -> list[str]:
    """The `context_reload` arguments a search answer gives for the offloads of its hits."""
    out = []
    for line in answer.splitlines():
        if " or {" in line:
            out.append("{" + line.split(" or {", 1)[1].split("}", 1)[0] + "}")
    return out


def test_a_fork_reloads_its_parents_handles_and_numbers_on(open_memory: Opener) -> None:
    parent = open_memory(config=CONFIG)
    build(parent, 10)
    child = parent.fork(f"{parent.session_id}-child")
    tags = [t for m in child.messages() for t in tag_ids(render_transcript([m], keep_tags=True))]
    assert tags and all(t.isdigit() for t in tags)
    for tag in tags:
        assert child.reload(int(tag)) == parent.reload(int(tag))
    assert _next_handle(child) == _next_handle(parent)
    for i in range(10, 16):
        child.add(round_of(i))
        child.compress_if_needed()
    new = [r.handle for r in _offloads(child) if r.handle >= _next_handle(parent)]
    assert new, "the child compressed on its own"
    assert_every_handle_reloads(child)
    assert_every_handle_reloads(parent)


def test_export_and_import_keep_the_handles_and_an_older_document_gets_them(
    open_memory: Opener, db_url: str, session_id: str
) -> None:
    mem = open_memory(config=CONFIG)
    build(mem, 10)
    document = export_session(mem.session_id, db_url)
    assert {o["handle"] for o in document["offloads"]} == {r.handle for r in _offloads(mem)}
    assert document["session"]["next_handle"] == _next_handle(mem)
    copy_id = f"{session_id}-copy"
    document["session"]["session_id"] = copy_id
    import_session(document, db_url)
    copy = open_memory(copy_id, config=CONFIG)
    assert_every_handle_reloads(copy)
    # A document written before handles: none in it. The import numbers the offloads by event,
    # as the migration numbers stored ones, and every tag still reloads the same messages.
    older = json.loads(json.dumps(document))
    older["session"]["session_id"] = f"{session_id}-older"
    del older["session"]["next_handle"]
    for o in older["offloads"]:
        del o["handle"]
    import_session(older, db_url)
    restored = open_memory(f"{session_id}-older", config=CONFIG)
    rows = _offloads(restored)
    assert [r.handle for r in rows] == list(range(1, len(rows) + 1))
    assert _next_handle(restored) == len(rows) + 1
    by_uuid = {r.uuid: r for r in _offloads(mem)}
    for r in rows:
        assert list(r.message_ids) == list(by_uuid[r.uuid].message_ids)
    assert _reach_by_tags(restored) >= {m.id for m in originals(restored)}


def test_erasure_keeps_a_handle_tag_and_a_reload_by_handle_quoting_it_is_erased(
    open_memory: Opener,
) -> None:
    secret = f"xyzzysecret{uuid.uuid4().hex[:12]}"
    mem = open_memory(config=CONFIG)
    for i in range(10):
        mem.add(round_of(i, secret if i == 1 else None))
        mem.compress_if_needed()
    holder = next(r for r in _offloads(mem) if 6 in r.message_ids)
    call = {"id": "q1", "type": "function"}
    call["function"] = {
        "name": "context_reload",
        "arguments": json.dumps({"offload": holder.handle}),
    }
    answer = mem.handle_tool_call(call)
    assert secret in answer
    from autoctx import ToolUseBlock

    block = ToolUseBlock("q1", "context_reload", json.dumps({"offload": holder.handle}))
    stored = mem.add([Msg.assistant(None, [block]), Msg.tool("q1", answer)])
    done = mem.erase([5, 6, 7, 8], reason="user request")
    assert done.answers == ((mem.session_id, stored[-1].id),)
    assert secret not in json.dumps([m.to_openai() for m in mem.messages()])
    assert secret not in json.dumps([m.to_openai() for m in mem.reload(holder.handle)])
    assert_every_handle_reloads(mem)
    assert_totals_match(mem)


def test_the_cli_and_the_audit_query_take_a_handle(open_memory: Opener, db_url: str) -> None:
    mem = open_memory(config=CONFIG)
    build(mem, 10)
    row = _offloads(mem)[-1]
    by_handle = invoke(["reload", mem.session_id, str(row.handle), "--json", "-d", db_url])
    by_uuid = invoke(["reload", mem.session_id, str(row.uuid), "--json", "-d", db_url])
    assert by_handle.exit_code == 0, by_handle.stderr
    assert by_handle.stdout == by_uuid.stdout
    text = invoke(["reload", mem.session_id, str(row.handle), "-d", db_url])
    assert text.stdout.startswith(f"offload {row.handle} ({row.uuid}): ")
    shown = json.loads(invoke(["show", mem.session_id, "--json", "-d", db_url]).stdout)
    tagged = [m for m in shown["messages"] if m["offload"] is not None]
    assert tagged
    for m in tagged:
        assert m["offload_uuid"] == str(
            next(r.uuid for r in _offloads(mem) if r.handle == m["offload"])
        )
    missing = invoke(["reload", mem.session_id, "999999", "-d", db_url])
    assert missing.exit_code != 0 and "has the handle 999999" in missing.stderr
    # docs/audit.md: which offload a tag names, and the event that made it.
    (found,) = sql(
        mem,
        "SELECT o.uuid, o.event_id, o.message_ids, e.strategy FROM offloads o "
        "JOIN compression_events e ON e.session_id = o.session_id AND e.id = o.event_id "
        "WHERE o.session_id = :session_id AND o.handle = :handle",
        session_id=mem.session_id,
        handle=row.handle,
    )
    assert (found.uuid, found.event_id) == (row.uuid, row.event_id)


# ---------------------------------------------------------------------------------------------
# Sessions written before handles (migration 0015)
# ---------------------------------------------------------------------------------------------


def _migrate(engine: sa.Engine, revision: str) -> None:
    with engine.connect() as conn:
        cfg = alembic_config()
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, revision)
        conn.commit()


def _write_uuid_tags(engine: sa.Engine, session_id: str, uuid_of: dict[int, Any]) -> int:
    """Rewrite the session's tags as autoctx wrote them before handles (the uuid form), with
    their tokens, characters and the session's totals counted again; returns how many."""
    counter = TokenCounter(CONFIG.model)
    rewritten = 0
    with engine.begin() as conn:
        rows = conn.execute(
            sa.text(
                "select id, role, name, content, metadata, kind, pinned, tokens from messages "
                "where session_id = :s and kind <> 'original'"
            ),
            {"s": session_id},
        ).all()
        for r in rows:
            raw = json.dumps(r.content)
            old = OFFLOAD_TAG_RE.sub(
                lambda m: f"<!-- CONTEXT_OFFLOAD: uuid={uuid_of[int(m.group('handle'))]} -->", raw
            )
            if old == raw:
                continue
            rewritten += 1
            content = json.loads(old)
            msg = msg_from_columns(
                r.id, r.role, r.name, content, r.metadata, r.kind, r.pinned, r.tokens
            )
            conn.execute(
                sa.text(
                    "update messages set content = cast(:c as jsonb), tokens = :t, chars = :n "
                    "where session_id = :s and id = :i"
                ),
                {
                    "c": old,
                    "t": count_tokens(msg, counter),
                    "n": msg.payload_chars,
                    "s": session_id,
                    "i": r.id,
                },
            )
        conn.execute(
            sa.text(
                "update sessions set token_count = (select coalesce(sum(m.tokens), 0) "
                "from working_set w join messages m on m.session_id = w.session_id "
                "and m.id = w.message_id where w.session_id = :s) where session_id = :s"
            ),
            {"s": session_id},
        )
    return rewritten


def test_a_session_written_before_handles_reloads_its_uuid_tags_and_gets_handles(
    empty_db_url: str,
) -> None:
    engine = create_engine(normalize_url(empty_db_url), poolclass=sa.NullPool)
    try:
        upgrade(engine)
        mem = AutoContextMemory.open("old", empty_db_url, CONFIG, summarizer=OfflineSummarizer())
        build(mem, 10)
        uuid_of = {r.handle: r.uuid for r in _offloads(mem)}
        order = [r.uuid for r in _offloads(mem)]
        mem.close()
        _migrate(engine, "0014")
        assert _write_uuid_tags(engine, "old", uuid_of) > 0
        upgrade(engine)
        mem = AutoContextMemory.open("old", empty_db_url, CONFIG, summarizer=OfflineSummarizer())
        assert_totals_match(mem)
        # The backfill numbers the offloads 1, 2, ... by event; the counter is past them.
        rows = _offloads(mem)
        assert [r.uuid for r in rows] == order
        assert [r.handle for r in rows] == list(range(1, len(rows) + 1))
        assert _next_handle(mem) == len(rows) + 1
        tags = [t for m in mem.messages() for t in tag_ids(render_transcript([m], keep_tags=True))]
        assert tags and not any(t.isdigit() for t in tags), "the working context holds uuid tags"
        # The old tags still reload, by the tool as by the API, and lead to every original.
        for tag in tags:
            answer = mem.handle_tool_call(
                {"function": {"name": "context_reload", "arguments": json.dumps({"uuid": tag})}}
            )
            assert not answer.startswith(("No offloaded", "Invalid")), answer
        assert _reach_by_tags(mem) >= {m.id for m in originals(mem)}
        # New compressions tag with handles past the backfilled ones; old and new mix.
        for i in range(10, 18):
            mem.add(round_of(i))
            mem.compress_if_needed()
        new = [r.handle for r in _offloads(mem) if r.handle > len(rows)]
        assert new and min(new) == len(rows) + 1
        mixed = {
            t.isdigit()
            for m in mem.messages()
            for t in tag_ids(render_transcript([m], keep_tags=True))
        }
        assert True in mixed
        assert _reach_by_tags(mem) >= {m.id for m in originals(mem)}
        assert_valid_openai_chat(mem.to_openai())
        assert_totals_match(mem)
        with pytest.raises(OffloadNotFound):
            mem.reload(_next_handle(mem))
        mem.close()
    finally:
        engine.dispose()
