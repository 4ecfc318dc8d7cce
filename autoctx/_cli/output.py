"""What the commands print: tables, JSON documents, one-line errors, and the helpers they share."""

from __future__ import annotations

import functools
import json
import os
import re
import sys
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Final, ParamSpec, TypeVar

import sqlalchemy as sa
import typer
from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.padding import Padding
from rich.table import Table
from rich.text import Text
from sqlalchemy.engine import Engine

from .. import _arguments
from .._client import AutoContextClient
from .._effects import FALLBACK_MODEL
from .._errors import AutoContextError, SessionNotFound
from .._events import Event, FactCheck
from .._messages import (
    Msg,
    OpaqueBlock,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from .._sessions import SessionInfo
from .._store.database import SchemaBehind
from .._store.store import SessionStore
from .._strategies import registry
from .._summarizers import OFFLINE_MODEL
from .._tags import OFFLOAD_TAG_RE, tag_ids
from .._transcript import render_transcript
from .trimmed import trimmed

P = ParamSpec("P")
R = TypeVar("R")


# ---------------------------------------------------------------------------------------------
# Output and errors
# ---------------------------------------------------------------------------------------------


def _console(*, stderr: bool = False) -> Console:
    # Built per command, not at import: the test runner swaps sys.stdout for each invocation.
    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty():
        return Console(highlight=False, soft_wrap=False, stderr=stderr)
    return Console(highlight=False, soft_wrap=False, file=trimmed(stream))


def _print_whole(console: Console, table: Table) -> None:
    """Print `table`; into a pipe or file without $COLUMNS, at its natural width, so that a
    row stays one line (for grep and cut); where it does not fit the terminal or $COLUMNS
    whole, one block per row."""
    if not console.is_terminal and not os.environ.get("COLUMNS", "").strip().isdigit():
        unbounded = console.options.update_width(sys.maxsize)
        console.width = max(console.width, console.measure(table, options=unbounded).maximum)
    _print_fitting(console, table)


def _one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


#: Control characters a terminal would act on (C0 but newline and tab, DEL, C1): stored content
#: is data, so what it holds is shown, never executed (an ESC sequence could clear the screen,
#: set the title or recolour everything after it).
_CONTROL_RE: Final = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _shown(text: str) -> str:
    """`text` with the control characters a terminal would act on written as escapes (CRLF
    line ends read as newlines)."""
    return _CONTROL_RE.sub(lambda m: f"\\x{ord(m.group()):02x}", text.replace("\r\n", "\n"))


#: What `_raw` escapes: the same controls, but a CR that ends a line (CRLF) is kept.
_RAW_CONTROL_RE: Final = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]|\r(?!\n)")


def _raw(text: str) -> str:
    """`text` exactly as stored (tabs, line ends, spacing, no rewrapping), except the control
    characters a terminal would act on, written as escapes."""
    return _RAW_CONTROL_RE.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    raise TypeError(f"cannot export {type(value).__name__}")


#: What `json.dumps(ensure_ascii=False)` leaves raw although a terminal may act on it (DEL and
#: the C1 range; C0 it escapes itself). Escaped, the document stays valid and lossless.
_JSON_RAW_CONTROL_RE: Final = re.compile(r"[\x7f-\x9f]")


def _json_text(document: Any) -> str:
    """`document` as indented JSON: ISO times, uuids as strings, every control character
    escaped, everything else (any script) as is."""
    text = json.dumps(document, default=_jsonable, ensure_ascii=False, indent=2)
    return _JSON_RAW_CONTROL_RE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _print_json(document: Any) -> None:
    sys.stdout.write(_json_text(document) + "\n")


def _session_json(info: SessionInfo, *, full: bool) -> dict[str, Any]:
    """The session row; without `full`, only what `autoctx sessions` lists."""
    row: dict[str, Any] = {
        "session_id": info.session_id,
        "tenant": info.tenant,
        "version": info.version,
        "message_count": info.message_count,
        "token_count": info.token_count,
    }
    if full:
        row |= {
            "model": info.model,
            "encoding": info.encoding,
            "config": info.config,
            "plan": info.plan,
            "created_at": info.created_at,
        }
    return row | {"updated_at": info.updated_at}


def _event_json(e: Event) -> dict[str, Any]:
    return {
        "id": e.id,
        "strategy": e.strategy,
        "status": e.status,
        "reason": e.reason,
        "messages_before": e.messages_before,
        "messages_after": e.messages_after,
        "tokens_before": e.tokens_before,
        "tokens_after": e.tokens_after,
        "replaced_ids": list(e.replaced_ids),
        "summary_message_id": e.summary_message_id,
        "offload_uuid": e.offload_uuid,
        "model": e.model,
        "prompt_tokens": e.prompt_tokens,
        "completion_tokens": e.completion_tokens,
        "latency_ms": e.latency_ms,
        "error": e.error,
        "session_version": e.session_version,
        "created_at": e.created_at,
        "undoes": e.undoes,
        "facts": _facts_json(e.facts),
    }


def _message_json(msg: Msg) -> dict[str, Any]:
    """A stored message as the audit commands give it in JSON: its id, role, kind, pinning,
    tokens and text (as the transcript renders it, tags kept)."""
    return {
        "id": msg.id,
        "role": msg.role,
        "kind": msg.kind,
        "pinned": msg.pinned,
        "tokens": msg.tokens,
        "text": render_transcript([msg], keep_tags=True),
    }


def _facts_json(facts: FactCheck | None) -> dict[str, Any] | None:
    """The fact check of an event (docs/design.md §6), or None where no summary was checked."""
    if facts is None:
        return None
    return {
        "found": facts.found,
        "kept": facts.kept,
        "repaired": facts.repaired,
        "listed": facts.listed,
        "dropped": facts.dropped,
        "repair_calls": facts.repair_calls,
        "dropped_facts": list(facts.dropped_facts),
    }


def _facts_cell(facts: FactCheck | None) -> str:
    """Facts the summary shows of those found (kept, repaired or listed), e.g. ``12/14``."""
    return "" if facts is None else f"{facts.found - facts.dropped}/{facts.found}"


def _facts_line(facts: FactCheck) -> str:
    return (
        f"{facts.found} found: {facts.kept} kept, {facts.repaired} repaired, {facts.listed} "
        f"listed, {facts.dropped} dropped"
    )


def _working_json(
    index: int, msg: Msg, uuid_of: Mapping[int, uuid.UUID] | None = None
) -> dict[str, Any]:
    """A working message as `autoctx show` lists it: the handle its tag shows (None for a tag
    written before handles) and the offload uuid whole (`uuid_of`: the session's uuids by
    handle)."""
    tagged = _offload_of(msg)
    handle = int(tagged) if tagged.isdigit() else None
    found = (uuid_of or {}).get(handle) if handle is not None else None
    return {
        "index": index,
        "id": msg.id,
        "role": msg.role,
        "kind": msg.kind,
        "pinned": msg.pinned,
        "tokens": msg.tokens,
        "offload": handle,
        "offload_uuid": str(found) if found is not None else (tagged or None),
    }


def _fail(message: str, code: int = 1) -> typer.Exit:
    typer.echo(f"autoctx: error: {_one_line(message)}", err=True)
    return typer.Exit(code)


def friendly_errors(func: Callable[P, R]) -> Callable[P, R]:
    """Turn the errors a user can fix into one line on stderr and exit code 1 (no traceback)."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        except SchemaBehind as exc:
            raise _fail(
                f"{exc.state}: run `autoctx db upgrade` (with the same --database-url), then "
                "this command again"
            ) from None
        except AutoContextError as exc:
            raise _fail(str(exc)) from None
        except sa.exc.DBAPIError as exc:
            # A connection lost mid-command, a statement timeout, a permission missing: the
            # driver's first line says which.
            orig = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
            raise _fail(
                f"database error: {orig}. Check the server and --database-url "
                "(run `autoctx db current` to test the connection)"
            ) from None
        except OSError as exc:
            target = f" {exc.filename}" if exc.filename else ""
            raise _fail(
                f"cannot access{target}: {exc.strerror or exc}; check the path and that its "
                "folder exists and is writable"
            ) from None
        except KeyboardInterrupt:
            raise _fail("interrupted", 130) from None

    return wrapper


def _engine(database_url: str | None) -> Engine:
    """The engine for an inspection command: the schema must already be at head (a reader
    never migrates; the error says to run `autoctx db upgrade`)."""
    return AutoContextClient.shared(database_url, auto_upgrade=False).engine


def _session(store: SessionStore) -> SessionInfo:
    session_id = _arguments.session_id(store.session_id)
    info = store.get_session()
    if info is None:
        raise SessionNotFound(
            f"session {session_id!r} does not exist in this database; list the sessions with "
            "`autoctx sessions` (and check --database-url)"
        )
    return info


def _fmt_time(value: datetime | None) -> str:
    return value.astimezone().strftime("%Y-%m-%d %H:%M:%S") if value is not None else ""


def _short(value: uuid.UUID | str | None) -> str:
    return str(value)[:8] if value is not None else ""


def _strategy_label(strategy: int) -> Text:
    return Text(registry.label(strategy), style=registry.STRATEGY_COLORS.get(strategy, ""))


_STATUS_STYLE: Final = {
    "applied": "green",
    "failed": "red",
    "conflict": "yellow",
    "skipped": "dim",
}


def _content_line(msg: Msg) -> str:
    """The message on one line: text, then calls and results."""
    parts: list[str] = []
    for block in msg.content:
        if isinstance(block, TextBlock):
            parts.append(block.text)
        elif isinstance(block, ToolUseBlock):
            parts.append(f"-> {block.name}({block.arguments})")
        elif isinstance(block, ToolResultBlock):
            parts.append(f"<- {block.name or 'tool'}: {block.output_text}")
        elif isinstance(block, OpaqueBlock):
            parts.append(f"[{block.data.get('type', 'opaque')}]")
    return _shown(_one_line(OFFLOAD_TAG_RE.sub("", " ".join(parts))))


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _offload_of(msg: Msg) -> str:
    """The offload id in a message's tag (summaries and previews carry one): its handle, or
    the uuid of a tag written before handles."""
    texts = [b.text for b in msg.content if isinstance(b, TextBlock)]
    texts += [b.output_text for b in msg.content if isinstance(b, ToolResultBlock)]
    for text in reversed(texts):
        found = tag_ids(text)
        if found:
            return found[-1]
    return ""


def _event_line(event: Event, where: str, width: int) -> Text:
    """One compression as the demo prints it; the location prefix only where it fits."""
    line = Text(f"  {where:<18} " if width >= 120 else "  ", style="dim")
    line.append_text(_event_kind(event))
    line.append(" " * max(1, 26 - len(_kind_name(event))))
    line.append(f"{event.status:<8}", style=_STATUS_STYLE.get(event.status, ""))
    line.append(
        f"{event.tokens_before:>6,}→{event.tokens_after:>6,} tok"
        f"  {event.messages_before:>3}→{event.messages_after:>3} msgs"
    )
    if event.offload_uuid is not None:
        line.append(f"  {_short(event.offload_uuid)}", style="cyan")
    elif _is_pass(event):
        line.append(f"  {len(event.replaced_ids)} offloads", style="cyan")
    if event.error:
        line.append(f"  {_clip(_one_line(event.error), 60)}", style="red")
    return line


def _is_compression(event: Event) -> bool:
    """A manual event (a pop, a clear, a fork, an erasure) summarizes nothing, so saves nothing."""
    return registry.is_compression(event.strategy)


def _kind_name(event: Event) -> str:
    """`S4 round summary` for a compression; `pop`, `clear`, `fork` or `erase` otherwise."""
    return registry.event_label(event.strategy, event.reason)


def _event_kind(event: Event) -> Text:
    style = registry.STRATEGY_COLORS.get(event.strategy, "") if _is_compression(event) else "bold"
    return Text(_kind_name(event), style=style)


def _table(title: str | None = None) -> Table:
    # No vertical rules and collapsed padding: the event rows are wide, and a terminal of
    # 120 columns should show them on one line each.
    return Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )


def _add_columns(table: Table, *names: str, wrap: str | None = None) -> None:
    """Columns by name; a leading '>' right-aligns one (numbers). Only the `wrap` column may
    wrap (folding a word longer than it) when the terminal is narrow; the others keep their
    width, so that `_fits` can tell whether the table is shown whole."""
    for name in names:
        label = name.removeprefix(">")
        table.add_column(
            label,
            justify="right" if name.startswith(">") else "left",
            no_wrap=label != wrap,
            overflow="fold",
            min_width=12 if label == wrap else None,
        )


def _fits(console: Console, table: Table) -> bool:
    """Whether `table` fits the console's width with every cell whole: no column dropped,
    none cut (only the wrapping column wraps). Into a pipe the width is $COLUMNS, else 80."""
    return _min_width(console, table) <= console.width


def _min_width(console: Console, table: Table) -> int:
    """The narrowest width at which every cell of `table` is whole."""
    # Measured without the console's bound (a bounded measure clamps each column to it). A
    # table's measure takes a column's longest word as its minimum even where the column may
    # not wrap; its `min_width` is what says otherwise, so a no-wrap column gets its widest cell.
    unbounded = console.options.update_width(sys.maxsize)
    for column in table.columns:
        if column.no_wrap:
            cells = [column.header, *column.cells]
            widest = max(Measurement.get(console, unbounded, cell).maximum for cell in cells)
            column.min_width = max(column.min_width or 0, widest)
    return console.measure(table, options=unbounded).minimum


def _record(console: Console, title: Text, fields: Sequence[tuple[str, str | Text]]) -> None:
    """One record as a block: a blank line, a title line, then one `label  value` line per
    field, each value wrapped under itself (a word longer than the line is folded, never cut).
    The title names the record (a session id, an event): a word of it longer than the line
    runs past the line whole rather than in two pieces, so that grep finds it."""
    console.print()
    console.print(_unbroken(title, console.width), no_wrap=True, overflow="ignore", crop=False)
    grid = Table.grid(padding=(0, 2), pad_edge=False)
    grid.add_column(no_wrap=True, style="dim")
    grid.add_column(overflow="fold")
    for label, value in fields:
        grid.add_row(label, value)
    console.print(Padding(grid, (0, 0, 0, 2), expand=False))


def _unbroken(text: Text, width: int) -> Text:
    """`text` wrapped at `width` between words, a word longer than the line kept whole."""
    words = text.split(" ")
    lines: list[Text] = []
    for word in words:
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1].append(" ")
            lines[-1].append_text(word)
        else:
            lines.append(word.copy())
    return Text("\n").join(lines)


def _cost(event: Event) -> str:
    cost = event.model or ""
    if event.latency_ms is not None:
        cost += f" {event.latency_ms:.0f} ms"
    return cost.strip()


def _why(event: Event) -> str:
    if event.undoes is not None:  # an undo says what it took back (docs/design.md §7)
        why = f"undo of event {event.undoes}"
        return f"{why}, {event.note}" if event.note else why
    return f"{event.reason}: {event.note}" if event.note else event.reason


def _events_table(events: Sequence[Event], title: str | None) -> Table:
    """Every column of the events, ids whole and errors whole (the last column wraps)."""
    table = _table(title)
    _add_columns(
        table,
        ">#",
        "time",
        "kind",
        "status",
        "why",
        ">tokens",
        ">msgs",
        ">repl",
        ">facts",
        "offload",
        "model, latency, error",
        wrap="model, latency, error",
    )
    for e in events:
        cost = Text(_cost(e))
        if e.error:
            cost.append((" " if cost else "") + _one_line(e.error), style="red")
        table.add_row(
            str(e.id),
            e.created_at.astimezone().strftime("%H:%M:%S") if e.created_at else "",
            _event_kind(e),
            Text(e.status, style=_STATUS_STYLE.get(e.status, "")),
            _shown(_why(e)),
            f"{e.tokens_before:,}→{e.tokens_after:,}",
            f"{e.messages_before}→{e.messages_after}",
            str(len(e.replaced_ids)),
            _facts_cell(e.facts),
            _offload_cell(e),
            cost,
        )
    return table


def _is_pass(e: Event) -> bool:
    """An applied event of a masking pass, which made an offload per output it masked."""
    return e.status == "applied" and e.strategy == registry.MASKING and e.offload_uuid is None


def _offload_cell(e: Event) -> str:
    if e.offload_uuid is not None:
        return str(e.offload_uuid)
    if _is_pass(e):
        return f"{len(e.replaced_ids)}, one per output"
    return ""


def _print_event_records(console: Console, events: Sequence[Event], title: str) -> None:
    """The events one block each (what a table too wide for the console shows instead)."""
    console.print(Text(title, style="italic"))
    for e in events:
        head = Text(f"event {e.id}  ", style="bold")
        head.append_text(_event_kind(e))
        head.append("  ")
        head.append(e.status, style=_STATUS_STYLE.get(e.status, ""))
        head.append(f"  {_fmt_time(e.created_at)}")
        fields: list[tuple[str, str | Text]] = [("why", _shown(_why(e)))]
        tokens = f"{e.tokens_before:,} → {e.tokens_after:,}"
        if _is_compression(e) and e.status == "applied":
            tokens += f" (saved {e.tokens_saved:,})"
        fields.append(("tokens", tokens))
        fields.append(
            (
                "messages",
                f"{e.messages_before} → {e.messages_after}, {len(e.replaced_ids)} replaced",
            )
        )
        if e.offload_uuid is not None:
            fields.append(("offload", Text(str(e.offload_uuid), style="cyan")))
        elif _is_pass(e):
            fields.append(("offloads", _offload_cell(e)))
        if e.summary_message_id is not None:
            fields.append(("summary", f"#{e.summary_message_id}"))
        if e.model or e.latency_ms is not None:
            fields.append(("model", _cost(e)))
        if e.prompt_tokens is not None or e.completion_tokens is not None:
            fields.append(
                ("usage", f"{e.prompt_tokens or 0:,} in, {e.completion_tokens or 0:,} out")
            )
        if e.facts is not None:
            fields.append(("facts", _facts_line(e.facts)))
        if e.error:
            fields.append(("error", Text(_shown(_one_line(e.error)), style="red")))
        if e.inherited:
            fields.append(("inherited", "copied from the parent session by the fork"))
        _record(console, head, fields)


def _print_events(console: Console, events: Sequence[Event], title: str) -> None:
    """The events as a table where it fits whole, else one block per event."""
    table = _events_table(events, title)
    if _fits(console, table):
        console.print(table)
    else:
        _print_event_records(console, events, title)
        console.print()


def _is_llm_call(event: Event) -> bool:
    """An answer received from an LLM: the offline summarizer (configured, or standing in as
    the fallback) calls none (the same rule as `autoctx_session_cost.llm_calls`)."""
    return event.model is not None and event.model not in (OFFLINE_MODEL, FALLBACK_MODEL)


def _per_kind_table(events: Sequence[Event]) -> Table:
    """Totals per strategy; pops, clears, forks and erasures on rows of their own that save
    nothing (they summarize nothing: what they take out is not compressed)."""
    table = _table("events per kind")
    _add_columns(
        table,
        "kind",
        ">applied",
        ">failed",
        ">conflict",
        ">tok saved",
        ">msgs cut",
        ">LLM calls",
        wrap="kind",
    )
    compressions = sorted({e.strategy for e in events if _is_compression(e)})
    others = sorted({_kind_name(e) for e in events if not _is_compression(e)})
    groups: list[tuple[Text, list[Event], bool]] = [
        (_strategy_label(s), [e for e in events if _is_compression(e) and e.strategy == s], True)
        for s in compressions
    ]
    groups += [
        (
            Text(name, style="bold"),
            [e for e in events if not _is_compression(e) and _kind_name(e) == name],
            False,
        )
        for name in others
    ]
    for label, mine, saves in groups:
        applied = [e for e in mine if e.status == "applied"]
        table.add_row(
            label,
            str(len(applied)),
            str(sum(e.status == "failed" for e in mine)),
            str(sum(e.status == "conflict" for e in mine)),
            f"{sum(e.tokens_saved for e in applied):,}" if saves else "-",
            f"{sum(e.messages_before - e.messages_after for e in applied):,}" if saves else "-",
            str(sum(_is_llm_call(e) for e in mine)),
        )
    return table


def _print_fitting(console: Console, table: Table) -> None:
    """`table` where it fits the console's width whole; else one block per row, titled by its
    first cell, with every other cell on a line of its own under its column's name."""
    if _fits(console, table):
        console.print(table)
        return
    if table.title:
        console.print(Text(str(table.title), style="italic"))
    first, *rest = table.columns
    for k, title in enumerate(first.cells):
        head = title.copy() if isinstance(title, Text) else Text(str(title))
        head.stylize("bold")
        fields: list[tuple[str, str | Text]] = []
        for column in rest:
            cell = list(column.cells)[k]
            fields.append((str(column.header), cell if isinstance(cell, Text) else str(cell)))
        _record(console, head, fields)
    console.print()


def _raw_message(msg: Msg) -> None:
    """A message written to stdout as its stored text: a plain header line, then the
    transcript of its content byte for byte (rich would rewrap it and expand its tabs)."""
    header = f"--- #{msg.id} {msg.role} {msg.kind} {msg.tokens or 0:,} tokens"
    if msg.pinned:
        header += " pinned"
    sys.stdout.write(f"{header}\n{_raw(render_transcript([msg], keep_tags=True))}\n")


def _print_message(console: Console, index: int | None, msg: Msg) -> None:
    where = f"[{index}] " if index is not None else ""
    header = f"{where}#{msg.id} {msg.role} {msg.kind} {msg.tokens or 0:,} tokens"
    if msg.pinned:
        header += " pinned"
    console.rule(Text(header, style="bold"), align="left")
    console.print(Text(_shown(render_transcript([msg], keep_tags=True))))
