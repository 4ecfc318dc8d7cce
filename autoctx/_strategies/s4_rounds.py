"""S4: previous rounds -> user message + one summary (LLM).

A round is previous once a newer user message exists, whether or not it ended with a final
answer (docs/design.md §1): an abandoned task, or a round S6 compressed while it was current,
is still a previous round. S4 replaces what follows the round's user message up to its last
message that is neither system nor pinned (its final answer, when it has one).

The kinds table of docs/design.md §1 lets a round summary or a current-round summary be
compressed again only inside a larger range (S6, the fold). A round that holds one keeps it,
and S4 summarizes only what follows the last of them.
"""

from __future__ import annotations

import itertools
from typing import Final

from .._config import AutoContextConfig
from .._messages import Kind
from .._plans import Edit, PlanContext, Snapshot
from ._common import Layout, has_failed, layout_of, make_edit, token_floor

STRATEGY: Final = 4

#: Summaries S4 may not fold into its own (see the module docstring).
_KEPT_KINDS: Final[frozenset[Kind]] = frozenset({"round_summary", "current_round_summary"})


def plan_s4(snapshot: Snapshot, config: AutoContextConfig, ctx: PlanContext) -> list[Edit]:
    """One edit per previous round, replacing everything after its user message (and after any
    summary it must keep) up to and including its last message."""
    lay = layout_of(snapshot, config, ctx.layouts)
    if lay.latest_user is None:
        return []
    floor = token_floor(config, ctx)
    edits: list[Edit] = []
    for user, last in previous_rounds(lay):
        # What S4 may replace is a part of the round after its user message: a round lighter
        # than the floor as a whole has no range heavy enough (checked first: it is O(1)).
        if lay.tokens(user + 1, last + 1) < floor:
            continue
        rng = round_range(lay, user, last)
        if rng is None:
            continue
        start, end = rng
        if lay.tokens(start, end) >= floor and not has_failed(snapshot, ctx, start, end):
            edits.append(make_edit(snapshot, STRATEGY, start, end, "round_summary"))
    return edits


def previous_rounds(lay: Layout) -> list[tuple[int, int]]:
    """(user index, index of the round's last message) of every previous round, oldest first.

    A round runs from its user message to the next user message; its last message is the last
    one before the next user message that is neither system nor pinned (a task's system
    message often stands just before the next task's user message). A round with nothing but
    its user message and protected messages is left out.
    """
    users = [i for i, m in enumerate(lay.metas) if m.role == "user"]
    rounds: list[tuple[int, int]] = []
    for user, following in itertools.pairwise(users):
        last = following - 1
        while last > user and lay.is_protected(last):
            last -= 1
        if last > user:
            rounds.append((user, last))
    return rounds


def round_range(lay: Layout, user: int, last: int) -> tuple[int, int] | None:
    """[start, end) S4 may replace in the round from `user` to its last message `last`, or
    None if it must skip it: after the user message and after the last summary it must keep,
    up to and including the last message."""
    # A system or pinned message anywhere in the round makes S4 skip it (docs/design.md §1).
    if any(lay.is_protected(k) for k in range(user + 1, last + 1)):
        return None
    if lay.metas[last].kind in _KEPT_KINDS:
        return None
    start = user + 1
    for k in range(last - 1, user, -1):
        if lay.metas[k].kind in _KEPT_KINDS:
            start = k + 1
            break
    end = last + 1
    # Only the last message left (nothing between the user message, or a kept summary, and
    # it): nothing to fold in. That is also how a round S4 already summarized looks.
    if end - start < 2:
        return None
    if not lay.holds_whole_groups(start, end) or lay.touches_pending(start, end):
        return None
    return start, end
