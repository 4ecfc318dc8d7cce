"""S3: large messages, the protected tail included -> preview (no LLM).

As S2, but the last `last_keep` messages are candidates too; still nothing at or after H.
"""

from __future__ import annotations

from typing import Final

from .._config import AutoContextConfig
from .._plans import Edit, PlanContext, Snapshot
from ._common import layout_of
from .s2_previews import preview_edits

STRATEGY: Final = 3


def plan_s3(snapshot: Snapshot, config: AutoContextConfig, ctx: PlanContext) -> list[Edit]:
    """One preview edit per large message below H, tail included."""
    lay = layout_of(snapshot, config, ctx.layouts)
    return preview_edits(snapshot, config, ctx, lay, STRATEGY, lay.history_end)
