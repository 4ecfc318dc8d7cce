"""autoctx as a Pydantic AI capability: every model request of a run gets autoctx's working
context, and every message the run produces is stored in the session once.

    from pydantic_ai import Agent
    from autoctx.integrations.pydantic_ai import AutoContextCapability

    memory = AutoContextCapability("agent-42", config=AutoContextConfig(max_tokens=128_000))
    agent = Agent("openai:gpt-4o", instructions="...", capabilities=[memory])
    agent.run_sync("Fix the failing test")
    agent.run_sync("Now the next one")          # the session continues; no message_history

How it hooks in (`pydantic_ai.capabilities.AbstractCapability`):

- `before_model_request`: the messages the run added since the last request (the user prompt,
  the model's last response, the tool returns) are converted and added to the session; the
  request's tool definitions and instructions, sent beside the messages, are measured into the
  session's `reserve_tokens` (unless the config sets it), which comes off the window; the
  memory compresses when its trigger holds, and the request's messages are replaced by the
  working context converted back to `ModelMessage`s. The run's own history (`ctx.messages`,
  `result.all_messages()`) is left as Pydantic AI built it: it is the record of the run, never
  what the model receives, so its growth inside one run does not reach the model.
- `after_run`: the run's last response is stored.
- `get_toolset`: `context_reload` and `context_search`, answered by the memory.

The session is the conversation: a run that starts with `message_history` does not store that
history again (it is what the caller already had); the model receives the session's working
context instead of it. A system prompt (`system_prompt=`) is stored once, when the session is
empty; Pydantic AI adds it again to a run without history, and that copy is not stored again.
Prefer `instructions=`, which Pydantic AI sends with every request and never puts in history.
One capability serves one session, one run at a time.

Conversion: system prompt, user prompt (text, `ImageUrl`, image `BinaryContent`), tool returns
(as their text, `model_response_str()`, which is what the model reads; an outcome other than
success is kept), retry feedback (as user text), text, tool calls and thinking convert both
ways. A part autoctx has no place for (a native tool call, a file) is refused with an
`InvalidMessage` naming it.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ._optional import framework_of

with framework_of(
    "Pydantic AI", needs="Pydantic AI", extra="pydantic-ai", packages=("pydantic_ai",)
):
    from pydantic_ai.capabilities import AbstractCapability
    from pydantic_ai.messages import (
        BinaryContent,
        ImageUrl,
        ModelMessage,
        ModelRequest,
        ModelRequestPart,
        ModelResponse,
        ModelResponsePart,
        RetryFeedbackPart,
        RetryPromptPart,
        SystemPromptPart,
        TextPart,
        ThinkingPart,
        ToolCallPart,
        ToolReturnPart,
        UserPromptPart,
    )
    from pydantic_ai.models import ModelRequestContext, ModelRequestParameters
    from pydantic_ai.run import AgentRunResult
    from pydantic_ai.tools import RunContext, Tool
    from pydantic_ai.toolsets import FunctionToolset

from .. import _arguments
from .._async_memory import AsyncAutoContextMemory
from .._client import AutoContextClient
from .._config import AutoContextConfig, RuntimeOptions, options_argument
from .._errors import InvalidMessage, InvalidSessionId
from .._messages import (
    REASONING_TYPES,
    Block,
    Msg,
    OpaqueBlock,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    opaque_type,
)
from .._summarizers import Summarizer
from .._tools import tool_definitions
from ._opening import checked_client, open_async_memory

__all__ = ["AutoContextCapability", "from_model_messages", "to_model_messages"]

#: Metadata key for what the Pydantic AI parts carry beyond autoctx's blocks.
META = "pydantic_ai"
#: The fields of a `ThinkingPart` besides its text, kept in its thinking block under these names
#: (`signature` where Anthropic's thinking block has it).
_THINKING_FIELDS = ("id", "signature", "provider_name", "provider_details")


# ---------------------------------------------------------------------------------------------
# ModelMessage -> Msg
# ---------------------------------------------------------------------------------------------


def _user_blocks(part: UserPromptPart) -> tuple[Block, ...]:
    if isinstance(part.content, str):
        return (TextBlock(part.content),)
    blocks: list[Block] = []
    for item in part.content:
        if isinstance(item, str):
            blocks.append(TextBlock(item))
        elif isinstance(item, ImageUrl):
            blocks.append(OpaqueBlock({"type": "image_url", "image_url": {"url": item.url}}))
        elif isinstance(item, BinaryContent) and item.is_image:
            data = base64.b64encode(item.data).decode()
            url = f"data:{item.media_type};base64,{data}"
            blocks.append(OpaqueBlock({"type": "image_url", "image_url": {"url": url}}))
        else:
            raise InvalidMessage(
                f"a Pydantic AI user prompt holds a {type(item).__name__}, which autoctx does "
                "not store; pass text, ImageUrl or image BinaryContent"
            )
    return tuple(blocks)


def _request_msgs(message: ModelRequest, *, with_system: bool) -> list[Msg]:
    out: list[Msg] = []
    results: list[ToolResultBlock] = []
    outcomes: dict[str, str] = {}

    def flush() -> None:
        if results:
            meta = {META: {"outcomes": dict(outcomes)}} if outcomes else {}
            out.append(Msg("tool", tuple(results), metadata=meta))
            results.clear()
            outcomes.clear()

    for part in message.parts:
        if isinstance(part, ToolReturnPart):
            if part.outcome != "success":
                outcomes[part.tool_call_id] = part.outcome
            results.append(
                ToolResultBlock(
                    part.tool_call_id,
                    part.model_response_str(wrap_if_error=False),
                    part.tool_name,
                    is_error=part.outcome != "success",
                )
            )
            continue
        if isinstance(part, RetryPromptPart) and part.tool_name is not None:
            outcomes[part.tool_call_id] = "retried"
            results.append(
                ToolResultBlock(part.tool_call_id, part.model_response(), part.tool_name, True)
            )
            continue
        flush()
        if isinstance(part, SystemPromptPart):
            if with_system:
                out.append(Msg.system(part.content))
        elif isinstance(part, UserPromptPart):
            out.append(Msg("user", _user_blocks(part)))
        elif isinstance(part, RetryFeedbackPart | RetryPromptPart):
            out.append(Msg.user(part.model_response()))
        else:
            raise InvalidMessage(
                f"a Pydantic AI request holds a {type(part).__name__}, which autoctx has no "
                "place for"
            )
    flush()
    return out


def _response_msg(message: ModelResponse) -> Msg:
    blocks: list[Block] = []
    for part in message.parts:
        if isinstance(part, TextPart):
            blocks.append(TextBlock(part.content))
        elif isinstance(part, ToolCallPart):
            blocks.append(ToolUseBlock(part.tool_call_id, part.tool_name, part.args_as_json_str()))
        elif isinstance(part, ThinkingPart):
            # Every field of the part (docs/design.md §1): the signature and the provider's
            # details are what the provider needs to accept the reasoning back.
            data: dict[str, Any] = {"type": "thinking", "thinking": part.content}
            for key in _THINKING_FIELDS:
                value = getattr(part, key)
                if value is not None:
                    data[key] = value
            blocks.append(OpaqueBlock(data))
        else:
            raise InvalidMessage(
                f"a Pydantic AI response holds a {type(part).__name__}, which autoctx has no "
                "place for"
            )
    return Msg("assistant", tuple(blocks))


def from_model_messages(messages: Sequence[ModelMessage], *, with_system: bool = True) -> list[Msg]:
    """Pydantic AI messages as autoctx messages (system prompts left out unless `with_system`).
    Raises `InvalidMessage` for a part autoctx has no place for."""
    out: list[Msg] = []
    for message in messages:
        if isinstance(message, ModelRequest):
            out.extend(_request_msgs(message, with_system=with_system))
        else:
            out.append(_response_msg(message))
    return out


# ---------------------------------------------------------------------------------------------
# Msg -> ModelMessage
# ---------------------------------------------------------------------------------------------


def _user_part(msg: Msg) -> UserPromptPart:
    if len(msg.content) == 1 and isinstance(msg.content[0], TextBlock):
        return UserPromptPart(msg.content[0].text)
    items: list[Any] = []
    for block in msg.content:
        if isinstance(block, TextBlock):
            items.append(block.text)
        elif isinstance(block, OpaqueBlock) and block.data.get("type") == "image_url":
            items.append(ImageUrl(url=block.data["image_url"]["url"]))
        else:
            raise InvalidMessage(
                f"message {msg.id} (user) holds a block Pydantic AI's user prompt cannot carry"
            )
    return UserPromptPart(items)


def _request_parts(msg: Msg) -> list[ModelRequestPart]:
    if msg.role == "system":
        return [SystemPromptPart(msg.text)]
    if msg.role == "user":
        return [_user_part(msg)]
    outcomes = (msg.metadata.get(META) or {}).get("outcomes") or {}
    return [
        ToolReturnPart(
            tool_name=r.name,
            content=r.output_text,
            tool_call_id=r.tool_use_id,
            outcome=outcomes.get(r.tool_use_id, "failed" if r.is_error else "success"),
        )
        for r in msg.tool_results
    ]


def _response_parts(msg: Msg) -> list[ModelResponsePart]:
    parts: list[ModelResponsePart] = []
    for block in msg.content:
        if isinstance(block, TextBlock):
            if block.text:
                parts.append(TextPart(block.text))
        elif isinstance(block, ToolUseBlock):
            parts.append(ToolCallPart(block.name, block.arguments, tool_call_id=block.id))
        elif isinstance(block, OpaqueBlock) and block.data.get("type") == "thinking":
            fields = {k: block.data[k] for k in _THINKING_FIELDS if k in block.data}
            parts.append(ThinkingPart(str(block.data.get("thinking", "")), **fields))
        elif isinstance(block, OpaqueBlock) and opaque_type(block) in REASONING_TYPES:
            # Reasoning of another framework's session (a Responses reasoning item, Anthropic's
            # redacted thinking): no part carries it; it stays stored.
            continue
        else:
            raise InvalidMessage(
                f"message {msg.id} (assistant) holds a block a Pydantic AI response cannot carry"
            )
    return parts


def to_model_messages(messages: Sequence[Msg]) -> list[ModelMessage]:
    """autoctx messages as Pydantic AI messages: each run of system/user/tool messages is one
    `ModelRequest`, each run of assistant messages (a summary and the response after it) one
    `ModelResponse`."""
    out: list[ModelMessage] = []
    for msg in messages:
        if msg.role == "assistant":
            response_parts = _response_parts(msg)
            if not response_parts:
                continue
            if out and isinstance(out[-1], ModelResponse):
                out[-1] = ModelResponse([*out[-1].parts, *response_parts])
            else:
                out.append(ModelResponse(response_parts))
        else:
            request_parts = _request_parts(msg)
            if out and isinstance(out[-1], ModelRequest):
                out[-1] = ModelRequest([*out[-1].parts, *request_parts])
            else:
                out.append(ModelRequest(request_parts))
    return out


# ---------------------------------------------------------------------------------------------
# The capability
# ---------------------------------------------------------------------------------------------


def _sent_beside(
    parameters: ModelRequestParameters,
) -> tuple[list[dict[str, Any]], str | None]:
    """What a model request sends beside its messages: the definitions of its function and
    output tools, and its instructions (which Pydantic AI never puts in the history)."""
    tools = [
        {
            "name": tool.name,
            "description": tool.description or "",
            "parameters": tool.parameters_json_schema,
        }
        for tool in (*parameters.function_tools, *parameters.output_tools)
    ]
    parts = parameters.instruction_parts or ()
    return tools, "\n\n".join(part.content for part in parts) or None


class _Shared:
    """The memory, opened on first use and shared by the per-run copies of a capability."""

    def __init__(self, memory: AsyncAutoContextMemory | None) -> None:
        self.memory = memory
        self.lock = asyncio.Lock()


@dataclass
class AutoContextCapability(AbstractCapability[Any]):
    """A Pydantic AI capability that gives an agent autoctx's memory (see the module docstring).

    Pass a session id (and optionally `database_url`, `config`, `summarizer`, `tenant`,
    `options`), or an open `memory` (an `AsyncAutoContextMemory`). With `client` (an
    `AutoContextClient`, instead of `database_url`) the memory is opened through it and closed
    by its `close()`.
    """

    session_id: str | None = None
    database_url: str | None = None
    config: AutoContextConfig | None = None
    summarizer: Summarizer | None = None
    tenant: str | None = None
    memory: AsyncAutoContextMemory | None = None
    #: Offer `context_reload` and `context_search` to the model.
    context_tools: bool = True
    #: How the memory runs its compressions (`AutoContextMemory.open(options=...)`).
    options: RuntimeOptions | None = None
    #: The client to open the memory through (else the shared client of `database_url`).
    client: AutoContextClient | None = None
    _shared: _Shared = field(init=False, repr=False)
    _start: int = field(default=0, init=False, repr=False)
    _stored: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.memory is None:
            if self.session_id is None:
                raise InvalidSessionId(
                    "AutoContextCapability needs a session_id (or an open memory=)"
                )
            # Checked here, as AsyncAutoContextMemory.open would, so a bad value fails where
            # the capability is built rather than at the agent's first run.
            _arguments.session_id(self.session_id)
            _arguments.tenant(self.tenant)
            options_argument(self.options)
        checked_client(self.client, self.database_url, "AutoContextCapability")
        self._shared = _Shared(self.memory)

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None  # holds a database connection: not an agent-spec capability

    async def open(self) -> AsyncAutoContextMemory:
        """The session's memory (opened on first use)."""
        shared = self._shared
        async with shared.lock:
            if shared.memory is None:
                assert self.session_id is not None
                shared.memory = await open_async_memory(
                    self.client,
                    self.database_url,
                    self.session_id,
                    self.config,
                    summarizer=self.summarizer,
                    tenant=self.tenant,
                    options=self.options,
                )
            return shared.memory

    async def aclose(self) -> None:
        """Close the memory (a later run opens it again)."""
        if self._shared.memory is not None:
            await self._shared.memory.close()
            self._shared.memory = None

    async def for_run(self, ctx: RunContext[Any]) -> AutoContextCapability:
        run = AutoContextCapability(
            self.session_id,
            self.database_url,
            self.config,
            self.summarizer,
            self.tenant,
            self.memory,
            self.context_tools,
            self.options,
            self.client,
        )
        run._shared = self._shared
        return run

    async def before_run(self, ctx: RunContext[Any]) -> None:
        # What the caller passed as message_history: not this run's, not stored again.
        self._start = len(ctx.messages)
        self._stored = 0

    async def _store(self, new: Sequence[ModelMessage]) -> AsyncAutoContextMemory:
        memory = await self.open()
        if new:
            empty = await memory.message_count() == 0
            msgs = from_model_messages(new, with_system=empty)
            if msgs:
                await memory.add(msgs)
            self._stored += len(new)
        return memory

    async def before_model_request(
        self, ctx: RunContext[Any], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        memory = await self._store(ctx.messages[self._start + self._stored :])
        await memory.reserve_for(*_sent_beside(request_context.model_request_parameters))
        await memory.compress_if_needed()
        request_context.messages = to_model_messages(await memory.messages())
        return request_context

    async def after_run(
        self, ctx: RunContext[Any], *, result: AgentRunResult[Any]
    ) -> AgentRunResult[Any]:
        await self._store(result.new_messages()[self._stored :])
        return result

    def get_toolset(self) -> FunctionToolset[Any] | None:
        if not self.context_tools:
            return None
        tools: list[Tool[Any]] = []
        for definition in tool_definitions(self.config or AutoContextConfig()):
            fn = definition["function"]
            tools.append(
                Tool.from_schema(
                    self._answer(fn["name"]),
                    name=fn["name"],
                    description=fn.get("description"),
                    json_schema=fn["parameters"],
                )
            )
        return FunctionToolset(tools)

    def _answer(self, name: str) -> Any:
        async def answer(**arguments: Any) -> str:
            memory = await self.open()
            call = {"function": {"name": name, "arguments": json.dumps(arguments)}}
            return await memory.handle_tool_call(call)

        return answer
