"""`context_reload`: the tool an agent calls to get offloaded context back.

The handler answers in plain text and turns every error into a plain answer, so a model's bad
call never raises into the agent loop. It only ever sees the offloads of its own session.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from typing import Any

from ._config import AutoContextConfig
from ._errors import InvalidOffloadId, OffloadNotFound
from ._messages import Msg, NonJsonNumber, ToolUseBlock, as_openai_dict, json_value
from ._transcript import render_transcript

TOOL_NAME = "context_reload"

NOT_FOUND_ANSWER = "No offloaded context with that id in this session."


def parse_offload_id(value: object) -> uuid.UUID:
    """A uuid from a string; `InvalidOffloadId` for an empty or malformed one."""
    if not isinstance(value, str):
        raise InvalidOffloadId(
            f"the offload id must be a string (the uuid from an offload tag), got "
            f"{type(value).__name__}"
        )
    if not value.strip():
        raise InvalidOffloadId("the offload id is empty; pass the uuid from an offload tag")
    text = value.strip()
    try:
        parsed = uuid.UUID(text)
    except ValueError:
        # Not quoted: what a model passes here may be any text of the conversation.
        raise InvalidOffloadId(
            f"the value given ({len(text)} characters) is not an offload id (expected a uuid "
            "such as '123e4567-e89b-12d3-a456-426614174000', from an offload tag)"
        ) from None
    if str(parsed) != text.lower() and parsed.hex != text.lower():
        raise InvalidOffloadId("the offload id is not a canonical uuid; copy it from the tag")
    return parsed


def reload_tool_definition(page_chars: int) -> dict[str, Any]:
    """The OpenAI function-tool definition of `context_reload`."""
    return {
        "type": "function",
        "function": {
            "name": TOOL_NAME,
            "description": (
                "Reload context that was compressed to save space. Messages that end with "
                "<!-- CONTEXT_OFFLOAD: uuid=... --> replace original messages; call this with "
                "that uuid to read the originals. Long results come in pages of about "
                f"{page_chars} characters: call again with the offset the answer gives."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "uuid": {
                        "type": "string",
                        "description": "The uuid from a CONTEXT_OFFLOAD tag.",
                    },
                    "offset": {
                        "type": "integer",
                        "minimum": 0,
                        "description": "Character offset of the page to read (default 0).",
                    },
                },
                "required": ["uuid"],
                "additionalProperties": False,
            },
        },
    }


def tool_definitions(config: AutoContextConfig) -> list[dict[str, Any]]:
    """The OpenAI function-tool definitions of a memory's model tools, for `config`."""
    return [reload_tool_definition(config.reload_page_chars)]


def answer_reload_call(
    arguments: str | Mapping[str, Any],
    reload: Callable[[uuid.UUID], list[Msg]],
    page_chars: int,
) -> str:
    """Answer one `context_reload` call with text (never raises for a bad call)."""
    if isinstance(arguments, str):
        try:
            args = json_value(arguments)
        except NonJsonNumber:
            return (
                'Invalid arguments: NaN and Infinity are not JSON; pass {"uuid": "..."} '
                "with an integer offset."
            )
        except RecursionError:
            # A hostile nesting depth: Python's json recurses once per level.
            return 'Invalid arguments: nested far too deep; expected JSON like {"uuid": "..."}.'
        except ValueError:
            return 'Invalid arguments: expected JSON like {"uuid": "..."}.'
    elif isinstance(arguments, Mapping):
        args = dict(arguments)
    else:
        return (
            "Invalid arguments: expected a JSON object text or a dict like "
            f'{{"uuid": "..."}}, got {type(arguments).__name__}.'
        )
    if not isinstance(args, dict):
        return 'Invalid arguments: expected a JSON object like {"uuid": "..."}.'
    raw = args.get("uuid")
    if raw is None:
        return 'Missing uuid: pass the uuid of an offload tag as {"uuid": "..."}.'
    if not isinstance(raw, str):
        return (
            f"Invalid uuid: it must be a string, got {type(raw).__name__}; copy the uuid that "
            "follows 'uuid=' in an offload tag."
        )
    if isinstance(raw, str) and not raw.strip():
        # Answers never spell out the tag or its marker word: they land in the context, where
        # either would read as an offload marker to the model and to the summary checks.
        return "Empty uuid: copy the uuid that follows 'uuid=' in an offload tag."
    try:
        offload = parse_offload_id(raw)
    except InvalidOffloadId as exc:
        return f"Invalid uuid: {exc}"
    offset = args.get("offset", 0)
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        return "Invalid offset: pass a non-negative integer character offset."
    try:
        msgs = reload(offload)
    except OffloadNotFound:
        return NOT_FOUND_ANSWER
    # Tags stay visible: a reloaded summary points at its own offload, one level further down.
    text = render_transcript(msgs, keep_tags=True)
    if offset >= len(text) and offset > 0:
        return f"Offset {offset} is past the end: the offloaded context has {len(text)} characters."
    page = text[offset : offset + page_chars]
    end = offset + len(page)
    if end < len(text):
        return (
            f"{page}\n[page: characters {offset}-{end} of {len(text)}; call {TOOL_NAME} with "
            f"offset={end} for the next page]"
        )
    return page


def call_arguments(call: ToolUseBlock | Mapping[str, Any]) -> tuple[str, str | Mapping[str, Any]]:
    """(tool name, arguments) of an OpenAI tool call dict or a `ToolUseBlock`; a call of any
    other shape names no tool (the handler then answers that it does not know it)."""
    if isinstance(call, ToolUseBlock):
        return call.name, call.arguments
    call = as_openai_dict(call)  # the `openai` client's tool-call object
    if not isinstance(call, Mapping):
        return "", {}
    fn = call.get("function", call)
    if not isinstance(fn, Mapping):
        return "", {}
    name = fn.get("name", "")
    # Arguments of the wrong type are passed on as they are, for the answer to explain them.
    return name if isinstance(name, str) else "", fn.get("arguments", "{}")
