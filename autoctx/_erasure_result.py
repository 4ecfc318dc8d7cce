"""What one erasure did (`AutoContextErasure`).

A public type, kept outside the SQL shell: the store's erasure builds it, the facade returns it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ._events import Event


@dataclass(frozen=True, slots=True)
class AutoContextErasure:
    """What one erasure did."""

    event: Event
    #: The originals tombstoned, in id order.
    erased_ids: tuple[int, ...]
    #: The messages derived from them that were rewritten (or tombstoned), in id order.
    rewritten_ids: tuple[int, ...]
    #: Of all these, the ones in the working context.
    working_ids: tuple[int, ...] = field(default=())
    #: The sessions forked from this one (and from them, ...): each owns its copies, which this
    #: erasure did not touch; erase the same ids there too.
    forks: tuple[str, ...] = field(default=())
    #: The answers of autoctx's own context tools (`context_search`, `context_reload`, stored
    #: as tool results) that quoted what was erased, as (session id, message id), in this
    #: session or another of the tenant: each was tombstoned as an original (with what derives
    #: from it) by an erasure event of its session with the same reason.
    answers: tuple[tuple[str, int], ...] = field(default=())
