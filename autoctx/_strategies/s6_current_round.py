"""S6: the whole current round -> one first-person summary (LLM), last resort.

The range is everything after the latest user message and after the last system or pinned
message of the round, up to (not including) a trailing pending tool call group, or the latest
step when the context ends with one (the trailing tool group whose results the model is about
to read) and the step stays (see `current_round_range`): the context then still ends with
those results, as every framework's agent loop needs (docs/design.md §3, "the latest step stays
last"). An earlier S6 summary at the start of the range is kept verbatim as a prefix, until that
prefix alone grows past `current_round_ratio` of the token target; then it is summarized too,
which keeps a task of any length bounded. It is summarized too when keeping it could not bring
the context under the target (protected messages, such as the system prompts of many tasks,
leave little room): a call that fires goes on to the target (docs/design.md §2), instead of
shaving a few tokens off the newest steps at every turn.
"""

from __future__ import annotations

from typing import Final

from .._config import AutoContextConfig
from .._plans import Edit, PlanContext, Snapshot
from .._tags import TAG_TOKENS
from ._common import (
    MIN_LLM_RANGE_TOKENS,
    Layout,
    current_round_body_start,
    has_failed,
    latest_step_fits,
    layout_of,
    make_edit,
    only_kind,
    step_shrinkable,
)

STRATEGY: Final = 6


def plan_s6(snapshot: Snapshot, config: AutoContextConfig, ctx: PlanContext) -> list[Edit]:
    """At most one edit: the current round, with its verbatim prefix and character budget."""
    if not ctx.token_pressure:
        return []
    lay = layout_of(snapshot, config, ctx.layouts)
    start, end = current_round_range(snapshot, lay, config, ctx)
    if end <= start:
        return []
    prefix = _verbatim_prefix(lay, start, config)
    if prefix is not None and not _reaches_target_with_prefix(
        snapshot, lay, start, end, config, ctx.arriving
    ):
        prefix = None
    body_start = start + 1 if prefix is not None else start
    # Nothing new after the prefix, or nothing but earlier S6 output: summarizing it would only
    # re-word S6's own text.
    if body_start >= end or only_kind(lay.metas, body_start, end, "current_round_summary"):
        return []
    if has_failed(snapshot, ctx, start, end):
        return []
    # A round too small to gain on is left alone (docs/design.md §2: no range is sent to the
    # summarizer when it cannot gain).
    if lay.tokens(body_start, end) < MIN_LLM_RANGE_TOKENS:
        return []
    return [
        make_edit(
            snapshot,
            STRATEGY,
            start,
            end,
            "current_round_summary",
            verbatim_prefix_id=prefix,
            char_budget=char_budget(snapshot, lay, body_start, end, config, ctx.arriving),
        )
    ]


#: Tokens of the offload tag and the newline before it, which every summary carries.
_TAG_TOKENS: Final = TAG_TOKENS


def char_budget(
    snapshot: Snapshot,
    lay: Layout,
    body_start: int,
    end: int,
    config: AutoContextConfig,
    arriving: int = 0,
) -> int:
    """S6's character budget: `current_round_ratio` of the original characters of what it
    summarizes, but never more than the fold's budget, `fold_budget_tokens`, which follows the
    token target (docs/design.md §3): a long task's summary then leaves room for many steps
    before the next compression, instead of a third of a round that filled the window. And
    never more than the room that leaves the context under the token target (docs/design.md
    §2: when the summarizer answers, the call ends under the target). A round many times the
    window would otherwise get a summary larger than the window, which no rung could shorten
    again (S6 never runs on its own output alone). Token sizes are converted to characters at
    the body's own characters per token; the budget is at least `preview_chars`, a sentence or
    two. The room leaves out the `arriving` tokens that will have come in when it commits."""
    body = lay.metas[body_start:end]
    body_chars = sum(m.chars for m in body)
    body_tokens = lay.tokens(body_start, end)
    chars_per_token = body_chars / max(1, body_tokens)
    share = max(1, int(config.current_round_ratio * body_chars))
    deep = int(config.fold_budget_tokens * chars_per_token)
    room_tokens = (
        config.token_target - (snapshot.token_count + arriving - body_tokens) - _TAG_TOKENS
    )
    room = int(room_tokens * chars_per_token)
    return max(1, min(share, max(config.preview_chars, min(deep, room))))


def current_round_range(
    snapshot: Snapshot, lay: Layout, config: AutoContextConfig, ctx: PlanContext
) -> tuple[int, int]:
    """[start, end) of what S6 may summarize; empty when end <= start.

    It ends before a trailing pending call, and before the latest step when the context ends
    with one and the step stays: when it fits under the target after the summary, or when it
    does not but S5 can still shrink it (S5 then runs first, as S6's range does not hold its
    edits). Only a step too large to fit that S5 can shrink no more is summarized with the rest,
    so that the bound holds."""
    start = current_round_body_start(lay)
    step = lay.step_start
    if step is not None and step < start:
        # The latest step holds a pinned message, so it stays whole after S6's summary: the
        # range is what precedes it, after the last protected message before it (else a long
        # stretch between two pinned steps could never be summarized, and the bound broke).
        earlier = current_round_body_start(lay, before=step)
        if earlier < step:
            return earlier, step
    if (
        step is not None
        and step >= start
        and (
            latest_step_fits(snapshot, lay, config, ctx.arriving)
            or step_shrinkable(snapshot, lay, ctx)
        )
    ):
        return start, step
    end = lay.pending_start if lay.pending_start is not None else len(lay)
    return start, end


def _reaches_target_with_prefix(
    snapshot: Snapshot, lay: Layout, start: int, end: int, config: AutoContextConfig, arriving: int
) -> bool:
    """Whether summarizing only what follows the prefix at `start`, at `current_round_ratio` of
    its size, would bring the context under the token target (with `arriving` tokens come in)."""
    body = lay.tokens(start + 1, end)
    after = snapshot.token_count + arriving - body * (1 - config.current_round_ratio)
    return after < config.token_target


def _verbatim_prefix(lay: Layout, start: int, config: AutoContextConfig) -> int | None:
    """Id of the earlier S6 summary at `start` to keep verbatim, if there is one and it is still
    small enough."""
    head = lay.metas[start]
    if head.kind != "current_round_summary":
        return None
    if head.tokens > config.current_round_ratio * config.token_target:
        return None
    return head.id
