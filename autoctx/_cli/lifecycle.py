"""`autoctx fork | undo | erase | purge | import`: a session branched, a compression taken
back, a session erased, retired or restored (docs/design.md §7, §9; the SQL is in
autoctx._store.lifecycle and autoctx._store.undo)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from .. import _arguments
from .._errors import SessionNotFound
from .._memory import AutoContextMemory, internals
from .._operations import import_session, purge_sessions
from .._store.catalog import Catalog
from .._summarizers import OfflineSummarizer
from .output import (
    _engine,
    _event_json,
    _fmt_time,
    _print_json,
    _session_json,
    friendly_errors,
)
from .root import AsJson, DatabaseUrl, SessionArg, Verbose, app

TenantOption = Annotated[
    str | None,
    typer.Option(
        help="The session's tenant: a session of another tenant is unknown (default: whatever "
        "tenant the session has)."
    ),
]


def _memory(session_id: str, tenant: str | None, database_url: str | None) -> AutoContextMemory:
    """The memory of an existing session, in its own tenant (or `tenant`, which must be its)."""
    _arguments.session_id(session_id)
    engine = _engine(database_url)
    info = Catalog(engine).session(session_id, _arguments.tenant(tenant))
    if info is None:
        where = "" if tenant is None else f" for tenant {tenant!r}"
        raise SessionNotFound(
            f"session {session_id!r} does not exist{where} in this database; list the sessions "
            "with `autoctx sessions` (and check --database-url)"
        )
    return AutoContextMemory.open(
        session_id,
        database_url,
        tenant=info.tenant,
        summarizer=OfflineSummarizer(),
        create=False,
    )


@app.command()
@friendly_errors
def fork(
    session: SessionArg,
    new: Annotated[str, typer.Argument(metavar="NEW", help="The new session's id.")],
    at: Annotated[
        int | None,
        typer.Option(
            "--at", metavar="MESSAGE_ID", help="Start from the context up to this message."
        ),
    ] = None,
    tenant: TenantOption = None,
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
    verbose: Verbose = False,
) -> None:
    """Branch SESSION into a new session NEW that starts from its working context.

    NEW gets copies of every row it needs (its working messages and every original reload
    reaches from them) and records where it came from (`autoctx_forks`, docs/audit.md);
    SESSION is not changed. With --at, NEW starts from the context up to and including that
    message (a working message, or an original a summary stands for).

    Examples:

    ```
    autoctx fork agent-42 agent-42-retry
    autoctx fork agent-42 agent-42-before-deploy --at 118
    ```
    """
    child = _memory(session, tenant, database_url).fork(new, at_message=at)
    info = child.refresh()
    _, ids = internals(child).working_ids(1)
    if as_json:
        _print_json(
            {"parent": session, "at_message": ids[-1] if ids else None}
            | _session_json(info, full=False)
        )
        return
    typer.echo(
        f"forked {session!r} into {new!r} at message {ids[-1] if ids else '-'}: "
        f"{info.message_count} working messages, {info.token_count:,} tokens"
    )


@app.command()
@friendly_errors
def undo(
    session: SessionArg,
    event_id: Annotated[
        int, typer.Argument(metavar="EVENT_ID", help="The compression to take back.")
    ],
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Undo even when the working context reaches the window; the next compression "
            "then chooses again (never the same range).",
        ),
    ] = False,
    tenant: TenantOption = None,
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
    verbose: Verbose = False,
) -> None:
    """Put the messages the compression EVENT_ID replaced back in place of its replacement.

    One level deep (a summary among them stays a summary), in one transaction, recorded as an
    event (reason 'undo') that names EVENT_ID; the compressor does not plan that range again.
    Refused, with nothing changed, when the working context would reach the window (unless
    --force), when the replacement is no longer in the working context (the message names
    the event that holds it now), or when what it replaced was erased. `autoctx history`
    lists the events.

    Examples:

    ```
    autoctx undo agent-42 17
    autoctx undo agent-42 17 --force
    ```
    """
    done = _memory(session, tenant, database_url).undo(event_id, force=force)
    if as_json:
        _print_json({"session_id": session, "event": _event_json(done)})
        return
    typer.echo(
        f"undid event {event_id} of {session!r} (event {done.id}): "
        f"{done.messages_before} -> {done.messages_after} working messages, "
        f"{done.tokens_before:,} -> {done.tokens_after:,} tokens"
        + (" (forced over the window)" if done.note else "")
    )


@app.command()
@friendly_errors
def erase(
    session: SessionArg,
    message_ids: Annotated[
        list[int], typer.Argument(metavar="MESSAGE_ID...", help="The originals to erase.")
    ],
    reason: Annotated[
        str, typer.Option("--reason", help="Why (recorded with the ids; never content).")
    ],
    tenant: TenantOption = None,
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
    verbose: Verbose = False,
) -> None:
    """Erase originals of SESSION and everything derived from them, in one transaction.

    Each original becomes a tombstone (role, ids, time and lineage stay; text, tool arguments
    and outputs go); every summary and preview made from it is rewritten from what remains, or
    becomes a tombstone; the working context stays valid and its totals follow. One event
    records the ids and the reason. Forks of SESSION own their copies: erase there too.

    Examples:

    ```
    autoctx erase agent-42 118 119 --reason "user request #5521"
    ```
    """
    done = _memory(session, tenant, database_url).erase(message_ids, reason=reason)
    if as_json:
        _print_json(
            {
                "session_id": session,
                "erased_ids": list(done.erased_ids),
                "rewritten_ids": list(done.rewritten_ids),
                "event": _event_json(done.event),
                "forks": list(done.forks),
            }
        )
        return
    typer.echo(
        f"erased {len(done.erased_ids)} original(s) of {session!r} "
        f"({', '.join(map(str, done.erased_ids))}); rewrote {len(done.rewritten_ids)} derived "
        f"message(s); event {done.event.id}, working tokens {done.event.tokens_before:,} -> "
        f"{done.event.tokens_after:,}"
    )
    if done.answers:
        shown = ", ".join(f"{sid!r} message {mid}" for sid, mid in done.answers)
        typer.echo(
            f"also erased {len(done.answers)} context-tool answer(s) that quoted it: {shown}"
        )
    if done.forks:
        typer.echo(
            f"note: {len(done.forks)} fork(s) of {session!r} keep their own copies: "
            f"{', '.join(done.forks)}; erase the same ids there too"
        )


@app.command()
@friendly_errors
def purge(
    older_than: Annotated[
        str,
        typer.Option(
            "--older-than",
            metavar="DURATION",
            help="Age of the last update, with its unit: 30d, 12h, 15min, 45s, 2w, 1d12h.",
        ),
    ],
    tenant: Annotated[
        str | None, typer.Option(help="Only this tenant's sessions (default: every tenant).")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="List what would be deleted; delete nothing.")
    ] = False,
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
    verbose: Verbose = False,
) -> None:
    """Delete whole sessions last updated before a time (retention), with everything of them.

    Examples:

    ```
    autoctx purge --older-than 90d --dry-run
    autoctx purge --older-than 30d --tenant acme
    autoctx purge --older-than 12h --dry-run --json
    ```

    A duration is a number and a unit: s, min, h, d, w (`1m` is refused: minutes or
    months? write 1min or 30d).
    """
    gone = purge_sessions(
        older_than, database_url, tenant=_arguments.tenant(tenant), dry_run=dry_run
    )
    if as_json:
        _print_json(
            {
                "dry_run": dry_run,
                "older_than_seconds": _arguments.duration(older_than).total_seconds(),
                "sessions": [
                    {"session_id": s.session_id, "tenant": s.tenant, "updated_at": s.updated_at}
                    for s in gone
                ],
            }
        )
        return
    for s in gone:
        typer.echo(f"{s.session_id}\t{s.tenant or ''}\t{_fmt_time(s.updated_at)}")
    verb = "would delete" if dry_run else "deleted"
    typer.echo(f"{verb} {len(gone)} session(s) last updated more than {older_than} ago")


@app.command("import")
@friendly_errors
def import_(
    file: Annotated[
        str, typer.Argument(metavar="FILE", help="What `autoctx export` wrote; '-' for stdin.")
    ],
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
    verbose: Verbose = False,
) -> None:
    """Recreate a session from an export (restore, or move it to another database).

    Every message, the working context, offloads, lineage, events and fork origin come back as
    they were; the session keeps its id and tenant. An existing session is never overwritten.

    Examples:

    ```
    autoctx export agent-42 -o agent-42.json -d postgresql://old-host/agents
    autoctx import agent-42.json -d postgresql://new-host/agents
    ```
    """
    # Bytes: `import_session` says which byte is not UTF-8, without a traceback.
    text = sys.stdin.buffer.read() if file == "-" else Path(file).read_bytes()
    info = import_session(text, database_url)
    if as_json:
        _print_json(_session_json(info, full=False))
        return
    typer.echo(
        f"imported {info.session_id!r}: {info.message_count} working messages, "
        f"{info.token_count:,} tokens, version {info.version}"
    )
