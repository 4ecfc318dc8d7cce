"""The async twin awaits an async summarizer (docs/design.md §5): while the LLM call is in
flight no executor thread waits on it, and the compression is the sync path's, event for event.

Against a real local OpenAI-compatible server and the official async client.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from autoctx import (
    AsyncAutoContextMemory,
    AutoContextMemory,
    Event,
    OpenAISummarizer,
    RuntimeOptions,
)
from tests.histories import SMALL, multi_round
from tests.invariants import assert_consistent
from tests.openai_server import OpenAIServer, Reply

#: Each answer takes this long: the window in which the event loop must stay free.
ANSWER_S = 1.0
CONFIG = SMALL
OPTIONS = RuntimeOptions(max_llm_calls=3)


@pytest.fixture(scope="module")
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer() as srv:
        yield srv


def _summarizer(server: OpenAIServer) -> OpenAISummarizer:
    return OpenAISummarizer(base_url=server.base_url, api_key="test", timeout=30, max_retries=0)


def _shape(events: list[Event]) -> list[tuple[Any, ...]]:
    """An event without what differs between two sessions (ids, uuids, latency, times, and
    the token counts, which a random offload uuid in a preview moves by a token or so)."""
    return [
        (
            e.strategy,
            e.status,
            e.reason,
            len(e.replaced_ids),
            e.messages_before,
            e.messages_after,
            e.model,
            e.prompt_tokens,
            e.completion_tokens,
            e.error,
        )
        for e in events
    ]


async def _compress_while_ticking(
    mem: AsyncAutoContextMemory,
) -> tuple[list[Event], list[float]]:
    """Compress while a ticker keeps asking the loop's only worker thread for a no-op."""
    ticks: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        while not done.is_set():
            await asyncio.to_thread(time.sleep, 0)
            ticks.append(time.monotonic())
            await asyncio.sleep(0.02)

    task = asyncio.create_task(ticker())
    try:
        events = await mem.compress_if_needed()
    finally:
        done.set()
        await task
    return events, ticks


def test_the_async_twin_holds_no_thread_during_the_llm_call(
    server: OpenAIServer, db_url: str, session_id: str
) -> None:
    history = multi_round(8, rounds=4, steps=8)
    arrivals: list[float] = []

    def slow_answer(body: dict[str, Any]) -> Reply:
        arrivals.append(time.monotonic())
        return Reply.slow(ANSWER_S)

    async def scenario() -> tuple[list[Event], list[float]]:
        # One worker thread: if the compression held it for the LLM call, nothing else that
        # needs a thread could run until the answer came.
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="only-worker")
        asyncio.get_running_loop().set_default_executor(executor)
        mem = await AsyncAutoContextMemory.open(
            f"{session_id}-async", db_url, CONFIG, options=OPTIONS, summarizer=_summarizer(server)
        )
        await mem.add(history)
        assert await mem.needs_compression()
        return await _compress_while_ticking(mem)

    server.reset()
    server.set_default(slow_answer)
    try:
        events, ticks = asyncio.run(scenario())
    finally:
        server.set_default(Reply.text())
    assert arrivals, "no summarizer call was made"
    assert any(
        e.status == "applied" and e.strategy in (1, 4, 5, 6, 7) and e.reason != "fallback"
        for e in events
    )
    for arrived in arrivals:
        # While the answer was being written, the worker thread kept serving the ticker.
        during = [t for t in ticks if arrived + 0.1 < t < arrived + ANSWER_S - 0.1]
        assert during, (arrived, ticks)

    # The same history through the sync path: the same compression, event for event.
    sync_mem = AutoContextMemory.open(
        f"{session_id}-sync", db_url, CONFIG, options=OPTIONS, summarizer=_summarizer(server)
    )
    sync_mem.add(history)
    sync_events = sync_mem.compress_if_needed()
    assert _shape(events) == _shape(sync_events)
    for a, b in zip(events, sync_events, strict=True):
        # Each offload uuid costs a few tokens more or less; the drift adds up along the call.
        assert abs(a.tokens_after - b.tokens_after) <= max(8, b.tokens_after // 100)
    async_mem = AutoContextMemory.open(f"{session_id}-async", db_url)
    assert [m.kind for m in async_mem.messages()] == [m.kind for m in sync_mem.messages()]
    assert_consistent(async_mem)
    assert_consistent(sync_mem)


def test_an_async_summarizer_call_is_cut_at_the_compress_deadline(
    server: OpenAIServer, db_url: str, session_id: str
) -> None:
    """A caller's async summarizer that never answers: the async driver cuts it at the
    deadline (it cannot hold the loop), and the call ends under the window."""

    class Never:
        calls = 0

        def summarize(self, request: Any) -> Any:
            raise AssertionError("the async path must not call summarize")

        async def asummarize(self, request: Any) -> Any:
            Never.calls += 1
            await asyncio.sleep(3600)

    options = dataclasses.replace(OPTIONS, compress_deadline_s=2)

    async def scenario() -> tuple[list[Event], float, int]:
        mem = await AsyncAutoContextMemory.open(
            session_id, db_url, CONFIG, options=options, summarizer=Never()
        )
        await mem.add(multi_round(8, rounds=6, steps=10))
        started = time.monotonic()
        events = await mem.compress_if_needed()
        return events, time.monotonic() - started, await mem.token_count()

    events, elapsed, tokens = asyncio.run(scenario())
    assert Never.calls == 1
    assert elapsed < 2 + 10  # the deadline and a generous allowance for the database work
    failed = [e for e in events if e.status == "failed"]
    assert len(failed) == 1 and failed[0].error is not None
    assert failed[0].error.startswith("deadline:")
    assert tokens < CONFIG.max_tokens
