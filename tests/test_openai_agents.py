"""AutoContextSession: autoctx behind the OpenAI Agents SDK's `Session` protocol, with the real SDK.

The unit tests drive the protocol methods directly; the Runner test runs a real `agents.Runner`
whose model is the SDK's Chat Completions model pointed at the local OpenAI-compatible server
(tests/openai_server.py), so that every request the SDK builds from the session is inspected.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
import logging
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import pytest
import sqlalchemy as sa
from openai import AsyncOpenAI

from autoctx import (
    AutoContextClient,
    AutoContextConfig,
    AutoContextMemory,
    ConfigError,
    InvalidMessage,
    OfflineSummarizer,
    SessionNotFound,
    SummaryRequest,
    SummaryResult,
)
from autoctx._plot import reconstruct
from autoctx._store.inspect import message_stamps
from autoctx._tokens import get_encoding
from autoctx._tools import NOT_FOUND_ANSWER
from tests import framework_runs
from tests.agent_model import ScriptedAgent, tool_output
from tests.dbsql import sql
from tests.openai_server import OpenAIServer, Reply

if TYPE_CHECKING:
    from agents import (
        Agent,
    )

    from autoctx.integrations.openai_agents import AutoContextSession

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


@pytest.fixture
def make_session(db_url: str, session_id: str) -> Callable[..., AutoContextSession]:
    from autoctx.integrations.openai_agents import AutoContextSession

    def _make(sid: str | None = None, **kw: Any) -> AutoContextSession:
        kw.setdefault("summarizer", OfflineSummarizer())
        return AutoContextSession(sid or session_id, db_url, **kw)

    return _make


def varied_items() -> list[dict[str, Any]]:
    """Items of every shape the SDK stores, including ones the conversion must keep opaque."""
    return [
        {"role": "system", "content": "You are careful."},
        {
            "type": "message",
            "role": "developer",
            "content": [{"type": "input_text", "text": "Prefer small diffs."}],
        },
        {"content": "Read a.py and b.py, then fix the bug.", "role": "user"},
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": "Here is a screenshot:"},
                {
                    "type": "input_image",
                    "image_url": "data:image/png;base64,iVBORw0KGgo=",
                    "detail": "auto",
                },
            ],
        },
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [{"type": "summary_text", "text": "Two files to read."}],
            "encrypted_content": "gAAAAB-opaque",
        },
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_1",
            "name": "read_file",
            "arguments": '{"path": "a.py"}',
            "status": "completed",
        },
        {
            "type": "function_call",
            "id": "fc_2",
            "call_id": "call_2",
            "name": "read_file",
            "arguments": '{"path": "b.py"}',
            "status": "completed",
            "provider_data": {"model": "test-model", "response_id": "chatcmpl-1"},
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "def a():\n    return 1\n"},
        {
            "type": "function_call_output",
            "call_id": "call_2",
            "output": [
                {"type": "input_text", "text": "def b():\n"},
                {"type": "input_image", "image_url": "https://example.test/b.png"},
                {"type": "input_text", "text": "    return 2\n"},
            ],
        },
        {
            "type": "message",
            "role": "assistant",
            "id": "msg_1",
            "status": "completed",
            "content": [{"type": "output_text", "text": "I will patch b.", "annotations": []}],
        },
        {
            "type": "function_call",
            "id": "__fake_id__",
            "call_id": "call_3",
            "name": "write_file",
            # A model's broken JSON is stored and given back as written.
            "arguments": '{"path": "b.py", "content": ',
        },
        # Tools return binary output: NUL survives the round trip.
        {"type": "function_call_output", "call_id": "call_3", "output": "wrote\x00 3 bytes"},
        {
            "type": "web_search_call",
            "id": "ws_1",
            "status": "completed",
            "action": {"type": "search", "query": "x"},
        },
        {
            "type": "message",
            "role": "assistant",
            "id": "msg_2",
            "status": "completed",
            "content": [
                {
                    "type": "output_text",
                    "text": "Fixed: b() returns 2 — ✓",
                    "annotations": [],
                    "logprobs": [],
                },
                {"type": "refusal", "refusal": "Not deleting tests."},
            ],
        },
        {"role": "assistant", "content": "Anything else?"},
    ]


# ---------------------------------------------------------------------------------------------
# The protocol, item by item
# ---------------------------------------------------------------------------------------------


def test_implements_the_sdk_session_protocol(
    make_session: Callable[..., AutoContextSession],
) -> None:
    from agents import Session
    from agents.memory.session_settings import SessionSettings

    session = make_session()
    assert isinstance(session, Session)
    assert session.session_settings == SessionSettings()  # as the SDK's own stores default it


def test_items_come_back_exactly_as_added(
    make_session: Callable[..., AutoContextSession], session_id: str
) -> None:
    items = varied_items()
    session = make_session(compress=False)
    run(session.add_items(copy.deepcopy(items)))
    assert run(session.get_items()) == items
    for limit in (1, 2, 3, 5, 9, len(items), len(items) + 10):
        assert run(session.get_items(limit=limit)) == items[-limit:]
    assert run(session.get_items(limit=0)) == []
    # Another process opening the session by id sees the same items.
    assert run(make_session(session_id).get_items()) == items


def test_an_add_under_the_trigger_is_one_statement_with_compression_on(
    make_session: Callable[..., AutoContextSession],
) -> None:
    """With compression on, an add that leaves the session under its trigger decides so from
    the totals its own statement returned: the append is the only statement of the call."""
    session = make_session(compress=True)
    items = varied_items()
    session.add_items_sync(copy.deepcopy(items[:3]))  # the first append locks (another path)
    mem = session.memory()
    assert mem._store.totals_after_append() == (
        mem.message_count(),
        mem.token_count(),
    )
    statements: list[str] = []

    def capture(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement.strip())

    sa.event.listen(mem.engine, "before_cursor_execute", capture)
    try:
        session.add_items_sync(copy.deepcopy(items[3:4]))
    finally:
        sa.event.remove(mem.engine, "before_cursor_execute", capture)
    assert [s.split()[:2] for s in statements] == [["WITH", "s"]], statements
    assert mem._store.totals_after_append() == (
        mem.message_count(),
        mem.token_count(),
    )


def test_items_added_in_small_batches_come_back_exactly(
    make_session: Callable[..., AutoContextSession],
) -> None:
    items = varied_items()
    session = make_session(compress=False)
    # Batches as the SDK saves them: never a model response's parallel calls split in two
    # (autoctx refuses a second assistant message while calls are unanswered).
    bounds = [0, 3, 4, 7, 8, 9, 11, 12, len(items)]
    for start, end in itertools.pairwise(bounds):
        run(session.add_items(copy.deepcopy(items[start:end])))
    assert run(session.get_items()) == items


def test_a_reasoning_item_and_parallel_calls_are_one_tool_group(
    make_session: Callable[..., AutoContextSession],
) -> None:
    session = make_session(compress=False)
    run(session.add_items(varied_items()))
    msgs = session.memory().messages()
    assert [m.role for m in msgs] == [
        "system", "system", "user", "user", "assistant", "tool", "tool",
        "assistant", "tool", "assistant",
    ]  # fmt: skip
    group = msgs[4]
    assert [b.type for b in group.content] == ["opaque", "tool_use", "tool_use"]
    assert [c.id for c in group.tool_uses] == ["call_1", "call_2"]
    assert group.content[0].data["type"] == "reasoning"  # type: ignore[union-attr]
    # The assistant's text and its next call are one message; the result names its tool.
    assert msgs[7].text == "I will patch b."
    assert [c.name for c in msgs[7].tool_uses] == ["write_file"]
    assert msgs[8].tool_results[0].name == "write_file"
    # The final answer, the web search and the easy-form assistant message are one message.
    assert msgs[9].text == "Fixed: b() returns 2 — ✓Anything else?"
    assert not msgs[9].tool_uses


def test_reads_follow_other_writers_and_never_hand_out_shared_items(
    make_session: Callable[..., AutoContextSession], session_id: str
) -> None:
    items = varied_items()
    mine, other = make_session(compress=False), make_session(session_id, compress=False)
    run(mine.add_items(copy.deepcopy(items[:3])))
    got = run(mine.get_items())
    got[0]["content"] = "edited by the caller"
    got.append({"role": "user", "content": "appended by the caller"})
    assert run(mine.get_items()) == items[:3]

    # Another writer (another process, as far as this object knows) appends and pops.
    run(other.add_items(copy.deepcopy(items[3:7])))
    assert run(mine.get_items()) == items[:7]
    assert run(other.pop_item()) == items[6]
    assert run(mine.get_items()) == items[:6]
    assert run(mine.get_items(limit=2)) == items[4:6]

    # Cleared by another worker: the reader sees the empty context, then what comes next.
    run(other.clear_session())
    assert run(mine.get_items()) == []
    later = [{"role": "user", "content": "after the clear"}]
    run(other.add_items(later))
    assert run(mine.get_items()) == later

    # Deleted and created again under the same id: message ids start over, and the reader,
    # bound to the incarnation it opened, must not serve the new session's items at all.
    other.memory().delete()
    fresh = [{"role": "user", "content": "a new session under an old id"}]
    run(make_session(session_id, compress=False).add_items(fresh))
    with pytest.raises(SessionNotFound):
        run(mine.get_items())
    with pytest.raises(SessionNotFound):
        run(mine.add_items([{"role": "user", "content": "into the wrong session"}]))


def test_an_erasure_elsewhere_empties_the_items_cache(
    make_session: Callable[..., AutoContextSession], db_url: str, session_id: str
) -> None:
    """The items cache keys on the session's erasure count: after an erasure by another memory
    object or by `autoctx erase` in another process, `get_items()` serves the tombstones, never
    the erased text it had cached."""
    first, second = (f"cardnumber{uuid.uuid4().hex[:10]}" for _ in range(2))
    session = make_session(compress=False)
    items = [
        {"role": "user", "content": f"my card is {first}"},
        {"role": "user", "content": f"and my other card is {second}"},
        {"role": "user", "content": "thanks"},
    ]
    run(session.add_items(copy.deepcopy(items)))
    assert run(session.get_items()) == items  # every item now cached by message id

    other = AutoContextMemory.open(session_id, db_url, summarizer=OfflineSummarizer())
    assert other.erase([1], reason="user request").erased_ids == (1,)
    got = json.dumps(run(session.get_items()))
    assert first not in got and "[erased]" in got and second in got

    cli = [sys.executable, "-m", "autoctx._cli", "erase", session_id, "2", "--reason", "gdpr"]
    subprocess.run(
        [*cli, "--database-url", db_url],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    got = json.dumps(run(session.get_items()))
    assert first not in got and second not in got and "thanks" in got
    assert second not in json.dumps(run(session.get_items(limit=2)))


_OTHER_PROCESS_WRITES = """
import asyncio, sys
from autoctx import AutoContextMemory, OfflineSummarizer
from autoctx.integrations.openai_agents import AutoContextSession

url, sid, secret = sys.argv[1:4]
session = AutoContextSession(sid, url, summarizer=OfflineSummarizer(), compress=False)
asyncio.run(session.add_items([{"role": "user", "content": "written by another process"}]))
mem = AutoContextMemory.open(sid, url, summarizer=OfflineSummarizer())
first = next(m for m in mem.messages() if secret in m.text)
mem.erase([first.id], reason="user request")
"""


def test_a_new_session_object_reads_the_clients_items_cache_and_sees_other_processes(
    client: AutoContextClient, db_url: str, session_id: str
) -> None:
    """Every session object of a session opened through one client shares its items cache
    (`AutoContextClient.session_caches`): a new object's read fetches no message content it
    already holds, and still sees what another process appended and erased."""
    from autoctx.integrations.openai_agents import AutoContextSession

    secret = f"cardnumber{uuid.uuid4().hex[:10]}"
    items = [
        {"role": "user", "content": f"my card is {secret}"},
        {"type": "message", "role": "assistant", "content": "noted"},
    ]

    def new_session() -> AutoContextSession:
        opened = AutoContextSession(
            session_id, summarizer=OfflineSummarizer(), compress=False, client=client
        )
        opened.memory()  # opening is not part of the reads counted below
        return opened

    writer = new_session()
    run(writer.add_items(copy.deepcopy(items)))
    assert run(writer.get_items()) == items
    statements: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    fresh = new_session()
    sa.event.listen(client.engine, "before_cursor_execute", count)
    try:
        assert run(fresh.get_items()) == items
        # One short query for the working ids and the epoch; no content fetched.
        assert len(statements) == 1 and "content" not in statements[0]

        # Another process appends, then erases the first message.
        subprocess.run(
            [sys.executable, "-c", _OTHER_PROCESS_WRITES, db_url, session_id, secret],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        later = new_session()
        statements.clear()
        got = run(later.get_items())
        assert secret not in json.dumps(got) and "[erased]" in json.dumps(got)
        assert got[1:] == [*items[1:], {"role": "user", "content": "written by another process"}]
        # The erasure started the cache over: the content was fetched again.
        assert any("content" in s for s in statements)
    finally:
        sa.event.remove(client.engine, "before_cursor_execute", count)


def test_an_erasure_in_this_process_empties_every_items_cache_at_once(
    client: AutoContextClient, session_id: str
) -> None:
    from autoctx.integrations.openai_agents import AutoContextSession

    session = AutoContextSession(
        session_id, summarizer=OfflineSummarizer(), compress=False, client=client
    )
    secret = f"cardnumber{uuid.uuid4().hex[:10]}"
    run(session.add_items([{"role": "user", "content": f"my card is {secret}"}]))
    assert secret in json.dumps(run(session.get_items()))
    # The client holds the text now, until the next read or an erasure here.
    caches = client.session_caches
    assert any(secret in json.dumps(vars(c)["items"]) for c in caches._caches.values())
    session.memory().erase([1], reason="user request")
    assert not any(secret in repr(vars(c)) for c in caches._caches.values())
    assert secret not in json.dumps(run(session.get_items()))


def test_pop_item_pops_one_item_at_a_time_and_keeps_the_originals(
    make_session: Callable[..., AutoContextSession],
) -> None:
    items = varied_items()
    session = make_session(compress=False)
    run(session.add_items(copy.deepcopy(items)))
    mem = session.memory()
    stored_before = sql(
        mem, "select count(*) from messages where session_id = :s", s=mem.session_id
    )[0][0]

    popped = [run(session.pop_item()) for _ in range(4)]
    assert popped == list(reversed(items[-4:]))
    assert run(session.get_items()) == items[:-4]
    _assert_totals_match_a_recount(mem)

    # Popping the result of call_3 leaves it the newest, still pending call: another result
    # for it is accepted, and the history is a valid shape again.
    retry = {"type": "function_call_output", "call_id": "call_3", "output": "retried"}
    run(session.add_items([retry]))
    assert run(session.get_items())[-2:] == [items[-5], retry]

    while run(session.pop_item()) is not None:
        pass
    assert run(session.get_items()) == []
    assert run(session.pop_item()) is None
    _assert_totals_match_a_recount(mem)

    # Nothing of what was added is gone from the database; every pop is an audited event.
    stored_after = sql(
        mem,
        "select count(*) from messages"
        " where session_id = :s and kind = 'original' and event_id is null",
        s=mem.session_id,
    )[0][0]
    assert stored_after == stored_before + 1  # + the retried result
    events = mem.events()
    assert len(events) == len(items) + 1
    assert {(e.strategy, e.status, e.reason) for e in events} == {(0, "applied", "manual")}
    assert events[-1].messages_after == 0 and events[-1].tokens_after == 0


def test_the_plot_replays_pops_to_the_session_totals(
    make_session: Callable[..., AutoContextSession],
) -> None:
    """A pop with nothing left in place writes an event and no message; the plot's replay
    must still take it into account (docs/design.md §8: tokens over time)."""
    items = varied_items()
    session = make_session(compress=False)
    run(session.add_items(copy.deepcopy(items)))
    mem = session.memory()
    for _ in range(4):  # single-item messages, then items out of a multi-item message
        run(session.pop_item())
    # The result of call_3 was popped: the call is pending again and takes a new result.
    run(session.add_items([{"type": "function_call_output", "call_id": "call_3", "output": "ok"}]))
    series = reconstruct(message_stamps(mem.engine, mem.session_id), mem.events())
    last = series.points[-1]
    assert (last.tokens, last.messages) == (mem.token_count(), mem.message_count())
    pops = [m for m in series.marks if m.strategy == 0]
    assert len(pops) == 4 and all(m.status == "applied" for m in pops)


def test_popping_a_call_out_of_a_parallel_group_keeps_the_others(
    make_session: Callable[..., AutoContextSession],
) -> None:
    items = varied_items()[:7]  # up to and including the two parallel calls, no results yet
    session = make_session(compress=False)
    run(session.add_items(copy.deepcopy(items)))
    assert run(session.pop_item()) == items[-1]
    assert run(session.get_items()) == items[:-1]
    mem = session.memory()
    group = mem.messages()[-1]
    assert [c.id for c in group.tool_uses] == ["call_1"]
    _assert_totals_match_a_recount(mem)
    # Only call_1 is open now: its result is accepted, call_2's is refused.
    result_2 = {"type": "function_call_output", "call_id": "call_2", "output": "b"}
    with pytest.raises(ValueError, match="answers no open call"):
        run(session.add_items([result_2]))
    result_1 = {"type": "function_call_output", "call_id": "call_1", "output": "a"}
    run(session.add_items([result_1]))
    assert run(session.get_items()) == [*items[:-1], result_1]


def test_clear_session_empties_the_context_and_keeps_the_audit_trail(
    make_session: Callable[..., AutoContextSession],
) -> None:
    from autoctx.integrations.openai_agents import AutoContextSession

    session = make_session(compress=False)
    items = varied_items()
    run(session.add_items(items))
    mem = session.memory()

    def count(table: str) -> int:
        query = f"select count(*) from {table} where session_id = :s"
        return int(sql(mem, query, s=session.session_id)[0][0])

    originals = count("messages")
    working = sql(
        mem,
        "select message_id from working_set where session_id = :s order by position",
        s=mem.session_id,
    )
    run(session.clear_session())
    assert run(session.get_items()) == []
    assert count("working_set") == 0
    assert count("messages") == originals  # clearing is not deleting
    (event,) = mem.events()
    assert (event.strategy, event.status, event.reason) == (0, "applied", "clear")
    assert list(event.replaced_ids) == [r[0] for r in working]
    # What was cleared stays reloadable through the event's offload.
    assert event.offload_uuid is not None
    assert [m.id for m in mem.reload(event.offload_uuid)] == [r[0] for r in working]
    assert (event.messages_after, event.tokens_after) == (0, 0)
    assert (mem.message_count(), mem.token_count()) == (0, 0)
    again = [{"role": "user", "content": "hello again"}]
    run(session.add_items(again))
    assert run(session.get_items()) == again
    # A session never used clears without error.
    run(AutoContextSession(f"never-{uuid.uuid4().hex}", mem.engine.url).clear_session())


def test_from_memory_shares_the_memory(
    open_memory: Callable[..., AutoContextMemory],
) -> None:
    from autoctx.integrations.openai_agents import AutoContextSession

    mem = open_memory()
    session = AutoContextSession.from_memory(mem, compress=False)
    run(session.add_items([{"role": "user", "content": "hi"}]))
    assert mem.to_openai() == [{"role": "user", "content": "hi"}]
    run(session.clear_session())
    run(session.add_items([{"role": "user", "content": "back"}]))
    assert run(session.get_items()) == [{"role": "user", "content": "back"}]


def test_a_tenants_session_works_and_stays_its_own(
    make_session: Callable[..., AutoContextSession], session_id: str
) -> None:
    items = varied_items()[:4]
    session = make_session(compress=False, tenant="acme")
    run(session.add_items(copy.deepcopy(items)))
    assert run(session.get_items()) == items
    assert run(session.pop_item()) == items[-1]
    assert run(session.get_items(limit=2)) == items[1:3]
    assert session.memory().tenant == "acme"
    # The same id under another tenant is not this session.
    with pytest.raises(SessionNotFound):
        run(make_session(session_id, tenant="globex").get_items())


def test_session_settings_limit_applies(make_session: Callable[..., AutoContextSession]) -> None:

    from agents.memory.session_settings import SessionSettings

    items = varied_items()
    session = make_session(compress=False, session_settings=SessionSettings(limit=2))
    run(session.add_items(copy.deepcopy(items)))
    assert run(session.get_items()) == items[-2:]
    assert run(session.get_items(limit=4)) == items[-4:]


def test_session_settings_given_as_a_dict_work_as_the_sdks_own_stores_take_them(
    make_session: Callable[..., AutoContextSession],
) -> None:

    from agents import Agent, OpenAIChatCompletionsModel, Runner, set_tracing_disabled
    from agents.memory.session_settings import SessionSettings

    items = varied_items()
    session = make_session(compress=False, session_settings={"limit": 2})
    assert isinstance(session.session_settings, SessionSettings)
    run(session.add_items(copy.deepcopy(items)))
    assert run(session.get_items()) == items[-2:]
    # Runner.run reads `session.session_settings.limit`; a dict crashed it there.
    set_tracing_disabled(True)

    async def scenario() -> None:
        with OpenAIServer() as srv:
            client = AsyncOpenAI(base_url=srv.base_url, api_key="test", max_retries=0)
            model = OpenAIChatCompletionsModel(model="test-model", openai_client=client)
            agent = Agent(name="worker", instructions="Answer.", model=model)
            srv.script(Reply.text("done"))
            result = await Runner.run(agent, "go on", session=session)
            assert result.final_output == "done"
            # The model saw the two latest stored items and the new input.
            assert len(srv.requests[0]["messages"]) <= 1 + 2 + 1
            await client.close()

    run(scenario())
    with pytest.raises(TypeError, match="Unknown session settings: limitt"):
        make_session(session_settings={"limitt": 1})


@pytest.mark.parametrize(
    ("item", "field"),
    [
        ({"role": "user", "content": object()}, "content"),
        ({"role": "user", "content": [{"type": "input_text", "text": b"x"}]}, "content[0].text"),
        ({"type": "function_call_output", "call_id": "c1", "output": {1, 2}}, "output"),
    ],
)
def test_an_unstorable_item_is_a_type_error_naming_its_field(
    make_session: Callable[..., AutoContextSession], item: dict[str, Any], field: str
) -> None:
    from autoctx import InvalidMessage

    session = make_session(compress=False)
    run(session.add_items([{"role": "user", "content": "kept"}]))
    # Caught as the SDK's own stores are (TypeError), and as autoctx's error.
    with pytest.raises(TypeError) as caught:
        run(session.add_items([{"role": "user", "content": "not kept"}, item]))
    assert isinstance(caught.value, InvalidMessage)
    assert f"item 1, field {field!r}" in str(caught.value)
    assert "metadata" not in str(caught.value)
    assert run(session.get_items()) == [{"role": "user", "content": "kept"}]


async def _compact_with_the_sdks_wrapper(session: AutoContextSession) -> list[Any]:
    """One forced compaction by the SDK's `OpenAIResponsesCompactionSession` over `session`
    (against the local server's compact endpoint); the items it leaves."""
    from agents.memory import OpenAIResponsesCompactionSession

    with OpenAIServer() as srv:
        client = AsyncOpenAI(base_url=srv.base_url, api_key="test", max_retries=0)
        wrapper = OpenAIResponsesCompactionSession(
            session.session_id, session, client=client, model="gpt-4.1"
        )
        await wrapper.run_compaction({"compaction_mode": "input", "force": True})
        assert len(srv.compactions) == 1
        await client.close()
        return await wrapper.get_items()


def test_the_sdks_compaction_wrapper_keeps_every_original_reloadable(
    make_session: Callable[..., AutoContextSession],
) -> None:
    """The SDK's OpenAIResponsesCompactionSession rewrites a store by clear_session() then
    add_items(); over autoctx that must not lose an original (docs/design.md §5)."""
    session = make_session(compress=False)
    items = varied_items()
    run(session.add_items(copy.deepcopy(items)))
    mem = session.memory()
    originals = {
        r[0]: r[1]
        for r in sql(
            mem,
            "select id, content::text from messages where session_id = :s and kind = 'original'",
            s=mem.session_id,
        )
    }

    after = run(_compact_with_the_sdks_wrapper(session))
    # The wrapper's rewrite is in place: the user messages and one compaction item.
    assert after[-1]["type"] == "compaction"
    assert [i for i in after if i.get("role") == "user"] == [
        i for i in items if i.get("role") == "user"
    ]
    # Every original is still stored, unchanged, and reloadable through an offload.
    stored = dict(
        sql(
            mem,
            "select id, content::text from messages where session_id = :s and kind = 'original'",
            s=mem.session_id,
        )
    )
    assert {k: stored[k] for k in originals} == originals
    reloadable: set[int] = set()
    for event in mem.events():
        if event.offload_uuid is not None:
            reloadable.update(m.id for m in mem.reload(event.offload_uuid) if m.id is not None)
    assert set(originals) <= reloadable
    _assert_totals_match_a_recount(mem)


def test_the_sdks_compaction_wrapper_rewrites_the_history_in_one_transaction(
    make_session: Callable[..., AutoContextSession],
) -> None:
    """The wrapper replaces a history through the store's `_atomic_replace_items` hook when it
    has one: the clear and the append of the compacted items commit together, so a crash
    between them cannot leave the session empty (with clear_session() then add_items(), the
    clear commits first)."""
    session = make_session(compress=False)
    run(session.add_items(copy.deepcopy(varied_items())))
    mem = session.memory()
    before = len(mem.events())
    log: list[str] = []

    def statement(conn: Any, cursor: Any, text: str, *args: Any) -> None:
        log.append(" ".join(text.split()[:5]).upper())

    def commit(conn: Any) -> None:
        log.append("COMMIT")

    sa.event.listen(mem.engine, "before_cursor_execute", statement)
    sa.event.listen(mem.engine, "commit", commit)
    try:
        after = run(_compact_with_the_sdks_wrapper(session))
    finally:
        sa.event.remove(mem.engine, "before_cursor_execute", statement)
        sa.event.remove(mem.engine, "commit", commit)
    assert after[-1]["type"] == "compaction"
    # The clear empties the working set through the function a granted role uses too.
    cleared = next(k for k, text in enumerate(log) if "AUTOCTX_UNLINK_WORKING" in text)
    appended = next(k for k in range(cleared, len(log)) if log[k].startswith("WITH S"))
    assert "COMMIT" not in log[cleared:appended], log[cleared : appended + 1]
    assert "COMMIT" in log[appended:]
    # The clear is audited as ever: one event, whose offload holds every cleared message.
    (clear,) = mem.events()[before:]
    assert (clear.strategy, clear.reason) == (0, "clear")
    assert clear.offload_uuid is not None
    assert len(mem.reload(clear.offload_uuid)) == clear.messages_before
    _assert_totals_match_a_recount(mem)


def test_a_rejected_replacement_leaves_the_session_as_it_was(
    make_session: Callable[..., AutoContextSession],
) -> None:
    """A replacement the shape rules refuse (here, a tool output answering no call) is an
    `InvalidMessage` naming the item, and the clear it came with is rolled back with it: the
    session keeps its items and records no event."""
    session = make_session(compress=False)
    items = varied_items()
    run(session.add_items(copy.deepcopy(items)))
    mem = session.memory()
    before = (run(session.get_items()), len(mem.events()), mem.version())
    orphan = {"type": "function_call_output", "call_id": "call_nobody", "output": "SECRET-ORPHAN"}
    with pytest.raises(InvalidMessage) as caught:
        run(session._atomic_replace_items([{"role": "user", "content": "hi"}, orphan]))
    assert "SECRET-ORPHAN" not in str(caught.value)
    assert (run(session.get_items()), len(mem.events()), mem.version()) == before
    _assert_totals_match_a_recount(mem)


def test_a_replacement_that_ends_in_a_pending_call_keeps_the_shape_rules(
    make_session: Callable[..., AutoContextSession],
) -> None:
    """The open calls the replacement leaves are what the next append is checked against:
    a new message while the call is unanswered is refused, its result is taken."""
    session = make_session(compress=False)
    run(session.add_items([{"role": "user", "content": "Read a file."}]))
    pending = {
        "type": "function_call",
        "call_id": "call_open",
        "name": "read_file",
        "arguments": json.dumps({"path": "a.txt"}),
    }
    run(session._atomic_replace_items([{"role": "user", "content": "Read a.txt."}, pending]))
    with pytest.raises(InvalidMessage, match="call_open"):
        run(session.add_items([{"role": "user", "content": "Never mind."}]))
    answer = {"type": "function_call_output", "call_id": "call_open", "output": "text of a"}
    run(session.add_items([answer]))
    assert [i.get("call_id") for i in run(session.get_items())][-2:] == ["call_open"] * 2
    _assert_totals_match_a_recount(session.memory())


def test_reload_tool_answers_plainly(make_session: Callable[..., AutoContextSession]) -> None:
    from agents.tool_context import ToolContext

    from autoctx.integrations.openai_agents import context_tools

    session = make_session()
    tool, search = context_tools(session)
    assert (tool.name, search.name) == ("context_reload", "context_search")
    assert "uuid" in tool.params_json_schema["properties"]

    def invoke(arguments: str) -> str:
        ctx = ToolContext(
            context=None, tool_name=tool.name, tool_call_id="call_x", tool_arguments=arguments
        )
        return str(run(tool.on_invoke_tool(ctx, arguments)))

    assert invoke(json.dumps({"uuid": str(uuid.uuid4())})) == NOT_FOUND_ANSWER
    assert invoke(json.dumps({"uuid": "not-a-uuid"})).startswith("Invalid uuid")
    assert invoke("{}").startswith("Missing offload")


# ---------------------------------------------------------------------------------------------
# A real Runner, compressing and reloading
# ---------------------------------------------------------------------------------------------


def file_contents(path: str) -> str:
    """A tool output larger than the test config's large_payload_chars (600), whose secret sits
    past the preview (100 characters), so only a reload shows it."""
    head = f"FILE {path} ".ljust(120, ".")
    body = "".join(f"\n{n:04d}: line of {path}" for n in range(80))
    return f"{head} SECRET-{path}-{len(path) * 7}{body}"


def read_file(path: str) -> str:
    """Read a file of the workspace."""
    return file_contents(path)


def call(call_id: str, name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def reads(*pairs: tuple[str, str]) -> Reply:
    """One assistant message calling read_file once per (call id, path), in parallel."""
    calls = [call(cid, "read_file", {"path": p}) for cid, p in pairs]
    return Reply.message({"role": "assistant", "content": None, "tool_calls": calls})


def assert_valid_chat_history(messages: Sequence[Mapping[str, Any]]) -> None:
    """The shape the Chat Completions API enforces: results follow their calls, all answered."""
    open_calls: set[str] = set()
    for k, m in enumerate(messages):
        if m["role"] == "tool":
            assert m["tool_call_id"] in open_calls, (k, m)
            open_calls.discard(m["tool_call_id"])
            continue
        assert not open_calls, (k, m, open_calls)
        if m["role"] == "assistant":
            open_calls = {c["id"] for c in m.get("tool_calls") or []}
    assert not open_calls


def test_runner_compresses_along_the_way_and_reloads_an_offload(
    make_session: Callable[..., AutoContextSession],
) -> None:
    from agents import (
        Agent,
        OpenAIChatCompletionsModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )

    from autoctx.integrations.openai_agents import context_tools

    config = AutoContextConfig(
        msg_threshold=12,
        max_tokens=4000,
        last_keep=4,
        min_compress_tokens=50,
        large_payload_chars=600,
        preview_chars=100,
        reload_page_chars=500,
    )
    session = make_session(config=config)
    set_tracing_disabled(True)
    turns: list[tuple[str, list[Reply]]] = [
        ("Read a.txt", [reads(("call_a", "a.txt")), Reply.text("a.txt is read.")]),
        (
            "Read b.txt and c.txt",
            [reads(("call_b", "b.txt"), ("call_c", "c.txt")), Reply.text("Both read.")],
        ),
        ("Read d.txt", [reads(("call_d", "d.txt")), Reply.text("d.txt is read.")]),
        ("Read e.txt", [reads(("call_e", "e.txt")), Reply.text("e.txt is read.")]),
        ("Thanks", [Reply.text("You're welcome.")]),
    ]

    async def scenario() -> None:
        with OpenAIServer() as srv:
            client = AsyncOpenAI(base_url=srv.base_url, api_key="test", max_retries=0)
            model = OpenAIChatCompletionsModel(model="test-model", openai_client=client)
            agent = Agent(
                name="worker",
                instructions="Work. " + AutoContextMemory.system_prompt_snippet(),
                model=model,
                tools=[function_tool(read_file), *context_tools(session)],
            )
            for prompt, replies in turns:
                srv.script(*replies)
                result = await Runner.run(agent, prompt, session=session)
                assert result.final_output == replies[-1].content
                assert srv.pending == 0

            # The session compressed along the way, and what the model was sent shows it.
            mem = session.memory()
            events = [e for e in mem.events() if e.status == "applied"]
            assert events, "the session never compressed"
            assert mem.message_count() < 20
            for body in srv.requests:
                assert_valid_chat_history(body["messages"])
            assert any("<!-- offload " in json.dumps(b["messages"]) for b in srv.requests)
            items = await session.get_items()
            previews = [
                i
                for i in items
                if i.get("type") == "function_call_output"
                and "<!-- offload " in str(i.get("output"))
            ]
            summaries = [
                i
                for i in items
                if i.get("role") == "assistant" and "<!-- offload " in json.dumps(i)
            ]
            assert previews or summaries

            # Pick an offload that holds a tool output, and have the model reload the page of
            # it that holds the output's secret (as a model pages through a long reload).
            offload, original = _tool_offload(mem)
            secret = next(w for w in original.split() if w.startswith("SECRET-"))
            assert secret not in json.dumps(srv.requests[-1]["messages"])
            offset = _reload_text(mem, offload).index(secret)
            srv.reset()
            srv.script(
                Reply.tool_call(
                    "context_reload",
                    {"uuid": str(offload), "offset": offset},
                    call_id="call_reload",
                ),
                Reply.text("Reloaded."),
            )
            result = await Runner.run(agent, "What was the secret?", session=session)
            assert result.final_output == "Reloaded."
            sent_back = [
                m
                for m in srv.requests[-1]["messages"]
                if m["role"] == "tool" and m["tool_call_id"] == "call_reload"
            ]
            assert len(sent_back) == 1
            assert sent_back[0]["content"].startswith(secret)
            await client.close()

    run(scenario())


def _tool_offload(mem: AutoContextMemory) -> tuple[uuid.UUID, str]:
    """An offload that holds an original tool output, and that output."""
    for event in mem.events():
        if event.status != "applied" or event.offload_uuid is None:
            continue
        for msg in mem.reload(event.offload_uuid):
            if msg.role == "tool" and msg.kind == "original":
                return event.offload_uuid, msg.tool_results[0].output_text
    raise AssertionError(f"no offload of a tool output among {mem.events()}")


def _reload_text(mem: AutoContextMemory, offload: uuid.UUID) -> str:
    """The whole text the reload tool pages through, read page by page as a model would."""
    text, offset = "", 0
    while True:
        call = {
            "id": "c",
            "function": {
                "name": "context_reload",
                "arguments": json.dumps({"uuid": str(offload), "offset": offset}),
            },
        }
        page = mem.handle_tool_call(call)
        head, _, trailer = page.rpartition("\n[page: characters ")
        if not trailer.endswith("for the next page]"):
            return text + page
        text += head
        offset = len(text)


def _assert_totals_match_a_recount(mem: AutoContextMemory) -> None:
    row = sql(
        mem,
        """
        select s.message_count, s.token_count, count(m.id), coalesce(sum(m.tokens), 0)
        from sessions s
        left join working_set w on w.session_id = s.session_id
        left join messages m on m.session_id = w.session_id and m.id = w.message_id
        where s.session_id = :s
        group by s.message_count, s.token_count
        """,
        s=mem.session_id,
    )[0]
    assert (row[0], row[1]) == (row[2], row[3])


def test_without_the_sdk_the_import_error_names_the_extra() -> None:
    message = framework_runs.import_error_without("autoctx.integrations.openai_agents", "agents")
    assert "needs the OpenAI Agents SDK" in message
    framework_runs.assert_names_the_extra(message, "agents")


class HeldSummarizer:
    """The offline summarizer, each call held until the test releases it."""

    def __init__(self) -> None:
        self.inner = OfflineSummarizer()
        self.asked = threading.Event()
        self.go = threading.Event()
        self.answered = threading.Event()

    def summarize(self, request: SummaryRequest) -> SummaryResult:
        self.asked.set()
        try:
            assert self.go.wait(20), "the test never released the summarizer"
            return self.inner.summarize(request)
        finally:
            self.answered.set()


def _tool_steps(start: int, steps: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for k in range(start, start + steps):
        out.append(
            {
                "type": "function_call",
                "call_id": f"call_{k}",
                "name": "read_file",
                "arguments": json.dumps({"path": f"src/m{k}.py"}),
            }
        )
        out.append(
            {
                "type": "function_call_output",
                "call_id": f"call_{k}",
                "output": f"def f_{k}(): return {k}\n" * 20,
            }
        )
    return out


def test_a_background_session_adds_items_without_waiting_for_the_summarizer(
    make_session: Callable[..., AutoContextSession],
) -> None:
    """`background=True`: the add that crosses the trigger starts the compression in a thread
    and returns while the summarizer is still writing; reads go on meanwhile; the compression
    lands afterwards, as in the memory's own background mode."""
    config = AutoContextConfig(msg_threshold=30, max_tokens=60_000, min_compress_tokens=50)
    summarizer = HeldSummarizer()
    session = make_session(config=config, summarizer=summarizer, background=True)
    session.add_items_sync([{"role": "user", "content": "Read every module."}])
    session.add_items_sync(_tool_steps(0, 20))  # 41 messages: over the count trigger
    mem = session.memory()
    try:
        assert summarizer.asked.wait(30), "no compression started at the trigger"
        # The add returned, and the session reads, while the summarizer is held.
        assert not summarizer.answered.is_set()
        assert len(session.get_items_sync()) == 41
        session.add_items_sync(_tool_steps(20, 1))
        summarizer.go.set()
        for _ in range(600):
            if any(e.status == "applied" for e in mem.events()):
                break
            time.sleep(0.05)
        applied = [e for e in mem.events() if e.status == "applied"]
        assert applied, "the background compression never landed"
        items = session.get_items_sync()
        assert len(items) < 43
        # The step added while the summarizer wrote is kept, after the summary.
        assert [i.get("call_id") for i in items[-2:]] == ["call_20", "call_20"]
    finally:
        summarizer.go.set()
        mem.close()


def test_a_bad_background_mode_of_a_session_is_refused_naming_it(db_url: str) -> None:
    from autoctx.integrations.openai_agents import AutoContextSession

    with pytest.raises(ConfigError, match="background must be False, True or 'worker'"):
        AutoContextSession("s", db_url, background=cast(Any, "yes"))


# ---------------------------------------------------------------------------------------------
# Inside a run: `call_model_input_filter` bounds every model call of the SDK's own loop
# ---------------------------------------------------------------------------------------------


def _sdk_agent(
    srv: OpenAIServer, session: AutoContextSession, work: framework_runs.Work
) -> tuple[Agent[Any], AsyncOpenAI]:
    from agents import Agent, OpenAIChatCompletionsModel, function_tool

    from autoctx.integrations.openai_agents import context_tools

    client = AsyncOpenAI(base_url=srv.base_url, api_key="test", max_retries=0)
    model = OpenAIChatCompletionsModel(model="test-model", openai_client=client)
    agent = Agent(
        name="worker",
        instructions="Work. " + AutoContextMemory.system_prompt_snippet(),
        model=model,
        tools=[framework_runs.work_tool(function_tool, work), *context_tools(session)],
    )
    return agent, client


async def _sdk_run(
    agent: Agent[Any], prompt: str, session: AutoContextSession, *, stream: bool, bounded: bool
) -> Any:
    from agents import RunConfig, Runner

    run_config = session.run_config() if bounded else RunConfig()
    if stream:
        streamed = Runner.run_streamed(
            agent, prompt, session=session, run_config=run_config, max_turns=1_000
        )
        async for _ in streamed.stream_events():
            pass
        return streamed.final_output
    result = await Runner.run(
        agent, prompt, session=session, run_config=run_config, max_turns=1_000
    )
    return result.final_output


def _run_once(
    session: AutoContextSession,
    agent_model: ScriptedAgent,
    work: framework_runs.Work,
    prompt: str,
    *,
    stream: bool,
    bounded: bool,
) -> Any:
    """One run of the SDK agent against a local server scripted by `agent_model`; its final
    output."""

    async def scenario() -> Any:
        with OpenAIServer(default=agent_model) as srv:
            agent, client = _sdk_agent(srv, session, work)
            final = await _sdk_run(agent, prompt, session, stream=stream, bounded=bounded)
            await client.close()
            return final

    return run(scenario())


def _window_config() -> AutoContextConfig:
    return AutoContextConfig(max_tokens=framework_runs.WINDOW)


@pytest.mark.parametrize("stream", [False, True], ids=["run", "run_streamed"])
def test_every_model_call_of_a_long_run_stays_under_the_window(
    make_session: Callable[..., AutoContextSession], stream: bool
) -> None:
    from agents import set_tracing_disabled

    session = make_session(config=_window_config())
    set_tracing_disabled(True)
    agent_model = ScriptedAgent(
        calls_per_run=48, context_calls={40: ("context_search", {"query": '"FACT-0003"'})}
    )
    work = framework_runs.Work()
    final = _run_once(session, agent_model, work, "Do the work", stream=stream, bounded=True)
    assert final == agent_model.final_answer
    assert work.calls == 47
    assert len(agent_model.inputs) == 49
    framework_runs.assert_under_window(agent_model)
    for body in agent_model.requests:
        assert_valid_chat_history(body["messages"])
    mem = session.memory()
    assert [e for e in mem.events() if e.status == "applied"], "the run never compressed"
    # The search the model made inside the run was answered from what the run stored.
    answers = framework_runs.answers_to(agent_model, "context_search")
    assert len(answers) == 1 and "FACT-0003" in answers[0]
    framework_runs.assert_each_stored_once(mem, prompts=1, calls=48)
    framework_runs.assert_reachable(mem, range(1, work.calls + 1))


@pytest.mark.parametrize("stream", [False, True], ids=["run", "run_streamed"])
def test_a_long_task_at_a_small_window_hands_the_model_its_tool_results_last(
    make_session: Callable[..., AutoContextSession], stream: bool
) -> None:
    """S6 fires in the input filter, when the run's items end with the call outputs the model is
    about to read: the input of the model call still ends with them."""
    from agents import set_tracing_disabled

    session = make_session(config=AutoContextConfig(max_tokens=framework_runs.SMALL_WINDOW))
    set_tracing_disabled(True)
    agent_model = ScriptedAgent(calls_per_run=30)
    work = framework_runs.Work(framework_runs.small_output_size)
    final = _run_once(session, agent_model, work, "Do the 30 steps", stream=stream, bounded=True)
    assert final == agent_model.final_answer
    assert work.calls == 30
    framework_runs.assert_every_request_ends_with_input(agent_model)
    framework_runs.assert_under_window(agent_model, framework_runs.SMALL_WINDOW)
    mem = session.memory()
    framework_runs.assert_current_round_summarized(mem)
    framework_runs.assert_reachable(mem, range(1, 31))


def test_a_given_client_opens_the_memory_and_its_close_closes_it(
    db_url: str, client: AutoContextClient, session_id: str
) -> None:
    from agents import set_tracing_disabled

    from autoctx.integrations.openai_agents import AutoContextSession

    AutoContextClient.close_shared(db_url)
    session = AutoContextSession(
        session_id, config=_window_config(), summarizer=OfflineSummarizer(), client=client
    )
    set_tracing_disabled(True)
    agent_model = ScriptedAgent(calls_per_run=2)

    async def scenario() -> None:
        with OpenAIServer(default=agent_model) as srv:
            agent, openai_client = _sdk_agent(srv, session, framework_runs.Work())
            final = await _sdk_run(agent, "Do the work", session, stream=False, bounded=True)
            assert final == agent_model.final_answer
            await openai_client.close()

    run(scenario())
    mem = session.memory()
    framework_runs.assert_each_stored_once(mem, prompts=1, calls=2)
    framework_runs.assert_opened_through(client, mem, db_url)
    with pytest.raises(ConfigError, match="not both"):
        AutoContextSession(session_id, db_url, client=client)


def test_without_the_filter_a_long_run_goes_over_the_window(
    make_session: Callable[..., AutoContextSession], caplog: pytest.LogCaptureFixture
) -> None:
    """What the README says happens without the filter: the session compresses what it
    stores, and the SDK still sends every item of the run at each model call. The session
    says so, once, naming `run_config()`."""
    from agents import set_tracing_disabled

    session = make_session(config=_window_config())
    set_tracing_disabled(True)
    agent_model = ScriptedAgent(calls_per_run=48)
    work = framework_runs.Work()
    with caplog.at_level(logging.WARNING, logger="autoctx"):
        _run_once(session, agent_model, work, "Do the work", stream=False, bounded=False)
        _run_once(
            session, ScriptedAgent(calls_per_run=2), work, "More", stream=False, bounded=False
        )
    assert [e for e in session.memory().events() if e.status == "applied"]
    assert agent_model.largest_request() > 5 * framework_runs.WINDOW
    assert agent_model.over(framework_runs.WINDOW) > 30
    (warning,) = [
        r.getMessage() for r in caplog.records if "call_model_input_filter" in r.getMessage()
    ]
    assert "run_config=session.run_config()" in warning and session.session_id in warning


def test_the_filter_keeps_room_for_the_tool_definitions_and_instructions(
    make_session: Callable[..., AutoContextSession],
) -> None:
    """The whole request (messages, tool definitions and instructions) stays under the window:
    the filter measures the agent's tools and instructions into the session's reserve."""
    from agents import set_tracing_disabled

    session = make_session(config=AutoContextConfig(max_tokens=framework_runs.SMALL_WINDOW))
    set_tracing_disabled(True)
    agent_model = ScriptedAgent(calls_per_run=30)
    work = framework_runs.Work(framework_runs.small_output_size)
    final = _run_once(session, agent_model, work, "Do the 30 steps", stream=False, bounded=True)
    assert final == agent_model.final_answer
    reserve = session.memory().config.reserve_tokens
    encoding = get_encoding("o200k_base")
    whole = [
        tokens + len(encoding.encode(json.dumps(body.get("tools") or [])))
        for tokens, body in zip(agent_model.inputs, agent_model.requests, strict=True)
    ]
    tools = len(encoding.encode(json.dumps(agent_model.requests[0].get("tools") or [])))
    assert tools * 0.8 < reserve, (tools, reserve)  # the tools are counted (instructions too)
    assert max(whole) < framework_runs.SMALL_WINDOW, max(whole)


@pytest.mark.parametrize("stream", [False, True], ids=["run", "run_streamed"])
def test_a_run_with_the_filter_is_not_warned_of(
    make_session: Callable[..., AutoContextSession],
    caplog: pytest.LogCaptureFixture,
    stream: bool,
) -> None:
    from agents import set_tracing_disabled

    session = make_session(config=_window_config())
    set_tracing_disabled(True)
    agent_model = ScriptedAgent(calls_per_run=3)
    with caplog.at_level(logging.WARNING, logger="autoctx"):
        final = _run_once(
            session, agent_model, framework_runs.Work(), "Go", stream=stream, bounded=True
        )
    assert final == agent_model.final_answer
    assert not [r for r in caplog.records if "call_model_input_filter" in r.getMessage()]


def test_many_short_runs_and_a_restart_stay_under_the_window(
    make_session: Callable[..., AutoContextSession],
) -> None:
    from agents import set_tracing_disabled

    set_tracing_disabled(True)
    agent_model = ScriptedAgent(
        calls_per_run=3, context_calls={1: ("context_search", {"query": '"FACT-0002"'})}
    )
    work = framework_runs.Work()
    finals: list[Any] = []

    async def runs(session: AutoContextSession, prompts: range) -> None:
        with OpenAIServer(default=agent_model) as srv:
            agent, client = _sdk_agent(srv, session, work)
            for k in prompts:
                # Streamed and plain runs alternate: both store each item once.
                finals.append(
                    await _sdk_run(agent, f"Task {k}", session, stream=k % 2 == 1, bounded=True)
                )
            await client.close()

    first = make_session(config=_window_config())
    run(runs(first, range(13)))
    # A restart: new objects, the same session id, the runs continue where they stopped.
    agent_model.requests.clear()
    second = make_session(first.session_id, config=_window_config())
    run(runs(second, range(13, 25)))
    assert finals == [agent_model.final_answer] * 25
    framework_runs.assert_under_window(agent_model)
    first_after_restart = json.dumps(agent_model.requests[0]["messages"])
    assert "Task 12" in first_after_restart
    mem = second.memory()
    assert [e for e in mem.events() if e.status == "applied"]
    framework_runs.assert_searches_found_the_fact(agent_model, later_runs=12)
    framework_runs.assert_each_stored_once(mem, prompts=25, calls=75)
    framework_runs.assert_reachable(mem, range(1, work.calls + 1))


def test_run_config_sets_the_filter_and_keeps_other_options(
    make_session: Callable[..., AutoContextSession],
) -> None:
    from agents import RunConfig

    session = make_session()
    config = session.run_config(RunConfig(workflow_name="w"), tracing_disabled=True)
    assert config.call_model_input_filter == session.call_model_input_filter
    assert (config.workflow_name, config.tracing_disabled) == ("w", True)
    assert session.run_config(config).call_model_input_filter == session.call_model_input_filter

    def other(data: Any) -> Any:
        return data.model_data

    with pytest.raises(ConfigError, match="call_model_input_filter"):
        session.run_config(RunConfig(call_model_input_filter=other))
    with pytest.raises(ConfigError, match="call_model_input_filter"):
        session.run_config(call_model_input_filter=other)


def test_the_filter_keeps_reasoning_with_its_calls_and_outputs_after_them(
    make_session: Callable[..., AutoContextSession],
) -> None:
    """A Responses-model run (reasoning, call, output per turn) given to the filter as the SDK
    gives it, with no session saving the turns: the filter stores each turn once, and what it
    returns keeps each reasoning item right before its call and each output after its call."""
    session = make_session(config=AutoContextConfig(max_tokens=6_000))
    run_input: list[dict[str, Any]] = [{"role": "user", "content": "Do the work"}]
    for i in range(30):
        run_input += [
            {"type": "reasoning", "id": f"rs_{i}", "summary": [], "encrypted_content": f"e{i}"},
            {
                "type": "function_call",
                "id": f"fc_{i}",
                "call_id": f"call_{i}",
                "name": "work",
                "arguments": json.dumps({"step": i}),
            },
            {
                "type": "function_call_output",
                "call_id": f"call_{i}",
                "output": tool_output(i, 3000),
            },
        ]
        sent = session.filter_input_sync(copy.deepcopy(run_input))
        assert session.memory().token_count() < 6_000
        called: set[str] = set()
        for k, item in enumerate(sent):
            if item.get("type") == "reasoning":
                assert sent[k + 1].get("type") == "function_call", sent[k + 1]
            if item.get("type") == "function_call":
                called.add(item["call_id"])
            if item.get("type") == "function_call_output":
                assert item["call_id"] in called
    mem = session.memory()
    assert [e for e in mem.events() if e.status == "applied"]
    framework_runs.assert_each_stored_once(mem, prompts=1, calls=30)


@pytest.mark.slow
def test_the_sdk_session_suite_fails_when_no_test_ran(tmp_path: Path) -> None:
    """bench/sdk_session_suite.py over an SDK source whose session tests cannot be collected
    (as when a test dependency such as httpx is missing): nothing builds a session, and the
    script exits 1 instead of printing "0 tests ran" and passing."""
    suite = Path(__file__).resolve().parent.parent / "bench" / "sdk_session_suite.py"
    tests = tmp_path / "tests" / "memory"
    tests.mkdir(parents=True)
    (tests / "test_session.py").write_text("import a_test_dependency_that_is_not_installed\n")
    proc = subprocess.run(
        [sys.executable, str(suite), "--source", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "0 built an AutoContextSession" in proc.stdout
    assert "this run checked nothing" in proc.stdout
