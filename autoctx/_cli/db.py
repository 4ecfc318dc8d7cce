"""`autoctx db ...`: the schema (upgrade, current revision) and database tenancy (grant, revoke)."""

from __future__ import annotations

from typing import Annotated

import typer

from .._store import tenancy
from .._store.database import (
    check_connection,
    current_revision,
    describe,
    engine_for,
    head_revision,
    upgrade,
)
from .output import _print_json, friendly_errors
from .root import AsJson, DatabaseUrl, Verbose, db_app

# ---------------------------------------------------------------------------------------------
# db
# ---------------------------------------------------------------------------------------------


@db_app.command("upgrade")
@friendly_errors
def db_upgrade(
    as_json: AsJson = False, database_url: DatabaseUrl = None, verbose: Verbose = False
) -> None:
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
    if as_json:
        _print_json({"database": where, "before": before, "after": after, "head": after})
        return
    if before == after:
        typer.echo(f"{where}: schema already at revision {after} (head)")
    else:
        typer.echo(f"{where}: schema upgraded from {before or 'nothing'} to {after} (head)")


@db_app.command("current")
@friendly_errors
def db_current(
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
    verbose: Verbose = False,
    check: Annotated[
        bool, typer.Option("--check", help="Exit with code 1 unless the schema is at head.")
    ] = False,
) -> None:
    """Show the database's schema revision and whether it is up to date.

    Examples:

    ```
    autoctx db current
    autoctx db current --check && echo ready
    autoctx db current --json
    ```
    """
    with engine_for(database_url) as engine:
        check_connection(engine)
        current = current_revision(engine)
        where = describe(engine.url)
    head = head_revision()
    if as_json:
        _print_json(
            {"database": where, "revision": current, "head": head, "up_to_date": current == head}
        )
        if check and current != head:
            raise typer.Exit(1)
        return
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
def db_grant_tenant(
    role: RoleArg,
    tenant: TenantArg,
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
    verbose: Verbose = False,
) -> None:
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
    if as_json:
        _print_json({"database": where, "role": role, "tenant": tenant, "changed": added})
        return
    state = "granted" if added else "already held"
    typer.echo(f"{where}: role {role!r} {state} tenant {tenant!r}")


@db_app.command("revoke-tenant")
@friendly_errors
def db_revoke_tenant(
    role: RoleArg,
    tenant: TenantArg,
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
    verbose: Verbose = False,
) -> None:
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
    if as_json:
        _print_json({"database": where, "role": role, "tenant": tenant, "changed": removed})
        return
    if removed:
        typer.echo(f"{where}: role {role!r} no longer holds tenant {tenant!r}")
    else:
        typer.echo(f"{where}: role {role!r} did not hold tenant {tenant!r}; nothing to revoke")
