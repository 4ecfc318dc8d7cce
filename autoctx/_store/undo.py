"""The SQL of an undo (docs/design.md §7): what it reads to be planned, and its write.

The plan is pure (`autoctx._undo`); `SessionStore.restore` applies it as one unit of work,
like every plan: it locks the session row, checks that each span is still where the plan saw
it (and that nothing else was written since the snapshot, so that the window check of the plan
is exact), writes, commits. The write, for each span (one, or one per output of a masking
pass), from the last back:

- the working-set rows of the span leave, and the restored messages take positions from the
  span's first: the gaps that compressions leave between positions are used first, and the
  positions after the span move on only by what does not fit (O(what follows), once, with
  INSERT and `autoctx_unlink_working`, which is all a granted role may do to the working set);

and then:

- one applied event: strategy 0, reason 'undo', `replaced_ids` the replacements that left the
  working context, `undoes` the compression taken back (whose offload and lineage rows name
  what came back), `note` set when the undo was forced over the window;
- the session's totals and version move on; its open calls do not change (a compression never
  takes a pending call, so neither does its undo).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Row

from .._errors import Conflict
from .._events import MANUAL, Event
from .._structure import MsgMeta
from .rows import event_from_row, event_of, event_row
from .sql import ALIVE, UNLINK_WORKING
from .tables import compression_events, messages, sessions, working_set

if TYPE_CHECKING:  # the store applies a plan; it does not make one
    from .._undo import Restoration, Span
    from .session_row import SessionRow

#: The messages an undo puts back: their metadata, the erasure that rewrote each (if any), and
#: each one's oldest original by lineage (itself for an original), which orders a fold's kept
#: messages among them (`autoctx._undo`).
_RESTORED = f"""
WITH RECURSIVE down(root, id) AS (
    SELECT u.id, u.id FROM unnest(%(ids)s::bigint[]) AS u(id)
  UNION
    SELECT d.root, l.replaced_id FROM down d
    JOIN lineage l ON l.session_id = %(sid)s AND l.summary_id = d.id
    WHERE %(keys)s
)
SELECT m.id, m.role, m.kind, m.final, m.pinned, m.tokens, m.chars, m.call_ids, m.result_ids,
       m.tool_names, m.erased_by, k.key
FROM (SELECT root, min(id) AS key FROM down GROUP BY root) k
JOIN messages m ON m.session_id = %(sid)s AND m.id = k.root
WHERE {ALIVE}
"""

#: The ranges of the compressions the session's undos took back: what the compressor does not
#: plan again (docs/design.md §7). Through the partial index on the undo events. A range is
#: an offload's: a masking pass's event covers one per output it masked.
_UNDONE = """
SELECT o.message_ids
FROM compression_events u
JOIN offloads o ON o.session_id = u.session_id AND o.event_id = u.undoes
WHERE u.session_id = %(sid)s AND u.reason = 'undo' AND u.status = 'applied'
"""

#: What a compression wrote: each offload of the event with the message that replaced it (the
#: summary its first replaced message's lineage row of this event names), in working order.
_WRITTEN = """
SELECT (
           SELECT l.summary_id FROM lineage l
           WHERE l.session_id = o.session_id AND l.event_id = o.event_id
             AND l.replaced_id = o.message_ids[1]
           LIMIT 1
       ) AS summary_id,
       o.message_ids, o.uuid
FROM offloads o
WHERE o.session_id = %(sid)s AND o.event_id = %(eid)s
ORDER BY summary_id
"""

#: The working messages from position `p` on, taken out (`UNLINK_WORKING`) to be put back
#: further on (`_MOVED`): in separate statements, since one that deletes and inserts the same
#: keys collides with them.
_TAIL = """
SELECT message_id FROM working_set WHERE session_id = %(sid)s AND position >= %(p)s
"""
_MOVED = """
INSERT INTO working_set (session_id, position, message_id)
SELECT %(sid)s, u.position, u.message_id
FROM unnest(%(positions)s::bigint[], %(ids)s::bigint[]) AS u(position, message_id)
"""

#: The summaries from a message up to the working message that stands for it now, nearest
#: first: lineage walked up only through messages that left the working context (a message
#: compressed, put back by an undo and compressed again has a summary of each time; only one
#: of them leads to the working context).
_HOLDER_PATH = """
WITH RECURSIVE up(id, path) AS (
    SELECT l.summary_id, ARRAY[l.summary_id]
    FROM lineage l WHERE l.session_id = %(sid)s AND l.replaced_id = %(mid)s
  UNION ALL
    SELECT l.summary_id, u.path || l.summary_id
    FROM up u JOIN lineage l ON l.session_id = %(sid)s AND l.replaced_id = u.id
    WHERE NOT EXISTS (
        SELECT 1 FROM working_set w WHERE w.session_id = %(sid)s AND w.message_id = u.id
    )
)
SELECT u.path FROM up u
JOIN working_set w ON w.session_id = %(sid)s AND w.message_id = u.id
LIMIT 1
"""

#: The latest applied event that took a message out of the working context.
_REMOVED_BY = """
SELECT * FROM compression_events
WHERE session_id = %(sid)s AND status = 'applied' AND %(mid)s = ANY(replaced_ids)
ORDER BY id DESC LIMIT 1
"""


@dataclass(frozen=True, slots=True)
class Restored:
    """What the plan of an undo needs of the messages it puts back."""

    metas: dict[int, MsgMeta]
    #: id -> the erasure event that tombstoned or rewrote it.
    erased: dict[int, int]
    #: id -> its order key (see `_RESTORED`); empty unless asked for.
    order_keys: dict[int, int]


@dataclass(frozen=True, slots=True)
class Written:
    """One replacement a compression wrote: its message, what it replaced, its offload."""

    summary_id: int
    replaced_ids: tuple[int, ...]
    offload_uuid: uuid.UUID


@dataclass(frozen=True, slots=True)
class Whereabouts:
    """Where a message that left the working context went."""

    #: The latest applied event that took it out (a compression, a pop, a clear, an undo).
    removed_by: Event | None
    #: The summaries that stand for it now, nearest first, down to one in the working context:
    #: (message id, the event that made it); empty when nothing in the working context does.
    chain: tuple[tuple[int, int | None], ...]


def find_event(store: SessionRow, event_id: int) -> Event | None:
    """The session's event with that id, or None."""
    with store.statement() as conn:
        row = conn.execute(
            sa.select(compression_events).where(
                compression_events.c.session_id == store.session_id,
                compression_events.c.id == event_id,
                store.alive_condition(),
            )
        ).one_or_none()
        if row is None:
            store.check_alive(conn)
    return None if row is None else event_from_row(row)


def restored(store: SessionRow, ids: Sequence[int], *, order_keys: bool) -> Restored:
    """The messages an undo puts back (see `Restored`)."""
    params = {
        "sid": store.session_id,
        "inc": store.incarnation(),
        "ids": list(ids),
        "keys": order_keys,
    }
    with store.statement() as conn:
        rows = conn.exec_driver_sql(_RESTORED, params).all()
        if not rows:
            store.check_alive(conn)
    metas: dict[int, MsgMeta] = {}
    erased: dict[int, int] = {}
    keys: dict[int, int] = {}
    for id_, role, kind, final, pinned, tokens, chars, calls, results, names, by, key in rows:
        metas[id_] = MsgMeta(
            id_,
            role,
            kind,
            final,
            pinned,
            tokens,
            chars,
            tuple(calls),
            tuple(results),
            tuple(names),
        )
        if by is not None:
            erased[id_] = by
        if order_keys:
            keys[id_] = key
    return Restored(metas, erased, keys)


def written_by(store: SessionRow, event_id: int) -> list[Written]:
    """The replacements the compression `event_id` wrote (see `Written`), in working order."""
    with store.statement() as conn:
        rows = conn.exec_driver_sql(_WRITTEN, {"sid": store.session_id, "eid": event_id}).all()
    return [Written(r.summary_id, tuple(r.message_ids), r.uuid) for r in rows]


def offloads_of(store: SessionRow, event: Event) -> list[uuid.UUID]:
    """The offloads an applied compression made: its own, or one per output of a masking
    pass (whose event names none)."""
    if event.offload_uuid is not None:
        return [event.offload_uuid]
    return [w.offload_uuid for w in written_by(store, event.id)]


def whereabouts(store: SessionRow, message_id: int) -> Whereabouts:
    """Where `message_id` went (see `Whereabouts`)."""
    params = {"sid": store.session_id, "mid": message_id}
    with store.statement() as conn:
        row = conn.exec_driver_sql(_REMOVED_BY, params).one_or_none()
        path = conn.exec_driver_sql(_HOLDER_PATH, params).scalar_one_or_none() or []
        made_by = dict(
            conn.execute(
                sa.select(messages.c.id, messages.c.event_id).where(
                    messages.c.session_id == store.session_id,
                    messages.c.id == sa.any_(sa.literal(list(path), sa.ARRAY(sa.BigInteger))),
                )
            ).all()
        )
    chain = tuple((mid, made_by.get(mid)) for mid in path)
    return Whereabouts(None if row is None else event_from_row(row), chain)


def undone_ranges(store: SessionRow) -> frozenset[tuple[int, ...]]:
    """The ranges the session's undos took back (see `_UNDONE`)."""
    with store.statement() as conn:
        rows = conn.exec_driver_sql(_UNDONE, {"sid": store.session_id}).all()
    return frozenset(tuple(r[0]) for r in rows)


def _unlink(conn: Connection, sid: str, ids: list[int]) -> list[tuple[int, int]]:
    """Take `ids` out of the working set; the function removes nothing for a login that does
    not hold the session's tenant, and then the transaction must not go on (as every writer's
    unlink, `SessionStore.apply`)."""
    removed = conn.exec_driver_sql(UNLINK_WORKING, {"sid": sid, "ids": ids}).all()
    if len(removed) != len(ids):
        raise Conflict(
            f"session {sid!r}: the working set could not be changed ({len(removed)} of "
            f"{len(ids)} messages taken out); the database login does not hold the session's "
            "tenant (`autoctx db grant-tenant`); nothing was written"
        )
    return [(r.pos, r.mid) for r in removed]


def write_restoration(
    conn: Connection,
    store: SessionRow,
    row: Row[Any],
    plan: Restoration,
    *,
    note: str | None,
    config: Mapping[str, Any],
) -> Event:
    """The writes of an undo, in the caller's transaction on the locked session `row`, whose
    spans the caller checked (see the module docstring)."""
    sid = store.session_id
    next_position = row.next_position
    # From the last span back: a span's writes move only what follows it, so the positions
    # of the spans before it stay as read.
    for span in reversed(plan.spans):
        next_position = _restore_span(conn, sid, span, next_position)
    removed = [span.removed for span in plan.spans]
    removed_tokens = conn.execute(
        sa.select(sa.func.coalesce(sa.func.sum(messages.c.tokens), 0)).where(
            messages.c.session_id == sid,
            messages.c.id == sa.any_(sa.literal(removed, sa.ARRAY(sa.BigInteger))),
        )
    ).scalar_one()
    version = row.version + 1
    values = event_row(
        sid,
        row.next_event_id,
        strategy=MANUAL,
        status="applied",
        reason="undo",
        messages=(row.message_count, plan.messages_after),
        tokens=(row.token_count, plan.tokens_after),
        replaced_ids=removed,
        replaced_tokens=removed_tokens,
        session_version=version,
        config=config,
        note=note,
        undoes=plan.undone,
    )
    conn.execute(sa.insert(compression_events).values(values))
    conn.execute(
        sa.update(sessions)
        .where(store.row_condition())
        .values(
            next_event_id=row.next_event_id + 1,
            next_position=next_position,
            message_count=plan.messages_after,
            token_count=plan.tokens_after,
            version=version,
            updated_at=sa.func.now(),
        )
    )
    return event_of(values)


def _restore_span(conn: Connection, sid: str, span: Span, next_position: int) -> int:
    """Put one span's sequence in place of its messages in the working set; returns the
    session's next free position after it."""
    ids = list(span.edit.replaced_ids)
    positions = dict(
        conn.execute(
            sa.select(working_set.c.message_id, working_set.c.position).where(
                working_set.c.session_id == sid,
                working_set.c.message_id == sa.any_(sa.literal(ids, sa.ARRAY(sa.BigInteger))),
            )
        ).all()
    )
    first, last = int(positions[ids[0]]), int(positions[ids[-1]])
    following = conn.execute(
        sa.select(sa.func.min(working_set.c.position)).where(
            working_set.c.session_id == sid, working_set.c.position > last
        )
    ).scalar_one()
    end = following if following is not None else next_position
    need = max(first + len(span.sequence) - end, 0)
    if need and following is not None:
        # Taken out and inserted again rather than updated: a granted role splices the working
        # set with INSERT and `autoctx_unlink_working` only (autoctx._store.tenancy), and a
        # one-step UPDATE of the positions could collide with the primary key row by row.
        tail = conn.exec_driver_sql(_TAIL, {"sid": sid, "p": following}).scalars().all()
        moved = _unlink(conn, sid, list(tail))
        conn.exec_driver_sql(
            _MOVED,
            {
                "sid": sid,
                "positions": [position + need for position, _ in moved],
                "ids": [message_id for _, message_id in moved],
            },
        )
    _unlink(conn, sid, ids)
    conn.execute(
        sa.insert(working_set),
        [
            {"session_id": sid, "position": first + k, "message_id": mid}
            for k, mid in enumerate(span.sequence)
        ],
    )
    return max(next_position + (need if following is not None else 0), first + len(span.sequence))
