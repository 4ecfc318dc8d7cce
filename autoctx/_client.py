"""`AutoContextClient`: what the memories of one database share in a process, with one owner.

A client holds the connection pool (a SQLAlchemy engine), has checked the schema once, runs the
background compressions, and knows the memories opened through it, so that `close()` stops
those compressions, closes the memories and releases the pool. It is the only factory of
memories: `open` (and `open_async`), and a memory's `fork`, which opens the child through its
parent's client. Like an `httpx.Client` or a psycopg pool, one per database per process is the
usual shape.

The shared default client: `AutoContextMemory.open(session_id, url)` (and the async twin's)
opens through the process's shared client for that URL, `AutoContextClient.shared(url)`,
made on first use. It lives until `AutoContextClient.close_shared()` closes it (with every
memory opened through it) or the process exits; a later open makes a new one. An application
that wants to decide when connections go away makes its own client and opens memories from it.

A client also keeps what its memories' adapters cache of a session's committed content (the
Agents SDK session's items by message id), so that a new adapter object of a session reads what
an earlier one of the same process read already (docs/design.md §5): each cache is keyed by the
session and checks the session's epoch on every read, so another process's writes are seen.

A process that forks does not share pooled connections with its child (docs/design.md §5):
in the child, every client forgets the connections it inherited (without closing them: they
are the parent's) and opens its own on next use, every memory gets fresh locks, and the session
caches start empty.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

from sqlalchemy.engine import URL, Engine

from . import _arguments
from ._async_memory import AsyncAutoContextMemory
from ._background import BackgroundRunner
from ._errors import InvalidArgument
from ._memory import AutoContextMemory, internals
from ._memory_open import open_memory
from ._observe import CompressionHooks, hooks_of
from ._open_arguments import OpenArguments
from ._session_caches import SessionCaches
from ._sessions import SessionInfo
from ._store.database import check_connection, create_engine, ensure_schema, resolve_url

if TYPE_CHECKING:
    from ._background import BackgroundMode
    from ._config import AutoContextConfig, RuntimeOptions
    from ._summarizers import Summarizer


class AutoContextClient:
    """The connection pool, the schema check and the open memories of one database.

    >>> with AutoContextClient("postgresql+psycopg://localhost/app") as client:  # doctest: +SKIP
    ...     mem = client.open("agent-42")
    """

    #: The process-wide client of each URL (see `shared`).
    _shared: ClassVar[dict[str, AutoContextClient]] = {}
    _shared_lock: ClassVar[threading.Lock] = threading.Lock()
    #: Every client alive in the process, for the at-fork handler.
    _live: ClassVar[weakref.WeakSet[AutoContextClient]] = weakref.WeakSet()
    #: The level of the line each memory logs when it opens, naming its summarizer
    #: (docs/design.md §6): INFO for the memories an application opens. `autoctx worker`'s
    #: client logs it at DEBUG: the worker names its one summarizer when it starts, and a line
    #: per compressed session would repeat it.
    _summarizer_log_level: ClassVar[int] = logging.INFO

    def __init__(
        self,
        database_url: str | URL | None = None,
        *,
        auto_upgrade: bool = True,
        hooks: CompressionHooks | Sequence[CompressionHooks] | None = None,
    ) -> None:
        """Connect to `database_url` (default: `AUTOCTX_DATABASE_URL`, else the embedded
        PostgreSQL) and check its schema, upgrading it when `auto_upgrade`. `hooks` observe
        the compressions of every memory opened through this client."""
        #: The lifecycle hooks of every memory opened here (before each memory's own).
        self.hooks = hooks_of(hooks)
        self.url = resolve_url(database_url)
        engine = create_engine(self.url)
        try:
            check_connection(engine)
            ensure_schema(engine, auto_upgrade=auto_upgrade)
        except BaseException:
            engine.dispose()
            raise
        self._engine: Engine | None = engine
        self._memories: weakref.WeakSet[AutoContextMemory] = weakref.WeakSet()
        self._lock = threading.Lock()
        #: The threads of the background compressions of the memories opened here.
        self.runner = BackgroundRunner()
        #: What adapters cache of their sessions' committed content (see `SessionCaches`).
        self.session_caches = SessionCaches()
        AutoContextClient._live.add(self)

    @classmethod
    def shared(
        cls, database_url: str | URL | None = None, *, auto_upgrade: bool = True
    ) -> AutoContextClient:
        """The process's shared client for `database_url` (default: `AUTOCTX_DATABASE_URL`,
        else the embedded PostgreSQL), the one `AutoContextMemory.open` uses: opening many
        memories must not open many pools. Made on first use; one that was closed is replaced
        by a new one. `auto_upgrade` applies when it is made."""
        url = resolve_url(database_url)
        key = url.render_as_string(hide_password=False)
        with cls._shared_lock:
            client = cls._shared.get(key)
            if client is None or client.closed:
                client = cls(url, auto_upgrade=auto_upgrade)
                cls._shared[key] = client
            return client

    @classmethod
    def close_shared(cls, *database_urls: str | URL) -> None:
        """Close the shared clients of `database_urls` (see `shared`), or every shared client
        when none is named: their memories, background compressions and pooled connections.
        The next `AutoContextMemory.open` without a client connects, and checks the schema,
        again."""
        keys = {resolve_url(u).render_as_string(hide_password=False) for u in database_urls}
        with cls._shared_lock:
            if not database_urls:
                keys = set(cls._shared)
            clients = [cls._shared.pop(k) for k in keys if k in cls._shared]
        for client in clients:
            client.close()

    @property
    def engine(self) -> Engine:
        engine = self._engine
        if engine is None:
            raise RuntimeError(
                "this AutoContextClient is closed; create a new one (or use "
                "AutoContextMemory.open, which opens the shared client again)"
            )
        return engine

    @property
    def closed(self) -> bool:
        return self._engine is None

    def open(
        self,
        session_id: str,
        config: AutoContextConfig | None = None,
        *,
        options: RuntimeOptions | None = None,
        tenant: str | None = None,
        summarizer: Summarizer | None = None,
        create: bool = True,
        background: BackgroundMode = False,
        hooks: CompressionHooks | Sequence[CompressionHooks] | None = None,
    ) -> AutoContextMemory:
        """Open a session's memory through this client (see `AutoContextMemory.open`)."""
        return self._open(
            OpenArguments(
                session_id, config, options, tenant, summarizer, create, background, hooks
            )
        )

    async def open_async(
        self,
        session_id: str,
        config: AutoContextConfig | None = None,
        *,
        options: RuntimeOptions | None = None,
        tenant: str | None = None,
        summarizer: Summarizer | None = None,
        create: bool = True,
        background: BackgroundMode = False,
        hooks: CompressionHooks | Sequence[CompressionHooks] | None = None,
    ) -> AsyncAutoContextMemory:
        """`open`, for asyncio: the memory is opened in a worker thread and returned as an
        `AsyncAutoContextMemory` (registered with this client like any other)."""
        args = OpenArguments(
            session_id, config, options, tenant, summarizer, create, background, hooks
        )
        return AsyncAutoContextMemory(await asyncio.to_thread(self._open, args))

    def sessions(
        self, *, tenant: str | None = None, prefix: str | None = None
    ) -> list[SessionInfo]:
        """The sessions of the database (of `tenant` only, when given; whose ids start with
        `prefix`, when given), the most recently updated first: what an integration that keeps
        a framework's many sessions (its users', its apps') lists them by. Opens none."""
        from ._store.catalog import Catalog

        tenant = _arguments.tenant(tenant)
        if prefix is not None and not isinstance(prefix, str):
            raise InvalidArgument(
                f"sessions: prefix must be a string (the start of the ids), got "
                f"{type(prefix).__name__}"
            )
        return Catalog(self.engine, tenant).list_sessions(tenant, prefix)

    def _open(self, args: OpenArguments) -> AutoContextMemory:
        """What every way of opening a memory comes to: open it, with this client's hooks
        first, and register it."""
        hooks = self.hooks + hooks_of(args.hooks)
        mem = open_memory(self, args, hooks=hooks, log_level=self._summarizer_log_level)
        with self._lock:
            self._memories.add(mem)
        return mem

    def close(self) -> None:
        """Close the memories opened through this client and every pooled connection.

        A background compression stops at its next step (closing its memory sees to that):
        it writes nothing after `close()` returns, and a summarizer call it has in flight is
        abandoned, not waited for (nothing of it was written)."""
        with self._lock:
            engine, self._engine = self._engine, None
            memories = list(self._memories)
            self._memories.clear()
        self.runner.close()
        self.session_caches.clear()
        for mem in memories:
            mem.close()
        if engine is not None:
            engine.dispose()

    def __enter__(self) -> AutoContextClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _after_fork_in_child(self) -> None:
        # The parent's connections stay the parent's: forget them without closing them
        # (SQLAlchemy's documented pattern for a pool inherited across fork).
        if self._engine is not None:
            self._engine.dispose(close=False)
        self._lock = threading.Lock()
        self.runner.after_fork_in_child()
        self.session_caches.after_fork_in_child()
        for mem in list(self._memories):
            internals(mem).after_fork_in_child()


def open_shared(
    database_url: str | URL | None, auto_upgrade: bool, args: OpenArguments
) -> AutoContextMemory:
    """`AutoContextMemory.open` (and its async twin's, in a thread): through the process's
    shared client for `database_url`, the arguments checked before anything connects."""
    args.check()
    client = AutoContextClient.shared(database_url, auto_upgrade=auto_upgrade)
    return client._open(args)


def _after_fork_in_child() -> None:
    AutoContextClient._shared_lock = threading.Lock()
    for client in list(AutoContextClient._live):
        client._after_fork_in_child()


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(after_in_child=_after_fork_in_child)
