"""S5: large messages in the current round -> conservative summary (LLM), under token pressure.

Only the text/output of the message is summarized; its tool_use/tool_result ids and names stay,
so an edit here never breaks a tool group. The compressor builds the replacement that way.

The current round's user message is a candidate too when it alone is large (a pasted log or
file): its first `preview_chars` characters stay verbatim and the rest is summarized.
"""

from __future__ import annotations

from typing import Final

from .._config import AutoContextConfig
from .._plans import Edit, PlanContext, Snapshot
from ._common import CONTEXT_TOOL_NAMES, Layout, has_failed, layout_of, make_edit

STRATEGY: Final = 5


def plan_s5(snapshot: Snapshot, config: AutoContextConfig, ctx: PlanContext) -> list[Edit]:
    """One edit per large original message after the latest user message."""
    if not ctx.token_pressure:
        return []
    lay = layout_of(snapshot, config, ctx.layouts)
    first = lay.latest_user if lay.latest_user is not None else lay.round_start
    return [
        make_edit(snapshot, STRATEGY, i, i + 1, "large_summary")
        for i in lay.large_in(first, len(lay))
        if _summarizable(lay, i) and not has_failed(snapshot, ctx, i, i + 1)
    ]


def _summarizable(lay: Layout, i: int) -> bool:
    """Whether large message `i` may be summarized alone."""
    m = lay.metas[i]
    return (
        # Previews and summaries of every kind are never summarized alone again.
        m.kind == "original"
        # The current user message is protected from every other rule; S5 may shorten it
        # (docs/design.md §3), unless the caller pinned it.
        and (not lay.is_protected(i) or (i == lay.latest_user and not lay.pinned[i]))
        # An agent that just reloaded an offload (or searched for what it knew) must not see
        # the answer compressed straight back.
        and not (m.role == "tool" and CONTEXT_TOOL_NAMES.intersection(m.tool_names))
        and not lay.touches_pending(i, i + 1)
    )
