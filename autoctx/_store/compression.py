"""The compression's writes of one session's store: a strategy's replacements applied in one
transaction (each with its offload and lineage; one event per range, one for a whole masking
pass), an undo's restoration, an attempt that
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
from .._replacements import ApplyOutcome, Replacement, event_groups, next_handle_after
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
        """Apply a strategy's replacements in one transaction, each with its offload and
        lineage, and their events (`event_groups`: one per range, one for a masking pass). If
        any replaced range is no longer in the working set as planned, nothing is applied and
        `conflict` events name the changed ranges, grouped the same way. So it is when an erasure
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
                applied, new_ids = self._write(conn, row, replacements, positions, reason, config)
        if not conflicts:
            self._splice(row, replacements, new_ids, len(applied))
            # A compression changes no open call: the tail is known at the new version.
            self._tail = (applied[-1].session_version, dict(row.open_calls))
            return ApplyOutcome(applied, False)
        # Grouped as the events the batch would have written: one for a masking pass.
        events = [
            self.record_event(
                strategy=conflicts[group[0]][0].edit.strategy,
                status="conflict",
                reason=reason,
                replaced_ids=[i for k in group for i in conflicts[k][0].edit.replaced_ids],
                error=conflicts[group[0]][1],
                config=config,
            )
            for group in event_groups([r for r, _ in conflicts])
        ]
        return ApplyOutcome(events, True)

    def _splice(
        self,
        row: Row[Any],
        replacements: Sequence[Replacement],
        new_ids: Sequence[int],
        events: int,
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
        for r, msg_id in zip(replacements, new_ids, strict=True):
            changes.append(
                (r.edit, meta_of(r.new.msg, id=msg_id, final=r.new.final, tokens=r.new.tokens))
            )
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
            snapshot, tuple(positions), row.next_event_id + events, cached.incarnation
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
    ) -> tuple[list[Event], list[int]]:
        """Write the batch: its events (one per `event_groups` group), and for each
        replacement its message, offload, lineage and working-set row. Returns the events and
        the id of each replacement's new message."""
        next_msg, next_event = row.next_message_id, row.next_event_id
        count, tokens = row.message_count, row.token_count
        version = row.version + 1
        msg_rows: list[dict[str, Any]] = []
        event_rows: list[dict[str, Any]] = []
        offload_rows: list[dict[str, Any]] = []
        lineage_rows: list[dict[str, Any]] = []
        working_rows: list[dict[str, Any]] = []
        removed_ids: list[int] = []
        new_ids: list[int] = []
        for group in event_groups(replacements):
            event_id = next_event
            next_event += 1
            before_count, before_tokens = count, tokens
            replaced: list[int] = []
            for k in group:
                r, position = replacements[k], positions[k]
                assert position is not None
                msg_id = next_msg
                next_msg += 1
                new_ids.append(msg_id)
                count += 1 - len(r.edit.replaced_ids)
                tokens += r.new.tokens - r.edit.replaced_tokens
                replaced.extend(r.edit.replaced_ids)
                msg_rows.append(message_row(self.session_id, msg_id, r.new, event_id))
                offload_rows.append(
                    {
                        "session_id": self.session_id,
                        "uuid": r.offload_uuid,
                        "handle": r.handle,
                        "event_id": event_id,
                        "message_ids": list(r.edit.replaced_ids),
                    }
                )
                lineage_rows.extend(
                    {
                        "session_id": self.session_id,
                        "summary_id": msg_id,
                        "ordinal": n,
                        "replaced_id": rid,
                        "event_id": event_id,
                    }
                    for n, rid in enumerate(r.edit.replaced_ids)
                )
                removed_ids.extend(r.edit.replaced_ids)
                working_rows.append(
                    {"session_id": self.session_id, "position": position, "message_id": msg_id}
                )
            # An event of one range names its summary message and its offload; an event of a
            # masking pass names neither: its offloads and lineage rows carry its id.
            single = replacements[group[0]] if len(group) == 1 else None
            event_rows.append(
                event_row(
                    self.session_id,
                    event_id,
                    strategy=replacements[group[0]].edit.strategy,
                    status="applied",
                    reason=reason,
                    messages=(before_count, count),
                    tokens=(before_tokens, tokens),
                    replaced_ids=replaced,
                    replaced_tokens=sum(replacements[k].edit.replaced_tokens for k in group),
                    summary_message_id=new_ids[-1] if single else None,
                    offload_uuid=single.offload_uuid if single else None,
                    model=single.model if single else None,
                    prompt_tokens=single.prompt_tokens if single else None,
                    completion_tokens=single.completion_tokens if single else None,
                    latency_ms=single.latency_ms if single else None,
                    session_version=version,
                    config=config,
                    facts=single.facts if single else None,
                )
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
        return [event_of(e) for e in event_rows], new_ids

    def restore(
        self, plan: Restoration, *, seen_version: int, note: str | None, config: Mapping[str, Any]
    ) -> Event | None:
        """Apply an undo's plan (docs/design.md §7) as one unit of work, like `apply`: lock the
        session row, check that the plan's spans are still in the working set as planned and
        that nothing was written since the snapshot at `seen_version` (so that the plan's
        window check is exact), write (`undo.write_restoration`), commit. None, with nothing
        written, when the session moved on: plan again from a new snapshot."""
        with self.transaction() as conn:
            row = self.lock_row(conn)
            edits = [span.edit for span in plan.spans]
            if row.version != seen_version or None in self._check_ranges(conn, edits):
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
