"""The SQL of a session's lifecycle: fork, erasure, retention, and the rows of an export.

Fork and erasure are units of work of a `SessionStore` (its tenant scope, its incarnation guard),
done through its internal API (`transaction`, `row_condition`, `lock_row`, `rewritten`), kept
apart from `store.py`, which holds the units of work of the agent loop. Export and import take
any `TenantScope` (a `Catalog`).

- `fork` copies, in one REPEATABLE READ transaction (one consistent view of the parent, whose
  writers it never blocks), the rows a new session needs to start from the parent's working
  context: the working messages, everything reachable from them by lineage (so that every
  reload works in the child), the applied events that made them (marked `inherited`), their
  offloads and lineage, and one `fork` event. Message ids, offload uuids and event ids are kept:
  session_id leads every key, so the copies are the child's own rows, and the tags in the
  summaries' text stay valid.
- `erase` tombstones originals and rewrites every message derived from them, in one transaction
  under the session row lock (`autoctx._erasure` says what is written), and names the forks
  that keep copies. Forks and erasures of a session serialize on an advisory lock (`_forking`):
  an erasure waits for the forks in flight, which a fork's REPEATABLE READ snapshot would
  otherwise hide from it; appends and compressions never wait for a fork.
- `read_rows` and `write_rows` move every row of a session to and from an export document
  (`autoctx._exports`).

Columns are always named: a column added later (a generated search vector, say) is never
copied by accident, and a generated column cannot be written.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from .._arguments import OffloadRef
from .._dropped import scrub_facts
from .._erasure import CONTEXT_TOOLS, Derived, Quote, quotes, quotes_any
from .._erasure_result import AutoContextErasure as AutoContextErasure
from .._errors import (
    ErasureNotPermitted,
    InvalidErasure,
    InvalidExport,
    MessageNotFound,
    SessionExists,
)
from .._events import MANUAL
from .._intake import Prepared, open_calls_at_tail
from .._messages import Msg, json_text
from .rows import (
    SessionInfo,
    array_literal,
    event_from_row,
    event_row,
    message_row,
    session_info,
)
from .scope import TenantScope
from .sql import COVERING_CHAIN, SNAPSHOT, WORKING_IDS, avoid_nested_loops, messages_by_id
from .store import SessionStore, session_gone
from .tables import compression_events, lineage, messages, offloads, sessions, working_set

#: The columns each table's rows are copied, exported and imported with.
SESSION_COLUMNS = (
    "session_id",
    "tenant",
    "created_at",
    "updated_at",
    "version",
    "message_count",
    "token_count",
    "model",
    "encoding",
    "config",
    "plan",
    "open_calls",
    "next_message_id",
    "next_position",
    "next_event_id",
    "next_handle",
    "settled_version",
    "forked_from",
    "forked_from_incarnation",
    "forked_at_message",
)
MESSAGE_COLUMNS = (
    "id",
    "role",
    "name",
    "content",
    "metadata",
    "kind",
    "pinned",
    "final",
    "tokens",
    "chars",
    "call_ids",
    "result_ids",
    "tool_names",
    "event_id",
    "erased_by",
    "search_config",
    "created_at",
)
EVENT_COLUMNS = (
    "id",
    "strategy",
    "status",
    "reason",
    "messages_before",
    "messages_after",
    "tokens_before",
    "tokens_after",
    "replaced_ids",
    "replaced_tokens",
    "summary_message_id",
    "offload_uuid",
    "model",
    "prompt_tokens",
    "completion_tokens",
    "latency_ms",
    "error",
    "session_version",
    "config",
    "created_at",
    "note",
    "undoes",
    "facts_found",
    "facts_kept",
    "facts_repaired",
    "facts_listed",
    "facts_dropped",
    "dropped_facts",
    "facts_repair_calls",
    "inherited",
)
OFFLOAD_COLUMNS = ("uuid", "handle", "event_id", "message_ids", "created_at")
LINEAGE_COLUMNS = ("summary_id", "ordinal", "replaced_id", "event_id")
WORKING_COLUMNS = ("position", "message_id")


def _cols(names: Sequence[str], alias: str = "") -> str:
    prefix = f"{alias}." if alias else ""
    return ", ".join(f"{prefix}{n}" for n in names)


# ---------------------------------------------------------------------------------------------
# Fork
# ---------------------------------------------------------------------------------------------

#: Everything reachable from the given messages by lineage, themselves included.
_CLOSURE = """
WITH RECURSIVE c(id) AS (
    SELECT u.id FROM unnest(%(ids)s::bigint[]) AS u(id)
  UNION
    SELECT l.replaced_id FROM c JOIN lineage l ON l.session_id = %(sid)s AND l.summary_id = c.id
)
SELECT coalesce(array_agg(id), '{}') FROM c
"""


@dataclass(frozen=True, slots=True)
class _Meta:
    id: int
    kind: str
    role: str
    tokens: int
    call_ids: tuple[str, ...]
    result_ids: tuple[str, ...]
    tool_names: tuple[str, ...]


def fork(store: SessionStore, child_id: str, at_message: int | None) -> SessionInfo:
    """Create `child_id` from the working context of `store`'s session (up to and including
    `at_message`); returns the child's session row. Raises `SessionExists` when the id is
    taken and `MessageNotFound` for a message the parent does not have (or cannot cut at)."""
    parent_id = store.session_id
    with store.statement() as conn:
        lineage = conn.execute(
            sa.select(sessions.c.incarnation, sessions.c.fork_ancestry).where(store.row_condition())
        ).one_or_none()
    if lineage is None:
        raise session_gone(parent_id)
    repeatable = store.engine.execution_options(isolation_level="REPEATABLE READ")
    try:
        with (
            repeatable.connect() as conn,
            _forking(conn, [*lineage[1], lineage[0]]),
            conn.begin(),
        ):
            store.scope(conn)
            info = _fork_in(store, conn, child_id, at_message)
    except sa.exc.DBAPIError as exc:
        # A session created under the id meanwhile: committed before our insert (a unique
        # violation) or after our snapshot (REPEATABLE READ reports it as a serialization
        # failure: only the child's rows are written, so nothing else can conflict).
        if getattr(exc.orig, "sqlstate", None) in ("23505", "40001"):
            raise _taken(child_id) from None
        raise
    return info


#: The first key of the advisory locks by which forks and erasures serialize ("acxf"; claims
#: use "actx", migrations a single 64-bit key), the second is hashtext(incarnation).
FORK_SPACE: Final = 0x61637866


@contextlib.contextmanager
def _forking(conn: Connection, incarnations: Sequence[Any]) -> Iterator[None]:
    """Hold a shared lock on the session being forked and each it descends from, from before
    the fork's snapshot until after its commit.

    An erasure takes its session's lock exclusively before it writes, so it waits for every
    fork (of the session or of a fork of it) whose snapshot predates it and then finds that
    fork committed, and a fork that starts while an erasure runs takes its snapshot after the
    erasure committed: no fork holds erased content without the erasure naming it. The locks
    are session-level, on the fork's own connection (a transaction-level lock would be taken
    after the snapshot of a REPEATABLE READ transaction); a shared lock never waits for another
    fork, and the keys are hashes of incarnations, which a role of another tenant cannot see.
    """
    keys = sorted({str(i) for i in incarnations})
    conn.exec_driver_sql(
        "SELECT pg_advisory_lock_shared(%(space)s, hashtext(k)) FROM unnest(%(keys)s::text[]) k",
        {"space": FORK_SPACE, "keys": keys},
    )
    conn.commit()
    try:
        yield
    finally:
        if not conn.invalidated:
            conn.rollback()
            conn.exec_driver_sql(
                "SELECT pg_advisory_unlock_shared(%(space)s, hashtext(k)) "
                "FROM unnest(%(keys)s::text[]) k",
                {"space": FORK_SPACE, "keys": keys},
            )
            conn.commit()


def _fork_in(
    store: SessionStore, conn: Connection, child_id: str, at_message: int | None
) -> SessionInfo:
    """The fork's work, in its REPEATABLE READ transaction."""
    parent_id = store.session_id
    parent = conn.execute(sa.select(sessions).where(store.row_condition())).one_or_none()
    if parent is None:
        raise session_gone(parent_id)
    if at_message is None:
        # The whole context: its ids in one array, and the totals and open calls the
        # parent's row holds for them (no per-message read).
        ids = conn.exec_driver_sql(
            WORKING_IDS, {"sid": parent_id, "inc": parent.incarnation, "n": None}
        ).scalar_one()
        cut = _Cut(list(ids), parent.token_count, dict(parent.open_calls))
    else:
        avoid_nested_loops(conn)
        # The planner's snapshot of the working context (positions start at 1).
        working = [
            _Meta(
                r.id,
                r.kind,
                r.role,
                r.tokens,
                tuple(r.call_ids),
                tuple(r.result_ids),
                tuple(r.tool_names),
            )
            for r in conn.exec_driver_sql(SNAPSHOT, {"sid": parent_id, "after": 0})
        ]
        conn.exec_driver_sql("SET LOCAL enable_nestloop = on")
        metas = _cut_at(conn, parent_id, working, at_message)
        cut = _Cut([m.id for m in metas], sum(m.tokens for m in metas), open_calls_of(metas))
    return _copy(conn, parent, child_id, cut)


def _taken(child_id: str) -> SessionExists:
    return SessionExists(
        f"session {child_id!r} already exists (or its id is taken by a session this tenant "
        "cannot see); fork into a new session id"
    )


def _cut_at(conn: Connection, sid: str, working: list[_Meta], at: int) -> list[_Meta]:
    """The working context up to and including message `at`.

    `at` in the working context: the context up to it. `at` replaced by a compression: the
    working message that stands for it is opened, down the lineage, to `at` (the messages each
    summary on the way replaced before it stay, summaries themselves where they can), and the
    messages a fold kept in place that came after `at` (ids are allocated in order) are left
    out. So the child starts exactly where the parent's conversation was at `at`, with as
    little expanded as possible.
    """
    index = {m.id: k for k, m in enumerate(working)}
    if at in index:
        return working[: index[at] + 1]
    kind = conn.execute(
        sa.select(messages.c.kind).where(messages.c.session_id == sid, messages.c.id == at)
    ).scalar_one_or_none()
    if kind is None:
        raise MessageNotFound(
            f"message {at} does not exist in session {sid!r}; fork at an id that "
            "`mem.messages()` or `autoctx show` lists (or an original behind one)"
        )
    chain = [r[0] for r in conn.exec_driver_sql(COVERING_CHAIN, {"sid": sid, "mid": at})]
    top = next((k for k, s in enumerate(chain) if s in index), None)
    if top is None:
        raise MessageNotFound(
            f"message {at} of session {sid!r} is not in the working context and no working "
            "message stands for it (the context was cleared or it was taken out); fork at a "
            "message of the working context"
        )
    path = chain[: top + 1]  # nearest summary first, the working message last
    children: dict[int, list[int]] = {}
    for summary_id, replaced_id in conn.exec_driver_sql(
        "SELECT summary_id, replaced_id FROM lineage WHERE session_id = %(sid)s "
        "AND summary_id = ANY(%(ids)s) ORDER BY summary_id, ordinal",
        {"sid": sid, "ids": path},
    ):
        children.setdefault(summary_id, []).append(replaced_id)
    ids: list[int] = []
    node = path[-1]
    for below in [*reversed(path[:-1]), at]:
        kids = children[node]
        ids.extend(kids[: kids.index(below)])
        node = below
    ids.append(at)
    metas = {m.id: m for m in _metas(conn, sid, ids)}
    prefix = [m for m in working[: index[path[-1]]] if not (m.kind == "original" and m.id > at)]
    return prefix + [metas[i] for i in ids]


def _metas(conn: Connection, sid: str, ids: list[int]) -> list[_Meta]:
    rows = conn.exec_driver_sql(
        "SELECT m.id, m.kind, m.role, m.tokens, m.call_ids, m.result_ids, m.tool_names "
        "FROM unnest(%(ids)s::bigint[]) AS u(id) "
        "JOIN messages m ON m.session_id = %(sid)s AND m.id = u.id",
        {"sid": sid, "ids": ids},
    )
    return [_Meta(r[0], r[1], r[2], r[3], tuple(r[4]), tuple(r[5]), tuple(r[6])) for r in rows]


def open_calls_of(tail: Sequence[_Meta]) -> dict[str, str]:
    """The newest tool group's calls without results (call id -> tool name), from a context's
    messages in order."""
    shapes = ((m.role, m.call_ids, m.result_ids, m.tool_names) for m in reversed(tail))
    return open_calls_at_tail(shapes) or {}


@dataclass(frozen=True, slots=True)
class _Cut:
    """The child's working context: its message ids in order, their tokens, its open calls."""

    ids: list[int]
    tokens: int
    open_calls: dict[str, str]


def _copy(conn: Connection, parent: Any, child_id: str, cut: _Cut) -> SessionInfo:
    """Write the child: its session row, the copies, its working set and its fork event."""
    sid = parent.session_id
    cut_ids, tokens = cut.ids, cut.tokens
    closure = conn.exec_driver_sql(_CLOSURE, {"sid": sid, "ids": cut_ids}).scalar_one()
    fork_event = parent.next_event_id
    created = conn.execute(
        sa.dialects.postgresql.insert(sessions)
        .values(
            session_id=child_id,
            tenant=parent.tenant,
            # The versions go on from the parent's, so that the child's events (the inherited
            # ones first) record versions in commit order, as every session's do.
            version=parent.version + 1,
            message_count=len(cut_ids),
            token_count=tokens,
            model=parent.model,
            encoding=parent.encoding,
            config=parent.config,
            plan=parent.plan,
            open_calls=cut.open_calls,
            next_message_id=parent.next_message_id,
            next_position=len(cut_ids) + 1,
            next_event_id=fork_event + 1,
            # The child's offloads are copies of the parent's, under the same handles (its
            # copied tags name them), and its own go on from the parent's counter.
            next_handle=parent.next_handle,
            forked_from=sid,
            forked_from_incarnation=parent.incarnation,
            fork_ancestry=[*parent.fork_ancestry, parent.incarnation],
            forked_at_message=cut_ids[-1] if cut_ids else None,
        )
        .on_conflict_do_nothing(index_elements=["session_id"])
        .returning(sessions)
    ).one_or_none()
    if created is None:
        raise _taken(child_id)
    params = {"sid": sid, "child": child_id, "ids": closure}
    # The events that made the copied messages (and the erasures that rewrote them): their
    # offloads and lineage point at them.
    conn.exec_driver_sql(
        f"""
        INSERT INTO compression_events (session_id, {_cols(EVENT_COLUMNS)})
        SELECT %(child)s, {_cols(EVENT_COLUMNS[:-1], "e")}, true
        FROM compression_events e
        WHERE e.session_id = %(sid)s AND e.id IN (
            SELECT x.event_id FROM unnest(%(ids)s::bigint[]) AS u(id)
            JOIN messages m ON m.session_id = %(sid)s AND m.id = u.id
            CROSS JOIN LATERAL (VALUES (m.event_id), (m.erased_by)) AS x(event_id)
            WHERE x.event_id IS NOT NULL
        )
        """,
        params,
    )
    conn.exec_driver_sql(
        f"""
        INSERT INTO messages (session_id, {_cols(MESSAGE_COLUMNS)})
        SELECT %(child)s, {_cols(MESSAGE_COLUMNS, "m")}
        FROM unnest(%(ids)s::bigint[]) AS u(id)
        JOIN messages m ON m.session_id = %(sid)s AND m.id = u.id
        """,
        params,
    )
    conn.exec_driver_sql(
        f"""
        INSERT INTO offloads (session_id, {_cols(OFFLOAD_COLUMNS)})
        SELECT %(child)s, {_cols(OFFLOAD_COLUMNS, "o")}
        FROM offloads o
        WHERE o.session_id = %(sid)s
          AND o.event_id IN (SELECT id FROM compression_events WHERE session_id = %(child)s)
        """,
        params,
    )
    conn.exec_driver_sql(
        f"""
        INSERT INTO lineage (session_id, {_cols(LINEAGE_COLUMNS)})
        SELECT %(child)s, {_cols(LINEAGE_COLUMNS, "l")}
        FROM unnest(%(ids)s::bigint[]) AS u(id)
        JOIN lineage l ON l.session_id = %(sid)s AND l.summary_id = u.id
        """,
        params,
    )
    conn.exec_driver_sql(
        "INSERT INTO working_set (session_id, position, message_id) "
        "SELECT %(child)s, u.ord, u.id "
        "FROM unnest(%(cut)s::bigint[]) WITH ORDINALITY AS u(id, ord)",
        {"child": child_id, "cut": cut_ids},
    )
    conn.execute(
        sa.insert(compression_events).values(
            event_row(
                child_id,
                fork_event,
                strategy=MANUAL,
                status="applied",
                reason="fork",
                # The context the child starts with, before and after: a fork saves nothing
                # and costs nothing (the savings views add `tokens_before - tokens_after`).
                messages=(len(cut_ids), len(cut_ids)),
                tokens=(tokens, tokens),
                session_version=parent.version + 1,
                config=parent.config,
            )
        )
    )
    return session_info(created)


# ---------------------------------------------------------------------------------------------
# Erasure
# ---------------------------------------------------------------------------------------------

#: Every message derived from the given ones by lineage (their summaries, and theirs, ...).
_DERIVED = """
WITH RECURSIVE up(id) AS (
    SELECT l.summary_id FROM unnest(%(ids)s::bigint[]) AS u(id)
    JOIN lineage l ON l.session_id = %(sid)s AND l.replaced_id = u.id
  UNION
    SELECT l.summary_id FROM up JOIN lineage l ON l.session_id = %(sid)s AND l.replaced_id = up.id
)
SELECT m.id, e.strategy, o.handle,
       coalesce((SELECT array_agg(l.replaced_id ORDER BY l.ordinal) FROM lineage l
                 WHERE l.session_id = %(sid)s AND l.summary_id = m.id), '{}')
FROM up JOIN messages m ON m.session_id = %(sid)s AND m.id = up.id
LEFT JOIN compression_events e ON e.session_id = %(sid)s AND e.id = m.event_id
LEFT JOIN offloads o ON o.session_id = %(sid)s AND o.uuid = e.offload_uuid
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
        # First, before the row lock: wait for the forks in flight (see `_forking`).
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


@dataclass(frozen=True, slots=True)
class SessionRows:
    """Every row of one session, as column dicts (the session_id column left out of all but
    the session row)."""

    session: dict[str, Any]
    messages: list[dict[str, Any]]
    working_set: list[dict[str, Any]]
    events: list[dict[str, Any]]
    offloads: list[dict[str, Any]]
    lineage: list[dict[str, Any]]


_READS = {
    "messages": (MESSAGE_COLUMNS, "id"),
    "working_set": (WORKING_COLUMNS, "position"),
    "compression_events": (EVENT_COLUMNS, "id"),
    "offloads": (OFFLOAD_COLUMNS, "event_id, uuid"),
    "lineage": (LINEAGE_COLUMNS, "summary_id, ordinal"),
}


def read_rows(store: TenantScope, session_id: str, tenant: str | None = None) -> SessionRows | None:
    """Every row of the session in one consistent view; None for an unknown session (or
    another tenant's, with `tenant`)."""
    repeatable = store.engine.execution_options(isolation_level="REPEATABLE READ")
    with repeatable.begin() as conn:
        store.scope(conn)
        cond = sessions.c.session_id == session_id
        if tenant is not None:
            cond = sa.and_(cond, sessions.c.tenant == tenant)
        row = conn.execute(
            sa.select(*(sessions.c[n] for n in SESSION_COLUMNS)).where(cond)
        ).one_or_none()
        if row is None:
            return None
        tables: dict[str, list[dict[str, Any]]] = {}
        for table, (columns, order) in _READS.items():
            result = conn.exec_driver_sql(
                f"SELECT {_cols(columns)} FROM {table} WHERE session_id = %(sid)s ORDER BY {order}",
                {"sid": session_id},
            )
            tables[table] = [dict(r._mapping) for r in result]
    return SessionRows(
        dict(row._mapping),
        tables["messages"],
        tables["working_set"],
        tables["compression_events"],
        tables["offloads"],
        tables["lineage"],
    )


def write_rows(store: TenantScope, rows: SessionRows) -> SessionInfo:
    """Create a session from `rows` in one transaction; `SessionExists` when its id is taken
    (nothing is overwritten), `InvalidExport` when the rows do not fit together."""
    sid = rows.session["session_id"]
    insert = sa.dialects.postgresql.insert
    try:
        with store.transaction() as conn:
            created = conn.execute(
                insert(sessions)
                .values(rows.session)
                .on_conflict_do_nothing(index_elements=["session_id"])
                .returning(sessions)
            ).one_or_none()
            if created is None:
                raise SessionExists(
                    f"session {sid!r} already exists in this database (or its id is taken by "
                    "a session this tenant cannot see); import refuses to overwrite it: delete "
                    "it first, or import into another database"
                )
            # Parents before children, for the foreign keys.
            for table, values in (
                (compression_events, rows.events),
                (messages, rows.messages),
                (offloads, rows.offloads),
                (lineage, rows.lineage),
                (working_set, rows.working_set),
            ):
                if values:
                    conn.execute(sa.insert(table), [{"session_id": sid, **v} for v in values])
    except sa.exc.IntegrityError as exc:
        constraint = getattr(getattr(exc.orig, "diag", None), "constraint_name", None)
        if getattr(exc.orig, "sqlstate", None) == "23505" and constraint == "sessions_pkey":
            raise SessionExists(
                f"session {sid!r} was created meanwhile; nothing imported"
            ) from None
        raise InvalidExport(
            f"the export of session {sid!r} does not fit together (constraint "
            f"{constraint or 'unknown'} refused a row); nothing was imported"
        ) from None
    except sa.exc.DBAPIError as exc:
        state = getattr(exc.orig, "sqlstate", None) or ""
        if state != "42501" and state[:2] not in _REFUSED_VALUE:
            raise  # the connection or the server, not the document: the caller's to report
        raise _refused_import(sid, rows.session["tenant"], state) from None
    return session_info(created)


#: SQLSTATE classes of a value the database refuses: data exceptions (22: out of range, bad
#: text) and program limits (54: a value too large to index).
_REFUSED_VALUE = frozenset({"22", "54"})


def _refused_import(sid: str, tenant: str | None, state: str) -> InvalidExport:
    """What the database refused of a document the pure checks passed, as one autoctx error:
    the driver's text is left out, as it may quote the row's content."""
    if state == "42501":
        # Row-level security (database tenancy): the role is not granted the row's tenant.
        owner = "no tenant" if tenant is None else f"tenant {tenant!r}"
        return InvalidExport(
            f"the export of session {sid!r} belongs to {owner}, which this database role may "
            "not write (database tenancy); import it as a role granted that tenant (`autoctx "
            "db grant-tenant`) or as the tables' owner; nothing was imported"
        )
    return InvalidExport(
        f"the export of session {sid!r} holds a value the database refused (SQLSTATE "
        f"{state}); export the session again; nothing was imported"
    )
