"""Row-level security by tenant on every session table.

autoctx scopes every transaction of a tenant's memory with
`set_config('autoctx.tenant', <tenant>, true)` (transaction-local, so a pooled connection never
carries a tenant over). These policies let a role subject to them see, and write, only the
rows of sessions whose tenant equals the setting; with the setting unset or empty, only
sessions without a tenant. A transaction that forgets its scope therefore sees nothing of the
other tenants (fail closed).

That is NOT isolation between roles: any role can set the setting itself (set_config, SET, the
connection options), so these policies alone keep tenants apart only while nothing but
autoctx's code talks to the database. Migration 0006 replaces them with policies that also
check the role's grant of the tenant (database tenancy, `autoctx db grant-tenant`).

RLS is ENABLEd, not FORCEd: the tables' owner (the role that ran the migrations, which is also
what autoctx connects as in the simple deployment) bypasses the policies, so single-tenant and
embedded use pay nothing and behave as before. To enforce them on the owner too:

    ALTER TABLE sessions FORCE ROW LEVEL SECURITY;   -- and likewise for the other five tables

(docs/scaling.md, "Tenants"). Tables without a tenant column are checked through their session
row, which is one primary-key probe: every table leads with session_id.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

POLICY = "autoctx_tenant_isolation"
#: The setting autoctx's store sets per transaction (autoctx._store.store.Store._scope).
#: `missing_ok = true`: unset reads as NULL instead of raising; both unset and '' mean "no tenant".
CURRENT_TENANT = "coalesce(current_setting('autoctx.tenant', true), '')"
SESSION_VISIBLE = f"coalesce(tenant, '') = {CURRENT_TENANT}"
#: Every table that holds a session's rows, except sessions itself.
CHILD_TABLES = ("messages", "working_set", "compression_events", "offloads", "lineage")


def _child_visible(table: str) -> str:
    return (
        "EXISTS (SELECT 1 FROM sessions s WHERE s.session_id = "
        f"{table}.session_id AND coalesce(s.tenant, '') = {CURRENT_TENANT})"
    )


def _policies() -> list[tuple[str, str]]:
    return [("sessions", SESSION_VISIBLE)] + [(t, _child_visible(t)) for t in CHILD_TABLES]


def upgrade() -> None:
    for table, condition in _policies():
        op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
        # USING filters what a statement sees (select, update, delete); WITH CHECK refuses
        # inserts and updates that would put a row under another tenant.
        op.execute(
            f"CREATE POLICY {POLICY} ON {table} FOR ALL "
            f"USING ({condition}) WITH CHECK ({condition})"
        )


def downgrade() -> None:
    for table, _ in reversed(_policies()):
        op.execute(f"DROP POLICY IF EXISTS {POLICY} ON {table}")
        op.execute(f"ALTER TABLE {table} DISABLE ROW LEVEL SECURITY")
