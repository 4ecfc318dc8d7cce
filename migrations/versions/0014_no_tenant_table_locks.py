"""No table lock for a tenant role, and the idempotency key of an add.

Table locks. Row-level security decides which rows a statement sees; it does not stop
`LOCK TABLE`. PostgreSQL lets a role take `LOCK TABLE t IN ACCESS SHARE MODE` with SELECT on
`t`, `IN ROW EXCLUSIVE MODE` with INSERT, and every stronger mode with a *table-level* UPDATE,
DELETE or TRUNCATE. A role granted one tenant (0006) had table-level UPDATE and DELETE on
`sessions` and `session_claims` and DELETE on `working_set`, so it could hold an exclusive lock
on a table every tenant shares: every other tenant's worker, `open()` and `add()` waited for as
long as it liked. The two modes a role keeps (ACCESS SHARE, ROW EXCLUSIVE) are the ones its
own reads and inserts take anyway: they conflict only with DDL (a migration's ALTER, a
non-concurrent CREATE INDEX), never with autoctx's reads, writes, row locks or claims.

So a granted role now holds:

- on `sessions`: SELECT, INSERT, and UPDATE of each column (column privileges allow UPDATE and
  `SELECT ... FOR UPDATE` but no table lock); a column added later must be granted the same way
  (`autoctx._store.tenancy` grants the columns `tables.py` lists);
- on `session_claims`: SELECT and UPDATE of `session_id` (a claim is `FOR UPDATE SKIP LOCKED`);
- on `working_set`: SELECT and INSERT;
- the rest as before (messages: SELECT, INSERT, UPDATE of `search_tsv`; events, offloads and
  lineage: SELECT, INSERT).

What needed DELETE goes through two functions that run with the owner's rights (SECURITY
DEFINER, with a fixed search path) and delete only what the caller could have deleted itself:
the rows of a session whose tenant the calling login holds (`session_user`, which a role
cannot change, is a member of a role granted the tenant) and which is the tenant its
transaction is scoped to, as the policies require; the owner's logins (application tenancy)
pass, as the owner passes the policies. `autoctx_unlink_working(session, message ids)` removes
working-set rows (all of them with NULL ids); `autoctx_delete_session(session, incarnation,
tenant, before)` deletes a session (the foreign keys cascade as the owner, as they always did). The
claim triggers of 0010 now run with the owner's rights too: they fire only for a row of
`sessions` the role may insert or delete, and the role no longer writes `session_claims`.
EXECUTE on the functions is revoked from PUBLIC and granted with a tenant.

Idempotency key. `messages.add_key` holds the key an `add()` was given (NULL without one) on
each message of that add, under a partial index: a retried add with the same key finds the
messages the first one stored instead of storing them again.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

GRANTS = "autoctx_tenant_grants"
UNLINK = "autoctx_unlink_working"
DELETE_SESSION = "autoctx_delete_session"
MAY_WRITE = "autoctx_login_may_write"
CLAIM_TRIGGERS = ("autoctx_claim_created()", "autoctx_claim_deleted()")
ADD_KEY_INDEX = "messages_add_key_idx"

#: The schema of autoctx's tables, quoted.
_SCHEMA = (
    "SELECT quote_ident(n.nspname) FROM pg_catalog.pg_class c "
    "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = 'sessions'::regclass"
)
_COLUMNS = (
    "SELECT quote_ident(attname) FROM pg_catalog.pg_attribute "
    "WHERE attrelid = 'sessions'::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum"
)


def _for_each_grantee(template: str) -> None:
    """Run `template` (one `%I` for the role) for every role granted a tenant (0006)."""
    op.execute(
        f"""
        DO $do$ DECLARE r record; BEGIN
            FOR r IN SELECT DISTINCT g.grantee FROM {GRANTS} g
                     JOIN pg_catalog.pg_roles o ON o.rolname = g.grantee LOOP
                EXECUTE format('{template}', r.grantee);
            END LOOP;
        END $do$"""
    )


def _functions(schema: str) -> None:
    # The policies' test (0006) for the calling login rather than `current_user`, which is the
    # owner inside a SECURITY DEFINER function. `session_user` is the role that logged in; only
    # a superuser can change it, and a role it is a member of is one it can SET ROLE to, so
    # this is exactly what the login could reach through the policies.
    op.execute(
        f"""
        CREATE FUNCTION {schema}.{MAY_WRITE}(p_tenant text) RETURNS boolean
        LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
            SELECT pg_has_role(session_user, c.relowner, 'MEMBER')
                OR (coalesce(p_tenant, '') = coalesce(current_setting('autoctx.tenant', true), '')
                    AND p_tenant IN (SELECT g.tenant FROM {schema}.{GRANTS} g
                                     JOIN pg_catalog.pg_roles r ON r.rolname = g.grantee
                                     WHERE pg_has_role(session_user, r.oid, 'MEMBER')))
            FROM pg_catalog.pg_class c WHERE c.oid = '{schema}.sessions'::regclass
        $fn$"""
    )
    op.execute(
        f"""
        CREATE FUNCTION {schema}.{UNLINK}(p_session text, p_ids bigint[])
        RETURNS TABLE (pos bigint, mid bigint)
        LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
            DELETE FROM {schema}.working_set w
            WHERE w.session_id = p_session
              AND (p_ids IS NULL OR w.message_id = ANY (p_ids))
              AND (SELECT {schema}.{MAY_WRITE}(s.tenant) FROM {schema}.sessions s
                   WHERE s.session_id = p_session)
            RETURNING w.position, w.message_id
        $fn$"""
    )
    op.execute(
        f"""
        CREATE FUNCTION {schema}.{DELETE_SESSION}(
            p_session text, p_incarnation uuid, p_tenant text, p_before timestamptz
        ) RETURNS SETOF {schema}.sessions
        LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
            DELETE FROM {schema}.sessions s
            WHERE s.session_id = p_session
              AND (p_incarnation IS NULL OR s.incarnation = p_incarnation)
              AND (p_tenant IS NULL OR s.tenant = p_tenant)
              AND (p_before IS NULL OR s.updated_at < p_before)
              AND {schema}.{MAY_WRITE}(s.tenant)
            RETURNING s.*
        $fn$"""
    )
    for function in (
        f"{MAY_WRITE}(text)",
        f"{UNLINK}(text, bigint[])",
        f"{DELETE_SESSION}(text, uuid, text, timestamptz)",
    ):
        op.execute(f"REVOKE ALL ON FUNCTION {schema}.{function} FROM PUBLIC")
    for trigger in CLAIM_TRIGGERS:
        op.execute(f"ALTER FUNCTION {schema}.{trigger} SECURITY DEFINER")


def upgrade() -> None:
    bind = op.get_bind()
    schema = bind.execute(sa.text(_SCHEMA)).scalar_one()
    columns = ", ".join(bind.execute(sa.text(_COLUMNS)).scalars())
    op.add_column("messages", sa.Column("add_key", sa.Text, nullable=True))
    op.execute(
        f"CREATE INDEX {ADD_KEY_INDEX} ON messages (session_id, add_key) WHERE add_key IS NOT NULL"
    )
    _functions(schema)
    # A table-level REVOKE takes the column privileges of its kind with it: revoke first.
    _for_each_grantee("REVOKE UPDATE, DELETE, TRUNCATE ON sessions, session_claims FROM %I")
    _for_each_grantee("REVOKE UPDATE, DELETE, TRUNCATE ON working_set FROM %I")
    _for_each_grantee(f"GRANT UPDATE ({columns}) ON sessions TO %I")
    _for_each_grantee("GRANT UPDATE (session_id) ON session_claims TO %I")
    _for_each_grantee(
        f"GRANT EXECUTE ON FUNCTION {schema}.{UNLINK}(text, bigint[]), "
        f"{schema}.{DELETE_SESSION}(text, uuid, text, timestamptz) TO %I"
    )


def downgrade() -> None:
    bind = op.get_bind()
    schema = bind.execute(sa.text(_SCHEMA)).scalar_one()
    _for_each_grantee("REVOKE UPDATE ON sessions, session_claims FROM %I")
    _for_each_grantee("GRANT UPDATE, DELETE ON sessions TO %I")
    _for_each_grantee("GRANT INSERT, UPDATE, DELETE ON session_claims TO %I")
    _for_each_grantee("GRANT DELETE ON working_set TO %I")
    for trigger in CLAIM_TRIGGERS:
        op.execute(f"ALTER FUNCTION {schema}.{trigger} SECURITY INVOKER")
    op.execute(f"DROP FUNCTION {schema}.{DELETE_SESSION}(text, uuid, text, timestamptz)")
    op.execute(f"DROP FUNCTION {schema}.{UNLINK}(text, bigint[])")
    op.execute(f"DROP FUNCTION {schema}.{MAY_WRITE}(text)")
    op.execute(f"DROP INDEX {ADD_KEY_INDEX}")
    op.drop_column("messages", "add_key")
