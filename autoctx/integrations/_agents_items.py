"""The Agents SDK's items as autoctx messages, and back: the codec of the session adapter
(`autoctx.integrations.openai_agents`), kept apart from the session it serves.

An item becomes a message whose metadata (`META_KEY`) keeps the item's skeleton (everything
but its text), so that `message_items` gives the SDK back exactly the items it stored; a
message autoctx wrote (a summary, a preview) becomes the items a model API accepts. Pure: no
SDK import, no database.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, cast

from .._arguments import unstorable
from .._errors import InvalidMessage
from .._messages import (
    Block,
    Msg,
    OpaqueBlock,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)

#: Metadata key under which a message keeps what it needs to give its items back exactly.
META_KEY = "agents"

Item = dict[str, Any]

_INPUT_ROLES = {"user": "user", "system": "system", "developer": "system"}


# ---------------------------------------------------------------------------------------------
# Items -> messages
# ---------------------------------------------------------------------------------------------


def _storable(text: str) -> bool:
    """PostgreSQL text cannot hold NUL, and lone surrogates are not UTF-8."""
    return unstorable(text) is None


def _quote(text: str) -> tuple[str, bool]:
    """`text` as it can be stored, and whether it had to be escaped.

    Tools do return binary output: a text PostgreSQL cannot store is kept as its JSON string
    literal (ASCII, NUL as \\u0000), which `_unquote` turns back into the exact text.
    """
    if _storable(text):
        return text, False
    return json.dumps(text), True


def _unquote(text: str, quoted: bool) -> str:
    return cast(str, json.loads(text)) if quoted else text


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return False
    return True


def _without(item: Mapping[str, Any], *keys: str) -> Item:
    return {k: v for k, v in item.items() if k not in keys}


def _encode_text_part(part: Mapping[str, Any]) -> tuple[TextBlock, Item]:
    """A content part with text: the text as a block, the rest of the part in its skeleton."""
    text, quoted = _quote(part["text"])
    return TextBlock(text), {"rest": _without(part, "text"), "q": quoted}


def _decode_text_part(spec: Mapping[str, Any], text: str) -> Item:
    """The content part `_encode_text_part` made `spec` and the text block of."""
    return {**spec["rest"], "text": _unquote(text, spec["q"])}


def _encode_message(item: Mapping[str, Any], blocks: list[Block]) -> Item:
    """A message item's text as text blocks, the rest in its skeleton."""
    start = len(blocks)
    rest = _without(item, "content")
    skeleton: Item = {"kind": "message", "rest": rest}
    content = item.get("content")
    if isinstance(content, str):
        text, quoted = _quote(content)
        blocks.append(TextBlock(text))
        skeleton["content"] = {"text": True, "q": quoted}
    elif isinstance(content, list):
        parts: list[Item] = []
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                block, spec = _encode_text_part(part)
                blocks.append(block)
                parts.append(spec)
            elif isinstance(part, Mapping):
                blocks.append(OpaqueBlock(dict(part)))
                parts.append({"opaque": True})
            else:
                blocks.append(OpaqueBlock({"value": part}))
                parts.append({"opaque": True, "wrapped": True})
        skeleton["content"] = parts
    elif "content" in item:
        rest["content"] = content
    skeleton["n"] = len(blocks) - start
    return skeleton


def _encode_call(item: Mapping[str, Any], blocks: list[Block]) -> Item:
    rest = _without(item, "call_id", "name", "arguments")
    skeleton: Item = {"kind": "call", "rest": rest, "n": 1}
    raw = item.get("arguments")
    if isinstance(raw, str):
        if _storable(raw) and _is_json(raw):
            arguments = raw
        else:
            # A model's broken JSON is still the call it made: stored as a JSON string
            # literal (valid JSON, so the call stays valid) and given back as written.
            arguments = json.dumps(raw)
            skeleton["args"] = "quoted"
    else:
        if "arguments" in item:
            rest["arguments"] = raw
        arguments = "{}"
        skeleton["args"] = "rest"
    blocks.append(ToolUseBlock(item["call_id"], item["name"], arguments))
    return skeleton


def _encode_output(item: Mapping[str, Any]) -> tuple[ToolResultBlock, Item]:
    rest = _without(item, "call_id", "output")
    skeleton: Item = {"kind": "output", "rest": rest, "n": 1}
    raw = item.get("output")
    output: str | tuple[TextBlock, ...]
    if isinstance(raw, str):
        output, quoted = _quote(raw)
        skeleton["output"] = {"text": True, "q": quoted}
    elif isinstance(raw, list):
        texts: list[TextBlock] = []
        parts: list[Item] = []
        for part in raw:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                block, spec = _encode_text_part(part)
                texts.append(block)
                parts.append(spec)
            else:
                # Images and files of a tool's output have no place in a tool_result block
                # (text only); they are kept whole in the skeleton.
                parts.append({"keep": part})
        output = tuple(texts)
        skeleton["output"] = parts
    else:
        if "output" in item:
            rest["output"] = raw
        output = json.dumps(raw, ensure_ascii=False) if "output" in item else ""
        skeleton["output"] = "rest"
    return ToolResultBlock(item["call_id"], output), skeleton


def _classify(item: Mapping[str, Any]) -> str:
    kind = item.get("type")
    if kind in (None, "message") and "role" in item:
        role = item.get("role")
        if role in _INPUT_ROLES:
            return "input"
        if role == "assistant":
            return "assistant"
        return "other"
    call_id = item.get("call_id")
    has_id = isinstance(call_id, str) and bool(call_id)
    if kind == "function_call" and has_id and isinstance(item.get("name"), str) and item["name"]:
        return "call"
    if kind == "function_call_output" and has_id:
        return "output"
    return "other"


def as_dict(item: Any, index: int) -> Mapping[str, Any]:
    if isinstance(item, Mapping):
        _check_plain_json(item, index)
        return item
    dump = getattr(item, "model_dump", None)
    if callable(dump):
        # The SDK's own item models, as the SDK itself turns them into input items.
        return cast(Mapping[str, Any], dump(exclude_unset=True, mode="json"))
    raise InvalidMessage(
        f"item {index}: expected a Responses input item (a dict), got {type(item).__name__}"
    )


_JSON_SCALARS = (str, int, float, bool, type(None))


def _check_plain_json(item: Mapping[str, Any], index: int) -> None:
    """Refuse, naming the field, a value the SDK's own stores could not serialize either
    (they raise `TypeError` from `json.dumps`; `InvalidMessage` is one), before any of it is
    split into blocks and metadata, where the error would name the wrong part."""
    stack: list[tuple[Any, str]] = [(item, "")]
    while stack:
        node, field = stack.pop()
        if isinstance(node, Mapping):
            for key, child in node.items():
                if not isinstance(key, str):
                    raise InvalidMessage(
                        f"item {index}, field {field or '(the item)'!r}: has a key of type "
                        f"{type(key).__name__}; JSON keys are strings"
                    )
                stack.append((child, f"{field}.{key}" if field else key))
        elif isinstance(node, list | tuple):
            stack.extend((child, f"{field}[{i}]") for i, child in enumerate(node))
        elif not isinstance(node, _JSON_SCALARS):
            raise InvalidMessage(
                f"item {index}, field {field!r}: holds a {type(node).__name__}, which is not "
                "JSON-serializable; pass JSON values (str, numbers, booleans, None, lists, dicts)"
            )


def _meta(skeletons: list[Item]) -> dict[str, Any]:
    return {META_KEY: {"items": skeletons}}


def items_to_messages(items: Sequence[Any]) -> list[Msg]:
    """Responses-API input items as autoctx messages (see the module docstring)."""
    return [msg for msg, _ in convert(items)]


def convert(items: Sequence[Any]) -> list[tuple[Msg, list[Mapping[str, Any]]]]:
    """Each message with the items it stands for."""
    out: list[tuple[Msg, list[Mapping[str, Any]]]] = []
    group_blocks: list[Block] = []
    group_skeletons: list[Item] = []
    group_items: list[Mapping[str, Any]] = []

    def flush() -> None:
        if group_skeletons:
            msg = Msg("assistant", tuple(group_blocks), metadata=_meta(list(group_skeletons)))
            out.append((msg, list(group_items)))
            group_blocks.clear()
            group_skeletons.clear()
            group_items.clear()

    for index, raw in enumerate(items):
        item = as_dict(raw, index)
        kind = _classify(item)
        if kind == "input":
            flush()
            blocks: list[Block] = []
            skeleton = _encode_message(item, blocks)
            role = _INPUT_ROLES[item["role"]]
            out.append((_single(Msg(cast(Any, role), tuple(blocks)), skeleton, item), [item]))
            continue
        if kind == "output":
            flush()
            block, skeleton = _encode_output(item)
            out.append((_single(Msg("tool", (block,)), skeleton, item), [item]))
            continue
        if kind == "assistant":
            group_skeletons.append(_encode_message(item, group_blocks))
        elif kind == "call":
            group_skeletons.append(_encode_call(item, group_blocks))
        else:
            group_blocks.append(OpaqueBlock(dict(item)))
            group_skeletons.append({"kind": "opaque", "n": 1})
        group_items.append(item)
    flush()
    return out


def _single(msg: Msg, skeleton: Item, item: Mapping[str, Any]) -> Msg:
    """A one-item message, with its skeleton only when the plain reading would not give the
    item back: the common `{"role": "user", "content": "..."}` and string tool outputs need
    none, which keeps them lean in the database and cheap to read."""
    plain = _generic_items(msg.role, msg.content_json())
    if len(plain) == 1 and plain[0][0] == item:
        return msg
    return msg.with_(metadata=_meta([skeleton]))


def plain_copy(value: Any) -> Any:
    """A copy of a JSON value, sharing its strings: O(nodes), not O(bytes) like a decode."""
    if type(value) is dict:
        return {k: plain_copy(v) for k, v in value.items()}
    if type(value) is list:
        return [plain_copy(v) for v in value]
    return value


# ---------------------------------------------------------------------------------------------
# Messages -> items
# ---------------------------------------------------------------------------------------------
#
# Both directions of reading work on the stored JSON form of the blocks (`block_to_json`), so
# that `get_items` turns rows into items without building `Msg` objects first.


def _decode_skeleton(
    skeleton: Mapping[str, Any], blocks: Sequence[Mapping[str, Any]], at: int
) -> Item:
    kind = skeleton["kind"]
    if kind == "opaque":
        return dict(blocks[at]["data"])
    item: Item = dict(skeleton.get("rest") or {})
    if kind == "message":
        spec = skeleton.get("content")
        if isinstance(spec, Mapping):
            item["content"] = _unquote(blocks[at]["text"], spec["q"])
        elif isinstance(spec, list):
            parts: list[Any] = []
            for k, part in enumerate(spec):
                block = blocks[at + k]
                if part.get("opaque"):
                    data = block["data"]
                    parts.append(data["value"] if part.get("wrapped") else dict(data))
                else:
                    parts.append(_decode_text_part(part, block["text"]))
            item["content"] = parts
        return item
    block = blocks[at]
    if kind == "call":
        item["call_id"] = block["id"]
        item["name"] = block["name"]
        mode = skeleton.get("args")
        if mode is None:
            item["arguments"] = block["arguments"]
        elif mode == "quoted":
            item["arguments"] = json.loads(block["arguments"])
        return item
    # kind == "output"
    item["call_id"] = block["tool_use_id"]
    spec = skeleton.get("output")
    output = block["output"]
    if isinstance(spec, Mapping):
        item["output"] = _unquote(output, spec["q"])
    elif isinstance(spec, list):
        texts = iter(output if isinstance(output, list) else [])
        parts = []
        for part in spec:
            if "keep" in part:
                parts.append(part["keep"])
            else:
                parts.append(_decode_text_part(part, next(texts)["text"]))
        item["output"] = parts
    return item


def _output_text(output: Any) -> str:
    if isinstance(output, str):
        return output
    return "".join(p.get("text", "") for p in output if isinstance(p, Mapping))


def _generic_items(role: str, blocks: Sequence[Mapping[str, Any]]) -> list[tuple[Item, list[int]]]:
    """Items of a message that carries no skeleton: a summary or preview autoctx wrote, or a
    message added through autoctx's own API. Each item with the blocks it came from."""
    if role == "tool":
        return [
            (
                {
                    "type": "function_call_output",
                    "call_id": b["tool_use_id"],
                    "output": _output_text(b["output"]),
                },
                [k],
            )
            for k, b in enumerate(blocks)
            if b.get("type") == "tool_result"
        ]
    texts = [k for k, b in enumerate(blocks) if b.get("type") == "text"]
    others = [k for k, b in enumerate(blocks) if b.get("type") == "opaque"]
    calls = [k for k, b in enumerate(blocks) if b.get("type") == "tool_use"]
    out: list[tuple[Item, list[int]]] = []
    if role == "assistant":
        if others:
            # Only a message added through autoctx's own API carries opaque content parts
            # here; they stay parts, next to the text.
            parts: list[Any] = [
                {"type": "output_text", "text": blocks[k]["text"], "annotations": []}
                if k in texts
                else dict(blocks[k]["data"])
                for k in sorted(texts + others)
            ]
            out.append(
                ({"type": "message", "role": "assistant", "content": parts}, sorted(texts + others))
            )
        elif texts or not calls:
            # The easy form: every model API and the SDK's Chat Completions converter take an
            # assistant message with string content and no id (an output message with
            # output_text parts needs an id that a summary does not have).
            text = "".join(blocks[k]["text"] for k in texts)
            out.append(({"type": "message", "role": "assistant", "content": text}, texts))
        out.extend(
            (
                {
                    "type": "function_call",
                    "call_id": blocks[k]["id"],
                    "name": blocks[k]["name"],
                    "arguments": blocks[k]["arguments"],
                },
                [k],
            )
            for k in calls
        )
        return out
    content: Any
    if others:
        content = [
            {"type": "input_text", "text": blocks[k]["text"]}
            if k in texts
            else dict(blocks[k]["data"])
            for k in sorted(texts + others)
        ]
    else:
        content = "".join(blocks[k]["text"] for k in texts)
    return [({"role": role, "content": content}, list(range(len(blocks))))]


def items_with_blocks(
    role: str, kind: str, blocks: Sequence[Mapping[str, Any]], metadata: Mapping[str, Any] | None
) -> list[tuple[Item, list[int]]]:
    agents_meta = (metadata or {}).get(META_KEY) if kind == "original" else None
    if not isinstance(agents_meta, Mapping):
        return _generic_items(role, blocks)
    out: list[tuple[Item, list[int]]] = []
    at = 0
    for skeleton in agents_meta["items"]:
        n = int(skeleton["n"])
        out.append((_decode_skeleton(skeleton, blocks, at), list(range(at, at + n))))
        at += n
    return out


def message_items(msg: Msg) -> list[Item]:
    """The Responses-API input items a stored message stands for."""
    return [
        item for item, _ in items_with_blocks(msg.role, msg.kind, msg.content_json(), msg.metadata)
    ]
