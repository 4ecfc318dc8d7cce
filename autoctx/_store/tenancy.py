"""Database tenancy: give a database role one tenant, or take it back (migration 0006).

A role granted tenant ``acme`` gets exactly the privileges a memory opened with
``tenant="acme"`` uses, and a row in `autoctx_tenant_grants`; the row-level security policies
let it see and write only the rows of sessions whose tenant it holds, whatever it sets
`autoctx.tenant` to. Run as the owner of autoctx's tables (the role that ran the migrations):
only it may write the grants table and pass on privileges on the tables.
"""

from __future__ import annotations

from typing import Any, Final

import sqlalchemy as sa
from psycopg import sql
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Connection, Engine

from .. import _arguments
from .._errors import TenantGrantError
from .database import describe, ensure_schema
from .sql import ROLE_INFO, TABLES_OWNER
from .tables import sessions, tenant_grants

GRANTS: Final = tenant_grants.name

#: Per table, what the store's statements need: sessions are created, locked (FOR UPDATE needs
#: UPDATE) and updated; originals, events, offloads and lineage are only ever inserted; the
#: working set is inserted into. An erasure rewrites messages in place (docs/design.md §9):
#: that stays the owner's (an operator's) act, so that a granted role, an agent's, can never
#: rewrite its own history. It may update one column of messages, the search vector, which its
#: searches fill (migration 0013: a trigger computes it from the row's content whatever the
#: statement sets, so that is all such an update can do).
#:
#: No table-level UPDATE, DELETE or TRUNCATE (migration 0014, docs/design.md §5): any of them
#: lets a role `LOCK TABLE` a table every tenant shares in a mode that stops the others' work.
#: UPDATE is granted column by column (which allows UPDATE and FOR UPDATE, and no table lock);
#: what needs a DELETE (the working set's splices, deleting a session) goes through the
#: functions in `FUNCTIONS`, which delete only what the caller could have deleted itself.
TABLE_PRIVILEGES: Final[dict[str, tuple[str, ...]]] = {
    "sessions": ("SELECT", "INSERT", f"UPDATE ({', '.join(c.name for c in sessions.c)})"),
    "messages": ("SELECT", "INSERT", "UPDATE (search_tsv)"),
    "working_set": ("SELECT", "INSERT"),
    "compression_events": ("SELECT", "INSERT"),
    "offloads": ("SELECT", "INSERT"),
    "lineage": ("SELECT", "INSERT"),
    # A claim is a row lock (FOR UPDATE needs UPDATE of a column); the triggers on sessions
    # write the rows with the owner's rights (migrations 0010, 0014).
    "session_claims": ("SELECT", "UPDATE (session_id)"),
}
#: The functions a granted role calls instead of deleting (migration 0014).
FUNCTIONS: Final = (
    "autoctx_unlink_working(text, bigint[])",
    "autoctx_delete_session(text, uuid, text, timestamptz)",
)
#: Read-only: the schema check when a memory opens, the audit views (security_invoker, so the
#: policies apply to the reader), and the grants the policies look up (its own rows only).
READ_ONLY: Final = (
    "alembic_version",
    "autoctx_savings_by_strategy",
    "autoctx_session_cost",
    "autoctx_lineage",
    "autoctx_coverage",
    "autoctx_problem_sessions",
    "autoctx_forks",
    "autoctx_undos",
    "autoctx_fact_checks",
    GRANTS,
)


def _ddl(conn: Connection, template: str, **names: str | tuple[str, ...]) -> None:
    """Run GRANT/REVOKE `template` in `conn`'s transaction with each `{name}` an identifier
    (a tuple: a comma-separated list of them), quoted by psycopg: a role name is used exactly
    as given, whatever characters it holds, and never becomes SQL."""

    def ident(value: str | tuple[str, ...]) -> sql.Composable:
        if isinstance(value, tuple):
            return sql.SQL(", ").join(sql.Identifier(v) for v in value)
        return sql.Identifier(value)

    statement = sql.SQL(template).format(**{k: ident(v) for k, v in names.items()})
    raw: Any = conn.connection.driver_connection
    with raw.cursor() as cur:
        cur.execute(statement)


def _check_caller(conn: Connection) -> tuple[str, str]:
    """The tables' schema and owner; raises unless the current role may grant on them."""
    row = conn.exec_driver_sql(TABLES_OWNER).one_or_none()
    if row is None:
        raise TenantGrantError(
            f"the database at {describe(conn.engine.url)} has no autoctx schema; run "
            "`autoctx db upgrade` first"
        )
    if not row.owns:
        raise TenantGrantError(
            f"role {row.me!r} does not own autoctx's tables (their owner is {row.owner}, the "
            "role that ran the migrations); connect as that role to grant or revoke tenants"
        )
    return str(row.nspname), str(row.owner)


def _role_info(conn: Connection, role: str) -> sa.Row[tuple[bool, bool, bool]] | None:
    return conn.exec_driver_sql(ROLE_INFO, {"role": role}).one_or_none()


def _check_confinable(conn: Connection, role: str, owner: str) -> None:
    info = _role_info(conn, role)
    if info is None:
        raise TenantGrantError(
            f"role {role!r} does not exist; create it first (CREATE ROLE ... LOGIN PASSWORD "
            "'...'), then grant it a tenant"
        )
    if info.superuser or info.bypassrls:
        raise TenantGrantError(
            f"role {role!r} is a superuser or has BYPASSRLS, so row-level security never "
            "applies to it and a tenant grant would confine nothing; grant the tenant to a "
            "plain role (NOSUPERUSER NOBYPASSRLS)"
        )
    if info.owner:
        raise TenantGrantError(
            f"role {role!r} owns autoctx's tables or has their owner's privileges (owner "
            f"{owner}), so it can always see every tenant; grant the tenant to a role that "
            "is not a member of the owner"
        )


def grant_tenant(engine: Engine, role: str, tenant: str) -> bool:
    """Let `role` run autoctx for `tenant`; True if the grant is new (granting twice is
    harmless). One transaction: the privileges and the grant row land together."""
    _arguments.role(role)
    _arguments.required_tenant(tenant)
    # The grants table is migration 0006's: an older schema says to upgrade, not "no table".
    ensure_schema(engine, auto_upgrade=False)
    with engine.begin() as conn:
        schema, owner = _check_caller(conn)
        _check_confinable(conn, role, owner)
        _ddl(conn, "GRANT USAGE ON SCHEMA {schema} TO {role}", schema=schema, role=role)
        for table, privileges in TABLE_PRIVILEGES.items():
            # The privilege keywords are this module's constants, never input.
            _ddl(
                conn,
                f"GRANT {', '.join(privileges)} ON {{table}} TO {{role}}",
                table=table,
                role=role,
            )
        _ddl(conn, "GRANT SELECT ON {objects} TO {role}", objects=READ_ONLY, role=role)
        # The signatures are this module's constants, never input.
        _ddl(conn, f"GRANT EXECUTE ON FUNCTION {', '.join(FUNCTIONS)} TO {{role}}", role=role)
        added = conn.execute(
            pg_insert(tenant_grants)
            .values(grantee=role, tenant=tenant)
            .on_conflict_do_nothing()
            .returning(tenant_grants.c.grantee)
        ).first()
    return added is not None


def revoke_tenant(engine: Engine, role: str, tenant: str) -> bool:
    """Take `tenant` away from `role`; True if it held it. With its last tenant gone, the role
    also loses every privilege on autoctx's tables and views (including any given by hand), so
    it can do nothing with them any more. A grant left by a role dropped since is removed."""
    _arguments.role(role)
    _arguments.required_tenant(tenant)
    ensure_schema(engine, auto_upgrade=False)
    with engine.begin() as conn:
        schema, _ = _check_caller(conn)
        removed = conn.execute(
            sa.delete(tenant_grants)
            .where(tenant_grants.c.grantee == role, tenant_grants.c.tenant == tenant)
            .returning(tenant_grants.c.grantee)
        ).first()
        remaining = conn.execute(
            sa.select(sa.func.count()).where(tenant_grants.c.grantee == role)
        ).scalar_one()
        # Undoes grant_tenant and nothing else: a role that held no such grant keeps whatever
        # privileges it was given some other way.
        if removed is not None and remaining == 0 and _role_info(conn, role) is not None:
            objects = (*TABLE_PRIVILEGES, *READ_ONLY)
            _ddl(conn, "REVOKE ALL ON {objects} FROM {role}", objects=objects, role=role)
            _ddl(conn, f"REVOKE ALL ON FUNCTION {', '.join(FUNCTIONS)} FROM {{role}}", role=role)
            _ddl(conn, "REVOKE USAGE ON SCHEMA {schema} FROM {role}", schema=schema, role=role)
    return removed is not None
