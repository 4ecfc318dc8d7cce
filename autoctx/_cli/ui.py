"""`autoctx ui`: the audit console, served on this machine."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from .. import _arguments
from .output import _engine, friendly_errors
from .root import AsJson, DatabaseUrl, Verbose, app


@app.command()
@friendly_errors
def ui(
    tenant: Annotated[
        str | None,
        typer.Option(help="Show this tenant's sessions (unset: the sessions without a tenant)."),
    ] = None,
    host: Annotated[
        str, typer.Option(help="Address to listen on (keep 127.0.0.1 unless you mean to share).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port (0: any free one).")] = 8765,
    allow_host: Annotated[
        list[str] | None,
        typer.Option(
            "--allow-host",
            help="Also answer requests for this Host name (repeat for each name the console is "
            "reached by; the bound address and localhost are always answered).",
        ),
    ] = None,
    token: Annotated[
        bool,
        typer.Option(
            "--token/--no-token",
            help="Require the token printed in the URL (the default). --no-token is refused "
            "unless the console listens on a loopback address.",
        ),
    ] = True,
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
    verbose: Verbose = False,
) -> None:
    """Serve the audit console: a read-only web page of the sessions, their token timelines,
    events, working context, lineage down to the originals, offloads and search.

    The page is served on this machine only (127.0.0.1) unless --host says otherwise; it loads
    nothing from elsewhere, so it works with no network. It answers only requests for its own
    address, localhost and the names given with --allow-host, and only with the token printed
    at start: open the URL it prints (the token goes into a cookie, and the address bar keeps
    the plain URL). Every read is scoped to one tenant
    (--tenant) as a memory of that tenant is, in read-only transactions. Needs the `ui` extra
    (`pip install 'autoctx-pg[ui]'`). Stop it with Ctrl-C.

    Examples:

    ```
    autoctx ui
    autoctx ui --tenant acme --port 9000
    autoctx ui --port 0 --json        # one JSON line with the address, for scripts
    autoctx ui --host 0.0.0.0 --allow-host box.internal   # reached as http://box.internal:8765
    ```
    """
    from .._ui.server import make_server

    server = make_server(
        _engine(database_url),
        _arguments.tenant(tenant),
        host,
        port,
        token=token,
        allow_hosts=allow_host or (),
    )
    if as_json:
        typer.echo(json.dumps({"url": server.url, "tenant": tenant, "read_only": True}))
    else:
        typer.echo(f"autoctx console on {server.url} (read-only; Ctrl-C stops it)")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
