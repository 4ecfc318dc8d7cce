"""`autoctx_session_cost.llm_calls` counts calls to an LLM only.

The built-in offline summarizer (model `autoctx-offline`, or `offline` when it stands in as the
fallback) writes summaries without any network call; counting its events as LLM calls made a
session summarized offline report hundreds of "LLM calls" at zero tokens. The view is replaced
in place (`CREATE OR REPLACE`), so the privileges granted on it (`autoctx db grant-tenant`) and
its `security_invoker` option stay.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

# A migration is a snapshot of its time: it copies the view of 0004, it does not import it.
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
        {offline}
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
LEFT JOIN compression_events e ON e.session_id = s.session_id
GROUP BY s.session_id, s.tenant, s.model
"""


def upgrade() -> None:
    op.execute(_SESSION_COST.format(offline="AND e.model NOT IN ('autoctx-offline', 'offline')"))


def downgrade() -> None:
    op.execute(_SESSION_COST.format(offline=""))
