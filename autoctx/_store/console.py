"""Read-only, paged queries for the audit console (`autoctx ui`).

Every function reads within the store's tenant (the sessions of `store.tenant`, or the sessions
without a tenant for a store without one), twice over: each statement names the tenant, and each
transaction sets the tenant scope the row-level security policies check, so a database role
granted one tenant sees that tenant only whatever the console asks. A session outside the scope
looks exactly like an unknown one (`SessionNotFound`, `MessageNotFound`, `OffloadNotFound`).

Nothing here loads a whole session: each page is a keyset read on an index that exists (the
primary keys of the session tables), at most `limit` rows, with no OFFSET; the session list
ranks the tenant's sessions by an aggregate and pages after a cursor session. Every transaction is
`READ ONLY`, so the console cannot write even by mistake.

A page is one `read`: its statements (each a `Read`: the SQL, its parameters, and what its rows
become) go to the server together, in one READ ONLY transaction with the tenant scope, in one
round trip (psycopg's pipeline mode). So no statement of a page may need another's result: where
one did (the index of a working page's first row, the event that wrote a message, the messages
of an offload's page), the statement computes it itself.
"""

from __future__ import annotations

import uuid as uuid_mod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Literal, TypeAlias

from sqlalchemy.engine import Engine

from .._arguments import OffloadRef
from .._errors import MessageNotFound, OffloadNotFound, SessionNotFound
from .._events import FactCheck
from .._messages import Msg
from .page_read import PageScope, Read, read
from .rows import facts_of_row, msg_from_columns
from .scope import TenantScope
from .sql import OWN_OFFLOAD

__all__ = [
    "SESSION_SORTS",
    "EventRow",
    "Growth",
    "MessageDetail",
    "MessageRow",
    "OffloadInfo",
    "PageScope",
    "Read",
    "SessionRow",
    "SessionSort",
    "TimelinePoint",
    "covering_chain",
    "events_page",
    "lineage_children",
    "made_by",
    "message",
    "offload_info",
    "offload_messages",
    "offload_originals",
    "read",
    "read_only",
    "session_row",
    "sessions_page",
    "timeline",
    "working_page",
]

SessionSort = Literal["window", "cost", "failures", "updated"]
#: The session list's orders: nearest the window, most expensive (summarizer tokens, as the
#: `autoctx_session_cost` view counts them), most failures, most recently updated.
SESSION_SORTS: Final[tuple[SessionSort, ...]] = ("window", "cost", "failures", "updated")

#: Each order's key, never NULL (a session without a window has fill -1, after every other),
#: highest first; ties go by session id.
_SORT_KEY: Final[dict[SessionSort, str]] = {
    "window": "coalesce(fill, -1)",
    "cost": "cost",
    "failures": "failures",
    "updated": "updated_at",
}

#: Characters of a message's text a list shows (the message's own page shows all of it).
PREVIEW_CHARS: Final = 240

#: The start of a message's text for a list: text blocks, tool calls (name and arguments) and
#: string tool outputs, read from the stored JSON so that a list never fetches whole payloads.
_PREVIEW = f"""
left(coalesce((SELECT string_agg(coalesce(
        b->>'text',
        CASE WHEN b ? 'arguments' THEN (b->>'name') || ' ' || (b->>'arguments') END,
        CASE WHEN jsonb_typeof(b->'output') = 'string' THEN b->>'output' END,
        ''), ' ')
    FROM jsonb_array_elements(m.content) AS b), ''), {PREVIEW_CHARS})"""

#: A message exactly as stored: the columns `msg_from_columns` takes, in its order.
_MSG_COLUMNS = "m.id, m.role, m.name, m.content, m.metadata, m.kind, m.pinned, m.tokens"

#: A message as a list shows it, after its position in the list (a `MessageRow`).
_ROW_COLUMNS = (
    f"m.id, m.role, m.kind, m.pinned, m.tokens, m.event_id, {_PREVIEW} AS preview, m.chars"
)


@dataclass(slots=True)
class SessionRow:
    session_id: str
    tenant: str | None
    model: str
    message_count: int
    token_count: int
    max_tokens: int | None
    #: Working tokens over the window (None without a window in the config).
    fill: float | None
    #: Summarizer prompt + completion tokens of the session's own events.
    cost: int
    failures: int
    events: int
    version: int
    updated_at: datetime
    config: dict[str, Any]


@dataclass(slots=True)
class TimelinePoint:
    """One compression event, as the token timeline draws it."""

    event_id: int
    strategy: int
    status: str
    reason: str
    tokens_before: int
    tokens_after: int
    version: int
    created_at: datetime


#: A message as a list shows it, psycopg's row as it came (`_ROW_COLUMNS` after the list's key):
#: the working-set position (working context pages) or the lineage ordinal (children), id,
#: role, kind, pinned, tokens, event_id, the start of its text (`PREVIEW_CHARS` at most) and
#: its length in characters. A list renders straight from these tuples: an object per row cost
#: 0.3 us each, 30 us of a page whose statements take 0.3 ms of the console's CPU (issue 33).
MessageRow: TypeAlias = tuple[int, int, str, str, bool, int, int | None, str, int]


@dataclass(slots=True)
class OffloadInfo:
    uuid: uuid_mod.UUID
    #: The handle its tag shows the model (docs/design.md §4).
    handle: int
    event_id: int
    strategy: int
    message_ids: tuple[int, ...]
    created_at: datetime


def read_only(engine: Engine) -> Engine:
    """The engine the console's searches read through: every transaction READ ONLY."""
    return engine.execution_options(postgresql_readonly=True)


def _tenant_scope(tenant: str | None, alias: str = "s") -> str:
    return f"{alias}.tenant = %(tenant)s" if tenant is not None else f"{alias}.tenant IS NULL"


def _in_scope(store: TenantScope, alias: str = "s") -> str:
    return _tenant_scope(store.tenant, alias)


def _params(store: TenantScope, **values: Any) -> dict[str, Any]:
    return {"tenant": store.tenant, **values}


_SESSIONS = """
SELECT s.session_id, s.tenant, s.model, s.message_count, s.token_count,
       (s.config->>'max_tokens')::bigint AS max_tokens,
       s.token_count::double precision / nullif((s.config->>'max_tokens')::bigint, 0) AS fill,
       coalesce(e.cost, 0) AS cost, coalesce(e.failures, 0) AS failures,
       coalesce(e.events, 0) AS events, s.version, s.updated_at, s.config
FROM sessions s
LEFT JOIN LATERAL (
    SELECT sum(coalesce(ce.prompt_tokens, 0) + coalesce(ce.completion_tokens, 0))
               FILTER (WHERE NOT ce.inherited)::bigint AS cost,
           count(*) FILTER (WHERE ce.status = 'failed') AS failures,
           count(*) AS events
    FROM compression_events ce WHERE ce.session_id = s.session_id
) e ON true
WHERE {where}
"""


def _session_row(r: Sequence[Any]) -> SessionRow:
    # The config as psycopg parsed it: a dict of its own, not copied again. (A page of the
    # list has one more column, its order's key.)
    return SessionRow(
        r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10], r[11], r[12]
    )


_RANKED = """
WITH ranked AS ({sessions}), keyed AS (SELECT r.*, {key} AS k FROM ranked r)
SELECT r.* FROM keyed r {cursor}
ORDER BY r.k {direction}, r.session_id {tie} LIMIT %(limit)s
"""
#: A keyset page: the sessions after (or before) the cursor session in the order "k DESC,
#: session_id ASC". The cursor's key is read from the same ranking, so the URL carries its id
#: only.
_CURSOR = (
    "JOIN keyed c ON c.session_id = %(cursor)s "
    "AND (r.k {cmp} c.k OR (r.k = c.k AND r.session_id {tie_cmp} c.session_id))"
)


def sessions_page(
    store: TenantScope,
    sort: SessionSort,
    *,
    after: str | None = None,
    before: str | None = None,
    limit: int,
) -> tuple[Read[list[SessionRow]], Read[int]]:
    """Up to `limit` of the tenant's sessions in `sort` order (highest first, then by id):
    the first ones, those after the session `after`, or those before the session `before`
    (a keyset page: no offset, whatever the page); and how many sessions there are.

    The orders are by aggregates (summarizer tokens, failures) that no index holds, so each
    page ranks the tenant's sessions: one probe of `compression_events`' primary key
    (session_id, id) each. A cursor session that no longer exists gives an empty page.
    """
    sql = sessions_sql(store.tenant, sort, after=after, before=before)
    params = _params(store, limit=limit, cursor=after if after is not None else before)

    def rows(found: list[Any]) -> list[SessionRow]:
        out = [_session_row(r) for r in found]
        return out[::-1] if before is not None else out

    return (
        Read(sql, params, rows),
        Read(
            f"SELECT count(*) FROM sessions s WHERE {_in_scope(store)}",
            _params(store),
            lambda found: int(found[0][0]),
        ),
    )


def sessions_sql(
    tenant: str | None, sort: SessionSort, *, after: str | None, before: str | None
) -> str:
    """The statement of a page of `sessions_page`."""
    backwards = before is not None
    cursor = (
        ""
        if after is None and before is None
        else _CURSOR.format(cmp=">" if backwards else "<", tie_cmp="<" if backwards else ">")
    )
    return _RANKED.format(
        sessions=_SESSIONS.format(where=_tenant_scope(tenant)),
        key=_SORT_KEY[sort],
        cursor=cursor,
        direction="ASC" if backwards else "DESC",
        tie="DESC" if backwards else "ASC",
    )


def session_row(store: TenantScope, session_id: str) -> Read[SessionRow]:
    """One session of the tenant; its build raises `SessionNotFound` for any other id."""

    def build(found: list[Any]) -> SessionRow:
        if not found:
            raise SessionNotFound(
                f"session {session_id!r} does not exist among "
                + (
                    f"tenant {store.tenant!r}"
                    if store.tenant is not None
                    else "untenanted sessions"
                )
                + "; start the console with --tenant for another tenant's sessions"
            )
        return _session_row(found[0])

    sql = _SESSIONS.format(where=f"s.session_id = %(sid)s AND {_in_scope(store)}")
    return Read(sql, _params(store, sid=session_id), build)


_TIMELINE = """
SELECT e.id, e.strategy, e.status, e.reason, e.tokens_before, e.tokens_after,
       e.session_version, e.created_at
FROM compression_events e JOIN sessions s ON s.session_id = e.session_id
WHERE e.session_id = %(sid)s AND {scope}
ORDER BY e.id
"""


@dataclass(slots=True)
class Growth:
    """Appends of originals between two events, as the timeline draws them: `appends` appends
    (each one a step of the session), adding `tokens`, after the first `events` events."""

    events: int
    appends: int
    tokens: int


#: The session's appends of originals (one append is one transaction, so one `created_at`),
#: placed among its events by time and summed into at most `buckets` steps, none across an
#: event: the timeline draws the steps the working context took between compressions.
_GROWTH = """
WITH appends AS (
    SELECT m.created_at AS at, sum(m.tokens)::bigint AS tokens
    FROM messages m JOIN sessions s ON s.session_id = m.session_id
    WHERE m.session_id = %(sid)s AND m.kind = 'original' AND {scope}
    GROUP BY m.created_at
), steps AS (
    SELECT a.at, a.tokens, 0 AS ev FROM appends a
  UNION ALL
    SELECT e.created_at, 0, 1 FROM compression_events e WHERE e.session_id = %(sid)s
), ordered AS (
    SELECT st.*, sum(st.ev) OVER w AS events, row_number() OVER w AS k, count(*) OVER () AS n
    FROM steps st WINDOW w AS (ORDER BY st.at, st.ev ROWS UNBOUNDED PRECEDING)
)
SELECT o.events, count(*) AS appends, sum(o.tokens)::bigint AS tokens
FROM ordered o WHERE o.ev = 0
GROUP BY o.events, (o.k - 1) * %(buckets)s / o.n
ORDER BY min(o.k)
"""


def timeline(
    store: TenantScope, session_id: str, *, buckets: int
) -> tuple[Read[list[TimelinePoint]], Read[list[Growth]]]:
    """Every compression event's numbers (no text), oldest first, and the appends between
    them in at most `buckets` (+ one per event) steps: the token timeline."""
    params = _params(store, sid=session_id, buckets=buckets)
    return (
        Read(
            _TIMELINE.format(scope=_in_scope(store)),
            params,
            lambda found: [TimelinePoint(*r) for r in found],
        ),
        Read(
            _GROWTH.format(scope=_in_scope(store)),
            params,
            lambda found: [Growth(int(r[0]), int(r[1]), int(r[2])) for r in found],
        ),
    )


_EVENTS = """
SELECT e.* FROM compression_events e JOIN sessions s ON s.session_id = e.session_id
WHERE e.session_id = %(sid)s AND {scope} AND e.id {op} %(key)s
ORDER BY e.id {direction} LIMIT %(limit)s
"""


def _keyset(after: int | None, before: int | None) -> tuple[str, str, int]:
    """(comparison, direction, key) of a keyset page: after a key, or before one (read
    backwards, then turned round)."""
    if before is not None:
        return "<", "DESC", before
    return ">", "ASC", after if after is not None else -(2**62)


@dataclass(slots=True)
class EventRow:
    """An event as the events page lists it: what `Event` holds but the ids of the messages it
    replaced, of which it keeps the count (a fold replaces thousands: copying their ids into
    an `Event`'s tuple was most of the Python of a page of events)."""

    id: int
    strategy: int
    status: str
    reason: str
    messages_before: int
    messages_after: int
    tokens_before: int
    tokens_after: int
    replaced: int
    summary_message_id: int | None
    offload_uuid: uuid_mod.UUID | None
    model: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    latency_ms: float | None
    error: str | None
    created_at: datetime | None
    note: str | None
    undoes: int | None
    facts: FactCheck | None


def _event_row(v: Mapping[str, Any]) -> EventRow:
    return EventRow(
        v["id"],
        v["strategy"],
        v["status"],
        v["reason"],
        v["messages_before"],
        v["messages_after"],
        v["tokens_before"],
        v["tokens_after"],
        len(v["replaced_ids"]),
        v["summary_message_id"],
        v["offload_uuid"],
        v["model"],
        v["prompt_tokens"],
        v["completion_tokens"],
        v["latency_ms"],
        v["error"],
        v.get("created_at"),
        v.get("note"),
        v.get("undoes"),
        facts_of_row(v),
    )


def events_page(
    store: TenantScope, session_id: str, *, after: int | None, before: int | None, limit: int
) -> Read[list[EventRow]]:
    """Up to `limit` events after (or before) an event id, in id order: a keyset page on the
    primary key (session_id, id)."""
    op, direction, key = _keyset(after, before)
    sql = _EVENTS.format(scope=_in_scope(store), op=op, direction=direction)

    def build(found: list[Any]) -> list[EventRow]:
        events = [_event_row(r) for r in found]
        return events[::-1] if before is not None else events

    return Read(sql, _params(store, sid=session_id, key=key, limit=limit), build, named=True)


#: The event that wrote a message (None for an original): by the message's own `event_id`;
#: with the offload of what the message replaced (a masking pass's event names none: it made
#: one per output).
_MADE_BY = f"""
SELECT e.*, own.uuid AS own_offload FROM messages m
JOIN sessions s ON s.session_id = m.session_id
JOIN compression_events e ON e.session_id = m.session_id AND e.id = m.event_id
{OWN_OFFLOAD}
WHERE m.session_id = %(sid)s AND m.id = %(id)s AND {{scope}}
"""


def made_by(store: TenantScope, session_id: str, message_id: int) -> Read[EventRow | None]:
    """The compression event that wrote message `message_id` (None for an original), its
    `offload_uuid` the offload of what that message replaced."""

    def build(found: list[Any]) -> EventRow | None:
        if not found:
            return None
        row = _event_row(found[0])
        row.offload_uuid = found[0]["own_offload"]
        return row

    return Read(
        _MADE_BY.format(scope=_in_scope(store)),
        _params(store, sid=session_id, id=message_id),
        build,
        named=True,
    )


#: The page's positions first (a range of the primary key, at most `limit` rows), then each
#: message by its primary key (`LIMIT 1` keeps the lateral probe from being flattened into a
#: join): the plan is that whatever the statistics say (a nested loop
#: that filters a join of the session's whole tables is what stale statistics chose, 590 ms
#: for a page of 3,000 messages).
_WORKING = f"""
SELECT w.position, {_ROW_COLUMNS}
FROM (
    SELECT w.position, w.message_id FROM working_set w
    JOIN sessions s ON s.session_id = w.session_id
    WHERE w.session_id = %(sid)s AND {{scope}} AND w.position {{op}} %(key)s
    ORDER BY w.position {{direction}} LIMIT %(limit)s
) w
CROSS JOIN LATERAL (
    SELECT m.* FROM messages m WHERE m.session_id = %(sid)s AND m.id = w.message_id LIMIT 1
) m
ORDER BY w.position {{direction}}
"""

#: The working messages up to a page's key (an index-only count on the primary key): those
#: before the page's first row, whichever side of the key the page is (`working_page`).
_BEFORE = (
    "SELECT count(*) FROM working_set w WHERE w.session_id = %(sid)s AND w.position {cmp} %(key)s"
)


def working_page(
    store: TenantScope, session_id: str, *, after: int | None, before: int | None, limit: int
) -> tuple[Read[list[MessageRow]], Read[int]]:
    """Up to `limit` working messages after (or before) a working-set position, in order (a
    keyset page on the primary key (session_id, position)), and the number of working messages
    up to the key: before a page after the key, the index of its first row (its first row is
    the first position past the key); before a page before the key, the index of its first
    row plus the page's length (the caller subtracts it)."""
    op, direction, key = _keyset(after, before)
    sql = _WORKING.format(scope=_in_scope(store), op=op, direction=direction)

    def rows(found: list[MessageRow]) -> list[MessageRow]:
        return found[::-1] if before is not None else found

    return (
        Read(sql, _params(store, sid=session_id, key=key, limit=limit), rows),
        Read(
            _BEFORE.format(cmp="<" if before is not None else "<="),
            {"sid": session_id, "key": key},
            lambda found: int(found[0][0]),
        ),
    )


_MESSAGE = f"""
SELECT {_MSG_COLUMNS},
       m.event_id, m.created_at,
       (SELECT count(*) FROM lineage l WHERE l.session_id = m.session_id
            AND l.summary_id = m.id) AS replaced,
       (SELECT w.position FROM working_set w WHERE w.session_id = m.session_id
            AND w.message_id = m.id) AS position
FROM messages m JOIN sessions s ON s.session_id = m.session_id
WHERE m.session_id = %(sid)s AND m.id = %(id)s AND {{scope}}
"""


@dataclass(slots=True)
class MessageDetail:
    msg: Msg
    #: The compression event that wrote it (None for an original).
    event_id: int | None
    created_at: datetime
    #: How many messages it replaced directly (lineage rows below it).
    replaced: int
    #: Its working-set position, None when it is not in the working context.
    position: int | None


def message(store: TenantScope, session_id: str, message_id: int) -> Read[MessageDetail]:
    """One stored message of a session of the tenant; its build raises `MessageNotFound`
    otherwise."""

    def build(found: list[Any]) -> MessageDetail:
        if not found:
            raise MessageNotFound(f"no message {message_id} in session {session_id!r}")
        row = found[0]
        return MessageDetail(msg_from_columns(*row[:8]), row[8], row[9], row[10], row[11])

    return Read(
        _MESSAGE.format(scope=_in_scope(store)),
        _params(store, sid=session_id, id=message_id),
        build,
    )


_CHILDREN = f"""
SELECT l.ordinal, {_ROW_COLUMNS}
FROM (
    SELECT l.ordinal, l.replaced_id FROM lineage l
    JOIN sessions s ON s.session_id = l.session_id
    WHERE l.session_id = %(sid)s AND l.summary_id = %(mid)s AND {{scope}}
      AND l.ordinal > %(after)s
    ORDER BY l.ordinal LIMIT %(limit)s
) l
CROSS JOIN LATERAL (
    SELECT m.* FROM messages m WHERE m.session_id = %(sid)s AND m.id = l.replaced_id LIMIT 1
) m
ORDER BY l.ordinal
"""


def lineage_children(
    store: TenantScope, session_id: str, message_id: int, *, after: int, limit: int
) -> Read[list[MessageRow]]:
    """The messages `message_id` replaced directly, in order, after lineage ordinal `after`
    (a keyset page on lineage's primary key (session_id, summary_id, ordinal))."""
    return Read(
        _CHILDREN.format(scope=_in_scope(store)),
        _params(store, sid=session_id, mid=message_id, after=after, limit=limit),
        lambda found: found,
    )


_COVERING = """
WITH RECURSIVE up(summary_id, depth) AS (
    SELECT l.summary_id, 1 FROM lineage l
    WHERE l.session_id = %(sid)s AND l.replaced_id = %(mid)s
  UNION ALL
    SELECT l.summary_id, u.depth + 1 FROM lineage l
    JOIN up u ON l.session_id = %(sid)s AND l.replaced_id = u.summary_id
)
SELECT u.summary_id FROM up u JOIN sessions s ON s.session_id = %(sid)s
WHERE {scope} ORDER BY u.depth
"""


def covering_chain(store: TenantScope, session_id: str, message_id: int) -> Read[list[int]]:
    """The summaries above `message_id`, nearest first (lineage's replaced_id index)."""
    return Read(
        _COVERING.format(scope=_in_scope(store)),
        _params(store, sid=session_id, mid=message_id),
        lambda found: [r[0] for r in found],
    )


_OFFLOAD = """
SELECT o.uuid, o.handle, o.event_id, e.strategy, o.message_ids, o.created_at
FROM offloads o
JOIN sessions s ON s.session_id = o.session_id
JOIN compression_events e ON e.session_id = o.session_id AND e.id = o.event_id
WHERE o.session_id = %(sid)s AND {named} AND {scope}
"""


def _named(offload: OffloadRef) -> str:
    """The condition on `offloads o` that picks the offload `%(ref)s` (a handle or a uuid)."""
    return "o.handle = %(ref)s" if isinstance(offload, int) else "o.uuid = %(ref)s"


def offload_info(store: TenantScope, session_id: str, offload: OffloadRef) -> Read[OffloadInfo]:
    """An offload (by uuid or handle) of a session of the tenant; its build raises
    `OffloadNotFound` otherwise."""

    def build(found: list[Any]) -> OffloadInfo:
        if not found:
            raise OffloadNotFound(
                f"no offloaded context with id {offload} in session {session_id!r}"
            )
        row = found[0]
        return OffloadInfo(row[0], row[1], row[2], row[3], tuple(row[4]), row[5])

    return Read(
        _OFFLOAD.format(named=_named(offload), scope=_in_scope(store)),
        _params(store, sid=session_id, ref=offload),
        build,
    )


#: A page of the messages an offload removed, in its order: the slice `start` (0-based) to
#: `stop` of its `message_ids`, read from the offload in the same statement.
_BY_ID = f"""
SELECT {_MSG_COLUMNS}
FROM offloads o
JOIN sessions s ON s.session_id = o.session_id
CROSS JOIN LATERAL unnest(o.message_ids[%(start)s + 1 : %(stop)s]) WITH ORDINALITY AS u(id, ord)
JOIN messages m ON m.session_id = %(sid)s AND m.id = u.id
WHERE o.session_id = %(sid)s AND {{named}} AND {{scope}}
ORDER BY u.ord
"""


def offload_messages(
    store: TenantScope, session_id: str, offload: OffloadRef, *, start: int, limit: int
) -> Read[list[Msg]]:
    """The stored messages of an offload's `message_ids` from index `start`, at most `limit`,
    in that order, exactly as stored."""
    return Read(
        _BY_ID.format(named=_named(offload), scope=_in_scope(store)),
        _params(store, sid=session_id, ref=offload, start=start, stop=start + limit),
        lambda found: [msg_from_columns(*r) for r in found],
    )


#: The originals behind an offload, down through nested summaries. Every message a compression
#: wrote stands for one of its offloads (the lineage row of the offload's first message, under
#: the same event, names it), so the summaries are a small set read from the offloads; the
#: walk descends through summaries only (one
#: primary-key range of lineage per summary, LATERAL so that it is never a hash join over the
#: session's whole lineage per level), and the originals are the children that are not
#: summaries. Originals are appended in order and ids are allocated in commit order, so id
#: order is the order they happened in: a keyset page on it reads content for its rows only.
_ORIGINALS = f"""
WITH RECURSIVE
sums AS MATERIALIZED (
    SELECT l.summary_id AS id FROM offloads o
    JOIN lineage l ON l.session_id = o.session_id AND l.replaced_id = o.message_ids[1]
                  AND l.event_id = o.event_id
    WHERE o.session_id = %(sid)s
),
removed AS MATERIALIZED (
    SELECT u.id
    FROM offloads o
    JOIN sessions s ON s.session_id = o.session_id
    CROSS JOIN LATERAL unnest(o.message_ids) AS u(id)
    WHERE o.session_id = %(sid)s AND {{named}} AND {{scope}}
),
down(id) AS (
    SELECT r.id FROM removed r WHERE r.id IN (SELECT id FROM sums)
  UNION ALL
    SELECT c.replaced_id FROM down d
    CROSS JOIN LATERAL (
        SELECT l.replaced_id FROM lineage l
        WHERE l.session_id = %(sid)s AND l.summary_id = d.id
    ) AS c
    WHERE c.replaced_id IN (SELECT id FROM sums)
),
below AS (
    SELECT r.id FROM removed r
  UNION ALL
    SELECT c.replaced_id FROM down d
    CROSS JOIN LATERAL (
        SELECT l.replaced_id FROM lineage l
        WHERE l.session_id = %(sid)s AND l.summary_id = d.id
    ) AS c
),
page AS (
    SELECT b.id FROM below b
    WHERE b.id > %(after)s AND b.id NOT IN (SELECT id FROM sums)
    ORDER BY b.id LIMIT %(limit)s
)
SELECT {_MSG_COLUMNS}
FROM page p JOIN messages m ON m.session_id = %(sid)s AND m.id = p.id
ORDER BY m.id
"""


def offload_originals(
    store: TenantScope, session_id: str, offload: OffloadRef, *, after: int, limit: int
) -> Read[list[Msg]]:
    """Up to `limit` of the originals behind an offload (following lineage down through the
    summaries it removed), in id order after id `after`, exactly as stored."""
    return Read(
        _ORIGINALS.format(named=_named(offload), scope=_in_scope(store)),
        _params(store, sid=session_id, ref=offload, after=after, limit=limit),
        lambda found: [msg_from_columns(*r) for r in found],
    )
