"""`AsyncAutoContextMemory`: the memory for asyncio, the sync memory's code run in a worker
thread. Its own module: it drives the sync memory (`autoctx._memory`) through its public
methods and its named internal API (`MemoryInternals`), and nothing there refers back to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import uuid
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy.engine import URL

from . import _window as window
from ._anthropic import to_anthropic
from ._background import (
    BackgroundMode,
)
from ._compressor import Compressor
from ._config import (
    AutoContextConfig,
    RuntimeOptions,
)
from ._erasure_result import AutoContextErasure
from ._events import Event
from ._memory import AutoContextMemory, MessageInput, internals
from ._memory_reads import ToolFormat
from ._messages import Msg, to_openai_messages
from ._observe import CompressionHooks
from ._open_arguments import OpenArguments
from ._search import (
    DEFAULT_LIMIT,
    AutoContextSearchHit,
    SearchScope,
)
from ._sessions import SessionInfo
from ._shared_opening import open_shared
from ._store.claims import aclaimed
from ._summarizers import (
    AsyncSummarizer,
    Summarizer,
)


class AsyncAutoContextMemory:
    """`AutoContextMemory` for asyncio: the same code, run in a worker thread.

    The window policy is the sync memory's (`autoctx._window`), awaited; in background mode
    its compressions run as asyncio tasks (`compress_in_background`). It drives the sync
    memory through its public methods and its named internal API (`MemoryInternals`).

    What a cancellation means (a timeout of `asyncio.wait_for`, a cancelled task): the awaiting
    coroutine stops at once, but the database work it started in a worker thread runs to its
    end, and each of its transactions commits whole or not at all, never half. So a cancelled
    write may have happened: `add()` may have stored its messages (retry it with the same
    `idempotency_key` to store them once), `pop_last()`, `clear()`, `set_plan()`, `fork()`,
    `erase()` and `delete()` may have committed (read the session to know). A cancelled
    `compress_if_needed()` keeps every compression step that committed (each is one
    transaction); the claim it held on the session is free when the cancellation reaches the
    caller, and a summarizer answer that had not been applied is dropped. A cancelled read
    changes nothing.
    """

    def __init__(self, sync: AutoContextMemory) -> None:
        self.sync = sync
        self.session_id = sync.session_id
        self._inner = internals(sync)
        self._compress_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
            weakref.WeakKeyDictionary()
        )
        #: The background compression started last (done or not); asyncio keeps only a weak
        #: reference to a task, so the memory holds it.
        self._task: asyncio.Future[list[Event]] | None = None

    @classmethod
    async def open(
        cls,
        session_id: str,
        database_url: str | URL | None = None,
        config: AutoContextConfig | None = None,
        *,
        options: RuntimeOptions | None = None,
        auto_upgrade: bool = True,
        tenant: str | None = None,
        summarizer: Summarizer | None = None,
        create: bool = True,
        background: BackgroundMode = False,
        hooks: CompressionHooks | Sequence[CompressionHooks] | None = None,
    ) -> AsyncAutoContextMemory:
        """`AutoContextMemory.open` (through the process's shared client for the URL), in a
        worker thread; `AutoContextClient.open_async` opens one through a client of yours."""
        args = OpenArguments(
            session_id, config, options, tenant, summarizer, create, background, hooks
        )
        sync = await asyncio.to_thread(
            open_shared, database_url, auto_upgrade, args, AutoContextMemory
        )
        return cls(sync)

    async def add(self, messages: MessageInput, *, idempotency_key: str | None = None) -> list[Msg]:
        """As `AutoContextMemory.add`. Cancelled (a timeout of `asyncio.wait_for`, say), the
        add may still commit: pass `idempotency_key` and retry with the same key to store the
        messages once (see the class's note on cancellation)."""
        return await asyncio.to_thread(self.sync.add, messages, idempotency_key=idempotency_key)

    async def messages(self) -> list[Msg]:
        await self._before_read()
        return await asyncio.to_thread(self._inner.working)

    async def to_openai(self) -> list[dict[str, Any]]:
        await self._before_read()
        return await asyncio.to_thread(
            lambda: to_openai_messages(self._inner.for_model(self._inner.working()))
        )

    async def token_count(self) -> int:
        return await asyncio.to_thread(self.sync.token_count)

    async def message_count(self) -> int:
        return await asyncio.to_thread(self.sync.message_count)

    async def needs_compression(self) -> bool:
        return await asyncio.to_thread(self.sync.needs_compression)

    async def compress_if_needed(self) -> list[Event]:
        """As `AutoContextMemory.compress_if_needed`; in background mode the compression
        runs as a task of the running event loop."""
        inner = self._inner
        return await window.arun(
            window.compress_if_needed(inner.mode, self.sync.config, inner.background),
            self._take_step,
        )

    async def _before_read(self) -> None:
        inner = self._inner
        await window.arun(
            window.before_read(inner.mode, self.sync.config, inner.background), self._take_step
        )

    async def _take_step(self, step: window.Step) -> object:
        """Do what a step of the window policy asks (`autoctx._window`), in this event loop."""
        background = self._inner.background
        match step:
            case window.ReadTotals():
                return await self.refresh()
            case window.StartBackground():
                return await self.compress_in_background()
            case window.BackgroundRunning():
                return self._running() is not None
            case window.WaitForStep(seen=seen):
                stepped = asyncio.ensure_future(
                    asyncio.to_thread(background.wait_for_step, seen, 1.0)
                )
                running = self._running()
                either: list[asyncio.Future[Any]] = [stepped]
                if running is not None:
                    either.append(running)
                await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
                return None
            case window.WaitForBackground():
                running = self._running()
                if running is not None:
                    await asyncio.wait([running])
                return None
            case window.Compress(over_window=over_window, claim=claim, hand_over=hand_over):
                async with contextlib.AsyncExitStack() as held:
                    if claim:
                        # Taken and released in one guarded region: a cancellation anywhere
                        # leaves the claim free at once (docs/design.md §5).
                        wait_s = self.sync.options.compress_deadline_s
                        await held.enter_async_context(aclaimed(self._inner.claim(), wait_s))
                    # Compressions of this memory run one at a time (the loop's lock; a
                    # background task holds it too), so none pays the summarizer for a range
                    # another one already replaced.
                    async with self._compress_lock():
                        await self._compress_now(over_window=over_window)
                        return background.take(raise_errors=True) if hand_over else []
            case window.TakeEvents():
                return background.take(raise_errors=True)

    def _running(self) -> asyncio.Future[list[Event]] | None:
        """This memory's background task, while it runs in the running event loop (a task of
        a loop that has ended runs no more)."""
        task = self._task
        if task is None or task.done() or task.get_loop() is not asyncio.get_running_loop():
            return None
        return task

    async def compress_in_background(self) -> asyncio.Future[list[Event]]:
        """Start compressing in a task of the running loop when the trigger holds, and return
        at once with it (await it for the compression's events, which the next
        `compress_if_needed()` returns too). A compression already running is returned as it
        is; with nothing to do, a future that is already done, with no events."""
        running = self._running()
        if running is not None:
            return running
        compressor, info = await asyncio.to_thread(self._inner.compression)
        running = self._running()
        if running is not None:
            return running  # another task of this memory started one meanwhile
        loop = asyncio.get_running_loop()
        if not compressor.wanted(info):
            nothing: asyncio.Future[list[Event]] = loop.create_future()
            nothing.set_result([])
            return nothing
        task = loop.create_task(
            self._run_in_background(compressor, info),
            name=f"autoctx-compress-{self.session_id[:40]}",
        )
        task.add_done_callback(self._inner.background.collect)
        self._task = task
        return task

    async def _run_in_background(self, compressor: Compressor, info: SessionInfo) -> list[Event]:
        sink: list[Event] = []
        inner = self._inner
        # The claim `autoctx worker` takes (as the sync memory's background thread does).
        try:
            async with aclaimed(inner.claim(), 0.0) as held:
                if not held:
                    return sink  # a worker is compressing the session
                async with self._compress_lock():
                    summarizer = self.sync.summarizer
                    background = inner.background
                    guard, stop = background.guard(inner.lock), background.stop
                    if isinstance(summarizer, AsyncSummarizer):
                        await compressor.arun(info, summarizer, guard, stop=stop, events=sink)
                    else:
                        await asyncio.to_thread(compressor.run, info, guard, stop, sink)
        except asyncio.CancelledError:
            inner.background.keep(sink)  # what committed before the cancellation
            raise
        return sink

    async def _compress_now(self, *, over_window: bool) -> None:
        inner = self._inner
        summarizer = self.sync.summarizer
        if not isinstance(summarizer, AsyncSummarizer):
            await asyncio.to_thread(inner.compress_now, over_window=over_window)
            return
        # The database steps run in a worker thread, each under the memory's lock; the LLM call
        # is awaited and holds neither a thread nor the lock, so other calls go on meanwhile.
        compressor, info = await asyncio.to_thread(inner.compression)
        if over_window and info.token_count < self.sync.config.message_window:
            return
        sink: list[Event] = []
        try:
            stop = inner.background.stop
            await compressor.arun(info, summarizer, inner.lock, stop=stop, events=sink)
        finally:
            inner.background.keep(sink)

    def _compress_lock(self) -> asyncio.Lock:
        # An asyncio lock belongs to one event loop: one per loop that uses this memory.
        loop = asyncio.get_running_loop()
        lock = self._compress_locks.get(loop)
        if lock is None:
            lock = self._compress_locks[loop] = asyncio.Lock()
        return lock

    async def events(self) -> list[Event]:
        return await asyncio.to_thread(self.sync.events)

    async def dropped(self, event_id: int) -> list[str]:
        return await asyncio.to_thread(self.sync.dropped, event_id)

    async def originals(self, offset: int = 0, limit: int | None = None) -> list[Msg]:
        return await asyncio.to_thread(self.sync.originals, offset, limit)

    async def reload(
        self,
        offload_id: int | str | uuid.UUID | None = None,
        offset: int = 0,
        limit: int | None = None,
        *,
        message_id: int | None = None,
        session_id: str | None = None,
        originals: bool = False,
    ) -> list[Msg]:
        return await asyncio.to_thread(
            functools.partial(
                self.sync.reload,
                offload_id,
                offset,
                limit,
                message_id=message_id,
                session_id=session_id,
                originals=originals,
            )
        )

    async def search(
        self, query: str, *, scope: SearchScope = "session", limit: int = DEFAULT_LIMIT
    ) -> list[AutoContextSearchHit]:
        return await asyncio.to_thread(
            functools.partial(self.sync.search, query, scope=scope, limit=limit)
        )

    async def handle_tool_call(self, call: Any) -> str:
        return await asyncio.to_thread(self.sync.handle_tool_call, call)

    async def clear(self) -> Event:
        return await asyncio.to_thread(self.sync.clear)

    async def undo(self, event_id: int, *, force: bool = False) -> Event:
        return await asyncio.to_thread(self.sync.undo, event_id, force=force)

    async def pop_last(self, split: Callable[[Msg], Msg | None] | None = None) -> Msg | None:
        return await asyncio.to_thread(self.sync.pop_last, split)

    async def refresh(self) -> SessionInfo:
        return await asyncio.to_thread(self.sync.refresh)

    async def version(self) -> int:
        return await asyncio.to_thread(self.sync.version)

    @staticmethod
    def system_prompt_snippet() -> str:
        return AutoContextMemory.system_prompt_snippet()

    async def to_anthropic(self) -> tuple[str, list[dict[str, Any]]]:
        await self._before_read()
        return await asyncio.to_thread(
            lambda: to_anthropic(self._inner.for_model(self._inner.working()))
        )

    async def reserve_for(
        self, tools: Sequence[Mapping[str, Any]] = (), instructions: str | None = None
    ) -> int:
        return await asyncio.to_thread(self.sync.reserve_for, tools, instructions)

    async def set_plan(self, plan: Mapping[str, Any] | None) -> None:
        await asyncio.to_thread(self.sync.set_plan, plan)

    def tools(self, format: ToolFormat = "openai") -> list[dict[str, Any]]:
        return self.sync.tools(format)

    async def fork(
        self, new_session_id: str, *, at_message: int | None = None
    ) -> AsyncAutoContextMemory:
        child = await asyncio.to_thread(self.sync.fork, new_session_id, at_message=at_message)
        return AsyncAutoContextMemory(child)

    async def erase(self, message_ids: Iterable[int], *, reason: str) -> AutoContextErasure:
        return await asyncio.to_thread(self.sync.erase, message_ids, reason=reason)

    async def delete(self) -> None:
        await asyncio.to_thread(self.sync.delete)

    async def close(self) -> None:
        """Close the memory; a background compression is cancelled (nothing of an answer in
        flight is written)."""
        await asyncio.to_thread(self.sync.close)
        running = self._task
        if running is not None and not running.done():
            running.cancel()
            await asyncio.wait([running])

    async def __aenter__(self) -> AsyncAutoContextMemory:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
