"""Core schema: sessions, messages, working set, offloads, lineage, compression events.

Every table carries session_id and it leads every primary key and index, so that a session's
rows live together and the schema can be distributed by session_id (docs/scaling.md).

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

ROLES = "('system', 'user', 'assistant', 'tool')"
KINDS = (
    "('original', 'tool_run_summary', 'preview', 'round_summary', 'large_summary', "
    "'current_round_summary')"
)
STATUSES = "('applied', 'skipped', 'failed', 'conflict')"


def _session_fk() -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(["session_id"], ["sessions.session_id"], ondelete="CASCADE")


def upgrade() -> None:
    now = sa.text("now()")
    op.create_table(
        "sessions",
        sa.Column("session_id", sa.Text, primary_key=True),
        sa.Column("tenant", sa.Text, nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=now),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=now),
        # Bumped by every committed change of the working context.
        sa.Column("version", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("message_count", sa.Integer, nullable=False, server_default="0"),
        sa.Column("token_count", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("model", sa.Text, nullable=False),
        sa.Column("encoding", sa.Text, nullable=False),
        sa.Column("config", pg.JSONB, nullable=False),
        sa.Column("plan", pg.JSONB, nullable=True),
        # Calls of the newest assistant message still without results (id -> tool name).
        sa.Column("open_calls", pg.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        # Per-session allocators: ids stay local to the session (no global sequence to shard).
        sa.Column("next_message_id", sa.BigInteger, nullable=False, server_default="1"),
        sa.Column("next_position", sa.BigInteger, nullable=False, server_default="1"),
        sa.Column("next_event_id", sa.BigInteger, nullable=False, server_default="1"),
        # The version at which the last compression call ended short of its target: a later
        # call at the same version does nothing (docs/design.md §2).
        sa.Column("settled_version", sa.BigInteger, nullable=True),
        sa.CheckConstraint("length(session_id) between 1 and 255", name="session_id_length"),
    )
    op.create_index("sessions_tenant_idx", "sessions", ["session_id", "tenant"])

    op.create_table(
        "messages",
        sa.Column("session_id", sa.Text, nullable=False),
        sa.Column("id", sa.BigInteger, nullable=False),
        sa.Column("role", sa.Text, nullable=False),
        sa.Column("name", sa.Text, nullable=True),
        sa.Column("content", pg.JSONB, nullable=False),
        sa.Column("metadata", pg.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("kind", sa.Text, nullable=False, server_default="original"),
        sa.Column("pinned", sa.Boolean, nullable=False, server_default=sa.false()),
        # Counts as a final answer (docs/design.md §1), recorded when written.
        sa.Column("final", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("tokens", sa.Integer, nullable=False),
        sa.Column("chars", sa.Integer, nullable=False),
        # Denormalized from content so that planning reads metadata only.
        sa.Column("call_ids", pg.ARRAY(sa.Text), nullable=False, server_default="{}"),
        sa.Column("result_ids", pg.ARRAY(sa.Text), nullable=False, server_default="{}"),
        sa.Column("tool_names", pg.ARRAY(sa.Text), nullable=False, server_default="{}"),
        # The compression event that made this message (NULL for originals).
        sa.Column("event_id", sa.BigInteger, nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=now),
        sa.PrimaryKeyConstraint("session_id", "id"),
        _session_fk(),
        sa.CheckConstraint(f"role in {ROLES}", name="messages_role"),
        sa.CheckConstraint(f"kind in {KINDS}", name="messages_kind"),
    )

    op.create_table(
        "working_set",
        sa.Column("session_id", sa.Text, nullable=False),
        # Order key. A compression replaces k >= 1 adjacent messages by one, which takes the
        # position of the first: a splice writes O(k) rows and never renumbers the session.
        sa.Column("position", sa.BigInteger, nullable=False),
        sa.Column("message_id", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("session_id", "position"),
        sa.UniqueConstraint("session_id", "message_id", name="working_set_message_key"),
        sa.ForeignKeyConstraint(
            ["session_id", "message_id"], ["messages.session_id", "messages.id"], ondelete="CASCADE"
        ),
    )

    op.create_table(
        "compression_events",
        sa.Column("session_id", sa.Text, nullable=False),
        sa.Column("id", sa.BigInteger, nullable=False),
        sa.Column("strategy", sa.SmallInteger, nullable=False),
        sa.Column("status", sa.Text, nullable=False),
        # Which trigger held: 'count' or 'tokens'.
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("messages_before", sa.Integer, nullable=False),
        sa.Column("messages_after", sa.Integer, nullable=False),
        sa.Column("tokens_before", sa.BigInteger, nullable=False),
        sa.Column("tokens_after", sa.BigInteger, nullable=False),
        sa.Column("replaced_ids", pg.ARRAY(sa.BigInteger), nullable=False, server_default="{}"),
        sa.Column("replaced_tokens", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("summary_message_id", sa.BigInteger, nullable=True),
        sa.Column("offload_uuid", pg.UUID(as_uuid=True), nullable=True),
        sa.Column("model", sa.Text, nullable=True),
        sa.Column("prompt_tokens", sa.Integer, nullable=True),
        sa.Column("completion_tokens", sa.Integer, nullable=True),
        sa.Column("latency_ms", sa.Float, nullable=True),
        sa.Column("error", sa.Text, nullable=True),
        # The session version this event's commit produced (or saw, when nothing was applied).
        sa.Column("session_version", sa.BigInteger, nullable=False),
        # The thresholds in force.
        sa.Column("config", pg.JSONB, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=now),
        sa.PrimaryKeyConstraint("session_id", "id"),
        _session_fk(),
        sa.CheckConstraint("strategy between 0 and 6", name="events_strategy"),
        sa.CheckConstraint(f"status in {STATUSES}", name="events_status"),
        sa.CheckConstraint("reason in ('count', 'tokens', 'manual')", name="events_reason"),
    )
    op.create_index("compression_events_status_idx", "compression_events", ["session_id", "status"])

    op.create_table(
        "offloads",
        sa.Column("session_id", sa.Text, nullable=False),
        sa.Column("uuid", pg.UUID(as_uuid=True), nullable=False),
        sa.Column("event_id", sa.BigInteger, nullable=False),
        # The removed messages, in working order (originals are stored once, in messages).
        sa.Column("message_ids", pg.ARRAY(sa.BigInteger), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=now),
        sa.PrimaryKeyConstraint("session_id", "uuid"),
        sa.ForeignKeyConstraint(
            ["session_id", "event_id"],
            ["compression_events.session_id", "compression_events.id"],
            ondelete="CASCADE",
        ),
    )

    op.create_table(
        "lineage",
        sa.Column("session_id", sa.Text, nullable=False),
        sa.Column("summary_id", sa.BigInteger, nullable=False),
        sa.Column("ordinal", sa.Integer, nullable=False),
        sa.Column("replaced_id", sa.BigInteger, nullable=False),
        sa.Column("event_id", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("session_id", "summary_id", "ordinal"),
        sa.ForeignKeyConstraint(
            ["session_id", "summary_id"], ["messages.session_id", "messages.id"], ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["session_id", "replaced_id"],
            ["messages.session_id", "messages.id"],
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["session_id", "event_id"],
            ["compression_events.session_id", "compression_events.id"],
            ondelete="CASCADE",
        ),
    )
    op.create_index("lineage_replaced_idx", "lineage", ["session_id", "replaced_id"])


def downgrade() -> None:
    for table in (
        "lineage",
        "offloads",
        "compression_events",
        "working_set",
        "messages",
        "sessions",
    ):
        op.drop_table(table)
