"""Compression events as the public API returns them (one row of `compression_events`)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Final, Literal, TypeAlias

Status: TypeAlias = Literal["applied", "skipped", "failed", "conflict"]

#: The strategy of every event that compresses nothing (a pop, a clear, a fork's first event,
#: an erasure, an undo; docs/design.md §7): its reason names what it did. Here, where both the store
#: that writes such events and the strategy registry that names them may import it.
MANUAL: Final = 0


@dataclass(frozen=True, slots=True)
class FactCheck:
    """What the fact check found of one summary (docs/design.md §6): of the facts of the
    messages it replaced, how many the summary kept, how many the repair request added, how
    many its index line lists, and which are in neither (`dropped_facts`, as stored: an
    erasure scrubs them like every other copy of erased text).

    ``found == kept + repaired + listed + dropped``.
    """

    found: int
    kept: int
    repaired: int
    listed: int
    dropped: int
    dropped_facts: tuple[str, ...] = ()
    #: Summarizer calls the repair made (0 or 1; its tokens are in the event's).
    repair_calls: int = 0

    @property
    def visible(self) -> int:
        """Facts the summary message shows verbatim or lists: all but the dropped."""
        return self.found - self.dropped


@dataclass(frozen=True, slots=True)
class Event:
    """One compression attempt: what ran, why, what it did and what it cost."""

    session_id: str
    id: int
    #: The rung, 1-8 (docs/design.md §3; 7 is the fold, 8 masking), or `MANUAL` (0) for an
    #: event that compresses nothing (a pop, a clear, a fork, an erasure), which its reason names.
    strategy: int
    status: Status
    #: Why it ran: 'count' or 'tokens' (which trigger held), 'manual' (`pop_last`), or
    #: 'fallback' (the offline summarizer stood in to keep the bound, docs/design.md §2),
    #: 'clear', 'fork' (the first event of a forked session), 'erase' (`mem.erase`) or 'undo'
    #: (`mem.undo`).
    reason: str
    messages_before: int
    messages_after: int
    tokens_before: int
    tokens_after: int
    replaced_ids: tuple[int, ...]
    summary_message_id: int | None
    offload_uuid: uuid.UUID | None
    model: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    latency_ms: float | None
    error: str | None
    session_version: int
    created_at: datetime | None = None
    #: The reason the caller gave for an erasure (never message content).
    note: str | None = None
    #: Copied from the parent by a fork (what made the copied summaries); the audit views
    #: count it in the parent only.
    inherited: bool = False
    #: An undo (reason 'undo', `mem.undo`): the id of the compression it took back.
    undoes: int | None = None
    #: The fact check of the summary it wrote (S1, S4, S5, S6, the fold), else None (previews,
    #: masking, attempts that changed nothing, manual events).
    facts: FactCheck | None = None

    @property
    def tokens_saved(self) -> int:
        return self.tokens_before - self.tokens_after
