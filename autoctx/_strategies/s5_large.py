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
from ._common import (
    has_failed,
    kept_step_start,
    layout_of,
    make_edit,
    step_shrinkable,
    summarizable_alone,
)

STRATEGY: Final = 5


def plan_s5(snapshot: Snapshot, config: AutoContextConfig, ctx: PlanContext) -> list[Edit]:
    """One edit per large original message after the latest user message; the latest step's
    messages only when the step does not fit (then each one a summary can gain on)."""
    if not ctx.token_pressure:
        return []
    lay = layout_of(snapshot, config, ctx.layouts)
    first = lay.latest_user if lay.latest_user is not None else lay.round_start
    # The latest step is what the model is about to read: it stays whole after S6's summary
    # when it fits under the target, and S5 shrinks it only when it does not, then each of its
    # messages a summary can gain on, not only the large ones (docs/design.md §3, "the latest
    # step stays last").
    end = kept_step_start(snapshot, lay, config, ctx)
    chosen = {
        i
        for i in lay.large_in(first, end)
        if summarizable_alone(lay, i) and not has_failed(snapshot, ctx, i, i + 1)
    }
    if lay.step_start is not None and end == len(lay):
        chosen.update(step_shrinkable(snapshot, lay, ctx))
    edits = [make_edit(snapshot, STRATEGY, i, i + 1, "large_summary") for i in sorted(chosen)]
    return _what_the_target_needs(snapshot, config, ctx, edits)


def _what_the_target_needs(
    snapshot: Snapshot, config: AutoContextConfig, ctx: PlanContext, edits: list[Edit]
) -> list[Edit]:
    """The first of `edits`, oldest first, whose summaries are expected to land the context
    `fold_keep_tokens` under the token target (deep enough not to give way to S6, docs/design.md
    §3), with what arrives meanwhile; all of them when even all would not. The latest step,
    which the model is about to read, comes last and is shrunk only when the older ones are
    not enough."""
    room = config.token_target - config.fold_keep_tokens
    over = snapshot.token_count + ctx.arriving - room
    if over <= 0:
        return edits  # asked with the totals under the mark: nothing to measure against
    for k, edit in enumerate(edits):
        over -= edit.estimated_gain
        if over < 0:
            return edits[: k + 1]
    return edits
