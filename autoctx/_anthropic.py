"""The Anthropic Messages format, both ways.

In: an Anthropic message (`{"role": "user" | "assistant", "content": str | [blocks]}`, or the
official client's objects) becomes autoctx messages. Text, `tool_use`, `image`, `document`,
`thinking` and `redacted_thinking` blocks keep their order in the message; the last four are
opaque blocks holding the block exactly as given (a thinking block's signature must come back
byte for byte). A user turn's `tool_result` blocks become one tool message (the API puts them
first in the turn), so they pair with their calls by the same shape rules as OpenAI results;
text or images after them in the same turn become a user message after it.

Out: `to_anthropic()` gives the system text and turns that the Messages API accepts: the
leading system messages are the system text, tool messages are user turns, adjacent turns of
one role are merged (a compression's summary is an assistant message, and may sit beside the
assistant message that follows it), and a context that opens with an assistant turn (after a
fold, say) gets a short user turn first, as the API wants a user turn first.

Anthropic messages that go in come out equal (a merged turn is split and merged back at the
same place); `content: []` on a tool_result comes back without `content`, which the API reads
alike.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

from ._errors import InvalidMessage
from ._messages import (
    ANTHROPIC_META,
    ANTHROPIC_ONLY_TYPES,
    OPENAI_META,
    REASONING_TYPES,
    Block,
    Msg,
    OpaqueBlock,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    as_openai_dict,
    json_text,
    log_omitted,
    opaque_type,
)

#: Block types that only the Anthropic format has: a message dict holding one is read as
#: Anthropic by `add()` (plain text reads the same in both formats).
_MARKERS = ANTHROPIC_ONLY_TYPES | {"tool_use", "tool_result"}
_USER_TYPES = ("text", "image", "document", "tool_result")
_ASSISTANT_TYPES = ("text", "tool_use", "thinking", "redacted_thinking")
#: Keys of a response (`client.messages.create(...)`) that are not part of a request message.
_RESPONSE_KEYS = frozenset(
    {"id", "type", "model", "stop_reason", "stop_sequence", "usage", "container"}
)
#: The user turn put first when a working context opens with an assistant turn.
CONTINUATION_TEXT = "(Continuing the conversation summarized below.)"


def is_anthropic(message: Mapping[str, Any]) -> bool:
    """Whether a message dict is in the Anthropic format (holds a block only it has)."""
    if message.get("type") == "message":  # a response of `client.messages.create()`
        return True
    content = message.get("content")
    if not isinstance(content, list):
        return False
    for block in content:
        block = as_openai_dict(block)
        if isinstance(block, Mapping) and block.get("type") in _MARKERS:
            return True
    return False


def _where(index: int | None, role: object) -> str:
    return f"message {index} ({role})" if index is not None else f"message ({role})"


def _string(block: Mapping[str, Any], key: str, where: str, *, empty: bool = True) -> str:
    value = block.get(key)
    if not isinstance(value, str) or (not empty and not value):
        raise InvalidMessage(
            f"{where}: a {block.get('type')!r} block needs a {'' if empty else 'non-empty '}"
            f"string {key!r}"
        )
    return value


def _source(block: Mapping[str, Any], where: str) -> None:
    source = block.get("source")
    if not isinstance(source, Mapping) or not isinstance(source.get("type"), str):
        raise InvalidMessage(
            f"{where}: an {block.get('type')!r} block needs a 'source' object with a 'type' "
            "(base64, url, text, file or content)"
        )


def _content_part(part: Mapping[str, Any], where: str) -> TextBlock | OpaqueBlock:
    """A text block (plain, or with citations/cache_control: kept whole) or an image/document."""
    kind = part.get("type")
    if kind == "text":
        text = _string(part, "text", where)
        return TextBlock(text) if set(part) == {"type", "text"} else OpaqueBlock(dict(part))
    _source(part, where)
    return OpaqueBlock(dict(part))


def _tool_use(block: Mapping[str, Any], where: str) -> ToolUseBlock:
    call_id = _string(block, "id", where, empty=False)
    name = _string(block, "name", where, empty=False)
    arguments = block.get("input")
    if not isinstance(arguments, Mapping):
        raise InvalidMessage(
            f"{where}: tool_use {call_id!r} ({name}) needs an 'input' object, got "
            f"{type(arguments).__name__}"
        )
    try:
        text = json_text(arguments)
    except (TypeError, ValueError) as exc:
        raise InvalidMessage(
            f"{where}: tool_use {call_id!r} ({name}) 'input' is not JSON ({exc})"
        ) from None
    rest = {k: v for k, v in block.items() if k not in ("type", "id", "name", "input")}
    return ToolUseBlock(call_id, name, text, {ANTHROPIC_META: rest} if rest else {})


def _tool_result(block: Mapping[str, Any], where: str) -> ToolResultBlock:
    call_id = _string(block, "tool_use_id", where, empty=False)
    where = f"{where}, tool_result {call_id!r}"
    content = block.get("content", ())
    output: str | tuple[TextBlock | OpaqueBlock, ...]
    if isinstance(content, str):
        output = content
    elif isinstance(content, list | tuple):
        parts: list[TextBlock | OpaqueBlock] = []
        for j, part in enumerate(content):
            part = as_openai_dict(part)
            if not isinstance(part, Mapping) or part.get("type") not in ("text", "image"):
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise InvalidMessage(
                    f"{where}: content part {j} is {kind!r}; a tool_result holds text and "
                    "image parts"
                )
            parts.append(_content_part(part, f"{where}, content part {j}"))
        output = tuple(parts)
    else:
        raise InvalidMessage(
            f"{where}: 'content' must be a string or a list of text and image parts"
        )
    is_error = block.get("is_error", False)
    if not isinstance(is_error, bool):
        raise InvalidMessage(f"{where}: 'is_error' must be true or false")
    # An explicit `"is_error": false` stays in `extra`, so that it comes back as given.
    rest = {
        k: v
        for k, v in block.items()
        if k not in ("type", "tool_use_id", "content") and not (k == "is_error" and v)
    }
    return ToolResultBlock(call_id, output, "", is_error, rest)


def from_anthropic(message: Any, *, index: int | None = None) -> list[Msg]:
    """One Anthropic message (a dict, or the `anthropic` client's `Message`/`MessageParam`) as
    autoctx messages: one, or for a user turn with tool results a tool message (and a user
    message for what follows the results). Raises `InvalidMessage` naming the bad block."""
    message = as_openai_dict(message)
    if not isinstance(message, Mapping):
        raise InvalidMessage(
            f"{_where(index, None)}: expected an Anthropic message (a dict with 'role' and "
            f"'content'), got {type(message).__name__}"
        )
    role = message.get("role")
    where = _where(index, role)
    if role not in ("user", "assistant"):
        raise InvalidMessage(
            f"{where}: an Anthropic message has role 'user' or 'assistant' (the system text "
            "is not a message: add it as Msg.system(text))"
        )
    response = message.get("type") == "message"
    unknown = set(message) - {"role", "content"} - (_RESPONSE_KEYS if response else set())
    if unknown:
        raise InvalidMessage(
            f"{where}: unknown keys {sorted(unknown)} on an Anthropic message (it has 'role' "
            "and 'content')"
        )
    content = message.get("content")
    if isinstance(content, str):
        return [Msg(role, (TextBlock(content),))]
    if not isinstance(content, list | tuple) or not content:
        raise InvalidMessage(
            f"{where}: 'content' must be a string or a non-empty list of content blocks"
        )
    allowed = _USER_TYPES if role == "user" else _ASSISTANT_TYPES
    results: list[ToolResultBlock] = []
    blocks: list[Block] = []
    for j, raw in enumerate(content):
        block = as_openai_dict(raw)
        at = f"{where}, content block {j}"
        kind = block.get("type") if isinstance(block, Mapping) else None
        if not isinstance(block, Mapping) or kind not in allowed:
            shown = repr(kind) if kind is not None else type(block).__name__
            raise InvalidMessage(
                f"{at}: {shown} is not a block of an Anthropic {role} message (one of "
                f"{', '.join(allowed)})"
            )
        if kind == "tool_result":
            if blocks:
                raise InvalidMessage(
                    f"{at}: tool_result blocks come first in a user turn, before any text or "
                    "image (as the Messages API requires)"
                )
            results.append(_tool_result(block, at))
        elif kind == "tool_use":
            blocks.append(_tool_use(block, at))
        elif kind == "thinking":
            _string(block, "thinking", at)
            _string(block, "signature", at)
            blocks.append(OpaqueBlock(dict(block)))
        elif kind == "redacted_thinking":
            _string(block, "data", at)
            blocks.append(OpaqueBlock(dict(block)))
        else:
            blocks.append(_content_part(block, at))
    out: list[Msg] = []
    if results:
        out.append(Msg("tool", tuple(results)))
    if blocks:
        single_text = len(blocks) == 1 and isinstance(blocks[0], TextBlock) and not results
        meta = {ANTHROPIC_META: {"content": "list"}} if single_text else {}
        out.append(Msg(role, tuple(blocks), metadata=meta))
    return out


def from_anthropic_messages(messages: Iterable[Any], *, system: str | None = None) -> list[Msg]:
    """A Messages API request's `system` and `messages` as autoctx messages."""
    out: list[Msg] = [Msg.system(system)] if system else []
    for i, message in enumerate(messages):
        out.extend(from_anthropic(message, index=i))
    return out


# ---------------------------------------------------------------------------------------------
# Out
# ---------------------------------------------------------------------------------------------


def _image_from_openai(part: Mapping[str, Any], where: str) -> dict[str, Any]:
    image = part.get("image_url")
    url = image.get("url") if isinstance(image, Mapping) else None
    if not isinstance(url, str):
        raise InvalidMessage(f"{where}: an image_url part without a url")
    if url.startswith("data:") and ";base64," in url:
        media_type, data = url[len("data:") :].split(";base64,", 1)
        return {
            "type": "image",
            "source": {"type": "base64", "media_type": media_type, "data": data},
        }
    return {"type": "image", "source": {"type": "url", "url": url}}


def _reasoning_out(block: OpaqueBlock) -> dict[str, Any] | None:
    """A reasoning block as the Messages API takes it, or None where it cannot: Anthropic's
    own thinking (Pydantic AI's thinking parts of an Anthropic model too, their own keys left
    off); not another provider's reasoning, whose signature Anthropic cannot verify, nor
    reasoning without a signature, which the API refuses."""
    data = block.data
    kind = data.get("type")
    if data.get("provider_name") not in (None, "anthropic"):
        return None
    keys: tuple[str, ...]
    if kind == "thinking" and isinstance(data.get("signature"), str):
        keys = ("type", "thinking", "signature")
    elif kind == "redacted_thinking" and isinstance(data.get("data"), str):
        keys = ("type", "data")
    else:
        return None
    if set(data) <= set(keys):
        return dict(data)  # as it came in, byte for byte
    return {k: data[k] for k in keys if k in data}


def _opaque_out(block: OpaqueBlock, where: str) -> dict[str, Any]:
    kind = block.data.get("type")
    if kind in ANTHROPIC_ONLY_TYPES or kind == "text":
        return dict(block.data)
    if kind == "image_url":
        # The same picture, in the form the Messages API takes.
        return _image_from_openai(block.data, where)
    if kind == "refusal" and isinstance(block.data.get("refusal"), str):
        return {"type": "text", "text": block.data["refusal"]}
    raise InvalidMessage(
        f"{where} holds a {opaque_type(block)!r} block, which the Anthropic Messages format "
        "cannot carry; read this session with to_openai()"
    )


def _tool_use_out(call: ToolUseBlock, where: str) -> dict[str, Any]:
    arguments: Any = {} if call.extra.get("arguments_absent") else call.input
    if not isinstance(arguments, dict):
        raise InvalidMessage(
            f"{where}: the arguments of call {call.id!r} ({call.name}) are not a JSON object, "
            "which an Anthropic tool_use 'input' must be"
        )
    out: dict[str, Any] = {"type": "tool_use", "id": call.id, "name": call.name}
    out["input"] = arguments
    out.update(call.extra.get(ANTHROPIC_META) or {})
    return out


def _tool_result_out(result: ToolResultBlock, where: str) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "tool_result", "tool_use_id": result.tool_use_id}
    if isinstance(result.output, str):
        out["content"] = result.output
    elif result.output:
        out["content"] = [
            {"type": "text", "text": p.text} if isinstance(p, TextBlock) else _opaque_out(p, where)
            for p in result.output
        ]
    if result.is_error:
        out["is_error"] = True
    out.update(result.extra)
    return out


def _blocks_out(msg: Msg, where: str, omitted: Counter[str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for block in msg.content:
        if isinstance(block, OpaqueBlock) and opaque_type(block) in REASONING_TYPES:
            # Per block, never the whole message (docs/design.md §1): reasoning of another
            # provider stays stored and in the export, and out of this view.
            kept = _reasoning_out(block)
            if kept is None:
                omitted[opaque_type(block)] += 1
            else:
                out.append(kept)
            continue
        if isinstance(block, TextBlock):
            if block.text:  # the API refuses empty text blocks (OpenAI writes "" beside calls)
                out.append({"type": "text", "text": block.text})
        elif isinstance(block, ToolUseBlock):
            out.append(_tool_use_out(block, where))
        elif isinstance(block, ToolResultBlock):
            out.append(_tool_result_out(block, where))
        else:
            out.append(_opaque_out(block, where))
    return out


def _as_list(content: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


def _leading_reasoning(blocks: list[dict[str, Any]]) -> int:
    k = 0
    while k < len(blocks) and blocks[k].get("type") in ("thinking", "redacted_thinking"):
        k += 1
    return k


def _joined(first: list[dict[str, Any]], second: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Two adjacent turns of one role as one. Only a compression puts a summary beside an
    assistant reply; the reply's leading thinking then stays first in the turn, where the
    API wants it when extended thinking is on."""
    lead = _leading_reasoning(second) if not _leading_reasoning(first) else 0
    return [*second[:lead], *first, *second[lead:]]


def _list_form(msg: Msg) -> bool:
    meta = msg.metadata
    return (meta.get(ANTHROPIC_META) or {}).get("content") == "list" or (
        meta.get(OPENAI_META) or {}
    ).get("content") == "parts"


def to_anthropic(messages: Sequence[Msg]) -> tuple[str, list[dict[str, Any]]]:
    """(system, messages) for the Messages API. Raises `InvalidMessage` for a block the format
    cannot carry (such as an OpenAI audio part)."""
    system: list[str] = []
    turns: list[dict[str, Any]] = []
    omitted: Counter[str] = Counter()
    touched = 0
    for msg in messages:
        where = f"message {msg.id} ({msg.role})"
        if msg.role == "system" and not turns:
            system.append(msg.text)
            continue
        role = "assistant" if msg.role == "assistant" else "user"
        before = omitted.total()
        blocks = _blocks_out(msg, where, omitted)
        touched += omitted.total() > before
        if not blocks:
            continue
        content: str | list[dict[str, Any]] = blocks
        if (
            len(blocks) == 1
            and len(msg.content) == 1
            and isinstance(msg.content[0], TextBlock)
            and not _list_form(msg)
        ):
            content = blocks[0]["text"]
        if turns and turns[-1]["role"] == role:
            previous = cast("str | list[dict[str, Any]]", turns[-1]["content"])
            turns[-1]["content"] = _joined(_as_list(previous), _as_list(content))
        else:
            turns.append({"role": role, "content": content})
    if turns and turns[0]["role"] == "assistant":
        turns.insert(0, {"role": "user", "content": CONTINUATION_TEXT})
    log_omitted(omitted, touched, view="to_anthropic()")
    return "\n\n".join(system), turns


def anthropic_tools(openai_tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Function-tool definitions in the Messages API's form (`name`, `description`,
    `input_schema`)."""
    out: list[dict[str, Any]] = []
    for tool in openai_tools:
        fn = tool["function"]
        out.append(
            {
                "name": fn["name"],
                "description": fn.get("description", ""),
                "input_schema": fn.get("parameters", {"type": "object", "properties": {}}),
            }
        )
    return out
