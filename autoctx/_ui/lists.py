"""The console's long lists (the rows of a table, the blocks of messages), as HTML built in
Python.

The working context's 100 rows through Jinja took 0.85 ms (a call, a filter and an escape
per cell, a loop object per row) of a page whose SQL takes about 1 ms, too much for a page to
stay within 1.5x of its SQL (issue 33); built here, the same markup takes 0.16 ms. Every piece
of stored or agent text is escaped with the five entities of `markupsafe.escape`, as the
templates' autoescape does (`_text`, the same bytes without a `Markup` object per cell);
numbers are formatted, never escaped text; each function returns `Markup`, which the template
inserts as is. The templates keep the page around the lists.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Final, Protocol
from urllib.parse import quote

import markupsafe
from markupsafe import Markup

from .._messages import Msg
from .._store.console import PREVIEW_CHARS, EventRow, MessageRow, SessionRow
from .._strategies.registry import MASKING

__all__ = [
    "Part",
    "event_rows",
    "message_blocks",
    "message_rows",
    "num",
    "parts_html",
    "q",
    "session_rows",
    "when",
]


class Part(Protocol):
    """One block of a message as the page shows it (`autoctx._ui.app.Part`)."""

    @property
    def label(self) -> str: ...

    @property
    def text(self) -> str: ...


#: What `quote(value, safe="")` leaves as it is: a text made of these alone (a session id, a
#: sort) is its own path segment or query value, with no call to `quote` (every page links
#: its session five times and more, issue 33).
_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-~")


def q(value: object) -> str:
    """A path segment or query value: every reserved character percent-encoded."""
    text = value if isinstance(value, str) else str(value)
    return text if _UNRESERVED.issuperset(text) else quote(text, safe="")


def num(value: int | None) -> str:
    return f"{value:,}" if value is not None else ""


def when(value: datetime | None) -> str:
    """`value` in the machine's time zone, to the second ("2026-12-07 23:13:04")."""
    if value is None:
        return ""
    try:
        # The local wall clock of the same second, naive, is what `value.astimezone()` shows
        # (both ask the C library's localtime), and its ISO form is what strftime writes:
        # 2.2 us against 2.8 for astimezone and strftime (a session list formats 50, issue 33).
        # Whole seconds make the float timestamp exact in any year.
        local = datetime.fromtimestamp(value.replace(microsecond=0).timestamp())
    except (OverflowError, ValueError, OSError):
        local = value.astimezone()
    # strftime's %Y does not pad a year before 1000 to four digits, ISO does.
    if local.year >= 1000:
        return local.isoformat(" ")[:19]
    return local.strftime("%Y-%m-%d %H:%M:%S")


def _replaced(value: str) -> str:
    """`value` escaped with the five entities of `markupsafe.escape`, in Python."""
    return (
        value.replace("&", "&amp;")
        .replace(">", "&gt;")
        .replace("<", "&lt;")
        .replace("'", "&#39;")
        .replace('"', "&#34;")
    )


#: `value` escaped exactly as `markupsafe.escape` does, as a plain string: without the `Markup`
#: object `escape` makes of every cell (a third of a list's time, issue 33). MarkupSafe 3's
#: `escape` is `Markup(_escape_inner(s))`, in C where its speedups are built: the same function,
#: so the same bytes, in a quarter of the time of five `replace` calls (4 us against 17 us for
#: the working page's 100 previews, issue 33). Without it (MarkupSafe 2), the same five
#: entities in Python.
_text: Callable[[str], str] = getattr(markupsafe, "_escape_inner", None) or _replaced


@functools.lru_cache(maxsize=64)
def _word(value: str) -> str:
    """A role or a kind, escaped (a handful of values, escaped once each)."""
    return _text(value)


@functools.lru_cache(maxsize=64)
def _kind_cell(kind: str) -> str:
    """A message's kind as its cell: an original plain, any other (a summary, a preview)
    marked."""
    return f'<td class="{"" if kind == "original" else "kind"}">{_text(kind)}</td>'


_CLIPPED: Final = '<span class="muted"> …</span>'


def message_rows(
    rows: Sequence[MessageRow], session_id: str, *, numbered: bool, index: int = 0
) -> Markup:
    """The rows of a message list (the working context, what a summary replaced): number,
    id (a link to the message), role, kind, tokens and the start of its text (with an
    ellipsis when the text is longer)."""
    base = f"/s/{q(session_id)}/m/"
    out: list[str] = []
    add = out.append
    n = ""
    for k, (_key, mid, role, kind, pinned, tokens, _event, preview, chars) in enumerate(rows):
        if numbered:
            n = f'<td class="n">{index + k}</td>\n  '
        shown = len(preview)
        more = _CLIPPED if shown >= PREVIEW_CHARS or chars > shown else ""
        add(
            f"<tr>\n  {n}"
            f'<td class="id"><a href="{base}{mid}">#{mid}</a></td>\n'
            f"  <td>{_word(role)}{'*' if pinned else ''}</td>\n"
            f"  {_kind_cell(kind)}\n"
            f'  <td class="n">{tokens:,}</td>\n'
            f'  <td class="preview">{_text(preview)}{more}</td>\n</tr>\n'
        )
    return Markup("".join(out))


def chain_html(chain: Sequence[int], session_id: str) -> Markup:
    """The summaries above a message, nearest first, each a link, joined by arrows (a chain
    of folds is tens long)."""
    base = f"/s/{q(session_id)}/m/"
    return Markup(" → ".join(f'<a href="{base}{c}">#{c}</a>' for c in chain))


def session_rows(rows: Iterable[SessionRow]) -> Markup:
    """The rows of the session list."""
    out: list[str] = []
    add = out.append
    for r in rows:
        fill = f"{r.fill * 100:.0f}%" if r.fill is not None else ""
        failed = "failed" if r.failures else ""
        window = f"{r.max_tokens:,}" if r.max_tokens is not None else ""
        add(
            "<tr>\n"
            f'  <td class="id"><a href="/s/{q(r.session_id)}">{_text(r.session_id)}</a>'
            "</td>\n"
            f'  <td class="n">{r.message_count:,}</td>\n'
            f'  <td class="n">{r.token_count:,}</td>\n'
            f'  <td class="n">{window}</td>\n'
            f'  <td class="n">{fill}</td>\n'
            f'  <td class="n">{r.cost:,}</td>\n'
            f'  <td class="n">{r.events:,}</td>\n'
            f'  <td class="n {failed}">{r.failures:,}</td>\n'
            f"  <td>{_text(r.model)}</td>\n"
            f"  <td>{when(r.updated_at)}</td>\n"
            "</tr>\n"
        )
    return Markup("".join(out))


def _facts(e: EventRow) -> str:
    f = e.facts
    if f is None:
        return ""
    title = _text(
        f"of {f.found} facts found in what it replaced: {f.kept} kept by the summary, "
        f"{f.repaired} by the repair, {f.listed} on the index line, {f.dropped} dropped"
    )
    out = f'<span title="{title}">{f.found - f.dropped}/{f.found}</span>'
    if f.dropped_facts:
        items = "".join(f"<li><code>{_text(fact)}</code></li>" for fact in f.dropped_facts)
        out += (
            f'<details class="dropped"><summary>{f.dropped} dropped</summary>'
            f"<ul>{items}</ul></details>"
        )
    return out


def event_rows(
    rows: Iterable[EventRow],
    session_id: str,
    *,
    colors: Mapping[int, str],
    kind: Callable[[int, str], str],
) -> Markup:
    """The rows of the events table."""
    base = f"/s/{q(session_id)}"
    out: list[str] = []
    add = out.append
    for e in rows:
        status = (
            f'<span class="{"failed" if e.status == "failed" else ""}">{_text(e.status)}</span>'
        )
        status += f", {_text(e.reason)}"
        if e.undoes is not None:
            status += (
                f' of <a class="undoes" href="{base}/events?after={e.undoes - 1}#e{e.undoes}">'
                f"event #{e.undoes}</a>"
            )
        if e.note:
            status += f' <span class="muted">({_text(e.note)})</span>'
        model = _text(e.model or "")
        if e.prompt_tokens is not None:
            model += (
                f'<br><span class="n">{num(e.prompt_tokens)} + {num(e.completion_tokens)}</span>'
            )
        if e.latency_ms is not None:
            model += f"<br>{e.latency_ms:.0f} ms"
        where = ""
        if e.offload_uuid:
            where = f'<a href="{base}/o/{e.offload_uuid}">{e.offload_uuid}</a>'
        if e.summary_message_id:
            where += (
                f'<br><a href="{base}/m/{e.summary_message_id}">message #{e.summary_message_id}</a>'
            )
        elif e.status == "applied" and e.strategy == MASKING and e.replaced:
            # One masking pass, one event: each output it masked has its own offload, shown
            # on the preview's page.
            where = f'<span class="muted">{e.replaced} outputs, an offload each</span>'

        color = _text(colors.get(e.strategy, "#777"))
        add(
            f'<tr id="e{e.id}">\n'
            f'  <td class="n">{e.id}</td>\n'
            f'  <td class="when">{when(e.created_at)}</td>\n'
            f'  <td><span class="tag" style="background: {color}">S{e.strategy}</span> '
            f"{_text(kind(e.strategy, e.reason))}</td>\n"
            f"  <td>{status}</td>\n"
            f'  <td class="n">{num(e.tokens_before)} → {num(e.tokens_after)}</td>\n'
            f'  <td class="n">{num(e.messages_before)} → {num(e.messages_after)}</td>\n'
            f'  <td class="n">{e.replaced}</td>\n'
            f'  <td class="facts">{_facts(e)}</td>\n'
            f"  <td>{model}</td>\n"
            f'  <td class="id offload">{where}</td>\n'
            f'  <td class="error">{_text(e.error or "")}</td>\n'
            "</tr>\n"
        )
    return Markup("".join(out))


def parts_html(parts: Iterable[Part]) -> Markup:
    """A message's blocks in order: each one's label and its text exactly as stored."""
    return Markup(
        "".join(
            f'<div class="part">{_text(p.label)}</div>\n<pre class="stored">{_text(p.text)}</pre>\n'
            for p in parts
        )
    )


def message_blocks(msgs: Iterable[tuple[int | None, Msg, Markup]], session_id: str) -> Markup:
    """Whole messages (an offload's page): each one's place in the offload when it has one,
    its id (a link to the message), role, kind and tokens, then its blocks (`parts_html`)."""
    base = f"/s/{q(session_id)}/m/"
    out: list[str] = []
    add = out.append
    for k, m, blocks in msgs:
        place = f"<b>[{k}]</b> " if k is not None else ""
        kind = "" if m.kind == "original" else "kind"
        add(
            f'<div class="msg" id="m{m.id}">\n'
            f'<div>{place}<a href="{base}{m.id}">#{m.id}</a> {_word(m.role)} '
            f'<span class="{kind}">{_word(m.kind)}</span> {num(m.tokens)} tokens</div>\n'
            f"{blocks}</div>\n"
        )
    return Markup("".join(out))
