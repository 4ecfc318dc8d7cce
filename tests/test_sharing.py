"""One memory, many callers; one session id, many incarnations (docs/design.md §5).

- A memory whose session was deleted (and created again under the same id, by anyone, for any
  tenant) gets `SessionNotFound` on every call and never reads or writes the new session.
- Caches only ever take what committed: an append interrupted before its commit leaves
  nothing the next append trusts.
- One memory shared by threads, or by gathered asyncio tasks, behaves as if its calls were made
  one after the other: no call fails, no conflict, no summarizer call for a range another call
  already replaced.
- A process that forks does not share pooled connections with its child.
- `AutoContextClient` owns the pool and the memories opened through it.
"""

from __future__ import annotations

import asyncio
import os
import random
import threading
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from autoctx import (
    AsyncAutoContextMemory,
    AutoContextClient,
    AutoContextConfig,
    AutoContextMemory,
    InvalidMessage,
    Msg,
    OfflineSummarizer,
    SessionNotFound,
    SummaryRequest,
    SummaryResult,
    ToolUseBlock,
)
from autoctx._memory import internals
from tests.dbsql import sql
from tests.histories import tool_group
from tests.invariants import assert_consistent

Open = Callable[..., AutoContextMemory]


def _calls(call_id: str) -> Msg:
    return Msg.assistant(tool_calls=[ToolUseBlock(call_id, "read_file", '{"path": "a.py"}')])


def _result(call_id: str) -> Msg:
    return Msg.tool(call_id, "contents of a.py", name="read_file")


def _stale_calls(mem: AutoContextMemory) -> list[tuple[str, Callable[[], object]]]:
    """Every call of a memory, as (name, thunk)."""
    return [
        ("add", lambda: mem.add(Msg.user("into the wrong session"))),
        ("add a tool result", lambda: mem.add(_result("c1"))),
        ("messages", mem.messages),
        ("to_openai", mem.to_openai),
        ("refresh", mem.refresh),
        ("token_count", lambda: mem.token_count()),
        ("needs_compression", mem.needs_compression),
        ("compress_if_needed", mem.compress_if_needed),
        ("events", mem.events),
        ("reload", lambda: mem.reload("00000000-0000-4000-8000-000000000000")),
        ("pop_last", mem.pop_last),
        ("clear", mem.clear),
        # What the Agents SDK session's atomic replacement runs.
        (
            "clear and add",
            lambda: internals(mem).replace_working(Msg.user("into the wrong session")),
        ),
        ("set_plan", lambda: mem.set_plan({"goal": "g", "steps": []})),
        ("delete", mem.delete),
    ]


@pytest.mark.parametrize(
    "tenants", [(None, None), ("acme", "globex")], ids=["untenanted", "tenants"]
)
def test_a_stale_memory_never_touches_the_session_created_again_under_its_id(
    open_memory: Open, session_id: str, tenants: tuple[str | None, str | None]
) -> None:
    old_tenant, new_tenant = tenants
    stale = open_memory(tenant=old_tenant)
    # The stale memory's store has written the latest version itself and knows call c1 open:
    # exactly what its one-statement append trusts.
    stale.add([Msg.user("first incarnation"), _calls("c1")])
    open_memory(tenant=old_tenant, create=False).delete()

    new = open_memory(tenant=new_tenant)
    # The new incarnation reaches the stale memory's version with other messages.
    new.add([Msg.user("second incarnation"), Msg.assistant("an answer")])
    before = new.to_openai()
    assert new.version() == 1 and stale._store.totals_after_append() is not None

    for name, call in _stale_calls(stale):
        with pytest.raises(SessionNotFound):
            call()
        assert new.to_openai() == before, f"{name} changed the new session"
    assert new.events() == []
    assert_consistent(new)
    # The new session's own tool calls are its own: its first result is accepted.
    new.add(_calls("c1"))
    new.add(_result("c1"))
    assert_consistent(new)


def test_an_append_interrupted_before_its_commit_leaves_nothing_the_next_append_trusts(
    open_memory: Open,
) -> None:
    mine, other = open_memory(), open_memory()
    interrupted = {"armed": True}

    def interrupt(conn: Any) -> None:
        if interrupted["armed"]:
            interrupted["armed"] = False
            raise KeyboardInterrupt  # a Ctrl-C at the very commit of a locked append

    # The first append of a store takes the locked path: lock, validate, write, commit.
    sa.event.listen(mine.engine, "commit", interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            mine.add([Msg.user("question"), _calls("c1")])
    finally:
        sa.event.remove(mine.engine, "commit", interrupt)
    assert mine.to_openai() == []

    # Another writer reaches the version the interrupted append would have made.
    other.add(Msg.user("another writer's message"))
    assert other.version() == 1

    # c1 never committed: its result is an orphan, refused against the truth.
    with pytest.raises(InvalidMessage):
        mine.add(_result("c1"))
    assert [m["content"] for m in mine.to_openai()] == ["another writer's message"]
    assert_consistent(mine)


class _Counting:
    """The offline summarizer, counting its calls (thread-safe) and slow enough for other
    callers to come in while a call is in flight."""

    def __init__(self) -> None:
        self.inner = OfflineSummarizer()
        self.calls = 0
        self._lock = threading.Lock()

    def summarize(self, request: SummaryRequest) -> SummaryResult:
        with self._lock:
            self.calls += 1
        threading.Event().wait(0.005)
        return self.inner.summarize(request)


class _AsyncCounting(_Counting):
    """The same, awaitable: the async memory then waits for it on the event loop, with other
    tasks' calls going on meanwhile."""

    async def asummarize(self, request: SummaryRequest) -> SummaryResult:
        with self._lock:
            self.calls += 1
        await asyncio.sleep(0.005)
        return self.inner.summarize(request)


def _sharing_config() -> AutoContextConfig:
    return AutoContextConfig(max_tokens=6000, msg_threshold=60, large_payload_chars=1500)


def _assert_serialized(mem: AutoContextMemory, summarizer: _Counting) -> None:
    events = mem.events()
    assert not [e for e in events if e.status == "conflict"]
    # Every summarizer call is accounted for by exactly one recorded attempt of this memory
    # (with the fact check's repair request, when the attempt made one, docs/design.md §6).
    with_model = [e for e in events if e.model is not None and e.strategy in (1, 4, 5, 6, 7)]
    assert summarizer.calls == sum(1 + (e.facts.repair_calls if e.facts else 0) for e in with_model)
    assert any(e.status == "applied" for e in events)
    assert_consistent(mem)


def _group(worker: int, step: int) -> list[Msg]:
    rng = random.Random(worker * 1000 + step)
    return [
        Msg.user(f"worker {worker} step {step}"),
        *tool_group(rng, [f"w{worker}s{step}"], step % 3 == 0),
    ]


def test_one_memory_shared_by_eight_threads(open_memory: Open) -> None:
    summarizer = _Counting()
    mem = open_memory(config=_sharing_config(), summarizer=summarizer)
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def work(worker: int) -> None:
        try:
            start.wait()
            for step in range(12):
                mem.add(_group(worker, step))
                mem.compress_if_needed()
                mem.to_openai()
        except BaseException as exc:  # every failure is the test's
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert errors == []
    # Each worker's group arrived whole: appends are atomic and in order per caller.
    originals = sql(
        mem,
        "select count(*) from messages where session_id = :s and kind = 'original'",
        s=mem.session_id,
    )[0][0]
    assert originals == sum(len(_group(w, s)) for w in range(8) for s in range(12))
    _assert_serialized(mem, summarizer)


@pytest.mark.parametrize("awaitable", [False, True], ids=["in-a-thread", "awaited"])
def test_one_async_memory_shared_by_64_gathered_tasks(open_memory: Open, awaitable: bool) -> None:
    summarizer = _AsyncCounting() if awaitable else _Counting()
    mem = AsyncAutoContextMemory(open_memory(config=_sharing_config(), summarizer=summarizer))

    async def task(worker: int) -> None:
        for step in range(3):
            await mem.add(_group(worker, step))
            await mem.compress_if_needed()
            await mem.to_openai()

    async def main() -> list[BaseException | None]:
        return await asyncio.gather(*(task(w) for w in range(64)), return_exceptions=True)

    results = asyncio.run(main())
    assert [r for r in results if r is not None] == []
    _assert_serialized(mem.sync, summarizer)


def _in_child(work: Callable[[], None]) -> int:
    """Run `work` in a forked child; its exit status (0: it passed)."""
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 1
        try:
            work()
            code = 0
        except BaseException:  # reported through the exit status
            import traceback

            traceback.print_exc()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_forked_child_does_not_share_pooled_connections(open_memory: Open) -> None:
    mem = open_memory()
    mem.add(Msg.user("before the fork"))
    with mem.engine.connect() as conn:
        parent_backend = conn.exec_driver_sql("select pg_backend_pid()").scalar_one()

    def child() -> None:
        with mem.engine.connect() as conn:
            backend = conn.exec_driver_sql("select pg_backend_pid()").scalar_one()
        assert backend != parent_backend, "the child used the parent's pooled connection"
        for k in range(20):
            mem.add(Msg.user(f"from the child {k}"))
        assert len(mem.messages()) == 21

    assert _in_child(child) == 0
    # The parent's pooled connection is intact (the child neither used nor closed it).
    with mem.engine.connect() as conn:
        assert conn.exec_driver_sql("select pg_backend_pid()").scalar_one() == parent_backend
    mem.add(Msg.user("after the fork"))
    assert len(mem.messages()) == 22
    assert_consistent(mem)


def test_a_client_owns_its_pool_and_the_memories_opened_through_it(
    db_url: str, session_id: str
) -> None:
    with AutoContextClient(db_url) as client:
        mem = client.open(session_id, summarizer=OfflineSummarizer())
        mem.add(Msg.user("hello"))
        assert mem.engine is client.engine
        # A second client is a second pool: closing one leaves the other working.
        with AutoContextClient(db_url) as other:
            again = other.open(session_id, summarizer=OfflineSummarizer(), create=False)
            assert again.engine is not mem.engine
        assert mem.to_openai() == [{"role": "user", "content": "hello"}]
    assert client.closed
    with pytest.raises(SessionNotFound):
        mem.messages()
    with pytest.raises(RuntimeError, match="closed"):
        client.open(session_id)
    # The session outlives the client.
    later = AutoContextMemory.open(session_id, db_url, summarizer=OfflineSummarizer())
    assert later.to_openai() == [{"role": "user", "content": "hello"}]


def test_memories_opened_without_a_client_share_one_client_until_it_is_closed(
    db_url: str, session_id: str
) -> None:
    """The shared default client: one per URL, made on the first open, closed (with its
    memories and its pool) by `close_shared(url)`; the next open makes a new one."""
    first = AutoContextMemory.open(session_id, db_url, summarizer=OfflineSummarizer())
    second = AutoContextMemory.open(f"{session_id}-2", db_url, summarizer=OfflineSummarizer())
    shared = AutoContextClient.shared(db_url)
    assert first.engine is second.engine is shared.engine, "one pool for the URL"
    first.add(Msg.user("hello"))
    AutoContextClient.close_shared(db_url)
    assert shared.closed
    for mem in (first, second):
        with pytest.raises(SessionNotFound, match="closed"):
            mem.messages()
    again = AutoContextMemory.open(session_id, db_url, summarizer=OfflineSummarizer())
    fresh = AutoContextClient.shared(db_url)
    assert fresh is not shared and not fresh.closed and again.engine is fresh.engine
    assert again.to_openai() == [{"role": "user", "content": "hello"}]


def test_an_async_memory_opened_through_a_client_is_closed_with_it(
    db_url: str, session_id: str
) -> None:
    async def scenario() -> None:
        with AutoContextClient(db_url) as client:
            mem = await client.open_async(session_id, summarizer=OfflineSummarizer())
            assert isinstance(mem, AsyncAutoContextMemory)
            await mem.add(Msg.user("hello"))
            assert mem.sync.engine is client.engine
            child = await mem.fork(f"{session_id}-fork")
            assert child.sync.engine is client.engine, "the fork is the client's too"
        for opened in (mem, child):
            with pytest.raises(SessionNotFound, match="closed"):
                await opened.messages()

    asyncio.run(scenario())


def test_clearing_keeps_every_original_offload_and_lineage_row(open_memory: Open) -> None:
    """docs/design.md §5: clearing empties the working context, records an event, and keeps
    every original, offload and lineage row; what was offloaded stays reloadable."""
    mem = open_memory(config=_sharing_config())
    for step in range(10):
        mem.add(_group(0, step))
    compressed = [e for e in mem.compress_if_needed() if e.status == "applied"]
    assert compressed
    # Every offload the compressions made (a masking pass, one event, makes one per output).
    made = {
        r.uuid: tuple(r.message_ids)
        for r in sql(
            mem, "select uuid, message_ids from offloads where session_id = :s", s=mem.session_id
        )
    }
    assert sorted(i for ids in made.values() for i in ids) == sorted(
        i for e in compressed for i in e.replaced_ids
    )

    def counts() -> tuple[int, ...]:
        return tuple(
            sql(mem, f"select count(*) from {t} where session_id = :s", s=mem.session_id)[0][0]
            for t in ("messages", "offloads", "lineage")
        )

    before = counts()
    working = [m.id for m in mem.messages()]
    event = mem.clear()
    assert (event.strategy, event.reason, event.messages_after) == (0, "clear", 0)
    # Nothing is deleted; one offload is added, holding what the clear took out.
    assert counts() == (before[0], before[1] + 1, before[2])
    assert event.offload_uuid is not None
    assert [m.id for m in mem.reload(event.offload_uuid)] == working
    assert mem.messages() == [] and (mem.message_count(), mem.token_count()) == (0, 0)
    for offload, ids in made.items():
        assert tuple(m.id for m in mem.reload(str(offload))) == ids
    # The session goes on after a clear.
    mem.add(Msg.user("a new start"))
    assert [m.text for m in mem.messages()] == ["a new start"]
