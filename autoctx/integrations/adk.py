"""autoctx as Google ADK's session service, and a plugin that hands ADK's model autoctx's
working context at every model call.

    from google.adk.runners import Runner
    from autoctx.integrations.adk import AutoContextPlugin, AutoContextSessionService, context_tools

    sessions = AutoContextSessionService(config=AutoContextConfig(max_tokens=128_000))
    agent = LlmAgent(name="coder", model=..., tools=[*my_tools, *context_tools(sessions)])
    runner = Runner(app_name="coder", agent=agent, session_service=sessions,
                    plugins=[AutoContextPlugin(sessions)])

How ADK's objects map onto autoctx's (docs/design.md §8):

- An ADK session is one autoctx session: its tenant is the `app_name` (after the service's
  `namespace`), its id ``adk/<user_id>/<session_id>`` (each part percent-encoded, so that no
  `/` in an id makes two sessions one). Every event is one message, stored losslessly: the
  event's JSON (what `Event.model_validate` reads back) in the message's metadata under
  ``"adk"``, and what the model reads of it as the message's blocks (text, function calls as
  tool calls, function responses as tool results), which is what autoctx counts, searches and
  compresses. `get_session` gives the events back from the originals, whatever was compressed.
- State: ``app:`` keys live in the tenant's session ``adk-state/app``, ``user:`` keys in
  ``adk-state/user/<user_id>``, the session's own keys in ``adk-state/session/<user_id>/
  <session_id>``; each write is one message holding the delta, and the state is the deltas
  folded in order. ``temp:`` keys are never stored (ADK's rule).
- `AutoContextPlugin` (an ADK `BasePlugin`; `before_model_callback` works the same way as an
  agent's callback): before every model call of a run it measures the request's tool
  declarations and system instruction into the session's `reserve_tokens` (unless the config
  sets it; they are sent beside the contents, so their tokens come off the window), compresses
  the session when its trigger holds and replaces the request's contents with the working
  context, converted back
  to `google.genai` contents (an event autoctx has not compressed is sent as ADK stored it;
  a summary or preview as the text autoctx wrote). ADK's runner builds each request from
  every event of the session; with the plugin the model receives the bounded context instead.
- `context_tools(service)`: `context_reload` and `context_search` as ADK tools, answered from
  the session of the call.

What this does not do: the event and the state deltas it carries are written in separate
transactions (a crash between them keeps the event and loses the delta); `append_event` does
not refuse a stale session object (no revision check: both writers' events are kept, in
commit order); an event other than a function response while the model's function calls are
unanswered (a long-running tool answered in a later turn) is refused with an
`InvalidMessage`, as autoctx refuses such a history anywhere.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote, unquote

from ._optional import framework_of

with framework_of("Google ADK", needs="Google ADK", extra="adk", packages=("google",)):
    from google.adk.agents.callback_context import CallbackContext
    from google.adk.errors.already_exists_error import AlreadyExistsError
    from google.adk.errors.session_not_found_error import SessionNotFoundError
    from google.adk.events.event import Event as AdkEvent
    from google.adk.models.llm_request import LlmRequest
    from google.adk.models.llm_response import LlmResponse
    from google.adk.plugins.base_plugin import BasePlugin
    from google.adk.sessions.base_session_service import (
        BaseSessionService,
        GetSessionConfig,
        ListSessionsResponse,
    )
    from google.adk.sessions.session import Session
    from google.adk.sessions.state import State
    from google.adk.tools.base_tool import BaseTool
    from google.adk.tools.tool_context import ToolContext
    from google.genai import types
from sqlalchemy.engine import URL

from .. import _arguments
from .._async_memory import AsyncAutoContextMemory
from .._client import AutoContextClient
from .._config import AutoContextConfig, RuntimeOptions, options_argument
from .._errors import ConfigError, InvalidArgument, SessionNotFound
from .._messages import Block, Msg, TextBlock, ToolResultBlock, ToolUseBlock
from .._summarizers import Summarizer
from .._tools import tool_definitions
from ._opening import checked_client, checked_namespace, open_async_memory

__all__ = [
    "AutoContextPlugin",
    "AutoContextSessionService",
    "context_tools",
    "from_events",
    "to_contents",
]

#: Metadata key of the stored event (its JSON) and of a state write.
META = "adk"
STATE = "adk_state"
#: The kinds of autoctx session the service keeps for an app (after its tenant, in the id).
_SESSIONS = "adk"
_APP_STATE = "adk-app-state"
_USER_STATE = "adk-user-state"
_SESSION_STATE = "adk-state"
#: The user turn before a working context that opens with the model's (after a fold).
_OPENING = "(The conversation so far, as autoctx keeps it.)"


def _part(value: str) -> str:
    """An id as one part of an autoctx session id: percent-encoded, `/` included."""
    return quote(value, safe="")


def _key(tenant: str, kind: str, *parts: str) -> str:
    """The autoctx session id of one of an app's sessions: session ids are unique across
    tenants, so the tenant leads it."""
    return "/".join([_part(tenant), kind, *map(_part, parts)])


def _parse_key(key: str) -> tuple[str, str]:
    _, _, user, session = key.split("/")
    return unquote(user), unquote(session)


# ---------------------------------------------------------------------------------------------
# Events <-> messages
# ---------------------------------------------------------------------------------------------


def _response_text(response: Mapping[str, Any] | None) -> str:
    """What the model reads of a function response: its lone "result" string, else its JSON."""
    if response is None:
        return ""
    if set(response) == {"result"} and isinstance(response["result"], str):
        return response["result"]
    return json.dumps(response, ensure_ascii=False, sort_keys=True, default=str)


def _event_msg(event: AdkEvent) -> Msg:
    """One ADK event as one autoctx message (see the module docstring)."""
    data = event.model_dump(mode="json", exclude_none=True)
    parts = list(event.content.parts or []) if event.content is not None else []
    results = [p.function_response for p in parts if p.function_response is not None]
    meta = {META: data}
    if results:
        blocks_r = tuple(
            ToolResultBlock(r.id or "", _response_text(r.response), r.name or "") for r in results
        )
        return Msg("tool", blocks_r, metadata=meta)
    blocks: list[Block] = []
    for p in parts:
        if p.text is not None and not p.thought:
            blocks.append(TextBlock(p.text))
        elif p.function_call is not None:
            call = p.function_call
            arguments = json.dumps(call.args or {}, ensure_ascii=False, default=str)
            blocks.append(ToolUseBlock(call.id or "", call.name or "", arguments))
        elif p.inline_data is not None or p.file_data is not None:
            blob = p.inline_data or p.file_data
            blocks.append(TextBlock(f"[{getattr(blob, 'mime_type', None) or 'file'}]"))
    model = event.content is not None and event.content.role == "model"
    if model or (event.content is None and event.author != "user"):
        return Msg("assistant", tuple(blocks), metadata=meta)
    return Msg("user", tuple(blocks), metadata=meta)


def from_events(events: Sequence[AdkEvent]) -> list[Msg]:
    """ADK events as the autoctx messages the service stores (partial events are not stored:
    pass the final ones)."""
    return [_event_msg(e) for e in events]


def _stored_event(msg: Msg) -> AdkEvent | None:
    data = msg.metadata.get(META)
    if msg.kind != "original" or not isinstance(data, Mapping):
        return None
    return AdkEvent.model_validate(data)


def _content_of(msg: Msg) -> types.Content | None:
    """A message autoctx wrote (a summary, a preview) as the content the model reads."""
    parts: list[types.Part] = []
    for block in msg.content:
        if isinstance(block, TextBlock):
            if block.text:
                parts.append(types.Part(text=block.text))
        elif isinstance(block, ToolUseBlock):
            try:
                args = json.loads(block.arguments or "{}")
            except ValueError:
                args = {"arguments": block.arguments}
            call = types.FunctionCall(id=block.id, name=block.name, args=args)
            parts.append(types.Part(function_call=call))
        elif isinstance(block, ToolResultBlock):
            response = types.FunctionResponse(
                id=block.tool_use_id, name=block.name, response={"result": block.output_text}
            )
            parts.append(types.Part(function_response=response))
    if not parts:
        return None
    return types.Content(role="model" if msg.role == "assistant" else "user", parts=parts)


def to_contents(messages: Sequence[Msg]) -> list[types.Content]:
    """A working context as `google.genai` contents: an event as ADK stored it, a message
    autoctx wrote (a summary, a preview) from its blocks; events without content are left out."""
    contents: list[types.Content] = []
    for msg in messages:
        event = _stored_event(msg)
        if event is not None:
            if event.content is not None and event.content.parts:
                contents.append(event.content)
            continue
        content = _content_of(msg)
        if content is not None:
            contents.append(content)
    return _turns(contents)


def _turns(contents: Sequence[types.Content]) -> list[types.Content]:
    """Contents as turns that alternate, starting with the user's, as the Messages API (ADK's
    `AnthropicLlm`) requires: adjacent contents of one role are merged (a summary autoctx
    wrote is a model turn that may sit beside the model's next one), function responses first
    in their turn, and a context that opens with a model turn (after a fold) gets a short user
    turn first."""
    out: list[types.Content] = []
    for content in contents:
        role = "model" if content.role == "model" else "user"
        if out and out[-1].role == role:
            parts = [*(out[-1].parts or []), *(content.parts or [])]
            if role == "user":
                parts.sort(key=lambda p: p.function_response is None)
            out[-1] = types.Content(role=role, parts=parts)
        else:
            out.append(types.Content(role=role, parts=list(content.parts or [])))
    if out and out[0].role == "model":
        out.insert(0, types.Content(role="user", parts=[types.Part(text=_OPENING)]))
    return out


# ---------------------------------------------------------------------------------------------
# State
# ---------------------------------------------------------------------------------------------


def _scopes(delta: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """A state delta split into its app, user and session parts (keys without their prefix
    for the first two); temp keys dropped."""
    app: dict[str, Any] = {}
    user: dict[str, Any] = {}
    own: dict[str, Any] = {}
    for key, value in delta.items():
        if key.startswith(State.APP_PREFIX):
            app[key.removeprefix(State.APP_PREFIX)] = value
        elif key.startswith(State.USER_PREFIX):
            user[key.removeprefix(State.USER_PREFIX)] = value
        elif not key.startswith(State.TEMP_PREFIX):
            own[key] = value
    return app, user, own


def _folded(writes: Sequence[Msg]) -> tuple[dict[str, Any], float | None]:
    """The state the writes leave, and the creation time the first write records."""
    state: dict[str, Any] = {}
    created: float | None = None
    for msg in writes:
        data = msg.metadata.get(STATE)
        if not isinstance(data, Mapping):
            continue
        state.update(data.get("delta") or {})
        if created is None and isinstance(data.get("created"), int | float):
            created = float(data["created"])
    return state, created


def _state_msg(delta: Mapping[str, Any], created: float | None = None) -> Msg:
    data: dict[str, Any] = {"delta": dict(delta)}
    if created is not None:
        data["created"] = created
    return Msg.system(json.dumps(data["delta"], default=str), metadata={STATE: data})


# ---------------------------------------------------------------------------------------------
# The session service
# ---------------------------------------------------------------------------------------------


class AutoContextSessionService(BaseSessionService):
    """ADK's `BaseSessionService`, kept by autoctx (see the module docstring).

    `database_url` (default: `AUTOCTX_DATABASE_URL`, else the embedded PostgreSQL) or `client`
    (an `AutoContextClient` of yours: its pool, its hooks; its `close()` closes every memory
    the service opened); `config`, `summarizer` and `options` for the sessions' memories;
    `namespace` is put before every `app_name` to make its tenant, so that several deployments
    can share a database without seeing each other's sessions.
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
        self._client = checked_client(client, database_url, "AutoContextSessionService")
        self._database_url = database_url
        self.namespace = checked_namespace(namespace, "AutoContextSessionService", "app_name")
        self.config = config
        self._summarizer = summarizer
        self._options = options_argument(options)
        self._memories: dict[tuple[str, str], AsyncAutoContextMemory] = {}
        self._lock = asyncio.Lock()

    # -- memories --------------------------------------------------------------------------

    def _tenant(self, app_name: str) -> str:
        if not isinstance(app_name, str) or not app_name:
            raise InvalidArgument(
                "AutoContextSessionService: app_name must be a non-empty string (it names the "
                "tenant of the app's sessions)"
            )
        tenant = _arguments.tenant(self.namespace + app_name)
        assert tenant is not None
        return tenant

    async def _open(
        self, app_name: str, where: tuple[str, ...], *, create: bool
    ) -> AsyncAutoContextMemory | None:
        """The memory of one of the app's sessions (`where`: its kind and ids); None if it
        does not exist and `create` is false."""
        tenant = self._tenant(app_name)
        key = _key(tenant, *where)
        async with self._lock:
            memory = self._memories.get((tenant, key))
            if memory is not None:
                return memory
            try:
                memory = await open_async_memory(
                    self._client,
                    self._database_url,
                    _arguments.session_id(key),
                    self.config,
                    summarizer=self._summarizer,
                    tenant=tenant,
                    options=self._options,
                    create=create,
                )
            except SessionNotFound:
                return None
            self._memories[(tenant, key)] = memory
            return memory

    async def _forget(self, app_name: str, where: tuple[str, ...]) -> None:
        tenant = self._tenant(app_name)
        async with self._lock:
            memory = self._memories.pop((tenant, _key(tenant, *where)), None)
        if memory is not None:
            await memory.close()

    async def memory(self, app_name: str, user_id: str, session_id: str) -> AsyncAutoContextMemory:
        """The autoctx memory of an ADK session (`SessionNotFound` if it does not exist)."""
        memory = await self._open(app_name, (_SESSIONS, user_id, session_id), create=False)
        if memory is None:
            raise SessionNotFound(
                f"ADK session {session_id!r} of app {app_name!r} does not exist; create it "
                "with create_session() first"
            )
        return memory

    async def _write_state(self, app_name: str, key: tuple[str, ...], msg: Msg) -> None:
        memory = await self._open(app_name, key, create=True)
        assert memory is not None
        await memory.add(msg)

    async def _read_state(
        self, app_name: str, key: tuple[str, ...]
    ) -> tuple[dict[str, Any], float | None]:
        memory = await self._open(app_name, key, create=False)
        if memory is None:
            return {}, None
        return _folded(await memory.originals())

    async def _merged(
        self, app_name: str, user_id: str, session_id: str
    ) -> tuple[dict[str, Any], float | None]:
        app, _ = await self._read_state(app_name, (_APP_STATE,))
        user, _ = await self._read_state(app_name, (_USER_STATE, user_id))
        state, created = await self._read_state(app_name, (_SESSION_STATE, user_id, session_id))
        for k, v in app.items():
            state[State.APP_PREFIX + k] = v
        for k, v in user.items():
            state[State.USER_PREFIX + k] = v
        return state, created

    async def _apply_delta(
        self,
        app_name: str,
        user_id: str,
        session_id: str,
        delta: Mapping[str, Any],
        created: float | None = None,
    ) -> None:
        app, user, own = _scopes(delta)
        if app:
            await self._write_state(app_name, (_APP_STATE,), _state_msg(app))
        if user:
            await self._write_state(app_name, (_USER_STATE, user_id), _state_msg(user))
        if own or created is not None:
            where = (_SESSION_STATE, user_id, session_id)
            await self._write_state(app_name, where, _state_msg(own, created))

    # -- BaseSessionService ----------------------------------------------------------------

    async def create_session(
        self,
        *,
        app_name: str,
        user_id: str,
        state: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> Session:
        session_id = session_id.strip() if session_id else uuid.uuid4().hex
        key = (_SESSIONS, user_id, session_id)
        if await self._open(app_name, key, create=False) is not None:
            raise AlreadyExistsError(f"Session with id {session_id} already exists.")
        await self._open(app_name, key, create=True)
        created = time.time()
        await self._apply_delta(app_name, user_id, session_id, state or {}, created)
        merged, _ = await self._merged(app_name, user_id, session_id)
        return Session(
            id=session_id,
            app_name=app_name,
            user_id=user_id,
            state=merged,
            last_update_time=created,
        )

    async def get_session(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        config: GetSessionConfig | None = None,
    ) -> Session | None:
        session_id = session_id.strip() if session_id else session_id
        memory = await self._open(app_name, (_SESSIONS, user_id, session_id), create=False)
        if memory is None:
            return None
        events = [e for m in await memory.originals() if (e := _stored_event(m)) is not None]
        state, created = await self._merged(app_name, user_id, session_id)
        # As ADK's services keep it: the last event's timestamp, else the creation time.
        last = events[-1].timestamp if events else created or 0.0
        if config is not None:
            if config.num_recent_events is not None:
                n = config.num_recent_events
                events = events[-n:] if n else []
            if config.after_timestamp is not None:
                events = [e for e in events if e.timestamp >= config.after_timestamp]
        return Session(
            id=session_id,
            app_name=app_name,
            user_id=user_id,
            state=state,
            events=events,
            last_update_time=last,
        )

    async def list_sessions(
        self, *, app_name: str, user_id: str | None = None
    ) -> ListSessionsResponse:
        tenant = self._tenant(app_name)
        prefix = _key(tenant, _SESSIONS) + "/"
        if user_id is not None:
            prefix += _part(user_id) + "/"
        client = self._client or AutoContextClient.shared(self._database_url)
        infos = await asyncio.to_thread(client.sessions, tenant=tenant, prefix=prefix)
        found: list[Session] = []
        for info in infos:
            user, session_id = _parse_key(info.session_id)
            state, created = await self._merged(app_name, user, session_id)
            updated = info.updated_at.timestamp() if info.updated_at is not None else 0.0
            found.append(
                Session(
                    id=session_id,
                    app_name=app_name,
                    user_id=user,
                    state=state,
                    last_update_time=max(created or 0.0, updated),
                )
            )
        found.sort(key=lambda s: (s.last_update_time, s.user_id, s.id))
        return ListSessionsResponse(sessions=found)

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        session_id = session_id.strip() if session_id else session_id
        for key in (
            (_SESSIONS, user_id, session_id),
            (_SESSION_STATE, user_id, session_id),
        ):
            memory = await self._open(app_name, key, create=False)
            if memory is not None:
                await memory.delete()
                await self._forget(app_name, key)

    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        state, _ = await self._read_state(app_name, (_USER_STATE, user_id))
        return state

    async def append_event(self, session: Session, event: AdkEvent) -> AdkEvent:
        if event.partial:
            return event
        memory = await self._open(
            session.app_name, (_SESSIONS, session.user_id, session.id), create=False
        )
        if memory is None:
            raise SessionNotFoundError(f"Session {session.id} not found.")
        self._apply_temp_state(session, event)
        event = self._trim_temp_delta_state(event)
        # The event first: a message autoctx refuses leaves the state untouched.
        await memory.add(_event_msg(event))
        if event.actions and event.actions.state_delta:
            await self._apply_delta(
                session.app_name, session.user_id, session.id, event.actions.state_delta
            )
        self._commit_event_to_session(session, event)
        session.last_update_time = event.timestamp
        return event

    async def close(self) -> None:
        """Close the memories the service opened (a later call opens them again)."""
        async with self._lock:
            memories = list(self._memories.values())
            self._memories.clear()
        for memory in memories:
            await memory.close()

    # -- the model's context ---------------------------------------------------------------

    async def before_model_callback(
        self, callback_context: CallbackContext, llm_request: LlmRequest
    ) -> LlmResponse | None:
        """An agent's `before_model_callback` (`LlmAgent(before_model_callback=service.
        before_model_callback)`), or through `AutoContextPlugin`: compress the session when
        its trigger holds, and send the model the working context."""
        session = callback_context.session
        memory = await self.memory(session.app_name, session.user_id, session.id)
        await memory.reserve_for(*_sent_beside(llm_request))
        await memory.compress_if_needed()
        llm_request.contents = to_contents(await memory.messages())
        return None


def _sent_beside(request: LlmRequest) -> tuple[list[dict[str, Any]], str | None]:
    """What an ADK model request sends beside its contents: the function declarations of its
    tools (a tool ADK does not declare as a function, such as a provider's built-in search,
    by its kind) and its system instruction."""
    tools: list[dict[str, Any]] = []
    config = request.config
    for tool in (config.tools if config is not None else None) or ():
        declarations = getattr(tool, "function_declarations", None)
        if declarations:
            tools.extend(d.model_dump(mode="json", exclude_none=True) for d in declarations)
        else:
            tools.append({"name": type(tool).__name__})
    system = config.system_instruction if config is not None else None
    return tools, _instruction_text(system) or None


def _instruction_text(value: Any) -> str:
    """The text of a `system_instruction` (a string, a `Content`, a `Part` or a list of them;
    what is not text, such as an image, counts as nothing here)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, types.Content):
        return _instruction_text(value.parts or [])
    if isinstance(value, types.Part):
        return value.text or ""
    if isinstance(value, list):
        return "\n".join(_instruction_text(item) for item in value)
    return ""


class AutoContextPlugin(BasePlugin):
    """The ADK plugin that hands every model call of a `Runner` the working context of its
    session, kept by `service` (the runner's session service)."""

    def __init__(self, service: AutoContextSessionService, name: str = "autoctx") -> None:
        if not isinstance(service, AutoContextSessionService):
            raise ConfigError(
                "AutoContextPlugin: service must be the runner's AutoContextSessionService, got "
                f"{type(service).__name__}"
            )
        super().__init__(name)
        self.service = service

    async def before_model_callback(
        self, *, callback_context: CallbackContext, llm_request: LlmRequest
    ) -> LlmResponse | None:
        return await self.service.before_model_callback(callback_context, llm_request)


class _ContextTool(BaseTool):
    """One of autoctx's context tools, answered from the session of the call."""

    def __init__(self, service: AutoContextSessionService, definition: Mapping[str, Any]):
        fn = definition["function"]
        super().__init__(name=fn["name"], description=fn.get("description", ""))
        self._service = service
        self._parameters = fn["parameters"]

    def _get_declaration(self) -> types.FunctionDeclaration | None:
        return types.FunctionDeclaration(
            name=self.name,
            description=self.description,
            parameters_json_schema=self._parameters,
        )

    async def run_async(self, *, args: dict[str, Any], tool_context: ToolContext) -> Any:
        session = tool_context.session
        memory = await self._service.memory(session.app_name, session.user_id, session.id)
        call = {"function": {"name": self.name, "arguments": json.dumps(args)}}
        return await memory.handle_tool_call(call)


def context_tools(service: AutoContextSessionService) -> list[BaseTool]:
    """`context_reload` and `context_search` as ADK tools for an agent's `tools=`."""
    return [
        _ContextTool(service, d) for d in tool_definitions(service.config or AutoContextConfig())
    ]
