"""The fold (strategy 7): the history before the current round -> one rolling summary (LLM).

Everything before the current round's user message that is neither system nor pinned (old user
messages, answers, tool groups, unfinished rounds, and summaries and previews of every kind, the
previous fold's summary included) is replaced by one `history_summary`, except the most recent
whole rounds that fit in `fold_keep_tokens` (and in the same share of the message target).
System and pinned messages keep their places, so a session of many tasks, each with its own
system message, still has one fold summary; the new summary takes the place of the last folded
message.

Because every fold takes the one before it, the history never holds more than
``fold_keep_tokens + fold_budget_tokens`` plus the protected messages (docs/design.md §3).
"""

from __future__ import annotations

from typing import Final

from .._config import AutoContextConfig
from .._plans import Edit, PlanContext, Snapshot
from ._common import Layout, has_failed_ids, layout_of, make_edit, token_floor

STRATEGY: Final = 7


def plan_s7(snapshot: Snapshot, config: AutoContextConfig, ctx: PlanContext) -> list[Edit]:
    """At most one edit: the unprotected history before the kept rounds."""
    lay = layout_of(snapshot, config, ctx.layouts)
    if lay.latest_user is None:
        return []
    if ctx.fallback:
        keep_tokens = keep_messages = 0
    else:
        # What comes in before the fold commits (`PlanContext.arriving`) is the newest of
        # the recent rounds then: the fold keeps that much less of the older ones, so that
        # it lands with about `fold_keep_tokens` of recent rounds, not that plus the arrivals.
        keep_tokens = max(0, config.fold_keep_tokens - ctx.arriving)
        # The kept rounds hold the same share of the message target as of the token target,
        # so that a fold the message count called for also ends under its target.
        # Without a count trigger, the tokens alone bound them.
        keep_messages = (
            len(lay)
            if config.msg_target is None
            else config.msg_target * keep_tokens // max(1, config.token_target)
        )
    kept = kept_from(lay, keep_tokens, keep_messages)
    members = tuple(i for i in range(kept) if not lay.is_protected(i))
    if not members:
        return []
    metas = lay.metas
    # Only the previous fold's summary: folding it alone would re-word the fold's own output.
    if all(metas[i].kind == "history_summary" for i in members):
        return []
    if sum(metas[i].tokens for i in members) < token_floor(config, ctx):
        return []
    edit = make_edit(
        snapshot,
        STRATEGY,
        members[0],
        members[-1] + 1,
        "history_summary",
        members=members,
        token_budget=config.fold_budget_tokens,
    )
    if not ctx.fallback and has_failed_ids(ctx, edit.replaced_ids):
        return []
    return [edit]


def kept_from(lay: Layout, keep_tokens: int, keep_messages: int) -> int:
    """The index where the kept recent rounds begin: the user message of the oldest of the most
    recent whole previous rounds whose unprotected messages fit in `keep_tokens` and
    `keep_messages` together (the current round's user message when none fits)."""
    assert lay.latest_user is not None
    users = [i for i in range(lay.latest_user) if lay.metas[i].role == "user"]
    start = lay.latest_user
    tokens = count = 0
    for user in reversed(users):
        kept = [k for k in range(user, start) if not lay.is_protected(k)]
        tokens += sum(lay.metas[k].tokens for k in kept)
        count += len(kept)
        if tokens > keep_tokens or count > keep_messages:
            break
        start = user
    return start
