"""autoctx as an OpenAI Agents SDK session: pass one object and an agent gets the memory.

    from agents import Agent, Runner
    from autoctx.integrations.openai_agents import AutoContextSession, context_tools

    session = AutoContextSession("agent-42", config=AutoContextConfig(max_tokens=128_000))
    agent = Agent(
        name="worker",
        instructions="..." + AutoContextMemory.system_prompt_snippet(),
        tools=[..., *context_tools(session)],
    )
    await Runner.run(
        agent, "Fix the failing test", session=session, run_config=session.run_config()
    )

`session.run_config()` sets the SDK's `RunConfig.call_model_input_filter` to
`session.call_model_input_filter`, so that every model call inside a run is sent the working
context: without it the SDK builds each call of a run from its own in-memory list of the run's
items, and a run of many tool calls overflows the window whatever the session compressed.

`AutoContextSession` implements the SDK's `Session` protocol (`get_items`, `add_items`, `pop_item`,
`clear_session`, `session_id`, `session_settings`). The SDK speaks Responses-API input items;
autoctx stores messages. The conversion is lossless: `get_items()` after `add_items(items)`
gives back items equal to `items` (every key the conversion does not model is kept in the
message's metadata under ``"agents"``), until a compression replaces some of them.

How items become messages, so that compression keeps what belongs together together:

- a user, system or developer message item is one message;
- a `function_call_output` item is one tool message (its call id binds it to its call);
- every other run of consecutive items (reasoning, assistant output messages, function calls,
  hosted tool calls and any item type autoctx does not know) is ONE assistant message: function
  calls become its tool_use blocks (consecutive calls are parallel calls of one tool group), the
  assistant's text its text blocks, and everything else opaque blocks. A reasoning item that
  precedes function calls is therefore compressed, offloaded or kept with them.

Summaries and previews written by the compressions come back as plain items: an assistant
message with string content for a summary (the form every model API and the SDK's Chat
Completions converter accept without an item id), a `function_call_output` holding the preview
for a previewed tool result, a user message for a previewed user message, and the calls of a
summarized tool_use message as `function_call` items, so that the SDK always gets a history the
model API accepts.

A model response is saved by the SDK in one `add_items` call; autoctx refuses a batch that
starts new calls while earlier ones are unanswered, so a response's parallel calls must not be
split across two calls (the SDK never does).

The SDK calls are async; autoctx's memory is sync, so each call runs it in a worker thread.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import threading
from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from ._agents_items import (
    META_KEY,
    Item,
    as_dict,
    convert,
    items_to_messages,
    items_with_blocks,
    message_items,
    plain_copy,
)
from ._filter_check import FilterCheck, sdk_tool_definitions
from ._optional import framework_of

with framework_of(
    "Agents SDK", needs="the OpenAI Agents SDK", extra="agents", packages=("agents",)
):
    from agents.items import TResponseInputItem
    from agents.memory.session_settings import (
        SessionSettings,
        coerce_session_settings,
        resolve_session_limit,
    )
    from agents.run_config import CallModelData, ModelInputData, RunConfig
    from agents.tool import FunctionTool
    from agents.tool_context import ToolContext
from sqlalchemy.engine import URL

from .. import _arguments
from .._background import BackgroundMode, validate_background
from .._client import AutoContextClient
from .._config import AutoContextConfig, RuntimeOptions, options_argument
from .._errors import ConfigError, SessionNotFound
from .._gc import paused_gc
from .._memory import AutoContextMemory, internals
from .._messages import (
    Msg,
)
from .._summarizers import Summarizer
from .._tools import tool_definitions
from ._opening import checked_client, open_memory

__all__ = ["META_KEY", "AutoContextSession", "context_tools", "items_to_messages", "message_items"]

# ---------------------------------------------------------------------------------------------
# The session
# ---------------------------------------------------------------------------------------------


class _ItemCache:
    """The items of a session's working messages by message id, and their digests (see
    `_Ledger`), for the epoch of the session's content they belong to (its incarnation and
    erasure count: a message's items change only when one of them does).

    One per session per client (`AutoContextClient.session_caches`), shared by every
    `AutoContextSession` object of the session opened through that client: a new object reads
    what an earlier one read or wrote (docs/design.md §5). Each read checks the epoch first, so
    another process's appends, pops, clears, compressions and erasures are seen; an erasure in
    this process empties it at once.

    Bounded (docs/design.md §5): at most `capacity` messages, the least recently read or
    written dropped first, so that one very long session in a long-lived process does not grow
    without limit (a dropped message is fetched again when a read needs it). The client's
    `SessionCaches` bounds how many sessions keep one.
    """

    #: Messages one session's cache keeps: far more than a compressed working context holds,
    #: and enough for the whole history of a long session with compression off, whose every
    #: whole read would otherwise fetch what the bound dropped (bench/peers.py, 20,000 items:
    #: about 16,000 messages).
    capacity: int = 20_000

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.epoch: Any = None
        self.items: OrderedDict[int, list[Item]] = OrderedDict()
        # Computed once per message when a read first needs them: a read of a long history
        # must not hash all of it again.
        self.digests: dict[int, list[bytes]] = {}

    def touch(self, ids: Sequence[int]) -> None:
        """Mark `ids` (held) as just used."""
        for i in ids:
            self.items.move_to_end(i)

    def trim(self) -> None:
        """Drop the least recently used messages beyond `capacity` (and their digests)."""
        while len(self.items) > self.capacity:
            dropped, _ = self.items.popitem(last=False)
            self.digests.pop(dropped, None)


def _item_cache(mem: AutoContextMemory) -> _ItemCache:
    return internals(mem).client.session_caches.get((META_KEY, mem.session_id), _ItemCache)


@dataclass(frozen=True)
class _OpenArgs:
    client: AutoContextClient | None
    database_url: str | URL | None
    config: AutoContextConfig | None
    summarizer: Summarizer | None
    tenant: str | None
    background: BackgroundMode
    options: RuntimeOptions


class AutoContextSession:
    """An OpenAI Agents SDK `Session` kept by autoctx in PostgreSQL.

    `AutoContextSession(session_id, database_url=None, config=None, *, summarizer=None,
    compress=True, tenant=None, background=False, options=None, client=None)` opens (or
    creates) the autoctx session on first use, through `client` (an `AutoContextClient`,
    instead of `database_url`: its `close()` closes the memory) or else the shared client of
    `database_url`; `AutoContextSession.from_memory(mem)` wraps a memory already open. With
    `compress=True`, `add_items` runs autoctx's compression loop whenever the trigger holds
    after the append; with `background=True` as well, that loop runs in a background thread
    and `add_items` returns at once, waiting only when the context would otherwise be over the
    window (`AutoContextMemory.open(..., background=True)`); `background="worker"` leaves it to
    `autoctx worker` processes.
    """

    session_settings: SessionSettings | None

    def __init__(
        self,
        session_id: str,
        database_url: str | URL | None = None,
        config: AutoContextConfig | None = None,
        *,
        summarizer: Summarizer | None = None,
        compress: bool = True,
        tenant: str | None = None,
        session_settings: SessionSettings | Mapping[str, Any] | None = None,
        background: BackgroundMode = False,
        options: RuntimeOptions | None = None,
        client: AutoContextClient | None = None,
    ) -> None:
        # Refused here, as `AutoContextMemory.open` would, rather than at the first run.
        self.session_id = _arguments.session_id(session_id)
        self.compress = compress
        # As the SDK's own stores do: a dict becomes `SessionSettings`, and an unknown key is a
        # TypeError here rather than an AttributeError inside `Runner.run`.
        self.session_settings = (
            coerce_session_settings(cast(Any, session_settings))
            if session_settings is not None
            else SessionSettings()
        )
        # Refused here, naming the argument, rather than at the first `Runner.run`.
        self._args = _OpenArgs(
            checked_client(client, database_url, "AutoContextSession"),
            database_url,
            config,
            summarizer,
            _arguments.tenant(tenant),
            validate_background(background),
            options_argument(options),
        )
        self._mem: AutoContextMemory | None = None
        # Opening touches the database; it happens once, in whichever worker thread asks first.
        self._lock = threading.Lock()
        # Which items of a run's input the memory holds already (see `call_model_input_filter`).
        self._ledger = _Ledger()
        # Whether runs go through that filter (a run without it is warned of, once).
        self._filter_check = FilterCheck()

    @classmethod
    def from_memory(
        cls,
        mem: AutoContextMemory,
        *,
        compress: bool = True,
        session_settings: SessionSettings | Mapping[str, Any] | None = None,
    ) -> AutoContextSession:
        """A session over an open memory (its database, config, tenant and summarizer)."""
        summarizer = mem.summarizer
        session = cls(
            mem.session_id,
            mem.engine.url,
            mem.config,
            summarizer=summarizer,
            compress=compress,
            tenant=mem.tenant,
            session_settings=session_settings,
        )
        session._mem = mem
        return session

    # -- the memory ---------------------------------------------------------------------------

    @property
    def config(self) -> AutoContextConfig:
        """The thresholds in force (the memory's once open)."""
        if self._mem is not None:
            return self._mem.config
        return self._args.config or AutoContextConfig()

    def memory(self) -> AutoContextMemory:
        """The autoctx memory behind the session, opened (or created) on first use (sync)."""
        with self._lock:
            if self._mem is None:
                self._mem = self._open(create=True)
            return self._mem

    def _open(self, *, create: bool) -> AutoContextMemory:
        args = self._args
        return open_memory(
            args.client,
            args.database_url,
            self.session_id,
            args.config,
            tenant=args.tenant,
            summarizer=args.summarizer,
            create=create,
            background=args.background,
            options=args.options,
        )

    # -- Session protocol ---------------------------------------------------------------------

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The working context as input items, oldest first; with `limit`, the latest `limit`."""
        resolved = resolve_session_limit(limit, self.session_settings)
        items, digests = await asyncio.to_thread(self._read, resolved, digests=True)
        # What the SDK starts a run from: those items of its input are stored already.
        self._ledger.saw(digests)
        return items

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append items (one transaction), then compress if the trigger holds."""
        if not items:
            return
        await asyncio.to_thread(self.add_items_sync, items)

    async def _atomic_replace_items(self, items: list[TResponseInputItem]) -> bool:
        """The hook the SDK's compaction wrapper (`OpenAIResponsesCompactionSession`) rewrites a
        history through when a store has one, instead of `clear_session()` then `add_items()`:
        here one transaction, the clear's audit event and offload included, so that a crash
        between the two never leaves the session empty. False (the wrapper then clears and
        adds) for a subclass, which may transform items on their way in, as the SDK's own
        stores do."""
        if type(self) is not AutoContextSession:
            return False
        await asyncio.to_thread(self._replace_items_sync, items)
        return True

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove the latest item from the working context and return it (see `pop_item_sync`)."""
        return await asyncio.to_thread(self.pop_item_sync)

    async def clear_session(self) -> None:
        """Empty the working context; the originals and the audit trail stay."""
        await asyncio.to_thread(self.clear_session_sync)

    # -- sync twins (what the async methods run in a worker thread) ------------------------------

    def get_items_sync(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The working context as items (sync).

        A message changes only when it is erased, so the items of each working message are kept
        in memory by message id, in a cache the client shares among every session object of the
        session (`_ItemCache`): a read asks the database only for the working set's message
        ids (one short query) and for the content of the messages no object has seen yet,
        whoever wrote them. The cache belongs to the session's incarnation (message ids start
        over when a session is deleted and created again under the same id) and to its erasure
        count, which the same short query returns: after an erasure, by this process or any
        other, the next read starts the cache over and never serves erased text.
        """
        return self._read(limit, digests=False)[0]

    def _read(
        self, limit: int | None, *, digests: bool
    ) -> tuple[list[TResponseInputItem], list[bytes]]:
        """`get_items_sync`'s items and, with `digests`, their digests for the ledger."""
        if limit is not None and limit <= 0:
            return [], []
        mem = self.memory()
        # Every message gives at least one item, so the latest `limit` messages hold the latest
        # `limit` items: the read stays O(limit) on a session of any length.
        epoch, ids = internals(mem).working_ids(limit)
        shared = _item_cache(mem)
        with shared.lock:
            if epoch != shared.epoch:
                shared.epoch, shared.items, shared.digests = epoch, OrderedDict(), {}
            cache = shared.items
            known = {i: cache[i] for i in ids if i in cache}
            shared.touch(list(known))
        missing = [i for i in ids if i not in known]
        # One pause of the collector for the whole build: a new object's first read makes
        # hundreds of thousands of small objects (none of them cyclic garbage), and a
        # collection between two steps of it would walk them all.
        with paused_gc():
            if missing:
                documents = internals(mem).message_documents(missing)
                for msg_id, role, kind, content, metadata in documents:
                    known[msg_id] = [
                        item for item, _ in items_with_blocks(role, kind, content, metadata)
                    ]
            with shared.lock:
                if epoch == shared.epoch:
                    if limit is None:
                        # Only the working set stays cached: compressed-away messages go.
                        shared.items = OrderedDict((i, known[i]) for i in ids)
                        shared.digests = {i: shared.digests[i] for i in ids if i in shared.digests}
                    else:
                        shared.items.update((i, known[i]) for i in missing)
                    shared.trim()
            items = [item for i in ids for item in known[i]]
            if limit is not None:
                items = items[-limit:]
            # Copies: a caller that edits what it got must not edit the cache.
            copies = cast(list[TResponseInputItem], [plain_copy(item) for item in items])
        return copies, _digests_of(shared, epoch, ids, known, limit) if digests else []

    def add_items_sync(self, items: Sequence[Any]) -> None:
        """Append items (one transaction), then compress if the trigger holds (sync)."""
        self._filter_check.added(items, self.session_id)
        # Items the input filter stored already, earlier in this run, are not stored twice.
        items = self._ledger.unclaimed(items)
        if not items:
            return
        self._store_items(items, replace=False)

    def _replace_items_sync(self, items: Sequence[Any]) -> None:
        """Empty the working context and append items, in one transaction (sync)."""
        self._store_items(items, replace=True)

    def _store_items(self, items: Sequence[Any], *, replace: bool) -> None:
        converted = convert(items)
        mem = self.memory()
        msgs = [msg for msg, _ in converted]
        stored = internals(mem).replace_working(msgs) if replace else mem.add(msgs)
        # The items as `convert` checked them: plain JSON, not checked again for the digests.
        self._ledger.stored([item for _, group in converted for item in group])
        # What was just written is known: the next read need not fetch it back. (The epoch
        # is not known here; a read with a new epoch starts the cache over anyway.)
        shared = _item_cache(mem)
        with shared.lock:
            if shared.epoch is not None:
                for msg, (_, group) in zip(stored, converted, strict=True):
                    if msg.id is not None:
                        shared.items[msg.id] = [
                            plain_copy(item if type(item) is dict else dict(item)) for item in group
                        ]
                shared.trim()
        if self.compress and internals(mem).appended_over_trigger():
            mem.compress_if_needed()

    def pop_item_sync(self) -> TResponseInputItem | None:
        """Remove the latest item from the working context and return it.

        The SDK pops one item at a time (to undo a turn, or before a retry) and compares what it
        gets, so this pops exactly one item, never a whole message: when the latest message
        holds several items (a reasoning item and parallel calls are one assistant message),
        the message leaves the working context and a message holding its other items takes its
        place. The popped original stays in the database (originals are never deleted) and the
        pop is recorded as an event (strategy 0, reason 'manual'). One transaction, under the
        session row's lock, like every autoctx write.
        """
        mem = self.memory()
        popped: list[Item] = []

        def split(last: Msg) -> Msg | None:
            items = items_with_blocks(last.role, last.kind, last.content_json(), last.metadata)
            if not items:
                return None
            item, blocks = items[-1]
            popped.append(item)
            if len(items) == 1:
                return None
            keep = [k for k in range(len(last.content)) if k not in set(blocks)]
            return _remainder(last, keep)

        if mem.pop_last(split) is None:
            return None
        if popped:
            self._ledger.forget(popped[0])
        return cast(TResponseInputItem | None, popped[0] if popped else None)

    def clear_session_sync(self) -> None:
        """Empty the working context (sync). Clearing is not deleting (docs/design.md §5): the
        SDK's compaction wrapper clears a session before it rewrites its history, and that
        must not destroy the originals and the audit trail. Delete through the memory
        (`session.memory().delete()`) to remove everything."""
        with self._lock:
            mem = self._mem
        if mem is None:
            try:
                mem = self._open(create=False)
            except SessionNotFound:
                return  # never used: nothing to clear
            with self._lock:
                self._mem = self._mem or mem
        mem.clear()

    # -- inside a run -------------------------------------------------------------------------

    async def call_model_input_filter(self, data: CallModelData[Any]) -> ModelInputData:
        """The SDK's `RunConfig.call_model_input_filter`: every model call of a run is sent the
        session's working context, so it stays under `max_tokens` inside a run too.

        Without it the SDK builds each model call of a run from its own in-memory list (the
        history read at the start plus every item of the run so far): the session compresses
        what it stores, but a run of many tool calls still sends everything it produced, and
        its requests grow past the window. Use it with the session:

            await Runner.run(agent, prompt, session=session, run_config=session.run_config())

        Items of the input the memory does not hold yet (a streamed run's new input, or every
        new item when the run has no session) are stored first, compressed as any append, and
        recorded so that the SDK's own `add_items` of the same items later stores nothing
        twice. The instructions pass through unchanged; they and the agent's tool definitions
        are measured, and unless the config sets `reserve_tokens` their tokens come off the
        window (`AutoContextMemory.reserve_for`). The working context keeps the SDK's pairing
        rules: a `function_call_output` follows its `function_call`, and a reasoning item stays
        with the calls that follow it (they are one message, compressed together).
        """
        tools = sdk_tool_definitions(data.agent)
        instructions = data.model_data.instructions
        items = await asyncio.to_thread(
            self._filter_and_reserve, data.model_data.input, tools, instructions
        )
        return ModelInputData(input=items, instructions=data.model_data.instructions)

    def _filter_and_reserve(
        self, items: Sequence[Any], tools: list[dict[str, Any]], instructions: str | None
    ) -> list[TResponseInputItem]:
        """`filter_input_sync`, with room kept for the agent's tools and instructions: they
        are sent beside the input, so their tokens come off the window (docs/design.md §2)."""
        self.memory().reserve_for(tools, instructions)
        return self.filter_input_sync(items)

    def filter_input_sync(self, items: Sequence[Any]) -> list[TResponseInputItem]:
        """The input a model call gets instead of `items` (sync; see `call_model_input_filter`)."""
        self._filter_check.filtered()
        pending = self._ledger.pending(items)
        if pending:
            self._store_items(pending, replace=False)
            self._ledger.claim(pending)
        return self.get_items_sync()

    def run_config(self, config: RunConfig | None = None, /, **options: Any) -> RunConfig:
        """A `RunConfig` whose `call_model_input_filter` is this session's: `config` (or a new
        one) with `options` (any other `RunConfig` field) set. A config that has an input
        filter of its own is refused: the SDK takes one, and two would each undo the other."""
        base = config if config is not None else RunConfig()
        theirs = options.pop("call_model_input_filter", base.call_model_input_filter)
        if theirs is not None and theirs != self.call_model_input_filter:
            raise ConfigError(
                "run_config: the RunConfig already has a call_model_input_filter; the SDK runs "
                "only one, so pass a config without it (wrap your filter around "
                "session.call_model_input_filter yourself if you need both)"
            )
        return dataclasses.replace(
            base, call_model_input_filter=self.call_model_input_filter, **options
        )


def _digests_of(
    shared: _ItemCache,
    epoch: Any,
    ids: Sequence[int],
    known: Mapping[int, list[Item]],
    limit: int | None,
) -> list[bytes]:
    """The digests of the items of `ids`, each message's computed once per epoch (the items of
    a message id never change within one) and kept in `shared` for every session object."""
    with shared.lock:
        memo = shared.digests if epoch == shared.epoch else {}
        found = {i: memo[i] for i in ids if i in memo}
    fresh = {i: [_plain_digest(item) for item in known[i]] for i in ids if i not in found}
    if fresh:
        with shared.lock:
            if epoch == shared.epoch:
                shared.digests.update(fresh)
    found.update(fresh)
    flat = [d for i in ids for d in found[i]]
    return flat[-limit:] if limit is not None else flat


def _remainder(last: Msg, keep: Sequence[int]) -> Msg:
    """The popped message without its last item's blocks (and without its last skeleton)."""
    blocks = tuple(last.content[k] for k in keep)
    metadata = dict(last.metadata or {})
    agents_meta = metadata.get(META_KEY)
    if last.kind == "original" and isinstance(agents_meta, Mapping):
        metadata[META_KEY] = {**agents_meta, "items": list(agents_meta["items"])[:-1]}
    return Msg(
        last.role, blocks, name=last.name, metadata=metadata, kind=last.kind, pinned=last.pinned
    )


# Keys an item's copy in the SDK's model input may lack or change from the item as stored (the
# SDK drops reasoning ids under `reasoning_item_id_policy="omit"`).
_VOLATILE_KEYS = frozenset({"id", "status"})


def _digest(item: Any) -> bytes:
    return _plain_digest(as_dict(item, 0))


def _plain_digest(data: Mapping[str, Any]) -> bytes:
    """`_digest` of an item known to be plain JSON (one this module built): without the
    check, which costs a third of the digest of a whole history."""
    kept = {k: v for k, v in data.items() if k not in _VOLATILE_KEYS}
    text = json.dumps(kept, sort_keys=True, ensure_ascii=False)
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


class _Ledger:
    """Which items of a run's model input the memory holds, as counts of item digests.

    The SDK's input to a model call is the history it read at the start of the run
    (`get_items`: `saw`) followed by the run's new input and items, which it stores through
    `add_items` (`stored`), in version 0.24 before the next model call except a streamed run's
    new input, stored after the first one. What the input holds beyond those counts is pending:
    the filter stores it and `claim`s it, and the SDK's later `add_items` of the same items
    skips them (`unclaimed`). Counts, not sets: a user may send the same message twice.
    """

    #: Distinct items the ledger remembers, the least recently read or stored dropped first
    #: (docs/design.md §5): a run's input holds what its start read and what it stored since,
    #: far fewer than this, so a dropped digest is one no input can hold any more.
    capacity: int = 10_000

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # A Counter keeps insertion order: re-inserting a digest marks it as just used.
        self._known: Counter[bytes] = Counter()
        self._claimed: Counter[bytes] = Counter()

    def saw(self, digests: Sequence[bytes]) -> None:
        """The digests of items read from the memory: held, counted once however often they
        are read."""
        counts = Counter(digests)
        with self._lock:
            for digest, count in counts.items():
                self._known[digest] = max(self._known.pop(digest, 0), count)
            self._trim()

    def stored(self, items: Sequence[Mapping[str, Any]]) -> None:
        """Items just stored, each a plain JSON dict (as `convert` gives them back)."""
        digests = [_plain_digest(item) for item in items]
        with self._lock:
            # In place: `+=` would also walk every count held (O(history) per append).
            for digest in digests:
                self._known[digest] = self._known.pop(digest, 0) + 1
            self._trim()

    def _trim(self) -> None:
        known = self._known
        while len(known) > self.capacity:
            del known[next(iter(known))]

    def forget(self, item: Any) -> None:
        with self._lock:
            self._known -= Counter([_digest(item)])

    def pending(self, items: Sequence[Any]) -> list[Any]:
        """The items of `items` the memory does not hold: of equal items, the latest ones."""
        digests = [_digest(item) for item in items]
        with self._lock:
            extra = Counter(digests) - self._known
        out: list[Any] = []
        for item, digest in zip(reversed(items), reversed(digests), strict=True):
            if extra[digest] > 0:
                extra[digest] -= 1
                out.append(item)
        out.reverse()
        return out

    def claim(self, items: Sequence[Any]) -> None:
        with self._lock:
            self._claimed += Counter(_digest(item) for item in items)

    def unclaimed(self, items: Sequence[Any]) -> list[Any]:
        """`items` without those the filter stored already (each claim is used once)."""
        with self._lock:
            if not self._claimed:
                return list(items)
            out: list[Any] = []
            for item in items:
                digest = _digest(item)
                if self._claimed[digest] > 0:
                    self._claimed[digest] -= 1
                else:
                    out.append(item)
            self._claimed = +self._claimed
            return out


# ---------------------------------------------------------------------------------------------
# context_reload and context_search as Agents SDK tools
# ---------------------------------------------------------------------------------------------


def context_tools(session: AutoContextSession | AutoContextMemory) -> list[FunctionTool]:
    """The memory's model tools (`AutoContextMemory.tools()`: `context_reload` and
    `context_search`) as Agents SDK function tools answering from `session`.

    Add them to the agent's tools (and `AutoContextMemory.system_prompt_snippet()` to its
    instructions) so that the model can read back what a compression offloaded and search what
    its tenant's sessions hold. Each answer is the memory's `handle_tool_call` answer: the
    originals as text, paged, search hits, and plain answers for an unknown, malformed or
    foreign id.
    """

    def memory() -> AutoContextMemory:
        return session if isinstance(session, AutoContextMemory) else session.memory()

    def tool(definition: Mapping[str, Any]) -> FunctionTool:
        name = definition["name"]

        async def on_invoke_tool(ctx: ToolContext[Any], arguments: str) -> str:
            call = {"type": "function", "function": {"name": name, "arguments": arguments}}
            return await asyncio.to_thread(lambda: memory().handle_tool_call(call))

        return FunctionTool(
            name=name,
            description=definition["description"],
            params_json_schema=definition["parameters"],
            on_invoke_tool=on_invoke_tool,
            # Optional properties (offset, scope, ...), which strict mode (every property
            # required) does not allow.
            strict_json_schema=False,
        )

    return [tool(definition["function"]) for definition in tool_definitions(session.config)]
