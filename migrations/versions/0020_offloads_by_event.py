"""Offloads found by their event: one masking pass is one event with an offload per output.

Until now an applied compression wrote one offload and named it in its event's
`offload_uuid`. A masking pass now writes one event for the whole pass (docs/design.md §7),
with an offload, a message and lineage rows for each output it masked, all carrying the
event's id; the event names no single offload. What a compression wrote is then read by its
event id (an undo, `dropped()`, the console's event page, the erasure's rebuild of previews),
which this index serves. It also serves the cascade from `compression_events` to `offloads`,
which had no index to follow.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-07
"""

from __future__ import annotations

from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("offloads_event_idx", "offloads", ["session_id", "event_id"])


def downgrade() -> None:
    op.drop_index("offloads_event_idx", table_name="offloads")
