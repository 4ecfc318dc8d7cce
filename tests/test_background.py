"""Compression in the background (issue 13, "the agent never waits"): at the trigger a memory
opened with ``background=True`` compresses in a thread (a task for the async memory) while the
agent appends and reads on; a call waits only when the next model call would be over the
window. Several ranges of one pass are summarized concurrently.

Against real PostgreSQL and the local OpenAI-protocol server, whose answers a `Gate` holds back
until the test lets them go, so that "while the summarizer writes" is a fact of the test, not a
matter of timing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from autoctx import (
    AsyncAutoContextMemory,
    AutoContextClient,
    AutoContextConfig,
    AutoContextMemory,
    ConfigError,
    Msg,
    OfflineSummarizer,
    OpenAISummarizer,
    RuntimeOptions,
    SessionNotFound,
    SummarizerError,
    ToolUseBlock,
)
from autoctx._memory import internals
from autoctx._worker import AutoContextWorker
from tests.dbsql import sql
from tests.histories import NO_MASKING, SMALL, file_dump
from tests.invariants import assert_consistent
from tests.openai_server import OpenAIServer, Reply

#: A count trigger at 60 messages, a 20,000-token window; S1 summarizes the older part of a
#: long task with one call.
CONFIG = SMALL
FORK = multiprocessing.get_context("fork")
#: Seconds a test waits for something that should happen at once (never reached when it does).
PATIENCE = 10.0


class Gate:
    """A summarizer endpoint that holds each answer until `release()`, and counts the requests
    in flight (at most how many at once, and how many in all)."""

    def __init__(self, reply: Reply | None = None, hold_s: float | None = None) -> None:
        self.reply = reply if reply is not None else Reply.text()
        #: With `hold_s`, each answer waits that long instead of for the gate.
        self.hold_s = hold_s
        self.asked = threading.Event()
        self._open = threading.Event()
        self._lock = threading.Lock()
        self.in_flight = 0
        self.max_in_flight = 0
        self.requests = 0

    def release(self) -> None:
        self._open.set()

    def __call__(self, body: dict[str, Any]) -> Reply:
        with self._lock:
            self.requests += 1
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.asked.set()
        try:
            if self.hold_s is not None:
                time.sleep(self.hold_s)
            else:
                self._open.wait(PATIENCE)
        finally:
            with self._lock:
                self.in_flight -= 1
        return self.reply


@pytest.fixture(scope="module")
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer() as srv:
        yield srv


@pytest.fixture
def gate(server: OpenAIServer) -> Iterator[Gate]:
    held = Gate()
    server.reset()
    server.set_default(held)
    yield held
    held.release()  # whatever a test left waiting answers now


def _summarizer(server: OpenAIServer) -> OpenAISummarizer:
    return OpenAISummarizer(base_url=server.base_url, api_key="test", timeout=20, max_retries=0)


def _group(rng: random.Random, call_id: str, lines: int = 20) -> list[Msg]:
    call = ToolUseBlock(call_id, "read_file", f'{{"path": "src/{call_id}.py"}}')
    return [Msg.assistant(None, [call]), Msg.tool(call.id, file_dump(rng, lines))]


def _task(seed: int, steps: int, lines: int = 20) -> list[Msg]:
    """A long task: steps of one call with a mid-sized output each (under the large size)."""
    rng = random.Random(seed)
    msgs = [Msg.system("You are a coding agent."), Msg.user("Check every module.")]
    for s in range(steps):
        msgs.extend(_group(rng, f"t{s}", lines))
    return msgs


def _working_ids(mem: AutoContextMemory) -> list[int]:
    return [m.id or 0 for m in internals(mem).working()]


def _at_trigger(open_memory: Callable[..., AutoContextMemory], summarizer: Any, **kw: Any) -> Any:
    """A memory over its count trigger and well under its window."""
    mem = open_memory(config=CONFIG, summarizer=summarizer, **kw)
    mem.add(_task(1, 30))
    info = mem.refresh()
    assert info.message_count >= CONFIG.msg_threshold
    assert info.token_count < CONFIG.token_trigger
    return mem


# ---------------------------------------------------------------------------------------------
# The agent goes on while the summarizer writes
# ---------------------------------------------------------------------------------------------


def test_appends_during_a_background_compression_are_kept_after_its_summary(
    open_memory: Callable[..., AutoContextMemory], server: OpenAIServer, gate: Gate
) -> None:
    mem = _at_trigger(open_memory, _summarizer(server), background=True)
    assert mem.compress_if_needed() == []  # started, not waited for
    assert gate.asked.wait(PATIENCE), "the background compression never asked the summarizer"
    future = mem.compress_in_background()  # the one that runs
    assert not future.done()

    rng = random.Random(9)
    appended: list[int] = []
    for k in range(3):  # the agent goes on while the summarizer writes
        appended.extend(m.id or 0 for m in mem.add(_group(rng, f"late{k}", lines=3)))
        assert mem.to_openai()[-1]["role"] == "tool"
    assert not future.done()
    gate.release()
    events = future.result(PATIENCE)

    applied = [e for e in events if e.status == "applied"]
    assert applied and all(e.strategy == 1 for e in applied), events
    working = _working_ids(mem)
    assert working[-len(appended) :] == appended, "the appends stay, in order, at the end"
    summary_at = working.index(applied[-1].summary_message_id or 0)
    assert summary_at < len(working) - len(appended), "they come after the summary"
    assert_consistent(mem)
    # The events surface through the agent's next call too.
    assert [e.id for e in mem.compress_if_needed()] == [e.id for e in events]
    assert mem.compress_if_needed() == []


def test_a_call_waits_only_when_the_next_model_call_would_be_over_the_window(
    open_memory: Callable[..., AutoContextMemory], server: OpenAIServer, gate: Gate
) -> None:
    mem = _at_trigger(open_memory, _summarizer(server), background=True)
    future = mem.compress_in_background()
    assert gate.asked.wait(PATIENCE)
    # Under the window: nothing waits for the summarizer, which is held back.
    assert mem.compress_if_needed() == []
    assert len(mem.to_openai()) == mem.message_count()
    rng = random.Random(4)
    k = 0
    while mem.token_count() < CONFIG.max_tokens:
        mem.add(_group(rng, f"big{k}", lines=150))
        k += 1
    read: list[list[dict[str, Any]]] = []
    reader = threading.Thread(target=lambda: read.append(mem.to_openai()))
    reader.start()
    reader.join(0.3)
    assert reader.is_alive(), "at the window, the read waits for the compression"
    gate.release()
    reader.join(PATIENCE)
    assert read, "the read never came back"
    assert mem.token_count() < CONFIG.max_tokens
    future.result(PATIENCE)  # it may still go on after the read: its events come at its end
    events = mem.compress_if_needed()
    assert any(e.status == "applied" and e.strategy == 1 for e in events), "the background S1"
    assert_consistent(mem)


def test_no_model_call_is_over_the_window_while_compression_runs_behind(
    open_memory: Callable[..., AutoContextMemory], server: OpenAIServer
) -> None:
    """An agent that appends faster than the summarizer writes (40 ms an answer): every read
    the model would get stays under the window."""
    server.reset()
    slow = Gate(hold_s=0.04)
    server.set_default(slow)
    # Masking off: the short tags let it keep this task under the target alone (no summary).
    config = AutoContextConfig(max_tokens=6000, msg_threshold=1000, last_keep=6, **NO_MASKING)
    mem = open_memory(config=config, summarizer=_summarizer(server), background=True)
    rng = random.Random(11)
    mem.add([Msg.system("You are a coding agent."), Msg.user("Migrate every module.")])
    for step in range(45):
        mem.add(_group(rng, f"s{step}", lines=12))
        mem.compress_if_needed()
        context = mem.messages()
        tokens = sum(m.tokens or 0 for m in context)
        assert tokens < config.max_tokens, f"step {step}: {tokens} tokens"
    internals(mem).wait_background()
    events = [e for e in mem.events() if e.status == "applied"]
    assert events, "nothing was compressed"
    assert slow.requests >= 1, "the summarizer was never asked"
    assert_consistent(mem)


def test_a_range_compressed_by_another_writer_meanwhile_is_a_clean_conflict(
    open_memory: Callable[..., AutoContextMemory], server: OpenAIServer, gate: Gate
) -> None:
    mem = _at_trigger(open_memory, _summarizer(server), background=True)
    future = mem.compress_in_background()
    assert gate.asked.wait(PATIENCE)
    other = open_memory(mem.session_id, config=CONFIG, summarizer=OfflineSummarizer())
    won = other.compress_if_needed()
    assert any(e.status == "applied" for e in won)
    gate.release()
    events = future.result(PATIENCE)
    conflicts = [e for e in events if e.status == "conflict"]
    assert conflicts, events
    assert not [e for e in events if e.status == "applied"], "nothing of the loser applies"
    assert_consistent(mem)


# ---------------------------------------------------------------------------------------------
# Stopping, and failures
# ---------------------------------------------------------------------------------------------


def _event_rows(mem: AutoContextMemory) -> list[Any]:
    return sql(
        mem, "select id, status from compression_events where session_id = :s", s=mem.session_id
    )


def test_close_during_a_background_compression_writes_nothing_after_it(
    open_memory: Callable[..., AutoContextMemory], server: OpenAIServer, gate: Gate
) -> None:
    mem = _at_trigger(open_memory, _summarizer(server), background=True)
    future = mem.compress_in_background()
    assert gate.asked.wait(PATIENCE)
    before = _event_rows(mem)
    mem.close()  # returns at once: the answer in flight is not waited for
    assert not future.done()
    gate.release()
    assert future.result(PATIENCE) == [], "stopped before it could apply"
    reopened = open_memory(mem.session_id, summarizer=OfflineSummarizer())
    assert _event_rows(reopened) == before, "nothing was written after close()"
    assert_consistent(reopened)
    assert any(e.status == "applied" for e in reopened.compress_if_needed())
    assert_consistent(reopened)


def test_closing_the_client_stops_its_background_compressions(
    db_url: str, session_id: str, server: OpenAIServer, gate: Gate
) -> None:
    client = AutoContextClient(db_url)
    mem = client.open(session_id, CONFIG, summarizer=_summarizer(server), background=True)
    mem.add(_task(2, 30))
    future = mem.compress_in_background()
    assert gate.asked.wait(PATIENCE)
    client.close()
    gate.release()
    assert future.result(PATIENCE) == []
    assert client.runner.join(PATIENCE), "the compression's thread ended"
    with AutoContextClient(db_url) as fresh:
        reopened = fresh.open(session_id, summarizer=OfflineSummarizer())
        assert not [e for e in reopened.events() if e.status == "applied"]
        assert_consistent(reopened)


def test_a_summarizer_failure_in_the_background_is_an_event_the_next_call_returns(
    open_memory: Callable[..., AutoContextMemory], server: OpenAIServer
) -> None:
    server.reset()
    server.set_default(Reply.server_error(500))
    mem = _at_trigger(open_memory, _summarizer(server), background=True)
    future = mem.compress_in_background()
    events = future.result(PATIENCE)
    failed = [e for e in events if e.status == "failed"]
    assert failed and "http_error" in (failed[0].error or ""), events
    assert [e.id for e in mem.compress_if_needed()] == [e.id for e in events]
    assert [e.id for e in mem.events() if e.status == "failed"] == [e.id for e in failed]
    server.set_default(Reply.text())


def test_an_error_that_ends_a_background_compression_is_raised_by_the_next_call(
    open_memory: Callable[..., AutoContextMemory], server: OpenAIServer
) -> None:
    server.reset()
    server.set_default(Reply.server_error(500))
    strict = RuntimeOptions(strict=True)
    mem = open_memory(
        config=CONFIG, options=strict, summarizer=_summarizer(server), background=True
    )
    mem.add(_task(3, 30))
    future = mem.compress_in_background()
    assert isinstance(future.exception(PATIENCE), SummarizerError)
    with pytest.raises(SummarizerError):
        mem.compress_if_needed()
    server.set_default(Reply.text())
    mem.compress_if_needed()  # raised once; the next call compresses again
    internals(mem).wait_background()
    assert any(e.status == "applied" for e in mem.compress_if_needed())
    assert_consistent(mem)


def test_a_forked_child_does_not_inherit_the_parents_background_compression(
    open_memory: Callable[..., AutoContextMemory], server: OpenAIServer, gate: Gate
) -> None:
    mem = _at_trigger(open_memory, _summarizer(server), background=True)
    inherited = mem.compress_in_background()
    assert gate.asked.wait(PATIENCE)
    results: multiprocessing.SimpleQueue[tuple[bool, bool, int]] = FORK.SimpleQueue()

    def child() -> None:
        # The parent's thread does not exist here: nothing may wait for it.
        mem.add(_group(random.Random(2), "child", lines=3))
        mem.to_openai()
        mine = mem.compress_in_background()
        results.put((mine is inherited, inherited.done(), mem._runner.running))
        mem.close()

    process = FORK.Process(target=child)
    process.start()
    process.join(PATIENCE)
    assert process.exitcode == 0
    is_inherited, done_in_child, threads_before = results.get()
    assert not is_inherited and not done_in_child
    assert threads_before <= 1, "only the child's own compression runs in the child"
    gate.release()
    assert any(e.status == "applied" for e in inherited.result(PATIENCE)), "the parent's goes on"
    assert_consistent(mem)


def test_a_fork_is_opened_through_its_parents_client_in_its_background_mode(
    db_url: str, session_id: str, server: OpenAIServer, gate: Gate
) -> None:
    client = AutoContextClient(db_url)
    try:
        parent = client.open(session_id, CONFIG, summarizer=_summarizer(server), background=True)
        parent.add(_task(3, 30))
        child = parent.fork(f"{session_id}-fork")
        assert child.compress_if_needed() == [], "at the trigger, the child does not wait"
        assert gate.asked.wait(PATIENCE)
        assert client.runner.running == 1, "the child compresses on its client's threads"
        client.close()
        with pytest.raises(SessionNotFound, match="closed"):
            child.messages()
        gate.release()
        assert client.runner.join(PATIENCE), "closing the client stopped the child's compression"
    finally:
        client.close()
    with AutoContextClient(db_url) as fresh:
        reopened = fresh.open(f"{session_id}-fork", summarizer=OfflineSummarizer())
        assert not [e for e in reopened.events() if e.strategy > 0], "nothing after close()"


def test_an_async_fork_is_closed_by_its_parents_client_and_compresses_in_a_task(
    db_url: str, session_id: str, server: OpenAIServer, gate: Gate
) -> None:
    async def scenario() -> None:
        client = AutoContextClient(db_url)
        try:
            parent = AsyncAutoContextMemory(
                client.open(session_id, CONFIG, summarizer=_summarizer(server), background=True)
            )
            await parent.add(_task(4, 30))
            child = await parent.fork(f"{session_id}-fork")
            assert await child.compress_if_needed() == [], "the child's compression is a task"
            assert await asyncio.to_thread(gate.asked.wait, PATIENCE)
            await asyncio.to_thread(client.close)
            with pytest.raises(SessionNotFound, match="closed"):
                await child.messages()
            gate.release()
            await child.close()  # the task is cancelled cleanly
        finally:
            client.close()

    asyncio.run(scenario())


def test_a_fork_of_a_worker_mode_memory_leaves_compression_to_the_workers(
    open_memory: Callable[..., AutoContextMemory], session_id: str, gate: Gate
) -> None:
    parent = _at_trigger(open_memory, OfflineSummarizer(), background="worker")
    child = parent.fork(f"{session_id}-fork")
    assert child.compress_if_needed() == []
    assert not [e for e in child.events() if e.strategy > 0], "nothing compressed here"


# ---------------------------------------------------------------------------------------------
# asyncio: a task
# ---------------------------------------------------------------------------------------------


def test_the_async_memory_compresses_in_a_task_while_the_agent_goes_on(
    open_memory: Callable[..., AutoContextMemory], server: OpenAIServer, gate: Gate
) -> None:
    async def scenario() -> None:
        mem = AsyncAutoContextMemory(_at_trigger(open_memory, _summarizer(server), background=True))
        assert await mem.compress_if_needed() == []
        assert await asyncio.to_thread(gate.asked.wait, PATIENCE)
        task = await mem.compress_in_background()
        assert isinstance(task, asyncio.Task) and not task.done()
        late = await mem.add(_group(random.Random(1), "late", lines=3))
        assert (await mem.to_openai())[-1]["role"] == "tool"
        gate.release()
        events = await task
        assert any(e.status == "applied" for e in events)
        assert _working_ids(mem.sync)[-2:] == [m.id for m in late]
        assert [e.id for e in await mem.compress_if_needed()] == [e.id for e in events]
        assert_consistent(mem.sync)

    asyncio.run(scenario())


def test_the_async_memory_waits_only_at_the_window(
    open_memory: Callable[..., AutoContextMemory], server: OpenAIServer, gate: Gate
) -> None:
    async def scenario() -> None:
        mem = AsyncAutoContextMemory(_at_trigger(open_memory, _summarizer(server), background=True))
        task = await mem.compress_in_background()
        assert await asyncio.to_thread(gate.asked.wait, PATIENCE)
        rng = random.Random(4)
        k = 0
        while await mem.token_count() < CONFIG.max_tokens:
            await mem.add(_group(rng, f"big{k}", lines=150))
            k += 1
        read = asyncio.ensure_future(mem.to_openai())
        done, _ = await asyncio.wait([read], timeout=0.3)
        assert not done, "at the window, the read waits for the compression"
        gate.release()
        await asyncio.wait_for(read, PATIENCE)
        assert await mem.token_count() < CONFIG.max_tokens
        await task
        assert_consistent(mem.sync)

    asyncio.run(scenario())


def test_closing_the_async_memory_cancels_its_task_cleanly(
    open_memory: Callable[..., AutoContextMemory], server: OpenAIServer, gate: Gate
) -> None:
    async def scenario() -> str:
        sync = _at_trigger(open_memory, _summarizer(server), background=True)
        mem = AsyncAutoContextMemory(sync)
        task = await mem.compress_in_background()
        assert await asyncio.to_thread(gate.asked.wait, PATIENCE)
        await mem.close()
        assert task.cancelled()
        return sync.session_id

    sid = asyncio.run(scenario())
    gate.release()
    reopened = open_memory(sid, summarizer=OfflineSummarizer())
    assert not [e for e in reopened.events() if e.status == "applied"]
    assert_consistent(reopened)


# ---------------------------------------------------------------------------------------------
# Several ranges of one pass at once
# ---------------------------------------------------------------------------------------------


def _three_runs() -> list[Msg]:
    """A long task whose older part holds three tool runs (system notes split them): S1 plans
    them in one pass, three ranges, three summarizer requests."""
    rng = random.Random(5)
    msgs = [Msg.system("You are a coding agent."), Msg.user("Check every module.")]
    n = 0
    for run in range(4):
        if run:
            msgs.append(Msg.system(f"Part {run}: keep going."))
        for _ in range(6 if run < 3 else 5):
            msgs.extend(_group(rng, f"c{n}"))
            n += 1
    return msgs


RUNS_CONFIG = dataclasses.replace(SMALL, msg_threshold=40)


@pytest.mark.parametrize("concurrency", [1, 2, 3])
def test_the_ranges_of_one_pass_are_summarized_concurrently_within_the_bound(
    concurrency: int, open_memory: Callable[..., AutoContextMemory], server: OpenAIServer
) -> None:
    server.reset()
    overlap = Gate(hold_s=0.15)
    server.set_default(overlap)
    options = RuntimeOptions(summarizer_concurrency=concurrency)
    mem = open_memory(config=RUNS_CONFIG, options=options, summarizer=_summarizer(server))
    mem.add(_three_runs())
    events = mem.compress_if_needed()
    applied = [e for e in events if e.status == "applied"]
    assert overlap.requests == 3 and len(applied) == 3, "the workload gives one pass 3 ranges"
    assert overlap.max_in_flight == concurrency
    # One transaction, in range order, whatever order the answers came in.
    assert len({e.session_version for e in applied}) == 1
    assert [e.replaced_ids[0] for e in applied] == sorted(e.replaced_ids[0] for e in applied)
    assert_consistent(mem)


def test_the_async_twin_awaits_the_ranges_of_one_pass_concurrently(
    open_memory: Callable[..., AutoContextMemory], server: OpenAIServer
) -> None:
    server.reset()
    overlap = Gate(hold_s=0.15)
    server.set_default(overlap)
    options = RuntimeOptions(summarizer_concurrency=2)
    sync = open_memory(config=RUNS_CONFIG, options=options, summarizer=_summarizer(server))
    sync.add(_three_runs())
    events = asyncio.run(AsyncAutoContextMemory(sync).compress_if_needed())
    assert overlap.requests == 3 and overlap.max_in_flight == 2
    assert len([e for e in events if e.status == "applied"]) == 3
    assert_consistent(sync)


# ---------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------


def test_a_bad_background_mode_or_bound_is_refused_naming_it(
    open_memory: Callable[..., AutoContextMemory], db_url: str
) -> None:
    with pytest.raises(ConfigError, match="background must be False, True or 'worker'"):
        open_memory(background="yes")
    with pytest.raises(ConfigError, match="summarizer_concurrency must be a positive integer"):
        RuntimeOptions(summarizer_concurrency=0)
    with pytest.raises(ConfigError, match="threads must be a positive integer"):
        AutoContextWorker(db_url, threads=0)


# ---------------------------------------------------------------------------------------------
# What the agent appends meanwhile: planned for, not chased
# ---------------------------------------------------------------------------------------------


def _round(rng: random.Random, k: int) -> list[Msg]:
    """A round of a tool chat: a question, one call and its result, the answer."""
    question = Msg.user(f"Question {k}: what does module {k} do?")
    group = _group(rng, f"r{k}", 30)
    return [question, *group, Msg.assistant(f"Module {k} serves {rng.randrange(10**6)} requests.")]


def test_a_background_compression_plans_for_what_the_agent_appended_during_the_last_one(
    open_memory: Callable[..., AutoContextMemory], server: OpenAIServer, gate: Gate
) -> None:
    """The agent outran the first compression (it appended while the summarizer wrote): the
    next one plans for as much to come in before it commits, and its fold keeps that much
    less of the older rounds. A twin given the same messages that compresses in the agent's
    calls (nothing comes in meanwhile) folds as before."""
    config = dataclasses.replace(CONFIG, msg_threshold=1000)
    summarizer = _summarizer(server)
    behind = open_memory(config=config, summarizer=summarizer, background=True)
    twin = open_memory(f"{behind.session_id}-twin", config=config, summarizer=summarizer)
    rng = random.Random(5)
    k = 0

    def both_until(tokens: int) -> None:
        nonlocal k
        while behind.token_count() < tokens:
            r = _round(rng, k)
            behind.add(r)
            twin.add(r)
            k += 1

    for mem in (behind, twin):
        mem.add(Msg.system("You answer questions about the code."))
    both_until(config.token_trigger)
    assert behind.compress_if_needed() == []
    running = behind.compress_in_background()
    assert gate.asked.wait(PATIENCE)
    before = behind.token_count()
    late = [_round(rng, k + j) for j in range(3)]
    for r in late:  # the agent goes on while the summarizer writes
        behind.add(r)
    k += len(late)
    arrived = behind.token_count() - before
    gate.release()
    first = running.result(PATIENCE)
    assert [e.strategy for e in first if e.status == "applied"] == [7]
    twin.compress_if_needed()  # the same fold, written before the late rounds came
    for r in late:
        twin.add(r)
    assert abs(behind.token_count() - twin.token_count()) < 50  # the summaries' wording

    both_until(config.token_trigger)
    [fold] = [e for e in behind.compress_in_background().result(PATIENCE) if e.status == "applied"]
    [twin_fold] = [e for e in twin.compress_if_needed() if e.status == "applied"]
    assert fold.strategy == twin_fold.strategy == 7
    assert len(fold.replaced_ids) > len(twin_fold.replaced_ids), "it folds deeper"
    deeper = twin_fold.tokens_after - fold.tokens_after
    assert 0 < deeper <= arrived + 50, (deeper, arrived)
    assert_consistent(behind)
