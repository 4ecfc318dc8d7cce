"""The undo call (`mem.undo`, `autoctx undo`; docs/design.md §7): read, plan, apply.

What the store reads (`autoctx._store.undo`), the pure plan (`autoctx._undo`) and the store's
unit of work (`SessionStore.restore`) are put together here, with the refusals that need what
only the database knows: an unknown event, a replacement that is no longer in the working
context (and which event holds it now), originals that were erased. Every refusal is an
`UndoRefused` (or `EventNotFound`) that names the session and the event and says what to do,
quotes no content, and writes nothing.
"""

from __future__ import annotations

from typing import Final

from ._config import AutoContextConfig
from ._errors import EventNotFound, UndoRefused
from ._events import Event
from ._store import undo as sql
from ._store.store import SessionStore
from ._strategies.registry import FOLD, event_label
from ._undo import not_undoable, plan_restoration

#: How many times an undo plans again when the session moved on between its snapshot and its
#: commit (an agent appending beside it); then it says so.
_ATTEMPTS: Final = 5


def undo(store: SessionStore, event_id: int, *, config: AutoContextConfig, force: bool) -> Event:
    """Take back the compression `event_id` of the store's session (see the module docstring);
    returns the undo's event."""
    sid = store.session_id
    event = sql.find_event(store, event_id)
    if event is None:
        raise EventNotFound(
            f"session {sid!r} has no event {event_id}: `autoctx history {sid}` (or "
            "`mem.events()`) lists its events; a fork has the events that made its working "
            "context, not its parent's later ones"
        )
    refused = not_undoable(sid, event)
    if refused is not None:
        raise refused
    written = [(w.summary_id, w.replaced_ids) for w in sql.written_by(store, event.id)]
    for _ in range(_ATTEMPTS):
        # The snapshot first: an erasure that commits after it moves the version on, and the
        # apply then refuses the plan, which is made again with what the erasure left.
        snapshot = store.snapshot()
        back = sql.restored(store, event.replaced_ids, order_keys=event.strategy == FOLD)
        if back.erased:
            first = min(back.erased)
            raise UndoRefused(
                "erased",
                f"event {event.id} of session {sid!r} cannot be undone: message {first} (one of "
                f"the {len(event.replaced_ids)} it replaced) was erased by event "
                f"{back.erased[first]}; what the erasure left is all there is, and the "
                "replacement stays",
            )
        plan = plan_restoration(
            snapshot,
            event,
            written,
            back.metas,
            back.order_keys,
            max_tokens=config.max_tokens,
            force=force,
        )
        if isinstance(plan, int):
            raise _moved(store, event, plan)
        note = (
            f"forced: {plan.tokens_after} working tokens, window {config.max_tokens}"
            if plan.forced
            else None
        )
        done = store.restore(
            plan, seen_version=snapshot.version, note=note, config=config.to_json()
        )
        if done is not None:
            return done
    raise UndoRefused(
        "busy",
        f"session {sid!r} changed {_ATTEMPTS} times while event {event.id} was being undone "
        "(another writer is appending or compressing): nothing was changed; try again",
    )


def _moved(store: SessionStore, event: Event, summary: int) -> UndoRefused:
    """The refusal for a replacement (`summary`) of `event` no longer in the working context,
    naming where it went."""
    sid = store.session_id
    where = sql.whereabouts(store, summary)
    head = (
        f"event {event.id} of session {sid!r} cannot be undone: its replacement (message "
        f"{summary}) is no longer in the working context"
    )
    removed = where.removed_by
    if removed is not None and removed.reason == "undo":
        return UndoRefused("moved", f"{head}: event {removed.id} already undid it")
    if where.chain:
        holder, made_by = where.chain[-1]
        events = [e for _, e in reversed(where.chain) if e is not None]
        order = ", then ".join(f"event {e}" for e in events)
        took = (
            "a later compression"
            if removed is None
            else f"event {removed.id} ({event_label(removed.strategy, removed.reason)})"
        )
        return UndoRefused(
            "moved",
            f"{head}: {took} took it in, "
            f"and message {holder}, made by event {made_by}, holds it now; undo {order} "
            f"first, then event {event.id}",
        )
    if removed is not None:
        return UndoRefused(
            "moved",
            f"{head}: event {removed.id} ({event_label(removed.strategy, removed.reason)}) "
            "took it out and nothing in the working context holds it now; its originals stay "
            f"reloadable (`autoctx lineage {sid} {summary}` names them)",
        )
    return UndoRefused("moved", f"{head}; nothing in the working context holds it now")
