"""The structure of a working context: tool groups, rounds, final answers, the current round.

These helpers work on `MsgMeta`, the metadata-only view of a message that planning reads (ids,
roles, kinds, sizes, call ids), so that the strategies never need the content of 100k messages.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from ._messages import Kind, Msg, Role


@dataclass(frozen=True, slots=True)
class MsgMeta:
    """What planning knows of one working message."""

    id: int
    role: Role
    kind: Kind
    #: Counts as a final answer (recorded at write time from the kind, never guessed).
    final: bool
    pinned: bool
    tokens: int
    #: Characters of text, tool input, tool output (see `Msg.payload_chars`).
    chars: int
    #: Ids of the tool calls this (assistant) message makes.
    call_ids: tuple[str, ...] = ()
    #: Ids of the calls this (tool) message answers.
    result_ids: tuple[str, ...] = ()
    #: Tool names of the calls made or answered.
    tool_names: tuple[str, ...] = ()


def is_final_answer(msg: Msg, replaced_final: bool = False) -> bool:
    """docs/design.md §1's kinds table: what counts as a final answer."""
    if msg.kind == "original":
        return msg.role == "assistant" and not msg.tool_uses
    if msg.kind == "round_summary":
        return True
    if msg.kind in ("preview", "large_summary"):
        return replaced_final
    return False


def meta_of(msg: Msg, *, id: int, final: bool, tokens: int) -> MsgMeta:
    calls = msg.tool_uses
    results = msg.tool_results
    return MsgMeta(
        id=id,
        role=msg.role,
        kind=msg.kind,
        final=final,
        pinned=msg.pinned,
        tokens=tokens,
        chars=msg.payload_chars,
        call_ids=tuple(c.id for c in calls),
        result_ids=tuple(r.tool_use_id for r in results),
        tool_names=tuple(c.name for c in calls) + tuple(r.name for r in results),
    )


def tool_group_spans(metas: Sequence[MsgMeta]) -> list[tuple[int, int]]:
    """Every message as a span [start, end): a tool group (the assistant message with calls and
    the tool messages answering them) is one span, any other message is a span of its own."""
    spans: list[tuple[int, int]] = []
    n = len(metas)
    done = 0  # every message before `done` is in a span
    # Messages that make calls are few; the lone messages between them become spans in bulk.
    for i in [k for k, m in enumerate(metas) if m.call_ids]:
        if i < done:
            continue  # inside the group before: only a tool message, which makes no calls
        spans.extend(zip(range(done, i), range(done + 1, i + 1), strict=True))
        open_ids = set(metas[i].call_ids)
        j = i + 1
        while j < n and open_ids and metas[j].role == "tool":
            open_ids.difference_update(metas[j].result_ids)
            j += 1
        spans.append((i, j))
        done = j
    spans.extend(zip(range(done, n), range(done + 1, n + 1), strict=True))
    return spans


def effective_pinned(
    metas: Sequence[MsgMeta], spans: Sequence[tuple[int, int]] | None = None
) -> list[bool]:
    """Pinned per index, where a pin on any member covers its whole tool group."""
    pinned = [False] * len(metas)
    marked = [i for i, m in enumerate(metas) if m.pinned]
    if not marked:
        return pinned  # the usual case: one pass over the messages, no pass over the groups
    spans = spans if spans is not None else tool_group_spans(metas)
    starts = [start for start, _ in spans]
    for i in marked:
        start, end = spans[bisect.bisect_right(starts, i) - 1]
        for k in range(start, end):
            pinned[k] = True
    return pinned


def latest_final_index(metas: Sequence[MsgMeta]) -> int | None:
    for i in range(len(metas) - 1, -1, -1):
        if metas[i].final:
            return i
    return None


def latest_user_index(metas: Sequence[MsgMeta]) -> int | None:
    for i in range(len(metas) - 1, -1, -1):
        if metas[i].role == "user":
            return i
    return None


def current_round_start(metas: Sequence[MsgMeta]) -> int:
    """Index of the latest user message; with none, the first message after the leading system
    messages."""
    user = latest_user_index(metas)
    if user is not None:
        return user
    i = 0
    while i < len(metas) and metas[i].role == "system":
        i += 1
    return i


def pending_call_ids(
    metas: Sequence[MsgMeta], spans: Sequence[tuple[int, int]] | None = None
) -> tuple[str, ...]:
    """Ids of the newest tool group's calls still without a result (a trailing pending call)."""
    if not metas:
        return ()
    start, end = (spans if spans is not None else tool_group_spans(metas))[-1]
    head = metas[start]
    if not head.call_ids:
        return ()
    answered = {rid for k in range(start + 1, end) for rid in metas[k].result_ids}
    return tuple(c for c in head.call_ids if c not in answered)
