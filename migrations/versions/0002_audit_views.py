"""Audit views: savings per strategy, cost per session, lineage, coverage, problem sessions.

Plain SQL views over the core tables (docs/design.md §7); docs/audit.md documents every column
and answers common audit questions with them.

Every view keeps session_id as a column so that it can be filtered (and sharded) by session.
The two recursive views are written as a LATERAL walk seeded by one message at a time, not as
one recursive CTE over the whole table: PostgreSQL never pushes an outer WHERE into a recursive
CTE, so `WHERE session_id = :s AND summary_id = :x` on a plain recursive view would walk the
lineage of every session of the database before filtering. Seeded per message, the filter
lands on the messages primary key and each step of the walk is one index probe
(lineage's primary key going down, lineage_replaced_idx going up).

The views are `security_invoker`, so that row-level security on the tables, when a deployment
enables it, applies to whoever reads a view and not to the view's owner (PostgreSQL 15+).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

#: The strategies whose replacement text a summarizer writes (docs/design.md §3).
_LLM_STRATEGIES = "(1, 4, 5, 6)"

SAVINGS_BY_STRATEGY = """
CREATE VIEW autoctx_savings_by_strategy WITH (security_invoker = true) AS
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
    -- Usage of every attempt, failed ones included: a summary discarded as no_gain was paid for.
    coalesce(sum(e.prompt_tokens), 0)::bigint AS prompt_tokens,
    coalesce(sum(e.completion_tokens), 0)::bigint AS completion_tokens,
    count(e.latency_ms) AS timed_count,
    coalesce(sum(e.latency_ms), 0)::double precision AS total_latency_ms,
    avg(e.latency_ms)::double precision AS mean_latency_ms,
    min(e.created_at) AS first_event_at,
    max(e.created_at) AS last_event_at
FROM compression_events e
GROUP BY e.session_id, e.strategy
"""

SESSION_COST = f"""
CREATE VIEW autoctx_session_cost WITH (security_invoker = true) AS
SELECT
    s.session_id,
    s.tenant,
    s.model,
    count(e.id) AS event_count,
    count(e.id) FILTER (WHERE e.status = 'applied') AS applied_count,
    count(e.id) FILTER (WHERE e.status = 'failed') AS failed_count,
    count(e.id) FILTER (WHERE e.status = 'conflict') AS conflict_count,
    count(e.id) FILTER (WHERE e.model IS NOT NULL AND e.strategy IN {_LLM_STRATEGIES}) AS llm_calls,
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

# Down from each summary (any message that lineage rows hang from: every kind but 'original')
# to everything it stands for. One walk per summary, seeded by the outer row (see the module
# docstring); the recursive step probes lineage's primary key (session_id, summary_id, ...).
LINEAGE = """
CREATE VIEW autoctx_lineage WITH (security_invoker = true) AS
SELECT
    s.session_id,
    s.id AS summary_id,
    w.message_id,
    w.depth,
    m.kind = 'original' AS is_original,
    m.kind,
    w.event_id,
    w.path
FROM messages s
CROSS JOIN LATERAL (
    WITH RECURSIVE walk(message_id, depth, event_id, path) AS (
        SELECT l.replaced_id, 1, l.event_id, ARRAY[s.id, l.replaced_id]
        FROM lineage l
        WHERE l.session_id = s.session_id AND l.summary_id = s.id
        UNION ALL
        SELECT l.replaced_id, w.depth + 1, l.event_id, w.path || l.replaced_id
        FROM walk w
        JOIN lineage l ON l.session_id = s.session_id AND l.summary_id = w.message_id
    )
    SELECT message_id, depth, event_id, path FROM walk
) w
JOIN messages m ON m.session_id = s.session_id AND m.id = w.message_id
WHERE s.kind <> 'original'
"""

# Up from each replaced original to the working message that covers it now. A message leaves
# the working set only by being replaced, so the chain of its replacements always ends in the
# working set; the recursive step probes lineage_replaced_idx (session_id, replaced_id).
COVERAGE = """
CREATE VIEW autoctx_coverage WITH (security_invoker = true) AS
SELECT
    o.session_id,
    o.id AS original_id,
    c.covering_message_id,
    c.covering_kind,
    c.depth
FROM messages o
CROSS JOIN LATERAL (
    WITH RECURSIVE up(message_id, depth) AS (
        SELECT l.summary_id, 1
        FROM lineage l
        WHERE l.session_id = o.session_id AND l.replaced_id = o.id
        UNION ALL
        SELECT l.summary_id, u.depth + 1
        FROM up u
        JOIN lineage l ON l.session_id = o.session_id AND l.replaced_id = u.message_id
    )
    SELECT u.message_id AS covering_message_id, m.kind AS covering_kind, u.depth
    FROM up u
    JOIN working_set ws ON ws.session_id = o.session_id AND ws.message_id = u.message_id
    JOIN messages m ON m.session_id = o.session_id AND m.id = u.message_id
) c
WHERE o.kind = 'original'
"""

# `id DESC` orders a session's events: ids are allocated per session in commit order, while
# created_at is the transaction's start and ties within one apply.
PROBLEM_SESSIONS = """
CREATE VIEW autoctx_problem_sessions WITH (security_invoker = true) AS
SELECT
    e.session_id,
    s.tenant,
    count(*) FILTER (WHERE e.status = 'failed') AS failed_count,
    count(*) FILTER (WHERE e.status = 'conflict') AS conflict_count,
    (array_agg(e.status ORDER BY e.id DESC))[1] AS last_status,
    (array_agg(e.strategy ORDER BY e.id DESC))[1] AS last_strategy,
    (array_agg(e.error ORDER BY e.id DESC))[1] AS last_error,
    max(e.id) AS last_event_id,
    max(e.created_at) AS last_problem_at
FROM compression_events e
JOIN sessions s ON s.session_id = e.session_id
WHERE e.status IN ('failed', 'conflict')
GROUP BY e.session_id, s.tenant
"""

#: In creation order; dropped in reverse.
VIEWS = (
    ("autoctx_savings_by_strategy", SAVINGS_BY_STRATEGY),
    ("autoctx_session_cost", SESSION_COST),
    ("autoctx_lineage", LINEAGE),
    ("autoctx_coverage", COVERAGE),
    ("autoctx_problem_sessions", PROBLEM_SESSIONS),
)


def upgrade() -> None:
    for _, ddl in VIEWS:
        op.execute(ddl)


def downgrade() -> None:
    for name, _ in reversed(VIEWS):
        op.execute(f"DROP VIEW IF EXISTS {name}")
