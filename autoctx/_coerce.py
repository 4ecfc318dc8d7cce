"""What `add()` accepts, in any supported format, as `Msg`s.

Its own module because it reads both formats: the Anthropic codec (`_anthropic`) is built on
the message model (`_messages`), so the one function that dispatches between OpenAI and
Anthropic dicts lives above both, and `_messages` never imports the codec back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ._anthropic import from_anthropic, is_anthropic
from ._errors import InvalidMessage
from ._messages import Msg, as_openai_dict


def coerce_messages(
    value: Msg | Mapping[str, Any] | Iterable[Msg | Mapping[str, Any]],
) -> list[Msg]:
    """What `add()` accepts: one `Msg`, one OpenAI or Anthropic message dict (or the official
    clients' message objects), or a list mixing them. An Anthropic message is recognized by its
    blocks (`tool_use`, `tool_result`, `image`, `document`, `thinking`, `redacted_thinking`);
    one whose turn carries tool results becomes a tool message (and a user message for any
    text after them)."""

    def one(item: Mapping[str, Any], i: int) -> list[Msg]:
        if is_anthropic(item):
            return from_anthropic(item, index=i)
        return [Msg.from_openai(item, index=i)]

    value = as_openai_dict(value)
    if isinstance(value, Msg):
        return [value]
    if isinstance(value, Mapping):
        return one(value, 0)
    if isinstance(value, str | bytes):
        raise InvalidMessage(
            "add() takes a Msg, an OpenAI or Anthropic message dict or a list of them, not a "
            "string; wrap text as Msg.user(text)"
        )
    if not isinstance(value, Iterable):
        raise InvalidMessage(
            f"add() takes a Msg, an OpenAI or Anthropic message dict or a list of them, got "
            f"{type(value).__name__}"
        )
    out: list[Msg] = []
    for i, item in enumerate(value):
        item = as_openai_dict(item)
        if isinstance(item, Msg):
            out.append(item)
        elif isinstance(item, Mapping):
            out.extend(one(item, i))
        else:
            raise InvalidMessage(
                f"message {i}: expected a Msg or an OpenAI or Anthropic message dict, got "
                f"{type(item).__name__}"
            )
    return out
