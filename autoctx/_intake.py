"""What `add()` does to messages before they are stored: validate, bind, count.

Validation follows docs/design.md §1: roles and block placement, the shape rules of tool calls
(results follow their call; nothing else while calls are open; call ids unique among open calls),
JSON arguments, the size cap, and text PostgreSQL can store (no NUL, no lone surrogates). A batch
is validated as a whole before anything is written, so a rejected `add([...])` stores nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ._arguments import unstorable
from ._errors import InvalidMessage
from ._messages import (
    ANTHROPIC_META,
    OPENAI_META,
    ROLES,
    Msg,
    NonJsonNumber,
    OpaqueBlock,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    json_text,
    json_value,
    jsonb_order,
)
from ._structure import is_final_answer
from ._tokens import TOKENS_PER_MESSAGE, TOKENS_PER_NAME, TokenCounter

#: Deepest JSON nesting accepted in tool arguments, metadata and opaque blocks. PostgreSQL's
#: JSONB and Python's json both recurse; far below either limit, and far above real tool input.
MAX_JSON_DEPTH = 200


@dataclass(frozen=True, slots=True)
class Prepared:
    """A validated message, its tool results bound to their calls' names, with its counts."""

    msg: Msg
    tokens: int
    chars: int
    final: bool
    #: The metadata as stored (compact JSON), when validation already wrote it out.
    metadata_json: str | None = None


def _strings(value: Any, depth: int = 0) -> Iterator[str]:
    """Every string (keys included) in a JSON-like value."""
    if depth > MAX_JSON_DEPTH:
        raise RecursionError
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for k, v in value.items():
            if isinstance(k, str):
                yield k
            yield from _strings(v, depth + 1)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _strings(v, depth + 1)


def _json_depth(text: str) -> int:
    """Nesting depth of a JSON text, without parsing it (so that a hostile depth cannot recurse)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def _check_text(s: str, where: str, what: str) -> None:
    if (problem := unstorable(s)) is not None:
        raise InvalidMessage(f"{where}: {what} {problem}")


def _check_json_value(value: Any, where: str, what: str) -> None:
    try:
        for s in _strings(value):
            _check_text(s, where, what)
        json.dumps(value)
    except RecursionError:
        raise InvalidMessage(
            f"{where}: {what} is nested deeper than {MAX_JSON_DEPTH} levels; flatten it"
        ) from None
    except (TypeError, ValueError) as exc:
        raise InvalidMessage(f"{where}: {what} is not JSON-serializable ({exc})") from None
    try:
        json.dumps(value, allow_nan=False)
    except ValueError:
        # Python writes these as bare NaN/Infinity tokens, which no JSON parser (nor jsonb)
        # accepts.
        raise InvalidMessage(
            f"{where}: {what} holds a NaN or Infinity number, which JSON cannot represent; "
            "store it as null or as a string such as 'NaN'"
        ) from None


def _check_fields(msg: Msg, where: str) -> None:
    """The field types of a `Msg` built by hand (dataclasses do not check them), so that a
    wrong one is refused here instead of failing in the database or half-way through a check."""
    if not isinstance(msg.content, tuple | list):
        raise InvalidMessage(
            f"{where}: 'content' must be a tuple of blocks (TextBlock, ToolUseBlock, "
            f"ToolResultBlock, OpaqueBlock), got {type(msg.content).__name__}; "
            "build text messages with Msg.user(text) or Msg.assistant(text)"
        )
    if msg.name is not None and not isinstance(msg.name, str):
        raise InvalidMessage(
            f"{where}: 'name' must be a string or None, got {type(msg.name).__name__}"
        )
    if not isinstance(msg.metadata, Mapping):
        raise InvalidMessage(
            f"{where}: 'metadata' must be a dict, got {type(msg.metadata).__name__}"
        )
    if not isinstance(msg.pinned, bool):
        raise InvalidMessage(
            f"{where}: 'pinned' must be True or False, got {type(msg.pinned).__name__}"
        )
    for field_name in ("id", "tokens"):
        value = getattr(msg, field_name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise InvalidMessage(
                f"{where}: '{field_name}' must be an integer or None (autoctx sets it when "
                f"the message is stored; leave it out), got {type(value).__name__}"
            )
    _check_openai_meta(msg, where)
    _check_anthropic_meta(msg, where)
    for j, block in enumerate(msg.content):
        _check_block_fields(block, f"{where}, content block {j}")


def _check_openai_meta(msg: Msg, where: str) -> None:
    """The reserved metadata key is read back by `Msg.to_openai()`: a value of another shape
    would be stored and then break every later read of the working context."""
    meta = msg.metadata.get(OPENAI_META)
    if meta is None:
        return
    valid = (
        isinstance(meta, Mapping)
        and set(meta) <= {"extra", "content", "empty_tool_calls", "role"}
        and isinstance(meta.get("extra", {}), Mapping)
        and meta.get("content", "parts") in ("parts", "none")
        and isinstance(meta.get("empty_tool_calls", False), bool)
        and meta.get("role", "developer") == "developer"
    )
    if not valid:
        raise InvalidMessage(
            f"{where}: metadata key {OPENAI_META!r} is reserved for what autoctx keeps of the "
            "OpenAI format (Msg.from_openai writes it); keep your own data under another key"
        )


def _check_anthropic_meta(msg: Msg, where: str) -> None:
    """Like the OpenAI key: `to_anthropic()` reads it back."""
    meta = msg.metadata.get(ANTHROPIC_META)
    if meta is not None and meta != {"content": "list"}:
        raise InvalidMessage(
            f"{where}: metadata key {ANTHROPIC_META!r} is reserved for what autoctx keeps of "
            "the Anthropic format; keep your own data under another key"
        )


def _string_fields(block: object, names: tuple[str, ...], where: str) -> None:
    for name in names:
        value = getattr(block, name)
        if not isinstance(value, str):
            raise InvalidMessage(
                f"{where} ({type(block).__name__}): '{name}' must be a string, got "
                f"{type(value).__name__}"
            )


def _check_block_fields(block: object, where: str) -> None:
    if isinstance(block, TextBlock):
        _string_fields(block, ("text",), where)
    elif isinstance(block, ToolUseBlock):
        _string_fields(block, ("id", "name", "arguments"), where)
        if not isinstance(block.extra, Mapping):
            raise InvalidMessage(
                f"{where} (ToolUseBlock): 'extra' must be a dict, got {type(block.extra).__name__}"
            )
    elif isinstance(block, ToolResultBlock):
        _string_fields(block, ("tool_use_id", "name"), where)
        output = block.output
        if not isinstance(output, str) and not (
            isinstance(output, tuple | list)
            and all(
                (isinstance(p, TextBlock) and isinstance(p.text, str))
                or (isinstance(p, OpaqueBlock) and isinstance(p.data, Mapping))
                for p in output
            )
        ):
            raise InvalidMessage(
                f"{where} (ToolResultBlock): 'output' must be a string or a tuple of "
                f"TextBlocks (and OpaqueBlocks for images), got {type(output).__name__}"
            )
        if not isinstance(block.is_error, bool) or not isinstance(block.extra, Mapping):
            raise InvalidMessage(
                f"{where} (ToolResultBlock): 'is_error' must be True or False and 'extra' a dict"
            )
    elif isinstance(block, OpaqueBlock):
        if not isinstance(block.data, Mapping):
            raise InvalidMessage(
                f"{where} (OpaqueBlock): 'data' must be a dict, got {type(block.data).__name__}"
            )
    else:
        raise InvalidMessage(
            f"{where}: a {type(block).__name__} is not a content block; use TextBlock, "
            "ToolUseBlock, ToolResultBlock or OpaqueBlock"
        )


def _checked_json_text(value: Any, where: str, what: str) -> str:
    """`value` written out as stored, after the checks of `_check_json_value`.

    One C-speed `json.dumps` decides the common case: it writes a NUL as the escape
    ``\\u0000``, keeps a lone surrogate as is (so the UTF-8 encoding fails), and cannot nest
    deeper than it has brackets. Only when one of these could be wrong does the exact (slow)
    walk run, to raise the precise error or to clear a false alarm.
    """
    try:
        text = json_text(value)
    except (RecursionError, TypeError, ValueError):
        text = None
    if text is None or "\\u0000" in text or text.count("[") + text.count("{") > MAX_JSON_DEPTH:
        _check_json_value(value, where, what)
        return json_text(value)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        _check_json_value(value, where, what)
    return text


def _check_arguments(call: ToolUseBlock, where: str) -> None:
    what = f"tool call {call.id!r} ({call.name})"
    _check_text(call.id, where, f"{what} id")
    _check_text(call.name, where, f"{what} name")
    _check_text(call.arguments, where, f"{what} arguments")
    if call.extra:
        # Unknown keys of the OpenAI call, stored with the content: JSON PostgreSQL can hold.
        _checked_json_text(dict(call.extra), where, f"{what} extra keys")
    if call.extra.get("arguments_absent") and not call.arguments:
        return
    # Counting brackets is C-speed; the exact depth only matters when there are that many.
    brackets = call.arguments.count("[") + call.arguments.count("{")
    if brackets > MAX_JSON_DEPTH and _json_depth(call.arguments) > MAX_JSON_DEPTH:
        raise InvalidMessage(
            f"{where}: {what} arguments are nested deeper than {MAX_JSON_DEPTH} levels; "
            "flatten them"
        )
    try:
        json_value(call.arguments)
    except NonJsonNumber:
        raise InvalidMessage(
            f"{where}: {what} arguments hold NaN or Infinity, which is not JSON; the model's "
            "call must carry a JSON object string (write such a number as null or a string)"
        ) from None
    except ValueError as exc:
        raise InvalidMessage(
            f"{where}: {what} arguments are not valid JSON ({exc.args[0]}); the model's call "
            'must carry a JSON object string such as \'{"path": "a.py"}\''
        ) from None


def _check_blocks(msg: Msg, where: str) -> str:
    """Raise `InvalidMessage` for a malformed message; return its metadata as stored."""
    if msg.role not in ROLES:
        raise InvalidMessage(f"{where}: unknown role {msg.role!r}; use one of {', '.join(ROLES)}")
    _check_fields(msg, where)
    if msg.kind != "original":
        raise InvalidMessage(
            f"{where}: kind {msg.kind!r} is made by autoctx's compressions; messages added "
            "by the caller are originals (leave kind at its default)"
        )
    if msg.name is not None:
        _check_text(msg.name, where, "the name")
    metadata_json = (
        _checked_json_text(dict(msg.metadata), where, "the metadata") if msg.metadata else "{}"
    )
    if msg.role == "tool" and (
        not msg.content or not all(isinstance(b, ToolResultBlock) for b in msg.content)
    ):
        raise InvalidMessage(
            f"{where}: a tool message must hold tool results only (one per call it answers)"
        )
    for block in msg.content:
        if isinstance(block, TextBlock):
            _check_text(block.text, where, "the text")
        elif isinstance(block, ToolUseBlock):
            if msg.role != "assistant":
                raise InvalidMessage(
                    f"{where}: only assistant messages may carry tool calls "
                    f"(found call {block.id!r} on a {msg.role} message)"
                )
            _check_arguments(block, where)
        elif isinstance(block, ToolResultBlock):
            if msg.role != "tool":
                raise InvalidMessage(
                    f"{where}: tool results belong on tool messages (found a result for "
                    f"{block.tool_use_id!r} on a {msg.role} message)"
                )
            _check_text(block.tool_use_id, where, "the tool_call_id")
            _check_text(block.output_text, where, f"the output of call {block.tool_use_id!r}")
            if not isinstance(block.output, str):
                for part in block.output:
                    if isinstance(part, OpaqueBlock):
                        _checked_json_text(dict(part.data), where, "a tool output part")
            if block.extra:
                _checked_json_text(dict(block.extra), where, "a tool result's extra keys")
        elif isinstance(block, OpaqueBlock):
            _checked_json_text(dict(block.data), where, "an opaque content part")
        else:
            raise InvalidMessage(f"{where}: unknown content block {type(block).__name__}")
    return metadata_json


def check_stored(msg: Msg, where: str) -> None:
    """The checks `prepare` makes of one message, for a message of any kind (an import reads
    summaries and previews too, which `add()` never takes). Raises `InvalidMessage`."""
    _check_blocks(msg if msg.kind == "original" else msg.with_(kind="original"), where)


def _opaque_json(block: OpaqueBlock) -> str:
    # In jsonb's key order: the count of a message read back from the database (an import
    # checks it) must equal its count when added, whatever order its keys were given in.
    return json.dumps(jsonb_order(block.data), ensure_ascii=False)


def count_tokens(msg: Msg, counter: TokenCounter) -> int:
    """Tokens of one message, as documented in `autoctx._tokens`."""
    total = TOKENS_PER_MESSAGE + (TOKENS_PER_NAME if msg.name else 0)
    for block in msg.content:
        if isinstance(block, TextBlock):
            total += counter.count(block.text)
        elif isinstance(block, ToolUseBlock):
            total += counter.count(block.name) + counter.count(block.arguments)
        elif isinstance(block, ToolResultBlock):
            total += counter.count(block.output_text)
            # A string output has no parts (iterating it would visit every character).
            if not isinstance(block.output, str):
                for part in block.output:
                    if isinstance(part, OpaqueBlock):
                        total += counter.count(json_text(jsonb_order(part.data)))
        else:
            total += counter.count(_opaque_json(block))
    return total


class OpenCalls:
    """The calls of the newest assistant message still waiting for their results (id -> name)."""

    def __init__(self, calls: Mapping[str, str] | None = None) -> None:
        self.calls: dict[str, str] = dict(calls or {})

    def to_json(self) -> dict[str, str]:
        return dict(self.calls)


def prepare(
    messages: Sequence[Msg],
    counter: TokenCounter,
    *,
    max_chars: int,
    session_id: str,
) -> list[Prepared]:
    """Validate each message on its own and count its tokens (no session state needed, so this
    runs before any lock is taken). Raises `InvalidMessage` naming the message and the fix."""
    out: list[Prepared] = []
    for index, msg in enumerate(messages):
        if not isinstance(msg, Msg):
            raise InvalidMessage(
                f"session {session_id!r}, message {index}: expected a Msg, got {type(msg).__name__}"
            )
        where = _where(session_id, index, msg)
        metadata_json = _check_blocks(msg, where)
        chars = msg.payload_chars
        if chars > max_chars:
            raise InvalidMessage(
                f"{where}: payload of {chars} characters is over the cap of {max_chars} "
                "(AutoContextConfig.max_message_chars); raise the cap or store the payload "
                "elsewhere and add a reference"
            )
        tokens = count_tokens(msg, counter)
        out.append(Prepared(msg, tokens, chars, is_final_answer(msg), metadata_json))
    return out


#: A message as the open-call rule reads it: role, call ids, result ids, tool names.
CallShape = tuple[str, Sequence[str], Sequence[str], Sequence[str]]


def open_calls_at_tail(newest_first: Iterable[CallShape]) -> dict[str, str] | None:
    """The newest tool group's calls still without results (call id -> tool name), from a
    context's messages newest first; None when they are all tool results (the caller reads
    further back, or has the whole context: then nothing is open). Pure: the store reads the
    tail, a fork cuts a context, and both ask this."""
    answered: set[str] = set()
    for role, call_ids, result_ids, tool_names in newest_first:
        if role == "tool":
            answered.update(result_ids)
            continue
        names = list(tool_names)
        return {
            call: names[k] if k < len(names) else ""
            for k, call in enumerate(call_ids)
            if call not in answered
        }
    return None


def stand_in(rest: Prepared, *, replaced_final: bool) -> Prepared:
    """`rest` as the message that takes a popped message's place (`pop_last`'s remainder),
    its final-answer flag from the kinds table (docs/design.md §1) given whether the message it
    stands for was the final answer. Pure: the store writes what this decides."""
    return replace(rest, final=is_final_answer(rest.msg, replaced_final=replaced_final))


def bind(prepared: Sequence[Prepared], open_calls: OpenCalls, *, session_id: str) -> list[Prepared]:
    """Apply the shape rules against the session's open calls (which it advances) and fill tool
    results' names from the calls they answer. Raises `InvalidMessage`."""
    out: list[Prepared] = []
    for i, p in enumerate(prepared):
        msg = _bind(p.msg, open_calls, _where(session_id, i, p.msg))
        out.append(
            p if msg is p.msg else Prepared(msg, p.tokens, p.chars, p.final, p.metadata_json)
        )
    return out


def _where(session_id: str, index: int, msg: Msg) -> str:
    return f"session {session_id!r}, message {index} ({msg.role})"


def _bind(msg: Msg, open_calls: OpenCalls, where: str) -> Msg:
    """Apply the shape rules; fill tool results' names from the calls they answer."""
    calls = open_calls.calls
    if msg.role == "tool":
        bound: list[ToolResultBlock] = []
        for block in msg.tool_results:
            if block.tool_use_id not in calls:
                raise InvalidMessage(
                    f"{where}: tool result for call id {block.tool_use_id!r} answers no open "
                    f"call (open calls: {sorted(calls) or 'none'}); a result must follow the "
                    "assistant message that made the call"
                )
            name = calls.pop(block.tool_use_id)
            bound.append(block if block.name == name else replace(block, name=name))
        return msg.with_(content=tuple(bound))
    if calls:
        raise InvalidMessage(
            f"{where}: calls {sorted(calls)} are still unanswered; add their tool results "
            "first (add a result such as 'cancelled' for a call you abandon)"
        )
    for call in msg.tool_uses:
        if call.id in calls:
            raise InvalidMessage(
                f"{where}: call id {call.id!r} is used twice among the unanswered calls; "
                "call ids must be unique until answered"
            )
        calls[call.id] = call.name
    return msg
