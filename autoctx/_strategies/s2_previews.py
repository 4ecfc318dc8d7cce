"""S2: large messages outside the protected tail -> preview (no LLM).

S3 (`s3_tail_previews`) is the same rule with the last `last_keep` messages as candidates too;
both share `preview_edits`.
"""

from __future__ import annotations

from typing import Final

from .._config import AutoContextConfig
from .._plans import Edit, PlanContext, Snapshot
from ._common import Layout, has_failed, layout_of, make_edit

STRATEGY: Final = 2


def plan_s2(snapshot: Snapshot, config: AutoContextConfig, ctx: PlanContext) -> list[Edit]:
    """One preview edit per large message below H and below the last `last_keep` messages."""
    lay = layout_of(snapshot, config, ctx.layouts)
    return preview_edits(snapshot, config, ctx, lay, STRATEGY, min(lay.history_end, lay.tail_start))


def preview_edits(
    snapshot: Snapshot,
    config: AutoContextConfig,
    ctx: PlanContext,
    lay: Layout,
    strategy: int,
    limit: int,
) -> list[Edit]:
    """One edit [i, i + 1) per message below `limit` that may be turned into a preview."""
    return [
        make_edit(snapshot, strategy, i, i + 1, "preview")
        for i in lay.large_in(0, limit)
        if _previewable(lay, i) and not has_failed(snapshot, ctx, i, i + 1)
    ]


def _previewable(lay: Layout, i: int) -> bool:
    """Whether large message `i` may be turned into a preview."""
    m = lay.metas[i]
    return (
        # Only originals: previews and summaries are never offloaded again (docs/design.md §3).
        m.kind == "original"
        # A preview is plain text; turning a tool_use message into one would orphan its results.
        and not m.call_ids
        and not lay.is_protected(i)
        and not lay.touches_pending(i, i + 1)
    )
