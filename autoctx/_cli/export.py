"""`autoctx plot` and `autoctx export`: a session written to a file (a chart, a JSON document)."""

from __future__ import annotations

from collections import Counter
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from .. import _arguments
from .._operations import export_session
from .._store import inspect as inspect_db
from .._store.store import SessionStore
from .output import (
    _engine,
    _json_text,
    _print_json,
    _session,
    friendly_errors,
)
from .root import AsJson, DatabaseUrl, SessionArg, Verbose, app

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
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
    verbose: Verbose = False,
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
    store = SessionStore(engine, session)
    info = _session(store)
    events = store.events()
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
    if as_json:
        _print_json(
            {
                "output": str(path),
                "originals": series.points[-1].step,
                "compressions": {f"S{s}": n for s, n in sorted(by_strategy.items())},
                "peak_tokens": peak,
                "tokens_now": series.points[-1].tokens,
            }
        )
        return
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
    verbose: Verbose = False,
) -> None:
    """Export a session as JSON: everything needed to audit it elsewhere, or to restore it
    with `autoctx import`.

    The document (format `autoctx-export/2`, docs/operations.md) holds the session row
    (totals, config, plan, fork origin), the working context in OpenAI format (and each working
    message's position, id, kind and tokens), every event, every offload with the messages it
    holds, and every stored message and lineage row as stored.

    Examples:

    ```
    autoctx export demo-20261130-101500-1a2b -o session.json
    autoctx export demo-20261130-101500-1a2b | jq '.events | length'
    ```
    """
    _arguments.session_id(session)
    document = export_session(session, database_url)
    if output == "-":
        _print_json(document)
        return
    Path(output).write_text(_json_text(document) + "\n", encoding="utf-8")
    typer.echo(
        f"wrote {output}: {len(document['messages'])} messages "
        f"({len(document['working_messages'])} working), {len(document['events'])} events, "
        f"{len(document['offloads'])} offloads"
    )
