"""autoctx as the Claude Agent SDK's `SessionStore`: the CLI's transcripts, kept in autoctx.

    from claude_agent_sdk import ClaudeAgentOptions
    from autoctx.integrations.claude_agent_sdk import AutoContextSessionStore

    store = AutoContextSessionStore()               # AUTOCTX_DATABASE_URL, else embedded
    options = ClaudeAgentOptions(session_store=store)

The SDK's runtime (the `claude` CLI) writes each session's transcript to local disk and mirrors
it to the store in batches of entries (`append`); a resume reads it back (`load`). How the
store keeps them (docs/design.md §8):

- A transcript is one autoctx session: its tenant is the `project_key` (after the store's
  `namespace`), its id ``<tenant>/claude/<session_id>``, and a sub-transcript (a subagent's,
  named by its `subpath`) the session ``<tenant>/claude/<session_id>/<subpath>`` (each part
  percent-encoded). Deleting a main transcript deletes its sub-transcripts too.
- Every entry is one message, stored losslessly: the entry as given in the message's metadata
  under ``"claude"`` (what `load` gives back, deep-equal), and as the message's text what a
  model reads of it (a user or assistant turn's text, its tool calls and results written
  out; another entry as its JSON), which autoctx counts, searches and compresses. An entry
  whose ``uuid`` the transcript already holds is not stored again (the SDK retries batches).
- A compact boundary (an entry of type ``system``, subtype ``compact_boundary``: the CLI
  compacted its context) clears the session's working context before the boundary is stored:
  the clear is an audit event whose offload holds what the compaction replaced (the lineage),
  and the working context goes on from the boundary and the CLI's summary after it. Nothing
  is lost: `load` reads the originals.
- The store never sees a model request: the CLI builds each one (its tool definitions, its
  system prompt) and compacts its own context, so there is nothing here to measure into
  `reserve_tokens` (docs/design.md §2) and the store compresses nothing by itself. Whoever
  compresses these sessions (`compress_if_needed()`, a worker) sets `reserve_tokens` in the
  config to what the CLI sends beside the messages.
- `list_session_summaries` folds each main transcript with the SDK's own
  `fold_session_summary` when it is asked (no sidecar is kept), stamped with the session's
  `updated_at`, the clock `list_sessions` reports too.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, unquote

from ._optional import framework_of

with framework_of(
    "Claude Agent SDK",
    needs="the Claude Agent SDK",
    extra="claude-agent-sdk",
    packages=("claude_agent_sdk",),
):
    from claude_agent_sdk import (
        SessionKey,
        SessionListSubkeysKey,
        SessionStore,
        SessionStoreEntry,
        SessionStoreListEntry,
        SessionSummaryEntry,
        fold_session_summary,
    )
from sqlalchemy.engine import URL

from .. import _arguments
from .._async_memory import AsyncAutoContextMemory
from .._client import AutoContextClient
from .._config import AutoContextConfig, RuntimeOptions, options_argument
from .._errors import InvalidArgument, SessionNotFound
from .._messages import Msg, TextBlock
from .._sessions import SessionInfo
from .._summarizers import Summarizer
from ._opening import checked_client, checked_namespace, open_async_memory

__all__ = ["AutoContextSessionStore", "entry_message", "is_compact_boundary"]

#: Metadata key of the stored entry.
META = "claude"
_KIND = "claude"


def _part(value: str) -> str:
    return quote(value, safe="")


def is_compact_boundary(entry: Mapping[str, Any]) -> bool:
    """Whether a transcript entry marks a compaction of the CLI's context."""
    return entry.get("type") == "system" and entry.get("subtype") == "compact_boundary"


def _block_text(block: Any) -> str:
    if isinstance(block, str):
        return block
    if not isinstance(block, Mapping):
        return json.dumps(block, default=str)
    kind = block.get("type")
    if kind == "text":
        return str(block.get("text", ""))
    if kind == "tool_use":
        arguments = json.dumps(block.get("input"), ensure_ascii=False, default=str)
        return f"[tool call {block.get('name')} {block.get('id')}] {arguments}"
    if kind == "tool_result":
        content = block.get("content")
        inner = (
            content
            if isinstance(content, str)
            else "\n".join(_block_text(b) for b in content or [])
        )
        return f"[tool result {block.get('tool_use_id')}] {inner}"
    if kind in ("thinking", "redacted_thinking"):
        return ""
    return json.dumps(block, ensure_ascii=False, default=str)


def entry_message(entry: Mapping[str, Any]) -> Msg:
    """A transcript entry as the message the store keeps (see the module docstring)."""
    if not isinstance(entry, Mapping):
        raise InvalidArgument(
            f"a transcript entry must be a JSON object (a dict), got {type(entry).__name__}"
        )
    kind = entry.get("type")
    message = entry.get("message")
    if kind in ("user", "assistant") and isinstance(message, Mapping):
        content = message.get("content")
        blocks = [content] if isinstance(content, str) else list(content or [])
        text = "\n".join(t for t in (_block_text(b) for b in blocks) if t)
    else:
        text = json.dumps(entry, ensure_ascii=False, sort_keys=True, default=str)
    if kind == "assistant":
        return Msg("assistant", (TextBlock(text),), metadata={META: dict(entry)})
    return Msg("user", (TextBlock(text),), metadata={META: dict(entry)})


def _millis(info: SessionInfo) -> int:
    """The session's `updated_at` in Unix epoch milliseconds (the SDK's `mtime`)."""
    return int(info.updated_at.timestamp() * 1000) if info.updated_at is not None else 0


class AutoContextSessionStore(SessionStore):
    """The Claude Agent SDK's `SessionStore`, kept by autoctx (see the module docstring).

    `database_url` (default: `AUTOCTX_DATABASE_URL`, else the embedded PostgreSQL) or `client`
    (an `AutoContextClient` of yours; its `close()` closes every memory the store opened);
    `config`, `summarizer` and `options` for the transcripts' memories; `namespace` is put
    before every `project_key` to make its tenant, so that several deployments can share a
    database without seeing each other's transcripts.
    """

    def __init__(
        self,
        database_url: str | URL | None = None,
        *,
        client: AutoContextClient | None = None,
        config: AutoContextConfig | None = None,
        summarizer: Summarizer | None = None,
        options: RuntimeOptions | None = None,
        namespace: str = "",
    ) -> None:
        self._client = checked_client(client, database_url, "AutoContextSessionStore")
        self._database_url = database_url
        self.namespace = checked_namespace(namespace, "AutoContextSessionStore", "project_key")
        self.config = config
        self._summarizer = summarizer
        self._options = options_argument(options)
        self._memories: dict[str, AsyncAutoContextMemory] = {}
        #: The entry uuids each open transcript holds (its idempotency keys).
        self._uuids: dict[str, set[str]] = {}
        self._lock = asyncio.Lock()

    # -- keys ------------------------------------------------------------------------------

    def _tenant(self, project_key: object) -> str:
        if not isinstance(project_key, str) or not project_key:
            raise InvalidArgument(
                "AutoContextSessionStore: project_key must be a non-empty string (it names the "
                "tenant of the project's transcripts)"
            )
        tenant = _arguments.tenant(self.namespace + project_key)
        assert tenant is not None
        return tenant

    def _prefix(self, tenant: str) -> str:
        return f"{_part(tenant)}/{_KIND}/"

    def _main_id(self, key: Mapping[str, Any]) -> tuple[str, str]:
        tenant = self._tenant(key.get("project_key"))
        session_id = key.get("session_id")
        if not isinstance(session_id, str) or not session_id:
            raise InvalidArgument(
                "AutoContextSessionStore: a key's session_id must be a non-empty string"
            )
        return tenant, self._prefix(tenant) + _part(session_id)

    def _id(self, key: Mapping[str, Any]) -> tuple[str, str]:
        tenant, main = self._main_id(key)
        subpath = key.get("subpath")
        if subpath is None:
            return tenant, main
        if not isinstance(subpath, str) or not subpath:
            raise InvalidArgument(
                "AutoContextSessionStore: a key's subpath must be a non-empty string or absent"
            )
        return tenant, f"{main}/{_part(subpath)}"

    def _client_now(self) -> AutoContextClient:
        return self._client or AutoContextClient.shared(self._database_url)

    # -- memories --------------------------------------------------------------------------

    async def _open(self, tenant: str, sid: str, *, create: bool) -> AsyncAutoContextMemory | None:
        async with self._lock:
            memory = self._memories.get(sid)
            if memory is not None:
                return memory
            try:
                memory = await open_async_memory(
                    self._client,
                    self._database_url,
                    sid,
                    self.config,
                    summarizer=self._summarizer,
                    tenant=tenant,
                    options=self._options,
                    create=create,
                )
            except SessionNotFound:
                return None
            self._memories[sid] = memory
            return memory

    async def memory(self, key: SessionKey) -> AsyncAutoContextMemory:
        """The autoctx memory of a transcript (`SessionNotFound` if nothing was appended to
        it): its working context is the transcript as the CLI's compactions left it."""
        tenant, sid = self._id(key)
        memory = await self._open(tenant, sid, create=False)
        if memory is None:
            raise SessionNotFound(
                "AutoContextSessionStore: no transcript was appended under this key"
            )
        return memory

    async def _delete(self, tenant: str, sid: str) -> None:
        memory = await self._open(tenant, sid, create=False)
        if memory is None:
            return
        await memory.delete()
        async with self._lock:
            self._memories.pop(sid, None)
            self._uuids.pop(sid, None)
        await memory.close()

    async def close(self) -> None:
        """Close the memories the store opened (a later call opens them again)."""
        async with self._lock:
            memories = list(self._memories.values())
            self._memories.clear()
            self._uuids.clear()
        for memory in memories:
            await memory.close()

    # -- SessionStore ----------------------------------------------------------------------

    async def append(self, key: SessionKey, entries: list[SessionStoreEntry]) -> None:
        tenant, sid = self._id(key)
        msgs = [entry_message(e) for e in entries]  # checked before anything is written
        if not msgs:
            return
        memory = await self._open(tenant, sid, create=True)
        assert memory is not None
        seen = self._uuids.get(sid)
        if seen is None:
            seen = {
                u
                for m in await memory.originals()
                if isinstance(u := (m.metadata.get(META) or {}).get("uuid"), str)
            }
            self._uuids[sid] = seen
        batch: list[Msg] = []
        for msg in msgs:
            entry = msg.metadata[META]
            uuid = entry.get("uuid")
            if isinstance(uuid, str):
                if uuid in seen:
                    continue
                seen.add(uuid)
            if is_compact_boundary(entry):
                if batch:
                    await memory.add(batch)
                    batch = []
                # The CLI compacted: what its summary replaces leaves the working context,
                # as an audit event whose offload holds it.
                if await memory.message_count():
                    await memory.clear()
            batch.append(msg)
        if batch:
            await memory.add(batch)

    async def load(self, key: SessionKey) -> list[SessionStoreEntry] | None:
        tenant, sid = self._id(key)
        memory = await self._open(tenant, sid, create=False)
        if memory is None:
            return None
        return [m.metadata[META] for m in await memory.originals() if META in m.metadata]

    async def _mains(self, project_key: str) -> list[SessionInfo]:
        tenant = self._tenant(project_key)
        infos = await asyncio.to_thread(
            self._client_now().sessions, tenant=tenant, prefix=self._prefix(tenant)
        )
        return [i for i in infos if "/" not in i.session_id.removeprefix(self._prefix(tenant))]

    def _session_id(self, project_key: str, info: SessionInfo) -> str:
        return unquote(info.session_id.removeprefix(self._prefix(self._tenant(project_key))))

    async def list_sessions(self, project_key: str) -> list[SessionStoreListEntry]:
        return [
            {"session_id": self._session_id(project_key, i), "mtime": _millis(i)}
            for i in await self._mains(project_key)
        ]

    async def list_session_summaries(self, project_key: str) -> list[SessionSummaryEntry]:
        out: list[SessionSummaryEntry] = []
        for info in await self._mains(project_key):
            key: SessionKey = {
                "project_key": project_key,
                "session_id": self._session_id(project_key, info),
            }
            entries = await self.load(key) or []
            summary = fold_session_summary(None, key, entries)
            summary["mtime"] = _millis(info)
            out.append(summary)
        return out

    async def delete(self, key: SessionKey) -> None:
        tenant, sid = self._id(key)
        if key.get("subpath") is None:
            subs = await asyncio.to_thread(
                self._client_now().sessions, tenant=tenant, prefix=sid + "/"
            )
            for info in subs:
                await self._delete(tenant, info.session_id)
        await self._delete(tenant, sid)

    async def list_subkeys(self, key: SessionListSubkeysKey) -> list[str]:
        tenant, sid = self._main_id(key)
        subs = await asyncio.to_thread(self._client_now().sessions, tenant=tenant, prefix=sid + "/")
        return sorted(unquote(i.session_id.removeprefix(sid + "/")) for i in subs)
