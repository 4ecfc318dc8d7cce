"""Whether an Agents SDK session's runs go through its input filter (docs/design.md §8, "no
silent overflow").

Without `run_config()`, the SDK builds each model call of a run from its own list (the history
read at the start plus every item of the run), so a long run sends everything it produced, past
the window, while the session compresses only what it stores. The session cannot see the
requests, but it sees the run's model outputs come to `add_items`: a model output that reaches
it before any model call went through its filter is a run without the filter.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Final

logger = logging.getLogger("autoctx")

#: Item types only a model call produces.
_MODEL_OUTPUTS: Final = frozenset({"function_call", "reasoning", "computer_call"})


def _is_model_output(item: Any) -> bool:
    if not isinstance(item, Mapping):
        return False
    kind = item.get("type")
    return kind in _MODEL_OUTPUTS or (kind in (None, "message") and item.get("role") == "assistant")


class FilterCheck:
    """One session object's record: has a model call gone through its filter, and was the
    warning said (once per session object)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._filtered = False
        self._warned = False

    def filtered(self) -> None:
        """A model call of a run went through the session's filter."""
        self._filtered = True

    def added(self, items: Sequence[Any], session_id: str) -> None:
        """Items come to `add_items`: warn (once) when they hold a model's output and no model
        call went through the filter."""
        if self._filtered or self._warned or not any(map(_is_model_output, items)):
            return
        with self._lock:
            if self._warned:
                return
            self._warned = True
        logger.warning(
            "autoctx: session %r: a run stored a model's output without the session's "
            "call_model_input_filter, so each model call of that run was sent every item of "
            "the run, not the compressed context, and may exceed the window; pass "
            "run_config=session.run_config() to Runner.run (logged once per session)",
            session_id,
        )


def sdk_tool_definitions(agent: Any) -> list[dict[str, Any]]:
    """What the SDK sends of `agent`'s tools at each model call, as far as the filter can see
    it: each function tool's name, description and JSON schema; any other tool by its name
    (hosted tools are defined by the provider, not sent as schemas)."""
    out: list[dict[str, Any]] = []
    for tool in getattr(agent, "tools", None) or ():
        name = getattr(tool, "name", type(tool).__name__)
        schema = getattr(tool, "params_json_schema", None)
        if isinstance(schema, Mapping):
            description = getattr(tool, "description", "") or ""
            out.append({"name": name, "description": description, "parameters": schema})
        else:
            out.append({"name": name})
    return out
