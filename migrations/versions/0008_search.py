"""Full-text search over originals: a generated `tsvector` per message and a GIN index on it.

`messages.search_tsv` is a STORED generated column, so PostgreSQL writes it in the statement
that writes the row: an append indexes its messages in its own transaction, and whatever
rewrites `content` later (the erasure of docs/design.md §9) rewrites the vector with it; no code
path can forget it. It holds, for originals only (summaries and previews are derived text whose
facts are in the originals they replace, and indexing them would make every fact a hit twice),
the text of the message's blocks: text blocks, tool names, tool-call arguments, tool outputs.
Opaque blocks (images, audio, reasoning payloads) are not searched. The tokens are those of
PostgreSQL's default parser with two adjustments:

- the text comes out of JSONB as JSON text (a generated column may not use a subquery, which
  `jsonb_array_elements_text` would need), so its escapes are turned into separators: once for
  plain text, twice for tool arguments, which are JSON text inside the JSON (so that a file
  written through a tool call is searchable line by line, and `C:\\new` stays `new`);
- `/` is a separator, so that a path is searchable by each of its parts (`main.py` finds
  `/srv/app/main.py`; the search turns a query term with `/` into a phrase of its parts, so the
  whole path still matches only itself).

Only the first 100,000 characters of the text (and 50,000 of the arguments) are indexed: a
tsvector is limited to 1 MB, and PostgreSQL refuses the whole row, not just the vector, when a
message's text would exceed it (`max_message_chars` allows 2,000,000). At most about 6 bytes of
vector per character of text (unique one-character words of four-byte characters, each with its
separator), 150,000 characters stay under it.

The text search configuration is per message (`search_config`, the session's
`AutoContextConfig.search_config`, fixed when the session is created like its model; 'none' for
a session created with `search_config=None`, whose appends skip the vector and its cost). A
generated column may only call immutable functions, and the cast of a text to `regconfig` is
not one (it looks the name up); a column of type `regconfig` would be, but pg_upgrade refuses
tables with such columns. So the configuration is a text column checked against the
configurations PostgreSQL 15 ships, and the expression maps each name to its constant.

The index is GIN over `(session_id, search_tsv)` with the `btree_gin` operator class for the
text column: session_id leads it, as every index of a session table (docs/scaling.md), and a
search of one session is one index scan that intersects that session's entries with the
words'. A search over a tenant's sessions uses the same index on `search_tsv` alone (a
multicolumn GIN index serves a condition on any of its columns). `btree_gin` ships with
PostgreSQL's contrib and is a trusted extension: a role with CREATE on the database may
create it.

On an existing database, adding the column rewrites `messages` (every row's vector is computed)
and building the index reads it again, under an exclusive lock: plan the upgrade for a quiet
moment on a big database.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

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
INDEXED_CHARS = 100_000
#: Characters of a message's tool-call arguments that are indexed.
ARGUMENT_CHARS = 50_000
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
#: Plain text and arguments are capped apart (each evaluated once): 150,000 characters at most
#: in all, under the 1 MB of a tsvector even for the worst text (about 6 bytes of vector per
#: character, for unique one-character words of four-byte characters).
_WORDS = (
    f"{_plain_words(f'left({PLAIN}, {INDEXED_CHARS})')} || ' ' || "
    f"{_argument_words(f'left({ARGUMENTS}, {ARGUMENT_CHARS})')}"
)
SEARCH_VECTOR = (
    "CASE WHEN kind = 'original' AND search_config <> 'none' "
    f"THEN to_tsvector({_CONFIG}, translate({_WORDS}, '/', ' ')) END"
)


def upgrade() -> None:
    bind = op.get_bind()
    installed = bind.execute(
        sa.text("SELECT count(*) FROM pg_catalog.pg_extension WHERE extname = 'btree_gin'")
    ).scalar_one()
    if not installed:
        available = bind.execute(
            sa.text(
                "SELECT count(*) FROM pg_catalog.pg_available_extensions WHERE name = 'btree_gin'"
            )
        ).scalar_one()
        if not available:
            raise RuntimeError(
                "migration 0008 needs PostgreSQL's btree_gin extension, which this server does "
                "not have: install the server's contrib package (postgresql-contrib), then run "
                "`autoctx db upgrade` again"
            )
        op.execute("CREATE EXTENSION btree_gin")
    configs = ", ".join(f"'{c}'" for c in CONFIGS)
    op.add_column(
        "messages",
        sa.Column("search_config", sa.Text, nullable=False, server_default="simple"),
    )
    # 'none': a session created with `search_config=None`, whose messages get no vector.
    op.create_check_constraint(
        "messages_search_config", "messages", f"search_config IN ('none', {configs})"
    )
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


def downgrade() -> None:
    op.execute(f"DROP INDEX {INDEX}")
    op.drop_column("messages", "search_tsv")
    op.drop_constraint("messages_search_config", "messages")
    op.drop_column("messages", "search_config")
    # btree_gin stays: other objects of the database may use it by now.
