"""Prototypes of faster `Store` hot paths, to measure proposals before they reach the library.

Not used by autoctx. `python bench/append_load.py --prototype` and `python bench/compress.py
--prototype` patch these over `Store`'s methods for the run, so the same benchmark measures the
library as it is and as it would be:

- `append`: the messages go in with one binary COPY and the working-set rows with one
  `INSERT ... SELECT generate_series` (instead of two `executemany` of one statement per row
  through SQLAlchemy's parameter processing).
- `load_working`: the driver's `fetchall` on a plain cursor (SQLAlchemy iterates `fetchone`), and
  empty metadata sent as NULL so that it is not parsed as JSON for every row.
- `snapshot`: the same plain-cursor read, plus a per-process cache keyed by the session's
  `version` and `next_event_id`. A version change with the same `next_event_id` means only
  appends happened (every compression event bumps `next_event_id`), so only the working-set
  rows past the cached last position are read; a snapshot right after this process's own
  `apply` is spliced locally from the replacements it just wrote. Either way the compressor's
  second and third passes stop re-reading 100k rows.
- `layout_of` (the strategies' shared structure pass) memoised for the last snapshot, so the six
  planners of a pass share one O(n) walk.

The SQL is the library's schema as migrations/versions/0001 creates it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import sqlalchemy as sa

import autoctx.strategies._common as strategies_common
from autoctx.errors import SessionNotFound
from autoctx.intake import OpenCalls, Prepared, bind
from autoctx.messages import Msg, block_from_json
from autoctx.plans import Snapshot
from autoctx.store import store as store_module
from autoctx.store.store import ApplyOutcome, Replacement, Store
from autoctx.store.tables import sessions
from autoctx.structure import MsgMeta, meta_of

_MESSAGE_COPY = (
    "COPY messages (session_id, id, role, name, content, metadata, kind, pinned, final, tokens, "
    "chars, call_ids, result_ids, tool_names, event_id) FROM STDIN (FORMAT BINARY)"
)
_MESSAGE_TYPES = [
    "text", "int8", "text", "text", "jsonb", "jsonb", "text", "bool", "bool", "int4", "int4",
    "text[]", "text[]", "text[]", "int8",
]  # fmt: skip


def _driver(conn: sa.Connection) -> Any:
    """The psycopg connection under a SQLAlchemy one (same transaction)."""
    return conn.connection.driver_connection


def append(self: Store, session_id: str, prepared: Sequence[Prepared]) -> list[Msg]:
    """`Store.append` with one COPY and one set-based INSERT per batch."""
    if not prepared:
        return []
    with self._begin() as conn:
        row = self._lock(conn, session_id)
        open_calls = OpenCalls(row.open_calls)
        bound = bind(prepared, open_calls, session_id=session_id)
        first_id, first_pos = row.next_message_id, row.next_position
        n = len(bound)
        driver = _driver(conn)
        with driver.cursor() as cur:
            with cur.copy(_MESSAGE_COPY) as copy:
                copy.set_types(_MESSAGE_TYPES)
                for i, p in enumerate(bound):
                    r = store_module._message_row(session_id, first_id + i, p, None)
                    copy.write_row(
                        (
                            session_id, r["id"], r["role"], r["name"], r["content"], r["metadata"],
                            r["kind"], r["pinned"], r["final"], r["tokens"], r["chars"],
                            r["call_ids"], r["result_ids"], r["tool_names"], None,
                        )
                    )  # fmt: skip
            cur.execute(
                "INSERT INTO working_set (session_id, position, message_id) "
                "SELECT %(sid)s, p, p + %(shift)s::bigint "
                "FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) AS p",
                {
                    "sid": session_id,
                    "shift": first_id - first_pos,
                    "lo": first_pos,
                    "hi": first_pos + n - 1,
                },
            )
        conn.execute(
            sa.update(sessions)
            .where(sessions.c.session_id == session_id)
            .values(
                next_message_id=first_id + n,
                next_position=first_pos + n,
                message_count=sessions.c.message_count + n,
                token_count=sessions.c.token_count + sum(p.tokens for p in bound),
                version=sessions.c.version + 1,
                open_calls=open_calls.to_json(),
                updated_at=sa.func.now(),
            )
        )
    return [p.msg.with_(id=first_id + i, tokens=p.tokens) for i, p in enumerate(bound)]


_LOAD_SQL = """
SELECT m.id, m.role, m.name, m.content, NULLIF(m.metadata, '{}'::jsonb), m.kind, m.pinned, m.tokens
FROM working_set w JOIN messages m ON m.session_id = w.session_id AND m.id = w.message_id
WHERE w.session_id = %s ORDER BY w.position
"""


def load_working(self: Store, session_id: str) -> list[Msg]:
    with self._connect() as conn, _driver(conn).cursor() as cur:
        cur.execute(_LOAD_SQL, (session_id,))
        rows = cur.fetchall()
    return [
        Msg(
            role=role,
            content=tuple(block_from_json(b) for b in content),
            name=name,
            metadata=metadata or {},
            kind=kind,
            pinned=pinned,
            id=id_,
            tokens=tokens,
        )
        for id_, role, name, content, metadata, kind, pinned, tokens in rows
    ]


# ---------------------------------------------------------------------------------------------
# Snapshot with a cache
# ---------------------------------------------------------------------------------------------

_META_SQL = """
SELECT w.position, m.id, m.role, m.kind, m.final, m.pinned, m.tokens, m.chars,
       m.call_ids, m.result_ids, m.tool_names
FROM working_set w JOIN messages m ON m.session_id = w.session_id AND m.id = w.message_id
WHERE w.session_id = %s AND w.position > %s ORDER BY w.position
"""


@dataclass(frozen=True, slots=True)
class _Cached:
    snapshot: Snapshot
    positions: tuple[int, ...]
    next_event_id: int
    created_at: Any


_cache: dict[tuple[int, str], _Cached] = {}
stats = {"full": 0, "incremental": 0, "hit": 0, "spliced": 0}
timings = {"last_apply": 0.0}


def _read_metas(cur: Any, session_id: str, after: int) -> tuple[list[int], list[MsgMeta]]:
    cur.execute(_META_SQL, (session_id, after))
    positions: list[int] = []
    metas: list[MsgMeta] = []
    for pos, id_, role, kind, final, pinned, tokens, chars, calls, results, names in cur.fetchall():
        positions.append(pos)
        metas.append(
            MsgMeta(
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
        )
    return positions, metas


def snapshot(self: Store, session_id: str) -> Snapshot:
    key = (id(self.engine), session_id)
    repeatable = self.engine.execution_options(isolation_level="REPEATABLE READ")
    with repeatable.begin() as conn:
        self._scope(conn)
        with _driver(conn).cursor() as cur:
            cur.execute(
                "SELECT version, message_count, token_count, next_event_id, created_at "
                "FROM sessions WHERE session_id = %s",
                (session_id,),
            )
            info = cur.fetchone()
            if info is None:
                raise SessionNotFound(f"session {session_id!r} does not exist (was it deleted?)")
            version, count, tokens, next_event, created = info
            cached = _cache.get(key)
            usable = (
                cached is not None
                and cached.next_event_id == next_event
                and cached.created_at == created
                and cached.snapshot.version <= version
            )
            if usable and cached is not None and cached.snapshot.version == version:
                stats["hit"] += 1
                return cached.snapshot
            if usable and cached is not None:
                # Only appends since: read the rows past the cached last position.
                stats["incremental"] += 1
                last = cached.positions[-1] if cached.positions else 0
                positions, metas = _read_metas(cur, session_id, last)
                all_positions = cached.positions + tuple(positions)
                all_metas = cached.snapshot.messages + tuple(metas)
            else:
                stats["full"] += 1
                positions, metas = _read_metas(cur, session_id, 0)
                all_positions, all_metas = tuple(positions), tuple(metas)
    snap = Snapshot(session_id, version, all_metas, tokens, count)
    _cache[key] = _Cached(snap, all_positions, next_event, created)
    return snap


_original_apply = Store.apply
_original_snapshot = Store.snapshot


def apply(
    self: Store, session_id: str, replacements: Sequence[Replacement], **kwargs: Any
) -> ApplyOutcome:
    """`Store.apply`, then the cached snapshot spliced with what it wrote (when nothing else
    wrote in between: the apply's version is the cached one plus one)."""
    started = time.perf_counter()
    outcome = _original_apply(self, session_id, replacements, **kwargs)
    # The library's apply alone, so that a benchmark can tell it from the splice below.
    timings["last_apply"] = time.perf_counter() - started
    key = (id(self.engine), session_id)
    cached = _cache.pop(key, None)
    applied = [e for e in outcome.events if e.status == "applied"]
    if outcome.conflict or cached is None or not applied:
        return outcome
    if applied[0].session_version != cached.snapshot.version + 1 or len(applied) != len(
        replacements
    ):
        return outcome
    metas = list(cached.snapshot.messages)
    positions = list(cached.positions)
    # From the last range to the first, so that earlier indices stay valid.
    pairs = sorted(
        zip(replacements, applied, strict=True), key=lambda x: x[0].edit.start, reverse=True
    )
    for r, event in pairs:
        assert event.summary_message_id is not None
        meta = meta_of(
            r.new.msg, id=event.summary_message_id, final=r.new.final, tokens=r.new.tokens
        )
        metas[r.edit.start : r.edit.end] = [meta]
        positions[r.edit.start : r.edit.end] = [positions[r.edit.start]]
    last = applied[-1]
    snap = replace(
        cached.snapshot,
        version=last.session_version,
        messages=tuple(metas),
        token_count=last.tokens_after,
        message_count=last.messages_after,
    )
    _cache[key] = _Cached(
        snap, tuple(positions), cached.next_event_id + len(applied), cached.created_at
    )
    stats["spliced"] += 1
    return outcome


# ---------------------------------------------------------------------------------------------
# One layout per snapshot
# ---------------------------------------------------------------------------------------------

_original_layout_of = strategies_common.layout_of
_last_layout: list[Any] = [None, None, None]


def layout_of(snapshot: Snapshot, config: Any) -> Any:
    if _last_layout[0] is snapshot and _last_layout[1] is config:
        return _last_layout[2]
    layout = _original_layout_of(snapshot, config)
    _last_layout[:] = [snapshot, config, layout]
    return layout


@contextlib.contextmanager
def installed(
    *, store: bool = True, snapshots: bool = True, layouts: bool = True
) -> Iterator[None]:
    """Patch the prototypes in for the duration of a block."""
    import autoctx.strategies as strategies

    saved: list[tuple[Any, str, Any]] = []

    def swap(target: Any, name: str, value: Any) -> None:
        saved.append((target, name, getattr(target, name)))
        setattr(target, name, value)

    if store:
        swap(Store, "append", append)
        swap(Store, "load_working", load_working)
    if snapshots:
        swap(Store, "snapshot", snapshot)
        swap(Store, "apply", apply)
    if layouts:
        # The planners import layout_of by name: patch it where they look it up.
        for module in (
            strategies.s1_tool_runs, strategies.s2_previews, strategies.s3_tail_previews,
            strategies.s4_rounds, strategies.s5_large, strategies.s6_current_round,
        ):  # fmt: skip
            if hasattr(module, "layout_of"):
                swap(module, "layout_of", layout_of)
    try:
        yield
    finally:
        # The caches stay: a benchmark installs the prototypes around each call it times.
        for target, name, value in reversed(saved):
            setattr(target, name, value)


def verify(store: Store, session_id: str) -> None:
    """Raise if the cached snapshot differs from a full read by the library's own method."""
    cached = _cache.get((id(store.engine), session_id))
    if cached is None:
        return
    fresh = _original_snapshot(store, session_id)
    if fresh.messages != cached.snapshot.messages or fresh.version != cached.snapshot.version:
        raise AssertionError(f"prototype snapshot cache of {session_id!r} differs from a full read")
