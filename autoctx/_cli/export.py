"""`autoctx plot` and `autoctx export`: a session written to a file (a chart, a JSON document)."""

from __future__ import annotations

from collections import Counter
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from .._messages import (
    to_openai_messages,
)
from .._store import inspect as inspect_db
from .._store.store import Store
from .output import (
    _engine,
    _event_json,
    _json_text,
    _print_json,
    _session,
    _session_json,
    _working_json,
    friendly_errors,
)
from .root import DatabaseUrl, SessionArg, app

# ---------------------------------------------------------------------------------------------
# plot, export
# ---------------------------------------------------------------------------------------------


class Axis(StrEnum):
    step = "step"
    time = "time"


@app.command()
@friendly_errors
def plot(
    session: SessionArg,
    output: Annotated[
        Path, typer.Option("--output", "-o", help="PNG file to write.", dir_okay=False)
    ] = Path("tokens.png"),
    x: Annotated[
        Axis, typer.Option("--x", help="Horizontal axis: originals appended, or wall-clock time.")
    ] = Axis.step,
    database_url: DatabaseUrl = None,
) -> None:
    """Plot the working context's tokens (and messages) over the session's life.

    Rebuilt from the database: every appended original adds its tokens, every compression
    moves the totals from its before to its after figures. Compressions are marked by
    strategy; the dashed line is the trigger (max_tokens x token_ratio), the dotted one the
    target (max_tokens x target_ratio), from the session's own config. Needs matplotlib
    (`pip install 'autoctx-pg[plot]'`; in a checkout, `pip install -e ".[plot]"`).

    Examples:

    ```
    autoctx plot demo-20261130-101500-1a2b -o tokens.png
    autoctx plot demo-20261130-101500-1a2b -o tokens-time.png --x time
    ```
    """
    from .._plot import reconstruct, render

    engine = _engine(database_url)
    store = Store(engine)
    info = _session(store, session)
    events = store.events(session)
    series = reconstruct(inspect_db.message_stamps(engine, session), events)
    path = render(
        series,
        info.config,
        output,
        title=f"autoctx session {session}: working context",
        x="step" if x is Axis.step else "time",
    )
    by_strategy = Counter(m.strategy for m in series.marks if m.status == "applied")
    peak = max(p.tokens for p in series.points)
    typer.echo(
        f"wrote {path}: {series.points[-1].step} originals appended, "
        f"{sum(by_strategy.values())} compressions "
        f"({', '.join(f'S{s} x{n}' for s, n in sorted(by_strategy.items())) or 'none'}), "
        f"peak {peak:,} tokens, now {series.points[-1].tokens:,}"
    )


@app.command()
@friendly_errors
def export(
    session: SessionArg,
    output: Annotated[
        str, typer.Option("--output", "-o", help="JSON file to write; '-' for stdout.")
    ] = "-",
    database_url: DatabaseUrl = None,
) -> None:
    """Export a session as JSON, everything needed to audit it elsewhere.

    The document holds the session row (totals, config, plan), the working context in OpenAI
    format (and each working message's id, kind and tokens), every compression event, and every
    offload with the messages it holds.

    Examples:

    ```
    autoctx export demo-20261130-101500-1a2b -o session.json
    autoctx export demo-20261130-101500-1a2b | jq '.events | length'
    ```
    """
    engine = _engine(database_url)
    store = Store(engine)
    info = _session(store, session)
    working = store.load_working(session)
    offloads = inspect_db.offload_rows(engine, session)
    held = store.load_messages(session, {i for o in offloads for i in o.message_ids})
    document = {
        "format": "autoctx-export/1",
        "session": _session_json(info, full=True),
        "working_context": to_openai_messages(working),
        "working_messages": [_working_json(k, m) for k, m in enumerate(working)],
        "events": [_event_json(e) for e in store.events(session)],
        "offloads": [
            {
                "uuid": o.uuid,
                "event_id": o.event_id,
                "strategy": o.strategy,
                "created_at": o.created_at,
                "message_ids": list(o.message_ids),
                "messages": [
                    {"id": i, "kind": held[i].kind, "message": held[i].to_openai()}
                    for i in o.message_ids
                ],
            }
            for o in offloads
        ],
    }
    if output == "-":
        _print_json(document)
        return
    Path(output).write_text(_json_text(document) + "\n", encoding="utf-8")
    typer.echo(
        f"wrote {output}: {len(working)} working messages, {len(document['events'])} events, "
        f"{len(offloads)} offloads"
    )
