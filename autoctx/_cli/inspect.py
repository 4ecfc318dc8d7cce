"""`autoctx sessions | show | history | lineage | reload`: what is stored, read back."""

from __future__ import annotations

import re
import sys
import uuid
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Final

import typer
from rich.padding import Padding
from rich.table import Table
from rich.text import Text
from rich.tree import Tree
from sqlalchemy.engine import Engine

from .. import _arguments
from .._arguments import OffloadRef
from .._arguments import offload_id as parse_offload_id
from .._errors import InvalidOffloadId, OffloadNotFound
from .._events import Event
from .._messages import Msg, openai_view
from .._store import inspect as inspect_db
from .._store.catalog import Catalog
from .._store.store import SessionStore
from .._strategies import registry
from .event_filter import EventFilter
from .output import (
    _add_columns,
    _clip,
    _console,
    _content_line,
    _engine,
    _event_json,
    _fits,
    _fmt_time,
    _is_compression,
    _kind_name,
    _message_json,
    _offload_of,
    _per_kind_table,
    _print_events,
    _print_fitting,
    _print_json,
    _print_message,
    _print_whole,
    _raw_message,
    _session,
    _session_json,
    _table,
    _working_json,
    friendly_errors,
)
from .root import AsJson, CliError, DatabaseUrl, SessionArg, Verbose, app

#: Characters of content `show` prints per message (wrapped; `--full` prints all of it).
PREVIEW_CHARS: Final = 300
#: Characters of content `lineage` prints under each message.
LINEAGE_PREVIEW_CHARS: Final = 70
#: Characters of an offload uuid `reload` needs at least: the 8 `history` prints. Fewer would
#: match by luck today and become ambiguous as the session grows.
MIN_PREFIX: Final = 8


# ---------------------------------------------------------------------------------------------
# sessions, show, history
# ---------------------------------------------------------------------------------------------


@app.command()
@friendly_errors
def sessions(
    prefix: Annotated[
        str | None, typer.Option("--prefix", "-p", help="Only ids starting with this.")
    ] = None,
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's sessions.")] = None,
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
    verbose: Verbose = False,
) -> None:
    """List sessions, most recently updated first.

    Ids are printed whole (piped, the table is as wide as it needs to be), so that they can be
    copied into the other commands.

    Examples:

    ```
    autoctx sessions
    autoctx sessions --prefix demo-
    autoctx sessions --json | jq -r '.[].session_id'
    ```
    """
    rows = Catalog(_engine(database_url)).list_sessions(
        tenant=_arguments.tenant(tenant), prefix=prefix
    )
    if as_json:
        _print_json([_session_json(s, full=False) for s in rows])
        return
    console = _console()
    if not rows:
        console.print("no sessions" + (f" starting with {prefix!r}" if prefix else ""))
        return
    table = _table(f"{len(rows)} session(s)")
    # The id is what a user copies: it never wraps or shrinks; tenant and time wrap instead.
    table.add_column("id", no_wrap=True, min_width=max(len(s.session_id) for s in rows))
    table.add_column("tenant", overflow="fold")
    for name in ("messages", "tokens", "version"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("updated", min_width=10)
    for s in rows:
        table.add_row(
            Text(s.session_id),
            Text(s.tenant or ""),
            str(s.message_count),
            f"{s.token_count:,}",
            str(s.version),
            _fmt_time(s.updated_at),
        )
    _print_whole(console, table)


def _openai_of(msg: Msg) -> dict[str, Any] | list[dict[str, Any]]:
    """A message's OpenAI view (what Chat Completions cannot carry, such as reasoning, left
    out: `stored` holds it); a tool message with several results is one OpenAI message each."""
    view = openai_view([msg])[0]
    return view[0] if len(view) == 1 else view


@app.command()
@friendly_errors
def show(
    session: SessionArg,
    full: Annotated[bool, typer.Option("--full", help="Print every message in full.")] = False,
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
    verbose: Verbose = False,
) -> None:
    """Show a session's working context: what the model would be sent now.

    One row per message: index, message id, role, kind (original or which compression wrote
    it), tokens, the offload behind it (its handle, as its tag shows it, which `autoctx reload`
    takes), and the first 300 characters of its
    content, wrapped; where the columns do not fit, one block per message. With --full, every
    message in full, offload tags included.

    Examples:

    ```
    autoctx show demo-20261130-101500-1a2b
    autoctx show demo-20261130-101500-1a2b --full | less -R
    ```
    """
    store = SessionStore(_engine(database_url), session)
    info = _session(store)
    msgs = store.load_working()
    if as_json:
        uuid_of = {r.handle: r.uuid for r in inspect_db.offload_rows(store.engine, session)}
        _print_json(
            {
                "session": _session_json(info, full=False),
                "messages": [
                    _working_json(k, m, uuid_of)
                    | {"message": _openai_of(m), "stored": m.stored_json()}
                    for k, m in enumerate(msgs)
                ],
            }
        )
        return
    console = _console()
    max_tokens = int(info.config.get("max_tokens", 0)) or None
    share = f" ({info.token_count / max_tokens:.0%} of {max_tokens:,})" if max_tokens else ""
    console.print(
        Text(
            f"{session}: {info.message_count} messages, {info.token_count:,} tokens{share}, "
            f"version {info.version}",
            style="bold",
        )
    )
    if full:
        for index, msg in enumerate(msgs):
            _print_message(console, index, msg)
        return
    table = Table(pad_edge=False, show_edge=False, box=None)
    _add_columns(
        table, ">#", ">id", "role", "kind", ">tokens", "offload", "content", wrap="content"
    )
    for index, msg in enumerate(msgs):
        table.add_row(
            str(index),
            str(msg.id),
            msg.role + ("*" if msg.pinned else ""),
            Text(msg.kind, style="" if msg.kind == "original" else "magenta"),
            f"{msg.tokens or 0:,}",
            _offload_of(msg),
            Text(_clip(_content_line(msg), PREVIEW_CHARS), overflow="fold"),
        )
    if _fits(console, table):
        console.print(table)
        return
    # Too narrow for the columns whole: one block per message, its content indented below.
    for index, msg in enumerate(msgs):
        head = Text(f"[{index}] #{msg.id} ", style="bold", overflow="fold")
        head.append(f"{msg.role}{'*' if msg.pinned else ''} ")
        head.append(msg.kind, style="" if msg.kind == "original" else "magenta")
        head.append(f" {msg.tokens or 0:,} tokens")
        offload = _offload_of(msg)
        if offload:
            head.append(f" offload {offload}", style="cyan")
        console.print(head)
        preview = Text(_clip(_content_line(msg), PREVIEW_CHARS), style="dim", overflow="fold")
        console.print(Padding(preview, (0, 0, 0, 4)))


@app.command()
@friendly_errors
def history(
    session: SessionArg,
    strategy: Annotated[
        list[str] | None,
        typer.Option(
            "--strategy",
            "-s",
            help="Only events of this kind: a strategy's number or name (7, S7, fold), or pop, "
            "clear, fork, erase. Repeat it for several.",
        ),
    ] = None,
    status: Annotated[
        list[str] | None,
        typer.Option(
            help="Only events of this status: applied, skipped, failed or conflict. Repeat it "
            "for several."
        ),
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(metavar="AGE", help="Only events of the last AGE (30min, 2h, 1d)."),
    ] = None,
    until: Annotated[
        str | None,
        typer.Option(metavar="AGE", help="Only events older than AGE (30min, 2h, 1d)."),
    ] = None,
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
    verbose: Verbose = False,
) -> None:
    """Show a session's compression events, oldest first, and totals per strategy.

    Each row is one attempt: its time, its kind (the strategy of a compression; pop, clear,
    fork or erase for what is not one, which saves nothing), whether it applied (or failed,
    and why), which trigger held, the working tokens and messages before and after, how many
    messages it replaced, the offload uuid (its first 8 characters are enough for `autoctx
    reload`), the summarizer's model, latency and error. Where the table does not fit the
    width (80 columns into a pipe unless $COLUMNS says otherwise), one block per event: every
    field, whole.

    The filters keep the events that match all of them (each repeated option: any of its
    values); the totals per strategy are of the events shown.

    Examples:

    ```
    autoctx history demo-20261130-101500-1a2b
    autoctx history demo-20261130-101500-1a2b --strategy fold --status failed --since 2h
    autoctx history demo-20261130-101500-1a2b -s 5 -s 6 --json
    ```
    """
    keep = EventFilter.parse(strategy or (), status or (), since, until)
    store = SessionStore(_engine(database_url), session)
    _session(store)
    everything = store.events()
    events = keep(everything)
    if as_json:
        _print_json([_event_json(e) for e in events])
        return
    console = _console()
    if not events:
        matched = f" of the {len(everything)} match the filters" if everything else " yet"
        console.print(f"{session}: no compression events{matched}")
        return
    shown = f"{len(events)} of {len(everything)} events" if keep else f"{len(events)} events"
    _print_events(console, events, f"{session}: {shown}")
    _print_fitting(console, _per_kind_table(events))


# ---------------------------------------------------------------------------------------------
# lineage, reload
# ---------------------------------------------------------------------------------------------


def _offloads_of_summaries(
    engine: Engine,
    session: str,
    edges: Sequence[inspect_db.LineageEdge],
    events: Mapping[int, Event],
) -> dict[int, uuid.UUID | None]:
    """The offload of what each summary of `edges` replaced: its event's, or for an event of a
    masking pass (which made an offload per output) the one that holds its first original."""
    firsts = {e.summary_id: (e.event_id, e.replaced_id) for e in edges if e.ordinal == 0}
    passes = {ev for ev, _ in firsts.values() if ev in events and events[ev].offload_uuid is None}
    own = (
        {
            (o.event_id, o.message_ids[0]): o.uuid
            for o in inspect_db.offload_rows(engine, session, sorted(passes))
            if o.message_ids
        }
        if passes
        else {}
    )
    return {
        mid: events[ev].offload_uuid if ev in events and ev not in passes else own.get((ev, first))
        for mid, (ev, first) in firsts.items()
    }


@app.command()
@friendly_errors
def lineage(
    session: SessionArg,
    message_id: Annotated[int, typer.Argument(metavar="MESSAGE_ID", help="A message id.")],
    depth: Annotated[
        int | None,
        typer.Option(min=1, help="Show only this many levels below the message (default: all)."),
    ] = None,
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
    verbose: Verbose = False,
) -> None:
    """Show what stands behind a message: the tree of what it replaced, down to the originals.

    Summaries of summaries are followed all the way down (one recursive query over the lineage
    table). For a message no longer in the working context, also shows which working message
    covers it now. Message ids are in the id column of `autoctx show`.

    Examples:

    ```
    autoctx lineage demo-20261130-101500-1a2b 812
    autoctx lineage demo-20261130-101500-1a2b 812 --depth 1
    autoctx lineage demo-20261130-101500-1a2b 812 --json | jq '.originals'
    ```
    """
    engine = _engine(database_url)
    store = SessionStore(engine, session)
    _session(store)
    edges = inspect_db.lineage_edges(engine, session, message_id)
    chain = inspect_db.covering_chain(engine, session, message_id)
    ids = {message_id, *chain, *(e.replaced_id for e in edges)}
    msgs = store.load_messages(ids)
    if message_id not in msgs:
        raise CliError(
            f"message {message_id} does not exist in session {session!r}; the id column of "
            f"`autoctx show {session}` lists the working messages"
        )
    events = {e.id: e for e in store.events()}
    in_working = inspect_db.working_positions(engine, session, sorted(ids))
    children: dict[int, list[int]] = {}
    made_by: dict[int, int] = {}
    for e in edges:
        children.setdefault(e.summary_id, []).append(e.replaced_id)
        made_by[e.summary_id] = e.event_id
    leaves = [e.replaced_id for e in edges if e.replaced_id not in children]
    offload_of = _offloads_of_summaries(engine, session, edges, events)

    def node_json(mid: int, level: int) -> dict[str, Any]:
        m = msgs[mid]
        event = events.get(made_by[mid]) if mid in made_by else None
        node: dict[str, Any] = {
            **_message_json(m),
            "working_position": in_working.get(mid),
            "event_id": event.id if event is not None else None,
            "strategy": event.strategy if event is not None else None,
            "offload_uuid": offload_of.get(mid),
        }
        kids = children.get(mid, [])
        if depth is not None and level > depth:
            return node | {"children": [], "more_below": len(kids)}
        return node | {"children": [node_json(k, level + 1) for k in kids], "more_below": 0}

    if as_json:
        _print_json(
            {
                "session_id": session,
                "tree": node_json(message_id, 1),
                "originals": leaves,
                "depth": max((e.depth for e in edges), default=0),
                "covered_by": chain,
                "in_working_context": message_id in in_working,
            }
        )
        return

    def label(mid: int) -> Text:
        # Ids first and whole (the line wraps, folding only a word longer than it); the
        # content preview on a line of its own.
        m = msgs[mid]
        text = Text(f"#{mid} ", style="bold", overflow="fold")
        text.append(f"{m.role} ")
        text.append(m.kind, style="" if m.kind == "original" else "magenta")
        text.append(f" {m.tokens or 0:,} tok")
        if mid in in_working:
            text.append(f"  [working #{in_working[mid]}]", style="green")
        event = events.get(made_by[mid]) if mid in made_by else None
        if event is not None:
            # A line of its own: the ids whole on one line down to a deep level of the tree.
            made = f"S{event.strategy}" if _is_compression(event) else _kind_name(event)
            text.append(f"\nevent {event.id} {made}", style="cyan")
            if offload_of.get(mid) is not None:
                text.append(f", offload {offload_of[mid]}", style="cyan")
        text.append("\n")
        text.append(_clip(_content_line(m), LINEAGE_PREVIEW_CHARS), style="dim")
        return text

    tree = Tree(label(message_id))

    def grow(node: Tree, mid: int, level: int) -> None:
        kids = children.get(mid, [])
        if depth is not None and level > depth:
            if kids:
                node.add(Text(f"... {len(kids)} more below (raise --depth)", style="dim"))
            return
        for child in kids:
            grow(node.add(label(child)), child, level + 1)

    grow(tree, message_id, 1)
    console = _console()
    console.print(tree)
    if edges:
        console.print(
            f"{len(leaves)} original message(s) behind #{message_id}, through "
            f"{len(children) - 1} intermediate summaries, {max(e.depth for e in edges)} "
            "level(s) deep"
        )
    else:
        console.print(f"#{message_id} is {msgs[message_id].kind}: nothing stands behind it")
    if chain:
        top = chain[-1]
        where = f"working #{in_working[top]}" if top in in_working else "not in the working context"
        console.print(
            f"covered now by #{top} ({msgs[top].kind}, {where})"
            + (f" via {' -> '.join('#' + str(c) for c in chain[:-1])}" if len(chain) > 1 else "")
        )
    elif message_id not in in_working:
        console.print(f"#{message_id} is not in the working context")


def _resolve_offload(engine: Engine, session_id: str, text: str) -> OffloadRef:
    """A handle (the number in a tag), a full uuid, or a unique prefix of one of the session's
    offload uuids (as history shows)."""
    prefix = text.strip().lower()
    try:
        parsed = parse_offload_id(text)
    except InvalidOffloadId as exc:
        if not re.fullmatch(r"[0-9a-f-]+", prefix):
            # The library's error does not quote the id (a model may pass any text there);
            # the operator typed this one, so the CLI names it.
            raise InvalidOffloadId(f"{text!r}: {exc}") from None
    else:
        if not isinstance(parsed, int) or not prefix.isdigit():
            return parsed
        # Digits name a handle; a uuid prefix can be digits too (history shows 8 characters).
        if any(r.handle == parsed for r in inspect_db.offload_rows(engine, session_id)):
            return parsed
        if len(prefix) < MIN_PREFIX:
            raise OffloadNotFound(
                f"no offload of session {session_id!r} has the handle {parsed} (and {prefix!r} "
                f"is too short for a uuid prefix: give at least {MIN_PREFIX} characters, as the "
                f"offload column of `autoctx history {session_id}` shows them)"
            )
    if len(prefix) < MIN_PREFIX:
        raise CliError(
            f"offload prefix {prefix!r} is too short: give at least {MIN_PREFIX} characters of "
            f"the uuid, as the offload column of `autoctx history {session_id}` shows them"
        )
    found = inspect_db.offloads_matching(engine, session_id, prefix)
    if not found:
        raise OffloadNotFound(
            f"no offloaded context starting with {prefix!r} in session {session_id!r}; "
            f"see the offload column of `autoctx history {session_id}`"
        )
    if len(found) > 1:
        raise CliError(
            f"{prefix!r} matches several offloads of {session_id!r}; give more characters"
        )
    return found[0]


@app.command()
@friendly_errors
def reload(
    session: SessionArg,
    offload: Annotated[
        str,
        typer.Argument(
            metavar="OFFLOAD",
            help="Offload handle (the number in its tag), uuid, or a unique uuid prefix (8 chars).",
        ),
    ],
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print the offload and its messages as JSON: each with its id, role, kind, "
            "tokens and text, and the message in OpenAI format.",
        ),
    ] = False,
    database_url: DatabaseUrl = None,
    verbose: Verbose = False,
) -> None:
    """Print the messages an offload removed from the working context, as they were stored.

    The handle is the number in the offload tag of a summary or preview (`<!-- offload 12 -->`,
    in `autoctx show`); the uuid is in `autoctx history` and in tags written before handles.
    One level deep: a summary among them keeps its own tag, which you can reload in turn.
    Reloading changes nothing in the session.

    Each message is a `--- #id role kind tokens` line and then its text exactly as stored
    (lines, tabs and spacing untouched; only terminal control characters are written as
    \\xNN escapes; --json gives every character as stored).

    Examples:

    ```
    autoctx reload demo-20261130-101500-1a2b 12
    autoctx reload demo-20261130-101500-1a2b 3f2a9c1e
    autoctx reload demo-20261130-101500-1a2b 3f2a9c1e-0b1d-4c55-9a5e-2b7c0f1d2e3a --json
    ```
    """
    engine = _engine(database_url)
    store = SessionStore(engine, session)
    _session(store)
    offload_id = _resolve_offload(engine, session, offload)
    msgs = store.reload(offload_id)
    row = next(
        r for r in inspect_db.offload_rows(engine, session) if offload_id in (r.uuid, r.handle)
    )
    if as_json:
        _print_json(
            {
                "session_id": session,
                "offload": row.handle,
                "offload_uuid": row.uuid,
                "event_id": row.event_id,
                "strategy": row.strategy,
                "tokens": sum(m.tokens or 0 for m in msgs),
                "messages": [
                    _message_json(m) | {"message": _openai_of(m), "stored": m.stored_json()}
                    for m in msgs
                ],
            }
        )
        return
    sys.stdout.write(
        f"offload {row.handle} ({row.uuid}): {len(msgs)} message(s), "
        f"{sum(m.tokens or 0 for m in msgs):,} tokens, removed by "
        f"{registry.label(row.strategy)} (event {row.event_id}, "
        f"{_fmt_time(row.created_at)})\n"
    )
    for msg in msgs:
        _raw_message(msg)
