"""Read-only queries for the inspection commands (`autoctx lineage`, `plot`, `export`, ...).

The store's unit-of-work methods serve the library; these serve humans looking at a session
after the fact. Every statement filters on one session_id (the sharding key, DESIGN.md) and none
writes.
"""

from __future__ import annotations

import uuid as uuid_mod
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from .sql import COVERING_CHAIN, LINEAGE_DOWN
from .tables import compression_events, messages, offloads, working_set

__all__ = [
    "LineageEdge",
    "MessageStamp",
    "OffloadRow",
    "covering_chain",
    "lineage_edges",
    "message_stamps",
    "offload_rows",
    "offloads_matching",
    "working_positions",
]


@dataclass(frozen=True, slots=True)
class MessageStamp:
    """When a stored message was written and what it weighs (for the token timeline)."""

    id: int
    kind: str
    tokens: int
    #: The compression event that wrote it; None for the caller's originals.
    event_id: int | None
    created_at: datetime


@dataclass(frozen=True, slots=True)
class LineageEdge:
    """`summary_id` replaced `replaced_id` (its `ordinal`-th message) in event `event_id`."""

    summary_id: int
    ordinal: int
    replaced_id: int
    event_id: int
    #: 1 for the messages a summary replaced directly, 2 for what those replaced, ...
    depth: int


@dataclass(frozen=True, slots=True)
class OffloadRow:
    uuid: uuid_mod.UUID
    event_id: int
    message_ids: tuple[int, ...]
    created_at: datetime
    strategy: int
    #: The handle its tag shows the model (docs/design.md §4).
    handle: int


def message_stamps(engine: Engine, session_id: str) -> list[MessageStamp]:
    """Every stored message of the session (originals and compressions' output), in id order.

    Ids are allocated per session in commit order, so this order interleaves appends and
    compressions exactly as they happened.
    """
    stmt = (
        sa.select(
            messages.c.id,
            messages.c.kind,
            messages.c.tokens,
            messages.c.event_id,
            messages.c.created_at,
        )
        .where(messages.c.session_id == session_id)
        .order_by(messages.c.id)
    )
    with engine.connect() as conn:
        return [
            MessageStamp(r.id, r.kind, r.tokens, r.event_id, r.created_at)
            for r in conn.execute(stmt)
        ]


def lineage_edges(engine: Engine, session_id: str, message_id: int) -> list[LineageEdge]:
    """The lineage below `message_id`, down to the originals (one recursive query)."""
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(LINEAGE_DOWN, {"sid": session_id, "mid": message_id})
        return [
            LineageEdge(r.summary_id, r.ordinal, r.replaced_id, r.event_id, r.depth) for r in rows
        ]


def covering_chain(engine: Engine, session_id: str, message_id: int) -> list[int]:
    """The summaries above `message_id`, nearest first: the last one is the working message
    that stands for it now (empty when the message itself is in the working context)."""
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(COVERING_CHAIN, {"sid": session_id, "mid": message_id})
        return [r.summary_id for r in rows]


def working_positions(engine: Engine, session_id: str, ids: Sequence[int]) -> dict[int, int]:
    """Index in the working context (0-based) of each of `ids` that is in it."""
    ranked = (
        sa.select(
            working_set.c.message_id,
            (sa.func.row_number().over(order_by=working_set.c.position) - 1).label("idx"),
        )
        .where(working_set.c.session_id == session_id)
        .subquery()
    )
    stmt = sa.select(ranked.c.message_id, ranked.c.idx).where(ranked.c.message_id.in_(list(ids)))
    with engine.connect() as conn:
        return {r.message_id: r.idx for r in conn.execute(stmt)}


def _offload_select() -> sa.Select[tuple[uuid_mod.UUID, int, list[int], datetime, int, int]]:
    return sa.select(
        offloads.c.uuid,
        offloads.c.event_id,
        offloads.c.message_ids,
        offloads.c.created_at,
        compression_events.c.strategy,
        offloads.c.handle,
    ).join(
        compression_events,
        sa.and_(
            compression_events.c.session_id == offloads.c.session_id,
            compression_events.c.id == offloads.c.event_id,
        ),
    )


def offload_rows(
    engine: Engine, session_id: str, events: Sequence[int] | None = None
) -> list[OffloadRow]:
    """Every offload of the session, oldest first; with `events`, those of these events only
    (through the index on the offloads' event, migration 0020)."""
    stmt = (
        _offload_select().where(offloads.c.session_id == session_id).order_by(offloads.c.event_id)
    )
    if events is not None:
        stmt = stmt.where(offloads.c.event_id.in_(list(events)))
    with engine.connect() as conn:
        return [
            OffloadRow(r.uuid, r.event_id, tuple(r.message_ids), r.created_at, r.strategy, r.handle)
            for r in conn.execute(stmt)
        ]


def offloads_matching(engine: Engine, session_id: str, prefix: str) -> list[uuid_mod.UUID]:
    """Offload uuids of the session whose text form starts with `prefix` (at most 2: enough
    to tell a unique match from an ambiguous one)."""
    stmt = (
        sa.select(offloads.c.uuid)
        .where(
            offloads.c.session_id == session_id,
            sa.cast(offloads.c.uuid, sa.Text).startswith(prefix.lower(), autoescape=True),
        )
        .order_by(offloads.c.uuid)
        .limit(2)
    )
    with engine.connect() as conn:
        return list(conn.execute(stmt).scalars())
