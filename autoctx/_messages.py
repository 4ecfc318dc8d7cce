"""Messages and their blocks (docs/design.md §1), and the OpenAI Chat Completions format.

A `Msg` is immutable. It holds a role, an ordered tuple of blocks and free metadata, plus what
autoctx records about it: its `kind` (original or one of the compressions' outputs), whether the
caller pinned it, and once stored its per-session `id` and token count.

OpenAI conversion is lossless: whatever autoctx does not model (unknown keys, the choice between
string content and content parts, the `developer` role) is kept under the reserved metadata key
``"openai"`` and given back by `Msg.to_openai()`. A block that came in another format (an
Anthropic image, a thinking block, a Responses reasoning item) is mapped to the Chat Completions
part that carries it where there is one, and left out of the OpenAI view where there is none
(reasoning, above all: Chat Completions has no place for it); it stays stored, and
`to_openai_messages` logs how many blocks of each type it left out (docs/design.md §1).
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypeAlias, cast

from ._errors import InvalidMessage

_log = logging.getLogger("autoctx")

Role: TypeAlias = Literal["system", "user", "assistant", "tool"]
Kind: TypeAlias = Literal[
    "original",
    "tool_run_summary",
    "preview",
    "round_summary",
    "large_summary",
    "current_round_summary",
    "history_summary",
]
ROLES: tuple[Role, ...] = ("system", "user", "assistant", "tool")
#: Metadata key under which autoctx keeps what the OpenAI format carries and the model does not.
OPENAI_META = "openai"
#: Metadata key (and `ToolUseBlock.extra` key) for what the Anthropic format carries and the
#: model does not (see `autoctx._anthropic`).
ANTHROPIC_META = "anthropic"


@dataclass(frozen=True, slots=True)
class TextBlock:
    text: str
    type: Literal["text"] = "text"


@dataclass(frozen=True, slots=True)
class ToolUseBlock:
    """One tool call. `arguments` is the call's JSON text exactly as the model wrote it."""

    id: str
    name: str
    arguments: str = "{}"
    #: Keys of the OpenAI tool call that autoctx does not model (for example a non-function type).
    extra: Mapping[str, Any] = field(default_factory=dict)
    type: Literal["tool_use"] = "tool_use"

    @property
    def input(self) -> Any:
        """The arguments, parsed."""
        return json.loads(self.arguments)


@dataclass(frozen=True, slots=True)
class OpaqueBlock:
    """Anything else a model produces (images, audio, thinking): stored, counted, never dropped."""

    data: Mapping[str, Any]
    type: Literal["opaque"] = "opaque"


@dataclass(frozen=True, slots=True)
class ToolResultBlock:
    """The answer to the call `tool_use_id`; `name` is that call's tool (filled in at `add()`).

    `output` is a string or a tuple of parts: text, and (from the Anthropic format) images as
    opaque parts. `is_error` is the Anthropic flag for a failed call; `extra` keeps the keys of
    an Anthropic `tool_result` block that autoctx does not model (such as `cache_control`).
    """

    tool_use_id: str
    output: str | tuple[TextBlock | OpaqueBlock, ...]
    name: str = ""
    is_error: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict)
    type: Literal["tool_result"] = "tool_result"

    @property
    def output_text(self) -> str:
        """The output's text (image parts not included)."""
        if isinstance(self.output, str):
            return self.output
        return "".join(part.text for part in self.output if isinstance(part, TextBlock))

    @property
    def output_parts_json(self) -> list[str]:
        """The JSON of the output's non-text parts (what they weigh, for counting)."""
        if isinstance(self.output, str):
            return []
        return [json_text(p.data) for p in self.output if isinstance(p, OpaqueBlock)]


Block: TypeAlias = TextBlock | ToolUseBlock | ToolResultBlock | OpaqueBlock


@dataclass(frozen=True, slots=True)
class Msg:
    """One message of a session's history.

    Build one with the constructors (`Msg.user("...")`, `Msg.assistant(...)`, `Msg.tool(...)`),
    with `Msg.from_openai(dict)`, or directly from blocks.
    """

    role: Role
    content: tuple[Block, ...] = ()
    name: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    kind: Kind = "original"
    #: Never compressed; the flag covers the whole tool group the message belongs to.
    pinned: bool = False
    #: Per-session id, set once stored.
    id: int | None = None
    #: Token count, set once stored (or counted).
    tokens: int | None = None

    # -- constructors -------------------------------------------------------------------------

    @classmethod
    def system(cls, text: str, **kw: Any) -> Msg:
        return cls("system", (TextBlock(text),), **kw)

    @classmethod
    def user(cls, text: str, **kw: Any) -> Msg:
        return cls("user", (TextBlock(text),), **kw)

    @classmethod
    def assistant(
        cls,
        text: str | None = None,
        tool_calls: Sequence[ToolUseBlock] = (),
        **kw: Any,
    ) -> Msg:
        blocks: list[Block] = [TextBlock(text)] if text is not None else []
        blocks.extend(tool_calls)
        return cls("assistant", tuple(blocks), **kw)

    @classmethod
    def tool(cls, call_id: str, output: str, name: str = "", **kw: Any) -> Msg:
        return cls("tool", (ToolResultBlock(call_id, output, name),), **kw)

    # -- views --------------------------------------------------------------------------------

    @property
    def text(self) -> str:
        """The text blocks joined (tool outputs not included)."""
        return "".join(b.text for b in self.content if isinstance(b, TextBlock))

    @property
    def tool_uses(self) -> tuple[ToolUseBlock, ...]:
        return tuple(b for b in self.content if isinstance(b, ToolUseBlock))

    @property
    def tool_results(self) -> tuple[ToolResultBlock, ...]:
        return tuple(b for b in self.content if isinstance(b, ToolResultBlock))

    @property
    def payload_chars(self) -> int:
        """Characters of text, tool-input JSON, tool outputs and opaque blocks (their JSON)."""
        total = 0
        for b in self.content:
            if isinstance(b, TextBlock):
                total += len(b.text)
            elif isinstance(b, ToolUseBlock):
                total += len(b.arguments)
            elif isinstance(b, ToolResultBlock):
                total += len(b.output_text) + sum(map(len, b.output_parts_json))
            else:
                total += len(json_text(b.data))
        return total

    def with_(self, **changes: Any) -> Msg:
        """A copy with some fields changed."""
        return replace(self, **changes)

    # -- OpenAI Chat Completions format ---------------------------------------------------------

    @classmethod
    def from_openai(cls, message: Mapping[str, Any], *, index: int | None = None) -> Msg:
        """Convert one OpenAI Chat Completions message. Raises `InvalidMessage`."""
        return _from_openai(message, index)

    def to_openai(self) -> dict[str, Any]:
        """This message as an OpenAI Chat Completions message. A block the format cannot
        carry (reasoning) is left out of it and logged; the message itself keeps it."""
        omitted: Counter[str] = Counter()
        out = _to_openai(self, omitted)
        log_omitted(omitted, 1)
        return out

    # -- storage form -------------------------------------------------------------------------

    def content_json(self) -> list[dict[str, Any]]:
        return [block_to_json(b) for b in self.content]

    def stored_json(self) -> dict[str, Any]:
        """The message as autoctx stores it: every block (reasoning, images, signatures) and
        the metadata, whatever format it came in; what the CLI and the console show beside
        the OpenAI view, which cannot carry reasoning."""
        out: dict[str, Any] = {"role": self.role}
        if self.name is not None:
            out["name"] = self.name
        out["content"] = self.content_json()
        if self.metadata:
            out["metadata"] = dict(self.metadata)
        return out


def json_text(value: Any) -> str:
    """A JSON value as autoctx stores it (compact, non-ASCII kept).

    Raises ValueError for NaN or Infinity: JSON (and PostgreSQL's jsonb) has neither, and
    `add()` refuses them before anything is written.
    """
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def jsonb_order(value: Any) -> Any:
    """A JSON value with every object's keys in the order PostgreSQL's jsonb keeps them
    (shorter keys first, then bytewise), so that what is counted when a message is added is
    what is counted again when it is read back or imported (`autoctx._intake.count_tokens`)."""
    if isinstance(value, Mapping):
        keys = sorted(value, key=lambda k: (len(str(k).encode()), str(k).encode()))
        return {k: jsonb_order(value[k]) for k in keys}
    if isinstance(value, list | tuple):
        return [jsonb_order(v) for v in value]
    return value


class NonJsonNumber(ValueError):
    """NaN, Infinity or -Infinity in a JSON text: Python's json reads them, JSON has none."""


def _refuse_constant(token: str) -> Any:
    raise NonJsonNumber(token)


def json_value(text: str) -> Any:
    """A JSON text parsed as JSON defines it: NaN and Infinity raise `NonJsonNumber` (a
    ValueError), as PostgreSQL and every other JSON reader would refuse them."""
    return json.loads(text, parse_constant=_refuse_constant)


# ---------------------------------------------------------------------------------------------
# Blocks <-> JSON (the JSONB form in the database)
# ---------------------------------------------------------------------------------------------


def block_to_json(block: Block) -> dict[str, Any]:
    if isinstance(block, TextBlock):
        return {"type": "text", "text": block.text}
    if isinstance(block, ToolUseBlock):
        out: dict[str, Any] = {
            "type": "tool_use",
            "id": block.id,
            "name": block.name,
            "arguments": block.arguments,
        }
        if block.extra:
            out["extra"] = dict(block.extra)
        return out
    if isinstance(block, ToolResultBlock):
        output: Any = (
            block.output
            if isinstance(block.output, str)
            else [block_to_json(p) for p in block.output]
        )
        result: dict[str, Any] = {
            "type": "tool_result",
            "tool_use_id": block.tool_use_id,
            "name": block.name,
            "output": output,
        }
        if block.is_error:
            result["is_error"] = True
        if block.extra:
            result["extra"] = dict(block.extra)
        return result
    return {"type": "opaque", "data": dict(block.data)}


def block_from_json(data: Mapping[str, Any]) -> Block:
    kind = data["type"]
    if kind == "text":
        return TextBlock(data["text"])
    if kind == "tool_use":
        return ToolUseBlock(data["id"], data["name"], data["arguments"], data.get("extra") or {})
    if kind == "tool_result":
        raw = data["output"]
        output = (
            raw
            if isinstance(raw, str)
            else tuple(
                OpaqueBlock(p["data"]) if p.get("type") == "opaque" else TextBlock(p["text"])
                for p in raw
            )
        )
        return ToolResultBlock(
            data["tool_use_id"],
            output,
            data.get("name", ""),
            bool(data.get("is_error", False)),
            data.get("extra") or {},
        )
    return OpaqueBlock(data["data"])


# ---------------------------------------------------------------------------------------------
# OpenAI conversion
# ---------------------------------------------------------------------------------------------

#: The Chat Completions content part types (the others are refused at intake).
OPENAI_PART_TYPES = ("text", "image_url", "input_audio", "file", "refusal")
#: Opaque blocks that only the Anthropic Messages format carries (`add()` reads a message that
#: holds one as Anthropic).
ANTHROPIC_ONLY_TYPES = frozenset({"image", "document", "thinking", "redacted_thinking"})
#: A model's reasoning, in each format autoctx stores it: Anthropic's thinking blocks (and Pydantic
#: AI's thinking parts, which take their shape) and the Responses API's reasoning items. Chat
#: Completions has no place for any of them: the OpenAI view leaves them out.
REASONING_TYPES = frozenset({"thinking", "redacted_thinking", "reasoning"})

_ROLE_KEYS = {
    "system": {"role", "content", "name"},
    "developer": {"role", "content", "name"},
    "user": {"role", "content", "name"},
    "assistant": {"role", "content", "name", "tool_calls"},
    "tool": {"role", "content", "tool_call_id"},
}


def _where(index: int | None, role: object = None) -> str:
    where = "message" if index is None else f"message {index}"
    return f"{where} ({role})" if role else where


def _content_blocks(content: Any, where: str) -> tuple[tuple[Block, ...], str]:
    """Blocks of a system/user/assistant content value and the form to give it back in."""
    if isinstance(content, str):
        return (TextBlock(content),), "string"
    if content is None:
        return (), "none"
    if isinstance(content, list):
        blocks: list[Block] = []
        for j, part in enumerate(content):
            if not isinstance(part, Mapping) or not isinstance(part.get("type"), str):
                raise InvalidMessage(
                    f"{where}: content part {j} must be an object with a string 'type', "
                    f"got {type(part).__name__}"
                )
            if set(part) == {"type", "text"} and part["type"] == "text":
                if not isinstance(part["text"], str):
                    raise InvalidMessage(f"{where}: content part {j} has a non-string 'text'")
                blocks.append(TextBlock(part["text"]))
            elif part["type"] in OPENAI_PART_TYPES:
                blocks.append(OpaqueBlock(dict(part)))
            else:
                # A part no Chat Completions model reads: stored as is, it would come back out
                # of to_openai() and fail only at the model call.
                raise InvalidMessage(
                    f"{where}: content part {j} has type {part['type']!r}, which is not a Chat "
                    f"Completions content part ({', '.join(OPENAI_PART_TYPES)}); for an Anthropic "
                    "message, pass it whole (its blocks are recognized by their types)"
                )
        return tuple(blocks), "parts"
    raise InvalidMessage(
        f"{where}: 'content' must be a string, a list of content parts or null, "
        f"got {type(content).__name__}"
    )


def _tool_call(call: Any, j: int, where: str) -> ToolUseBlock:
    if not isinstance(call, Mapping):
        raise InvalidMessage(f"{where}: tool_calls[{j}] must be an object")
    call_id = call.get("id")
    if not isinstance(call_id, str) or not call_id:
        raise InvalidMessage(f"{where}: tool_calls[{j}] needs a non-empty string 'id'")
    fn = call.get("function")
    if not isinstance(fn, Mapping):
        raise InvalidMessage(
            f"{where}: tool_calls[{j}] (id {call_id!r}) needs a 'function' object with "
            "'name' and 'arguments'"
        )
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidMessage(f"{where}: tool_calls[{j}] (id {call_id!r}) needs a function name")
    arguments = fn.get("arguments", "")
    if not isinstance(arguments, str):
        raise InvalidMessage(
            f"{where}: tool_calls[{j}] (id {call_id!r}, {name}) 'arguments' must be a JSON "
            f"string, got {type(arguments).__name__}; pass json.dumps(arguments)"
        )
    extra = {k: v for k, v in call.items() if k not in ("id", "function") and v is not None}
    if extra.get("type") == "function":
        del extra["type"]
    fn_extra = {k: v for k, v in fn.items() if k not in ("name", "arguments") and v is not None}
    if fn_extra:
        extra["function_extra"] = fn_extra
    if "arguments" not in fn:
        extra["arguments_absent"] = True
    return ToolUseBlock(call_id, name, arguments, extra)


def _from_openai(message: Mapping[str, Any], index: int | None) -> Msg:
    if not isinstance(message, Mapping):
        raise InvalidMessage(
            f"{_where(index)}: expected an OpenAI chat message (a dict with 'role'), "
            f"got {type(message).__name__}"
        )
    role = message.get("role")
    where = _where(index, role)
    if role not in _ROLE_KEYS:
        raise InvalidMessage(
            f"{_where(index)}: unknown role {role!r}; use one of system, developer, user, "
            "assistant, tool"
        )
    known = _ROLE_KEYS[role]
    extra = {k: v for k, v in message.items() if k not in known and v is not None}
    openai_meta: dict[str, Any] = {}
    if extra:
        openai_meta["extra"] = extra
    name = message.get("name")
    if name is not None and not isinstance(name, str):
        raise InvalidMessage(f"{where}: 'name' must be a string")
    content = message.get("content")

    blocks: tuple[Block, ...]
    if role == "tool":
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise InvalidMessage(f"{where}: a tool message needs a non-empty 'tool_call_id'")
        output: str | tuple[TextBlock, ...]
        if isinstance(content, str):
            output = content
        elif isinstance(content, list):
            parts, _ = _content_blocks(content, where)
            if not all(isinstance(p, TextBlock) for p in parts):
                raise InvalidMessage(
                    f"{where}: tool message content parts must all be text parts "
                    "({'type': 'text', 'text': ...})"
                )
            output = cast(tuple[TextBlock, ...], parts)
        else:
            raise InvalidMessage(
                f"{where}: tool message 'content' must be a string or a list of text parts"
            )
        blocks = (ToolResultBlock(call_id, output),)
    else:
        blocks, form = _content_blocks(content, where)
        if form != "string":
            openai_meta["content"] = form
        if role == "assistant" and message.get("tool_calls") is not None:
            calls = message["tool_calls"]
            if not isinstance(calls, list):
                raise InvalidMessage(f"{where}: 'tool_calls' must be a list")
            blocks = blocks + tuple(_tool_call(c, j, where) for j, c in enumerate(calls))
            if not calls:
                openai_meta["empty_tool_calls"] = True
        elif role != "assistant" and form == "none":
            raise InvalidMessage(f"{where}: a {role} message needs 'content'")
    if role == "developer":
        openai_meta["role"] = "developer"
        role = "system"
    metadata = {OPENAI_META: openai_meta} if openai_meta else {}
    return Msg(cast(Role, role), blocks, name=name, metadata=metadata)


def opaque_type(block: OpaqueBlock) -> str:
    """The type of an opaque block, for counts and logs (an AgentScope block's own type)."""
    kind = block.data.get("type")
    if isinstance(kind, str):
        return kind
    for value in block.data.values():
        if isinstance(value, Mapping) and isinstance(value.get("type"), str):
            return str(value["type"])
    return "unknown"


def _image_url_part(source: Any) -> dict[str, Any] | None:
    if not isinstance(source, Mapping):
        return None
    if source.get("type") == "base64" and isinstance(source.get("data"), str):
        url = f"data:{source.get('media_type', 'image/png')};base64,{source['data']}"
        return {"type": "image_url", "image_url": {"url": url}}
    if source.get("type") == "url" and isinstance(source.get("url"), str):
        return {"type": "image_url", "image_url": {"url": source["url"]}}
    return None


def openai_part(block: OpaqueBlock) -> dict[str, Any] | None:
    """The Chat Completions content part that carries an opaque block, or None when the format
    has none (reasoning; a document it cannot name; a block of an unknown type)."""
    data = block.data
    kind = data.get("type")
    if kind in OPENAI_PART_TYPES:
        # An OpenAI part, given back as it came in (a text part with extra keys too; so is an
        # Anthropic text block with citations, as before).
        return dict(data)
    if kind in ("input_text", "output_text") and isinstance(data.get("text"), str):
        return {"type": "text", "text": data["text"]}  # Responses text: the text is the part
    if kind == "image":  # Anthropic
        return _image_url_part(data.get("source"))
    if kind == "input_image" and isinstance(data.get("image_url"), str):  # Responses
        return {"type": "image_url", "image_url": {"url": data["image_url"]}}
    if kind == "document":  # Anthropic: a PDF as a file part, a text document as text
        source = data.get("source")
        if not isinstance(source, Mapping):
            return None
        if source.get("type") == "text" and isinstance(source.get("data"), str):
            return {"type": "text", "text": source["data"]}
        media = source.get("media_type")
        if source.get("type") == "base64" and media == "application/pdf":
            file: dict[str, Any] = {"file_data": f"data:{media};base64,{source.get('data')}"}
            if isinstance(data.get("title"), str):
                file["filename"] = data["title"]
            return {"type": "file", "file": file}
    return None


def log_omitted(omitted: Counter[str], messages: int, *, view: str = "to_openai()") -> None:
    """Log (at INFO, no content) the blocks a view left out, by type."""
    if not omitted:
        return
    kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(omitted.items()))
    fmt = "Chat Completions" if view == "to_openai()" else "Anthropic Messages"
    _log.info(
        "%s: left out %d block(s) the %s format cannot carry (%s) in %d message(s); they "
        "stay stored, and the export and `autoctx show --json` carry them",
        view,
        sum(omitted.values()),
        fmt,
        kinds,
        messages,
    )


def _to_openai(msg: Msg, omitted: Counter[str]) -> dict[str, Any]:
    meta: Mapping[str, Any] = msg.metadata.get(OPENAI_META) or {}
    out: dict[str, Any] = {"role": meta.get("role", msg.role)}
    if msg.role == "tool":
        results = msg.tool_results
        if len(results) != 1:
            # Several results in one message exist only in autoctx's own format; the OpenAI
            # format needs one message per result (see `to_openai_messages`).
            raise InvalidMessage(
                f"message {msg.id} (tool) holds {len(results)} tool results; convert it with "
                "to_openai_messages(), which gives one OpenAI tool message per result"
            )
        result = results[0]
        # `is_error` has no place in Chat Completions: the output text is what the model reads.
        # Nor has an image: a tool message holds text parts only, so the image is left out.
        if isinstance(result.output, str):
            out["content"] = result.output
        else:
            out["content"] = [
                {"type": "text", "text": p.text} for p in result.output if isinstance(p, TextBlock)
            ]
            for part in result.output:
                if isinstance(part, OpaqueBlock):
                    omitted[opaque_type(part)] += 1
        out["tool_call_id"] = result.tool_use_id
    else:
        content_blocks: list[TextBlock | OpaqueBlock] = []
        parts: list[dict[str, Any]] = []
        for b in msg.content:
            if isinstance(b, TextBlock):
                content_blocks.append(b)
                parts.append({"type": "text", "text": b.text})
            elif isinstance(b, OpaqueBlock):
                mapped = openai_part(b)
                if mapped is None:
                    # Per block, never the whole message: a thinking block's signature verifies
                    # only against its own provider's models, and Chat Completions has no field
                    # for reasoning. The block stays stored; `to_anthropic()` gives it back.
                    omitted[opaque_type(b)] += 1
                else:
                    content_blocks.append(b)
                    parts.append(mapped)
        form = meta.get("content")
        calls = msg.tool_uses
        if form is None and len(content_blocks) == 1 and isinstance(content_blocks[0], TextBlock):
            out["content"] = content_blocks[0].text
        elif not content_blocks and (form in (None, "none") or len(msg.content) > len(calls)):
            # Nothing (left) to show: null, as the API writes it beside calls; empty text for
            # a message whose every block was left out, as it has neither calls nor content.
            left_out_all = len(msg.content) > len(calls) and not calls
            out["content"] = "" if left_out_all else None
        else:
            out["content"] = parts
        if msg.name is not None:
            out["name"] = msg.name
        if calls or meta.get("empty_tool_calls"):
            out["tool_calls"] = [_call_to_openai(c) for c in calls]
    for key, value in (meta.get("extra") or {}).items():
        out.setdefault(key, value)
    return out


def _call_to_openai(call: ToolUseBlock) -> dict[str, Any]:
    extra = dict(call.extra)
    fn: dict[str, Any] = {"name": call.name}
    extra.pop(ANTHROPIC_META, None)  # e.g. cache_control, which Chat Completions has not
    if not extra.pop("arguments_absent", False):
        fn["arguments"] = call.arguments
    fn.update(extra.pop("function_extra", {}))
    out: dict[str, Any] = {"id": call.id, "type": extra.pop("type", "function"), "function": fn}
    out.update(extra)
    return out


def from_openai_messages(messages: Iterable[Mapping[str, Any]]) -> list[Msg]:
    """Convert a list of OpenAI chat messages. Raises `InvalidMessage` naming the bad one."""
    return [Msg.from_openai(m, index=i) for i, m in enumerate(messages)]


def openai_view(messages: Iterable[Msg]) -> tuple[list[dict[str, Any]], Counter[str], int]:
    """Messages as OpenAI chat messages, how many blocks of each type the format could not
    carry and were left out, and in how many messages. A message with several tool results
    (which autoctx's own format allows) becomes one tool message per result."""
    out: list[dict[str, Any]] = []
    omitted: Counter[str] = Counter()
    touched = 0
    for m in messages:
        before = omitted.total()
        if m.role == "tool" and len(m.tool_results) > 1:
            for r in m.tool_results:
                out.append(_to_openai(m.with_(content=(r,)), omitted))
        else:
            out.append(_to_openai(m, omitted))
        touched += omitted.total() > before
    return out, omitted, touched


def to_openai_messages(messages: Iterable[Msg]) -> list[dict[str, Any]]:
    """Convert messages to OpenAI chat messages (see `openai_view`); what the format cannot
    carry (reasoning) is left out, block by block, and the count logged."""
    out, omitted, touched = openai_view(messages)
    log_omitted(omitted, touched)
    return out


def as_openai_dict(value: object) -> Any:
    """The official `openai` client's own objects (pydantic models: a response's message, a
    tool call) as the dicts of the wire format, so that they are taken wherever a dict is;
    anything else unchanged. Fields the server did not send, or sent as null, are left out,
    as the wire format reads absent and null alike."""
    dump = getattr(value, "model_dump", None)
    if callable(dump) and hasattr(type(value), "model_fields"):
        return dump(mode="json", exclude_none=True)
    return value
