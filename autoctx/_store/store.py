"""The store of one session: every SQL statement autoctx issues for a session lives here and
in `autoctx._store.compression` (the compression's writes, which `SessionStore` inherits).

Each public method is one unit of work (one transaction, or one statement in autocommit where a
statement does it all). Writers of a session serialize on the session row (`SELECT ... FOR
UPDATE`, or the `UPDATE` of the one-statement append): an append, an apply and an event record
each lock it for the few milliseconds of their work, and nothing holds it across a summarizer
call.
Every statement filters on one session_id, so sessions never block each other and the schema can
be sharded by session (docs/scaling.md).

A `SessionStore` is bound to one session id and to the incarnation it first sees
(docs/design.md §5): every statement names it too, so once the session is deleted (and perhaps
created again under the same id, by anyone, for any tenant) each call raises `SessionNotFound`
and nothing of the new session is read or written. An incarnation belongs to one tenant, so
this also scopes every statement to the tenant the session was opened for. The store's caches
belong to that incarnation and only ever take what committed. What spans sessions (listing,
inspection, import and export, retention) is `autoctx._store.catalog`'s.
"""

from __future__ import annotations

import uuid as uuid_mod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine, Row

from .._arguments import OffloadRef
from .._errors import InvalidMessage, OffloadNotFound
from .._events import MANUAL, Event
from .._gc import paused_gc
from .._idempotency import check_same_add
from .._intake import OpenCalls, Prepared, bind, open_calls_at_tail
from .._messages import Msg, json_text
from .._plans import Snapshot
from .._structure import MsgMeta
from .compression import CachedSnapshot, CompressionWrites
from .rows import (
    SessionInfo,
    documents,
    event_from_row,
    event_row,
    message_fields,
    message_row,
    msg_from_columns,
    search_config_of,
    stored,
)
from .session_row import session_gone
from .sql import (
    ADDED_WITH_KEY,
    APPEND_AT_VERSION,
    APPEND_LARGE_AT_VERSION,
    DELETE_SESSION,
    DOCUMENTS_BY_ID,
    LAST_WORKING,
    LOAD_WORKING,
    ORIGINALS,
    SNAPSHOT,
    TAIL_CALLS,
    UNLINK_WORKING,
    WORKING_IDS,
    avoid_nested_loops,
    messages_by_id,
    originals_below,
)
from .tables import compression_events, lineage, messages, offloads, sessions, working_set


@dataclass(frozen=True, slots=True)
class _Appended:
    """What a committed one-statement append returns: the messages and the new totals."""

    msgs: list[Msg]
    message_count: int
    token_count: int


def offload_named(offload: OffloadRef) -> sa.ColumnElement[bool]:
    """The condition on `offloads` of the offload a uuid or a handle names."""
    if isinstance(offload, int):
        return offloads.c.handle == offload
    return offloads.c.uuid == offload


#: Characters of a batch's rows beyond which the append sends them as an array of texts
#: (`APPEND_LARGE_AT_VERSION`): one jsonb value holds at most 256 MB, and a character is at
#: most four bytes of UTF-8.
LARGE_BATCH_CHARS = 50_000_000


def _append_rows(bound: Sequence[Prepared]) -> tuple[str, str | list[str]]:
    """The append statement for the batch and its `rows` parameter: a JSON array of one object
    per message (one text for psycopg to send, where an array per column cost it a Python walk
    of each), or for a very large batch a list of those objects' texts. Each message's content
    and metadata are spliced in as the JSON texts they are (written once, never escaped as
    strings), its scalars and id arrays written by one `json_text`."""
    rows = []
    for p in bound:
        m = p.msg
        head = json_text(message_fields(p))
        metadata = p.metadata_json if p.metadata_json is not None else json_text(dict(m.metadata))
        rows.append(f'{head[:-1]},"content":{json_text(m.content_json())},"metadata":{metadata}}}')
    if sum(map(len, rows)) > LARGE_BATCH_CHARS:
        return APPEND_LARGE_AT_VERSION, rows
    return APPEND_AT_VERSION, "[" + ",".join(rows) + "]"


class SessionStore(CompressionWrites):
    """The SQL of one session: its messages, working set, offloads, lineage and events.

    Bound to one session id and the incarnation it first sees (the module docstring), and the
    only owner of that session's caches: the planning snapshot, the tail (the version this
    store's last write produced and the open calls then) and the totals of its latest append.
    Fork and erasure (`lifecycle.fork`, `erase.erase`) work on the session through its
    internal API (`transaction`, `statement`, `scope`, `row_condition`, `lock_row`,
    `rewritten`), never through these caches; search takes it as a tenant scope. Appends,
    reads, pops and clears are here; a compression's apply, an undo's restore and a recorded
    attempt are `CompressionWrites`' (autoctx._store.compression).
    """

    def __init__(self, engine: Engine, session_id: str, tenant: str | None = None) -> None:
        super().__init__(engine, session_id, tenant)
        self._snapshot: CachedSnapshot | None = None
        #: The version this store's last write produced and the open calls then: what the
        #: one-statement append checks against.
        self._tail: tuple[int, dict[str, str]] | None = None
        #: The working (message, token) totals this store's latest append committed (see
        #: `totals_after_append`).
        self._appended: tuple[int, int] | None = None

    # -- the session row --------------------------------------------------------------------------

    def rewritten(self, version: int, open_calls: Mapping[str, str]) -> None:
        """After a committed rewrite in place (an erasure) at `version`: drop what this store
        cached of the messages (their tokens and chars changed); the open calls are still
        `open_calls` (tombstones keep every id)."""
        self._snapshot = None
        self._appended = None
        self._tail = (version, dict(open_calls))

    def delete_session(self) -> None:
        """Delete the session and everything of it (the foreign keys cascade): the incarnation
        this store works on, never one created since under the same id (`SessionNotFound`
        when it is already gone)."""
        params = {"sid": self.session_id, "inc": self.incarnation(), "tenant": self.tenant}
        with self.transaction() as conn:
            deleted = conn.exec_driver_sql(DELETE_SESSION, params).all()
        self._tail = self._snapshot = self._appended = None
        if not deleted:
            raise session_gone(self.session_id)

    # -- append and load ------------------------------------------------------------------------

    def append(self, prepared: Sequence[Prepared], *, add_key: str | None = None) -> list[Msg]:
        """Append validated messages atomically; returns them with ids and tokens.

        The append is one statement (`APPEND_AT_VERSION`): it updates the session row only if
        it is still at the version the store expects and inserts the messages and their
        working-set rows from the same snapshot of it, so it either all happens or nothing
        does. When this store wrote the session's latest version itself (the usual case: one
        agent loop, one memory), it runs alone, in autocommit: the update's row lock serializes
        it with every other writer of the session. Otherwise (a process's first append, or
        another writer came in between) the store first locks the session row to learn its
        version and open calls, validates the batch against them, and runs the same statement
        in that transaction.

        With `add_key`, always the locked path: under the session row's lock, the messages an
        earlier append with the same key stored are returned instead (`Conflict` when they
        are not the same messages), so that a retried add stores nothing twice.
        """
        if not prepared:
            return []
        if add_key is not None:
            return self._append_once(prepared, add_key)
        tail, self._tail = self._tail, None
        if tail is not None:
            version, calls = tail
            open_calls = OpenCalls(calls)
            try:
                with self.statement() as conn:
                    done = self._append_at(conn, version, open_calls, prepared)
            except InvalidMessage:
                done = None  # maybe stale: the locked path validates against the truth
            if done is not None:
                self._appended_committed(version, open_calls, done)
                return done.msgs
        with self.transaction() as conn:
            row = self.lock_row(conn)
            open_calls = OpenCalls(row.open_calls)
            done = self._append_at(conn, row.version, open_calls, prepared)
            assert done is not None  # the row is locked at that version
        # Only now that it committed: an append interrupted before its commit must leave no
        # trace in what the next append trusts.
        self._appended_committed(row.version, open_calls, done)
        return done.msgs

    def _append_once(self, prepared: Sequence[Prepared], add_key: str) -> list[Msg]:
        """`append` with an idempotency key (docs/design.md §5)."""
        self._tail = None
        params = {"sid": self.session_id, "inc": self.incarnation(), "key": add_key}
        with self.transaction() as conn:
            row = self.lock_row(conn)
            earlier = [msg_from_columns(*r) for r in conn.exec_driver_sql(ADDED_WITH_KEY, params)]
            if earlier:
                check_same_add(self.session_id, add_key, earlier, prepared)
                return earlier
            open_calls = OpenCalls(row.open_calls)
            done = self._append_at(conn, row.version, open_calls, prepared, add_key)
            assert done is not None  # the row is locked at that version
        self._appended_committed(row.version, open_calls, done)
        return done.msgs

    def _appended_committed(self, version: int, open_calls: OpenCalls, done: _Appended) -> None:
        self._tail = (version + 1, open_calls.to_json())
        self._appended = (done.message_count, done.token_count)

    def _append_at(
        self,
        conn: Connection,
        version: int,
        open_calls: OpenCalls,
        prepared: Sequence[Prepared],
        add_key: str | None = None,
    ) -> _Appended | None:
        """Bind the batch's tool results to `open_calls` (advancing them to the calls it leaves
        open; `InvalidMessage` for a result of no open call) and run the one-statement append
        if the session is at `version`; None if it is not. The one place both append paths
        (`append`, `replace_working`) bind a batch."""
        bound = bind(prepared, open_calls, session_id=self.session_id)
        statement, rows = _append_rows(bound)
        params = {
            "sid": self.session_id,
            "inc": self.incarnation(),
            "version": version,
            "n": len(bound),
            "added_tokens": sum(p.tokens for p in bound),
            "open_calls": json_text(open_calls.to_json()),
            "add_key": add_key,
            "rows": rows,
        }
        claimed = conn.exec_driver_sql(statement, params).one_or_none()
        if claimed is None:
            return None  # another writer moved the session on
        first_id, message_count, token_count = claimed
        msgs = [stored(p.msg, first_id + i, p.tokens) for i, p in enumerate(bound)]
        return _Appended(msgs, message_count, token_count)

    def count_originals(self) -> int:
        """How many originals the session stores (the demo's "nothing lost" check)."""
        stmt = (
            sa.select(sa.func.count())
            .select_from(messages)
            .where(
                messages.c.session_id == self.session_id,
                messages.c.kind == "original",
                self.alive_condition(),
            )
        )
        with self.statement() as conn:
            count = int(conn.execute(stmt).scalar_one())
            if not count:
                self.check_alive(conn)
        return count

    def totals_after_append(self) -> tuple[int, int] | None:
        """The working (message, token) totals as this store's latest append of the session
        committed them, without a read; None if it has not appended to it.

        Exact at that commit; a later write by anyone else is not in them. Right after an
        append, that is what deciding whether the append calls for a compression needs.
        """
        return self._appended

    def load_working(self) -> list[Msg]:
        """The working context, in order."""
        params = {"sid": self.session_id, "inc": self.incarnation()}
        with paused_gc():
            with self.connection() as conn:
                avoid_nested_loops(conn)
                rows = conn.exec_driver_sql(LOAD_WORKING, params).all()
                if not rows:
                    self.check_alive(conn)
            return [msg_from_columns(*r) for r in rows]

    def snapshot(self) -> Snapshot:
        """The working context, metadata only, at one version (read in one transaction).

        Kept per store and reused: a snapshot at the same version is returned as is; when only
        appends happened since (no event was written: every compression, failed attempt or
        conflict writes one), only the rows past the last known position are read; after this
        store's own apply the snapshot is spliced locally (see `apply`). So the compressor's
        passes over a 100k-message session read it once, not once per pass.
        """
        # REPEATABLE READ makes the session row and the working set one consistent view.
        repeatable = self.engine.execution_options(isolation_level="REPEATABLE READ")
        with repeatable.begin() as conn:
            self.scope(conn)
            info = conn.execute(
                sa.select(
                    sessions.c.version,
                    sessions.c.message_count,
                    sessions.c.token_count,
                    sessions.c.next_event_id,
                    sessions.c.incarnation,
                    sessions.c.next_handle,
                ).where(self.row_condition())
            ).one_or_none()
            if info is None:
                raise session_gone(self.session_id)
            cached = self._snapshot
            usable = (
                cached is not None
                and cached.next_event_id == info.next_event_id
                and cached.incarnation == info.incarnation
                and cached.snapshot.version <= info.version
            )
            if usable and cached is not None and cached.snapshot.version == info.version:
                return cached.snapshot
            after = (
                cached.positions[-1] if usable and cached is not None and cached.positions else 0
            )
            avoid_nested_loops(conn)
            with paused_gc():
                rows = conn.exec_driver_sql(
                    SNAPSHOT, {"sid": self.session_id, "after": after}
                ).all()
        with paused_gc():
            positions = tuple(r[0] for r in rows)
            metas = tuple(
                MsgMeta(id_, role, kind, final, pinned, tokens, chars, tuple(c), tuple(r), tuple(t))
                for _, id_, role, kind, final, pinned, tokens, chars, c, r, t in rows
            )
        if usable and cached is not None:
            positions = cached.positions + positions
            metas = cached.snapshot.messages + metas
        snap = Snapshot(
            self.session_id,
            info.version,
            metas,
            info.token_count,
            info.message_count,
            info.next_handle,
        )
        self._snapshot = CachedSnapshot(snap, positions, info.next_event_id, info.incarnation)
        return snap

    def load_messages(self, ids: Iterable[int]) -> dict[int, Msg]:
        """Stored messages by id (any, working or not)."""
        id_list = list(ids)
        if not id_list:
            return {}
        with self.statement() as conn:
            found = messages_by_id(conn, self.session_id, self.incarnation(), id_list)
            if not found:
                self.check_alive(conn)
        return found

    def load_originals(self, offset: int, limit: int | None) -> list[Msg]:
        """The originals as appended, in order, a page of them (`AutoContextMemory.originals`)."""
        params = {"sid": self.session_id, "inc": self.incarnation(), "offset": offset}
        with paused_gc():
            with self.statement() as conn:
                rows = conn.exec_driver_sql(ORIGINALS, {**params, "limit": limit}).all()
                if not rows:
                    self.check_alive(conn)
            return [msg_from_columns(*r) for r in rows]

    def message_documents(self, ids: Sequence[int]) -> list[tuple[int, str, str, Any, Any]]:
        """(id, role, kind, content JSON, metadata JSON) of stored messages, for integrations
        that decode the stored JSON themselves."""
        if not ids:
            return []
        params = {"sid": self.session_id, "inc": self.incarnation(), "ids": list(ids)}
        with paused_gc(), self.statement() as conn:
            rows = conn.exec_driver_sql(DOCUMENTS_BY_ID, params).all()
            if not rows:
                self.check_alive(conn)
        return documents(rows)

    def working_ids(self, limit: int | None = None) -> tuple[int, list[int]]:
        """The session's erasure count and its working message ids in order (the last `limit`
        of them when given). One short query: no content. The count changes with every
        erasure, which rewrites messages in place: a cache of content by message id must be
        dropped when it changes."""
        params = {"sid": self.session_id, "inc": self.incarnation(), "n": limit}
        with self.statement() as conn:
            row = conn.exec_driver_sql(WORKING_IDS, params).one_or_none()
        if row is None:
            raise session_gone(self.session_id)
        return int(row[1]), list(row[0])

    def pop_last(
        self,
        remainder: Callable[[Msg, bool], Prepared | None],
        *,
        config: Mapping[str, Any],
    ) -> Msg | None:
        """Take the last working message out of the working context (one transaction).

        `remainder(last, last_final)` may return a message to stand in its place (same
        position: the rest of a message that held several items), its `final` already decided
        from whether `last` was the final answer (`autoctx._intake.stand_in`); the original
        stays stored either way, linked by lineage to the remainder. Updates the totals and the
        open calls, bumps the version and records an applied event with strategy 0 and reason
        'manual'. Returns the message taken out, or None when the working context is empty.
        """
        with self.transaction() as conn:
            srow = self.lock_row(conn)
            last = conn.exec_driver_sql(LAST_WORKING, {"sid": self.session_id}).one_or_none()
            if last is None:
                return None
            position, last_id, last_final = last[0], last[1], last[2]
            popped = messages_by_id(conn, self.session_id, srow.incarnation, [last_id])[last_id]
            rest = remainder(popped, bool(last_final))
            event_id, version = srow.next_event_id, srow.version + 1
            rest_id = srow.next_message_id if rest is not None else None
            self._unlink(conn, [last_id])
            popped_tokens = popped.tokens or 0
            count_after = srow.message_count - (0 if rest is not None else 1)
            tokens_after = srow.token_count - popped_tokens + (rest.tokens if rest else 0)
            conn.execute(
                sa.insert(compression_events).values(
                    event_row(
                        self.session_id,
                        event_id,
                        strategy=MANUAL,
                        status="applied",
                        reason="manual",
                        messages=(srow.message_count, count_after),
                        tokens=(srow.token_count, tokens_after),
                        replaced_ids=[last_id],
                        replaced_tokens=popped_tokens,
                        summary_message_id=rest_id,
                        session_version=version,
                        config=config,
                    )
                )
            )
            if rest is not None and rest_id is not None:
                conn.execute(
                    sa.insert(messages).values(
                        **message_row(self.session_id, rest_id, rest, event_id),
                        search_config=search_config_of(srow.config),
                    )
                )
                conn.execute(
                    sa.insert(working_set).values(
                        session_id=self.session_id, position=position, message_id=rest_id
                    )
                )
                # The remainder stands for the popped message's other items: "which working
                # message covers this original" stays answerable for them.
                conn.execute(
                    sa.insert(lineage).values(
                        session_id=self.session_id,
                        summary_id=rest_id,
                        ordinal=0,
                        replaced_id=last_id,
                        event_id=event_id,
                    )
                )
            conn.execute(
                sa.update(sessions)
                .where(self.row_condition())
                .values(
                    next_message_id=srow.next_message_id + (1 if rest is not None else 0),
                    next_event_id=event_id + 1,
                    message_count=count_after,
                    token_count=tokens_after,
                    version=version,
                    open_calls=(tail_calls := self._open_calls_at_tail(conn)),
                    updated_at=sa.func.now(),
                )
            )
        self._tail = (version, tail_calls)
        return popped

    def clear(self, *, config: Mapping[str, Any]) -> Event:
        """Empty the working context in one transaction, keeping every original, offload and
        lineage row (clearing is not deleting, docs/design.md §5): an applied event of strategy
        0 with reason 'clear' names what left the working set, and an offload holds it, so that
        what was cleared stays reloadable by the event's uuid like any compressed range."""
        event, _ = self.replace_working((), config=config)
        return event

    def replace_working(
        self, prepared: Sequence[Prepared], *, config: Mapping[str, Any]
    ) -> tuple[Event, list[Msg]]:
        """`clear`, then append `prepared` to the emptied context, in the same transaction: a
        rewrite of a whole history (the Agents SDK's compaction wrapper) that a crash or a
        reader never sees half done. Returns the clear's event and the appended messages."""
        # The emptied context has no open call; `bind` advances this to the calls the
        # appended messages leave open, which the tail cache must then hold.
        open_calls = OpenCalls({})
        with self.transaction() as conn:
            row = self.lock_row(conn)
            created, version = self._clear_locked(conn, row, config)
            done: _Appended | None = None
            if prepared:
                done = self._append_at(conn, version, open_calls, prepared)
                assert done is not None  # the row is locked at that version
        self._snapshot = None
        if done is None:
            self._appended = None
            self._tail = (version, {})
            return event_from_row(created), []
        self._appended_committed(version, open_calls, done)
        return event_from_row(created), done.msgs

    def _clear_locked(
        self, conn: Connection, row: Row[Any], config: Mapping[str, Any]
    ) -> tuple[Row[Any], int]:
        """The writes of `clear`, in the caller's transaction on the locked session `row`;
        returns the event's row and the session's new version."""
        removed = conn.exec_driver_sql(UNLINK_WORKING, {"sid": self.session_id, "ids": None}).all()
        replaced = [message_id for _, message_id in sorted(removed)]
        offload_uuid = uuid_mod.uuid4() if replaced else None
        next_handle = row.next_handle + (1 if replaced else 0)
        version = row.version + 1
        created = conn.execute(
            sa.insert(compression_events)
            .values(
                event_row(
                    self.session_id,
                    row.next_event_id,
                    strategy=MANUAL,
                    status="applied",
                    reason="clear",
                    messages=(row.message_count, 0),
                    tokens=(row.token_count, 0),
                    replaced_ids=replaced,
                    replaced_tokens=row.token_count,
                    offload_uuid=offload_uuid,
                    session_version=version,
                    config=config,
                )
            )
            .returning(compression_events)
        ).one()
        if offload_uuid is not None:
            conn.execute(
                sa.insert(offloads).values(
                    session_id=self.session_id,
                    uuid=offload_uuid,
                    handle=row.next_handle,
                    event_id=row.next_event_id,
                    message_ids=replaced,
                )
            )
        conn.execute(
            sa.update(sessions)
            .where(self.row_condition())
            .values(
                next_event_id=row.next_event_id + 1,
                next_handle=next_handle,
                message_count=0,
                token_count=0,
                version=version,
                open_calls={},
                updated_at=sa.func.now(),
            )
        )
        return created, version

    def _open_calls_at_tail(self, conn: Connection) -> dict[str, str]:
        """The newest tool group's calls still without results, read from the working tail."""
        window = 32
        while True:
            rows = conn.exec_driver_sql(TAIL_CALLS, {"sid": self.session_id, "n": window}).all()
            found = open_calls_at_tail(rows)
            if found is not None:
                return found
            if len(rows) < window:
                return {}
            window *= 4

    def totals(self) -> SessionInfo:
        """The session row: one primary-key read, no messages (the O(1) trigger check)."""
        info = self.get_session()
        if info is None:
            raise session_gone(self.session_id)
        return info

    # -- reload and audit ----------------------------------------------------------------------

    def reload(self, offload: OffloadRef, *, originals: bool = False) -> list[Msg]:
        """The messages an offload (by uuid or handle) removed, in order (one level deep); with
        `originals`, the originals behind them, lineage followed down through nested
        summaries."""
        with self.connection() as conn:
            ids = conn.execute(
                sa.select(offloads.c.message_ids).where(
                    offloads.c.session_id == self.session_id,
                    offload_named(offload),
                    self.alive_condition(),
                )
            ).scalar_one_or_none()
            if ids is None:
                self.check_alive(conn)
                raise OffloadNotFound(
                    f"no offloaded context with id {offload} in session {self.session_id!r}"
                )
            ids = originals_below(conn, self.session_id, list(ids)) if originals else list(ids)
            by_id = messages_by_id(conn, self.session_id, self.incarnation(), ids)
        return [by_id[i] for i in ids]

    def events(self) -> list[Event]:
        stmt = (
            sa.select(compression_events)
            .where(compression_events.c.session_id == self.session_id, self.alive_condition())
            .order_by(compression_events.c.id)
        )
        with self.statement() as conn:
            found = [event_from_row(r) for r in conn.execute(stmt)]
            if not found:
                self.check_alive(conn)
        return found
