"""Undo, planned (docs/design.md §7): a compression's originals back in place of its replacement.

An undo is a plan like any other: an edit of the working context whose replacement is the
messages the compression replaced, one level deep (a summary among them stays a summary).
This module is pure: a snapshot, the compression's event and the metadata of what it replaced
in, a `Restoration` (or an `UndoRefused` naming the session, the event and the fix) out. The
store applies it in one transaction, like every plan (`autoctx._store.undo.restore`).

Where the originals go. Every rung but the fold replaced one contiguous span, and its
replacement stands where that span stood: the originals take its place, in their order. A
masking pass is one event that wrote a replacement for each output it masked: its undo puts
every one back, in one unit, or none. The
fold went around the system and pinned messages inside its range, which kept their places
before its summary; the undo puts each back between the originals where it stood. Messages keep
the order they were appended in through every compression, so where a kept message stood among
the originals follows from its id and from each original's oldest original by lineage (its
`order key`).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from ._errors import UndoRefused
from ._events import MANUAL, Event
from ._plans import Edit, Snapshot
from ._structure import MsgMeta, effective_pinned, tool_group_spans

#: The fold's rung number (docs/design.md §3): the one rung that replaces a non-contiguous set.
_FOLD: Final = 7


@dataclass(frozen=True, slots=True)
class Span:
    """One replacement an undo takes out, and what it puts back in its place.

    `edit` names the span of the snapshot it rewrites (its `replaced_ids`, checked again at
    apply time like every edit's): the replacement, and for a fold the kept messages before it
    that stood among its originals. `sequence` is what stands in the span afterwards, in
    order; `removed` the replacement that leaves the working context."""

    edit: Edit
    sequence: tuple[int, ...]
    removed: int


@dataclass(frozen=True, slots=True)
class Restoration:
    """An undo planned on a snapshot: a span for each replacement the compression wrote (one,
    or one per masked output of a masking pass), in working order."""

    spans: tuple[Span, ...]
    undone: int
    tokens_before: int
    tokens_after: int
    messages_after: int
    forced: bool


def not_undoable(session_id: str, event: Event) -> UndoRefused | None:
    """Why `event` is not a compression an undo can take back, or None when it is one."""
    where = f"event {event.id} of session {session_id!r}"
    if event.strategy == MANUAL:
        kind = event.reason if event.reason != "manual" else "pop"
        return UndoRefused(
            "not_a_compression",
            f"{where} is a {kind}, not a compression: only an applied compression (strategy "
            "1-8) can be undone; `autoctx history` lists them",
        )
    if event.status != "applied" or not event.replaced_ids:
        return UndoRefused(
            "not_applied",
            f"{where} is a {event.status} attempt that changed nothing: there is nothing to "
            "undo; undo an applied compression (`autoctx history` lists them)",
        )
    return None


def plan_restoration(
    snapshot: Snapshot,
    event: Event,
    written: Sequence[tuple[int, tuple[int, ...]]],
    restored: Mapping[int, MsgMeta],
    order_keys: Mapping[int, int],
    *,
    max_tokens: int,
    force: bool,
) -> Restoration | int:
    """The restoration of `event` on `snapshot`, or the id of a replacement of it that is not
    in the working context (the caller says where it went).

    `written`: each replacement the compression wrote, with the ids it replaced, in order (a
    masking pass wrote many, every other compression one); `restored`: the metadata of the
    messages it replaced; `order_keys`: for a fold, each one's oldest original by lineage (see
    the module docstring). Raises `UndoRefused` ('over_window') when the working context would
    reach `max_tokens` and `force` is not set, and ('pairing') if the result would break the
    tool pairing of docs/design.md §1 (which no compression's replacement can do: a defect,
    said as one).
    """
    sid = snapshot.session_id
    metas = snapshot.messages
    where = {m.id: i for i, m in enumerate(metas)}
    spans: list[tuple[int, int, list[MsgMeta]]] = []
    for summary, replaced in written:
        index = where.get(summary)
        if index is None:
            return summary
        start = index
        sequence: list[MsgMeta] = [restored[i] for i in replaced]
        if event.strategy == _FOLD:
            start, sequence = _around_kept(metas, index, sequence, order_keys)
        spans.append((start, index + 1, sequence))
    spans.sort(key=lambda span: span[0])
    after: list[MsgMeta] = []
    at = 0
    for start, end, sequence in spans:
        after.extend(metas[at:start])
        after.extend(sequence)
        at = end
    after.extend(metas[at:])
    tokens_after = snapshot.token_count + sum(
        sum(m.tokens for m in sequence) - sum(m.tokens for m in metas[start:end])
        for start, end, sequence in spans
    )
    if tokens_after >= max_tokens and not force:
        raise UndoRefused(
            "over_window",
            f"undoing event {event.id} of session {sid!r} would put {tokens_after} tokens in "
            f"the working context, at or over its window of {max_tokens}: make room first "
            "(undo a later compression, or pop messages), or pass force=True (`autoctx undo "
            "--force`) and let the next compress_if_needed() choose again",
        )
    broken = _pairing_problem(after)
    if broken is not None:
        raise UndoRefused(
            "pairing",
            f"undoing event {event.id} of session {sid!r} would leave message "
            f"{after[broken].id} {_PAIRING_TEXT}; nothing was changed (please report this)",
        )
    return Restoration(
        spans=tuple(
            Span(
                edit=Edit(
                    strategy=MANUAL,
                    start=start,
                    end=end,
                    replaced_ids=tuple(m.id for m in metas[start:end]),
                    new_kind="original",
                    llm=False,
                    replaced_tokens=sum(m.tokens for m in metas[start:end]),
                ),
                sequence=tuple(m.id for m in sequence),
                removed=metas[end - 1].id,
            )
            for start, end, sequence in spans
        ),
        undone=event.id,
        tokens_before=snapshot.token_count,
        tokens_after=tokens_after,
        messages_after=snapshot.message_count
        + sum(len(sequence) - (end - start) for start, end, sequence in spans),
        forced=tokens_after >= max_tokens,
    )


def _around_kept(
    metas: Sequence[MsgMeta],
    index: int,
    originals: Sequence[MsgMeta],
    order_keys: Mapping[int, int],
) -> tuple[int, list[MsgMeta]]:
    """For a fold: where the span starts (the kept messages before its summary that stood
    among its originals) and the originals merged with them in the order they had."""
    first = min(order_keys[m.id] for m in originals)
    pinned = effective_pinned(metas, tool_group_spans(metas))
    start = index
    # The fold put the system and pinned messages of its range, in their order, right
    # before its summary; one whose order key is after the fold's first original stood
    # among the originals (one before it stood before the range, and stays).
    while (
        start > 0
        and (metas[start - 1].role == "system" or pinned[start - 1])
        and order_keys.get(metas[start - 1].id, metas[start - 1].id) > first
    ):
        start -= 1
    kept = metas[start:index]

    def key(m: MsgMeta) -> int:
        return order_keys.get(m.id, m.id)

    return start, list(heapq.merge(kept, originals, key=key))


_PAIRING_TEXT: Final = (
    "out of the tool pairing (a tool result without its call just before it, or a call "
    "without its results)"
)


def _pairing_problem(metas: Sequence[MsgMeta]) -> int | None:
    """The index of the first message that breaks the pairing of docs/design.md §1 in a
    working context, or None: a tool result answers an open call of the group before it,
    nothing else comes while calls are open, and only the newest group may stay open."""
    open_ids: set[str] = set()
    for i, m in enumerate(metas):
        if m.role == "tool":
            if not m.result_ids or not set(m.result_ids) <= open_ids:
                return i
            open_ids.difference_update(m.result_ids)
            continue
        if open_ids:
            return i
        open_ids = set(m.call_ids)
    return None
