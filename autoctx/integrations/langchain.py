"""autoctx as LangChain v1 middleware: `create_agent` runs with autoctx's working context.

    from langchain.agents import create_agent
    from langgraph.checkpoint.memory import InMemorySaver
    from autoctx.integrations.langchain import AutoContextMiddleware

    middleware = AutoContextMiddleware(config=AutoContextConfig(max_tokens=128_000))
    agent = create_agent(
        model,
        tools=[...],  # the middleware adds context_reload and context_search
        system_prompt="..." + AutoContextMemory.system_prompt_snippet(),
        middleware=[middleware],
        checkpointer=InMemorySaver(),
    )
    agent.invoke({"messages": [{"role": "user", "content": "Fix the test"}]},
                 {"configurable": {"thread_id": "agent-42"}})

A thread is one autoctx session: the session id is the middleware's `session_id` when given,
otherwise the run's `thread_id` (`config["configurable"]["thread_id"]`).

Before every model call (`before_model`, which the agent loop enters again after each round of
tool calls) the messages the graph state gained since the last call are appended to the
session, the session compresses if its trigger holds, and the state's messages are replaced by
the session's working context: that is what the model receives, and it stays under
`max_tokens`. The model call itself (`wrap_model_call`) sends the tool definitions and the
system prompt beside those messages: they are measured into the session's `reserve_tokens`
(unless the config sets it), which comes off the window, so the whole request stays under
`max_tokens`. After the run (`after_agent`) its final messages are appended too.

Why the state is replaced rather than left to grow: LangGraph writes the whole state to the
checkpointer after every step, so a thread whose messages grow without bound makes every
checkpoint larger than the last, and the state would also be what the next run starts from.
Keeping the state equal to the working context bounds both; nothing is lost, because every
message is stored in autoctx as an original (reload, search and lineage as everywhere else).
`SummarizationMiddleware` makes the same choice. The state holds one extra key,
`autoctx_synced`: how many of its messages (a prefix) the session holds already.

Messages convert directly, not through a provider's dict format (`_langchain_messages`): each
LangChain message is one autoctx message with its content blocks in order (thinking and
reasoning blocks beside the tool calls they led to, as `ChatAnthropic` and `ChatOpenAI` write
them), and every field autoctx does not model (ids, a `ToolMessage`'s status, artifact and name,
`additional_kwargs`, `response_metadata`) kept in its metadata, so that the messages given back
are equal to those stored until a compression replaces them.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, NotRequired, cast

from ._optional import framework_of

with framework_of(
    "LangChain",
    needs="LangChain v1",
    extra="langchain",
    packages=("langchain", "langchain_core", "langgraph"),
):
    from langchain.agents.middleware.types import (
        AgentMiddleware,
        AgentState,
        ModelRequest,
        ModelResponse,
    )
    from langchain_core.messages import AnyMessage, RemoveMessage
    from langchain_core.runnables import RunnableConfig
    from langchain_core.tools import BaseTool
    from langchain_core.utils.function_calling import convert_to_openai_tool
    from langgraph.config import get_config
    from langgraph.graph.message import REMOVE_ALL_MESSAGES
    from langgraph.runtime import Runtime
from sqlalchemy.engine import URL

from .. import _arguments
from .._background import BackgroundMode, validate_background
from .._client import AutoContextClient
from .._config import AutoContextConfig, RuntimeOptions, options_argument
from .._errors import ConfigError
from .._memory import AutoContextMemory
from .._summarizers import Summarizer
from .._tools import tool_definitions
from ._langchain_messages import from_langchain, to_langchain
from ._opening import checked_client, open_memory

__all__ = ["AutoContextMiddleware", "AutoContextState"]


class AutoContextState(AgentState[Any]):
    """The agent state with the count of its messages the autoctx session holds already."""

    autoctx_synced: NotRequired[int]


class _ContextTool(BaseTool):
    """One of the memory's model tools, answered from the session of the run that calls it."""

    middleware: Any
    tool_name: str

    def _run(self, config: RunnableConfig, **arguments: Any) -> str:
        mem = self.middleware.memory(config)
        call = {
            "type": "function",
            "function": {"name": self.tool_name, "arguments": json.dumps(arguments)},
        }
        return cast(str, mem.handle_tool_call(call))

    async def _arun(self, config: RunnableConfig, **arguments: Any) -> str:
        return await asyncio.to_thread(lambda: self._run(config, **arguments))


class AutoContextMiddleware(AgentMiddleware[AutoContextState, Any, Any]):
    """`create_agent` middleware that keeps the thread's messages in an autoctx session and
    sends the model the session's working context (see the module docstring).

    `AutoContextMiddleware(database_url=None, config=None, *, session_id=None,
    summarizer=None, tenant=None, background=False, options=None, client=None)`: the
    arguments of `AutoContextMemory.open`; with `client` (an `AutoContextClient`, instead of
    `database_url`) the memories are opened through it and closed by its `close()`. One
    middleware serves any number of threads (a memory per session id, opened on first use,
    created when new).
    """

    state_schema = AutoContextState

    def __init__(
        self,
        database_url: str | URL | None = None,
        config: AutoContextConfig | None = None,
        *,
        session_id: str | None = None,
        summarizer: Summarizer | None = None,
        tenant: str | None = None,
        background: BackgroundMode = False,
        options: RuntimeOptions | None = None,
        client: AutoContextClient | None = None,
    ) -> None:
        super().__init__()
        self.client = checked_client(client, database_url, "AutoContextMiddleware")
        self.database_url = database_url
        self.config = config or AutoContextConfig()
        # Refused here, as `AutoContextMemory.open` would, rather than at the first run.
        self.session_id = None if session_id is None else _arguments.session_id(session_id)
        self.summarizer = summarizer
        self.tenant = _arguments.tenant(tenant)
        self.background = validate_background(background)
        #: How each memory runs its compressions (`AutoContextMemory.open(options=...)`).
        self.options = options_argument(options)
        self._memories: dict[str, AutoContextMemory] = {}
        self._lock = threading.Lock()
        self.tools = [
            _ContextTool(
                name=d["function"]["name"],
                description=d["function"]["description"],
                args_schema=d["function"]["parameters"],
                middleware=self,
                tool_name=d["function"]["name"],
            )
            for d in tool_definitions(self.config)
        ]

    # -- the memory of a thread ---------------------------------------------------------------

    def session_for(self, config: RunnableConfig | None = None) -> str:
        """The autoctx session id of a run: `session_id`, else the run's thread id."""
        if self.session_id is not None:
            return self.session_id
        configurable = (config if config is not None else get_config()).get("configurable") or {}
        thread_id = configurable.get("thread_id")
        if thread_id is None or thread_id == "":
            raise ConfigError(
                "AutoContextMiddleware: the run has no thread id; pass "
                '{"configurable": {"thread_id": ...}} to invoke, or '
                "AutoContextMiddleware(session_id=...)"
            )
        return str(thread_id)

    def memory(self, config: RunnableConfig | None = None) -> AutoContextMemory:
        """The memory of the run's session (opened, or created, on first use)."""
        session_id = self.session_for(config)
        with self._lock:
            mem = self._memories.get(session_id)
            if mem is None:
                mem = open_memory(
                    self.client,
                    self.database_url,
                    session_id,
                    self.config,
                    tenant=self.tenant,
                    summarizer=self.summarizer,
                    background=self.background,
                    options=self.options,
                )
                self._memories[session_id] = mem
            return mem

    def close(self) -> None:
        """Close the memories this middleware opened."""
        with self._lock:
            memories, self._memories = list(self._memories.values()), {}
        for mem in memories:
            mem.close()

    # -- hooks --------------------------------------------------------------------------------

    def before_model(self, state: AutoContextState, runtime: Runtime[Any]) -> dict[str, Any]:
        return self._before_model_in(get_config(), state)

    async def abefore_model(self, state: AutoContextState, runtime: Runtime[Any]) -> dict[str, Any]:
        config = get_config()
        return await asyncio.to_thread(self._before_model_in, config, state)

    def _before_model_in(self, config: RunnableConfig, state: AutoContextState) -> dict[str, Any]:
        mem = self.memory(config)
        self._store_new(mem, state)
        working = working_messages(mem)
        return {
            "messages": [RemoveMessage(id=REMOVE_ALL_MESSAGES), *working],
            "autoctx_synced": len(working),
        }

    def wrap_model_call(
        self, request: ModelRequest[Any], handler: Callable[[ModelRequest[Any]], ModelResponse[Any]]
    ) -> ModelResponse[Any]:
        return handler(self._with_room(get_config(), request))

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any]:
        config = get_config()
        return await handler(await asyncio.to_thread(self._with_room, config, request))

    def _with_room(self, config: RunnableConfig, request: ModelRequest[Any]) -> ModelRequest[Any]:
        """`request`, with room kept for what it sends beside the messages: its tool
        definitions (this middleware's context tools among them) and system prompt are
        measured into the session's reserve unless the config sets `reserve_tokens`
        (docs/design.md §2). `before_model` compressed before this measure was known (the
        first call of a session, or tools that changed): when the reserve grew, the session
        compresses to the smaller window and the request gets that working context."""
        mem = self.memory(config)
        before = mem.config.reserve_tokens
        tools = [_tool_definition(tool) for tool in request.tools]
        if mem.reserve_for(tools, request.system_prompt) <= before:
            return request
        if not mem.compress_if_needed():
            return request
        return request.override(messages=working_messages(mem))

    def after_agent(self, state: AutoContextState, runtime: Runtime[Any]) -> dict[str, Any]:
        return {"autoctx_synced": self._store_new(self.memory(), state)}

    async def aafter_agent(self, state: AutoContextState, runtime: Runtime[Any]) -> dict[str, Any]:
        config = get_config()
        synced = await asyncio.to_thread(lambda: self._store_new(self.memory(config), state))
        return {"autoctx_synced": synced}

    def _store_new(self, mem: AutoContextMemory, state: Mapping[str, Any]) -> int:
        """Append the state's messages past the synced prefix; compress if the trigger holds.
        Returns the length of the state's messages (all of them are now held)."""
        messages: Sequence[AnyMessage] = state.get("messages") or []
        synced = int(state.get("autoctx_synced") or 0)
        new = list(messages[synced:])
        if new:
            mem.add(from_langchain(new))
            mem.compress_if_needed()
        return len(messages)


def _tool_definition(tool: BaseTool | Mapping[str, Any]) -> Mapping[str, Any]:
    """A tool of a model request as the model receives it: the OpenAI function definition
    LangChain's chat models bind (a provider's own dict tool as given)."""
    try:
        return convert_to_openai_tool(tool)
    except (TypeError, ValueError):
        return tool if isinstance(tool, Mapping) else {"name": str(getattr(tool, "name", tool))}


def working_messages(mem: AutoContextMemory) -> list[AnyMessage]:
    """The memory's working context as LangChain messages."""
    return to_langchain(mem.messages())
