"""What a memory holds, and what every call of it rests on: the lock that serializes its
calls (`_serialized`), the open check, the session row read.

`AutoContextMemory` (autoctx._memory) is built on this in layers, one module per job: its
compressions (`_memory_compress`), its reads (`_memory_reads`), then its writes and its
lifecycle (`_memory`). One object: the layers share one state, set by
`AutoContextMemory.__init__` and declared here.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import ParamSpec, TypeVar

from sqlalchemy.engine import Engine

from ._background import BackgroundMode, BackgroundRunner, BackgroundState
from ._compression_state import SessionState
from ._config import AutoContextConfig, RuntimeOptions
from ._errors import SessionNotFound
from ._events import Event
from ._observe import CompressionHooks
from ._read_check import ReadCheck
from ._sessions import SessionInfo
from ._store import locks
from ._store.store import SessionStore
from ._summarizers import Summarizer
from ._tokens import TokenCounter

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _serialized(method: Callable[_P, _R]) -> Callable[_P, _R]:
    """Run the method under its memory's lock (reentrant: public methods call each other).

    The outermost call is tried again when it met a foreign lock past PostgreSQL's
    `lock_timeout` (its transaction rolled back, so nothing of it was written), and raises that
    `Conflict` when the lock is still held (autoctx._store.locks)."""

    @functools.wraps(method)
    def locked(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        mem: MemoryState = args[0]  # type: ignore[assignment]
        with mem._lock:
            if mem._depth:
                return method(*args, **kwargs)
            mem._depth += 1
            try:
                for _ in range(locks.RETRIES):
                    try:
                        return method(*args, **kwargs)
                    except locks.LockWaitTimeout:
                        time.sleep(locks.RETRY_PAUSE_S)
                return method(*args, **kwargs)
            finally:
                mem._depth -= 1

    return locked


class MemoryState:
    """The state of one memory (each member is described where `AutoContextMemory.__init__`
    sets it), the open check, and the session row."""

    _store: SessionStore
    _hooks: tuple[CompressionHooks, ...]
    session_id: str
    tenant: str | None
    config: AutoContextConfig
    options: RuntimeOptions
    _counter: TokenCounter
    _summarizer: Summarizer
    _owns_summarizer: bool
    _info: SessionInfo
    _closed: bool
    _lock: threading.RLock
    _depth: int
    _session: SessionState
    _read_check: ReadCheck
    _background_mode: BackgroundMode
    _background: BackgroundState
    _running: Future[list[Event]] | None
    _runner: BackgroundRunner

    @_serialized
    def refresh(self) -> SessionInfo:
        """Re-read the session row (one primary-key read)."""
        self._check_open()
        self._info = self._store.totals()
        return self._info

    def _check_open(self) -> None:
        if self._closed:
            raise SessionNotFound(
                f"the memory of session {self.session_id!r} is closed; open it again"
            )

    @property
    def engine(self) -> Engine:
        return self._store.engine

    @property
    def summarizer(self) -> Summarizer:
        return self._summarizer
