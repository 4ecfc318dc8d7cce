"""S4: previous rounds -> user message + one summary (LLM).

"Each finished round before the latest final answer" is read as each finished round that is not
the current round, i.e. whose user message comes before the latest user message. Those rounds
all end at or before the latest final answer; the round the latest final answer closes is
compressed only once a newer user message has made it a previous round, because the answer to
the current round is what the model reads next.

The kinds table of SPEC.md section 1 lets a round summary or a current-round summary be
compressed again only inside a larger S6 range (or as the prefix of the next S6). A round that
holds one (a round S6 compressed while it was current, or one S4 already summarised that went on
without a new user message) keeps it, and S4 summarises only what follows the last of them.
"""

from __future__ import annotations

from typing import Final

from ..config import AutoContextConfig
from ..messages import Kind
from ..plans import Edit, PlanContext, Snapshot
from ..structure import finished_rounds
from ._common import Layout, has_failed, layout_of, make_edit, token_floor

STRATEGY: Final = 4

#: Summaries S4 may not fold into its own (see the module docstring).
_KEPT_KINDS: Final[frozenset[Kind]] = frozenset({"round_summary", "current_round_summary"})


def plan_s4(snapshot: Snapshot, config: AutoContextConfig, ctx: PlanContext) -> list[Edit]:
    """One edit per previous round, replacing everything after its user message (and after any
    summary it must keep) up to and including its answer."""
    lay = layout_of(snapshot, config)
    if lay.latest_user is None:
        return []
    floor = token_floor(config, ctx)
    edits: list[Edit] = []
    for user, answer in finished_rounds(lay.metas):
        if user >= lay.latest_user:
            break
        # What S4 may replace is a part of the round after its user message: a round lighter
        # than the floor as a whole has no range heavy enough (checked first: it is O(1)).
        if lay.tokens(user + 1, answer + 1) < floor:
            continue
        rng = round_range(lay, user, answer)
        if rng is None:
            continue
        start, end = rng
        if lay.tokens(start, end) >= floor and not has_failed(snapshot, ctx, start, end):
            edits.append(make_edit(snapshot, STRATEGY, start, end, "round_summary"))
    return edits


def round_range(lay: Layout, user: int, answer: int) -> tuple[int, int] | None:
    """[start, end) S4 may replace in the round (user, answer), or None if it must skip it:
    after the user message and after the last summary it must keep, up to and including the
    answer."""
    # A system or pinned message anywhere in the round makes S4 skip it (SPEC.md section 1).
    if any(lay.is_protected(k) for k in range(user + 1, answer + 1)):
        return None
    if lay.metas[answer].kind in _KEPT_KINDS:
        return None
    start = user + 1
    for k in range(answer - 1, user, -1):
        if lay.metas[k].kind in _KEPT_KINDS:
            start = k + 1
            break
    end = answer + 1
    # Only the answer left (nothing between the user message, or a kept summary, and the
    # answer): nothing to fold in. That is also how a round S4 already summarised looks.
    if end - start < 2:
        return None
    if not lay.holds_whole_groups(start, end) or lay.touches_pending(start, end):
        return None
    return start, end
