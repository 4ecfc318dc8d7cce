"""SQLAlchemy Core descriptions of the tables the migrations create: columns, types,
nullability, server defaults, keys and indexes.

The schema itself is created and changed only by the Alembic migrations in `migrations/`; these
descriptions are Alembic's `target_metadata` (so `alembic revision --autogenerate` starts a new
migration from a change made here), and a test compares them to the migrated database with
`alembic.autogenerate.compare_metadata`. Check constraints and the row-level security policies
live in the migrations only (Alembic does not compare them).
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

metadata = sa.MetaData()

_NOW = sa.text("now()")
_EMPTY_JSON = sa.text("'{}'::jsonb")


def _session_fk() -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(["session_id"], ["sessions.session_id"], ondelete="CASCADE")


sessions = sa.Table(
    "sessions",
    metadata,
    sa.Column("session_id", sa.Text, primary_key=True),
    sa.Column("tenant", sa.Text, nullable=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=_NOW),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=_NOW),
    sa.Column("version", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("message_count", sa.Integer, nullable=False, server_default="0"),
    sa.Column("token_count", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("model", sa.Text, nullable=False),
    sa.Column("encoding", sa.Text, nullable=False),
    sa.Column("config", pg.JSONB, nullable=False),
    sa.Column("plan", pg.JSONB, nullable=True),
    sa.Column("open_calls", pg.JSONB, nullable=False, server_default=_EMPTY_JSON),
    sa.Column("next_message_id", sa.BigInteger, nullable=False, server_default="1"),
    sa.Column("next_position", sa.BigInteger, nullable=False, server_default="1"),
    sa.Column("next_event_id", sa.BigInteger, nullable=False, server_default="1"),
    sa.Column("settled_version", sa.BigInteger, nullable=True),
    sa.Column(
        "incarnation",
        pg.UUID(as_uuid=True),
        nullable=False,
        server_default=sa.text("gen_random_uuid()"),
    ),
    # Where a fork came from (migration 0009): the parent session, its incarnation, and the
    # last message of its working context the fork started from.
    sa.Column("forked_from", sa.Text, nullable=True),
    sa.Column("forked_from_incarnation", pg.UUID(as_uuid=True), nullable=True),
    sa.Column("forked_at_message", sa.BigInteger, nullable=True),
    # How many erasures rewrote the session's messages in place (migration 0010): every cache
    # of message content is keyed by it.
    sa.Column("erasures", sa.BigInteger, nullable=False, server_default="0"),
    # The incarnations a fork descends from, the root first and its parent last (0010).
    sa.Column("fork_ancestry", pg.ARRAY(pg.UUID), nullable=False, server_default="{}"),
    # The next offload handle the session gives (0015): past every handle in use.
    sa.Column("next_handle", sa.BigInteger, nullable=False, server_default="1"),
    sa.Index("sessions_tenant_idx", "session_id", "tenant"),
)

messages = sa.Table(
    "messages",
    metadata,
    sa.Column("session_id", sa.Text, primary_key=True),
    sa.Column("id", sa.BigInteger, primary_key=True),
    sa.Column("role", sa.Text, nullable=False),
    sa.Column("name", sa.Text, nullable=True),
    sa.Column("content", pg.JSONB, nullable=False),
    sa.Column("metadata", pg.JSONB, nullable=False, server_default=_EMPTY_JSON),
    sa.Column("kind", sa.Text, nullable=False, server_default="original"),
    sa.Column("pinned", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("final", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("tokens", sa.Integer, nullable=False),
    sa.Column("chars", sa.Integer, nullable=False),
    sa.Column("call_ids", pg.ARRAY(sa.Text), nullable=False, server_default="{}"),
    sa.Column("result_ids", pg.ARRAY(sa.Text), nullable=False, server_default="{}"),
    sa.Column("tool_names", pg.ARRAY(sa.Text), nullable=False, server_default="{}"),
    sa.Column("event_id", sa.BigInteger, nullable=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=_NOW),
    #: The erasure event that tombstoned this original or rewrote this summary (0009).
    sa.Column("erased_by", sa.BigInteger, nullable=True),
    #: The text search configuration of `search_tsv` (the session's `search_config`, 0008).
    sa.Column("search_config", sa.Text, nullable=False, server_default="simple"),
    #: The full-text vector of an original (NULL for summaries and previews), under the GIN
    #: index below: NULL when the message is written, computed by the first search that covers
    #: it, and by a trigger on every UPDATE of the row (the function `autoctx_search_vector`,
    #: migration 0013). Read and filled by `autoctx._store.search`.
    sa.Column("search_tsv", pg.TSVECTOR, nullable=True),
    #: The idempotency key the `add()` that stored the message was given, on each message of
    #: that add (NULL without one): a retried add finds them (migration 0014).
    sa.Column("add_key", sa.Text, nullable=True),
    _session_fk(),
    sa.Index(
        "messages_add_key_idx",
        "session_id",
        "add_key",
        postgresql_where=sa.text("add_key IS NOT NULL"),
    ),
    sa.Index(
        "messages_search_idx",
        "session_id",
        "search_tsv",
        postgresql_using="gin",
        postgresql_where=sa.text("search_tsv IS NOT NULL"),
    ),
    # The originals whose vector is not computed yet (0013): what a search fills first.
    sa.Index(
        "messages_unindexed_idx",
        "session_id",
        "id",
        postgresql_where=sa.text(
            "search_tsv IS NULL AND kind = 'original' AND search_config <> 'none'"
        ),
    ),
    # The answers of autoctx's context tools, which an erasure looks through (0010).
    sa.Index(
        "messages_context_answers_idx",
        "session_id",
        "id",
        postgresql_where=sa.text(
            "role = 'tool' AND tool_names && ARRAY['context_search', 'context_reload']"
        ),
    ),
)

working_set = sa.Table(
    "working_set",
    metadata,
    sa.Column("session_id", sa.Text, primary_key=True),
    sa.Column("position", sa.BigInteger, primary_key=True),
    sa.Column("message_id", sa.BigInteger, nullable=False),
    sa.UniqueConstraint("session_id", "message_id", name="working_set_message_key"),
    sa.ForeignKeyConstraint(
        ["session_id", "message_id"], ["messages.session_id", "messages.id"], ondelete="CASCADE"
    ),
)

compression_events = sa.Table(
    "compression_events",
    metadata,
    sa.Column("session_id", sa.Text, primary_key=True),
    sa.Column("id", sa.BigInteger, primary_key=True),
    sa.Column("strategy", sa.SmallInteger, nullable=False),
    sa.Column("status", sa.Text, nullable=False),
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
    sa.Column("session_version", sa.BigInteger, nullable=False),
    sa.Column("config", pg.JSONB, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=_NOW),
    #: The reason given for an erasure (0009); never message content.
    sa.Column("note", sa.Text, nullable=True),
    #: Copied from the parent by a fork: counted in the session that paid for it (0009).
    sa.Column("inherited", sa.Boolean, nullable=False, server_default=sa.false()),
    #: An undo's event: the id of the compression it took back (0017); NULL otherwise.
    sa.Column("undoes", sa.BigInteger, nullable=True),
    # The fact check of the summary the event wrote (migration 0016, docs/design.md §6): NULL
    # where no summary was checked; the dropped facts as the check found them.
    sa.Column("facts_found", sa.Integer, nullable=True),
    sa.Column("facts_kept", sa.Integer, nullable=True),
    sa.Column("facts_repaired", sa.Integer, nullable=True),
    sa.Column("facts_listed", sa.Integer, nullable=True),
    sa.Column("facts_dropped", sa.Integer, nullable=True),
    sa.Column("dropped_facts", pg.ARRAY(sa.Text), nullable=False, server_default="{}"),
    sa.Column("facts_repair_calls", sa.SmallInteger, nullable=False, server_default="0"),
    _session_fk(),
    sa.Index("compression_events_status_idx", "session_id", "status"),
    # The undo events, which the compressor reads when a call fires (0017).
    sa.Index(
        "compression_events_undo_idx", "session_id", postgresql_where=sa.text("reason = 'undo'")
    ),
)

offloads = sa.Table(
    "offloads",
    metadata,
    sa.Column("session_id", sa.Text, primary_key=True),
    sa.Column("uuid", pg.UUID(as_uuid=True), primary_key=True),
    sa.Column("event_id", sa.BigInteger, nullable=False),
    sa.Column("message_ids", pg.ARRAY(sa.BigInteger), nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=_NOW),
    #: The offload's handle (0015): the short, per-session name its tag shows the model.
    sa.Column("handle", sa.BigInteger, nullable=False),
    sa.UniqueConstraint("session_id", "handle", name="offloads_handle_key"),
    sa.ForeignKeyConstraint(
        ["session_id", "event_id"],
        ["compression_events.session_id", "compression_events.id"],
        ondelete="CASCADE",
    ),
    #: What a compression wrote, by its event (0020): a masking pass's event has an offload
    #: for each output it masked.
    sa.Index("offloads_event_idx", "session_id", "event_id"),
)

lineage = sa.Table(
    "lineage",
    metadata,
    sa.Column("session_id", sa.Text, primary_key=True),
    sa.Column("summary_id", sa.BigInteger, primary_key=True),
    sa.Column("ordinal", sa.Integer, primary_key=True),
    sa.Column("replaced_id", sa.BigInteger, nullable=False),
    sa.Column("event_id", sa.BigInteger, nullable=False),
    sa.ForeignKeyConstraint(
        ["session_id", "summary_id"], ["messages.session_id", "messages.id"], ondelete="CASCADE"
    ),
    sa.ForeignKeyConstraint(
        ["session_id", "replaced_id"], ["messages.session_id", "messages.id"], ondelete="CASCADE"
    ),
    sa.ForeignKeyConstraint(
        ["session_id", "event_id"],
        ["compression_events.session_id", "compression_events.id"],
        ondelete="CASCADE",
    ),
    sa.Index("lineage_replaced_idx", "session_id", "replaced_id"),
)

#: One row per session id, written by triggers on `sessions` (migration 0010): a worker's
#: claim on a session is a row lock on its row (autoctx._store.claims). No foreign key, so that
#: deleting a session never waits for a compression that holds its claim.
session_claims = sa.Table(
    "session_claims",
    metadata,
    sa.Column("session_id", sa.Text, primary_key=True),
)

#: Tables that hold a session's data, children first (for deletes and checks).
SESSION_TABLES = (lineage, offloads, working_set, compression_events, messages, sessions)

#: Not a session table, so outside `metadata` (its key is the role, not session_id): which
#: database role may use which tenant (migration 0006, autoctx._store.tenancy).
tenancy_metadata = sa.MetaData()

tenant_grants = sa.Table(
    "autoctx_tenant_grants",
    tenancy_metadata,
    sa.Column("grantee", sa.Text, primary_key=True),
    sa.Column("tenant", sa.Text, primary_key=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=_NOW),
)
