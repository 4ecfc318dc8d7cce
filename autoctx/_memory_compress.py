"""A memory's compressions: in the calling thread, in the background (a thread of its client),
or left to `autoctx worker` processes, as the window policy (autoctx._window) asks; and the
trigger checks from the session row (docs/design.md §2, §5).
"""

from __future__ import annotations

import contextlib
from concurrent.futures import Future
from concurrent.futures import wait as wait_for_futures

from . import _window as window
from ._background import done_future
from ._compressor import Compressor
from ._events import Event
from ._memory_state import MemoryState, _serialized
from ._observe import Observer
from ._sessions import SessionInfo
from ._store.claims import claimed
from ._summarizers import OfflineSummarizer
from ._trigger import trigger_of


class MemoryCompression(MemoryState):
    """When and where a memory compresses (see `compress_if_needed`)."""

    def compress_if_needed(self) -> list[Event]:
        """Run the compression loop if the trigger holds; returns this call's events, and
        those of the background compressions that finished since the previous call.

        In background mode (``open(..., background=True)``) it does not wait for the
        summarizer: at the trigger it starts a background compression (`compress_in_background`)
        and returns. It waits only when the working context is at the window (`max_tokens`
        tokens or more: the next model call would be over it): for the compression under way,
        then compressing here whatever is still over, so that it returns under the window as
        ever. With ``background="worker"`` it starts nothing (`autoctx worker` processes
        compress the session) and, at the window, waits for a worker's compression first.
        An error that ended a background compression is raised here, once (a summarizer
        failure is a `failed` event, as always, never an error).
        """
        return window.run(
            window.compress_if_needed(self._background_mode, self.config, self._background),
            self._take_step,
        )

    def compress_in_background(self) -> Future[list[Event]]:
        """Start compressing in a background thread when the trigger holds, and return at
        once, with the compression's future: its result is the compression's events (which
        the next `compress_if_needed()` returns too). A compression already running is
        returned as it is; with nothing to do, a future that is already done, with no events.

        The thread belongs to the memory's client; it takes the memory's lock for each
        database step only, so the agent appends and reads meanwhile, and appends that arrive
        while it summarizes are kept after the summary (docs/design.md §5). `close()` stops it
        at its next step; nothing of an answer still in flight is written.
        """
        with self._lock:
            self._check_open()
            running = self._running
            if running is not None and not running.done():
                return running
            compressor, info = self._compression()
            if not compressor.wanted(info):
                return done_future([])
            guard, stop = self._background.guard(self._lock), self._background.stop
            engine, session_id, tenant = self.engine, self.session_id, self._store.tenant

            def run() -> list[Event]:
                # The claim `autoctx worker` takes: while this thread compresses, no worker
                # does, and a session a worker is compressing is left to it.
                with claimed(engine, session_id, 0.0, tenant=tenant) as held:
                    return compressor.run(info, guard=guard, stop=stop) if held else []

            future = self._runner.submit(run, name=f"autoctx-compress-{self.session_id[:40]}")
            future.add_done_callback(self._background.collect)
            self._running = future
            return future

    def _take_step(self, step: window.Step) -> object:
        """Do what a step of the window policy asks (`autoctx._window`), in this thread.

        The waits run outside the memory's lock: the background compression's steps take it."""
        match step:
            case window.ReadTotals():
                return self.refresh()
            case window.StartBackground():
                return self.compress_in_background()
            case window.BackgroundRunning():
                running = self._running
                return running is not None and not running.done()
            case window.WaitForStep(seen=seen):
                # Woken as each step ends; the timeout only guards against a lost wake-up.
                self._background.wait_for_step(seen, timeout=1.0)
                return None
            case window.WaitForBackground():
                self._wait_background()
                return None
            case window.Compress(over_window=over_window, claim=claim, hand_over=hand_over):
                held = self._session_claim() if claim else contextlib.nullcontext()
                with held, self._lock:  # the loop and the events it returns: one call
                    self._compress_now(over_window=over_window)
                    return self._background.take(raise_errors=True) if hand_over else []
            case window.TakeEvents():
                with self._lock:
                    return self._background.take(raise_errors=True)

    def _wait_background(self) -> None:
        """Wait for this memory's background compression, if one runs (never under the
        memory's lock: the compression's steps take it)."""
        running = self._running
        if running is not None:
            wait_for_futures([running])

    @_serialized
    def _compress_now(self, *, over_window: bool = False) -> None:
        """The compression loop in this thread, under the memory's lock (with `over_window`,
        only when the working context is at the window); its events wait for the next
        `compress_if_needed()` to return them."""
        compressor, info = self._compression()
        if not over_window or info.token_count >= self.config.message_window:
            self._background.keep(compressor.run(info))

    def _session_claim(self) -> contextlib.AbstractContextManager[bool]:
        """Wait for the claim a worker holds on the session (its compression) and keep it for
        the block, so that no worker compresses beside this memory."""
        return claimed(
            self.engine,
            self.session_id,
            self.options.compress_deadline_s,
            tenant=self._store.tenant,
        )

    @_serialized
    def _compression(self) -> tuple[Compressor, SessionInfo]:
        """The compressor of one `compress_if_needed()` call and the totals it starts from."""
        self._check_open()
        info = self._store.totals()
        compressor = Compressor(
            self._store,
            self.session_id,
            self.config,
            self._counter,
            self._summarizer,
            self._session,
            Observer(self.session_id, self._hooks),
            # What keeps the bound when the summarizer fails (docs/design.md §2).
            fallback=OfflineSummarizer(),
            options=self.options,
        )
        return compressor, info

    @_serialized
    def _appended_over_trigger(self) -> bool:
        """Whether this memory's latest `add()` left the session at or over its trigger, from
        the totals that append committed (no read). After an `add()`, `compress_if_needed()`
        only has work when this holds, so an agent loop can skip that call's read of the
        session row; another writer's later appends are seen by the next check."""
        totals = self._store.totals_after_append()
        return totals is None or trigger_of(*totals, self.config).fired

    @_serialized
    def needs_compression(self) -> bool:
        """The trigger of docs/design.md §2, from the session row: one indexed read."""
        info = self.refresh()
        return trigger_of(info.message_count, info.token_count, self.config).fired
