"""Offload handles: a short, per-session number that names an offload in the model's view.

The offload tag named its offload by uuid (`<!-- CONTEXT_OFFLOAD: uuid=... -->`, about 45
tokens); a masked tool output paid that on every preview, and over a long task the tags alone
outgrew the token target (docs/design.md §4). The tag now names the offload by its handle
(`<!-- offload 12 -->`, at most 8 tokens): the uuid stays the offload's key, and the handle is
an alias, unique within the session.

- `offloads.handle`: the handle, unique per session. Existing offloads are numbered 1, 2, ...
  in each session by their event (and uuid, for two offloads of one event, which no version of
  autoctx writes), so a session's old offloads have handles too; their tags keep their uuids,
  which still reload.
- `sessions.next_handle`: the next handle the session gives, past every handle in use, as
  `next_message_id` is for message ids. A compression takes its handles from it in the
  transaction that applies it. The roles granted a tenant get UPDATE on it, as on every other
  column of `sessions` (0014).

The downgrade drops both: the tags written with handles no longer name anything reloadable
after it (their offloads stay, by uuid).

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("offloads", sa.Column("handle", sa.BigInteger, nullable=True))
    op.add_column(
        "sessions", sa.Column("next_handle", sa.BigInteger, nullable=False, server_default="1")
    )
    op.execute(
        """
        UPDATE offloads o SET handle = n.handle
        FROM (
            SELECT session_id, uuid,
                   row_number() OVER (PARTITION BY session_id ORDER BY event_id, uuid) AS handle
            FROM offloads
        ) n
        WHERE o.session_id = n.session_id AND o.uuid = n.uuid
        """
    )
    op.execute(
        """
        UPDATE sessions s SET next_handle = m.top + 1
        FROM (SELECT session_id, max(handle) AS top FROM offloads GROUP BY session_id) m
        WHERE s.session_id = m.session_id
        """
    )
    # A role granted a tenant updates `sessions` column by column (0014): it moves the counter.
    op.execute(
        """
        DO $do$ DECLARE r record; BEGIN
            FOR r IN SELECT DISTINCT g.grantee FROM autoctx_tenant_grants g
                     JOIN pg_catalog.pg_roles o ON o.rolname = g.grantee LOOP
                EXECUTE format('GRANT UPDATE (next_handle) ON sessions TO %I', r.grantee);
            END LOOP;
        END $do$"""
    )
    op.alter_column("offloads", "handle", nullable=False)
    op.create_unique_constraint("offloads_handle_key", "offloads", ["session_id", "handle"])
    op.create_check_constraint("offloads_handle_positive", "offloads", "handle >= 1")


def downgrade() -> None:
    op.drop_constraint("offloads_handle_positive", "offloads", type_="check")
    op.drop_constraint("offloads_handle_key", "offloads", type_="unique")
    op.drop_column("offloads", "handle")
    op.drop_column("sessions", "next_handle")
