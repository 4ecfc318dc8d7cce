"""What each model call sends beside the working context, measured (docs/design.md §2, "room
for what is not a message"): the tool definitions and the instructions. Their tokens come off
the window (`AutoContextConfig.reserve_tokens`) unless the caller set the reserve."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

from ._config import AutoContextConfig, _Derived, _given
from ._tokens import TokenCounter

#: The framing a provider adds around each tool definition and around the instructions (the
#: per-message overhead of docs/design.md §2 is 4; a definition's wrapper costs about as much).
_FRAMING: Final = 8


def measure(
    counter: TokenCounter, tools: Sequence[Mapping[str, Any]], instructions: str | None
) -> int:
    """The tokens of `tools` (their JSON definitions) and `instructions`."""
    total = 0
    for tool in tools:
        total += counter.count(json.dumps(tool, sort_keys=True, default=str)) + _FRAMING
    if instructions:
        total += counter.count(instructions) + _FRAMING
    return total


def kept_measure(config: AutoContextConfig, stored: object) -> AutoContextConfig:
    """`config`, given to open a session, with the reserve measured for the session before
    when the caller did not set one: the measure stays until an integration measures again
    (a worker reading the record in between keeps the room)."""
    if _given(config.reserve_tokens) or not isinstance(stored, Mapping):
        return config
    measured = stored.get("reserve_tokens")
    if "reserve_tokens" not in stored.get("derived", ()) or not isinstance(measured, int):
        return config
    if isinstance(measured, bool) or not 0 <= measured <= config.max_tokens // 2:
        return config  # a window changed under it: measured again at the next model call
    return dataclasses.replace(config, reserve_tokens=_Derived(measured))


def with_measured(config: AutoContextConfig, measured: int) -> AutoContextConfig | None:
    """`config` with `measured` as its reserve, or None when nothing changes (the caller set
    the reserve, or the measure is the one recorded)."""
    if _given(config.reserve_tokens) or config.reserve_tokens == measured:
        return None
    return dataclasses.replace(config, reserve_tokens=_Derived(measured))
