"""The facade users import: `AutoContextMemory` and its async twin.

The async twin runs the same sync code in a worker thread (`asyncio.to_thread`): one source of
truth, and psycopg's sync driver under it.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from sqlalchemy.engine import URL, Engine

from .compressor import Compressor, trigger_of
from .config import AutoContextConfig
from .errors import InvalidSessionId, SessionNotFound
from .events import Event
from .intake import Prepared, count_tokens, prepare
from .messages import Msg, coerce_messages, to_openai_messages
from .prompts import RELOAD_SNIPPET
from .store.database import check_connection, create_engine, ensure_schema, resolve_url
from .store.rows import SessionInfo
from .store.store import Store
from .summarizers import AsyncSummarizer, Summarizer, default_summarizer
from .tokens import TokenCounter
from .tools import (
    TOOL_NAME,
    answer_reload_call,
    call_arguments,
    parse_offload_id,
    reload_tool_definition,
)
from .transcript import validate_plan

logger = logging.getLogger("autoctx")

MAX_SESSION_ID = 255
MessageInput = Msg | Mapping[str, Any] | Iterable[Msg | Mapping[str, Any]]

# One engine per URL per process: opening many memories must not open many pools.
_engines: dict[str, Engine] = {}
_schema_checked: set[str] = set()


def validate_session_id(session_id: object) -> str:
    if not isinstance(session_id, str):
        raise InvalidSessionId(f"session id must be a string, got {type(session_id).__name__}")
    if not session_id:
        raise InvalidSessionId("session id is empty; pass a non-empty string such as 'agent-42'")
    if len(session_id) > MAX_SESSION_ID:
        raise InvalidSessionId(
            f"session id is {len(session_id)} characters long; the limit is {MAX_SESSION_ID}"
        )
    if "\x00" in session_id:
        raise InvalidSessionId("session id contains a NUL character; remove it")
    try:
        session_id.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidSessionId("session id is not valid Unicode (lone surrogate)") from None
    return session_id


def get_engine(database_url: str | URL | None, *, auto_upgrade: bool) -> Engine:
    """The process-wide engine for a URL (or the embedded server), schema checked once."""
    url = resolve_url(database_url)
    key = url.render_as_string(hide_password=False)
    engine = _engines.get(key)
    if engine is None:
        engine = create_engine(url)
        check_connection(engine)
        _engines[key] = engine
    if key not in _schema_checked:
        ensure_schema(engine, auto_upgrade=auto_upgrade)
        _schema_checked.add(key)
    return engine


def dispose_engines() -> None:
    """Close every pooled connection (for tests and for forked children)."""
    for engine in _engines.values():
        engine.dispose()
    _engines.clear()
    _schema_checked.clear()


class AutoContextMemory:
    """The working memory of one agent session, kept in PostgreSQL.

    >>> mem = AutoContextMemory.open("agent-42")           # embedded PostgreSQL by default
    >>> mem.add({"role": "user", "content": "hello"})
    >>> mem.to_openai()                                     # the working context
    >>> mem.compress_if_needed()                            # events of this call
    """

    def __init__(
        self,
        store: Store,
        info: SessionInfo,
        config: AutoContextConfig,
        summarizer: Summarizer,
    ) -> None:
        self._store = store
        self.session_id = info.session_id
        self.tenant = info.tenant
        self.config = config
        self._counter = TokenCounter(config.model)
        self._summarizer = summarizer
        self._info = info
        self._closed = False

    @classmethod
    def open(
        cls,
        session_id: str,
        database_url: str | URL | None = None,
        config: AutoContextConfig | None = None,
        *,
        tenant: str | None = None,
        summarizer: Summarizer | None = None,
        create: bool = True,
    ) -> AutoContextMemory:
        """Open the session `session_id`, creating it unless `create=False`.

        The model (and so the token encoding) is fixed when the session is created: for an
        existing session the stored model wins over `config.model` (with a warning). Reopening
        without a config uses the thresholds stored with the session; with a config, the
        session's record of the thresholds in force is updated. `database_url` defaults to
        `AUTOCTX_DATABASE_URL`, else the embedded PostgreSQL.
        """
        validate_session_id(session_id)
        if tenant is not None and (not isinstance(tenant, str) or not tenant.strip()):
            # Under row-level security an empty tenant means "no tenant": refuse the ambiguity.
            raise InvalidSessionId(
                f"tenant {tenant!r} is not a tenant name; pass a non-empty string, or None for "
                "a session without a tenant"
            )
        given = config
        config = config or AutoContextConfig()
        engine = get_engine(database_url, auto_upgrade=config.auto_upgrade)
        store = Store(engine, tenant)
        info = store.get_session(session_id, tenant)
        if info is None:
            if not create:
                raise SessionNotFound(
                    f"session {session_id!r} does not exist; open it with create=True to start it"
                )
            counter = TokenCounter(config.model)
            info = store.create_session(
                session_id, tenant=tenant, config=config, encoding=counter.encoding_name
            )
        elif given is None:
            # Reopening without a config keeps the thresholds the session was run with.
            config = AutoContextConfig.from_json(info.config)
        if info.model != config.model:
            config = _with_model(config, info)
        if config.to_json() != info.config:
            # The thresholds in force are recorded on the session (and on each event).
            store.set_config(session_id, config.to_json())
        return cls(store, info, config, summarizer or default_summarizer())

    # -- writing ----------------------------------------------------------------------------

    def add(self, messages: MessageInput) -> list[Msg]:
        """Validate, count and append messages atomically; returns them as stored.

        Accepts a `Msg`, an OpenAI chat message dict, or a list mixing both. A rejected list
        stores none of its messages. Never compresses (call `compress_if_needed()`).
        """
        self._check_open()
        msgs = coerce_messages(messages)
        prepared = prepare(
            msgs, self._counter, max_chars=self.config.max_message_chars, session_id=self.session_id
        )
        return self._store.append(self.session_id, prepared)

    def compress_if_needed(self) -> list[Event]:
        """Run the compression loop if the trigger holds; returns this call's events."""
        compressor, info = self._compression()
        return compressor.run(info)

    def _compression(self) -> tuple[Compressor, SessionInfo]:
        """The compressor of one `compress_if_needed()` call and the totals it starts from."""
        self._check_open()
        info = self._store.totals(self.session_id)
        compressor = Compressor(
            self._store, self.session_id, self.config, self._counter, self._summarizer
        )
        return compressor, info

    def pop_last(self, split: Callable[[Msg], Msg | None] | None = None) -> Msg | None:
        """Take the last working message out of the working context and return it.

        The original stays stored; the removal is an applied event (strategy 0, reason
        'manual'). `split(last)` may return a message to stand in its place (for example the
        rest of a message that held several items). Returns None when the context is empty.
        """
        self._check_open()

        def remainder(last: Msg) -> Prepared | None:
            rest = split(last) if split is not None else None
            if rest is None:
                return None
            return Prepared(rest, count_tokens(rest, self._counter), rest.payload_chars, False)

        return self._store.pop_last(self.session_id, remainder, config=self.config.to_json())

    def set_plan(self, plan: Mapping[str, Any] | None) -> None:
        """Attach a plan (goal, steps with states, expected outcome) for the summaries' plan
        hint; None removes it."""
        self._check_open()
        self._store.set_plan(self.session_id, validate_plan(plan) if plan is not None else None)

    # -- reading ----------------------------------------------------------------------------

    def messages(self) -> list[Msg]:
        """The working context, in order."""
        self._check_open()
        return self._store.load_working(self.session_id)

    def to_openai(self) -> list[dict[str, Any]]:
        """The working context as OpenAI Chat Completions messages."""
        return to_openai_messages(self.messages())

    def refresh(self) -> SessionInfo:
        """Re-read the session row (one primary-key read)."""
        self._check_open()
        self._info = self._store.totals(self.session_id)
        return self._info

    @property
    def token_count(self) -> int:
        """Working tokens, from the session row (no recount)."""
        return self.refresh().token_count

    @property
    def message_count(self) -> int:
        """Working messages, from the session row."""
        return self.refresh().message_count

    @property
    def version(self) -> int:
        return self.refresh().version

    def appended_over_trigger(self) -> bool:
        """Whether this memory's latest `add()` left the session at or over its trigger, from
        the totals that append committed (no read). After an `add()`, `compress_if_needed()`
        only has work when this holds, so an agent loop can skip that call's read of the
        session row; another writer's later appends are seen by the next check."""
        totals = self._store.totals_after_append(self.session_id)
        return totals is None or trigger_of(*totals, self.config).fired

    def needs_compression(self) -> bool:
        """The trigger of SPEC.md section 2, from the session row: one indexed read."""
        info = self.refresh()
        return trigger_of(info.message_count, info.token_count, self.config).fired

    def events(self) -> list[Event]:
        """Every compression event of the session, oldest first."""
        self._check_open()
        return self._store.events(self.session_id)

    # -- reload -----------------------------------------------------------------------------

    def reload(
        self, offload_id: str | uuid.UUID, offset: int = 0, limit: int | None = None
    ) -> list[Msg]:
        """The messages an offload removed (one level deep), optionally a page of them.

        Raises `InvalidOffloadId` for an empty or malformed id and `OffloadNotFound` for an id
        unknown to this session.
        """
        self._check_open()
        parsed = offload_id if isinstance(offload_id, uuid.UUID) else parse_offload_id(offload_id)
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offset must be an integer >= 0, got {offset!r}")
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int) or limit < 1
        ):
            raise ValueError(f"limit must be a positive integer or None, got {limit!r}")
        msgs = self._store.reload(self.session_id, parsed)
        return msgs[offset : None if limit is None else offset + limit]

    def reload_tool(self) -> dict[str, Any]:
        """The OpenAI function-tool definition of `context_reload`."""
        return reload_tool_definition(self.config.reload_page_chars)

    def handle_tool_call(self, call: Any) -> str:
        """Answer a model's `context_reload` call (OpenAI tool-call dict or `ToolUseBlock`)."""
        name, arguments = call_arguments(call)
        if name != TOOL_NAME:
            return f"Unknown tool {name!r}: this handler answers {TOOL_NAME} only."
        return self.answer_reload(arguments)

    def answer_reload(self, arguments: str | Mapping[str, Any]) -> str:
        """Answer `context_reload` arguments (JSON text or a dict) with text; never raises."""
        self._check_open()
        return answer_reload_call(
            arguments,
            lambda u: self._store.reload(self.session_id, u),
            self.config.reload_page_chars,
        )

    @staticmethod
    def system_prompt_snippet() -> str:
        """Text for the agent's system prompt that explains offload tags and reload."""
        return RELOAD_SNIPPET

    # -- lifecycle --------------------------------------------------------------------------

    def delete(self) -> None:
        """Delete the session and everything of it."""
        self._check_open()
        self._store.delete_session(self.session_id, self.tenant)
        self._closed = True

    def close(self) -> None:
        self._closed = True

    def __enter__(self) -> AutoContextMemory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise SessionNotFound(
                f"the memory of session {self.session_id!r} is closed; open it again"
            )

    @property
    def engine(self) -> Engine:
        return self._store.engine

    @property
    def store(self) -> Store:
        """The store behind the memory (for integrations that read stored JSON directly)."""
        return self._store

    @property
    def summarizer(self) -> Summarizer:
        return self._summarizer


def _with_model(config: AutoContextConfig, info: SessionInfo) -> AutoContextConfig:
    # The encoding is fixed at creation: counts already stored were made with it.
    logger.warning(
        "autoctx: session %r was created for model %r; keeping it (config says %r)",
        info.session_id,
        info.model,
        config.model,
    )
    return replace(config, model=info.model)


class AsyncAutoContextMemory:
    """`AutoContextMemory` for asyncio: the same code, run in a worker thread."""

    def __init__(self, sync: AutoContextMemory) -> None:
        self.sync = sync
        self.session_id = sync.session_id

    @classmethod
    async def open(
        cls,
        session_id: str,
        database_url: str | URL | None = None,
        config: AutoContextConfig | None = None,
        **kwargs: Any,
    ) -> AsyncAutoContextMemory:
        sync = await asyncio.to_thread(
            AutoContextMemory.open, session_id, database_url, config, **kwargs
        )
        return cls(sync)

    async def add(self, messages: MessageInput) -> list[Msg]:
        return await asyncio.to_thread(self.sync.add, messages)

    async def messages(self) -> list[Msg]:
        return await asyncio.to_thread(self.sync.messages)

    async def to_openai(self) -> list[dict[str, Any]]:
        return await asyncio.to_thread(self.sync.to_openai)

    async def token_count(self) -> int:
        return await asyncio.to_thread(lambda: self.sync.token_count)

    async def message_count(self) -> int:
        return await asyncio.to_thread(lambda: self.sync.message_count)

    async def needs_compression(self) -> bool:
        return await asyncio.to_thread(self.sync.needs_compression)

    def appended_over_trigger(self) -> bool:
        return self.sync.appended_over_trigger()  # no I/O: nothing to run in a thread

    async def compress_if_needed(self) -> list[Event]:
        summarizer = self.sync.summarizer
        if not isinstance(summarizer, AsyncSummarizer):
            return await asyncio.to_thread(self.sync.compress_if_needed)
        # The database steps run in a worker thread; the LLM call is awaited and holds none.
        compressor, info = await asyncio.to_thread(self.sync._compression)
        return await compressor.arun(info, summarizer)

    async def events(self) -> list[Event]:
        return await asyncio.to_thread(self.sync.events)

    async def reload(
        self, offload_id: str | uuid.UUID, offset: int = 0, limit: int | None = None
    ) -> list[Msg]:
        return await asyncio.to_thread(self.sync.reload, offload_id, offset, limit)

    async def handle_tool_call(self, call: Any) -> str:
        return await asyncio.to_thread(self.sync.handle_tool_call, call)

    async def answer_reload(self, arguments: str | Mapping[str, Any]) -> str:
        return await asyncio.to_thread(self.sync.answer_reload, arguments)

    async def pop_last(self, split: Callable[[Msg], Msg | None] | None = None) -> Msg | None:
        return await asyncio.to_thread(self.sync.pop_last, split)

    async def refresh(self) -> SessionInfo:
        return await asyncio.to_thread(self.sync.refresh)

    async def version(self) -> int:
        return await asyncio.to_thread(lambda: self.sync.version)

    @staticmethod
    def system_prompt_snippet() -> str:
        return AutoContextMemory.system_prompt_snippet()

    async def set_plan(self, plan: Mapping[str, Any] | None) -> None:
        await asyncio.to_thread(self.sync.set_plan, plan)

    def reload_tool(self) -> dict[str, Any]:
        return self.sync.reload_tool()

    async def delete(self) -> None:
        await asyncio.to_thread(self.sync.delete)

    async def close(self) -> None:
        self.sync.close()

    async def __aenter__(self) -> AsyncAutoContextMemory:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
