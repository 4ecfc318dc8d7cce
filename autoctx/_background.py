"""Compression that runs while the agent goes on (docs/design.md §5 makes it safe).

A compression's summarizer calls hold no database lock, the appends that arrive meanwhile are
kept after the summary, and a range that changed under it is a clean conflict. So a memory can
start its compression at the trigger in a thread of its own (`BackgroundRunner`, owned by the
memory's `AutoContextClient`) and let the agent append and read on: the agent waits only when
its next model call would be over the window (working tokens at `max_tokens` or more). Then it
waits for the running compression, and compresses itself whatever is still over.

`BackgroundState` is one memory's share of it: the stop signal that `close()` sets, and the
events and errors of the compressions that finished, until `compress_if_needed()` hands them
to the caller (so that a failure in the background is never lost silently).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from types import TracebackType
from typing import Final, Literal, Protocol, TypeAlias, TypeVar

from ._errors import ConfigError
from ._events import Event

logger = logging.getLogger("autoctx")

_T = TypeVar("_T")

#: How a memory compresses: False in the calls that ask (`compress_if_needed()`), True in the
#: background (a thread, or a task for the async memory), "worker" by `autoctx worker`
#: processes (the memory itself compresses only what would be over the window).
BackgroundMode: TypeAlias = bool | Literal["worker"]
_MODES: Final = (False, True, "worker")


class _Finished(Protocol):
    """A finished compression: a thread's `Future` or an asyncio task."""

    def cancelled(self) -> bool: ...

    def exception(self) -> BaseException | None: ...

    def result(self) -> list[Event]: ...


def validate_background(mode: object) -> BackgroundMode:
    if isinstance(mode, bool) or mode == "worker":
        return mode
    raise ConfigError(
        f"background must be False, True or 'worker', got {mode!r}: True compresses in a thread "
        "of this process (a task for the async memory), 'worker' leaves compression to "
        "`autoctx worker` processes"
    )


def done_future(value: _T) -> Future[_T]:
    """A future that has already finished with `value` (nothing was to be done)."""
    future: Future[_T] = Future()
    future.set_result(value)
    return future


class BackgroundRunner:
    """The threads that run a client's background compressions.

    One daemon thread per running compression (a memory runs at most one at a time): a process
    that exits does not wait for a summarizer call in flight, and loses nothing by it, since
    nothing of a compression is written before its one transaction. After a fork the child
    forgets the parent's threads (they do not exist in it).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._threads: set[threading.Thread] = set()
        self._closed = False

    def submit(self, fn: Callable[[], _T], *, name: str) -> Future[_T]:
        future: Future[_T] = Future()

        def work() -> None:
            try:
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(fn())
                    except BaseException as exc:
                        future.set_exception(exc)
            finally:
                with self._lock:
                    self._threads.discard(thread)

        thread = threading.Thread(target=work, name=name, daemon=True)
        with self._lock:
            if self._closed:
                raise RuntimeError(
                    "this AutoContextClient is closed; open the memory through a new client"
                )
            self._threads.add(thread)
        thread.start()
        return future

    @property
    def running(self) -> int:
        """Threads still running a compression."""
        with self._lock:
            return len(self._threads)

    def join(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for the running threads; True if none is left."""
        with self._lock:
            threads = list(self._threads)
        deadline = time.monotonic() + timeout
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return self.running == 0

    def close(self) -> None:
        """Refuse new work (the memories' own stop signals end the running ones)."""
        with self._lock:
            self._closed = True

    def after_fork_in_child(self) -> None:
        self._lock = threading.Lock()
        self._threads = set()


class BackgroundState:
    """One memory's background compressions: the stop signal, and what finished.

    Its lock is its own, not the memory's: a compression's thread reports here when it ends,
    while the caller may be waiting for it outside the memory's lock.
    """

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        #: Set by `close()`: a running compression ends at its next step and writes nothing more.
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._events: list[Event] = []
        self._errors: list[BaseException] = []
        #: Counts the steps of background compressions (and their ends), for `wait_for_step`.
        self._stepped = threading.Condition()
        self.steps = 0

    def step_done(self) -> None:
        """A step of a background compression ended (it may have committed)."""
        with self._stepped:
            self.steps += 1
            self._stepped.notify_all()

    def wait_for_step(self, seen: int, timeout: float) -> None:
        """Wait until a step after the `seen`-th ends (or `timeout` seconds pass)."""
        with self._stepped:
            self._stepped.wait_for(lambda: self.steps != seen, timeout)

    def guard(self, lock: threading.RLock) -> StepGuard:
        """The guard a background compression's steps run in: `lock`, and a `step_done` as
        each step leaves it."""
        return StepGuard(lock, self)

    def collect(self, future: _Finished) -> None:
        """A done callback: keep the finished compression's events, or its error."""
        self.step_done()  # whoever waits for a step sees the end too
        if future.cancelled():
            return
        error = future.exception()
        with self._lock:
            if error is None:
                self._events.extend(future.result())
            else:
                self._errors.append(error)
        if error is not None:
            # The type only: a database error's text carries the statement's parameters.
            logger.warning(
                "autoctx: session %r: a background compression failed (%s); the next "
                "compress_if_needed() raises it",
                self.session_id,
                type(error).__name__,
            )

    def keep(self, events: list[Event]) -> None:
        """Events of a compression that a read made (`to_openai()` cannot return them)."""
        with self._lock:
            self._events.extend(events)

    def take(self, *, raise_errors: bool) -> list[Event]:
        """The events kept since the last take; with `raise_errors`, the first error of a
        finished compression is raised instead (the events wait for the next take)."""
        with self._lock:
            if raise_errors and self._errors:
                raise self._errors.pop(0)
            events, self._events = self._events, []
        return events

    def after_fork_in_child(self) -> None:
        # What the parent's compressions did is the parent's to report.
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._events = []
        self._errors = []
        self._stepped = threading.Condition()


class StepGuard:
    """The memory's lock around one step of a background compression; leaving it tells the
    callers that wait at the window that a commit may have brought the context under it."""

    def __init__(self, lock: threading.RLock, state: BackgroundState) -> None:
        self._lock = lock
        self._state = state

    def __enter__(self) -> None:
        self._lock.acquire()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._lock.release()
        self._state.step_done()
