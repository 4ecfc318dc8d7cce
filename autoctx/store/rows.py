"""The SQL texts of the store's hot paths and the conversions between rows and objects.

Kept apart from `store.py`, which holds the units of work, so that each reads on its own.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Connection, Row

from ..events import Event
from ..intake import Prepared
from ..messages import Msg, block_from_json


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """A session row, without its messages."""

    session_id: str
    tenant: str | None
    version: int
    message_count: int
    token_count: int
    model: str
    encoding: str
    config: dict[str, Any]
    plan: dict[str, Any] | None
    settled_version: int | None
    created_at: Any = None
    updated_at: Any = None
    #: Which creation of the id this is (SPEC.md section 5): a session deleted and created
    #: again under the same id has another one.
    incarnation: uuid.UUID | None = None


def msg_from_columns(
    id_: int,
    role: Any,
    name: str | None,
    content: Any,
    metadata: Any,
    kind: Any,
    pinned: bool,
    tokens: int,
) -> Msg:
    """A `Msg` from the message columns, in the order `LOAD_WORKING` and `MESSAGES_BY_ID`
    select them (a NULL metadata, as `LOAD_WORKING` writes an empty one, is empty)."""
    return Msg(
        role=role,
        content=tuple(block_from_json(b) for b in content),
        name=name,
        metadata=metadata or {},
        kind=kind,
        pinned=pinned,
        id=id_,
        tokens=tokens,
    )


def msg_from_row(row: Any) -> Msg:
    """A `Msg` from a row holding the message columns by name."""
    return msg_from_columns(
        row.id, row.role, row.name, row.content, row.metadata, row.kind, row.pinned, row.tokens
    )


#: The condition every read of a session's rows carries: the session is still the incarnation
#: the store opened (SPEC.md section 5). Uncorrelated, so PostgreSQL checks it once per
#: statement (one primary-key probe); an empty result is then told from a deleted session by
#: `Store._check_alive`.
ALIVE = (
    "EXISTS (SELECT 1 FROM sessions s0 WHERE s0.session_id = %(sid)s "
    "AND s0.incarnation = %(inc)s)"
)

# The hot paths are plain SQL run through `exec_driver_sql`: SQLAlchemy's events still see every
# statement (the sharding test captures them all) but no per-row parameter or result
# processing is done in Python.

#: The whole append in one statement, guarded by the session version the store expects.
#: Every part reads the same snapshot of `s`: if the guard fails, `s` is empty and the inserts,
#: which select from it, insert nothing.
#: Claims `n` ids and positions and moves the totals on, if the session is still at `version`.
CLAIM_AT_VERSION = """
UPDATE sessions
SET next_message_id = next_message_id + %(n)s, next_position = next_position + %(n)s,
    message_count = message_count + %(n)s, token_count = token_count + %(added_tokens)s,
    version = version + 1, open_calls = %(open_calls)s::jsonb, updated_at = now()
WHERE sessions.session_id = %(sid)s AND sessions.incarnation = %(inc)s
  AND sessions.version = %(version)s
RETURNING next_message_id - %(n)s AS first_id, next_position - %(n)s AS first_pos,
          message_count, token_count,
          CASE WHEN config ? 'search_config' THEN coalesce(config->>'search_config', 'none')
               ELSE 'simple' END AS search_config
"""

APPEND_AT_VERSION = f"""
WITH s AS ({CLAIM_AT_VERSION}), m AS (
    INSERT INTO messages (session_id, id, role, name, content, metadata, kind, pinned, final,
                          tokens, chars, call_ids, result_ids, tool_names, search_config)
    SELECT %(sid)s, s.first_id + u.ord - 1, u.role, u.name, u.content::jsonb, u.metadata::jsonb,
           u.kind, u.pinned, u.final, u.tokens, u.chars, u.call_ids::text[],
           u.result_ids::text[], u.tool_names::text[], s.search_config
    FROM s, unnest(%(role)b::text[], %(name)b::text[], %(content)b::text[],
                   %(metadata)b::text[], %(kind)b::text[], %(pinned)b::bool[], %(final)b::bool[],
                   %(tokens)b::int[], %(chars)b::int[], %(call_ids)b::text[],
                   %(result_ids)b::text[], %(tool_names)b::text[])
         WITH ORDINALITY AS u(role, name, content, metadata, kind, pinned, final, tokens, chars,
                              call_ids, result_ids, tool_names, ord)
), w AS (
    INSERT INTO working_set (session_id, position, message_id)
    SELECT %(sid)s, s.first_pos + g, s.first_id + g FROM s, generate_series(0, %(n)s - 1) AS g
)
SELECT first_id, message_count, token_count FROM s
"""

LOAD_WORKING = f"""
SELECT m.id, m.role, m.name, m.content, NULLIF(m.metadata, '{{}}'::jsonb), m.kind, m.pinned,
       m.tokens
FROM working_set w JOIN messages m ON m.session_id = w.session_id AND m.id = w.message_id
WHERE w.session_id = %(sid)s AND {ALIVE} ORDER BY w.position
"""

SNAPSHOT = """
SELECT w.position, m.id, m.role, m.kind, m.final, m.pinned, m.tokens, m.chars,
       m.call_ids, m.result_ids, m.tool_names
FROM working_set w JOIN messages m ON m.session_id = w.session_id AND m.id = w.message_id
WHERE w.session_id = %(sid)s AND w.position > %(after)s ORDER BY w.position
"""


# Messages by id: a join on the unnested ids, not `id = ANY(:ids)`, which PostgreSQL applies as
# a filter scanning the whole array for every row (quadratic for a big offload or S6 range).
MESSAGES_BY_ID = f"""
SELECT m.id, m.role, m.name, m.content, m.metadata, m.kind, m.pinned, m.tokens
FROM unnest(%(ids)s::bigint[]) AS u(id) JOIN messages m ON m.session_id = %(sid)s AND m.id = u.id
WHERE {ALIVE}
"""
DOCUMENTS_BY_ID = f"""
SELECT m.id, m.role, m.kind, m.content, m.metadata
FROM unnest(%(ids)s::bigint[]) AS u(id) JOIN messages m ON m.session_id = %(sid)s AND m.id = u.id
WHERE {ALIVE}
"""
#: The session's latest `n` working message ids, in order (all of them when `n` is NULL:
#: PostgreSQL reads LIMIT NULL as no limit); no row once the incarnation is gone.
WORKING_IDS = """
SELECT coalesce((SELECT array_agg(x.message_id ORDER BY x.position)
                 FROM (SELECT w.message_id, w.position FROM working_set w
                       WHERE w.session_id = s.session_id
                       ORDER BY w.position DESC LIMIT %(n)s) x), '{}')
FROM sessions s WHERE s.session_id = %(sid)s AND s.incarnation = %(inc)s
"""
LAST_WORKING = """
SELECT w.position, m.id, m.final
FROM working_set w JOIN messages m ON m.session_id = w.session_id AND m.id = w.message_id
WHERE w.session_id = %(sid)s ORDER BY w.position DESC LIMIT 1
"""
TAIL_CALLS = """
SELECT m.role, m.call_ids, m.result_ids, m.tool_names
FROM working_set w JOIN messages m ON m.session_id = w.session_id AND m.id = w.message_id
WHERE w.session_id = %(sid)s ORDER BY w.position DESC LIMIT %(n)s
"""


def messages_by_id(
    conn: Connection, session_id: str, incarnation: uuid.UUID, ids: list[int]
) -> dict[int, Msg]:
    rows = conn.exec_driver_sql(
        MESSAGES_BY_ID, {"sid": session_id, "inc": incarnation, "ids": ids}
    )
    return {r[0]: msg_from_columns(*r) for r in rows}


def avoid_nested_loops(conn: Connection) -> None:
    """Keep the planner off nested loops for the whole-session reads of this transaction.

    Before ANALYZE has seen a fast-growing session, PostgreSQL estimates its working set at a
    few rows and joins it to messages with a nested loop that is quadratic in the session's
    size (seconds at 5k messages, hours at 100k); a hash or merge join is always right here.
    """
    conn.exec_driver_sql("SET LOCAL enable_nestloop = off")


def array_literal(items: Sequence[str]) -> str:
    """A PostgreSQL text[] literal: per-row arrays travel as one text each through `unnest`
    (a ragged list of lists is not a PostgreSQL array)."""
    quoted = (s.replace("\\", "\\\\").replace('"', '\\"') for s in items)
    return "{" + ",".join(f'"{q}"' for q in quoted) + "}"


def stored(m: Msg, msg_id: int, tokens: int) -> Msg:
    """`m` with its id and tokens (direct construction: `dataclasses.replace` costs more than
    the rest of the row on the append path)."""
    return Msg(m.role, m.content, m.name, m.metadata, m.kind, m.pinned, msg_id, tokens)


def event_from_row(row: Row[Any]) -> Event:
    return Event(
        session_id=row.session_id,
        id=row.id,
        strategy=row.strategy,
        status=row.status,
        reason=row.reason,
        messages_before=row.messages_before,
        messages_after=row.messages_after,
        tokens_before=row.tokens_before,
        tokens_after=row.tokens_after,
        replaced_ids=tuple(row.replaced_ids),
        summary_message_id=row.summary_message_id,
        offload_uuid=row.offload_uuid,
        model=row.model,
        prompt_tokens=row.prompt_tokens,
        completion_tokens=row.completion_tokens,
        latency_ms=row.latency_ms,
        error=row.error,
        session_version=row.session_version,
        created_at=row.created_at,
    )


def message_row(session_id: str, msg_id: int, p: Prepared, event_id: int | None) -> dict[str, Any]:
    m = p.msg
    calls = m.tool_uses
    results = m.tool_results
    return {
        "session_id": session_id,
        "id": msg_id,
        "role": m.role,
        "name": m.name,
        "content": m.content_json(),
        "metadata": dict(m.metadata),
        "kind": m.kind,
        "pinned": m.pinned,
        "final": p.final,
        "tokens": p.tokens,
        "chars": p.chars,
        "call_ids": [c.id for c in calls],
        "result_ids": [r.tool_use_id for r in results],
        "tool_names": [c.name for c in calls] + [r.name for r in results],
        "event_id": event_id,
    }


def search_config_of(config: Mapping[str, Any]) -> str:
    """The `messages.search_config` of a session's config: the text search configuration its
    originals are indexed with, 'none' for a session created with `search_config=None`, and
    'simple' for one recorded before migration 0008 (its messages were indexed with it)."""
    if "search_config" not in config:
        return "simple"
    value = config["search_config"]
    return value if isinstance(value, str) else "none"


def session_info(row: Row[Any]) -> SessionInfo:
    return SessionInfo(
        session_id=row.session_id,
        tenant=row.tenant,
        version=row.version,
        message_count=row.message_count,
        token_count=row.token_count,
        model=row.model,
        encoding=row.encoding,
        config=row.config,
        plan=row.plan,
        settled_version=row.settled_version,
        created_at=row.created_at,
        updated_at=row.updated_at,
        incarnation=row.incarnation,
    )
