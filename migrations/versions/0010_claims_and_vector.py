"""Worker claims a tenant cannot take, and a search vector that never refuses a message.

Claims. A claim was a session-level advisory lock keyed by the hash of the session id.
Advisory locks need no privilege: any role, one granted a single tenant included, could take
the key of another tenant's session and hold it, and every worker skipped that session while
its agent waited at the window. A claim is now a row lock on the session's row of
`session_claims` (`SELECT ... FOR UPDATE SKIP LOCKED`, held by a transaction of its own for as
long as the compression runs). A row lock needs UPDATE on the table and a row the role can
see: the policy lets a granted role see only the claims of its own tenants' sessions, so it
cannot touch another tenant's claim with any SQL it can send (its writes are held to the same
rows: at worst it removes its own sessions' claims, which costs it the worker's help, nothing
else). The rows are written by triggers on `sessions`, as the role that writes the session
(no SECURITY DEFINER function: nothing runs with the owner's rights): one per session id, made
when a session is created (by any path: open, fork, import); deleting a session deletes its
claim unless a compression still holds it (then the row stays, an orphan that a session created
again under the same id takes over). No foreign key: a cascade would make a delete wait for a
running compression.

Search vector. Migration 0008 capped the indexed text at 150,000 characters, assuming at most
about 6 bytes of vector per character. Hyphenated words break that: `ab-cd` gives the lexemes
`ab-cd`, `ab` and `cd`, so each character is stored twice, and with four-byte characters (CJK
extension B) and unique words the vector's text costs close to 8 bytes a character: 136,444
characters of such words are already over the limit (measured with `to_tsvector('simple', ...)`
on PostgreSQL 15). The bound is 8 (4 bytes in the compound, 4 in its part; the per-lexeme
overhead is paid for by the separators). The cap is now 80,000 characters of plain text and
40,000 of tool-call arguments, 120,000 in all, at most 960,000 bytes: under the 1 MB limit for
any text, so the index never refuses a message the rest of autoctx accepts. What lies beyond the
cap is stored and reloadable, not searchable.

PostgreSQL 15 cannot change a generated column's expression in place: the column and its index
are dropped and made again, which rewrites `messages` and rebuilds the index under an exclusive
lock (plan the upgrade for a quiet moment on a big database).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

CLAIMS = "session_claims"
GRANTS = "autoctx_tenant_grants"
POLICY = "autoctx_tenant_isolation"

#: As in 0006 (copied, not imported).
CURRENT_TENANT = "coalesce(current_setting('autoctx.tenant', true), '')"
_HOLDS = "pg_catalog.pg_has_role(current_user, {role_oid}, 'USAGE')"
MY_TENANTS = (
    f"SELECT g.tenant FROM {GRANTS} g JOIN pg_catalog.pg_roles r ON r.rolname = g.grantee "
    f"WHERE {_HOLDS.format(role_oid='r.oid')}"
)
IS_OWNER = _HOLDS.format(
    role_oid="(SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = 'sessions'::regclass)"
)
CLAIM_VISIBLE = (
    f"EXISTS (SELECT 1 FROM sessions s WHERE s.session_id = {CLAIMS}.session_id "
    f"AND coalesce(s.tenant, '') = {CURRENT_TENANT} "
    f"AND ({IS_OWNER} OR s.tenant IN ({MY_TENANTS})))"
)

#: The text search configurations of PostgreSQL 15 (the oldest server autoctx supports; 18
#: adds `estonian`). A migration is a snapshot of its time: autoctx._search copies this list.
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
#: Characters of a message's text that are indexed (see the module docstring).
INDEXED_CHARS = 80_000
#: Characters of a message's tool-call arguments that are indexed.
ARGUMENT_CHARS = 40_000
INDEX = "messages_search_idx"


def _strings(*paths: str) -> str:
    """The JSON text of an array of the string values `paths` select from `content`."""
    arrays = " || ".join(f"jsonb_path_query_array(content, '{p}')" for p in paths)
    return f"({arrays})::text"


#: Text blocks, tool names, tool outputs (a string, or a list of text parts).
PLAIN = _strings(
    "$[*].text", "$[*].name", '$[*].output ? (@.type() == "string")', "$[*].output[*].text"
)
#: Tool-call arguments: JSON text, stored as a JSON string.
ARGUMENTS = _strings("$[*].arguments")
#: What follows the backslash of a JSON escape (`\uXXXX` keeps its digits, which become a
#: word of their own: jsonb writes that form only for control characters).
_ESCAPES = ('"', "/", "b", "f", "n", "r", "t", "u")
#: Stands for a backslash of the first level while the second is decoded (a private-use
#: character: one in the text itself only becomes a separator).
_MARK = "U&'\\E000'"


def _replace(text: str, old: str, new: str = "' '") -> str:
    # replace(), not regexp_replace(): a plain scan, several times cheaper per message.
    return f"replace({text}, {old}, {new})"


def _first_level(text: str, backslash: str) -> str:
    """`text` with each JSON escape a separator, and each escaped backslash `backslash`.
    Pairs go first, from the left (as replace() scans), so that `\\n` is a backslash then n."""
    out = _replace(text, r"'\\'", backslash)
    for e in _ESCAPES:
        out = _replace(out, "'\\" + e.replace("'", "''") + "'")
    return out


def _plain_words(text: str) -> str:
    return _first_level(text, "' '")


def _argument_words(text: str) -> str:
    # JSON text inside the JSON: decode the first level, keeping its backslashes as a mark,
    # then the second level on the marks.
    out = _replace(_first_level(text, _MARK), "U&'\\E000\\E000'")
    for e in _ESCAPES:
        out = _replace(out, "U&'\\E000" + e.replace("'", "''") + "'")
    return _replace(out, _MARK)


_CONFIG = (
    "CASE search_config " + " ".join(f"WHEN '{c}' THEN '{c}'::regconfig" for c in CONFIGS) + " END"
)
#: Plain text and arguments are capped apart (each evaluated once): 120,000 characters at most
#: in all, under the 1 MB of a tsvector even for the worst text (under 8 bytes a character, see
#: the module docstring).
_WORDS = (
    f"{_plain_words(f'left({PLAIN}, {INDEXED_CHARS})')} || ' ' || "
    f"{_argument_words(f'left({ARGUMENTS}, {ARGUMENT_CHARS})')}"
)
SEARCH_VECTOR = (
    "CASE WHEN kind = 'original' AND search_config <> 'none' "
    f"THEN to_tsvector({_CONFIG}, translate({_WORDS}, '/', ' ')) END"
)


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


def _schema() -> str:
    bind = op.get_bind()
    quote = bind.dialect.identifier_preparer.quote_identifier
    name = bind.execute(
        sa.text(
            "SELECT n.nspname FROM pg_catalog.pg_class c "
            "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.oid = 'sessions'::regclass"
        )
    ).scalar_one()
    return str(quote(name))


def _claims_upgrade() -> None:
    op.create_table(CLAIMS, sa.Column("session_id", sa.Text, primary_key=True))
    op.execute(f"REVOKE ALL ON {CLAIMS} FROM PUBLIC")
    op.execute(f"ALTER TABLE {CLAIMS} ENABLE ROW LEVEL SECURITY")
    # A granted role sees, locks and writes the claims of its own tenants' sessions only.
    op.execute(
        f"CREATE POLICY {POLICY} ON {CLAIMS} FOR ALL "
        f"USING ({CLAIM_VISIBLE}) WITH CHECK ({CLAIM_VISIBLE})"
    )
    schema = _schema()
    op.execute(
        f"""
        CREATE FUNCTION {schema}.autoctx_claim_created() RETURNS trigger
        LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
        BEGIN
            INSERT INTO {schema}.{CLAIMS} (session_id) VALUES (NEW.session_id)
            ON CONFLICT (session_id) DO NOTHING;
            RETURN NULL;
        END $fn$"""
    )
    op.execute(
        f"""
        CREATE FUNCTION {schema}.autoctx_claim_deleted() RETURNS trigger
        LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
        BEGIN
            -- Before the session goes, while the policy still shows its claim to a granted
            -- role. A claim a compression holds stays (an orphan): the delete never waits.
            DELETE FROM {schema}.{CLAIMS} c
            WHERE c.session_id = OLD.session_id
              AND c.session_id IN (SELECT l.session_id FROM {schema}.{CLAIMS} l
                                   WHERE l.session_id = OLD.session_id
                                   FOR UPDATE SKIP LOCKED);
            RETURN OLD;
        END $fn$"""
    )
    op.execute(
        "CREATE TRIGGER autoctx_claim_created AFTER INSERT ON sessions "
        f"FOR EACH ROW EXECUTE FUNCTION {schema}.autoctx_claim_created()"
    )
    op.execute(
        "CREATE TRIGGER autoctx_claim_deleted BEFORE DELETE ON sessions "
        f"FOR EACH ROW EXECUTE FUNCTION {schema}.autoctx_claim_deleted()"
    )
    op.execute(f"INSERT INTO {CLAIMS} (session_id) SELECT session_id FROM sessions")
    # A row lock needs UPDATE (FOR UPDATE) and SELECT; the triggers insert and delete as the
    # role that writes the session.
    for role in _grantees():
        op.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {CLAIMS} TO {role}")


def _replace_vector(expression: str) -> None:
    op.execute(f"DROP INDEX {INDEX}")
    op.drop_column("messages", "search_tsv")
    op.add_column(
        "messages",
        sa.Column(
            "search_tsv",
            sa.dialects.postgresql.TSVECTOR,
            sa.Computed(expression, persisted=True),
        ),
    )
    op.execute(
        f"CREATE INDEX {INDEX} ON messages USING gin (session_id, search_tsv) "
        "WHERE search_tsv IS NOT NULL"
    )


def upgrade() -> None:
    _claims_upgrade()
    _replace_vector(SEARCH_VECTOR)


def downgrade() -> None:
    _replace_vector(
        SEARCH_VECTOR.replace(f"{INDEXED_CHARS})", "100000)").replace(
            f"{ARGUMENT_CHARS})", "50000)"
        )
    )
    schema = _schema()
    op.execute("DROP TRIGGER autoctx_claim_deleted ON sessions")
    op.execute("DROP TRIGGER autoctx_claim_created ON sessions")
    op.execute(f"DROP FUNCTION {schema}.autoctx_claim_deleted()")
    op.execute(f"DROP FUNCTION {schema}.autoctx_claim_created()")
    op.drop_table(CLAIMS)
