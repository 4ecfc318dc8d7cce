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
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import wait as wait_for_futures
from dataclasses import replace
from typing import Any, Literal, ParamSpec, TypeVar

from sqlalchemy.engine import URL, Engine

from . import _arguments, _reserve
from . import _undoing as undoing
from . import _window as window
from ._agent_plan import validate_plan
from ._anthropic import anthropic_tools, to_anthropic
from ._background import (
    BackgroundMode,
    BackgroundState,
    done_future,
    validate_background,
)
from ._client import AutoContextClient, OpenArguments, open_shared
from ._coerce import coerce_messages
from ._compressor import Compressor, SessionState
from ._config import (
    AutoContextConfig,
    RuntimeOptions,
)
from ._dropped import dropped_facts
from ._erasure import Derived, rewrite_erased
from ._erasure_result import AutoContextErasure
from ._errors import (
    AutoContextError,
    EventNotFound,
    InvalidArgument,
    InvalidMessage,
    InvalidMessageId,
    InvalidPage,
    SessionNotFound,
)
from ._events import Event
from ._intake import Prepared, prepare, stand_in
from ._messages import Msg, to_openai_messages
from ._observe import CompressionHooks, Observer
from ._prompts import RELOAD_SNIPPET
from ._read_check import ReadCheck
from ._search import (
    DEFAULT_LIMIT,
    AutoContextSearchHit,
    SearchScope,
    validate_limit,
    validate_query,
    validate_scope,
)
from ._sessions import SessionInfo
from ._store import erase as erase_sql
from ._store import lifecycle, locks
from ._store import search as search_store
from ._store.claims import SessionClaim, claimed
from ._store.store import SessionStore
from ._summarizers import (
    OfflineSummarizer,
    Summarizer,
)
from ._tokens import TokenCounter
from ._tools import (
    SEARCH_TOOL_NAME,
    TOOL_NAME,
    answer_reload_call,
    answer_search_call,
    call_arguments,
    tool_definitions,
)
from ._trigger import is_due, trigger_of

logger = logging.getLogger("autoctx")

ToolFormat = Literal["openai", "anthropic"]
MessageInput = Msg | Mapping[str, Any] | Iterable[Msg | Mapping[str, Any]]

_P = ParamSpec("_P")
_R = TypeVar("_R")


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


def _serialized(method: Callable[_P, _R]) -> Callable[_P, _R]:
    """Run the method under its memory's lock (reentrant: public methods call each other).

    The outermost call is tried again when it met a foreign lock past PostgreSQL's
    `lock_timeout` (its transaction rolled back, so nothing of it was written), and raises that
    `Conflict` when the lock is still held (autoctx._store.locks)."""

    @functools.wraps(method)
    def locked(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        mem: AutoContextMemory = args[0]  # type: ignore[assignment]
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


class AutoContextMemory:
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
        client: AutoContextClient,
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
        return open_shared(database_url, auto_upgrade, args)

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
            if not is_due(info, self.config):
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

    # -- reading ----------------------------------------------------------------------------

    def messages(self) -> list[Msg]:
        """The working context, in order. In background mode, kept under the window first
        (see `compress_if_needed()`: this is what the next model call reads)."""
        window.run(
            window.before_read(self._background_mode, self.config, self._background),
            self._take_step,
        )
        return self._working()

    @_serialized
    def _working(self) -> list[Msg]:
        self._check_open()
        return self._store.load_working()

    def to_openai(self) -> list[dict[str, Any]]:
        """The working context as OpenAI Chat Completions messages.

        Over the window (nobody called `compress_if_needed()`), it logs a warning once per
        memory; with `RuntimeOptions(strict=True)` it raises `ContextOverWindow` instead."""
        return to_openai_messages(self._for_model(self.messages()))

    def to_anthropic(self) -> tuple[str, list[dict[str, Any]]]:
        """The working context as `(system, messages)` for the Anthropic Messages API: the
        system text, then user and assistant turns that alternate, each call's results in the
        user turn after it. Over the window, as `to_openai()`."""
        return to_anthropic(self._for_model(self.messages()))

    def _for_model(self, msgs: list[Msg]) -> list[Msg]:
        """`msgs`, read for a model call: checked against the window (docs/design.md §2)."""
        self._read_check.check(msgs, self.config, self.options, self.session_id)
        return msgs

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

    @_serialized
    def refresh(self) -> SessionInfo:
        """Re-read the session row (one primary-key read)."""
        self._check_open()
        self._info = self._store.totals()
        return self._info

    def token_count(self) -> int:
        """Working tokens, from the session row (no recount)."""
        return self.refresh().token_count

    def message_count(self) -> int:
        """Working messages, from the session row."""
        return self.refresh().message_count

    def version(self) -> int:
        """The session's version (one more with every committed write), from the session row.

        `token_count()`, `message_count()` and `version()` are methods, in the sync memory as in
        the async one: each reads the database."""
        return self.refresh().version

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

    @_serialized
    def events(self) -> list[Event]:
        """Every compression event of the session, oldest first."""
        self._check_open()
        return self._store.events()

    @_serialized
    def dropped(self, event_id: int) -> list[str]:
        """The facts of the originals compression `event_id` replaced that the working
        context does not show now, best ranked first (docs/design.md §6): what to reload
        (`reload(event.offload_uuid, originals=True)`) before relying on it.

        The same extractor and matching as the check after every summary; it answers for
        every compression, previews and masking included. Raises `InvalidEventId` for an id
        that is not a positive integer, and `EventNotFound` for one the session does not have
        or whose event compressed nothing (a failed attempt, a pop, a clear, a fork, an
        erasure).
        """
        self._check_open()
        checked = _arguments.event_id(event_id)
        event = next((e for e in self._store.events() if e.id == checked), None)
        if event is None or event.status != "applied" or event.offload_uuid is None:
            raise EventNotFound(
                f"session {self.session_id!r} has no compression event {checked}"
                + ("" if event is None else f" (event {checked} compressed nothing)")
                + "; mem.events() lists them"
            )
        return self._dropped_of(event.offload_uuid)

    def _dropped_of(self, offload: _arguments.OffloadRef) -> list[str]:
        originals = self._store.reload(offload, originals=True)
        return dropped_facts(originals, self._store.load_working())

    @_serialized
    def originals(self, offset: int = 0, limit: int | None = None) -> list[Msg]:
        """Every message the session was given, as given and in the order appended, whatever
        its compressions did since (a page of them with `offset` and `limit`): the record a
        framework reads back as its own history, where `messages()` is what the model reads.
        A message `pop_last()` or `clear()` took out of the working context is still here."""
        self._check_open()
        offset, limit = _arguments.page(offset, limit, "originals")
        return self._store.load_originals(offset, limit)

    # -- reload -----------------------------------------------------------------------------

    @_serialized
    def reload(
        self,
        offload_id: int | str | uuid.UUID | None = None,
        offset: int = 0,
        limit: int | None = None,
        *,
        message_id: int | None = None,
        session_id: str | None = None,
        originals: bool = False,
    ) -> list[Msg]:
        """The messages an offload removed (one level deep), optionally a page of them; or,
        with `message_id` instead of an offload id, that one stored message (a search hit).

        The offload id is the handle its tag shows (``12`` in ``<!-- offload 12 -->``, as an int
        or as text), or its uuid (as events, search hits and tags written before handles show
        it).

        With `originals=True`, the originals behind the offload instead: lineage followed down
        through the summaries and previews it holds (and theirs), so that the raw messages
        come back in one call, in the order they were appended; `offset` and `limit` page them.

        `session_id` reads another session of this memory's tenant (of the untenanted sessions
        for an untenanted memory), as a search of scope "tenant" finds them. Raises
        `InvalidOffloadId` for an empty or malformed id, `OffloadNotFound` for an id unknown to
        the session (or a session outside the tenant), `MessageNotFound` likewise for a message
        id, and `InvalidMessageId` for a message id that is not a positive integer (as `fork`
        and `erase` do) or for both (or neither) of the two ids.
        """
        self._check_open()
        if (offload_id is None) == (message_id is None):
            raise InvalidMessageId(
                "pass an offload id (the number in an offload tag, or a search hit's "
                "offload_uuid) or "
                "message_id= (a search hit's message_id), not both and not neither"
            )
        offset, limit = _arguments.page(offset, limit)
        if not isinstance(originals, bool):
            raise InvalidPage(
                f"reload: originals must be True or False, got {type(originals).__name__}"
            )
        if originals and message_id is not None:
            raise InvalidMessageId(
                "originals=True reads the originals behind an offload: pass the offload id "
                "(a search hit's offload_uuid), not message_id="
            )
        other = self._other_session(session_id)
        if message_id is not None:
            checked = _arguments.message_id(message_id, "message_id")
            msgs = [self._reload_message(checked, other)]
        else:
            assert offload_id is not None
            msgs = self._reload_offload(
                _arguments.offload_id(offload_id), other, originals=originals
            )
        return msgs[offset : None if limit is None else offset + limit]

    def tools(self, format: ToolFormat = "openai") -> list[dict[str, Any]]:
        """The definitions of the memory's model tools (`context_reload`, `context_search`):
        OpenAI function tools for a chat completion's `tools=`, or with `format="anthropic"`
        the Messages API's tools; `handle_tool_call()` answers a call of any of them (an OpenAI
        tool call or an Anthropic tool_use block)."""
        if format == "anthropic":
            return anthropic_tools(tool_definitions(self.config))
        if format != "openai":
            raise InvalidArgument(f"tools(format={format!r}): use 'openai' or 'anthropic'")
        return tool_definitions(self.config)

    @_serialized
    def handle_tool_call(self, call: Any) -> str:
        """Answer a model's call of one of `tools()` with text, by its function name: an OpenAI
        tool-call dict, the `openai` client's tool-call object, or a `ToolUseBlock`. Never
        raises for a bad call: the model reads the answer, so a wrong uuid or malformed
        arguments are explained in it.
        """
        self._check_open()
        name, arguments = call_arguments(call)
        if name == TOOL_NAME:
            return answer_reload_call(
                arguments,
                lambda u, sid, deep: self._reload_offload(
                    u, self._other_session(sid), originals=deep
                ),
                self.config.reload_page_chars,
                lambda mid, sid: self._reload_message(mid, self._other_session(sid)),
                self._dropped_of,
            )
        if name == SEARCH_TOOL_NAME:
            return answer_search_call(
                arguments,
                lambda q, scope, n: self.search(q, scope=scope, limit=n),
                own_session=self.session_id,
                max_chars=self.config.reload_page_chars,
            )
        return (
            f"Unknown tool {name!r}: this handler answers {TOOL_NAME} and {SEARCH_TOOL_NAME} only."
        )

    def _other_session(self, session_id: str | None) -> str | None:
        """The other session of the tenant a reload names (None: this memory's own)."""
        if session_id is None:
            return None
        _arguments.session_id(session_id)
        return None if session_id == self.session_id else session_id

    def _reload_offload(
        self, offload: _arguments.OffloadRef, session_id: str | None, *, originals: bool = False
    ) -> list[Msg]:
        if session_id is None:
            return self._store.reload(offload, originals=originals)
        return search_store.reload_in_tenant(self._store, session_id, offload, originals=originals)

    def _reload_message(self, message_id: int, session_id: str | None) -> Msg:
        if session_id is None:
            incarnation = self._store.incarnation()
            return search_store.load_message(
                self._store, self.session_id, message_id, incarnation=incarnation
            )
        return search_store.load_message(self._store, session_id, message_id)

    # -- search -----------------------------------------------------------------------------

    @_serialized
    def search(
        self, query: str, *, scope: SearchScope = "session", limit: int = DEFAULT_LIMIT
    ) -> list[AutoContextSearchHit]:
        """The originals that match `query`, best first: full-text search (PostgreSQL's
        `websearch_to_tsquery` syntax: words, "a phrase", -excluded, or) with the session's
        `search_config`, ranked by cover density.

        `scope="session"` searches this session, `"tenant"` every session of this memory's
        tenant (for an untenanted memory, every untenanted session); another tenant's message
        is never a hit. Each hit names its session, message, role, time, a snippet with the
        matched words marked, and where the original is now (`in_working_context`, or the
        `offload_uuid` that holds it); `reload(message_id=..., session_id=...)` reads it whole.
        Raises `InvalidSearch` for an empty or overlong query, an unknown scope, or a limit
        outside 1..100.
        """
        self._check_open()
        text = validate_query(query)
        where = validate_scope(scope)
        count = validate_limit(limit)
        incarnation = self._store.incarnation()
        if where == "session":
            return search_store.search_session(
                self._store, self.session_id, text, count, incarnation=incarnation
            )
        return search_store.search_tenant(
            self._store, text, count, alive=(self.session_id, incarnation)
        )

    @staticmethod
    def system_prompt_snippet() -> str:
        """Text for the agent's system prompt that explains offload tags, reload and search."""
        return RELOAD_SNIPPET

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

    # -- for autoctx's own integrations (the Agents SDK session, the CLI) ----------------------

    @_serialized
    def _working_ids(self, limit: int | None = None) -> tuple[tuple[uuid.UUID, int], list[int]]:
        """The epoch of the session's message content (its incarnation and its erasure count:
        a message's content changes only when one of them does) and its working message ids
        (the last `limit` of them)."""
        self._check_open()
        erasures, ids = self._store.working_ids(limit)
        return (self._store.incarnation(), erasures), ids

    @_serialized
    def _message_documents(self, ids: Sequence[int]) -> list[tuple[int, str, str, Any, Any]]:
        """Stored messages as (id, role, kind, content, metadata) JSON, for those ids."""
        self._check_open()
        return self._store.message_documents(ids)

    @_serialized
    def _count_originals(self) -> int:
        self._check_open()
        return self._store.count_originals()

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


class MemoryInternals:
    """What autoctx's own code needs of a memory beyond its public methods, each named here,
    so that nothing outside this module touches a memory's private members. Reached with
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
    def client(self) -> AutoContextClient:
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
