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
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
    verbose: Verbose = False,
) -> None:
    """Serve the audit console: a read-only web page of the sessions, their token timelines,
    events, working context, lineage down to the originals, offloads and search.

    The page is served on this machine only (127.0.0.1) unless --host says otherwise; it loads
    nothing from elsewhere, so it works with no network. Every read is scoped to one tenant
    (--tenant) as a memory of that tenant is, in read-only transactions. Needs the `ui` extra
    (`pip install 'autoctx-pg[ui]'`). Stop it with Ctrl-C.

    Examples:

    ```
    autoctx ui
    autoctx ui --tenant acme --port 9000
    autoctx ui --port 0 --json        # one JSON line with the address, for scripts
    ```
    """
    from .._ui.app import make_server

    server = make_server(_engine(database_url), _arguments.tenant(tenant), host, port)
    address, bound_port = server.server_address[:2]
    bound = address.decode() if isinstance(address, bytes) else address
    shown = f"[{bound}]" if ":" in bound else bound
    url = f"http://{shown}:{bound_port}/"
    if as_json:
        typer.echo(json.dumps({"url": url, "tenant": tenant, "read_only": True}))
    else:
        typer.echo(f"autoctx console on {url} (read-only; Ctrl-C stops it)")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
