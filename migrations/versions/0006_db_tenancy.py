"""Database tenancy: the policies check the role's right to a tenant, not only a setting.

Migration 0003 let a row through when its session's tenant equalled the setting
`autoctx.tenant`. Any role can set that setting (`set_config`, `SET`, `-c autoctx.tenant=...`
in the connection options), so a role with the tables' privileges could read and write every
tenant's rows by naming the tenant. The setting stays, because it is how autoctx scopes its own
transactions (application tenancy, docs/design.md §5), but it is no longer enough:

- `autoctx_tenant_grants` lists which role may use which tenant. Only the tables' owner writes
  it (`autoctx db grant-tenant` / `revoke-tenant`, autoctx._store.tenancy); a granted role may
  read it, and its own row-level security shows each role only the grants it holds.
- Every session table's policy now also asks that the current role hold the tenant: it is a
  role granted the tenant, or one whose privileges it has (`pg_has_role(current_user, ..,
  'USAGE')`, the same test PostgreSQL applies to table privileges, so membership in a granted
  group counts and SET ROLE changes nothing that membership did not already allow). A row
  without a tenant has no grant and is visible to no such role.
- A role with the privileges of the tables' owner passes that check: it could turn row-level
  security off anyway, and with `FORCE ROW LEVEL SECURITY` the owner stays scoped by the
  setting alone, which is application tenancy enforced by PostgreSQL.

`current_user`, not `session_user`: it is the role whose privileges the statement runs with
(after SET ROLE, inside a view or function), which is what the policy must judge. The audit
views are `security_invoker` (migration 0002); this migration sets the option again so that a
view re-created without it since then cannot read as its owner. The schema defines no
functions, so there is no SECURITY DEFINER door.

Downgrading restores 0003's setting-only policies, which would trust the setting again: it
therefore revokes every privilege that grant-tenant gave on autoctx's tables, so that no
tenant role keeps a door it had not before (fail closed).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

POLICY = "autoctx_tenant_isolation"
GRANTS = "autoctx_tenant_grants"
GRANTS_POLICY = "autoctx_own_grants"
CHILD_TABLES = ("messages", "working_set", "compression_events", "offloads", "lineage")
TABLES = ("sessions", *CHILD_TABLES)
VIEWS = (
    "autoctx_savings_by_strategy",
    "autoctx_session_cost",
    "autoctx_lineage",
    "autoctx_coverage",
    "autoctx_problem_sessions",
)

#: As in 0003 (a migration is a snapshot of its time: it copies, it does not import).
CURRENT_TENANT = "coalesce(current_setting('autoctx.tenant', true), '')"
#: The current role may use the grants of `role_oid`. pg_roles, not a cast to regrole: a grant
#: left behind by a dropped role must count as nothing, not make every statement fail.
_HOLDS = "pg_catalog.pg_has_role(current_user, {role_oid}, 'USAGE')"
#: The tenants the current role holds (uncorrelated: PostgreSQL evaluates it once a statement).
MY_TENANTS = (
    f"SELECT g.tenant FROM {GRANTS} g JOIN pg_catalog.pg_roles r ON r.rolname = g.grantee "
    f"WHERE {_HOLDS.format(role_oid='r.oid')}"
)
#: The current role has the tables' owner's privileges ('sessions'::regclass is stored as the
#: table's oid, so the search path at query time does not matter).
IS_OWNER = _HOLDS.format(
    role_oid="(SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = 'sessions'::regclass)"
)


def _session_visible(alias: str) -> str:
    return (
        f"coalesce({alias}.tenant, '') = {CURRENT_TENANT} "
        f"AND ({IS_OWNER} OR {alias}.tenant IN ({MY_TENANTS}))"
    )


def _policies() -> list[tuple[str, str]]:
    child = (
        "EXISTS (SELECT 1 FROM sessions s WHERE s.session_id = {table}.session_id AND {visible})"
    )
    return [("sessions", _session_visible("sessions"))] + [
        (t, child.format(table=t, visible=_session_visible("s"))) for t in CHILD_TABLES
    ]


# 0003's policies, for the downgrade.
def _setting_only_policies() -> list[tuple[str, str]]:
    same = f"coalesce({{alias}}.tenant, '') = {CURRENT_TENANT}"
    child = "EXISTS (SELECT 1 FROM sessions s WHERE s.session_id = {table}.session_id AND {same})"
    return [("sessions", same.format(alias="sessions"))] + [
        (t, child.format(table=t, same=same.format(alias="s"))) for t in CHILD_TABLES
    ]


def _replace_policies(policies: list[tuple[str, str]]) -> None:
    for table, condition in policies:
        op.execute(f"DROP POLICY {POLICY} ON {table}")
        # USING filters what a statement sees (select, update, delete); WITH CHECK refuses
        # inserts and updates that would put a row under a tenant the role does not hold.
        op.execute(
            f"CREATE POLICY {POLICY} ON {table} FOR ALL "
            f"USING ({condition}) WITH CHECK ({condition})"
        )


def upgrade() -> None:
    op.create_table(
        GRANTS,
        # A role name, not an oid: readable, and what GRANT and the CLI name.
        sa.Column("grantee", sa.Text, nullable=False),
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.text("now()"),
        ),
        sa.PrimaryKeyConstraint("grantee", "tenant"),
        sa.CheckConstraint("length(tenant) > 0", name="tenant_grants_tenant"),
    )
    op.execute(f"REVOKE ALL ON {GRANTS} FROM PUBLIC")
    op.execute(f"ALTER TABLE {GRANTS} ENABLE ROW LEVEL SECURITY")
    # Read-only for the roles granted SELECT on it, and only their own rows: a tenant learns
    # neither the other tenants' names nor their roles. No write policy: even a role given
    # INSERT by mistake could add nothing.
    op.execute(
        f"CREATE POLICY {GRANTS_POLICY} ON {GRANTS} FOR SELECT USING ("
        + _HOLDS.format(
            role_oid=f"(SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = {GRANTS}.grantee)"
        )
        + ")"
    )
    _replace_policies(_policies())
    for view in VIEWS:
        op.execute(f"ALTER VIEW {view} SET (security_invoker = true)")


def _revoke_granted_privileges() -> None:
    bind = op.get_bind()
    quote = bind.dialect.identifier_preparer.quote_identifier
    roles = bind.execute(
        sa.text(
            f"SELECT DISTINCT g.grantee FROM {GRANTS} g "
            "JOIN pg_catalog.pg_roles r ON r.rolname = g.grantee"
        )
    ).scalars()
    schema = quote(
        bind.execute(
            sa.text(
                "SELECT n.nspname FROM pg_catalog.pg_class c "
                "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
                "WHERE c.oid = 'sessions'::regclass"
            )
        ).scalar_one()
    )
    objects = ", ".join((*TABLES, *VIEWS, "alembic_version", GRANTS))
    for role in roles:
        op.execute(f"REVOKE ALL ON {objects} FROM {quote(role)}")
        op.execute(f"REVOKE USAGE ON SCHEMA {schema} FROM {quote(role)}")


def downgrade() -> None:
    _revoke_granted_privileges()
    _replace_policies(_setting_only_policies())
    op.drop_table(GRANTS)
