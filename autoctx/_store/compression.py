"""The compression's writes of one session's store: a strategy's replacements applied in one
transaction (each with its offload, lineage and event), an undo's restoration, an attempt that
changed nothing recorded as an event, and the working-set unlink they share.

`SessionStore` (autoctx._store.store) is made of this and of its appends and reads; the split
is by job only: one object, one set of caches (the planning snapshot, the tail, the totals of
the latest append: see `SessionStore`), each written here and there under the same rules.
"""

from __future__ import annotations

import uuid as uuid_mod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Row

from .._errors import Conflict
from .._events import Event
from .._plans import Edit, Snapshot, splice
from .._replacements import ApplyOutcome, Replacement, next_handle_after
from .._structure import meta_of
from . import undo
from .rows import event_from_row, event_of, event_row, message_row
from .session_row import SessionRow
from .sql import CHECK_RANGES, UNLINK_WORKING
from .tables import compression_events, lineage, messages, offloads, sessions, working_set

if TYPE_CHECKING:  # the store applies an undo's plan; it does not make one
    from .._undo import Restoration


@dataclass(frozen=True, slots=True)
class CachedSnapshot:
    snapshot: Snapshot
    #: Working-set position of each message of the snapshot.
    positions: tuple[int, ...]
    #: The session's event counter when read: an unchanged one means only appends since.
    next_event_id: int
    #: The incarnation the snapshot was read from.
    incarnation: uuid_mod.UUID


def _conflict(erased: bool, moved: bool) -> str:
    """Why a planned replacement cannot apply (its `conflict` event's error)."""
    if erased:
        return "an erasure rewrote messages since the snapshot"
    if moved:
        return "the working set changed since the snapshot (another writer compressed it)"
    # Its range is intact, but its handle was numbered from the snapshot's counter and an
    # offload made since took it: planned again, it gets the next free one.
    return (
        "the working set changed since the snapshot (another offload took the planned handle: "
        "another writer compressed or cleared the session)"
    )


def _erased_since(conn: Connection, session_id: str, version: int) -> bool:
    """Whether an erasure of the session committed after `version`.

    Events are numbered in commit order and each records the session version of its time, so
    those after `version` are the newest ones: read back from the newest (by primary key)
    until one is not after it. Usually the first is not: nothing else wrote while the
    summarizer ran. Inherited events (a fork's copies) are the parent's history.
    """
    window = 8
    while True:
        rows = conn.execute(
            sa.select(
                compression_events.c.session_version,
                compression_events.c.reason,
                compression_events.c.status,
                compression_events.c.inherited,
            )
            .where(compression_events.c.session_id == session_id)
            .order_by(compression_events.c.id.desc())
            .limit(window)
        ).all()
        for r in rows:
            if r.session_version <= version:
                return False
            if r.reason == "erase" and r.status == "applied" and not r.inherited:
                return True
        if len(rows) < window:
            return False
        window *= 4


class CompressionWrites(SessionRow):
    """The writes of a compression, an undo and a recorded attempt, and the caches of the
    session they keep current (declared here, set by `SessionStore.__init__`)."""

    _snapshot: CachedSnapshot | None
    _tail: tuple[int, dict[str, str]] | None
    _appended: tuple[int, int] | None

    def _unlink(self, conn: Connection, ids: list[int]) -> None:
        """Take `ids` out of the working set (in the caller's transaction, the session row
        locked and the ids checked there). The function refuses a login that does not hold
        the session's tenant by removing nothing: then the transaction must not go on."""
        removed = conn.exec_driver_sql(UNLINK_WORKING, {"sid": self.session_id, "ids": ids}).all()
        if len(removed) != len(ids):
            raise Conflict(
                f"session {self.session_id!r}: the working set could not be changed "
                f"({len(removed)} of {len(ids)} messages taken out); the database login does "
                "not hold the session's tenant (`autoctx db grant-tenant`); nothing was written"
            )

    def apply(
        self,
        replacements: Sequence[Replacement],
        *,
        reason: str,
        config: Mapping[str, Any],
        seen_version: int | None = None,
    ) -> ApplyOutcome:
        """Apply a strategy's replacements in one transaction, each with its offload, lineage
        and event. If any replaced range is no longer in the working set as planned, nothing is
        applied and a `conflict` event is recorded per changed range. So it is when an erasure
        committed after `seen_version` (the snapshot's): the summaries were written from
        content it may have erased."""
        if not replacements:
            return ApplyOutcome([], False)
        with self.transaction() as conn:
            row = self.lock_row(conn)
            positions = self._check_ranges(conn, [r.edit for r in replacements])
            erased = seen_version is not None and _erased_since(conn, self.session_id, seen_version)
            # The handles were numbered from the snapshot's counter: another offload since (by
            # a writer that compressed another range, or a clear) took them.
            taken = min(r.handle for r in replacements) < row.next_handle
            conflicts = [
                (r, _conflict(erased, pos is None))
                for r, pos in zip(replacements, positions, strict=True)
                if pos is None or erased or taken
            ]
            if not conflicts:
                applied = self._write(conn, row, replacements, positions, reason, config)
        if not conflicts:
            self._splice(row, replacements, applied)
            # A compression changes no open call: the tail is known at the new version.
            self._tail = (applied[-1].session_version, dict(row.open_calls))
            return ApplyOutcome(applied, False)
        events = [
            self.record_event(
                strategy=r.edit.strategy,
                status="conflict",
                reason=reason,
                replaced_ids=r.edit.replaced_ids,
                error=error,
                config=config,
            )
            for r, error in conflicts
        ]
        return ApplyOutcome(events, True)

    def _splice(
        self,
        row: Row[Any],
        replacements: Sequence[Replacement],
        applied: Sequence[Event],
    ) -> None:
        """Bring the cached snapshot up to the version this apply committed, without a read.

        Only when the cache was at exactly the version the apply started from (nobody else
        wrote in between); otherwise the next snapshot reads what it needs.
        """
        cached, self._snapshot = self._snapshot, None
        if (
            cached is None
            or cached.snapshot.version != row.version
            or cached.next_event_id != row.next_event_id
        ):
            return
        changes = []
        for r, event in zip(replacements, applied, strict=True):
            assert event.summary_message_id is not None
            new = meta_of(
                r.new.msg, id=event.summary_message_id, final=r.new.final, tokens=r.new.tokens
            )
            changes.append((r.edit, new))
        try:
            snapshot = cached.snapshot.apply(
                changes, next_handle_after(row.next_handle, replacements)
            )
        except ValueError:
            return  # planned on another snapshot than the cached one: the next read refreshes it
        # The new message takes the working-set position of the last message it replaces.
        positions = splice(
            cached.positions, [(r.edit, cached.positions[r.edit.end - 1]) for r in replacements]
        )
        self._snapshot = CachedSnapshot(
            snapshot, tuple(positions), row.next_event_id + len(applied), cached.incarnation
        )

    def _check_ranges(self, conn: Connection, edits: Sequence[Edit]) -> list[int | None]:
        """For each edit, the working position of its last replaced message if its span is
        still exactly what the plan saw (its replaced ids, with the kept messages of a fold
        between them), adjacent and in order; else None."""
        rows = conn.exec_driver_sql(
            CHECK_RANGES,
            {
                "sid": self.session_id,
                "firsts": [e.replaced_ids[0] for e in edits],
                "lasts": [e.replaced_ids[-1] for e in edits],
            },
        )
        # The span ends at the last replaced message, so its last position is that message's.
        found = {r.ord: (r.last_position, tuple(r.ids)) for r in rows}
        out: list[int | None] = []
        for k, edit in enumerate(edits, start=1):
            hit = found.get(k)
            out.append(hit[0] if hit is not None and hit[1] == edit.expected_span else None)
        return out

    def _write(
        self,
        conn: Connection,
        row: Row[Any],
        replacements: Sequence[Replacement],
        positions: Sequence[int | None],
        reason: str,
        config: Mapping[str, Any],
    ) -> list[Event]:
        next_msg, next_event = row.next_message_id, row.next_event_id
        count, tokens = row.message_count, row.token_count
        version = row.version + 1
        msg_rows: list[dict[str, Any]] = []
        event_rows: list[dict[str, Any]] = []
        offload_rows: list[dict[str, Any]] = []
        lineage_rows: list[dict[str, Any]] = []
        working_rows: list[dict[str, Any]] = []
        removed_ids: list[int] = []
        for r, position in zip(replacements, positions, strict=True):
            assert position is not None
            msg_id, event_id = next_msg, next_event
            next_msg += 1
            next_event += 1
            replaced = r.edit.replaced_ids
            replaced_tokens = r.edit.replaced_tokens
            before_count, before_tokens = count, tokens
            count += 1 - len(replaced)
            tokens += r.new.tokens - replaced_tokens
            event_rows.append(
                event_row(
                    self.session_id,
                    event_id,
                    strategy=r.edit.strategy,
                    status="applied",
                    reason=reason,
                    messages=(before_count, count),
                    tokens=(before_tokens, tokens),
                    replaced_ids=replaced,
                    replaced_tokens=replaced_tokens,
                    summary_message_id=msg_id,
                    offload_uuid=r.offload_uuid,
                    model=r.model,
                    prompt_tokens=r.prompt_tokens,
                    completion_tokens=r.completion_tokens,
                    latency_ms=r.latency_ms,
                    session_version=version,
                    config=config,
                    facts=r.facts,
                )
            )
            msg_rows.append(message_row(self.session_id, msg_id, r.new, event_id))
            offload_rows.append(
                {
                    "session_id": self.session_id,
                    "uuid": r.offload_uuid,
                    "handle": r.handle,
                    "event_id": event_id,
                    "message_ids": list(replaced),
                }
            )
            lineage_rows.extend(
                {
                    "session_id": self.session_id,
                    "summary_id": msg_id,
                    "ordinal": k,
                    "replaced_id": rid,
                    "event_id": event_id,
                }
                for k, rid in enumerate(replaced)
            )
            removed_ids.extend(replaced)
            working_rows.append(
                {"session_id": self.session_id, "position": position, "message_id": msg_id}
            )
        conn.execute(sa.insert(compression_events), event_rows)
        conn.execute(sa.insert(messages), msg_rows)
        conn.execute(sa.insert(offloads), offload_rows)
        conn.execute(sa.insert(lineage), lineage_rows)
        self._unlink(conn, removed_ids)
        conn.execute(sa.insert(working_set), working_rows)
        conn.execute(
            sa.update(sessions)
            .where(self.row_condition())
            .values(
                next_message_id=next_msg,
                next_event_id=next_event,
                next_handle=next_handle_after(row.next_handle, replacements),
                message_count=count,
                token_count=tokens,
                version=version,
                updated_at=sa.func.now(),
            )
        )
        return [event_of(e) for e in event_rows]

    def restore(
        self, plan: Restoration, *, seen_version: int, note: str | None, config: Mapping[str, Any]
    ) -> Event | None:
        """Apply an undo's plan (docs/design.md §7) as one unit of work, like `apply`: lock the
        session row, check that the plan's span is still in the working set as planned and
        that nothing was written since the snapshot at `seen_version` (so that the plan's
        window check is exact), write (`undo.write_restoration`), commit. None, with nothing
        written, when the session moved on: plan again from a new snapshot."""
        with self.transaction() as conn:
            row = self.lock_row(conn)
            if row.version != seen_version or self._check_ranges(conn, [plan.edit])[0] is None:
                return None
            event = undo.write_restoration(conn, self, row, plan, note=note, config=config)
        self._snapshot = None
        self._appended = None
        self._tail = (event.session_version, dict(row.open_calls))
        return event

    def undone_ranges(self) -> frozenset[tuple[int, ...]]:
        """The ranges of the compressions this session's undos took back."""
        return undo.undone_ranges(self)

    def record_event(
        self,
        *,
        strategy: int,
        status: str,
        reason: str,
        replaced_ids: Sequence[int] = (),
        error: str | None = None,
        config: Mapping[str, Any],
        model: str | None = None,
        prompt_tokens: int | None = None,
        completion_tokens: int | None = None,
        latency_ms: float | None = None,
    ) -> Event:
        """Record an attempt that changed nothing (failed, skipped or conflict)."""
        with self.transaction() as conn:
            row = self.lock_row(conn)
            event_id = row.next_event_id
            values = event_row(
                self.session_id,
                event_id,
                strategy=strategy,
                status=status,
                reason=reason,
                messages=(row.message_count, row.message_count),
                tokens=(row.token_count, row.token_count),
                replaced_ids=replaced_ids,
                model=model,
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                latency_ms=latency_ms,
                error=error,
                session_version=row.version,
                config=config,
            )
            created = conn.execute(
                sa.insert(compression_events).values(values).returning(compression_events)
            ).one()
            conn.execute(
                sa.update(sessions).where(self.row_condition()).values(next_event_id=event_id + 1)
            )
        return event_from_row(created)
