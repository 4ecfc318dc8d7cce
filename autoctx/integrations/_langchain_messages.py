"""LangChain messages as autoctx messages and back, losslessly (docs/design.md §1).

In: a `SystemMessage`, `HumanMessage`, `AIMessage` or `ToolMessage` becomes one autoctx message
of the same role. Its content, a string or a list, gives the blocks in order: text (a plain
string item, or a text block with nothing else) as text blocks; a tool call written in the
content (Anthropic's `tool_use`, the Responses API's `function_call`) as that call's tool_use
block, in place; anything else (Anthropic's `thinking` and `redacted_thinking`, OpenAI's
`reasoning`, images, citations) as an opaque block holding it whole. An `AIMessage`'s
`tool_calls` that its content does not already hold follow as tool_use blocks. A `ToolMessage`
is one tool result (`status="error"` is its `is_error`).

What autoctx does not model (the message's id, name, status, artifact, `additional_kwargs`,
`response_metadata`, `usage_metadata`, the shape of its content) is kept under the metadata key
``"langchain"``, so that the message given back is equal to the one stored. A message a
compression wrote (a summary, a preview) has no such record and becomes a plain message of its
role.

No conversion goes through the OpenAI or Anthropic dict formats: a message holding thinking
blocks and tool calls (what `ChatAnthropic` returns with extended thinking and tools) is neither.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)

from .._anthropic import CONTINUATION_TEXT
from .._errors import InvalidMessage
from .._messages import (
    REASONING_TYPES,
    Block,
    Msg,
    OpaqueBlock,
    Role,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    json_text,
)

__all__ = ["LANGCHAIN_META", "from_langchain", "to_langchain"]

_log = logging.getLogger("autoctx")

#: Metadata key (and `ToolUseBlock.extra` key) of what a LangChain message carries and autoctx's
#: blocks do not.
LANGCHAIN_META = "langchain"

_ROLES: dict[type[BaseMessage], Role] = {
    SystemMessage: "system",
    HumanMessage: "user",
    AIMessage: "assistant",
    ToolMessage: "tool",
}
#: Fields rebuilt from the blocks, never kept in the record.
_FROM_BLOCKS = frozenset({"content", "type", "tool_calls", "tool_call_id"})
#: The keys of a tool call written in the content, by its shape: (id, name, arguments).
_CALL_SHAPES = {
    "tool_use": ("id", "name", "input"),
    "function_call": ("call_id", "name", "arguments"),
}


def _role(message: BaseMessage, index: int) -> Role:
    for cls, role in _ROLES.items():
        if isinstance(message, cls):
            return role
    raise InvalidMessage(
        f"message {index}: a LangChain {type(message).__name__} has no place in an autoctx "
        "session; the middleware stores SystemMessage, HumanMessage, AIMessage and ToolMessage"
    )


def _json_fields(message: BaseMessage, index: int) -> dict[str, Any]:
    """The message's fields that the blocks do not hold, each one JSON (a field that is not,
    such as an artifact of arbitrary Python objects, is left out with a warning)."""
    fields: dict[str, Any] = {}
    for key, value in message.model_dump(exclude=set(_FROM_BLOCKS)).items():
        try:
            json_text(value)
        except (TypeError, ValueError):
            _log.warning(
                "LangChain message %d (%s): its %r is not JSON and is not kept; autoctx stores "
                "JSON values only",
                index,
                type(message).__name__,
                key,
            )
            continue
        fields[key] = value
    return fields


def _call_in_content(item: Mapping[str, Any], index: int) -> ToolUseBlock:
    id_key, name_key, args_key = _CALL_SHAPES[str(item["type"])]
    call_id, name, arguments = item.get(id_key), item.get(name_key), item.get(args_key)
    if not isinstance(call_id, str) or not call_id or not isinstance(name, str) or not name:
        raise InvalidMessage(
            f"message {index}: a {item['type']!r} content block needs a non-empty {id_key!r} "
            f"and {name_key!r}"
        )
    text = arguments if isinstance(arguments, str) else json_text(arguments)
    rest = {k: v for k, v in item.items() if k not in (id_key, name_key, args_key)}
    if not isinstance(arguments, str):
        rest["arguments_parsed"] = True
    return ToolUseBlock(call_id, name, text, {LANGCHAIN_META: rest})


def _content_blocks(
    content: str | list[Any], index: int, *, calls: bool
) -> tuple[list[Block], dict[str, Any]]:
    """The blocks of a content value and how to give it back (its form, its plain strings)."""
    if isinstance(content, str):
        return [TextBlock(content)], {"content": "string"}
    blocks: list[Block] = []
    strings: list[int] = []
    for j, item in enumerate(content):
        if isinstance(item, str):
            strings.append(j)
            blocks.append(TextBlock(item))
        elif not isinstance(item, Mapping):
            raise InvalidMessage(
                f"message {index}: content item {j} is a {type(item).__name__}; LangChain "
                "content holds strings and dicts"
            )
        elif set(item) == {"type", "text"} and item["type"] == "text":
            blocks.append(TextBlock(str(item["text"])))
        elif calls and item.get("type") in _CALL_SHAPES:
            blocks.append(_call_in_content(item, index))
        else:
            blocks.append(OpaqueBlock(dict(item)))
    form: dict[str, Any] = {"content": "list"}
    if strings:
        form["strings"] = strings
    return blocks, form


def _from_one(message: BaseMessage, index: int) -> Msg:
    role = _role(message, index)
    record: dict[str, Any] = {"type": message.type, "fields": _json_fields(message, index)}
    content: Any = message.content
    if isinstance(message, ToolMessage):
        blocks, form = _content_blocks(content, index, calls=False)
        output: str | tuple[TextBlock | OpaqueBlock, ...]
        if isinstance(content, str):
            output = content
        else:
            output = tuple(b for b in blocks if isinstance(b, TextBlock | OpaqueBlock))
        record.update(form)
        result = ToolResultBlock(
            message.tool_call_id, output, message.name or "", message.status == "error"
        )
        return Msg("tool", (result,), metadata={LANGCHAIN_META: record})
    blocks, form = _content_blocks(content, index, calls=isinstance(message, AIMessage))
    record.update(form)
    if isinstance(message, AIMessage):
        held = {b.id for b in blocks if isinstance(b, ToolUseBlock)}
        for call in message.tool_calls:
            call_id = call.get("id")
            if not call_id:
                raise InvalidMessage(
                    f"message {index}: a tool call of {call.get('name')!r} has no id; autoctx "
                    "pairs each result with its call by id"
                )
            if call_id not in held:
                blocks.append(ToolUseBlock(call_id, call["name"], json_text(call["args"])))
        given = [dict(c) for c in message.tool_calls]
        if given != _tool_calls(blocks):
            record["tool_calls"] = given  # as given, where the blocks would not rebuild them
    return Msg(role, tuple(blocks), name=message.name, metadata={LANGCHAIN_META: record})


def from_langchain(messages: Sequence[BaseMessage]) -> list[Msg]:
    """LangChain messages as autoctx messages, one each (see the module docstring)."""
    return [_from_one(m, i) for i, m in enumerate(messages)]


# ---------------------------------------------------------------------------------------------
# Back
# ---------------------------------------------------------------------------------------------


def _tool_calls(blocks: Sequence[Block]) -> list[dict[str, Any]]:
    return [
        {"name": b.name, "args": json.loads(b.arguments), "id": b.id, "type": "tool_call"}
        for b in blocks
        if isinstance(b, ToolUseBlock)
    ]


def _item(block: Block) -> Any:
    if isinstance(block, TextBlock):
        return {"type": "text", "text": block.text}
    if isinstance(block, OpaqueBlock):
        return dict(block.data)
    if isinstance(block, ToolUseBlock):
        rest = dict(block.extra.get(LANGCHAIN_META) or {})
        parsed = rest.pop("arguments_parsed", False)
        id_key, name_key, args_key = _CALL_SHAPES.get(
            str(rest.get("type")), _CALL_SHAPES["tool_use"]
        )
        arguments: Any = json.loads(block.arguments) if parsed else block.arguments
        return {**rest, id_key: block.id, name_key: block.name, args_key: arguments}
    raise AssertionError(block)


def _content(msg: Msg, record: Mapping[str, Any]) -> str | list[Any]:
    in_content = [
        b for b in msg.content if not isinstance(b, ToolUseBlock) or LANGCHAIN_META in b.extra
    ]
    if record.get("content") == "string" and len(in_content) == 1:
        only = in_content[0]
        if isinstance(only, TextBlock):
            return only.text
    strings = set(record.get("strings") or ())
    return [
        b.text if k in strings and isinstance(b, TextBlock) else _item(b)
        for k, b in enumerate(in_content)
    ]


def _record(msg: Msg) -> Mapping[str, Any] | None:
    record = msg.metadata.get(LANGCHAIN_META)
    if msg.kind != "original" or not isinstance(record, Mapping):
        return None
    return record if isinstance(record.get("fields"), Mapping) else None


def _plain(msg: Msg) -> AnyMessage:
    """A message with no LangChain record (a compression's summary or preview, or a message
    stored by another integration) as the LangChain message of its role."""
    texts = [b for b in msg.content if isinstance(b, TextBlock)]
    others = [b for b in msg.content if isinstance(b, OpaqueBlock)]
    content: str | list[Any] = (
        "".join(b.text for b in texts)
        if not others
        else [_item(b) for b in msg.content if not isinstance(b, ToolUseBlock)]
    )
    if msg.role == "system":
        return SystemMessage(content=content, name=msg.name)
    if msg.role == "user":
        return HumanMessage(content=content, name=msg.name)
    if msg.role == "assistant":
        return AIMessage(content=content, name=msg.name, tool_calls=_tool_calls(msg.content))
    [result] = msg.tool_results
    return ToolMessage(
        content=result.output_text,
        tool_call_id=result.tool_use_id,
        name=result.name or None,
        status="error" if result.is_error else "success",
    )


def _from_record(msg: Msg, record: Mapping[str, Any]) -> AnyMessage:
    fields = dict(record["fields"])
    if msg.role == "tool":
        [result] = msg.tool_results
        content: Any = (
            result.output
            if isinstance(result.output, str)
            else _content(msg.with_(content=result.output), record)
        )
        return ToolMessage(content=content, tool_call_id=result.tool_use_id, **fields)
    content = _content(msg, record)
    if msg.role == "assistant":
        calls = record.get("tool_calls") or _tool_calls(msg.content)
        return AIMessage(content=content, tool_calls=calls, **fields)
    cls = SystemMessage if msg.role == "system" else HumanMessage
    return cls(content=content, **fields)


def _as_list(content: str | list[Any]) -> list[Any]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content)


def _leading_reasoning(content: list[Any]) -> int:
    k = 0
    while k < len(content) and isinstance(content[k], Mapping):
        if content[k].get("type") not in REASONING_TYPES:
            break
        k += 1
    return k


def _joined(first: AIMessage, second: AIMessage) -> AIMessage:
    """Two adjacent assistant messages (a compression's summary beside a reply) as one, as the
    Messages API wants turns to alternate; a reply's leading thinking stays first in the turn,
    where the API wants it."""
    a, b = _as_list(first.content), _as_list(second.content)
    lead = _leading_reasoning(b) if not _leading_reasoning(a) else 0
    content = [*b[:lead], *a, *b[lead:]]
    keep = second if second.id is not None or first.id is None else first
    return keep.model_copy(
        update={"content": content, "tool_calls": [*first.tool_calls, *second.tool_calls]}
    )


def to_langchain(messages: Sequence[Msg]) -> list[AnyMessage]:
    """autoctx messages as LangChain messages: a message the middleware stored comes back equal
    to the one given; any other as the plain message of its role (one per tool result).

    Only a compression makes two assistant messages adjacent (a summary beside a reply), or
    makes the context open with one (after a fold): those are joined into one turn, and a
    short user turn goes first, as the Anthropic Messages API (`ChatAnthropic`) requires."""
    out: list[AnyMessage] = []
    for msg in messages:
        record = _record(msg)
        if record is not None and (msg.role != "tool" or len(msg.tool_results) == 1):
            converted: list[AnyMessage] = [_from_record(msg, record)]
        elif msg.role == "tool":
            converted = [_plain(msg.with_(content=(r,))) for r in msg.tool_results]
        else:
            converted = [_plain(msg)]
        for message in converted:
            previous = out[-1] if out else None
            if isinstance(message, AIMessage) and isinstance(previous, AIMessage):
                out[-1] = _joined(previous, message)
            else:
                out.append(message)
    first = next((k for k, m in enumerate(out) if not isinstance(m, SystemMessage)), None)
    if first is not None and isinstance(out[first], AIMessage):
        out.insert(first, HumanMessage(CONTINUATION_TEXT))
    return out
