"""The fact check: what each summary kept of the facts it replaced (docs/design.md §6).

Every event that wrote a summary (S1, S4, S5, S6, the fold) records how many facts the
extractor found in the messages it replaced, how many the summary kept, how many its repair
request added, how many its index line lists, and how many are in none of them, with the
dropped facts themselves as the check found them (an erasure scrubs them like every other copy
of erased text). The counts are NULL where no summary was checked (previews, masking, failed
attempts, manual events); where they are set they add up.

`autoctx_fact_checks` is the audit's view of them: one row per checked summary, with the share
the summary message still shows (kept, repaired or listed). The repair request is a summarizer
call of its own, recorded on the event it repaired (`facts_repair_calls`, its tokens in the
event's): `autoctx_session_cost` counts it in `llm_calls`, and shows it apart in a new last
column, `fact_repair_calls`.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

_COUNTS = ("facts_found", "facts_kept", "facts_repaired", "facts_listed", "facts_dropped")

#: As in 0006 (a migration is a snapshot of its time: it copies, it does not import).
GRANTS = "autoctx_tenant_grants"

FACT_CHECKS = """
CREATE VIEW autoctx_fact_checks WITH (security_invoker = true) AS
SELECT
    e.session_id,
    s.tenant,
    e.id AS event_id,
    e.strategy,
    e.reason,
    e.created_at,
    e.offload_uuid,
    e.facts_found,
    e.facts_kept,
    e.facts_repaired,
    e.facts_listed,
    e.facts_dropped,
    CASE WHEN e.facts_found > 0
        THEN round((e.facts_found - e.facts_dropped)::numeric / e.facts_found, 3)
    END AS visible_share,
    e.dropped_facts
FROM compression_events e
JOIN sessions s ON s.session_id = e.session_id
WHERE e.status = 'applied' AND e.facts_found IS NOT NULL AND NOT e.inherited
"""


#: 0009's view, with the repair calls counted in `llm_calls` and shown apart at the end (a
#: view replaced in place may only gain columns at its end).
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
    ){repairs} AS llm_calls,
    coalesce(sum(e.prompt_tokens), 0)::bigint AS prompt_tokens,
    coalesce(sum(e.completion_tokens), 0)::bigint AS completion_tokens,
    coalesce(sum(e.latency_ms), 0)::double precision AS total_latency_ms,
    coalesce(sum(e.tokens_before - e.tokens_after) FILTER (WHERE e.status = 'applied'), 0)::bigint
        AS tokens_saved,
    min(e.created_at) FILTER (WHERE e.status = 'applied') AS first_compression_at,
    max(e.created_at) FILTER (WHERE e.status = 'applied') AS last_compression_at,
    max(e.created_at) AS last_event_at{column}
FROM sessions s
LEFT JOIN compression_events e ON e.session_id = s.session_id AND NOT e.inherited
GROUP BY s.session_id, s.tenant, s.model
"""
_REPAIRS = "coalesce(sum(e.facts_repair_calls), 0)"


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
    for name in _COUNTS:
        op.add_column("compression_events", sa.Column(name, sa.Integer, nullable=True))
    op.add_column(
        "compression_events",
        sa.Column("dropped_facts", pg.ARRAY(sa.Text), nullable=False, server_default="{}"),
    )
    op.add_column(
        "compression_events",
        sa.Column("facts_repair_calls", sa.SmallInteger, nullable=False, server_default="0"),
    )
    op.create_check_constraint(
        "events_facts_add_up",
        "compression_events",
        "facts_found IS NULL OR (facts_kept >= 0 AND facts_repaired >= 0 AND facts_listed >= 0 "
        "AND facts_dropped >= 0 AND facts_found = facts_kept + facts_repaired + facts_listed "
        "+ facts_dropped)",
    )
    op.execute(FACT_CHECKS)
    op.execute(
        _SESSION_COST.format(
            repairs=f" + {_REPAIRS}", column=f",\n    {_REPAIRS}::bigint AS fact_repair_calls"
        )
    )
    for role in _grantees():
        op.execute(f"GRANT SELECT ON autoctx_fact_checks TO {role}")


def downgrade() -> None:
    op.execute("DROP VIEW autoctx_fact_checks")
    # A view loses a column only by being dropped: 0009's is made again, with its grants.
    op.execute("DROP VIEW autoctx_session_cost")
    op.execute(_SESSION_COST.format(repairs="", column=""))
    for role in _grantees():
        op.execute(f"GRANT SELECT ON autoctx_session_cost TO {role}")
    op.drop_constraint("events_facts_add_up", "compression_events", type_="check")
    op.drop_column("compression_events", "facts_repair_calls")
    op.drop_column("compression_events", "dropped_facts")
    for name in reversed(_COUNTS):
        op.drop_column("compression_events", name)
