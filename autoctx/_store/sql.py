"""The SQL texts of the store's hot paths, and the small helpers that run them.

Every raw statement of the store is written here with psycopg's `%(name)s` placeholders and run
with `Connection.exec_driver_sql`; everything else is SQLAlchemy Core. The units of work that use
them are in `store.py`, the row conversions in `rows.py`.
"""

from __future__ import annotations

import uuid

from sqlalchemy.engine import Connection

from .._messages import Msg
from .rows import msg_from_columns

#: The condition every read of a session's rows carries: the session is still the incarnation
#: the store opened (docs/design.md §5). Uncorrelated, so PostgreSQL checks it once per
#: statement (one primary-key probe); an empty result is then told from a deleted session by
#: `SessionStore.check_alive`.
ALIVE = (
    "EXISTS (SELECT 1 FROM sessions s0 WHERE s0.session_id = %(sid)s AND s0.incarnation = %(inc)s)"
)

# The hot paths are plain SQL run through `exec_driver_sql`: SQLAlchemy's events still see every
# statement (the sharding test captures them all) but no per-row parameter or result
# processing is done in Python.

#: The whole append in one statement, guarded by the session version the store expects.
#: Every part reads the same snapshot of `s`: if the guard fails, `s` is empty and the inserts,
#: which select from it, insert nothing. The batch travels as ONE parameter, a JSON array of
#: its rows (`rows`, see `store._append_rows`): one text for psycopg to send where twelve
#: arrays cost it a Python walk each, and jsonb's own parse of the content, which the
#: column needs anyway (measured: the server's time is the same, bench/README.md).
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

_APPEND_ROW_TYPES = """role text, name text, content jsonb, metadata jsonb, kind text, pinned bool,
             final bool, tokens int, chars int, call_ids text[], result_ids text[],
             tool_names text[]"""
_APPEND_TEMPLATE = f"""
WITH s AS ({CLAIM_AT_VERSION}), m AS (
    INSERT INTO messages (session_id, id, role, name, content, metadata, kind, pinned, final,
                          tokens, chars, call_ids, result_ids, tool_names, search_config,
                          add_key)
    SELECT %(sid)s, s.first_id + {{ord}} - 1, u.role, u.name, u.content, u.metadata, u.kind,
           u.pinned, u.final, u.tokens, u.chars, u.call_ids, u.result_ids, u.tool_names,
           s.search_config, %(add_key)s::text
    FROM s, {{rows}}
), w AS (
    INSERT INTO working_set (session_id, position, message_id)
    SELECT %(sid)s, s.first_pos + g, s.first_id + g FROM s, generate_series(0, %(n)s - 1) AS g
)
SELECT first_id, message_count, token_count FROM s
"""
APPEND_AT_VERSION = _APPEND_TEMPLATE.format(
    ord="u.ord",
    rows=f"""ROWS FROM (jsonb_to_recordset(%(rows)s::jsonb) AS ({_APPEND_ROW_TYPES}))
         WITH ORDINALITY AS u(role, name, content, metadata, kind, pinned, final, tokens,
                              chars, call_ids, result_ids, tool_names, ord)""",
)
#: `APPEND_AT_VERSION` for a batch too large for one jsonb value (its limit is 256 MB; each
#: message's content has that limit on its own anyway): `rows` is a text[] of the rows' JSON,
#: each parsed on its own (0.1 ms slower on ten messages, so not the usual path).
APPEND_LARGE_AT_VERSION = _APPEND_TEMPLATE.format(
    ord="r.ord",
    rows=f"""unnest(%(rows)b::text[]) WITH ORDINALITY AS r(doc, ord),
         jsonb_to_record(r.doc::jsonb) AS u({_APPEND_ROW_TYPES})""",
)

#: The messages an add with idempotency key `key` stored (docs/design.md §5), in order.
ADDED_WITH_KEY = f"""
SELECT m.id, m.role, m.name, m.content, NULLIF(m.metadata, '{{}}'::jsonb), m.kind, m.pinned,
       m.tokens
FROM messages m
WHERE m.session_id = %(sid)s AND m.add_key = %(key)s AND {ALIVE} ORDER BY m.id
"""

# A role granted a tenant may not DELETE (table-level DELETE would let it lock the shared
# tables, docs/design.md §5): working-set rows and sessions are deleted through functions that
# delete only what the caller could have deleted itself (migration 0014).

#: Take messages (all of them when `ids` is NULL) out of the working set; their positions
#: and ids.
UNLINK_WORKING = "SELECT pos, mid FROM autoctx_unlink_working(%(sid)s, %(ids)s::bigint[])"
#: Delete the session (of `inc` and `tenant`, each when given) with everything of it; its row
#: as it was, or no row.
DELETE_SESSION = """
SELECT * FROM autoctx_delete_session(%(sid)s, %(inc)s::uuid, %(tenant)s::text, NULL)
"""
#: Delete every session of `tenant` (of any tenant, when NULL) last updated before `before`:
#: one statement, so a session written to meanwhile is judged on its new `updated_at` (the
#: function checks it again under the row's lock), and kept.
PURGE_SESSIONS = """
SELECT d.* FROM sessions s
CROSS JOIN LATERAL autoctx_delete_session(s.session_id, NULL, %(tenant)s::text,
                                          %(before)s::timestamptz) d
WHERE s.updated_at < %(before)s AND (%(tenant)s::text IS NULL OR s.tenant = %(tenant)s)
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
#: The session's originals as appended (not a compression's writing, nor a popped message's
#: stand-in), in append order, a page of them (all from the offset when the limit is NULL).
ORIGINALS = f"""
SELECT m.id, m.role, m.name, m.content, m.metadata, m.kind, m.pinned, m.tokens
FROM messages m
WHERE m.session_id = %(sid)s AND m.kind = 'original' AND m.event_id IS NULL AND {ALIVE}
ORDER BY m.id
OFFSET %(offset)s LIMIT %(limit)s
"""
#: The documents as JSON text (an empty metadata as NULL), which `rows.documents` parses in one
#: call: a parse per value costs more in calls than in parsing on a whole-history read.
DOCUMENTS_BY_ID = f"""
SELECT m.id, m.role, m.kind, m.content::text, NULLIF(m.metadata, '{{}}'::jsonb)::text
FROM unnest(%(ids)s::bigint[]) AS u(id) JOIN messages m ON m.session_id = %(sid)s AND m.id = u.id
WHERE {ALIVE}
"""
#: The session's latest `n` working message ids, in order (all of them when `n` is NULL:
#: PostgreSQL reads LIMIT NULL as no limit); no row once the incarnation is gone.
WORKING_IDS = """
SELECT coalesce((SELECT array_agg(x.message_id ORDER BY x.position)
                 FROM (SELECT w.message_id, w.position FROM working_set w
                       WHERE w.session_id = s.session_id
                       ORDER BY w.position DESC LIMIT %(n)s) x), '{}'),
       s.erasures
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
    rows = conn.exec_driver_sql(MESSAGES_BY_ID, {"sid": session_id, "inc": incarnation, "ids": ids})
    return {r[0]: msg_from_columns(*r) for r in rows}


def avoid_nested_loops(conn: Connection) -> None:
    """Keep the planner off nested loops for the whole-session reads of this transaction.

    Before ANALYZE has seen a fast-growing session, PostgreSQL estimates its working set at a
    few rows and joins it to messages with a nested loop that is quadratic in the session's
    size (seconds at 5k messages, hours at 100k); a hash or merge join is always right here.
    """
    conn.exec_driver_sql("SET LOCAL enable_nestloop = off")


#: Sets the tenant for the row-level security policies, local to the transaction, so that a
#: pooled connection never carries a tenant over.
SET_TENANT = "SELECT set_config('autoctx.tenant', %(t)s, true)"

#: For each planned edit (its first and last replaced ids, in order), the working positions of
#: its span: the apply re-checks that each span is still what the plan saw.
CHECK_RANGES = """
SELECT e.ord, max(w.position) AS last_position, array_agg(w.message_id ORDER BY w.position) AS ids
FROM unnest(%(firsts)s::bigint[], %(lasts)s::bigint[]) WITH ORDINALITY AS e(first_id, last_id, ord)
JOIN working_set wf ON wf.session_id = %(sid)s AND wf.message_id = e.first_id
JOIN working_set wl ON wl.session_id = %(sid)s AND wl.message_id = e.last_id
JOIN working_set w ON w.session_id = %(sid)s AND w.position BETWEEN wf.position AND wl.position
GROUP BY e.ord
"""

#: The lineage below a message, down to the originals.
LINEAGE_DOWN = """
WITH RECURSIVE down(summary_id, ordinal, replaced_id, event_id, depth) AS (
    SELECT l.summary_id, l.ordinal, l.replaced_id, l.event_id, 1
    FROM lineage l
    WHERE l.session_id = %(sid)s AND l.summary_id = %(mid)s
  UNION ALL
    SELECT l.summary_id, l.ordinal, l.replaced_id, l.event_id, d.depth + 1
    FROM lineage l
    JOIN down d ON l.session_id = %(sid)s AND l.summary_id = d.replaced_id
)
SELECT summary_id, ordinal, replaced_id, event_id, depth
FROM down
ORDER BY depth, summary_id, ordinal
"""

#: The originals behind some messages: lineage followed down through nested summaries to the
#: messages that replace nothing, in id order (the order they were appended in).
ORIGINALS_BELOW = """
WITH RECURSIVE down(id) AS (
    SELECT unnest(%(ids)s::bigint[])
  UNION
    SELECT l.replaced_id FROM lineage l
    JOIN down d ON l.session_id = %(sid)s AND l.summary_id = d.id
)
SELECT d.id FROM down d
WHERE NOT EXISTS (SELECT 1 FROM lineage l WHERE l.session_id = %(sid)s AND l.summary_id = d.id)
ORDER BY d.id
"""


def originals_below(conn: Connection, session_id: str, ids: list[int]) -> list[int]:
    """The ids of the originals behind `ids` (see `ORIGINALS_BELOW`)."""
    rows = conn.exec_driver_sql(ORIGINALS_BELOW, {"sid": session_id, "ids": ids})
    return [r[0] for r in rows]


#: The summaries above a message, nearest first.
COVERING_CHAIN = """
WITH RECURSIVE up(summary_id, depth) AS (
    SELECT l.summary_id, 1 FROM lineage l
    WHERE l.session_id = %(sid)s AND l.replaced_id = %(mid)s
  UNION ALL
    SELECT l.summary_id, u.depth + 1 FROM lineage l
    JOIN up u ON l.session_id = %(sid)s AND l.replaced_id = u.summary_id
)
SELECT summary_id FROM up ORDER BY depth
"""

#: The schema and owner of autoctx's tables, and whether the current role may grant on them.
TABLES_OWNER = """
SELECT n.nspname, c.relowner::regrole::text AS owner,
       pg_has_role(current_user, c.relowner, 'USAGE') AS owns, current_user AS me
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.oid = to_regclass('sessions')
"""

#: Whether a role is a superuser, bypasses row-level security, or owns autoctx's tables.
ROLE_INFO = """
SELECT r.rolsuper AS superuser, r.rolbypassrls AS bypassrls,
       pg_has_role(r.oid, c.relowner, 'USAGE') AS owner
FROM pg_roles r, pg_class c
WHERE r.rolname = %(role)s AND c.oid = to_regclass('sessions')
"""


#: The offload of what a written message `m` replaced (its uuid and handle, as `own`): the one
#: whose first message its first lineage row names, under the same event. An event names one
#: offload for a range, none for a masking pass, which made one per output (docs/design.md §7),
#: so the message's own offload is found through its lineage, by primary keys and the offloads'
#: event index (migration 0020).
OWN_OFFLOAD = """
LEFT JOIN LATERAL (
    SELECT o.uuid, o.handle FROM lineage l
    JOIN offloads o ON o.session_id = l.session_id AND o.event_id = l.event_id
                   AND o.message_ids[1] = l.replaced_id
    WHERE l.session_id = m.session_id AND l.summary_id = m.id AND l.ordinal = 0
) own ON true"""
