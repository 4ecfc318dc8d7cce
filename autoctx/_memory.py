"""The facade users import: `AutoContextMemory` and its async twin.

The async twin runs the same sync code in a worker thread (`asyncio.to_thread`): one source of
truth, and psycopg's sync driver under it.

One memory may be shared by threads and by asyncio tasks (docs/design.md §5): each memory
serializes its own calls with a lock, so they behave as if made one after the other, and its
caches (in its store) only ever change under that lock.

Opened with ``background=True``, a memory compresses at the trigger in a background thread (a
task for the async memory) and makes a call wait only when the working context is at the
window (see `autoctx._background`); a background compression takes the lock for its database
steps only, never while the summarizer writes.

The memory is one class built in layers, one module per job: what it holds and its lock
(`_memory_state`), its compressions (`_memory_compress`), its reads (`_memory_reads`), and
here its writes, fork, erasure and lifecycle, with the internal API autoctx's own code uses.
"""

from __future__ import annotations

import functools
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import replace
from typing import Any, Protocol

from sqlalchemy.engine import URL, Engine

from . import _arguments, _reserve
from . import _undoing as undoing
from ._agent_plan import validate_plan
from ._background import (
    BackgroundMode,
    BackgroundRunner,
    BackgroundState,
    validate_background,
)
from ._coerce import coerce_messages
from ._compression_state import SessionState
from ._compressor import Compressor
from ._config import (
    AutoContextConfig,
    RuntimeOptions,
)
from ._erasure import Derived, rewrite_erased
from ._erasure_result import AutoContextErasure
from ._errors import (
    AutoContextError,
    InvalidMessage,
)
from ._events import Event
from ._intake import Prepared, prepare, stand_in
from ._memory_reads import MemoryReads
from ._memory_state import _serialized
from ._messages import Msg
from ._observe import CompressionHooks
from ._open_arguments import OpenArguments
from ._read_check import ReadCheck
from ._session_caches import SessionCaches
from ._sessions import SessionInfo
from ._shared_opening import open_shared
from ._store import erase as erase_sql
from ._store import lifecycle
from ._store.claims import SessionClaim
from ._store.store import SessionStore
from ._summarizers import (
    Summarizer,
)
from ._tokens import TokenCounter

MessageInput = Msg | Mapping[str, Any] | Iterable[Msg | Mapping[str, Any]]


def _checked_remainder(rest: object, last: Msg, mem: AutoContextMemory) -> Prepared:
    """What `pop_last`'s `split` returned, checked as `add` checks a message (storable, under
    the size cap) and as the rest of `last`: the same role, and only tool calls and results
    `last` had, so that the working context stays a valid chat. `InvalidMessage` naming the
    rule, never the content; nothing is written."""
    where = f"session {mem.session_id!r}, pop_last: the remainder split returned"
    if not isinstance(rest, Msg):
        raise InvalidMessage(f"{where} must be a Msg or None, got {type(rest).__name__}")
    try:
        (prepared,) = prepare(
            [rest],
            mem._counter,
            max_chars=mem.config.max_message_chars,
            session_id=mem.session_id,
        )
    except InvalidMessage as exc:
        raise InvalidMessage(f"{where} is invalid: {exc}") from None
    if rest.role != last.role:
        raise InvalidMessage(
            f"{where} has role {rest.role!r}, the message it stands for {last.role!r}; return "
            "the rest of that message (same role), or None"
        )
    calls = {c.id for c in last.tool_uses}
    results = {r.tool_use_id for r in last.tool_results}
    if (
        not {c.id for c in rest.tool_uses} <= calls
        or not {r.tool_use_id for r in rest.tool_results} <= results
    ):
        raise InvalidMessage(
            f"{where} has tool calls or results the message it stands for does not have; it "
            "may keep some of that message's calls and results, never add any"
        )
    return replace(prepared, final=False)


class MemoryClient(Protocol):
    """What a memory holds of the client that opened it (`AutoContextClient` is one): the
    memory does not import the client, which is above it (it opens memories)."""

    #: The threads of the background compressions.
    runner: BackgroundRunner
    #: What the adapters of its memories cache of their sessions (an erasure empties them).
    session_caches: SessionCaches

    @property
    def engine(self) -> Engine: ...

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
        """Open a session's memory through this client (a fork's child, here)."""
        ...


class AutoContextMemory(MemoryReads):
    """The working memory of one agent session, kept in PostgreSQL.

    >>> mem = AutoContextMemory.open("agent-42")           # embedded PostgreSQL by default
    >>> mem.add({"role": "user", "content": "hello"})
    >>> mem.to_openai()                                     # the working context
    >>> mem.compress_if_needed()                            # events of this call
    """

    def __init__(
        self,
        store: SessionStore,
        info: SessionInfo,
        config: AutoContextConfig,
        summarizer: Summarizer,
        *,
        owns_summarizer: bool = False,
        client: MemoryClient,
        background: BackgroundMode = False,
        hooks: Sequence[CompressionHooks] = (),
        options: RuntimeOptions | None = None,
    ) -> None:
        self._store = store
        #: The lifecycle hooks of its compressions (the client's, then its own).
        self._hooks = tuple(hooks)
        self.session_id = info.session_id
        self.tenant = info.tenant
        self.config = config
        #: How this memory runs its compressions (never stored with the session).
        self.options = options if options is not None else RuntimeOptions()
        self._counter = TokenCounter(config.model)
        self._summarizer = summarizer
        #: The default summarizer is the memory's to close; one passed in is the caller's.
        self._owns_summarizer = owns_summarizer
        self._info = info
        self._closed = False
        self._lock = threading.RLock()
        #: How deep in `_serialized` calls the thread holding `_lock` is (the outermost one
        #: retries a lock wait that timed out).
        self._depth = 0
        self._session = SessionState()
        self._read_check = ReadCheck()
        self._background_mode = validate_background(background)
        self._background = BackgroundState(info.session_id)
        #: The background compression started last (done or not).
        self._running: Future[list[Event]] | None = None
        #: The client that opened the memory: it closes it, and opens its forks.
        self._client = client
        #: The client's threads.
        self._runner = client.runner
        self._internals = MemoryInternals(self)

    @classmethod
    def open(
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
    ) -> AutoContextMemory:
        """Open the session `session_id`, creating it unless `create=False`.

        The model (and so the token encoding) is fixed when the session is created: for an
        existing session the stored model wins over `config.model` (with a warning). Reopening
        without a config uses the thresholds stored with the session; with a config, the
        session's record of the thresholds in force is updated. `database_url` defaults to
        `AUTOCTX_DATABASE_URL`, else the embedded PostgreSQL.

        `options` (a `RuntimeOptions`) bound how this memory compresses: passes, summarizer
        calls, deadlines, concurrency, strictness; they are this process's, never stored.
        `auto_upgrade` runs the migrations when the database's schema is behind (the first
        open of a URL in the process decides, as it creates the shared client).

        `background=True` compresses in a background thread while the agent goes on, and
        `background="worker"` leaves compression to `autoctx worker` processes: see
        `compress_if_needed()`. `hooks` (a `CompressionHooks`, or a list of them) are called
        before each strategy's attempt, after each event it applied and on each failure.
        """
        args = OpenArguments(
            session_id, config, options, tenant, summarizer, create, background, hooks
        )
        return open_shared(database_url, auto_upgrade, args, AutoContextMemory)

    # -- writing ----------------------------------------------------------------------------

    @_serialized
    def add(self, messages: MessageInput, *, idempotency_key: str | None = None) -> list[Msg]:
        """Validate, count and append messages atomically; returns them as stored.

        Accepts a `Msg`, an OpenAI chat message dict, the `openai` client's own message object
        (`response.choices[0].message`), an Anthropic message (a dict, or the `anthropic`
        client's response), or a list mixing them. A rejected list stores none of
        its messages. Never compresses (call `compress_if_needed()`).

        With `idempotency_key` (a framework's message id, say), an add that the session
        already stored under that key (one that committed before a timeout, a cancellation
        or a lost connection reached the caller) returns the messages it stored and stores
        nothing again; the same key with other messages is a `Conflict`.
        """
        self._check_open()
        key = _arguments.add_key(idempotency_key)
        msgs = coerce_messages(messages)
        prepared = prepare(
            msgs, self._counter, max_chars=self.config.max_message_chars, session_id=self.session_id
        )
        return self._store.append(prepared, add_key=key)

    @_serialized
    def pop_last(self, split: Callable[[Msg], Msg | None] | None = None) -> Msg | None:
        """Take the last working message out of the working context and return it.

        The original stays stored; the removal is an applied event (strategy 0, reason
        'manual'). `split(last)` may return a message to stand in its place (for example the
        rest of a message that held several items). Returns None when the context is empty.
        """
        self._check_open()

        def remainder(last: Msg, last_final: bool) -> Prepared | None:
            rest = split(last) if split is not None else None
            if rest is None:
                return None
            return stand_in(_checked_remainder(rest, last, self), replaced_final=last_final)

        return self._store.pop_last(remainder, config=self.config.to_json())

    @_serialized
    def clear(self) -> Event:
        """Empty the working context; every original, offload and lineage row stays (clearing
        is not deleting). Recorded as an applied event: strategy 0, reason 'clear'."""
        self._check_open()
        return self._store.clear(config=self.config.to_json())

    @_serialized
    def undo(self, event_id: int, *, force: bool = False) -> Event:
        """Put the messages the compression `event_id` replaced back in place of its
        replacement, one level deep (a summary among them stays a summary), in one transaction;
        returns the undo's event (strategy 0, reason 'undo', `undoes` the compression's id).

        The compressor does not plan that range again; the next `compress_if_needed()`
        chooses again. Raises `UndoRefused` (its `reason` says which rule, nothing changed)
        when the working context would reach the window (unless `force`), when the
        replacement is no longer in the working context (the message names the event that
        holds it now), when what it replaced was erased, or when the event is not an applied
        compression; `EventNotFound` for an id the session does not have. docs/design.md §7.
        """
        self._check_open()
        eid = _arguments.event_id(event_id)
        return undoing.undo(self._store, eid, config=self.config, force=bool(force))

    @_serialized
    def _replace_working(self, messages: MessageInput) -> list[Msg]:
        """`clear()` then `add(messages)` in one transaction, so that a crash or another reader
        sees the old working context or the new one, never an empty one between them (the
        Agents SDK's compaction wrapper rewrites a history so). Returns the messages stored."""
        self._check_open()
        prepared = prepare(
            coerce_messages(messages),
            self._counter,
            max_chars=self.config.max_message_chars,
            session_id=self.session_id,
        )
        _, stored = self._store.replace_working(prepared, config=self.config.to_json())
        return stored

    @_serialized
    def set_plan(self, plan: Mapping[str, Any] | None) -> None:
        """Attach a plan (goal, steps with states, expected outcome) for the summaries' plan
        hint; None removes it."""
        self._check_open()
        self._store.set_plan(validate_plan(plan) if plan is not None else None)

    @_serialized
    def reserve_for(
        self,
        tools: Sequence[Mapping[str, Any]] = (),
        instructions: str | None = None,
    ) -> int:
        """Measure what each model call sends beside the working context (the tool
        definitions, the instructions that are not a stored message) and keep room for it:
        unless the config sets `reserve_tokens`, the measure becomes the session's reserve,
        recorded with it, and comes off the window for every trigger, target and the bound.
        The framework integrations call it with what they send; returns the reserve in force.
        """
        self._check_open()
        measured = _reserve.measure(self._counter, tools, instructions)
        changed = _reserve.with_measured(self.config, measured)
        if changed is not None:
            self._store.set_config(changed.to_json())
            self.config = changed
        return self.config.reserve_tokens

    # -- fork and erasure (docs/design.md §9; the SQL is autoctx._store.lifecycle's) ---------

    @_serialized
    def fork(self, new_session_id: str, *, at_message: int | None = None) -> AutoContextMemory:
        """A new session `new_session_id` that starts from this one's working context (up to
        and including message `at_message`, when given), and its memory.

        One transaction copies every row the child needs (its working messages and every
        original reload reaches from them, with their offloads, lineage and events), keeping
        message ids and offload uuids, so tags and `reload` work in the child as here; the
        child records where it came from (`autoctx_forks`, docs/audit.md) and has this
        session's tenant, model and thresholds. The child is opened through this memory's
        client (which closes it), in this memory's background mode, with its summarizer (or a
        default one of its own). This session is not changed. `at_message` may
        be a working message or an original a summary stands for: the child then starts with
        the messages up to it. Raises `SessionExists` for a taken id and `MessageNotFound`
        for a message this session does not have (`InvalidMessageId` for a malformed id).
        """
        self._check_open()
        _arguments.session_id(new_session_id)
        at = None if at_message is None else _arguments.message_id(at_message, "at_message")
        info = lifecycle.fork(self._store, new_session_id, at)
        # The child is opened like any memory, through this one's client: the client closes
        # it, runs its background compressions, and it keeps this memory's background mode.
        # A summarizer this memory made itself is closed with it, so the child makes its own.
        return self._client.open(
            info.session_id,
            self.config,
            options=self.options,
            tenant=self.tenant,
            summarizer=None if self._owns_summarizer else self._summarizer,
            create=False,
            background=self._background_mode,
        )

    @_serialized
    def erase(self, message_ids: Iterable[int], *, reason: str) -> AutoContextErasure:
        """Erase the content of the originals `message_ids` and of everything derived from
        them, in one transaction.

        Each original becomes a tombstone (role, id, time, tool call ids and names, and its
        lineage stay; text, tool arguments, outputs and metadata go); every summary and
        preview derived from it, found by lineage up to the working context, is rewritten
        from what remains by the offline summarizer, or becomes a tombstone; the totals
        follow; one applied event (strategy 0, reason 'erase') records the ids and `reason`,
        never content. Raises `MessageNotFound` for an id this session does not have
        (`InvalidMessageId` for a malformed one) and
        `InvalidErasure` for an id that is not an original or an empty reason, and
        `ErasureNotPermitted` for a database role granted a tenant (only the tables' owner
        rewrites history); nothing is erased then. Forks own their copies and are not
        changed: the result names them (`.forks`); erase the same ids there too. The answers
        of autoctx's context tools that quoted what is erased (tool results of
        `context_search` and `context_reload`, in this session or another of the tenant) are
        tombstoned in the same transaction, each by an erasure event of its session, and
        named (`.answers`).
        """
        self._check_open()
        ids = _arguments.erasure_ids(message_ids)
        note = _arguments.reason(reason)
        try:
            return erase_sql.erase(
                self._store,
                ids,
                note=note,
                rewrite=_rewrite_with(self.config, self._counter),
                config=self.config.to_json(),
                rewrite_for=functools.partial(_rewrite_for, self.config, self._counter),
            )
        finally:
            # The adapters' caches of this process let go of the erased text now, not at
            # their next read (which would drop it too: docs/design.md §5, §9).
            self._client.session_caches.clear()

    # -- lifecycle --------------------------------------------------------------------------

    @_serialized
    def delete(self) -> None:
        """Delete the session and everything of it, and close the memory."""
        self._check_open()
        self._store.delete_session()
        self.close()

    def close(self) -> None:
        """Close the memory: later calls raise `SessionNotFound`; a summarizer the memory made
        itself (the default one) is closed with it. The session stays stored."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            # Under the lock: no step of a background compression runs now, and none after.
            self._background.stop.set()
        close = getattr(self._summarizer, "close", None)
        if self._owns_summarizer and callable(close):
            close()

    def _after_fork_in_child(self) -> None:
        # A lock another thread of the parent held at the fork would stay held in the child.
        self._lock = threading.RLock()
        self._depth = 0
        # The parent's background compression goes on in the parent only.
        self._background.after_fork_in_child()
        self._running = None

    def __enter__(self) -> AutoContextMemory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class MemoryInternals:
    """What autoctx's own code needs of a memory beyond its public methods, each named here,
    so that nothing outside the memory's modules touches its private members. Reached with
    `internals(mem)`.

    - the async twin: the lock, the background state and mode, the compression of one call,
      the loop run in a thread, the session's claim, the working context read as it is;
    - `autoctx worker`: the compression of one call and the lock its steps run under;
    - the Agents SDK session: working ids with their epoch, stored documents, replacing the
      working context in one transaction, whether the latest append reached the trigger, the
      client whose session caches it shares;
    - the CLI: the count of stored originals, the latest working id;
    - the client: the at-fork reset.
    """

    __slots__ = ("_mem",)

    def __init__(self, mem: AutoContextMemory) -> None:
        self._mem = mem

    @property
    def lock(self) -> threading.RLock:
        """The memory's lock: its calls, and each step of its compressions, run under it."""
        return self._mem._lock

    @property
    def background(self) -> BackgroundState:
        """The stop signal and the finished compressions' events and errors."""
        return self._mem._background

    @property
    def mode(self) -> BackgroundMode:
        """How the memory compresses (`background=` of `open`)."""
        return self._mem._background_mode

    def compression(self) -> tuple[Compressor, SessionInfo]:
        """The compressor of one compression and the totals it starts from."""
        return self._mem._compression()

    def compress_now(self, *, over_window: bool) -> None:
        """The compression loop in this thread, under the memory's lock; its events wait for
        the next `compress_if_needed()`."""
        self._mem._compress_now(over_window=over_window)

    def wait_background(self) -> None:
        """Wait for the memory's background compression (a thread), if one runs."""
        self._mem._wait_background()

    def claim(self) -> SessionClaim:
        """The claim `autoctx worker` takes on the session (not yet acquired)."""
        mem = self._mem
        return SessionClaim(mem.engine, mem.session_id, tenant=mem._store.tenant)

    def working(self) -> list[Msg]:
        """The working context as it is (the window policy is the caller's)."""
        return self._mem._working()

    def for_model(self, msgs: list[Msg]) -> list[Msg]:
        """`msgs`, read for a model call: checked against the window (a warning, or
        `ContextOverWindow` for a strict memory)."""
        return self._mem._for_model(msgs)

    @property
    def client(self) -> MemoryClient:
        """The client the memory was opened through (its `session_caches` are shared by every
        adapter object of the process's sessions)."""
        return self._mem._client

    def working_ids(self, limit: int | None = None) -> tuple[tuple[uuid.UUID, int], list[int]]:
        """The epoch of the session's message content and its working message ids (the last
        `limit` of them)."""
        return self._mem._working_ids(limit)

    def message_documents(self, ids: Sequence[int]) -> list[tuple[int, str, str, Any, Any]]:
        """Stored messages as (id, role, kind, content, metadata) JSON, for those ids."""
        return self._mem._message_documents(ids)

    def replace_working(self, messages: MessageInput) -> list[Msg]:
        """`clear()` then `add(messages)` in one transaction; the messages stored."""
        return self._mem._replace_working(messages)

    def appended_over_trigger(self) -> bool:
        """Whether the memory's latest `add()` left the session at or over its trigger."""
        return self._mem._appended_over_trigger()

    def count_originals(self) -> int:
        """The originals stored for the session."""
        return self._mem._count_originals()

    def after_fork_in_child(self) -> None:
        """Fresh locks, and no background compression of the parent's (docs/design.md §5)."""
        self._mem._after_fork_in_child()


def internals(mem: AutoContextMemory) -> MemoryInternals:
    """The internal API of `mem` (see `MemoryInternals`)."""
    return mem._internals


def _rewrite_with(
    config: AutoContextConfig, counter: TokenCounter
) -> Callable[[Mapping[int, Msg], Sequence[Derived], Mapping[int, Msg]], dict[int, Prepared]]:
    def rewrite(
        erased: Mapping[int, Msg], derived: Sequence[Derived], stored: Mapping[int, Msg]
    ) -> dict[int, Prepared]:
        return rewrite_erased(erased, derived, stored, config, counter)

    return rewrite


def _rewrite_for(
    config: AutoContextConfig, counter: TokenCounter, stored: Mapping[str, Any]
) -> Callable[[Mapping[int, Msg], Sequence[Derived], Mapping[int, Msg]], dict[int, Prepared]]:
    """The rewrite of another session's messages, with the config it was stored with (its
    token encoding counts its totals); the erasing memory's when that cannot be read back."""
    try:
        theirs = AutoContextConfig.from_json(stored)
        return _rewrite_with(theirs, TokenCounter(theirs.model))
    except (AutoContextError, ValueError, TypeError, KeyError):
        return _rewrite_with(config, counter)
