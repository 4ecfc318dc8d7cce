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
from typing import Any, Final

from rich import box
from rich.table import Table
from rich.text import Text
from sqlalchemy.engine import Engine

from .memory import validate_session_id, validate_tenant
from .search import (
    HIGHLIGHT,
    AutoContextSearchHit,
    validate_limit,
    validate_query,
)
from .store import search as search_store
from .store.store import Store

_MARKED: Final = re.compile(re.escape(HIGHLIGHT) + r"(.+?)" + re.escape(HIGHLIGHT))


def run(
    engine: Engine, query: str, *, session: str | None, tenant: str | None, limit: int
) -> list[AutoContextSearchHit]:
    """The hits of `query` in `session`, or in every session of `tenant` (None: the untenanted
    ones); `InvalidSearch`, `InvalidSessionId` or `SessionNotFound` for bad input."""
    text = validate_query(query)
    count = validate_limit(limit)
    store = Store(engine, validate_tenant(tenant))
    if session is not None:
        return search_store.search_session(store, validate_session_id(session), text, count)
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
