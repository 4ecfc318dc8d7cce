"""`autoctx worker`: compress every agent's due sessions in this process, sharing the work with
other workers through per-session claims (see autoctx._worker)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from .. import _arguments
from .._config import RuntimeOptions
from .._summarizers import OfflineSummarizer, Summarizer, default_summarizer
from .._worker import AutoContextWorker, Compressed, run_until_signalled
from .demo import _describe_summarizer
from .output import friendly_errors
from .root import DatabaseUrl, Verbose, app


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
        typer.Option("--offline", help="Use the offline summarizer even if an endpoint is set."),
    ] = False,
    grace: Annotated[
        float,
        typer.Option(min=0, help="Seconds a stop waits for the summarizer calls in flight."),
    ] = 10.0,
    summarizer_concurrency: Annotated[
        int,
        typer.Option(
            min=1,
            max=64,
            help="Summarizer calls one compression may have in flight at once (1: one after "
            "the other).",
        ),
    ] = RuntimeOptions().summarizer_concurrency,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json", help="Print one JSON object per compression (JSON lines) on stdout."
        ),
    ] = False,
    database_url: DatabaseUrl = None,
    verbose: Verbose = False,
) -> None:
    """Compress the sessions that are over their trigger, for every agent of the database.

    Start as many workers as you like, on as many machines: each session is claimed (a row
    lock that no other tenant's role can take) by one of them at a time, so none is ever
    compressed twice at once. The agents open their memories with background="worker": they
    never compress at the trigger, and wait (for the worker's compression, then compressing
    what is still over themselves) only when the next model call would be over the window.

    Summaries come from the LLM endpoint in OPENAI_BASE_URL / OPENAI_API_KEY
    (AUTOCTX_SUMMARY_MODEL names the model) when set, else from the offline extractive
    summarizer. SIGTERM or Ctrl-C stops it: nothing is written after the signal (an answer in
    flight is dropped) and it exits 0; a second signal exits at once.

    A session that cannot be compressed (its stored config is invalid, the database failed
    under it) is logged with its id and skipped until it changes; the others go on. With
    --once the exit status is 1 when there was any such failure (or a look for due sessions
    failed), 0 otherwise.

    Examples:

    ```
    autoctx worker --threads 4
    autoctx worker --once --offline --database-url postgresql://localhost/agents
    autoctx worker --once --offline --json -v
    ```
    """

    def report(done: Compressed) -> None:
        if as_json:
            line = {
                "session_id": done.session_id,
                "applied": done.applied,
                "failed": done.failed,
                "tokens_before": done.events[0].tokens_before if done.events else None,
                "tokens_after": done.events[-1].tokens_after if done.events else None,
                "event_ids": [e.id for e in done.events],
            }
            typer.echo(json.dumps(line, ensure_ascii=False))
            return
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
        tenant=_arguments.tenant(tenant),
        on_compressed=report,
        auto_upgrade=False,
        options=RuntimeOptions(summarizer_concurrency=summarizer_concurrency),
    ) as running:
        typer.echo(
            f"autoctx worker: {threads} thread(s), summarizer "
            f"{_describe_summarizer(summarizer, offline)}",
            err=True,
        )
        made = run_until_signalled(running, once=once, grace_s=grace)
        failures = running.failures
        typer.echo(
            f"autoctx worker: stopped after {made} compression(s), {failures} failure(s)",
            err=True,
        )
    close = getattr(summarizer, "close", None)
    if callable(close):
        close()
    if once and failures:
        # The failures are logged above, each with its session; the other sessions were
        # compressed. A script that runs `--once` learns that something needs a look.
        raise typer.Exit(1)
