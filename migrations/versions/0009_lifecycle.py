"""Session lifecycle: forks, erasure, and the audit of both.

- A fork (`mem.fork`, `autoctx fork`) is a new session that starts from another one's working
  context with copies of every row it needs (session_id leads every key, so the child owns its
  rows). `sessions.forked_from`, `forked_from_incarnation` and `forked_at_message` record where
  it came from; `autoctx_forks` lists every fork with whether its parent (that incarnation) is
  still there. No index on `forked_from`: every index leads with session_id (docs/scaling.md),
  and finding a session's forks is an audit query, not a hot path.
- The events a fork copies from its parent are marked `inherited`, so that the audit views
  count a compression's cost once, in the session that paid for it.
- `fork` and `erase` are reasons of the events that record a fork (in the child) and an
  erasure; `note` holds the reason the caller gave for an erasure (never message content).
- `messages.erased_by` is the erasure event that tombstoned an original or rewrote a summary
  derived from one (NULL otherwise): which messages an erasure touched is one query.
- A role granted a tenant (`autoctx db grant-tenant`, migration 0006) gets SELECT on the new
  view. Not UPDATE on messages: an erasure rewrites rows in place, and that stays the tables'
  owner's act (an operator's), so that an agent's role can never rewrite its own history.

Revision ID: 0009
Revises: 0007
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

_REASONS_BEFORE = "('count', 'tokens', 'manual', 'fallback', 'clear')"
_REASONS = "('count', 'tokens', 'manual', 'fallback', 'clear', 'fork', 'erase')"
GRANTS = "autoctx_tenant_grants"

# The views of migrations 0002 and 0007 (a migration is a snapshot of its time: it copies, it
# does not import), with the events a fork inherited left out. CREATE OR REPLACE keeps the
# privileges granted on them and their security_invoker option.
_SAVINGS_BY_STRATEGY = """
CREATE OR REPLACE VIEW autoctx_savings_by_strategy WITH (security_invoker = true) AS
SELECT
    e.session_id,
    e.strategy,
    count(*) AS event_count,
    count(*) FILTER (WHERE e.status = 'applied') AS applied_count,
    count(*) FILTER (WHERE e.status = 'failed') AS failed_count,
    count(*) FILTER (WHERE e.status = 'conflict') AS conflict_count,
    count(*) FILTER (WHERE e.status = 'skipped') AS skipped_count,
    coalesce(sum(e.tokens_before - e.tokens_after) FILTER (WHERE e.status = 'applied'), 0)::bigint
        AS tokens_saved,
    coalesce(sum(e.replaced_tokens) FILTER (WHERE e.status = 'applied'), 0)::bigint
        AS replaced_tokens,
    coalesce(
        sum(e.messages_before - e.messages_after) FILTER (WHERE e.status = 'applied'), 0
    )::bigint AS messages_removed,
    coalesce(sum(e.prompt_tokens), 0)::bigint AS prompt_tokens,
    coalesce(sum(e.completion_tokens), 0)::bigint AS completion_tokens,
    count(e.latency_ms) AS timed_count,
    coalesce(sum(e.latency_ms), 0)::double precision AS total_latency_ms,
    avg(e.latency_ms)::double precision AS mean_latency_ms,
    min(e.created_at) AS first_event_at,
    max(e.created_at) AS last_event_at
FROM compression_events e
{where}
GROUP BY e.session_id, e.strategy
"""

_SESSION_COST = """
CREATE OR REPLACE VIEW autoctx_session_cost WITH (security_invoker = true) AS
SELECT
    s.session_id,
    s.tenant,
    s.model,
    count(e.id) AS event_count,
    count(e.id) FILTER (WHERE e.status = 'applied') AS applied_count,
    count(e.id) FILTER (WHERE e.status = 'failed') AS failed_count,
    count(e.id) FILTER (WHERE e.status = 'conflict') AS conflict_count,
    count(e.id) FILTER (
        WHERE e.model IS NOT NULL AND e.strategy IN (1, 4, 5, 6, 7) AND e.reason <> 'fallback'
        AND e.model NOT IN ('autoctx-offline', 'offline')
    ) AS llm_calls,
    coalesce(sum(e.prompt_tokens), 0)::bigint AS prompt_tokens,
    coalesce(sum(e.completion_tokens), 0)::bigint AS completion_tokens,
    coalesce(sum(e.latency_ms), 0)::double precision AS total_latency_ms,
    coalesce(sum(e.tokens_before - e.tokens_after) FILTER (WHERE e.status = 'applied'), 0)::bigint
        AS tokens_saved,
    min(e.created_at) FILTER (WHERE e.status = 'applied') AS first_compression_at,
    max(e.created_at) FILTER (WHERE e.status = 'applied') AS last_compression_at,
    max(e.created_at) AS last_event_at
FROM sessions s
LEFT JOIN compression_events e ON e.session_id = s.session_id {join}
GROUP BY s.session_id, s.tenant, s.model
"""

#: Every fork, seeded by the child's row; `parent_exists` says whether the parent incarnation
#: the fork copied is still stored (it may have been deleted, purged, or created again under
#: the same id since).
FORKS = """
CREATE VIEW autoctx_forks WITH (security_invoker = true) AS
SELECT
    c.session_id,
    c.tenant,
    c.forked_from,
    c.forked_from_incarnation,
    c.forked_at_message,
    EXISTS (
        SELECT 1 FROM sessions p
        WHERE p.session_id = c.forked_from AND p.incarnation = c.forked_from_incarnation
    ) AS parent_exists,
    f.id AS fork_event_id,
    f.created_at AS forked_at,
    f.messages_after AS messages_at_fork,
    f.tokens_after AS tokens_at_fork
FROM sessions c
LEFT JOIN compression_events f
    ON f.session_id = c.session_id AND f.reason = 'fork' AND NOT f.inherited
WHERE c.forked_from IS NOT NULL
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
    op.add_column("sessions", sa.Column("forked_from", sa.Text, nullable=True))
    op.add_column("sessions", sa.Column("forked_from_incarnation", pg.UUID(as_uuid=True)))
    op.add_column("sessions", sa.Column("forked_at_message", sa.BigInteger, nullable=True))
    op.add_column("messages", sa.Column("erased_by", sa.BigInteger, nullable=True))
    op.add_column("compression_events", sa.Column("note", sa.Text, nullable=True))
    op.add_column(
        "compression_events",
        sa.Column("inherited", sa.Boolean, nullable=False, server_default=sa.false()),
    )
    _replace_reasons(_REASONS)
    op.execute(_SAVINGS_BY_STRATEGY.format(where="WHERE NOT e.inherited"))
    op.execute(_SESSION_COST.format(join="AND NOT e.inherited"))
    op.execute(FORKS)
    for role in _grantees():
        op.execute(f"GRANT SELECT ON autoctx_forks TO {role}")


def downgrade() -> None:
    op.execute("DROP VIEW autoctx_forks")
    op.execute(_SESSION_COST.format(join=""))
    op.execute(_SAVINGS_BY_STRATEGY.format(where=""))
    # A fork's or an erasure's event has no meaning before this revision; the rows they wrote
    # (copies, tombstones) stay.
    op.execute("DELETE FROM compression_events WHERE reason IN ('fork', 'erase')")
    _replace_reasons(_REASONS_BEFORE)
    op.drop_column("compression_events", "inherited")
    op.drop_column("compression_events", "note")
    op.drop_column("messages", "erased_by")
    op.drop_column("sessions", "forked_at_message")
    op.drop_column("sessions", "forked_from_incarnation")
    op.drop_column("sessions", "forked_from")
