"""The SQL of a session's lifecycle: fork, and the rows of an export (erasure: `erase.py`).

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
- `erase` (in `erase.py`) tombstones originals and rewrites every message derived from them,
  in one transaction under the session row lock (`autoctx._erasure` says what is written), and
  names the forks that keep copies. Forks and erasures of a session serialize on an advisory
  lock (`_forking`, `FORK_SPACE`): an erasure waits for the forks in flight, which a fork's
  REPEATABLE READ snapshot would otherwise hide from it; appends and compressions never wait
  for a fork.
- `read_rows` and `write_rows` move every row of a session to and from an export document
  (`autoctx._exports`).

Columns are always named: a column added later (a generated search vector, say) is never
copied by accident, and a generated column cannot be written.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from .._erasure_result import AutoContextErasure as AutoContextErasure
from .._errors import (
    InvalidExport,
    MessageNotFound,
    SessionExists,
)
from .._events import MANUAL
from .._intake import open_calls_at_tail
from .rows import (
    SessionInfo,
    event_row,
    session_info,
)
from .scope import TenantScope
from .session_row import session_gone
from .sql import COVERING_CHAIN, SNAPSHOT, WORKING_IDS, avoid_nested_loops
from .store import SessionStore
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
