"""`autoctx search`: full-text search from the command line, as a memory of a tenant would search.

Without `--session` it searches every session of `--tenant` (without `--tenant`, every session
without a tenant), exactly the scope a memory of that tenant has: another tenant's message is
never a hit, whoever runs the command. With `--session`, that one session, which must belong to
the tenant named (or to no tenant). The command never creates a session and writes nothing.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Annotated, Any, Final

import typer
from rich import box
from rich.table import Table
from rich.text import Text
from sqlalchemy.engine import Engine

from .. import _arguments
from .._search import (
    HIGHLIGHT,
    AutoContextSearchHit,
    validate_limit,
    validate_query,
)
from .._store import search as search_store
from .._store.catalog import Catalog
from .output import (
    _console,
    _engine,
    _fmt_time,
    _print_json,
    _print_whole,
    _shown,
    friendly_errors,
)
from .root import AsJson, DatabaseUrl, Verbose, app

_MARKED: Final = re.compile(re.escape(HIGHLIGHT) + r"(.+?)" + re.escape(HIGHLIGHT))


def run(
    engine: Engine, query: str, *, session: str | None, tenant: str | None, limit: int
) -> list[AutoContextSearchHit]:
    """The hits of `query` in `session`, or in every session of `tenant` (None: the untenanted
    ones); `InvalidSearch`, `InvalidSessionId` or `SessionNotFound` for bad input."""
    text = validate_query(query)
    count = validate_limit(limit)
    store = Catalog(engine, _arguments.tenant(tenant))
    if session is not None:
        return search_store.search_session(store, _arguments.session_id(session), text, count)
    return search_store.search_tenant(store, text, count)


def where(hit: AutoContextSearchHit) -> str:
    """Where the original is now, as the table shows it."""
    if hit.in_working_context:
        return "working"
    if hit.offload_uuid is not None:
        return f"offload {str(hit.offload_uuid)[:8]}"
    return "stored"


def hits_json(hits: Sequence[AutoContextSearchHit]) -> list[dict[str, Any]]:
    return [
        {
            "session_id": h.session_id,
            "message_id": h.message_id,
            "role": h.role,
            "created_at": h.created_at,
            "rank": h.rank,
            "snippet": h.snippet,
            "in_working_context": h.in_working_context,
            "offload_uuid": h.offload_uuid,
        }
        for h in hits
    ]


def _snippet(text: str, shown: Callable[[str], str]) -> Text:
    """The snippet with its marked words in bold (and the markers gone)."""
    out = Text()
    last = 0
    for match in _MARKED.finditer(text):
        out.append(shown(text[last : match.start()]))
        out.append(shown(match.group(1)), style="bold yellow")
        last = match.end()
    out.append(shown(text[last:]))
    return out


def hits_table(
    hits: Sequence[AutoContextSearchHit],
    title: str,
    *,
    shown: Callable[[str], str],
    when: Callable[[datetime], str],
) -> Table:
    """The hits, best first; ids whole (they are what a user copies into `autoctx reload` or
    `autoctx show`), the snippet the one column that wraps."""
    table = Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("session", no_wrap=True, min_width=max(len(h.session_id) for h in hits))
    table.add_column("message", justify="right", no_wrap=True)
    table.add_column("role", no_wrap=True)
    table.add_column("time", no_wrap=True)
    table.add_column("where", no_wrap=True)
    table.add_column("snippet", min_width=20)
    for k, h in enumerate(hits, start=1):
        table.add_row(
            str(k),
            Text(shown(h.session_id)),
            str(h.message_id),
            h.role,
            when(h.created_at),
            where(h),
            _snippet(h.snippet, shown),
        )
    return table


@app.command()
@friendly_errors
def search(
    query: Annotated[
        str, typer.Argument(metavar="QUERY", help="Words, ids or paths (web search syntax).")
    ],
    session: Annotated[
        str | None, typer.Option("--session", "-s", help="Search this session only.")
    ] = None,
    tenant: Annotated[
        str | None,
        typer.Option(help="The tenant whose sessions to search (unset: untenanted sessions)."),
    ] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", help="Best hits to show (1-100).")] = 10,
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
    verbose: Verbose = False,
) -> None:
    """Search the originals of every session of a tenant, or of one session, by words, ids or
    paths; best first, with the matched words marked.

    The scope is that of a memory of the tenant: without --tenant, only sessions without a
    tenant; another tenant's messages are never shown. The query uses web search syntax: words
    (all must match), "a phrase", -excluded, or. Each hit says where the original is now: in
    its session's working context, in an offload (`autoctx reload SESSION UUID`), or only
    stored (after a clear). Searching changes nothing.

    Examples:

    ```
    autoctx search "deploy failed"
    autoctx search /srv/app/main.py --tenant acme --limit 5
    autoctx search req-7f3a --session demo-20261130-101500-1a2b --json
    ```
    """
    found = run(_engine(database_url), query, session=session, tenant=tenant, limit=limit)
    if as_json:
        _print_json(hits_json(found))
        return
    console = _console()
    scope = (
        f"session {session!r}"
        if session is not None
        else (f"tenant {tenant!r}" if tenant is not None else "the sessions without a tenant")
    )
    if not found:
        console.print(Text(f"no hits in {scope}"))
        return
    title = f"{len(found)} hit(s) in {scope}, best first"
    _print_whole(console, hits_table(found, title, shown=_shown, when=_fmt_time))
