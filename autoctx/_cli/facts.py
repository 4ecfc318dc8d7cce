"""autoctx dropped: what a compression's originals said that the working context does not show
now (docs/design.md §6)."""

from __future__ import annotations

from typing import Annotated

import typer

from .. import _arguments
from .._dropped import dropped_facts
from .._errors import EventNotFound
from .._store.store import SessionStore
from .._store.undo import offloads_of
from .output import _engine, _print_json, _session, _shown, friendly_errors
from .root import AsJson, DatabaseUrl, SessionArg, Verbose, app


@app.command()
@friendly_errors
def dropped(
    session: SessionArg,
    event_id: Annotated[
        int, typer.Argument(metavar="EVENT_ID", help="A compression event id (autoctx history).")
    ],
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
    verbose: Verbose = False,
) -> None:
    """List the facts of the originals a compression replaced that the working context does
    not show now: paths, ids, errors, values and the user's instructions a summary (or a
    preview) left out, and that no later message repeats.

    The same check as the one after every summary (`autoctx history` shows its counts); read
    the originals whole with `autoctx reload SESSION UUID`.

    Examples:

    ```
    autoctx dropped demo-20261130-101500-1a2b 12
    autoctx dropped demo-20261130-101500-1a2b 12 --json
    ```
    """
    checked = _arguments.event_id(event_id)
    store = SessionStore(_engine(database_url), session)
    _session(store)
    event = next((e for e in store.events() if e.id == checked), None)
    offloads = [] if event is None or event.status != "applied" else offloads_of(store, event)
    if event is None or not offloads:
        raise EventNotFound(
            f"session {session!r} has no compression event {checked}; `autoctx history "
            f"{session}` lists them (an event that compressed nothing has no originals)"
        )
    originals = [m for o in offloads for m in store.reload(o, originals=True)]
    facts = dropped_facts(originals, store.load_working())
    if as_json:
        _print_json(
            {
                "event_id": checked,
                "offload_uuid": event.offload_uuid,
                "offload_uuids": offloads,
                "dropped": facts,
            }
        )
        return
    if not facts:
        typer.echo(f"event {checked}: the working context shows every fact of its originals")
        return
    where = (
        f"autoctx reload {session} {event.offload_uuid}"
        if event.offload_uuid is not None
        else f"{len(offloads)} offloads, one per masked output: reload one by the handle its "
        "preview shows"
    )
    typer.echo(
        f"event {checked}: {len(facts)} fact(s) of its originals not in the working context "
        f"({where}):"
    )
    for fact in facts:
        typer.echo(f"  {_shown(fact)}")
