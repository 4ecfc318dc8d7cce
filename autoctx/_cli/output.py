"""What the commands print: tables, JSON documents, one-line errors, and the helpers they share."""

from __future__ import annotations

import functools
import json
import re
import sys
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Final, ParamSpec, TypeVar

import sqlalchemy as sa
import typer
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text
from sqlalchemy.engine import Engine

from .._compressor import FALLBACK_MODEL
from .._errors import AutoContextError, SessionNotFound
from .._events import Event
from .._memory import (
    get_engine,
    validate_session_id,
)
from .._messages import (
    Msg,
    OpaqueBlock,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from .._plot import STRATEGY_COLORS, STRATEGY_NAMES
from .._store.rows import SessionInfo
from .._store.store import Store
from .._summarizers import OFFLINE_MODEL
from .._tags import OFFLOAD_TAG_RE
from .._transcript import render_transcript

P = ParamSpec("P")
R = TypeVar("R")


# ---------------------------------------------------------------------------------------------
# Output and errors
# ---------------------------------------------------------------------------------------------


def _console() -> Console:
    # Built per command, not at import: the test runner swaps sys.stdout for each invocation.
    return Console(highlight=False, soft_wrap=False)


def _print_whole(console: Console, table: Table) -> None:
    """Print `table`; into a pipe or file, at its natural width, so that nothing is cut to an
    assumed 80 columns (a terminal keeps its width, and the table wraps what may wrap)."""
    if not console.is_terminal:
        unbounded = console.options.update_width(sys.maxsize)
        console.width = max(console.width, console.measure(table, options=unbounded).maximum)
    console.print(table)


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
    }


def _working_json(index: int, msg: Msg) -> dict[str, Any]:
    """A working message as `autoctx show` lists it (the offload uuid whole)."""
    return {
        "index": index,
        "id": msg.id,
        "role": msg.role,
        "kind": msg.kind,
        "pinned": msg.pinned,
        "tokens": msg.tokens,
        "offload_uuid": _offload_of(msg) or None,
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
    return get_engine(database_url, auto_upgrade=False)


def _session(store: Store, session_id: str) -> SessionInfo:
    validate_session_id(session_id)
    info = store.get_session(session_id)
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
    return Text(
        f"S{strategy} {STRATEGY_NAMES.get(strategy, '?')}",
        style=STRATEGY_COLORS.get(strategy, ""),
    )


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


def _cell(text: str, style: str = "") -> Text:
    """One line of text that ends in an ellipsis where the column or terminal ends."""
    return Text(text, style=style, no_wrap=True, overflow="ellipsis")


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _offload_of(msg: Msg) -> str:
    """The offload uuid in a message's tag (summaries and previews carry one)."""
    texts = [b.text for b in msg.content if isinstance(b, TextBlock)]
    texts += [b.output_text for b in msg.content if isinstance(b, ToolResultBlock)]
    for text in reversed(texts):
        found = OFFLOAD_TAG_RE.findall(text)
        if found:
            return str(found[-1])
    return ""


def _event_line(event: Event, where: str, width: int) -> Text:
    """One compression as the demo prints it; the location prefix only where it fits."""
    line = Text(f"  {where:<18} " if width >= 120 else "  ", style="dim")
    line.append_text(_strategy_label(event.strategy))
    line.append(" " * max(1, 23 - len(STRATEGY_NAMES.get(event.strategy, "?"))))
    line.append(f"{event.status:<8}", style=_STATUS_STYLE.get(event.status, ""))
    line.append(
        f"{event.tokens_before:>6,}→{event.tokens_after:>6,} tok"
        f"  {event.messages_before:>3}→{event.messages_after:>3} msgs"
    )
    if event.offload_uuid is not None:
        line.append(f"  {_short(event.offload_uuid)}", style="cyan")
    if event.error:
        line.append(f"  {_clip(_one_line(event.error), 60)}", style="red")
    return line


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
    wrap or shrink when the terminal is narrow; the others keep their width."""
    for name in names:
        label = name.removeprefix(">")
        table.add_column(
            label,
            justify="right" if name.startswith(">") else "left",
            no_wrap=label != wrap,
            min_width=12 if label == wrap else None,
        )


def _events_table(events: Sequence[Event], title: str | None, width: int) -> Table:
    """The events; below 120 columns only what identifies them and what they did."""
    table = _table(title)
    wide = width >= 120
    if wide:
        _add_columns(
            table,
            ">#",
            "time",
            "strategy",
            "status",
            "why",
            ">tokens",
            ">msgs",
            ">repl",
            "offload",
            "model ms error",
            wrap="model ms error",
        )
    else:
        _add_columns(
            table, ">#", "strategy", "status", ">tokens", ">msgs", "offload", wrap="strategy"
        )
    for e in events:
        cost = e.model or ""
        if e.latency_ms is not None:
            cost += f" {e.latency_ms:.0f}ms"
        if e.error:
            cost += f" {_clip(_one_line(e.error), 80)}"
        cells: list[str | Text] = [str(e.id)]
        if wide:
            cells.append(e.created_at.astimezone().strftime("%H:%M:%S") if e.created_at else "")
        cells += [
            _strategy_label(e.strategy),
            Text(e.status, style=_STATUS_STYLE.get(e.status, "")),
        ]
        if wide:
            cells.append(e.reason)
        cells += [
            f"{e.tokens_before:,}→{e.tokens_after:,}",
            f"{e.messages_before}→{e.messages_after}",
        ]
        if wide:
            cells.append(str(len(e.replaced_ids)))
        cells.append(_short(e.offload_uuid))
        if wide:
            cells.append(Text(cost.strip()))
        table.add_row(*cells)
    return table


def _is_llm_call(event: Event) -> bool:
    """An answer received from an LLM: the offline summarizer (configured, or standing in as
    the fallback) calls none (the same rule as `autoctx_session_cost.llm_calls`)."""
    return event.model is not None and event.model not in (OFFLINE_MODEL, FALLBACK_MODEL)


def _per_strategy_table(events: Sequence[Event]) -> Table:
    table = _table("events per strategy")
    _add_columns(
        table,
        "strategy",
        ">applied",
        ">failed",
        ">conflict",
        ">tok saved",
        ">msgs cut",
        ">LLM calls",
        wrap="strategy",
    )
    for s in sorted({e.strategy for e in events}):
        mine = [e for e in events if e.strategy == s]
        applied = [e for e in mine if e.status == "applied"]
        table.add_row(
            _strategy_label(s),
            str(len(applied)),
            str(sum(e.status == "failed" for e in mine)),
            str(sum(e.status == "conflict" for e in mine)),
            f"{sum(e.tokens_saved for e in applied):,}",
            f"{sum(e.messages_before - e.messages_after for e in applied):,}",
            str(sum(_is_llm_call(e) for e in mine)),
        )
    return table


def _print_message(console: Console, index: int | None, msg: Msg) -> None:
    where = f"[{index}] " if index is not None else ""
    header = f"{where}#{msg.id} {msg.role} {msg.kind} {msg.tokens or 0:,} tokens"
    if msg.pinned:
        header += " pinned"
    console.rule(Text(header, style="bold"), align="left")
    console.print(Text(_shown(render_transcript([msg], keep_tags=True))))
