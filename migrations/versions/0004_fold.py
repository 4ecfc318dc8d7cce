"""The fold (strategy 7) and the offline fallback: a strategy, a message kind, an event reason.

`autoctx_session_cost.llm_calls` counts the fold's calls too, and not the fallback's: the
offline summarizer that keeps the bound when the configured one fails calls no LLM.

`history_summary` is the kind of the one rolling summary the fold keeps of a session's history
(docs/design.md §3); `fallback` is the reason of a summary the offline summarizer wrote because
the configured one failed and the context was still over the window (docs/design.md §2).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_KINDS_BEFORE = (
    "('original', 'tool_run_summary', 'preview', 'round_summary', 'large_summary', "
    "'current_round_summary')"
)
_KINDS = (
    "('original', 'tool_run_summary', 'preview', 'round_summary', 'large_summary', "
    "'current_round_summary', 'history_summary')"
)
_REASONS_BEFORE = "('count', 'tokens', 'manual')"
_REASONS = "('count', 'tokens', 'manual', 'fallback')"


# The view of migration 0002, with the fold among the LLM strategies and the fallback left out
# of the LLM calls (a migration is a snapshot of its time: it copies, it does not import).
_SESSION_COST = """
CREATE VIEW autoctx_session_cost WITH (security_invoker = true) AS
SELECT
    s.session_id,
    s.tenant,
    s.model,
    count(e.id) AS event_count,
    count(e.id) FILTER (WHERE e.status = 'applied') AS applied_count,
    count(e.id) FILTER (WHERE e.status = 'failed') AS failed_count,
    count(e.id) FILTER (WHERE e.status = 'conflict') AS conflict_count,
    count(e.id) FILTER (
        WHERE e.model IS NOT NULL AND e.strategy IN {strategies} {fallback}
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


def _replace_session_cost(strategies: str, fallback: str) -> None:
    op.execute("DROP VIEW autoctx_session_cost")
    op.execute(_SESSION_COST.format(strategies=strategies, fallback=fallback))


def _replace_check(table: str, name: str, condition: str) -> None:
    op.drop_constraint(name, table, type_="check")
    op.create_check_constraint(name, table, condition)


def upgrade() -> None:
    _replace_check("messages", "messages_kind", f"kind in {_KINDS}")
    _replace_check("compression_events", "events_reason", f"reason in {_REASONS}")
    _replace_check("compression_events", "events_strategy", "strategy between 0 and 7")
    _replace_session_cost("(1, 4, 5, 6, 7)", "AND e.reason <> 'fallback'")


def downgrade() -> None:
    # Refused by PostgreSQL while rows of the new kind or reason exist, which is the point: a
    # downgrade must not silently drop what the fold wrote.
    _replace_session_cost("(1, 4, 5, 6)", "")
    _replace_check("compression_events", "events_strategy", "strategy between 0 and 6")
    _replace_check("compression_events", "events_reason", f"reason in {_REASONS_BEFORE}")
    _replace_check("messages", "messages_kind", f"kind in {_KINDS_BEFORE}")
