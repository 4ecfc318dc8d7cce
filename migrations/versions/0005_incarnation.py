"""Session incarnations, and clearing as an event.

A session id names one incarnation (docs/design.md §5): `sessions.incarnation` is a random id
given when the row is created, so a session deleted and created again under the same id is a
different incarnation. Every statement of a memory names the incarnation it opened; a memory
whose session was deleted (and perhaps recreated, by anyone) finds no row and gets
`SessionNotFound`, instead of reading or writing the new session.

`clear` is the reason of the event that records a cleared working context (the originals,
offloads and lineage stay: clearing is not deleting).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_REASONS_BEFORE = "('count', 'tokens', 'manual', 'fallback')"
_REASONS = "('count', 'tokens', 'manual', 'fallback', 'clear')"


def _replace_reasons(condition: str) -> None:
    op.drop_constraint("events_reason", "compression_events", type_="check")
    op.create_check_constraint("events_reason", "compression_events", f"reason in {condition}")


def upgrade() -> None:
    # gen_random_uuid() is built in since PostgreSQL 13; existing rows each get their own.
    op.add_column(
        "sessions",
        sa.Column(
            "incarnation",
            pg.UUID(as_uuid=True),
            nullable=False,
            server_default=sa.text("gen_random_uuid()"),
        ),
    )
    _replace_reasons(_REASONS)


def downgrade() -> None:
    op.execute("DELETE FROM compression_events WHERE reason = 'clear'")
    _replace_reasons(_REASONS_BEFORE)
    op.drop_column("sessions", "incarnation")
