"""S1: historical tool runs -> one summary each (LLM).

A *tool run* is a maximal sequence of consecutive whole tool groups (an assistant message with
tool calls plus the tool messages answering every one of them). Anything else ends a run: a
user, system or plain assistant message, a summary, a pinned group, an unanswered call. Because
a run is built from whole groups, "trim each run to whole tool groups" holds by construction.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

from .._config import AutoContextConfig
from .._messages import Kind
from .._plans import Edit, PlanContext, Snapshot
from ._common import Layout, has_failed, layout_of, make_edit, token_floor

STRATEGY: Final = 1

#: Kinds a run may hold. Previews and large summaries keep their call ids and stay members of
#: their group; the other summaries are plain assistant messages and may be re-compressed only
#: inside a larger S4 or S6 range (docs/design.md §1), so they end a run.
_RUN_KINDS: Final[frozenset[Kind]] = frozenset({"original", "preview", "large_summary"})


def plan_s1(snapshot: Snapshot, config: AutoContextConfig, ctx: PlanContext) -> list[Edit]:
    """One edit per tool run below H and below the protected tail that is long and heavy enough."""
    lay = layout_of(snapshot, config, ctx.layouts)
    floor = token_floor(config, ctx)
    edits: list[Edit] = []
    limit = min(lay.history_end, lay.tail_start)
    if lay.step_start is not None:
        # With `last_keep` 0 a run could reach the latest step, which the model is about to
        # read: the context keeps ending with its results (docs/design.md §3, "the latest
        # step stays last").
        limit = min(limit, lay.step_start)
    for start, end in tool_runs(lay, limit, longer_than=config.min_tool_run):
        # A run of nothing but previews and summaries was compressed once already; summarizing
        # it again would mostly re-word earlier output.
        if all(lay.metas[k].kind != "original" for k in range(start, end)):
            continue
        # Below the floor the run is skipped and the search goes on past it.
        if lay.tokens(start, end) < floor:
            continue
        if has_failed(snapshot, ctx, start, end):
            continue
        edits.append(make_edit(snapshot, STRATEGY, start, end, "tool_run_summary"))
    return edits


def tool_runs(lay: Layout, limit: int, longer_than: int = 0) -> Iterator[tuple[int, int]]:
    """Maximal runs [start, end) of consecutive run-eligible tool groups ending at or before
    `limit` and holding more than `longer_than` messages, oldest first.

    A cheap necessary condition (an assistant head with calls and at least one answer) cuts
    the groups into stretches first; the full eligibility check runs only in a stretch long
    enough to hold a long run (in a chat of short tool steps, none is).
    """
    metas = lay.metas
    stretch: list[tuple[int, int]] = []
    for start, end in lay.spans:
        if end > limit:
            break
        head = metas[start]
        if end - start >= 2 and head.call_ids and head.role == "assistant":
            stretch.append((start, end))
            continue
        if stretch:
            yield from _exact_runs(lay, stretch, longer_than)
            stretch = []
    if stretch:
        yield from _exact_runs(lay, stretch, longer_than)


def _exact_runs(
    lay: Layout, stretch: list[tuple[int, int]], longer_than: int
) -> Iterator[tuple[int, int]]:
    """The maximal runs of `_is_run_group` groups within a stretch of consecutive groups."""
    if stretch[-1][1] - stretch[0][0] <= longer_than:
        return
    run_start: int | None = None
    run_end = 0
    for start, end in stretch:
        if _is_run_group(lay, start, end):
            run_start = start if run_start is None else run_start
            run_end = end
        elif run_start is not None:
            if run_end - run_start > longer_than:
                yield run_start, run_end
            run_start = None
    if run_start is not None and run_end - run_start > longer_than:
        yield run_start, run_end


def _is_run_group(lay: Layout, start: int, end: int) -> bool:
    """A whole, answered, unpinned tool group whose members may be summarized by S1 (called on
    groups that passed `tool_runs`'s cheap check: an assistant head with calls and answers)."""
    head = lay.metas[start]
    members = lay.metas[start:end]
    answered = {rid for m in members[1:] for rid in m.result_ids}
    if not set(head.call_ids) <= answered:
        # Unanswered calls: the trailing pending call, never touched.
        return False
    if any(lay.pinned[k] for k in range(start, end)):
        return False
    return all(m.kind in _RUN_KINDS for m in members)
