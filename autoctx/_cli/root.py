"""The `autoctx` command itself: the Typer apps, the options every command shares, `--version`."""

from __future__ import annotations

import logging
import sys
from importlib import metadata
from typing import Annotated, Final

import typer
import typer.rich_utils
from rich.console import Console

from .._errors import AutoContextError
from .._store.database import (
    ENV_URL,
)
from .trimmed import trimmed


def _help_console(stderr: bool = False) -> Console:
    """Typer's console for help and usage errors, which pads every line to its width with
    spaces: into a pipe or a file they are trimmed, as every command's own output is."""
    console = _typer_console(stderr=stderr)
    console.file = trimmed(sys.stderr if stderr else sys.stdout)
    return console


# Typer builds this console for each help page and usage error, through this name (a
# process that imports the CLI gets the trimming for its other Typer apps too: harmless, since
# it only drops trailing spaces outside a terminal).
_typer_console = typer.rich_utils._get_rich_console
typer.rich_utils._get_rich_console = _help_console

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


def _log_progress(verbose: bool) -> None:
    """`-v`, before or after the command's name: autoctx's INFO log lines on stderr."""
    if verbose:
        logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
        logging.getLogger("autoctx").setLevel(logging.INFO)


#: `-v` on every command, so that `autoctx worker -v` works as `autoctx -v worker` does.
Verbose = Annotated[
    bool,
    typer.Option(
        "--verbose",
        "-v",
        callback=_log_progress,
        help="Log autoctx's progress (INFO) to stderr.",
    ),
]


@app.callback()
def _root(
    verbose: Verbose = False,
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
    pass  # `--verbose` acts in its callback; `--version` in its own


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


class CliError(AutoContextError):
    """A problem with the command line itself (for example an ambiguous uuid prefix)."""


def main() -> None:
    """Console-script entry point (`autoctx`)."""
    app()
