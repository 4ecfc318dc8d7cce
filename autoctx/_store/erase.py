"""The SQL of an erasure: tombstone originals and rewrite every message derived from them.

`erase` is one unit of work of a `SessionStore` (its tenant scope, its incarnation guard), in
one transaction under the session row lock (`autoctx._erasure` says what is written), and names
the forks that keep copies. Forks and erasures of a session serialize on the fork's advisory
lock (`lifecycle.FORK_SPACE`): an erasure waits for the forks in flight, which a fork's
REPEATABLE READ snapshot would otherwise hide from it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from .._arguments import OffloadRef
from .._dropped import scrub_facts
from .._erasure import CONTEXT_TOOLS, Derived, Quote, quotes, quotes_any
from .._erasure_result import AutoContextErasure
from .._errors import (
    ErasureNotPermitted,
    InvalidErasure,
    MessageNotFound,
)
from .._events import MANUAL
from .._intake import Prepared
from .._messages import Msg, json_text
from .lifecycle import FORK_SPACE
from .rows import (
    array_literal,
    event_from_row,
    event_row,
    message_row,
)
from .sql import OWN_OFFLOAD, messages_by_id
from .store import SessionStore
from .tables import compression_events, sessions

_DERIVED = f"""
WITH RECURSIVE up(id) AS (
    SELECT l.summary_id FROM unnest(%(ids)s::bigint[]) AS u(id)
    JOIN lineage l ON l.session_id = %(sid)s AND l.replaced_id = u.id
  UNION
    SELECT l.summary_id FROM up JOIN lineage l ON l.session_id = %(sid)s AND l.replaced_id = up.id
)
SELECT m.id, e.strategy, own.handle,
       coalesce((SELECT array_agg(l.replaced_id ORDER BY l.ordinal) FROM lineage l
                 WHERE l.session_id = %(sid)s AND l.summary_id = m.id), '{{}}')
FROM up JOIN messages m ON m.session_id = %(sid)s AND m.id = up.id
LEFT JOIN compression_events e ON e.session_id = %(sid)s AND e.id = m.event_id
{OWN_OFFLOAD}
"""
_REWRITE = """
UPDATE messages m
SET name = u.name, content = u.content::jsonb, metadata = u.metadata::jsonb, tokens = u.tokens,
    chars = u.chars, call_ids = u.call_ids::text[], result_ids = u.result_ids::text[],
    tool_names = u.tool_names::text[], erased_by = %(event)s
FROM unnest(%(id)s::bigint[], %(name)s::text[], %(content)s::text[], %(metadata)s::text[],
            %(tokens)s::int[], %(chars)s::int[], %(call_ids)s::text[], %(result_ids)s::text[],
            %(tool_names)s::text[])
     AS u(id, name, content, metadata, tokens, chars, call_ids, result_ids, tool_names)
WHERE m.session_id = %(sid)s AND m.id = u.id
"""

#: The sessions forked from a session incarnation, and from them, ... (an audit walk over the
#: sessions table: forks are found by their ancestry, which no index leads with). The ancestry
#: finds the fork of a fork whose middle session was deleted; the chain of parents finds the
#: forks an import wrote, which carry no ancestry of this database.
_FORKS_OF = """
WITH RECURSIVE f(session_id, incarnation) AS (
    SELECT s.session_id, s.incarnation FROM sessions s
    WHERE (CAST(%(inc)s AS uuid) = ANY(s.fork_ancestry)
           OR (s.forked_from = %(sid)s AND s.forked_from_incarnation = %(inc)s))
      AND s.tenant IS NOT DISTINCT FROM %(tenant)s
  UNION
    SELECT s.session_id, s.incarnation FROM f
    JOIN sessions s ON s.forked_from = f.session_id AND s.forked_from_incarnation = f.incarnation
    WHERE s.tenant IS NOT DISTINCT FROM %(tenant)s
)
SELECT session_id FROM f ORDER BY session_id
"""

#: Given the erased originals, the derived messages and every message they read, the new
#: version of each (`autoctx._erasure.rewrite_erased` with the memory's config and counter).
Rewrite = Callable[[Mapping[int, Msg], Sequence[Derived], Mapping[int, Msg]], dict[int, Prepared]]


def erase(
    store: SessionStore,
    ids: Sequence[int],
    *,
    note: str,
    rewrite: Rewrite,
    config: Mapping[str, Any],
    rewrite_for: Callable[[Mapping[str, Any]], Rewrite] | None = None,
) -> AutoContextErasure:
    """Erase the originals `ids` and rewrite what derives from them, in one transaction, with
    every answer of autoctx's context tools that quoted any of it (in any session of the
    tenant; `rewrite_for` gives another session's rewrite from its stored config)."""
    for attempt in range(_DEADLOCK_ATTEMPTS):
        try:
            return _erase(
                store,
                ids,
                note=note,
                rewrite=rewrite,
                config=config,
                rewrite_for=rewrite_for,
            )
        except sa.exc.DBAPIError as exc:
            state = getattr(exc.orig, "sqlstate", None)
            # Two erasures that rewrite answers in each other's sessions lock the two session
            # rows in opposite orders; PostgreSQL breaks the cycle by failing one, which rolled
            # back whole and starts over.
            if state == "40P01" and attempt + 1 < _DEADLOCK_ATTEMPTS:
                continue
            if state != "42501":
                raise
            raise _not_permitted(store.session_id) from None
    raise AssertionError("unreachable")  # the last attempt returns or raises


#: How many times an erasure runs when PostgreSQL picks it to break a deadlock.
_DEADLOCK_ATTEMPTS: Final = 3


def _not_permitted(session_id: str) -> ErasureNotPermitted:
    return ErasureNotPermitted(
        f"this database role may not rewrite the messages of session {session_id!r}: a "
        "role granted a tenant only appends (its history is its own to read, not to "
        "rewrite); run the erasure as the owner of autoctx's tables, for example "
        "`autoctx erase ... --database-url <the owner's URL>`. Nothing was erased"
    )


def _erase(
    store: SessionStore,
    ids: Sequence[int],
    *,
    note: str,
    rewrite: Rewrite,
    config: Mapping[str, Any],
    rewrite_for: Callable[[Mapping[str, Any]], Rewrite] | None,
) -> AutoContextErasure:
    session_id = store.session_id
    incarnation = store.incarnation()
    with store.transaction() as conn:
        # First, before the row lock: wait for the forks in flight (see `lifecycle._forking`).
        _wait_for_forks(conn, incarnation)
        row = store.lock_row(conn)
        params: dict[str, Any] = {"sid": session_id, "ids": list(ids)}
        kinds: dict[int, str] = dict(
            conn.exec_driver_sql(
                "SELECT m.id, m.kind FROM unnest(%(ids)s::bigint[]) AS u(id) "
                "JOIN messages m ON m.session_id = %(sid)s AND m.id = u.id",
                params,
            ).all()
        )
        _check_erasable(session_id, ids, kinds)
        rows, targets, derived, answers = _reach(conn, row, set(ids))
        done = {}
        for sid in [session_id, *sorted(set(rows) - {session_id})]:
            own = sid == session_id
            done[sid] = _rewrite_session(
                conn,
                rows[sid],
                targets[sid],
                derived[sid],
                note=note,
                rewrite=rewrite if own or rewrite_for is None else rewrite_for(rows[sid].config),
                config=config if own else rows[sid].config,
            )
    created, changed, working = done[session_id]
    # What the store cached of its session predates the rewrite (tokens and chars changed);
    # the open calls did not (tombstones keep every id). The stores of the other sessions
    # rewritten (their memories') see the erasure's event and version, and read again.
    store.rewritten(created.session_version, row.open_calls)
    # After the commit, in a read of its own: the erasure's transaction stays on its session's
    # rows (one shard, docs/scaling.md), and finding forks is a walk over every session. Every
    # fork whose snapshot predates the erasure has committed (the erasure waited for it).
    with store.statement() as conn:
        forks = tuple(
            r[0]
            for r in conn.exec_driver_sql(
                _FORKS_OF, {"sid": session_id, "inc": row.incarnation, "tenant": row.tenant}
            )
        )
    return AutoContextErasure(
        event_from_row(created),
        tuple(sorted(ids)),
        tuple(i for i in changed if i not in targets[session_id]),
        tuple(sorted(working)),
        forks,
        tuple(sorted(answers)),
    )


def _wait_for_forks(conn: Connection, incarnation: Any) -> None:
    conn.exec_driver_sql(
        "SELECT pg_advisory_xact_lock(%(space)s, hashtext(%(k)s))",
        {"space": FORK_SPACE, "k": str(incarnation)},
    )


def _reach(
    conn: Connection, row: Any, ids: set[int]
) -> tuple[dict[str, Any], dict[str, set[int]], dict[str, list[Any]], list[tuple[str, int]]]:
    """Everything the erasure of `ids` in `row`'s session rewrites, found under the locks of
    the sessions it touches: per session its row, the originals to tombstone and the rows of
    the messages derived from them; and the answers of autoctx's context tools (in any
    session of the tenant) that quoted any of it, which are tombstoned as originals too.
    Repeated until nothing new is found: an answer can quote an answer."""
    sid0 = row.session_id
    rows: dict[str, Any] = {sid0: row}
    targets: dict[str, set[int]] = {sid0: ids}
    derived: dict[str, list[Any]] = {}
    answers: list[tuple[str, int]] = []
    found: list[tuple[str, int, list[Quote]]] | None = None
    offloads: dict[tuple[str, OffloadRef], Sequence[int]] = {}
    pending = [sid0]
    while pending:
        sid = pending.pop()
        derived[sid] = list(
            conn.exec_driver_sql(_DERIVED, {"sid": sid, "ids": sorted(targets[sid])}).all()
        )
        if found is None:
            found, offloads = _answers(conn, row.tenant)
        changed = {t: targets[t] | {r[0] for r in derived.get(t, ())} for t in targets}
        for t, a, quoted in found:
            if a in targets.get(t, ()) or not quotes_any(quoted, changed, offloads):
                continue
            if t not in rows:
                other = _lock_other(conn, t)
                if other is None:
                    continue
                rows[t], targets[t] = other, set()
            targets[t].add(a)
            answers.append((t, a))
            if t not in pending:
                pending.append(t)
    return rows, targets, derived, answers


#: The answers of autoctx's context tools in the sessions of a tenant that no erasure has
#: tombstoned yet, with the content of the call each answers (the latest message before it
#: that made the call). The tool names are spelled out (`CONTEXT_TOOLS`), so that the planner
#: sees the predicate of the partial index over them (migration 0010).
_ANSWERS = f"""
SELECT r.session_id, r.id, r.content, c.content
FROM sessions s
JOIN messages r ON r.session_id = s.session_id
LEFT JOIN LATERAL (
    SELECT m.content FROM messages m
    WHERE m.session_id = r.session_id AND m.id < r.id AND m.call_ids && r.result_ids
    ORDER BY m.id DESC LIMIT 1
) c ON true
WHERE s.tenant IS NOT DISTINCT FROM %(tenant)s
  AND r.role = 'tool' AND r.kind = 'original' AND r.erased_by IS NULL
  AND r.tool_names && ARRAY[{", ".join(f"'{t}'" for t in CONTEXT_TOOLS)}]
"""


def _answers(
    conn: Connection, tenant: str | None
) -> tuple[list[tuple[str, int, list[Quote]]], dict[tuple[str, OffloadRef], Sequence[int]]]:
    """The tenant's context-tool answers with what each quoted, and the message ids of every
    offload they quoted (by uuid or by handle, as each call named it)."""
    found = [
        (r[0], int(r[1]), quotes(r[2] or [], r[3] or [], r[0]))
        for r in conn.exec_driver_sql(_ANSWERS, {"tenant": tenant})
    ]
    wanted = {(q.session_id, q.offload) for _, _, qs in found for q in qs if q.offload}
    offloads: dict[tuple[str, OffloadRef], Sequence[int]] = {}
    by_uuid = sorted((k for k in wanted if isinstance(k[1], uuid.UUID)), key=str)
    by_handle = sorted((k for k in wanted if isinstance(k[1], int)), key=str)
    for column, cast, keys in (("uuid", "uuid", by_uuid), ("handle", "bigint", by_handle)):
        if not keys:
            continue
        for sid, ref, message_ids in conn.exec_driver_sql(
            f"SELECT o.session_id, o.{column}, o.message_ids FROM offloads o "
            f"JOIN unnest(%(sids)s::text[], %(refs)s::{cast}[]) AS k(sid, ref) "
            f"ON o.session_id = k.sid AND o.{column} = k.ref",
            {"sids": [k[0] for k in keys], "refs": [k[1] for k in keys]},
        ):
            offloads[(sid, ref)] = list(message_ids)
    return found, offloads


def _lock_other(conn: Connection, session_id: str) -> Any:
    """Lock another session of the tenant whose answers the erasure tombstones (None if it
    is gone)."""
    inc = conn.execute(
        sa.select(sessions.c.incarnation).where(sessions.c.session_id == session_id)
    ).scalar_one_or_none()
    if inc is None:
        return None
    _wait_for_forks(conn, inc)
    return conn.execute(
        sa.select(sessions)
        .where(sessions.c.session_id == session_id, sessions.c.incarnation == inc)
        .with_for_update()
    ).one_or_none()


def _rewrite_session(
    conn: Connection,
    row: Any,
    ids: set[int],
    derived_rows: Sequence[Any],
    *,
    note: str,
    rewrite: Rewrite,
    config: Mapping[str, Any],
) -> tuple[Any, list[int], set[int]]:
    """Tombstone `ids` in `row`'s session and rewrite what derives from them; one event.
    Returns the event row, the ids rewritten (all of them) and those in the working context."""
    session_id = row.session_id
    read = set(ids) | {r[0] for r in derived_rows} | {c for r in derived_rows for c in r[3]}
    stored = messages_by_id(conn, session_id, row.incarnation, sorted(read))
    derived = [Derived(stored[r[0]], r[1], r[2], tuple(r[3])) for r in derived_rows]
    new = rewrite({i: stored[i] for i in ids}, derived, stored)
    changed = sorted(new)
    working = {
        r[0]
        for r in conn.exec_driver_sql(
            "SELECT w.message_id FROM unnest(%(ids)s::bigint[]) AS u(id) "
            "JOIN working_set w ON w.session_id = %(sid)s AND w.message_id = u.id",
            {"sid": session_id, "ids": changed},
        )
    }
    delta = sum(new[i].tokens - (stored[i].tokens or 0) for i in working)
    event_id, version = row.next_event_id, row.version + 1
    tokens_after = row.token_count + delta
    conn.exec_driver_sql(
        _REWRITE,
        {"sid": session_id, "event": event_id, "id": changed, **_rewrite_columns(new, changed)},
    )
    _scrub_fact_lists(conn, session_id, [stored[i] for i in ids], changed)
    created = conn.execute(
        sa.insert(compression_events)
        .values(
            event_row(
                session_id,
                event_id,
                strategy=MANUAL,
                status="applied",
                reason="erase",
                messages=(row.message_count, row.message_count),
                tokens=(row.token_count, tokens_after),
                replaced_ids=sorted(ids),
                session_version=version,
                config=config,
                note=note,
            )
        )
        .returning(compression_events)
    ).one()
    conn.execute(
        sa.update(sessions)
        .where(sessions.c.session_id == session_id, sessions.c.incarnation == row.incarnation)
        .values(
            token_count=tokens_after,
            version=version,
            next_event_id=event_id + 1,
            # Every cache of message content checks it (`SessionStore.working_ids`).
            erasures=sessions.c.erasures + 1,
            updated_at=sa.func.now(),
        )
    )
    return created, changed, working


#: The fact lists of the events that made the messages an erasure rewrites (docs/design.md §6).
_FACT_LISTS = """
SELECT e.id, e.dropped_facts FROM compression_events e
WHERE e.session_id = %(sid)s AND cardinality(e.dropped_facts) > 0 AND e.id IN (
    SELECT m.event_id FROM unnest(%(ids)s::bigint[]) AS u(id)
    JOIN messages m ON m.session_id = %(sid)s AND m.id = u.id
)
"""
_SCRUB_FACTS = """
UPDATE compression_events e
SET dropped_facts = u.kept::text[],
    facts_found = e.facts_found - u.removed, facts_dropped = e.facts_dropped - u.removed
FROM unnest(%(event)s::bigint[], %(kept)s::text[], %(removed)s::int[]) AS u(id, kept, removed)
WHERE e.session_id = %(sid)s AND e.id = u.id
"""


def _scrub_fact_lists(
    conn: Connection, session_id: str, erased: Sequence[Msg], rewritten: Sequence[int]
) -> None:
    """Scrub the erased text from the dropped facts of the events that made the rewritten
    messages (their summaries derive from what was erased, so their facts may quote it): a
    fact that stands in the erased content leaves the list, and the event's counts with it."""
    rows = conn.exec_driver_sql(_FACT_LISTS, {"sid": session_id, "ids": list(rewritten)}).all()
    events: list[int] = []
    kept_lists: list[str] = []
    removed: list[int] = []
    for event_id, facts in rows:
        kept = scrub_facts(facts, erased)
        if len(kept) < len(facts):
            events.append(event_id)
            kept_lists.append(array_literal(kept))
            removed.append(len(facts) - len(kept))
    if events:
        conn.exec_driver_sql(
            _SCRUB_FACTS,
            {"sid": session_id, "event": events, "kept": kept_lists, "removed": removed},
        )


def _check_erasable(session_id: str, ids: Sequence[int], kinds: Mapping[int, str]) -> None:
    missing = sorted(set(ids) - set(kinds))
    if missing:
        raise MessageNotFound(
            f"session {session_id!r} has no message with id {_list(missing)}; nothing was "
            "erased (the ids are the ones `mem.messages()` and `autoctx show` list, or the "
            "originals behind them)"
        )
    made = sorted(i for i in ids if kinds[i] != "original")
    if made:
        raise InvalidErasure(
            f"message {_list(made)} of session {session_id!r} is a {kinds[made[0]]}, not an "
            "original; erase the originals it stands for (`autoctx lineage`): every summary "
            "and preview derived from them is rewritten. Nothing was erased"
        )


def _list(ids: Sequence[int]) -> str:
    shown = ", ".join(str(i) for i in ids[:10])
    return shown + (f" (and {len(ids) - 10} more)" if len(ids) > 10 else "")


def _rewrite_columns(new: Mapping[int, Prepared], ids: Sequence[int]) -> dict[str, list[Any]]:
    rows = [message_row("", i, new[i], None) for i in ids]
    out: dict[str, list[Any]] = {
        "name": [r["name"] for r in rows],
        "content": [json_text(r["content"]) for r in rows],
        "metadata": [json_text(r["metadata"]) for r in rows],
        "tokens": [r["tokens"] for r in rows],
        "chars": [r["chars"] for r in rows],
    }
    for key in ("call_ids", "result_ids", "tool_names"):
        out[key] = [array_literal(r[key]) for r in rows]
    return out


# ---------------------------------------------------------------------------------------------
# Export and import
# ---------------------------------------------------------------------------------------------
