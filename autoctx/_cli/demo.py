"""`autoctx demo`: a long synthetic agent session fed into a memory, shown as it compresses."""

from __future__ import annotations

import json
import logging
import shlex
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Annotated, Final

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from .. import _arguments
from .. import _demo as demo_mod
from .._client import AutoContextClient
from .._config import AutoContextConfig
from .._events import Event
from .._memory import (
    AutoContextMemory,
    internals,
)
from .._store.catalog import Catalog
from .._store.database import (
    ENV_URL,
    describe,
)
from .._strategies import registry
from .._summarizers import OfflineSummarizer, Summarizer, default_summarizer
from .._tools import TOOL_NAME
from .._transcript import render_transcript
from .output import (
    _clip,
    _console,
    _event_json,
    _event_line,
    _per_kind_table,
    _print_events,
    _print_fitting,
    _print_json,
    _shown,
    friendly_errors,
)
from .root import CliError, DatabaseUrl, Verbose, app

#: Events `demo` repeats in its closing history table (the rest: `autoctx history`).
DEMO_HISTORY_ROWS: Final = 12


# ---------------------------------------------------------------------------------------------
# demo
# ---------------------------------------------------------------------------------------------


def _describe_summarizer(summarizer: Summarizer, forced: bool) -> str:
    if isinstance(summarizer, OfflineSummarizer):
        why = "--offline" if forced else "no OPENAI_BASE_URL or OPENAI_API_KEY set"
        return f"offline extractive summarizer ({why}; set one of them to use an LLM endpoint)"
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
        typer.Option("--offline", help="Use the offline summarizer even if an endpoint is set."),
    ] = False,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print the run on stderr and a JSON summary on stdout (session id, events, "
            "totals).",
        ),
    ] = False,
    database_url: DatabaseUrl = None,
    verbose: Verbose = False,
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
    from the offline extractive summarizer.

    Examples:

    ```
    autoctx demo
    autoctx demo --rounds 2 --steps 40
    autoctx demo --seed 7 --session demo-mine --database-url postgresql://localhost/agents
    autoctx demo --rounds 1 --steps 20 --json | jq -r .session_id
    ```
    """
    console = _console(stderr=as_json)
    started = time.perf_counter()
    session_id = session or demo_mod.new_session_id()
    if not session_id.startswith(demo_mod.SESSION_PREFIX):
        session_id = demo_mod.SESSION_PREFIX + session_id
    _arguments.session_id(session_id)
    summarizer: Summarizer = OfflineSummarizer() if offline else default_summarizer()
    config = demo_mod.demo_config()
    engine = AutoContextClient.shared(database_url, auto_upgrade=True).engine
    if Catalog(engine).session(session_id) is not None:
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
    console.print(Text(f"  summarizer  {_describe_summarizer(summarizer, offline)}"))
    console.print(
        f"  window      {config.max_tokens:,} tokens; compress at {config.token_trigger:,} tokens"
        + (
            f" or {config.msg_threshold} messages, down to {config.token_target:,} / "
            f"{config.msg_target}"
            if config.msg_threshold is not None
            else f", down to {config.token_target:,}"
        )
        + f"; last_keep {config.last_keep}, large > "
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
    _print_events(console, shown, title)
    _print_fitting(console, _per_kind_table(events))
    applied = [e for e in events if e.status == "applied"]
    fired = sorted({e.strategy for e in applied if registry.is_compression(e.strategy)})
    idle = [s for s in sorted(registry.RUNGS) if s not in fired]
    console.print(
        Text(
            f"strategies that fired: {', '.join(f'S{s}' for s in fired) or 'none'}"
            + (f"; not fired: {', '.join(f'S{s}' for s in idle)}" if idle else "")
        )
    )
    # Compress rarely, and deeply (docs/design.md §2): how often the summarizer ran, and how
    # many of the calls that fired went all the way to the target.
    calls = sum(e.model is not None and e.reason != "fallback" for e in events)
    reached = sum(
        f is not None
        and (config.msg_target is None or f[0] < config.msg_target)
        and f[1] < config.token_target
        for f in result.fired
    )
    console.print(
        Text(
            f"compression fired after {len(result.fired)} of {result.steps} steps and reached "
            f"the target {reached} times; {calls} summarizer calls "
            f"({calls / max(1, result.steps):.2f} per step)"
        )
    )
    # "Nothing lost" is checked, not claimed: every message added is stored as an original.
    kept = internals(mem).count_originals()
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
    if as_json:
        _print_json(
            {
                "session_id": session_id,
                "steps": result.steps,
                "message_count": info.message_count,
                "token_count": info.token_count,
                "max_tokens": config.max_tokens,
                "originals_added": added,
                "originals_stored": kept,
                "events": [_event_json(e) for e in events],
            }
        )


def _deepest_summary(events: Sequence[Event]) -> int | None:
    """A summary worth a lineage tree: the latest of the LLM rung highest up the ladder that
    wrote a summary (S6 folds earlier summaries in, so its tree goes deepest)."""
    applied = [e for e in events if e.status == "applied" and e.summary_message_id is not None]
    for strategy in reversed([s for s in registry.ORDER if s in registry.LLM_STRATEGIES]):
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
    pick = next((e for e in applied if e.strategy in registry.PREVIEW_STRATEGIES), applied[0])
    assert pick.offload_uuid is not None
    reloaded = mem.reload(pick.offload_uuid)
    originals = [m for m in reloaded if m.id in result.originals]
    same = sum(m.to_openai() == result.originals[m.id or 0] for m in originals)
    chars = sum(m.payload_chars for m in reloaded)
    summaries = len(reloaded) - len(originals)
    nested = f" (and {summaries} earlier summaries, each reloadable in turn)" if summaries else ""
    console.print(
        Text(
            f"\nreload {pick.offload_uuid} ({registry.label(pick.strategy)}, event {pick.id}): "
            f"{len(reloaded)} message(s), "
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
    AutoContextClient.close_shared()
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
