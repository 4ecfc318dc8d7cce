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
  search_config)`, 0010's expression as it was (the text of originals only, capped at 120,000
  characters, each session's configuration).
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

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

GRANTS = "autoctx_tenant_grants"
INDEX = "messages_search_idx"
WAITING_INDEX = "messages_unindexed_idx"
#: An original whose vector is not computed yet (the predicate of the partial index, which the
#: search repeats word for word so that PostgreSQL can use the index).
WAITING = "search_tsv IS NULL AND kind = 'original' AND search_config <> 'none'"
FUNCTION = "autoctx_search_vector"
TRIGGER_FUNCTION = "autoctx_search_vector_of_row"
TRIGGER = "autoctx_search_vector"

#: The text search configurations of PostgreSQL 15 (as in 0008 and 0010; copied, not imported).
CONFIGS = (
    "simple",
    "arabic",
    "armenian",
    "basque",
    "catalan",
    "danish",
    "dutch",
    "english",
    "finnish",
    "french",
    "german",
    "greek",
    "hindi",
    "hungarian",
    "indonesian",
    "irish",
    "italian",
    "lithuanian",
    "nepali",
    "norwegian",
    "portuguese",
    "romanian",
    "russian",
    "serbian",
    "spanish",
    "swedish",
    "tamil",
    "turkish",
    "yiddish",
)
#: 0010's caps: 80,000 characters of plain text and 40,000 of tool-call arguments.
INDEXED_CHARS = 80_000
ARGUMENT_CHARS = 40_000


def _strings(*paths: str) -> str:
    arrays = " || ".join(f"jsonb_path_query_array(content, '{p}')" for p in paths)
    return f"({arrays})::text"


PLAIN = _strings(
    "$[*].text", "$[*].name", '$[*].output ? (@.type() == "string")', "$[*].output[*].text"
)
ARGUMENTS = _strings("$[*].arguments")
_ESCAPES = ('"', "/", "b", "f", "n", "r", "t", "u")
_MARK = "U&'\\E000'"


def _replace(text: str, old: str, new: str = "' '") -> str:
    return f"replace({text}, {old}, {new})"


def _first_level(text: str, backslash: str) -> str:
    out = _replace(text, r"'\\'", backslash)
    for e in _ESCAPES:
        out = _replace(out, "'\\" + e.replace("'", "''") + "'")
    return out


def _argument_words(text: str) -> str:
    out = _replace(_first_level(text, _MARK), "U&'\\E000\\E000'")
    for e in _ESCAPES:
        out = _replace(out, "U&'\\E000" + e.replace("'", "''") + "'")
    return _replace(out, _MARK)


_CONFIG = (
    "CASE search_config " + " ".join(f"WHEN '{c}' THEN '{c}'::regconfig" for c in CONFIGS) + " END"
)
_PLAIN_WORDS = _first_level(f"left({PLAIN}, {INDEXED_CHARS})", "' '")
_WORDS = f"{_PLAIN_WORDS} || ' ' || {_argument_words(f'left({ARGUMENTS}, {ARGUMENT_CHARS})')}"
#: 0010's expression over the columns `content`, `kind` and `search_config` (the function's
#: parameters carry the same names).
SEARCH_VECTOR = (
    "CASE WHEN kind = 'original' AND search_config <> 'none' "
    f"THEN to_tsvector({_CONFIG}, translate({_WORDS}, '/', ' ')) END"
)


def _schema() -> str:
    bind = op.get_bind()
    quote = bind.dialect.identifier_preparer.quote_identifier
    name = bind.execute(
        sa.text(
            "SELECT n.nspname FROM pg_catalog.pg_class c "
            "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.oid = 'messages'::regclass"
        )
    ).scalar_one()
    return str(quote(name))


def _grantees() -> list[str]:
    bind = op.get_bind()
    quote = bind.dialect.identifier_preparer.quote_identifier
    rows = bind.execute(
        sa.text(
            f"SELECT DISTINCT g.grantee FROM {GRANTS} g "
            "JOIN pg_catalog.pg_roles r ON r.rolname = g.grantee"
        )
    ).scalars()
    return [quote(r) for r in rows]


def upgrade() -> None:
    schema = _schema()
    # Immutable (as the generated column's expression had to be) and plain SQL, so that the
    # planner inlines it into the statements that call it.
    op.execute(
        f"CREATE FUNCTION {schema}.{FUNCTION}(content jsonb, kind text, search_config text) "
        "RETURNS tsvector LANGUAGE sql IMMUTABLE PARALLEL SAFE "
        f"RETURN {SEARCH_VECTOR}"
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
    for role in _grantees():
        op.execute(f"GRANT UPDATE (search_tsv) ON messages TO {role}")


def downgrade() -> None:
    schema = _schema()
    for role in _grantees():
        op.execute(f"REVOKE UPDATE (search_tsv) ON messages FROM {role}")
    op.execute(f"DROP INDEX {WAITING_INDEX}")
    op.execute(f"DROP TRIGGER {TRIGGER} ON messages")
    op.execute(f"DROP FUNCTION {schema}.{TRIGGER_FUNCTION}()")
    op.execute(f"DROP FUNCTION {schema}.{FUNCTION}(jsonb, text, text)")
    # 0010's generated column again: every vector computed, waiting or not.
    op.execute(f"DROP INDEX {INDEX}")
    op.drop_column("messages", "search_tsv")
    op.add_column(
        "messages",
        sa.Column(
            "search_tsv",
            sa.dialects.postgresql.TSVECTOR,
            sa.Computed(SEARCH_VECTOR, persisted=True),
        ),
    )
    op.execute(
        f"CREATE INDEX {INDEX} ON messages USING gin (session_id, search_tsv) "
        "WHERE search_tsv IS NOT NULL"
    )
