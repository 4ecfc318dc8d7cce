"""The console's pages (`autoctx._ui.server` serves them over HTTP and keeps the access rule).

Why this stack: the store is synchronous and the console is a local, read-only page for one
operator, so a thread per request over the store's connection pool is all it needs; the
standard library's `ThreadingHTTPServer` serves it with no framework, and Jinja2 (one small,
well-kept dependency with MarkupSafe) renders the templates with autoescaping on, so every piece
of agent text reaches the browser as text. No script, no font, no stylesheet from elsewhere:
the pages work with no network.

Every read goes through `autoctx._store.console` (tenant-scoped, READ ONLY transactions) or the
library's search. A URL is checked before any read: each page takes the parameters it names and
no other, and a session id, a number or a text that PostgreSQL could not take is a 400 with a
plain message, never a database error.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any, Final, NamedTuple
from urllib.parse import parse_qs, quote, unquote, urlsplit

from sqlalchemy.engine import Engine

from .._arguments import offload_id as parse_offload_id
from .._arguments import session_id as valid_session_id
from .._arguments import unstorable
from .._errors import (
    AutoContextError,
    InvalidOffloadId,
    InvalidSearch,
    InvalidSessionId,
    MessageNotFound,
    OffloadNotFound,
    SessionNotFound,
)
from .._messages import Msg, TextBlock, ToolResultBlock, ToolUseBlock, json_text
from .._search import HIGHLIGHT, validate_limit, validate_query
from .._store import console as db
from .._store import search as search_store
from .._store.catalog import Catalog
from .._strategies import registry
from . import lists, timeline

try:
    import jinja2
except ImportError:  # pragma: no cover - exercised only without the extra
    jinja2 = None  # type: ignore[assignment]

__all__ = ["Console", "ConsoleRequestError", "Page"]

#: Rows per page of each list.
SESSIONS_PAGE: Final = 50
EVENTS_PAGE: Final = 100
WORKING_PAGE: Final = 100
CHILDREN_PAGE: Final = 100
#: Messages per page of an offload (shown whole: they may be large tool outputs).
OFFLOAD_PAGE: Final = 20
SEARCH_LIMIT: Final = 50

_TEMPLATES: Final = Path(__file__).parent / "templates"
#: The largest id or position a URL may name (PostgreSQL's bigint).
_LARGEST: Final = 2**63 - 1


class ConsoleRequestError(AutoContextError, ValueError):
    """A console URL with a parameter the console cannot read (names the parameter and what
    it takes)."""


class Part(NamedTuple):
    """One block of a message, as the page shows it: a label and its text exactly as stored.
    (A tuple: a frozen dataclass sets each field through `object.__setattr__`, several times
    the cost, on every block of an offload's page, issue 33.)"""

    label: str
    text: str


def parts(msg: Msg) -> list[Part]:
    """The message's blocks in order, each one's text as stored (no wrapping, no tag removed)."""
    out: list[Part] = []
    for b in msg.content:
        if isinstance(b, TextBlock):
            out.append(Part("text", b.text))
        elif isinstance(b, ToolUseBlock):
            out.append(Part(f"tool call {b.name} id={b.id}", b.arguments))
        elif isinstance(b, ToolResultBlock):
            out.append(Part(f"tool result {b.name or '?'} id={b.tool_use_id}", b.output_text))
        else:
            out.append(Part(f"{b.type} block", json_text(b.data)))
    return out


def _int(query: Mapping[str, list[str]], name: str, *, minimum: int = 0) -> int | None:
    values = query.get(name)
    if not values or values[0] == "":
        return None
    try:
        value = int(values[0])
    except ValueError:
        raise ConsoleRequestError(
            f"the URL parameter {name!r} takes a whole number; remove it or give one"
        ) from None
    if not minimum <= value <= _LARGEST:
        raise ConsoleRequestError(
            f"the URL parameter {name!r} takes a number from {minimum} to {_LARGEST}"
        )
    return value


def _query(text: str, takes: tuple[str, ...]) -> dict[str, list[str]]:
    """The URL's parameters, each one the page takes, given once, as text PostgreSQL can hold;
    `ConsoleRequestError` naming the parameter otherwise."""
    query = parse_qs(text, keep_blank_values=True)
    for name, values in query.items():
        if name not in takes:
            allowed = ", ".join(takes) if takes else "none"
            raise ConsoleRequestError(
                f"this page takes no URL parameter {name[:40]!r} (it takes: {allowed}); remove it"
            )
        if len(values) > 1:
            raise ConsoleRequestError(f"the URL parameter {name!r} is given twice; give it once")
        if (problem := unstorable(values[0])) is not None:
            raise ConsoleRequestError(f"the URL parameter {name!r} {problem}")
    return query


def _session_id(text: str) -> str:
    try:
        return valid_session_id(text)
    except InvalidSessionId as exc:
        raise ConsoleRequestError(f"the URL's {exc}") from None


def _text(query: Mapping[str, list[str]], name: str) -> str | None:
    values = query.get(name)
    return values[0] if values and values[0] != "" else None


@dataclass(frozen=True, slots=True)
class Page:
    status: int
    body: bytes
    content_type: str = "text/html; charset=utf-8"


class Console:
    """The pages of one console: a read-only catalog of one tenant scope, and the templates."""

    def __init__(self, engine: Engine, tenant: str | None) -> None:
        if jinja2 is None:
            raise AutoContextError(
                "autoctx ui needs Jinja2, which the `ui` extra installs: "
                "pip install 'autoctx-pg[ui]'"
            )
        #: The pages' reads: connections of the console's own, pinned to READ ONLY and the
        #: tenant (`db.PageScope`); the searches go through the library's search, in READ ONLY
        #: transactions on the engine's pool.
        self.store = db.PageScope(engine, tenant)
        self.searches = Catalog(db.read_only(engine), tenant)
        self.tenant = tenant
        self.env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(_TEMPLATES),
            autoescape=True,
            # The templates ship with the package: no stat of each file on every page.
            auto_reload=False,
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.env.filters["q"] = lists.q
        self.env.filters["when"] = lists.when
        self.env.filters["num"] = lists.num
        self.env.globals.update(
            strategy_names=registry.STRATEGY_NAMES,
            strategy_colors=registry.STRATEGY_COLORS,
            event_kind=registry.event_kind,
            tenant=tenant,
        )
        #: Each page: its path, its view, and the URL parameters it takes (no other).
        self.routes: list[tuple[re.Pattern[str], Callable[..., Page], tuple[str, ...]]] = [
            (re.compile(r"/"), self.sessions, ("sort", "after", "before")),
            (re.compile(r"/search"), self.search, ("q", "session")),
            (re.compile(r"/s/([^/]+)"), self.session, ()),
            (re.compile(r"/s/([^/]+)/events"), self.events, ("after", "before")),
            (re.compile(r"/s/([^/]+)/working"), self.working, ("after", "before")),
            (re.compile(r"/s/([^/]+)/m/(\d+)"), self.message, ("after",)),
            (re.compile(r"/s/([^/]+)/o/([^/]+)"), self.offload, ("view", "after", "page")),
        ]

    def close(self) -> None:
        """Close the pages' connections (the engine's pool is its owner's)."""
        self.store.close()

    # -- dispatch -----------------------------------------------------------------------------

    def handle(self, target: str) -> Page:
        parts_ = urlsplit(target)
        for pattern, view, takes in self.routes:
            match = pattern.fullmatch(parts_.path)
            if match:
                try:
                    query = _query(parts_.query, takes)
                    args = [unquote(g) for g in match.groups()]
                    if args:
                        args[0] = _session_id(args[0])
                    return view(query, *args)
                except (SessionNotFound, MessageNotFound, OffloadNotFound) as exc:
                    return self.error_page(HTTPStatus.NOT_FOUND, str(exc))
                except (
                    ConsoleRequestError,
                    InvalidSearch,
                    InvalidSessionId,
                    InvalidOffloadId,
                ) as exc:
                    return self.error_page(HTTPStatus.BAD_REQUEST, str(exc))
        return self.error_page(HTTPStatus.NOT_FOUND, "no console page at that address")

    def _render(self, name: str, **values: Any) -> Page:
        html = self.env.get_template(name).render(**values)
        return Page(HTTPStatus.OK, html.encode())

    def error_page(self, status: HTTPStatus, text: str) -> Page:
        html = self.env.get_template("error.html").render(status=status, text=text)
        return Page(status, html.encode())

    # -- pages --------------------------------------------------------------------------------

    def sessions(self, query: Mapping[str, list[str]]) -> Page:
        sorts: dict[str, db.SessionSort] = {s: s for s in db.SESSION_SORTS}
        sort = sorts.get(_text(query, "sort") or "window")
        if sort is None:
            raise ConsoleRequestError(
                f"the URL parameter 'sort' takes one of {', '.join(db.SESSION_SORTS)}"
            )
        after, before = _text(query, "after"), _text(query, "before")
        if after is not None and before is not None:
            raise ConsoleRequestError("give the URL parameter 'after' or 'before', not both")
        for cursor in (after, before):
            if cursor is not None:
                _session_id(cursor)
        rows, total = db.read(
            self.store,
            *db.sessions_page(
                self.store, sort, after=after, before=before, limit=SESSIONS_PAGE + 1
            ),
        )
        if before is not None:
            has_prev, has_next = len(rows) > SESSIONS_PAGE, True
            rows = rows[-SESSIONS_PAGE:]
        else:
            has_prev, has_next = after is not None, len(rows) > SESSIONS_PAGE
            rows = rows[:SESSIONS_PAGE]
        return self._render(
            "sessions.html",
            rows=rows,
            rows_html=lists.session_rows(rows),
            total=total,
            sort=sort,
            sorts=db.SESSION_SORTS,
            prev_key=rows[0].session_id if rows and has_prev else None,
            next_key=rows[-1].session_id if rows and has_next else None,
        )

    def _header(self, session_id: str) -> db.Read[db.SessionRow]:
        return db.session_row(self.store, session_id)

    def session(self, query: Mapping[str, list[str]], session_id: str) -> Page:
        info, points, growth = db.read(
            self.store,
            self._header(session_id),
            *db.timeline(self.store, session_id, buckets=timeline.BUCKETS),
        )
        window = info.max_tokens
        trigger = target = None
        if window:
            trigger = round(window * float(info.config.get("token_ratio", 0) or 0)) or None
            target = round(window * float(info.config.get("target_ratio", 0) or 0)) or None
        base = f"/s/{quote(session_id, safe='')}"
        svg = timeline.render(
            points,
            growth,
            tokens_now=info.token_count,
            version_now=info.version,
            limits=timeline.Limits(window, trigger, target),
            event_href=base + "/events?after={after}#e{id}",
        )
        applied = sum(1 for p in points if p.status == "applied")
        return self._render(
            "session.html",
            info=info,
            svg=svg,
            legend=timeline.legend(points),
            applied=applied,
            limits=(window, trigger, target),
            event_count=len(points),
        )

    def events(self, query: Mapping[str, list[str]], session_id: str) -> Page:
        after, before = _int(query, "after"), _int(query, "before")
        info, rows = db.read(
            self.store,
            self._header(session_id),
            db.events_page(
                self.store, session_id, after=after, before=before, limit=EVENTS_PAGE + 1
            ),
        )
        if before is not None:
            has_prev, has_next = len(rows) > EVENTS_PAGE, True
            rows = rows[-EVENTS_PAGE:]
        else:
            has_prev, has_next = bool(after), len(rows) > EVENTS_PAGE
            rows = rows[:EVENTS_PAGE]
        return self._render(
            "events.html",
            info=info,
            rows=rows,
            rows_html=lists.event_rows(
                rows, session_id, colors=registry.STRATEGY_COLORS, kind=registry.event_kind
            ),
            prev_key=rows[0].id if rows and has_prev else None,
            next_key=rows[-1].id if rows and has_next else None,
        )

    def working(self, query: Mapping[str, list[str]], session_id: str) -> Page:
        after, before = _int(query, "after"), _int(query, "before")
        info, rows, index = db.read(
            self.store,
            self._header(session_id),
            *db.working_page(
                self.store, session_id, after=after, before=before, limit=WORKING_PAGE + 1
            ),
        )
        if before is not None:
            # The count is of the messages before the key: the page's rows are among them.
            index -= len(rows)
            has_next = True
            if len(rows) > WORKING_PAGE:
                rows = rows[-WORKING_PAGE:]
                index += 1
        else:
            has_next = len(rows) > WORKING_PAGE
            rows = rows[:WORKING_PAGE]
        return self._render(
            "working.html",
            info=info,
            rows=rows,
            rows_html=lists.message_rows(rows, session_id, numbered=True, index=index),
            index=index,
            prev_key=rows[0][0] if rows and index > 0 else None,
            next_key=rows[-1][0] if rows and has_next else None,
        )

    def message(self, query: Mapping[str, list[str]], session_id: str, message_id: str) -> Page:
        mid = int(message_id)
        if mid > _LARGEST:
            raise ConsoleRequestError(f"no message id is larger than {_LARGEST}")
        # Lineage ordinals start at 0: the first page is everything after -1.
        after = _int(query, "after", minimum=-1)
        after = -1 if after is None else after
        info, detail, children, chain, made_by = db.read(
            self.store,
            self._header(session_id),
            db.message(self.store, session_id, mid),
            db.lineage_children(self.store, session_id, mid, after=after, limit=CHILDREN_PAGE + 1),
            db.covering_chain(self.store, session_id, mid),
            db.made_by(self.store, session_id, mid),
        )
        more = len(children) > CHILDREN_PAGE
        children = children[:CHILDREN_PAGE]
        return self._render(
            "message.html",
            info=info,
            detail=detail,
            msg=detail.msg,
            parts_html=lists.parts_html(parts(detail.msg)),
            stored_json=json.dumps(detail.msg.stored_json(), ensure_ascii=False, indent=2),
            children=children,
            children_html=lists.message_rows(children, session_id, numbered=False),
            after=after,
            next_key=children[-1][0] if children and more else None,
            chain=chain,
            chain_html=lists.chain_html(chain, session_id),
            made_by=made_by,
        )

    def offload(self, query: Mapping[str, list[str]], session_id: str, text: str) -> Page:
        try:
            offload_id = parse_offload_id(text)
        except InvalidOffloadId:
            raise ConsoleRequestError(
                "an offload page takes the offload's handle (the number in its tag) or its "
                "full uuid, as the events page links it"
            ) from None
        view = _text(query, "view") or "removed"
        if view not in ("removed", "originals"):
            raise ConsoleRequestError("the URL parameter 'view' takes removed or originals")
        if view == "originals":
            # Every original behind it, down through nested summaries, keyset-paged by id.
            after = _int(query, "after") or 0
            info, found, msgs = db.read(
                self.store,
                self._header(session_id),
                db.offload_info(self.store, session_id, offload_id),
                db.offload_originals(
                    self.store, session_id, offload_id, after=after, limit=OFFLOAD_PAGE + 1
                ),
            )
            more = len(msgs) > OFFLOAD_PAGE
            msgs = msgs[:OFFLOAD_PAGE]
            return self._render(
                "offload.html",
                info=info,
                offload=found,
                view=view,
                msgs=msgs,
                msgs_html=lists.message_blocks(
                    [(None, m, lists.parts_html(parts(m))) for m in msgs], session_id
                ),
                page=0,
                pages=0,
                after=after,
                next_after=msgs[-1].id if msgs and more else None,
                more=more,
            )
        page = _int(query, "page") or 0
        # An array holds fewer than 2**31 elements: a page past that is empty, as any page past
        # the end is (and the statement's int4 subscript never overflows).
        start = min(page * OFFLOAD_PAGE, 2**31 - 1 - OFFLOAD_PAGE)
        info, found, msgs = db.read(
            self.store,
            self._header(session_id),
            db.offload_info(self.store, session_id, offload_id),
            db.offload_messages(
                self.store, session_id, offload_id, start=start, limit=OFFLOAD_PAGE
            ),
        )
        return self._render(
            "offload.html",
            info=info,
            offload=found,
            view=view,
            msgs=msgs,
            msgs_html=lists.message_blocks(
                [(start + k, m, lists.parts_html(parts(m))) for k, m in enumerate(msgs)],
                session_id,
            ),
            page=page,
            pages=max(1, -(-len(found.message_ids) // OFFLOAD_PAGE)),
            after=0,
            next_after=None,
            more=start + OFFLOAD_PAGE < len(found.message_ids),
        )

    def search(self, query: Mapping[str, list[str]]) -> Page:
        text = _text(query, "q")
        session_id = _text(query, "session")
        if session_id is not None:
            session_id = _session_id(session_id)
        hits: list[Any] = []
        if text is not None:
            words = validate_query(text)
            limit = validate_limit(SEARCH_LIMIT)
            if session_id is not None:
                db.read(self.store, self._header(session_id))
                hits = search_store.search_session(self.searches, session_id, words, limit)
            else:
                hits = search_store.search_tenant(self.searches, words, limit)
        return self._render(
            "search.html",
            q=text or "",
            session=session_id or "",
            hits=[(h, _marked(h.snippet)) for h in hits],
            searched=text is not None,
        )


_MARK: Final = re.compile(re.escape(HIGHLIGHT) + r"(.+?)" + re.escape(HIGHLIGHT))


def _marked(snippet: str) -> list[tuple[str, bool]]:
    """The snippet cut into (text, highlighted) pieces; the template escapes each one."""
    out: list[tuple[str, bool]] = []
    last = 0
    for match in _MARK.finditer(snippet):
        out.append((snippet[last : match.start()], False))
        out.append((match.group(1), True))
        last = match.end()
    out.append((snippet[last:], False))
    return out
