"""What every planner needs to know about a snapshot, computed once per planning call.

The rules of docs/design.md §3 share a handful of notions (protected messages, the history
boundary H, the protected tail of `last_keep` messages, the trailing pending tool call); they
live here so that each planner reads as the rule it implements.
"""

from __future__ import annotations

import bisect
import itertools
import operator
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, TypeAlias

from .._config import AutoContextConfig
from .._messages import Kind
from .._plans import Edit, LayoutCache, PlanContext, Snapshot
from .._structure import (
    MsgMeta,
    current_round_start,
    effective_pinned,
    latest_final_index,
    latest_user_index,
    pending_call_ids,
    tool_group_spans,
)
from .._tools import SEARCH_TOOL_NAME, TOOL_NAME

Planner: TypeAlias = Callable[[Snapshot, AutoContextConfig, PlanContext], list[Edit]]

#: The tool an agent reloads offloads with; S5 never summarizes its results, so that an agent
#: cannot loop reloading what was just compressed (docs/design.md §4).
RELOAD_TOOL_NAME: Final = TOOL_NAME
#: The tools whose results S5 leaves alone: the reload tool, and the search tool, whose answer
#: is what the agent asked to see again (a hit reloaded by id comes back through it too).
CONTEXT_TOOL_NAMES: Final = frozenset({TOOL_NAME, SEARCH_TOOL_NAME})


@dataclass(frozen=True, slots=True)
class Layout:
    """The structure of one snapshot as the planners see it."""

    metas: tuple[MsgMeta, ...]
    #: Every tool group (or lone message) as [start, end), in order.
    spans: tuple[tuple[int, int], ...]
    #: Pinned per index, a pin covering its whole tool group.
    pinned: tuple[bool, ...]
    latest_user: int | None
    #: First index of the current round: the latest user message, or with none the first
    #: message after the leading system messages.
    round_start: int
    #: H of docs/design.md §3: S1 to S3 act only on indices below it.
    history_end: int
    #: len - last_keep (at least 0): S1 and S2 act only below it.
    tail_start: int
    #: The current round has more than `last_keep` messages after its user message (the
    #: long-task rule of docs/design.md §3).
    long_round: bool
    #: Start of the trailing tool group whose calls are not all answered, if any.
    pending_start: int | None
    #: Running token totals: ``cum_tokens[i]`` is the sum over ``metas[:i]``.
    cum_tokens: tuple[int, ...]
    #: Indices of the messages over `large_payload_chars`, in order (few: the preview and
    #: large-message rules look at these, not at every message).
    large: tuple[int, ...]
    #: Indices of the original tool messages over `mask_min_chars`, in order: masking's
    #: candidates before its other rules.
    maskable: tuple[int, ...] = ()
    #: Start of the latest step, when the context ends with it: the trailing tool group whose
    #: calls are all answered, which the model is about to read (docs/design.md §3, "the
    #: latest step stays last"). None when the context ends otherwise (a user message, an answer, a
    #: pending call).
    step_start: int | None = None

    def __len__(self) -> int:
        return len(self.metas)

    def tokens(self, start: int, end: int) -> int:
        """Tokens of [start, end), in O(1)."""
        return self.cum_tokens[end] - self.cum_tokens[start]

    def large_in(self, start: int, end: int) -> tuple[int, ...]:
        """The indices of `large` within [start, end)."""
        large = self.large
        return large[bisect.bisect_left(large, start) : bisect.bisect_left(large, end)]

    def maskable_in(self, start: int, end: int) -> tuple[int, ...]:
        """The indices of `maskable` within [start, end)."""
        maskable = self.maskable
        return maskable[bisect.bisect_left(maskable, start) : bisect.bisect_left(maskable, end)]

    def is_protected(self, i: int) -> bool:
        """Never compressed by any strategy: system, pinned, the current round's user message."""
        return self.metas[i].role == "system" or self.pinned[i] or i == self.latest_user

    def touches_pending(self, start: int, end: int) -> bool:
        """Whether [start, end) overlaps the trailing pending tool call group."""
        return self.pending_start is not None and end > self.pending_start

    def holds_whole_groups(self, start: int, end: int) -> bool:
        """Whether [start, end) begins and ends on tool-group boundaries (cuts no group)."""
        spans = self.spans
        first = bisect.bisect_left(spans, start, key=operator.itemgetter(0))
        last = bisect.bisect_left(spans, end, key=operator.itemgetter(1))
        return (
            first < len(spans)
            and spans[first][0] == start
            and last < len(spans)
            and spans[last][1] == end
        )


#: The layout of no messages: the base `compute_layout` starts from when it has none.
_EMPTY_LAYOUT = Layout(
    metas=(),
    spans=(),
    pinned=(),
    latest_user=None,
    round_start=0,
    history_end=0,
    tail_start=0,
    long_round=False,
    pending_start=None,
    cum_tokens=(0,),
    large=(),
)


class Layouts:
    """The latest layout of one session, owned by whoever plans it again and again (a memory).

    The planners of one pass share a snapshot: one layout per (snapshot, config), by identity,
    so that a 100k-message pass walks the messages once, not seven times. The next snapshot of
    the session (the next pass, or the next call after appends) recomputes only what changed
    from this one: a snapshot is the last one with messages appended or a range replaced, and
    what the layout says about a message depends only on the messages of its tool group.
    Handed to the planners in `PlanContext.layouts`; without it each planner computes its
    layout from scratch (the same result).
    """

    __slots__ = ("_last", "_lock")

    def __init__(self) -> None:
        self._last: tuple[Snapshot, AutoContextConfig, Layout] | None = None
        self._lock = threading.Lock()

    def of(self, snapshot: Snapshot, config: AutoContextConfig) -> Layout:
        with self._lock:
            last = self._last
        if last is not None and last[0] is snapshot and last[1] is config:
            return last[2]
        # A base of another config (or, misused, another session) would be wrong: start over.
        same = last is not None and last[1] is config and last[0].session_id == snapshot.session_id
        base = last[2] if same and last is not None else None
        layout = compute_layout(snapshot, config, base)
        with self._lock:
            self._last = (snapshot, config, layout)
        return layout


def layout_of(
    snapshot: Snapshot, config: AutoContextConfig, layouts: LayoutCache[Layout] | None
) -> Layout:
    """The layout of `snapshot`, through the caller's `layouts` when it keeps one."""
    if layouts is None:
        return compute_layout(snapshot, config)
    return layouts.of(snapshot, config)


def _shared_prefix(a: tuple[MsgMeta, ...], b: tuple[MsgMeta, ...]) -> int:
    """Length of the longest common prefix of two message tuples.

    Tuple comparison runs in C and takes identical objects as equal without comparing them,
    so the usual case (b is a with messages appended, the same objects) costs one pass of
    pointer comparisons; otherwise a binary search over prefixes.
    """
    m = min(len(a), len(b))
    if a[:m] == b[:m]:
        return m
    lo, hi = 0, m - 1  # a[:lo] == b[:lo] holds, a[:hi + 1] == b[:hi + 1] does not
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def compute_layout(
    snapshot: Snapshot, config: AutoContextConfig, base: Layout | None = None
) -> Layout:
    """The layout of `snapshot`; with `base` (a layout of the same session and config),
    reusing what it knows of the messages the two share, up to the tool group that the first
    difference (or the end of `base`) could change."""
    metas = snapshot.messages
    n = len(metas)
    latest_user = latest_user_index(metas)
    round_start = current_round_start(metas)
    final = latest_final_index(metas)
    tail_start = max(0, n - config.last_keep)
    # The long-task rule: a current round with more than last_keep messages after its user
    # message has its older part treated as history, as if a final answer stood at tail_start.
    # With no user message the whole round (after the leading system messages) counts.
    after_user = n - (latest_user + 1) if latest_user is not None else n - round_start
    long_task = after_user > config.last_keep
    history_end = max(final if final is not None else 0, tail_start if long_task else 0)

    # Kept from `base`: its groups that end before the first difference (a group ending there
    # might go on with results appended since), and what it says of their messages.
    # Without a base, nothing is kept (q = 0) and the same code computes everything.
    if base is None:
        base = _EMPTY_LAYOUT
    p = _shared_prefix(base.metas, metas)
    k = bisect.bisect_left(base.spans, p, key=operator.itemgetter(1))
    kept_spans = base.spans[:k]
    q = kept_spans[-1][1] if kept_spans else 0
    rest = metas[q:]
    rest_spans = tool_group_spans(rest)
    spans = kept_spans + tuple((s + q, e + q) for s, e in rest_spans)
    pinned = base.pinned[:q] + tuple(effective_pinned(rest, rest_spans))
    cum_tokens = (
        base.cum_tokens[: q + 1]
        + tuple(itertools.accumulate((m.tokens for m in rest), initial=base.cum_tokens[q]))[1:]
    )
    large = base.large[: bisect.bisect_left(base.large, q)] + tuple(
        i for i, m in enumerate(rest, start=q) if m.chars > config.large_payload_chars
    )
    maskable = base.maskable[: bisect.bisect_left(base.maskable, q)] + tuple(
        i
        for i, m in enumerate(rest, start=q)
        if m.kind == "original"
        and m.chars > config.mask_min_chars
        and (m.role == "tool" or (m.role == "assistant" and bool(m.call_ids)))
    )
    pending_start = spans[-1][0] if pending_call_ids(metas, spans) else None
    step_start = None
    if pending_start is None and spans and metas[-1].role == "tool":
        # A tool message always closes the group of its call (the shape rules of add()).
        step_start = spans[-1][0]
    return Layout(
        metas=metas,
        spans=spans,
        pinned=pinned,
        latest_user=latest_user,
        round_start=round_start,
        history_end=history_end,
        tail_start=tail_start,
        long_round=long_task,
        pending_start=pending_start,
        cum_tokens=cum_tokens,
        large=large,
        maskable=maskable,
        step_start=step_start,
    )


#: The fewest tokens a range sent to the summarizer must hold: well more than a minimal
#: summary and its offload tag (about 25 tokens), so that a summary of it can gain and
#: `no_gain` failures stay rare events, not a per-turn cost (docs/design.md §2).
MIN_LLM_RANGE_TOKENS: Final = 256


def current_round_body_start(lay: Layout, before: int | None = None) -> int:
    """Where what S6 may summarize begins: after the latest user message (after the leading
    system messages when there is none), and after the last system or pinned message of the
    round (before `before`, when given), even one inside the trailing pending group: those
    messages keep their place after everything before them."""
    start = lay.latest_user + 1 if lay.latest_user is not None else lay.round_start
    for k in range((len(lay) if before is None else before) - 1, start - 1, -1):
        if lay.is_protected(k):
            return k + 1
    return start


def latest_step_fits(
    snapshot: Snapshot, lay: Layout, config: AutoContextConfig, arriving: int = 0
) -> bool:
    """Whether the latest step (`Layout.step_start`) can stay, whole and after S6's summary,
    with the context under the token target: everything but what S6 would summarize before it,
    plus a summary of the smallest range worth sending, is under the target (with the
    `arriving` tokens come in)."""
    step = lay.step_start
    assert step is not None
    before = lay.tokens(min(current_round_body_start(lay), step), step)
    return snapshot.token_count + arriving - before + MIN_LLM_RANGE_TOKENS < config.token_target


def kept_step_start(
    snapshot: Snapshot, lay: Layout, config: AutoContextConfig, ctx: PlanContext
) -> int:
    """Where the rungs that leave the latest step whole while it fits (masking, S5) stop: the
    step's start when the context ends with one that fits (`latest_step_fits`), else the end
    of the context."""
    step = lay.step_start
    if step is not None and latest_step_fits(snapshot, lay, config, ctx.arriving):
        return step
    return len(lay)


def step_shrinkable(snapshot: Snapshot, lay: Layout, ctx: PlanContext) -> tuple[int, ...]:
    """The messages of the latest step that S5 may still summarize when the step does not fit
    (`latest_step_fits`): each one S5 may summarize alone, large enough for a summary to gain,
    and not failed in this call."""
    step = lay.step_start
    assert step is not None
    return tuple(
        i
        for i in range(step, len(lay))
        if lay.metas[i].tokens >= MIN_LLM_RANGE_TOKENS
        and summarizable_alone(lay, i)
        and not has_failed(snapshot, ctx, i, i + 1)
    )


def summarizable_alone(lay: Layout, i: int) -> bool:
    """Whether S5 may summarize message `i` of the current round on its own (its size aside)."""
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


def token_floor(config: AutoContextConfig, ctx: PlanContext) -> int:
    """The floor of S1, S4 and the fold: `min_compress_tokens`, waived when the message count
    is the pressure (a summary then still removes messages, which is the progress asked
    for), but never under what a summary can gain on."""
    floor = 0 if ctx.floor_waived else config.min_compress_tokens
    return max(floor, MIN_LLM_RANGE_TOKENS)


def make_edit(
    snapshot: Snapshot,
    strategy: int,
    start: int,
    end: int,
    new_kind: Kind,
    *,
    members: tuple[int, ...] | None = None,
    verbatim_prefix_id: int | None = None,
    char_budget: int | None = None,
    token_budget: int | None = None,
    preview_chars: int | None = None,
    fact_chars: int = 0,
) -> Edit:
    """The edit replacing ``snapshot.messages[start:end]``, or only its `members` (indices in
    order, the first at `start`, the last at ``end - 1``) when they are not the whole span."""
    metas = snapshot.messages
    if members is not None and len(members) == end - start:
        members = None  # the whole span after all
    replaced = metas[start:end] if members is None else tuple(metas[i] for i in members)
    return Edit(
        strategy=strategy,
        start=start,
        end=end,
        replaced_ids=tuple(m.id for m in replaced),
        new_kind=new_kind,
        # A preview is the only replacement no LLM writes (each rung's record in `registry`
        # says the same of the rung, and a test holds the two together).
        llm=new_kind != "preview",
        replaced_tokens=sum(m.tokens for m in replaced),
        verbatim_prefix_id=verbatim_prefix_id,
        char_budget=char_budget,
        token_budget=token_budget,
        members=members,
        span_ids=None if members is None else snapshot.ids(start, end),
        preview_chars=preview_chars,
        fact_chars=fact_chars,
    )


def has_failed(snapshot: Snapshot, ctx: PlanContext, start: int, end: int) -> bool:
    """A range that failed earlier in this call is not planned again until the session changes."""
    return has_failed_ids(ctx, snapshot.ids(start, end))


def has_failed_ids(ctx: PlanContext, ids: tuple[int, ...]) -> bool:
    """`has_failed` for a range given by its replaced ids."""
    return ids in ctx.failed


def only_kind(metas: tuple[MsgMeta, ...], start: int, end: int, kind: Kind) -> bool:
    """Whether [start, end) holds nothing but messages of `kind` (a strategy's own output)."""
    return all(metas[k].kind == kind for k in range(start, end))
