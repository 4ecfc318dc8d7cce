"""autoctx inside an AgentScope 2.x agent: one middleware and the agent gets the memory.

    from agentscope.agent import Agent
    from agentscope.tool import Toolkit
    from autoctx.integrations.agentscope import AutoContextMiddleware

    mw = await AutoContextMiddleware.open("agent-42", config=AutoContextConfig(max_tokens=128_000))
    agent = Agent(
        name="worker",
        system_prompt="..." + AutoContextMemory.system_prompt_snippet(),
        model=model,
        toolkit=Toolkit(tools=[..., *await mw.list_tools()]),
        middlewares=[mw],
    )
    await agent.reply(UserMsg(name="user", content="Fix the failing test"))

What each hook does:

- `on_model_call`: every message of the agent's context not yet stored is added to the autoctx
  session (once: a cursor per AgentScope message id counts the blocks already stored), the
  session is compressed if needed, and the model receives the agent's system prompt followed by
  autoctx's working context converted back to AgentScope messages. The tool schemas and the
  system prompt of the call are measured into the session's `reserve_tokens` (unless the config
  sets it), which comes off the window, so the whole request stays under `max_tokens`. This is
  where the bound is kept, at every model call of a reply, not only between replies.
- `on_compress_context`: replaces AgentScope's built-in one-shot summary. It stores what is
  new, compresses the session with autoctx's ladder, and drops from `agent.state.context` the
  messages already stored, except the last one (the reply in progress, which the agent's loop
  reads). The agent's own state therefore stays small: autoctx holds the history.
- `on_reply`: registers the context tools in the agent's toolkit if the caller did not, and
  stores the reply's final message when the reply ends.
- `list_tools`: `context_reload` and `context_search` as AgentScope tools, answered by the
  memory (allowed without asking: they only read this session's store).

An AgentScope 2.x `Msg` holds a whole reply: its tool calls AND their results are blocks of one
assistant message. autoctx pairs calls with results across messages, so one AgentScope message
becomes several autoctx messages (the blocks up to a tool result, each tool result on its own),
each carrying under the metadata key ``"agentscope"`` what autoctx does not model (the
message's own fields, every block's id, timestamps, state and extras), so that the conversion
back gives an equal `Msg`. Consecutive autoctx messages of one AgentScope message are joined
again. A message written by a compression (a summary, a preview) becomes a plain AgentScope
message of the same role.

- `on_acting`: sees each tool's whole response before AgentScope cuts it to the agent's
  `ContextConfig.tool_result_limit`, and keeps it until the result is stored: autoctx stores the
  whole result (the limit does not apply to what it stores), and its own ladder previews and
  offloads a large one, which `context_reload` gives back byte for byte.

Use one middleware per agent: it follows that agent's context.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from ._optional import framework_of

with framework_of(
    "AgentScope", needs="AgentScope 2.x", extra="agentscope", packages=("agentscope",)
):
    from agentscope.message import (
        DataBlock,
        HintBlock,
        Msg,
        TextBlock,
        ThinkingBlock,
        ToolCallBlock,
        ToolCallState,
        ToolResultBlock,
        ToolResultState,
    )
    from agentscope.middleware import MiddlewareBase
    from agentscope.permission import PermissionBehavior, PermissionDecision
    from agentscope.tool import FunctionTool, ToolBase, ToolChunk, ToolResponse
from sqlalchemy.engine import URL

from .. import _messages as ax
from .._async_memory import AsyncAutoContextMemory
from .._client import AutoContextClient
from .._config import AutoContextConfig
from .._errors import InvalidMessage
from ._opening import checked_client, open_async_memory

if TYPE_CHECKING:
    from agentscope.agent import Agent

__all__ = ["AutoContextMiddleware"]

#: Metadata key of an autoctx message under which the AgentScope fields it does not model live.
AGENTSCOPE_META = "agentscope"

_BLOCK_TYPES: dict[str, Any] = {
    "text": TextBlock,
    "thinking": ThinkingBlock,
    "hint": HintBlock,
    "tool_call": ToolCallBlock,
    "tool_result": ToolResultBlock,
    "data": DataBlock,
}


# -- AgentScope Msg -> autoctx messages ---------------------------------------------------------


def _block_to_autoctx(block: Any, where: str) -> tuple[ax.Block, dict[str, Any]]:
    """One AgentScope block (not a tool result) as an autoctx block plus what it leaves out."""
    dump: dict[str, Any] = block.model_dump(mode="json")
    if isinstance(block, TextBlock):
        return ax.TextBlock(dump.pop("text")), dump
    if isinstance(block, ToolCallBlock):
        call = ax.ToolUseBlock(dump.pop("id"), dump.pop("name"), dump.pop("input"))
        return call, dump
    if isinstance(block, HintBlock) and isinstance(block.hint, str):
        # A hint reaches the model as user text: counted and searched as text.
        return ax.TextBlock(dump.pop("hint")), dump
    if isinstance(block, (ThinkingBlock, HintBlock, DataBlock)):
        return ax.OpaqueBlock({AGENTSCOPE_META: dump}), {"type": dump["type"]}
    raise InvalidMessage(
        f"{where} has a block of type {type(block).__name__}, which autoctx's AgentScope "
        "integration does not know: pass AgentScope 2.x message blocks only"
    )


def _result_to_autoctx(block: ToolResultBlock) -> tuple[ax.Block, dict[str, Any]]:
    dump: dict[str, Any] = block.model_dump(mode="json")
    output = dump.pop("output")
    call_id, name = dump.pop("id"), dump.pop("name")
    if isinstance(output, str):
        return ax.ToolResultBlock(call_id, output, name), dump
    # Text parts become the result's text; anything else (images) is kept whole in the extras,
    # with its position, so the output list comes back in order.
    texts: list[ax.TextBlock] = []
    parts: list[dict[str, Any]] = []
    for part in output:
        if part.get("type") == "text":
            texts.append(ax.TextBlock(part.pop("text")))
        parts.append(part)
    dump["output"] = parts
    return ax.ToolResultBlock(call_id, tuple(texts), name), dump


def _text_of(output: str | Sequence[Any]) -> str:
    if isinstance(output, str):
        return output
    return "".join(part.text for part in output if isinstance(part, TextBlock))


def _whole(block: ToolResultBlock, whole: Mapping[str, ToolResultBlock]) -> ToolResultBlock:
    """The result as the tool returned it, where AgentScope cut it to its `tool_result_limit`
    (its text differs from what the tool returned); the block as it is otherwise."""
    full = whole.get(block.id)
    if full is None or _text_of(full.output) == _text_of(block.output):
        return block
    return block.model_copy(update={"output": full.output})


def _to_autoctx(
    msg: Msg,
    start: int = 0,
    stop: int | None = None,
    whole: Mapping[str, ToolResultBlock] | None = None,
) -> list[ax.Msg]:
    """The blocks ``start:stop`` of one AgentScope message as autoctx messages: the blocks up to
    a tool result form one message of the AgentScope role, each tool result a tool message
    (the tool's whole result where `whole` holds it)."""
    if not isinstance(msg, Msg):
        raise InvalidMessage(
            f"an AgentScope context entry is a {type(msg).__name__}, not an "
            "agentscope.message.Msg: give the agent AgentScope messages"
        )
    head = msg.model_dump(mode="json", exclude={"content"})
    blocks = list(msg.content)[start:stop]
    out: list[ax.Msg] = []
    run: list[ax.Block] = []
    extras: list[dict[str, Any]] = []
    at = start

    def emit(role: ax.Role, content: list[ax.Block], first: int) -> None:
        meta = {AGENTSCOPE_META: {"msg": head, "at": first, "blocks": list(extras)}}
        out.append(ax.Msg(role, tuple(content), name=msg.name, metadata=meta))

    for i, block in enumerate(blocks, start):
        where = f"AgentScope message {msg.id} block {i}"
        if isinstance(block, ToolResultBlock):
            if run:
                emit(msg.role, run, at)
            result, extra = _result_to_autoctx(_whole(block, whole or {}))
            extras[:] = [extra]
            emit("tool", [result], i)
            run, extras[:], at = [], [], i + 1
            continue
        converted, extra = _block_to_autoctx(block, where)
        run.append(converted)
        extras.append(extra)
    if run or not out:
        emit(msg.role, run, at)
    return out


# -- autoctx messages -> AgentScope Msg ---------------------------------------------------------


def _block_from_autoctx(block: ax.Block, extra: Mapping[str, Any]) -> Any:
    if isinstance(block, ax.TextBlock):
        if extra.get("type") == "hint":
            return HintBlock.model_validate({**extra, "hint": block.text})
        return TextBlock.model_validate({**extra, "text": block.text})
    if isinstance(block, ax.ToolUseBlock):
        data = {**extra, "id": block.id, "name": block.name, "input": block.arguments}
        return ToolCallBlock.model_validate(data)
    if isinstance(block, ax.OpaqueBlock):
        dump = block.data.get(AGENTSCOPE_META)
        if isinstance(dump, Mapping) and dump.get("type") in _BLOCK_TYPES:
            return _BLOCK_TYPES[str(dump["type"])].model_validate(dump)
        return TextBlock(text=json.dumps(dict(block.data), ensure_ascii=False))
    output: str | list[Any]
    if isinstance(block.output, str):
        output = block.output
    else:
        # What this module stores holds text parts only (the rest is in `extra`).
        texts = iter(part for part in block.output if isinstance(part, ax.TextBlock))
        parts = extra.get("output") or [{"type": "text"} for _ in block.output]
        output = []
        for part in parts:
            if part.get("type") == "text":
                output.append(TextBlock.model_validate({**part, "text": next(texts).text}))
            else:
                output.append(DataBlock.model_validate(part))
    rest = {k: v for k, v in extra.items() if k != "output"}
    data = {**rest, "id": block.tool_use_id, "name": block.name, "output": output}
    return ToolResultBlock.model_validate(data)


def _meta(msg: ax.Msg) -> Mapping[str, Any] | None:
    """The AgentScope record of an original autoctx message whose blocks it still describes."""
    meta = msg.metadata.get(AGENTSCOPE_META)
    if msg.kind != "original" or not isinstance(meta, Mapping):
        return None
    blocks = meta.get("blocks")
    if not isinstance(meta.get("msg"), Mapping) or not isinstance(blocks, list):
        return None
    return meta if len(blocks) == len(msg.content) else None


def _plain(msg: ax.Msg, name: str) -> Msg:
    """A message a compression wrote (summary, preview) as a plain AgentScope message."""
    blocks: list[Any] = []
    for block in msg.content:
        if isinstance(block, ax.TextBlock):
            blocks.append(TextBlock(text=block.text))
        elif isinstance(block, ax.ToolUseBlock):
            blocks.append(
                ToolCallBlock(
                    id=block.id,
                    name=block.name,
                    input=block.arguments,
                    state=ToolCallState.FINISHED,
                )
            )
        elif isinstance(block, ax.ToolResultBlock):
            output = block.output_text
            blocks.append(
                ToolResultBlock(
                    id=block.tool_use_id,
                    name=block.name,
                    output=output,
                    state=ToolResultState.SUCCESS,
                )
            )
        else:
            blocks.append(_block_from_autoctx(block, {}))
    # AgentScope keeps tool results in assistant messages; a system message past the first is
    # read by the model as user text.
    role = {"tool": "assistant", "system": "user"}.get(msg.role, msg.role)
    if role == "user":
        blocks = [b for b in blocks if isinstance(b, (TextBlock, DataBlock))] or [
            TextBlock(text="")
        ]
    return Msg(name=msg.name or name, role=cast(Any, role), content=blocks)


def _from_autoctx(messages: Sequence[ax.Msg], name: str = "assistant") -> list[Msg]:
    """autoctx messages as AgentScope messages: consecutive parts of one AgentScope message are
    joined again; other messages become plain messages (`name` for the assistant's)."""
    out: list[Msg] = []
    current_id: str | None = None
    for msg in messages:
        meta = _meta(msg)
        if meta is None:
            out.append(_plain(msg, name))
            current_id = None
            continue
        head = meta["msg"]
        blocks = [
            _block_from_autoctx(b, e) for b, e in zip(msg.content, meta["blocks"], strict=True)
        ]
        if current_id is not None and head.get("id") == current_id:
            last = out[-1]
            out[-1] = Msg.model_validate({**head, "content": [*last.content, *blocks]})
        else:
            out.append(Msg.model_validate({**head, "content": blocks}))
            current_id = head.get("id")
    return out


# -- the middleware -----------------------------------------------------------------------------


def _settled(msg: Msg, start: int) -> int:
    """How many blocks of `msg` can be stored: up to the first tool call still awaiting its
    result (a call parked on a user confirmation, say), so a call and its result are never
    stored out of order."""
    answered = {b.id for b in msg.content if isinstance(b, ToolResultBlock)}
    for i, block in enumerate(msg.content):
        if i >= start and isinstance(block, ToolCallBlock) and block.id not in answered:
            return i
    return len(msg.content)


class AutoContextMiddleware(MiddlewareBase):
    """AgentScope middleware that gives an agent autoctx's memory (see the module docstring)."""

    def __init__(self, memory: AsyncAutoContextMemory) -> None:
        if not isinstance(memory, AsyncAutoContextMemory):
            raise TypeError(
                "AutoContextMiddleware takes an AsyncAutoContextMemory: open one with "
                "`await AsyncAutoContextMemory.open(session_id, ...)` or use "
                "`await AutoContextMiddleware.open(session_id, ...)`"
            )
        self.memory = memory
        #: Blocks already stored, by AgentScope message id; None until read from the session.
        self._stored: dict[str, int] | None = None
        self._tools: list[ToolBase] | None = None
        #: Each tool's whole result, by call id, from `on_acting` until it is stored.
        self._whole: dict[str, ToolResultBlock] = {}

    @classmethod
    async def open(
        cls,
        session_id: str,
        database_url: str | URL | None = None,
        config: AutoContextConfig | None = None,
        *,
        client: AutoContextClient | None = None,
        **kwargs: Any,
    ) -> AutoContextMiddleware:
        """Open (or create) the session `session_id` and wrap it (arguments as
        `AsyncAutoContextMemory.open`); with `client` (an `AutoContextClient`, instead of
        `database_url`) the memory is opened through it and closed by its `close()`."""
        checked = checked_client(client, database_url, "AutoContextMiddleware.open")
        memory = await open_async_memory(checked, database_url, session_id, config, **kwargs)
        return cls(memory)

    async def close(self) -> None:
        await self.memory.close()

    # -- storing ------------------------------------------------------------------------------

    async def _cursor(self) -> dict[str, int]:
        if self._stored is None:
            # A reopened session: what the working context already holds of a message (an agent
            # state restored from elsewhere) is not stored twice.
            stored: dict[str, int] = {}
            for msg in await self.memory.messages():
                meta = _meta(msg)
                if meta is not None and isinstance(meta["msg"].get("id"), str):
                    end = int(meta.get("at", 0)) + len(msg.content)
                    key = meta["msg"]["id"]
                    stored[key] = max(stored.get(key, 0), end)
            self._stored = stored
        return self._stored

    async def sync(self, agent: Agent) -> None:
        """Store what the agent's context holds that the session does not (each block once)."""
        stored = await self._cursor()
        batch: list[ax.Msg] = []
        ends: dict[str, int] = {}
        for msg in agent.state.context:
            start = stored.get(msg.id, 0)
            stop = _settled(msg, start)
            if stop > start:
                batch.extend(_to_autoctx(msg, start, stop, self._whole))
                ends[msg.id] = stop
        if batch:
            await self.memory.add(batch)
            stored.update(ends)
            for m in batch:
                for result in m.tool_results:
                    self._whole.pop(result.tool_use_id, None)

    async def _sync_and_trim(self, agent: Agent) -> None:
        await self.sync(agent)
        await self.memory.compress_if_needed()
        stored = await self._cursor()
        context = agent.state.context
        keep = [m for m in context[:-1] if stored.get(m.id, 0) < len(m.content)] + context[-1:]
        if len(keep) < len(context):
            agent.state.context = keep

    # -- hooks --------------------------------------------------------------------------------

    async def on_model_call(
        self,
        agent: Agent,
        input_kwargs: dict[str, Any],
        next_handler: Callable[..., Awaitable[Any]],
    ) -> Any:
        await self.sync(agent)
        given: list[Msg] = input_kwargs["messages"]
        system = [m for m in given[:1] if m.role == "system"]
        # The tool schemas and the system prompt are sent beside the working context: their
        # tokens come off the window unless the config sets `reserve_tokens` (design.md §2).
        instructions = "\n".join(m.get_text_content() or "" for m in system) or None
        await self.memory.reserve_for(input_kwargs.get("tools") or (), instructions)
        await self.memory.compress_if_needed()
        working = _from_autoctx(await self.memory.messages(), agent.name)
        return await next_handler(messages=[*system, *working])

    async def on_acting(
        self,
        agent: Agent,
        input_kwargs: dict[str, Any],
        next_handler: Callable[..., AsyncGenerator[Any, None]],
    ) -> AsyncGenerator[Any, None]:
        # The agent cuts a result over its `tool_result_limit` after this hook: keep the whole
        # one for `sync` (docs/design.md §1), as the agent itself would have built its block.
        call: ToolCallBlock = input_kwargs["tool_call"]
        async for item in next_handler():
            if isinstance(item, ToolResponse):
                content = item.content
                output = [TextBlock(text=content)] if isinstance(content, str) else content
                self._whole[call.id] = ToolResultBlock(
                    id=call.id, name=call.name, output=output, state=item.state
                )
            yield item

    async def on_compress_context(
        self,
        agent: Agent,
        input_kwargs: dict[str, Any],
        next_handler: Callable[..., Awaitable[None]],
    ) -> None:
        # The built-in summary is not run: autoctx's ladder compresses instead.
        await self._sync_and_trim(agent)

    async def on_reply(
        self,
        agent: Agent,
        input_kwargs: dict[str, Any],
        next_handler: Callable[..., AsyncGenerator[Any, None]],
    ) -> AsyncGenerator[Any, None]:
        for tool in await self.list_tools():
            if await agent.toolkit.get_tool(tool.name) is None:
                await agent.toolkit.add_tool(tool)
        async for event in next_handler():
            yield event
        await self._sync_and_trim(agent)

    async def list_tools(self) -> list[ToolBase]:
        if self._tools is None:
            self._tools = [self._tool(d["function"]) for d in self.memory.tools()]
        return list(self._tools)

    def _tool(self, definition: Mapping[str, Any]) -> ToolBase:
        name = str(definition["name"])
        memory = self.memory

        async def answer(**arguments: Any) -> ToolChunk:
            call = {"function": {"name": name, "arguments": json.dumps(arguments)}}
            text = await memory.handle_tool_call(call)
            # The state a plain function's result gets from AgentScope's own adapter.
            return ToolChunk(content=[TextBlock(text=text)], state=ToolResultState.RUNNING)

        return FunctionTool(
            answer,
            name=name,
            description=str(definition.get("description", "")),
            input_schema=dict(definition.get("parameters") or {}),
            is_read_only=True,
            permission=PermissionDecision(
                behavior=PermissionBehavior.ALLOW,
                message=f"{name} only reads this session's context.",
            ),
        )
