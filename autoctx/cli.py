"""The `autoctx` command: run the demo, manage the schema, and inspect sessions.

    autoctx demo                          # watch a long agent session get compressed
    autoctx sessions                      # what is in the database
    autoctx show SESSION                  # the working context the model sees
    autoctx history SESSION               # every compression: what, why, how much
    autoctx lineage SESSION MESSAGE_ID    # a summary, down to the originals behind it
    autoctx reload SESSION UUID           # what an offload removed
    autoctx plot SESSION -o tokens.png    # working tokens over time, compressions marked
    autoctx export SESSION -o s.json      # everything, as JSON
    autoctx worker                        # compress every agent's due sessions, in this process
    autoctx db upgrade | db current       # the schema
    autoctx db grant-tenant ROLE TENANT   # a database role that can use one tenant only

Every command takes ``--database-url`` (default: ``AUTOCTX_DATABASE_URL``, else the embedded
PostgreSQL). Errors print as one line that says what to do, with a non-zero exit code.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import shlex
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from importlib import metadata
from pathlib import Path
from typing import Annotated, Any, Final, ParamSpec, TypeVar

import sqlalchemy as sa
import typer
from rich import box
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text
from rich.tree import Tree
from sqlalchemy.engine import Engine

from . import demo as demo_mod
from .compressor import FALLBACK_MODEL
from .config import AutoContextConfig
from .errors import AutoctxError, InvalidOffloadId, OffloadNotFound, SessionNotFound
from .events import Event
from .memory import (
    AutoContextMemory,
    dispose_engines,
    get_engine,
    validate_session_id,
    validate_tenant,
)
from .messages import Msg, OpaqueBlock, TextBlock, ToolResultBlock, ToolUseBlock, to_openai_messages
from .plot import STRATEGY_COLORS, STRATEGY_NAMES
from .store import inspect as inspect_db
from .store import tenancy
from .store.database import (
    ENV_URL,
    check_connection,
    current_revision,
    describe,
    engine_for,
    head_revision,
    upgrade,
)
from .store.rows import SessionInfo
from .store.store import Store
from .summarizers import OFFLINE_MODEL, OfflineSummarizer, Summarizer, default_summarizer
from .tools import TOOL_NAME, parse_offload_id
from .transcript import OFFLOAD_TAG_RE, render_transcript

__all__ = ["app", "main"]

P = ParamSpec("P")
R = TypeVar("R")

#: Characters of content `show` prints per message.
PREVIEW_CHARS: Final = 100
#: Characters of an offload uuid `reload` needs at least: the 8 `history` prints. Fewer would
#: match by luck today and become ambiguous as the session grows.
MIN_PREFIX: Final = 8
#: Events `demo` repeats in its closing history table (the rest: `autoctx history`).
DEMO_HISTORY_ROWS: Final = 12

app = typer.Typer(
    name="autoctx",
    help=(
        "Working memory for long-running tool-using agents, kept in PostgreSQL: run the demo, "
        "manage the schema, inspect sessions.\n\n"
        "Start with `autoctx demo`.\n\n"
        f"The database is --database-url, else ${ENV_URL}, else an embedded PostgreSQL "
        "started on first use."
    ),
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="markdown",
    pretty_exceptions_enable=False,
)
db_app = typer.Typer(
    help=(
        "Create or upgrade autoctx's schema (Alembic migrations), show its revision, or give "
        "a database role one tenant."
    ),
    no_args_is_help=True,
)
app.add_typer(db_app, name="db")


#: The name autoctx is installed under (the index's `autoctx` is an unrelated project).
DISTRIBUTION: Final = "autoctx-pg"


def _version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        # Run from a source tree that was never installed: no metadata to read.
        return f"unknown ({DISTRIBUTION} is not installed; `pip install -e .` records it)"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"autoctx {_version()}")
        raise typer.Exit()


@app.callback()
def _root(
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Log autoctx's progress (INFO) to stderr.")
    ] = False,
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="Print the installed version and exit.",
        ),
    ] = False,
) -> None:
    if verbose:
        logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
        logging.getLogger("autoctx").setLevel(logging.INFO)


DatabaseUrl = Annotated[
    str | None,
    typer.Option(
        "--database-url",
        "-d",
        envvar=ENV_URL,
        show_envvar=True,
        metavar="URL",
        help="PostgreSQL URL, e.g. postgresql://user:pw@host:5432/db. Unset: embedded PostgreSQL.",
    ),
]
SessionArg = Annotated[str, typer.Argument(metavar="SESSION", help="The session id.")]
AsJson = Annotated[
    bool,
    typer.Option(
        "--json", help="Print JSON instead of a table: whole ids, ISO times, content as stored."
    ),
]


class CliError(AutoctxError):
    """A problem with the command line itself (for example an ambiguous uuid prefix)."""


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
        except AutoctxError as exc:
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
    """An answer received from an LLM: the offline summariser (configured, or standing in as
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


# ---------------------------------------------------------------------------------------------
# demo
# ---------------------------------------------------------------------------------------------


def _describe_summarizer(summarizer: Summarizer, forced: bool) -> str:
    if isinstance(summarizer, OfflineSummarizer):
        why = "--offline" if forced else "no OPENAI_BASE_URL or OPENAI_API_KEY set"
        return f"offline extractive summariser ({why}; set one of them to use an LLM endpoint)"
    return f"LLM endpoint {summarizer!r}"


@dataclass
class _Position:
    """Where the demo is, for the lines it prints."""

    phase: str = "setup"
    step: int = 0


@contextmanager
def _quiet_library() -> Iterator[None]:
    # The demo prints every event itself; the library's warnings for failed attempts would say
    # the same thing twice.
    log = logging.getLogger("autoctx")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


@app.command()
@friendly_errors
def demo(
    ctx: typer.Context,
    rounds: Annotated[
        int, typer.Option(min=0, max=200, help="User rounds (ReAct loops) before the long task.")
    ] = demo_mod.DEFAULT_ROUNDS,
    steps: Annotated[
        int, typer.Option(min=0, max=5000, help="Tool steps of the long single-task round.")
    ] = demo_mod.DEFAULT_STEPS,
    session: Annotated[
        str | None,
        typer.Option(help="Session id (demo- is prepended if missing). Default: demo-<time>."),
    ] = None,
    seed: Annotated[int, typer.Option(help="Random seed: the same seed, the same session.")] = (
        demo_mod.DEFAULT_SEED
    ),
    offline: Annotated[
        bool,
        typer.Option("--offline", help="Use the offline summariser even if an endpoint is set."),
    ] = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Watch autoctx keep a long agent session inside a small context window.

    Generates a realistic coding-agent session (seeded, so reproducible): a system prompt,
    user rounds of tool calls (parallel ones included) with file dumps, test logs, grep
    results and final answers, then one long task of hundreds of tool steps. After every step
    it calls compress_if_needed() and prints each compression as it happens. The window is
    small (32k tokens, 120 messages) so that every strategy gets its turn.

    It ends with the history, the final size against the window, a reload of an offload
    (the original is back, byte for byte) and a restart (the session reopened by id is
    identical).

    Summaries come from the LLM endpoint in OPENAI_BASE_URL / OPENAI_API_KEY when set, else
    from the offline extractive summariser.

    Examples:

    ```
    autoctx demo
    autoctx demo --rounds 2 --steps 40
    autoctx demo --seed 7 --session demo-mine --database-url postgresql://localhost/agents
    ```
    """
    console = _console()
    started = time.perf_counter()
    session_id = session or demo_mod.new_session_id()
    if not session_id.startswith(demo_mod.SESSION_PREFIX):
        session_id = demo_mod.SESSION_PREFIX + session_id
    validate_session_id(session_id)
    summarizer: Summarizer = OfflineSummarizer() if offline else default_summarizer()
    config = demo_mod.demo_config()
    engine = get_engine(database_url, auto_upgrade=True)
    if Store(engine).get_session(session_id) is not None:
        raise CliError(
            f"session {session_id!r} already exists; pass another --session, or leave it out "
            "for a fresh demo-<time> id"
        )
    stream = list(demo_mod.generate(rounds, steps, seed))
    total = sum(s.is_step for s in stream)

    console.print(Text(f"autoctx demo: session {session_id}", style="bold"))
    where = describe(engine.url)
    if database_url is None:
        where = f"embedded PostgreSQL ({where}); set {ENV_URL} or --database-url for a server"
    console.print(Text(f"  database    {where}"))
    console.print(Text(f"  summariser  {_describe_summarizer(summarizer, offline)}"))
    console.print(
        f"  window      {config.max_tokens:,} tokens; compress at {config.token_trigger:,} tokens "
        f"or {config.msg_threshold} messages, down to {config.token_target:,} / "
        f"{config.msg_target}; last_keep {config.last_keep}, large > "
        f"{config.large_payload_chars:,} chars"
    )
    console.print(
        f"  session     {rounds} rounds + a task of {steps} steps = {total} agent steps, "
        f"{sum(len(s.messages) for s in stream)} messages (seed {seed})\n"
    )

    mem = AutoContextMemory.open(session_id, database_url, config, summarizer=summarizer)
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[size]}"),
        TimeElapsedColumn(),
        console=console,
    )
    task = progress.add_task("setup", total=total, size="")
    position = _Position()

    def on_step(step: demo_mod.DemoStep) -> None:
        position.phase = step.phase
        position.step += int(step.is_step)
        info = mem.refresh()
        progress.update(
            task,
            advance=1 if step.is_step else 0,
            description=f"{step.phase:<8}",
            size=f"{info.token_count:>6,} tok {info.message_count:>3} msgs",
        )

    def on_event(event: Event) -> None:
        progress.console.print(
            _event_line(event, f"step {position.step} {position.phase}", console.width)
        )

    with _quiet_library(), progress:
        result = demo_mod.run(mem, iter(stream), on_step=on_step, on_event=on_event)

    events = mem.events()
    info = mem.refresh()
    console.print()
    shown = events[-DEMO_HISTORY_ROWS:]
    title = f"history of {session_id}: {len(events)} events"
    if len(events) > len(shown):
        title += f" (last {len(shown)} shown; all: autoctx history {session_id})"
    console.print(_events_table(shown, title, console.width))
    console.print(_per_strategy_table(events))
    fired = sorted({e.strategy for e in events if e.status == "applied"})
    console.print(
        Text(
            f"strategies that fired: {', '.join(f'S{s}' for s in fired) or 'none'}"
            + (
                f"; not fired: {', '.join(f'S{s}' for s in STRATEGY_NAMES if s and s not in fired)}"
                if len(set(fired) - {0}) < len(STRATEGY_NAMES) - 1
                else ""
            )
        )
    )
    # Compress rarely, and deeply (SPEC.md section 2): how often the summariser ran, and how
    # many of the calls that fired went all the way to the target.
    calls = sum(e.model is not None and e.reason != "fallback" for e in events)
    reached = sum(
        f is not None and f[0] < config.msg_target and f[1] < config.token_target
        for f in result.fired
    )
    console.print(
        Text(
            f"compression fired after {len(result.fired)} of {result.steps} steps and reached "
            f"the target {reached} times; {calls} summariser calls "
            f"({calls / max(1, result.steps):.2f} per step)"
        )
    )
    # "Nothing lost" is checked, not claimed: every message added is stored as an original.
    kept = mem.store.count_originals(session_id)
    added = len(result.originals)
    console.print(
        Text(
            f"\nworking context: {info.token_count:,} / {config.max_tokens:,} tokens "
            f"({info.token_count / config.max_tokens:.0%} of the window), {info.message_count} "
            f"messages; {added} messages added ({result.tokens_added:,} tokens), {kept} stored "
            f"as originals{', none lost' if kept == added else ' (MISSING SOME)'}",
            style="bold" if kept == added else "bold red",
        )
    )
    _demo_reload(console, mem, events, result)
    _demo_restart(console, mem, session_id, database_url, config, summarizer)
    console.print(f"\ndone in {time.perf_counter() - started:.1f} s. Look further:")
    first_offload = next((e.offload_uuid for e in events if e.offload_uuid is not None), None)
    deepest = _deepest_summary(events)
    # A URL given on the command line goes into every hint, so that each can be pasted as is
    # (one from the environment is still there when the hint runs).
    given = ctx.get_parameter_source("database_url")
    url = (
        f" --database-url {shlex.quote(database_url)}"
        if database_url is not None and given is not None and given.name == "COMMANDLINE"
        else ""
    )
    for command in (
        f"autoctx history {session_id}",
        f"autoctx show {session_id}",
        f"autoctx reload {session_id} {first_offload or '<uuid>'}",
        f"autoctx lineage {session_id} {deepest or '<message id from show>'}",
        f"autoctx plot {session_id} -o tokens.png",
        f"autoctx export {session_id} -o {session_id}.json",
    ):
        # Soft-wrapped: a terminal narrower than the line folds it, but a copy stays one line.
        console.print(Text(f"  {command}{url}", style="cyan"), soft_wrap=True)


def _deepest_summary(events: Sequence[Event]) -> int | None:
    """A summary worth a lineage tree: the latest of the strategy highest up the ladder that
    wrote a summary (S6 folds earlier summaries in, so its tree goes deepest)."""
    applied = [e for e in events if e.status == "applied" and e.summary_message_id is not None]
    for strategy in (6, 4, 1, 5):
        mine = [e for e in applied if e.strategy == strategy]
        if mine:
            return mine[-1].summary_message_id
    return applied[-1].summary_message_id if applied else None


def _demo_reload(
    console: Console, mem: AutoContextMemory, events: Sequence[Event], result: demo_mod.DemoResult
) -> None:
    """Reload one offload and compare it with what the demo added."""
    applied = [e for e in events if e.status == "applied" and e.offload_uuid is not None]
    if not applied:
        console.print("reload: no compression happened, nothing to reload (try more --steps)")
        return
    # A preview of one large original shows best that the original comes back whole.
    pick = next((e for e in applied if e.strategy in (2, 3)), applied[0])
    assert pick.offload_uuid is not None
    reloaded = mem.reload(pick.offload_uuid)
    originals = [m for m in reloaded if m.id in result.originals]
    same = sum(m.to_openai() == result.originals[m.id or 0] for m in originals)
    chars = sum(m.payload_chars for m in reloaded)
    summaries = len(reloaded) - len(originals)
    nested = f" (and {summaries} earlier summaries, each reloadable in turn)" if summaries else ""
    console.print(
        Text(
            f"\nreload {pick.offload_uuid} (S{pick.strategy} "
            f"{STRATEGY_NAMES[pick.strategy]}, event {pick.id}): {len(reloaded)} message(s), "
            f"{chars:,} characters; {same} of {len(originals)} original(s) identical to what was "
            f"added{nested}",
            style="bold green" if same == len(originals) else "bold red",
        )
    )
    excerpt = _shown(render_transcript(reloaded[:1], keep_tags=True)).splitlines()[:6]
    for line in excerpt:
        console.print(Text(f"  | {_clip(line, max(20, min(110, console.width - 5)))}", style="dim"))
    answer = mem.handle_tool_call(
        {
            "type": "function",
            "function": {
                "name": TOOL_NAME,
                "arguments": json.dumps({"uuid": str(pick.offload_uuid)}),
            },
        }
    )
    console.print(
        f"  the agent's context_reload tool answers with {len(answer):,} characters "
        f"(pages of {mem.config.reload_page_chars:,})"
    )


def _demo_restart(
    console: Console,
    mem: AutoContextMemory,
    session_id: str,
    database_url: str | None,
    config: AutoContextConfig,
    summarizer: Summarizer,
) -> None:
    """Close the memory and every pooled connection, reopen the session by id, compare."""
    before = (mem.message_count(), mem.token_count(), mem.to_openai())
    mem.close()
    dispose_engines()
    again = AutoContextMemory.open(
        session_id, database_url, config, summarizer=summarizer, create=False
    )
    after = (again.message_count(), again.token_count(), again.to_openai())
    recount = sum(m.tokens or 0 for m in again.messages())
    ok = before == after and recount == after[1]
    console.print(
        Text(
            f"restart: closed, reopened {session_id} by id: {after[0]} messages, {after[1]:,} "
            f"tokens, working context {'identical' if before[2] == after[2] else 'DIFFERENT'}; "
            f"recount of stored tokens {recount:,} "
            f"{'= session total' if recount == after[1] else '!= session total'}",
            style="bold green" if ok else "bold red",
        )
    )
    again.close()


# ---------------------------------------------------------------------------------------------
# db
# ---------------------------------------------------------------------------------------------


@db_app.command("upgrade")
@friendly_errors
def db_upgrade(database_url: DatabaseUrl = None) -> None:
    """Create autoctx's tables, or bring them to this version's schema (idempotent).

    Runs the Alembic migrations shipped in the package, under an advisory lock, so several
    processes may run it at once.

    Examples:

    ```
    autoctx db upgrade
    autoctx db upgrade --database-url postgresql://agent@db.internal/agents
    ```
    """
    with engine_for(database_url) as engine:
        check_connection(engine)
        before = current_revision(engine)
        after = upgrade(engine)
        where = describe(engine.url)
    if before == after:
        typer.echo(f"{where}: schema already at revision {after} (head)")
    else:
        typer.echo(f"{where}: schema upgraded from {before or 'nothing'} to {after} (head)")


@db_app.command("current")
@friendly_errors
def db_current(
    database_url: DatabaseUrl = None,
    check: Annotated[
        bool, typer.Option("--check", help="Exit with code 1 unless the schema is at head.")
    ] = False,
) -> None:
    """Show the database's schema revision and whether it is up to date.

    Examples:

    ```
    autoctx db current
    autoctx db current --check && echo ready
    ```
    """
    with engine_for(database_url) as engine:
        check_connection(engine)
        current = current_revision(engine)
        where = describe(engine.url)
    head = head_revision()
    if current == head:
        typer.echo(f"{where}: revision {current} (head): up to date")
        return
    state = "no autoctx schema yet" if current is None else f"revision {current}, head is {head}"
    typer.echo(f"{where}: {state}: run `autoctx db upgrade`")
    if check:
        raise typer.Exit(1)


RoleArg = Annotated[
    str, typer.Argument(metavar="ROLE", help="An existing database role (not the tables' owner).")
]
TenantArg = Annotated[str, typer.Argument(metavar="TENANT", help="The tenant's name.")]


@db_app.command("grant-tenant")
@friendly_errors
def db_grant_tenant(role: RoleArg, tenant: TenantArg, database_url: DatabaseUrl = None) -> None:
    """Let ROLE run autoctx for TENANT and see nothing of any other tenant (database tenancy).

    Grants ROLE the privileges a memory uses (no DDL) and records the tenant; the row-level
    security policies then show ROLE only TENANT's sessions, whatever SQL it sends. Run as the
    owner of autoctx's tables; running it twice is harmless.

    Examples:

    ```
    autoctx db grant-tenant acme_agent acme
    autoctx db grant-tenant acme_agent acme --database-url postgresql://owner@db/agents
    ```
    """
    with engine_for(database_url) as engine:
        check_connection(engine)
        added = tenancy.grant_tenant(engine, role, tenant)
        where = describe(engine.url)
    state = "granted" if added else "already held"
    typer.echo(f"{where}: role {role!r} {state} tenant {tenant!r}")


@db_app.command("revoke-tenant")
@friendly_errors
def db_revoke_tenant(role: RoleArg, tenant: TenantArg, database_url: DatabaseUrl = None) -> None:
    """Take TENANT away from ROLE; with its last tenant gone, ROLE loses every privilege on
    autoctx's tables and views.

    Examples:

    ```
    autoctx db revoke-tenant acme_agent acme
    ```
    """
    with engine_for(database_url) as engine:
        check_connection(engine)
        removed = tenancy.revoke_tenant(engine, role, tenant)
        where = describe(engine.url)
    if removed:
        typer.echo(f"{where}: role {role!r} no longer holds tenant {tenant!r}")
    else:
        typer.echo(f"{where}: role {role!r} did not hold tenant {tenant!r}; nothing to revoke")


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
    rows = Store(_engine(database_url)).list_sessions(tenant=validate_tenant(tenant), prefix=prefix)
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


@app.command()
@friendly_errors
def show(
    session: SessionArg,
    full: Annotated[bool, typer.Option("--full", help="Print every message in full.")] = False,
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Show a session's working context: what the model would be sent now.

    One line per message: index, message id, role, kind (original or which compression wrote
    it), tokens, the offload behind it, and the start of its content. With --full, every
    message in full, offload tags included.

    Examples:

    ```
    autoctx show demo-20261130-101500-1a2b
    autoctx show demo-20261130-101500-1a2b --full | less -R
    ```
    """
    store = Store(_engine(database_url))
    info = _session(store, session)
    msgs = store.load_working(session)
    if as_json:
        _print_json(
            {
                "session": _session_json(info, full=False),
                "messages": [
                    _working_json(k, m) | {"message": m.to_openai()} for k, m in enumerate(msgs)
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
            _short(_offload_of(msg)),
            _cell(_clip(_content_line(msg), PREVIEW_CHARS)),
        )
    console.print(table)


@app.command()
@friendly_errors
def history(session: SessionArg, as_json: AsJson = False, database_url: DatabaseUrl = None) -> None:
    """Show a session's compression events, oldest first, and totals per strategy.

    Each row is one attempt: the strategy, whether it applied (or failed, and why), which
    trigger held, the working tokens and messages before and after, how many messages it
    replaced, the offload uuid (its first 8 characters are enough for `autoctx reload`), the
    summariser's model and latency.

    Examples:

    ```
    autoctx history demo-20261130-101500-1a2b
    ```
    """
    store = Store(_engine(database_url))
    _session(store, session)
    events = store.events(session)
    if as_json:
        _print_json([_event_json(e) for e in events])
        return
    console = _console()
    if not events:
        console.print(f"{session}: no compression events yet")
        return
    console.print(_events_table(events, f"{session}: {len(events)} events", console.width))
    console.print(_per_strategy_table(events))


# ---------------------------------------------------------------------------------------------
# lineage, reload
# ---------------------------------------------------------------------------------------------


@app.command()
@friendly_errors
def lineage(
    session: SessionArg,
    message_id: Annotated[int, typer.Argument(metavar="MESSAGE_ID", help="A message id.")],
    depth: Annotated[
        int | None,
        typer.Option(min=1, help="Show only this many levels below the message (default: all)."),
    ] = None,
    database_url: DatabaseUrl = None,
) -> None:
    """Show what stands behind a message: the tree of what it replaced, down to the originals.

    Summaries of summaries are followed all the way down (one recursive query over the lineage
    table). For a message no longer in the working context, also shows which working message
    covers it now. Message ids are in the id column of `autoctx show`.

    Examples:

    ```
    autoctx lineage demo-20261130-101500-1a2b 812
    autoctx lineage demo-20261130-101500-1a2b 812 --depth 1
    ```
    """
    engine = _engine(database_url)
    store = Store(engine)
    _session(store, session)
    edges = inspect_db.lineage_edges(engine, session, message_id)
    chain = inspect_db.covering_chain(engine, session, message_id)
    ids = {message_id, *chain, *(e.replaced_id for e in edges)}
    msgs = store.load_messages(session, ids)
    if message_id not in msgs:
        raise CliError(
            f"message {message_id} does not exist in session {session!r}; the id column of "
            f"`autoctx show {session}` lists the working messages"
        )
    events = {e.id: e for e in store.events(session)}
    in_working = inspect_db.working_positions(engine, session, sorted(ids))
    children: dict[int, list[int]] = {}
    made_by: dict[int, int] = {}
    for e in edges:
        children.setdefault(e.summary_id, []).append(e.replaced_id)
        made_by[e.summary_id] = e.event_id

    def label(mid: int) -> Text:
        m = msgs[mid]
        text = Text(f"#{mid} ", style="bold")
        text.append(f"{m.role} ")
        text.append(m.kind, style="" if m.kind == "original" else "magenta")
        text.append(f" {m.tokens or 0:,} tok")
        event = events.get(made_by[mid]) if mid in made_by else None
        if event is not None:
            text.append("  ")
            text.append_text(_strategy_label(event.strategy))
            text.append(f" event {event.id}, offload {_short(event.offload_uuid)}", style="cyan")
        if mid in in_working:
            text.append(f"  [working #{in_working[mid]}]", style="green")
        text.append(f"  {_clip(_content_line(m), 70)}", style="dim")
        text.no_wrap = True
        text.overflow = "ellipsis"
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
    leaves = [e.replaced_id for e in edges if e.replaced_id not in children]
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


def _resolve_offload(engine: Engine, session_id: str, text: str) -> uuid.UUID:
    """A full uuid, or a unique prefix of one of the session's offloads (as history shows)."""
    try:
        return parse_offload_id(text)
    except InvalidOffloadId as exc:
        prefix = text.strip().lower()
        if not re.fullmatch(r"[0-9a-f-]+", prefix):
            # The library's error does not quote the id (a model may pass any text there);
            # the operator typed this one, so the CLI names it.
            raise InvalidOffloadId(f"{text!r}: {exc}") from None
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
        str, typer.Argument(metavar="UUID", help="Offload uuid, or a unique prefix (8 chars).")
    ],
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the messages as OpenAI-format JSON.")
    ] = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Print the messages an offload removed from the working context, as they were stored.

    The uuid is in the offload tag of a summary or preview (`<!-- CONTEXT_OFFLOAD: uuid=... -->`),
    in `autoctx history` and in `autoctx show`. One level deep: a summary among them keeps its
    own tag, which you can reload in turn. Reloading changes nothing in the session.

    Examples:

    ```
    autoctx reload demo-20261130-101500-1a2b 3f2a9c1e
    autoctx reload demo-20261130-101500-1a2b 3f2a9c1e-0b1d-4c55-9a5e-2b7c0f1d2e3a --json
    ```
    """
    engine = _engine(database_url)
    store = Store(engine)
    _session(store, session)
    offload_id = _resolve_offload(engine, session, offload)
    msgs = store.reload(session, offload_id)
    if as_json:
        _print_json(to_openai_messages(msgs))
        return
    row = next(r for r in inspect_db.offload_rows(engine, session) if r.uuid == offload_id)
    console = _console()
    console.print(
        Text(
            f"offload {offload_id}: {len(msgs)} message(s), "
            f"{sum(m.tokens or 0 for m in msgs):,} tokens, removed by S{row.strategy} "
            f"{STRATEGY_NAMES.get(row.strategy, '?')} (event {row.event_id}, "
            f"{_fmt_time(row.created_at)})",
            style="bold",
        )
    )
    for msg in msgs:
        _print_message(console, None, msg)


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
    from .plot import reconstruct, render

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


@app.command()
@friendly_errors
def worker(
    threads: Annotated[
        int, typer.Option(min=1, max=64, help="Sessions this process compresses at once.")
    ] = 1,
    poll: Annotated[
        float, typer.Option(min=0.01, help="Seconds between two looks when nothing is due.")
    ] = 1.0,
    once: Annotated[
        bool, typer.Option("--once", help="Exit when no session is due (instead of polling).")
    ] = False,
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's sessions.")] = None,
    offline: Annotated[
        bool,
        typer.Option("--offline", help="Use the offline summariser even if an endpoint is set."),
    ] = False,
    grace: Annotated[
        float,
        typer.Option(min=0, help="Seconds a stop waits for the summariser calls in flight."),
    ] = 10.0,
    database_url: DatabaseUrl = None,
) -> None:
    """Compress the sessions that are over their trigger, for every agent of the database.

    Start as many workers as you like, on as many machines: each session is claimed (an
    advisory lock) by one of them at a time, so none is ever compressed twice at once. The
    agents open their memories with background="worker": they never compress at the trigger,
    and wait (for the worker's compression, then compressing what is still over themselves)
    only when the next model call would be over the window.

    Summaries come from the LLM endpoint in OPENAI_BASE_URL / OPENAI_API_KEY
    (AUTOCTX_SUMMARY_MODEL names the model) when set, else from the offline extractive
    summariser. SIGTERM or Ctrl-C stops it: nothing is written after the signal (an answer in
    flight is dropped) and it exits 0; a second signal exits at once.

    Examples:

    ```
    autoctx worker --threads 4
    autoctx worker --once --offline --database-url postgresql://localhost/agents
    ```
    """
    from .worker import AutoContextWorker, Compressed, run_until_signalled

    def report(done: Compressed) -> None:
        tokens = ""
        if done.events:
            tokens = (
                f", {done.events[0].tokens_before:,} -> {done.events[-1].tokens_after:,} tokens"
            )
        typer.echo(
            f"compressed {done.session_id}: {done.applied} applied, {done.failed} failed{tokens}"
        )

    summarizer: Summarizer = OfflineSummarizer() if offline else default_summarizer()
    with AutoContextWorker(
        database_url,
        summarizer=summarizer,
        threads=threads,
        poll_s=poll,
        tenant=validate_tenant(tenant),
        on_compressed=report,
        auto_upgrade=False,
    ) as running:
        typer.echo(
            f"autoctx worker: {threads} thread(s), summariser "
            f"{_describe_summarizer(summarizer, offline)}",
            err=True,
        )
        made = run_until_signalled(running, once=once, grace_s=grace)
        typer.echo(f"autoctx worker: stopped after {made} compression(s)", err=True)
    close = getattr(summarizer, "close", None)
    if callable(close):
        close()


def main() -> None:
    """Console-script entry point (`autoctx`)."""
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
