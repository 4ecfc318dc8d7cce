"""What an erasure needs to reach every copy: a counter the caches check, and fork ancestry.

- `sessions.erasures` counts the erasures of the session (incarnation). An erasure rewrites
  messages in place under their ids, so a cache keyed by message id (the Agents SDK adapter's
  items) would serve the erased text; every such cache is keyed by this counter too, and any
  process sees that an erasure happened in the one short read it makes anyway.
- `sessions.fork_ancestry` holds the incarnations of every session a fork descends from, the
  root first and its parent last (`forked_from_incarnation` is the last one). An erasure finds
  the forks that keep copies by this array, so that the fork of a fork whose middle session was
  deleted is still found. Existing forks get theirs from the `forked_from` chain (a chain
  whose link is gone starts at the missing parent).
- `messages_context_answers_idx` is a partial index of the tool results that answer autoctx's
  context tools (`context_search`, `context_reload`): an erasure looks for the answers that
  quoted what it erases among them, in every session of the tenant, without reading every
  message (3 s for 500,000 messages without it).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

#: The tool results that answer autoctx's context tools (results take their tool's name).
ANSWERS_WHERE = "role = 'tool' AND tool_names && ARRAY['context_search', 'context_reload']"

_BACKFILL = """
WITH RECURSIVE a(session_id, incarnation, ancestry) AS (
    SELECT s.session_id, s.incarnation,
           CASE WHEN s.forked_from_incarnation IS NULL THEN ARRAY[]::uuid[]
                ELSE ARRAY[s.forked_from_incarnation] END
    FROM sessions s
    WHERE NOT EXISTS (
        SELECT 1 FROM sessions p
        WHERE p.session_id = s.forked_from AND p.incarnation = s.forked_from_incarnation
    )
  UNION
    SELECT c.session_id, c.incarnation, a.ancestry || a.incarnation
    FROM a JOIN sessions c
      ON c.forked_from = a.session_id AND c.forked_from_incarnation = a.incarnation
    WHERE NOT c.incarnation = ANY(a.ancestry)
)
UPDATE sessions s SET fork_ancestry = a.ancestry
FROM a WHERE s.session_id = a.session_id AND cardinality(a.ancestry) > 0
"""


def upgrade() -> None:
    op.add_column(
        "sessions", sa.Column("erasures", sa.BigInteger, nullable=False, server_default="0")
    )
    op.add_column(
        "sessions",
        sa.Column("fork_ancestry", pg.ARRAY(pg.UUID), nullable=False, server_default="{}"),
    )
    op.execute(_BACKFILL)
    op.execute(
        "CREATE INDEX messages_context_answers_idx ON messages (session_id, id) "
        f"WHERE {ANSWERS_WHERE}"
    )


def downgrade() -> None:
    op.drop_index("messages_context_answers_idx", table_name="messages")
    op.drop_column("sessions", "fork_ancestry")
    op.drop_column("sessions", "erasures")
