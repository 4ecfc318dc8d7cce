"""SQLAlchemy Core descriptions of the tables the migrations create (for queries only).

The schema itself is created and changed only by the Alembic migrations in `migrations/`; a test
checks that these descriptions match what the migrations build.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

metadata = sa.MetaData()

sessions = sa.Table(
    "sessions",
    metadata,
    sa.Column("session_id", sa.Text, primary_key=True),
    sa.Column("tenant", sa.Text),
    sa.Column("created_at", sa.DateTime(timezone=True)),
    sa.Column("updated_at", sa.DateTime(timezone=True)),
    sa.Column("version", sa.BigInteger),
    sa.Column("message_count", sa.Integer),
    sa.Column("token_count", sa.BigInteger),
    sa.Column("model", sa.Text),
    sa.Column("encoding", sa.Text),
    sa.Column("config", pg.JSONB),
    sa.Column("plan", pg.JSONB),
    sa.Column("open_calls", pg.JSONB),
    sa.Column("next_message_id", sa.BigInteger),
    sa.Column("next_position", sa.BigInteger),
    sa.Column("next_event_id", sa.BigInteger),
    sa.Column("settled_version", sa.BigInteger),
    sa.Column("incarnation", pg.UUID(as_uuid=True)),
    # Where a fork came from (migration 0009): the parent session, its incarnation, and the
    # last message of its working context the fork started from.
    sa.Column("forked_from", sa.Text),
    sa.Column("forked_from_incarnation", pg.UUID(as_uuid=True)),
    sa.Column("forked_at_message", sa.BigInteger),
)

messages = sa.Table(
    "messages",
    metadata,
    sa.Column("session_id", sa.Text, primary_key=True),
    sa.Column("id", sa.BigInteger, primary_key=True),
    sa.Column("role", sa.Text),
    sa.Column("name", sa.Text),
    sa.Column("content", pg.JSONB),
    sa.Column("metadata", pg.JSONB),
    sa.Column("kind", sa.Text),
    sa.Column("pinned", sa.Boolean),
    sa.Column("final", sa.Boolean),
    sa.Column("tokens", sa.Integer),
    sa.Column("chars", sa.Integer),
    sa.Column("call_ids", pg.ARRAY(sa.Text)),
    sa.Column("result_ids", pg.ARRAY(sa.Text)),
    sa.Column("tool_names", pg.ARRAY(sa.Text)),
    sa.Column("event_id", sa.BigInteger),
    sa.Column("created_at", sa.DateTime(timezone=True)),
    #: The erasure event that tombstoned this original or rewrote this summary (0009).
    sa.Column("erased_by", sa.BigInteger),
)

working_set = sa.Table(
    "working_set",
    metadata,
    sa.Column("session_id", sa.Text, primary_key=True),
    sa.Column("position", sa.BigInteger, primary_key=True),
    sa.Column("message_id", sa.BigInteger),
)

compression_events = sa.Table(
    "compression_events",
    metadata,
    sa.Column("session_id", sa.Text, primary_key=True),
    sa.Column("id", sa.BigInteger, primary_key=True),
    sa.Column("strategy", sa.SmallInteger),
    sa.Column("status", sa.Text),
    sa.Column("reason", sa.Text),
    sa.Column("messages_before", sa.Integer),
    sa.Column("messages_after", sa.Integer),
    sa.Column("tokens_before", sa.BigInteger),
    sa.Column("tokens_after", sa.BigInteger),
    sa.Column("replaced_ids", pg.ARRAY(sa.BigInteger)),
    sa.Column("replaced_tokens", sa.BigInteger),
    sa.Column("summary_message_id", sa.BigInteger),
    sa.Column("offload_uuid", pg.UUID(as_uuid=True)),
    sa.Column("model", sa.Text),
    sa.Column("prompt_tokens", sa.Integer),
    sa.Column("completion_tokens", sa.Integer),
    sa.Column("latency_ms", sa.Float),
    sa.Column("error", sa.Text),
    sa.Column("session_version", sa.BigInteger),
    sa.Column("config", pg.JSONB),
    sa.Column("created_at", sa.DateTime(timezone=True)),
    #: The reason given for an erasure (0009); never message content.
    sa.Column("note", sa.Text),
    #: Copied from the parent by a fork: counted in the session that paid for it (0009).
    sa.Column("inherited", sa.Boolean),
)

offloads = sa.Table(
    "offloads",
    metadata,
    sa.Column("session_id", sa.Text, primary_key=True),
    sa.Column("uuid", pg.UUID(as_uuid=True), primary_key=True),
    sa.Column("event_id", sa.BigInteger),
    sa.Column("message_ids", pg.ARRAY(sa.BigInteger)),
    sa.Column("created_at", sa.DateTime(timezone=True)),
)

lineage = sa.Table(
    "lineage",
    metadata,
    sa.Column("session_id", sa.Text, primary_key=True),
    sa.Column("summary_id", sa.BigInteger, primary_key=True),
    sa.Column("ordinal", sa.Integer, primary_key=True),
    sa.Column("replaced_id", sa.BigInteger),
    sa.Column("event_id", sa.BigInteger),
)

#: Tables that hold a session's data, children first (for deletes and checks).
SESSION_TABLES = (lineage, offloads, working_set, compression_events, messages, sessions)

#: Not a session table, so outside `metadata` (its key is the role, not session_id): which
#: database role may use which tenant (migration 0006, autoctx.store.tenancy).
tenancy_metadata = sa.MetaData()

tenant_grants = sa.Table(
    "autoctx_tenant_grants",
    tenancy_metadata,
    sa.Column("grantee", sa.Text, primary_key=True),
    sa.Column("tenant", sa.Text, primary_key=True),
    sa.Column("created_at", sa.DateTime(timezone=True)),
)
