"""Undo: a compression's originals put back in place of its replacement.

- `undo` is the reason of the event that records it (strategy 0, like a pop or a clear):
  `mem.undo(event_id)` and `autoctx undo` (docs/design.md §7).
- `compression_events.undoes` is the id of the compression an undo took back (NULL on every
  other event): the lineage of an undo is one join, the undo's event to the compression's,
  whose offload and lineage rows name what came back.
- `autoctx_undos` lists every undo with the compression it took back: its strategy, the
  tokens it had saved and the tokens the undo gave back, whether it was forced over the
  window. A role granted a tenant (0006) may read it, as it reads the other views.
- A partial index (session_id) on the undo events: the compressor reads a session's undone
  ranges when a call fires, so that it does not plan them again (docs/design.md §7), and that
  read must not scan every event of a long session.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

_REASONS_BEFORE = "('count', 'tokens', 'manual', 'fallback', 'clear', 'fork', 'erase')"
_REASONS = "('count', 'tokens', 'manual', 'fallback', 'clear', 'fork', 'erase', 'undo')"
GRANTS = "autoctx_tenant_grants"

UNDOS = """
CREATE VIEW autoctx_undos WITH (security_invoker = true) AS
SELECT
    u.session_id,
    u.id AS undo_event_id,
    u.undoes AS undone_event_id,
    c.strategy AS undone_strategy,
    c.summary_message_id AS removed_message_id,
    c.replaced_ids AS restored_ids,
    c.offload_uuid AS restored_offload_uuid,
    c.tokens_before - c.tokens_after AS tokens_saved_by_compression,
    u.tokens_after - u.tokens_before AS tokens_given_back,
    u.note IS NOT NULL AS forced,
    u.tokens_after,
    u.created_at AS undone_at
FROM compression_events u
JOIN compression_events c ON c.session_id = u.session_id AND c.id = u.undoes
WHERE u.reason = 'undo' AND u.status = 'applied' AND NOT u.inherited
"""


def _replace_reasons(condition: str) -> None:
    op.drop_constraint("events_reason", "compression_events", type_="check")
    op.create_check_constraint("events_reason", "compression_events", f"reason in {condition}")


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
    op.add_column("compression_events", sa.Column("undoes", sa.BigInteger, nullable=True))
    _replace_reasons(_REASONS)
    op.create_index(
        "compression_events_undo_idx",
        "compression_events",
        ["session_id"],
        postgresql_where=sa.text("reason = 'undo'"),
    )
    op.execute(UNDOS)
    for role in _grantees():
        op.execute(f"GRANT SELECT ON autoctx_undos TO {role}")


def downgrade() -> None:
    op.execute("DROP VIEW autoctx_undos")
    op.drop_index("compression_events_undo_idx", "compression_events")
    # An undo has no meaning before this revision; the working set it wrote stays (the
    # originals it put back are ordinary working messages).
    op.execute("DELETE FROM compression_events WHERE reason = 'undo'")
    _replace_reasons(_REASONS_BEFORE)
    op.drop_column("compression_events", "undoes")
