"""A memory's reads: the working context (checked against the window for a model call), its
totals, events and originals, reload and search, and the model tools that reach them.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any, Literal

from . import _arguments
from . import _window as window
from ._anthropic import anthropic_tools, to_anthropic
from ._dropped import dropped_facts
from ._errors import EventNotFound, InvalidArgument, InvalidMessageId, InvalidPage
from ._events import Event
from ._memory_compress import MemoryCompression
from ._memory_state import _serialized
from ._messages import Msg, to_openai_messages
from ._prompts import RELOAD_SNIPPET
from ._search import (
    DEFAULT_LIMIT,
    AutoContextSearchHit,
    SearchScope,
    validate_limit,
    validate_query,
    validate_scope,
)
from ._store import search as search_store
from ._store.undo import offloads_of
from ._tools import (
    SEARCH_TOOL_NAME,
    TOOL_NAME,
    answer_reload_call,
    answer_search_call,
    call_arguments,
    tool_definitions,
)

ToolFormat = Literal["openai", "anthropic"]


class MemoryReads(MemoryCompression):
    """What a memory reads (each read of the working context runs the window policy first)."""

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
        applied = event is not None and event.status == "applied"
        offloads = offloads_of(self._store, event) if event is not None and applied else []
        if not offloads:
            raise EventNotFound(
                f"session {self.session_id!r} has no compression event {checked}"
                + ("" if event is None else f" (event {checked} compressed nothing)")
                + "; mem.events() lists them"
            )
        return self._dropped_of(offloads)

    def _dropped_of(self, offloads: Sequence[_arguments.OffloadRef]) -> list[str]:
        originals = [m for o in offloads for m in self._store.reload(o, originals=True)]
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
                lambda offload: self._dropped_of([offload]),
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
