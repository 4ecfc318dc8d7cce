"""Search reads a model's reasoning: thinking blocks and reasoning items are indexed text.

Reasoning is stored losslessly as opaque blocks (docs/design.md §1): an Anthropic `thinking`
block (Pydantic AI's thinking parts take its shape, and AgentScope's thinking blocks are kept
under its key), a Responses API `reasoning` item (its summary and content texts) and
LangChain's standard `reasoning` block. The vector of 0010 read text blocks, tool names,
outputs and arguments only, so a word that occurred only in a model's reasoning was never
found. Now the reasoning's text is part of the plain text the vector reads, after the rest
and under the same 80,000-character cap, so the bound of 0010 (a vector under 1 MB for any
message) holds unchanged. A redacted thinking block holds no text to index (its data is
encrypted), nor does a reasoning item's `encrypted_content`.

The function `autoctx_search_vector` (0013) is replaced, and the vectors of the originals
that hold reasoning are computed again (the trigger of 0013 computes the vector of any updated
row), so sessions written before this migration find their reasoning too. The downgrade puts
0010's expression back and recomputes the same rows.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

FUNCTION = "autoctx_search_vector"

#: As in 0010 (copied, not imported: a migration is a snapshot of its time).
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
INDEXED_CHARS = 80_000
ARGUMENT_CHARS = 40_000

#: 0010's plain text: text blocks, tool names, tool outputs (a string, or a list of text parts).
PLAIN_PATHS = (
    "$[*].text",
    "$[*].name",
    '$[*].output ? (@.type() == "string")',
    "$[*].output[*].text",
)
#: The text of a model's reasoning, as autoctx stores each kind (an opaque block's `data`).
REASONING_PATHS = (
    '$[*].data ? (@.type == "thinking").thinking',
    '$[*].data.agentscope ? (@.type == "thinking").thinking',
    '$[*].data ? (@.type == "reasoning").summary[*].text',
    '$[*].data ? (@.type == "reasoning").content[*].text',
    '$[*].data ? (@.type == "reasoning").reasoning ? (@.type() == "string")',
)
_ESCAPES = ('"', "/", "b", "f", "n", "r", "t", "u")
_MARK = "U&'\\E000'"


def _strings(paths: tuple[str, ...]) -> str:
    """The JSON text of an array of the string values `paths` select from `content`."""
    arrays = " || ".join(f"jsonb_path_query_array(content, '{p}')" for p in paths)
    return f"({arrays})::text"


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


def search_vector(plain_paths: tuple[str, ...]) -> str:
    """0010's vector over the plain text `plain_paths` select (and the arguments)."""
    plain = _first_level(f"left({_strings(plain_paths)}, {INDEXED_CHARS})", "' '")
    arguments = _argument_words(f"left({_strings(('$[*].arguments',))}, {ARGUMENT_CHARS})")
    words = f"{plain} || ' ' || {arguments}"
    return (
        "CASE WHEN kind = 'original' AND search_config <> 'none' "
        f"THEN to_tsvector({_CONFIG}, translate({words}, '/', ' ')) END"
    )


#: The originals whose vector the reasoning changes: those holding a reasoning block.
_WITH_REASONING = (
    "UPDATE messages SET search_tsv = NULL WHERE kind = 'original' AND search_config <> 'none' "
    'AND content @? \'$[*].data ? (@.type == "thinking" || @.type == "reasoning" '
    '|| @.agentscope.type == "thinking")\''
)
#: The schema of autoctx's tables, quoted (as in 0013).
_SCHEMA = (
    "SELECT quote_ident(n.nspname) FROM pg_catalog.pg_class c "
    "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = 'messages'::regclass"
)


def _define(expression: str) -> None:
    schema = op.get_bind().execute(sa.text(_SCHEMA)).scalar_one()
    op.execute(
        f"CREATE OR REPLACE FUNCTION {schema}.{FUNCTION}"
        "(content jsonb, kind text, search_config text) "
        f"RETURNS tsvector LANGUAGE sql IMMUTABLE PARALLEL SAFE RETURN {expression}"
    )
    # The trigger (0013) computes each updated row's vector with the function just defined.
    op.execute(_WITH_REASONING)


def upgrade() -> None:
    _define(search_vector(PLAIN_PATHS + REASONING_PATHS))


def downgrade() -> None:
    _define(search_vector(PLAIN_PATHS))
