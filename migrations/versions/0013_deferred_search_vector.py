"""The search vector leaves the append path: computed when a search first needs it.

Migrations 0008 and 0010 made `messages.search_tsv` a STORED generated column: every append
parsed its messages' text with `to_tsvector` and added them to the GIN index inside the
append's own statement. On the Agents SDK session's workload that parse was most of what
separated autoctx's append from the SDK's (docs/design.md §9; bench/README.md, peers.py): the
server spends more time in `to_tsvector` than in writing the rows.

Now the column is a plain one, NULL when a message is written, and filled by whichever search
first covers the message (`autoctx._store.search`): the search fills the vectors of the
originals still waiting in the sessions it reads, then queries. The rules stay what they were:

- One definition of the vector: the function `autoctx_search_vector(content, kind,
  search_config)`, whose body is 0010's generated expression as the database holds it (read
  from the catalog, not copied: the text of originals only, capped at 120,000 characters, each
  session's configuration); the downgrade reads it back from the function.
- Whatever writes a message row afterwards gets the vector of the row's new content: a trigger
  sets it on every UPDATE, whatever the statement set. An erasure (docs/design.md §9) that
  rewrites a message's content rewrites its vector in the same statement, so no code path can
  leave erased words in the index; and a role that may only fill vectors (below) cannot write
  a vector of its choosing, only have the true one computed.
- A message appended just now is found: a search reads the messages still waiting (the partial
  index `messages_unindexed_idx` holds exactly them) and computes their vectors in the query when
  it could not fill them (a read-only console, another search filling them at that moment).
- A role granted a tenant (0006) may UPDATE the column `search_tsv` of its tenant's messages,
  nothing else of them: with the trigger, that only ever computes the true vector.

`ALTER COLUMN ... DROP EXPRESSION` keeps every vector already computed and does not rewrite the
table. The downgrade makes the column generated again (it rewrites `messages` and rebuilds the
index under an exclusive lock, like 0010).

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

INDEX = "messages_search_idx"
WAITING_INDEX = "messages_unindexed_idx"
#: An original whose vector is not computed yet (the predicate of the partial index, which the
#: search repeats word for word so that PostgreSQL can use the index).
WAITING = "search_tsv IS NULL AND kind = 'original' AND search_config <> 'none'"
FUNCTION = "autoctx_search_vector"
TRIGGER_FUNCTION = "autoctx_search_vector_of_row"
TRIGGER = "autoctx_search_vector"

#: The schema of autoctx's tables, quoted.
_SCHEMA = (
    "SELECT quote_ident(n.nspname) FROM pg_catalog.pg_class c "
    "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = 'messages'::regclass"
)
#: The expression of 0010's generated column, as PostgreSQL keeps it (read, not copied: the
#: function computes exactly what the column did).
_GENERATED = (
    "SELECT pg_catalog.pg_get_expr(d.adbin, d.adrelid) FROM pg_catalog.pg_attrdef d "
    "JOIN pg_catalog.pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum "
    "WHERE d.adrelid = 'messages'::regclass AND a.attname = 'search_tsv'"
)


def _for_each_grantee(template: str) -> None:
    """Run `template` (one `%I` for the role) for every role granted a tenant (0006)."""
    op.execute(
        f"""
        DO $do$ DECLARE r record; BEGIN
            FOR r IN SELECT DISTINCT g.grantee FROM autoctx_tenant_grants g
                     JOIN pg_catalog.pg_roles o ON o.rolname = g.grantee LOOP
                EXECUTE format('{template}', r.grantee);
            END LOOP;
        END $do$"""
    )


def upgrade() -> None:
    bind = op.get_bind()
    schema = bind.execute(sa.text(_SCHEMA)).scalar_one()
    expression = bind.execute(sa.text(_GENERATED)).scalar_one()
    # Immutable (as the generated column's expression had to be) and plain SQL, so that the
    # planner inlines it into the statements that call it; its parameters carry the names of
    # the columns the expression reads.
    op.execute(
        f"CREATE FUNCTION {schema}.{FUNCTION}(content jsonb, kind text, search_config text) "
        f"RETURNS tsvector LANGUAGE sql IMMUTABLE PARALLEL SAFE RETURN {expression}"
    )
    op.execute(
        f"""
        CREATE FUNCTION {schema}.{TRIGGER_FUNCTION}() RETURNS trigger
        LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
        BEGIN
            -- Whatever the statement set: the vector of the row's content, or NULL.
            NEW.search_tsv := {schema}.{FUNCTION}(NEW.content, NEW.kind, NEW.search_config);
            RETURN NEW;
        END $fn$"""
    )
    op.execute("ALTER TABLE messages ALTER COLUMN search_tsv DROP EXPRESSION")
    op.execute(
        f"CREATE TRIGGER {TRIGGER} BEFORE UPDATE ON messages "
        f"FOR EACH ROW EXECUTE FUNCTION {schema}.{TRIGGER_FUNCTION}()"
    )
    op.execute(f"CREATE INDEX {WAITING_INDEX} ON messages (session_id, id) WHERE {WAITING}")
    _for_each_grantee("GRANT UPDATE (search_tsv) ON messages TO %I")


def downgrade() -> None:
    bind = op.get_bind()
    schema = bind.execute(sa.text(_SCHEMA)).scalar_one()
    function = f"{schema}.{FUNCTION}(jsonb, text, text)"
    # The function's body is 0010's expression over parameters named as the columns.
    body = bind.execute(
        sa.text(f"SELECT pg_catalog.pg_get_function_sqlbody('{function}'::regprocedure)")
    ).scalar_one()
    expression = body.strip().removeprefix("RETURN").strip()
    _for_each_grantee("REVOKE UPDATE (search_tsv) ON messages FROM %I")
    op.execute(f"DROP INDEX {WAITING_INDEX}")
    op.execute(f"DROP TRIGGER {TRIGGER} ON messages")
    op.execute(f"DROP FUNCTION {schema}.{TRIGGER_FUNCTION}()")
    # 0010's generated column again: every vector computed, waiting or not.
    op.execute(f"DROP INDEX {INDEX}")
    op.execute(
        "ALTER TABLE messages DROP COLUMN search_tsv, ADD COLUMN search_tsv tsvector "
        f"GENERATED ALWAYS AS ({expression}) STORED"
    )
    op.execute(f"DROP FUNCTION {function}")
    op.execute(
        f"CREATE INDEX {INDEX} ON messages USING gin (session_id, search_tsv) "
        "WHERE search_tsv IS NOT NULL"
    )
