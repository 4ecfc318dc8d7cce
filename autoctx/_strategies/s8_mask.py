"""Masking (strategy 8): old tool outputs -> short previews (no LLM), the cheapest rung, first in
every pass (docs/design.md §3).

Every tool output outside the most recent `mask_keep` tool results, in the history and in a
long current round (there outside those results, not only below H as for S1 to S3), whose
output is longer than `mask_min_chars`, becomes a preview of `mask_preview_chars` characters and
its offload tag, keeping its call ids and tool names: the peers clear old tool results the same
way, and lose them; here each stays reloadable and searchable through its tag. Every candidate
goes in one pass (one transaction, one event for the pass), so that the context is rewritten once,
deeply, rather than a little at every trigger. An old tool call (the assistant message that
made it) over `mask_min_chars` is masked the same way once all its results are outside the kept
ones: its text to the preview's head, each argument string longer than the preview to its head,
its call ids and tool names kept, so that a long task's file writes do not stay in full.

Left alone: pinned groups, the answers of the context tools (an agent that reloaded or searched
must see what it asked for), a trailing pending call, and anything that is not an original (a
masked output is never masked again; the fold and S6 take it like any other message).
"""

from __future__ import annotations

import bisect
import operator
from typing import Final

from .._config import AutoContextConfig
from .._plans import Edit, PlanContext, Snapshot
from ._common import (
    CONTEXT_TOOL_NAMES,
    Layout,
    has_failed,
    kept_step_start,
    layout_of,
    make_edit,
)

STRATEGY: Final = 8


def plan_s8(snapshot: Snapshot, config: AutoContextConfig, ctx: PlanContext) -> list[Edit]:
    """One preview edit per old tool output over `mask_min_chars` (see the module docstring)."""
    lay = layout_of(snapshot, config, ctx.layouts)
    if not lay.maskable:
        return []
    # The history before the current round (and the finished part of the current round, below
    # its latest final answer); in a long task, the whole round. The `last_keep` tail that S1
    # to S3 leave to a long task is not masking's to keep: a masked output stays reloadable,
    # and a tail kept whole is re-sent in full after every masking pass, since each rewrites
    # the context from its first masked output on (docs/design.md §3).
    end = len(lay) if lay.long_round else max(lay.history_end, lay.round_start)
    # The latest step is what the model is about to read: it stays whole while it fits under
    # the target, as it does for S5 and S6 (docs/design.md §3, "the latest step stays last");
    # when it does not, masking its older results is the cheapest way to shrink it.
    limit = min(
        end,
        recent_results_start(lay, config.mask_keep),
        kept_step_start(snapshot, lay, config, ctx),
    )
    return [
        make_edit(
            snapshot,
            STRATEGY,
            i,
            i + 1,
            "preview",
            preview_chars=config.mask_preview_chars,
            fact_chars=config.mask_fact_chars,
        )
        for i in lay.maskable_in(0, limit)
        if _maskable(lay, i)
        and not has_failed(snapshot, ctx, i, i + 1)
        # A call is masked with its results: never while one of them is kept.
        and (lay.metas[i].role == "tool" or _group_end(lay, i) <= limit)
    ]


def recent_results_start(lay: Layout, keep: int) -> int:
    """The index of the tool message that holds the `keep`-th most recent tool result (the
    whole context's: every tool result counts, masked or not); len(lay) when `keep` is 0, and 0
    when the context holds fewer results."""
    if keep <= 0:
        return len(lay)
    seen = 0
    for i in range(len(lay) - 1, -1, -1):
        seen += len(lay.metas[i].result_ids) if lay.metas[i].role == "tool" else 0
        if seen >= keep:
            return i
    return 0


def _maskable(lay: Layout, i: int) -> bool:
    """Whether tool output or call `i` (an original over `mask_min_chars`) may be masked."""
    m = lay.metas[i]
    return (
        not lay.is_protected(i)
        and not CONTEXT_TOOL_NAMES.intersection(m.tool_names)
        and not lay.touches_pending(i, i + 1)
    )


def _group_end(lay: Layout, i: int) -> int:
    """The end of the tool group that message `i` opens (its call and its results)."""
    k = bisect.bisect_right(lay.spans, i, key=operator.itemgetter(0)) - 1
    if k >= 0 and lay.spans[k][0] <= i < lay.spans[k][1]:
        return lay.spans[k][1]
    return i + 1
