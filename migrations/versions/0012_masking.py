"""Masking (strategy 8): a strategy number for the audit.

Masking turns old tool outputs into short previews with their offload tag, without an LLM
(docs/design.md §3). Its events carry strategy 8; its previews are of the existing kind
`preview`, and it calls no LLM, so the cost view's count of LLM calls is unchanged.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02
"""

from __future__ import annotations

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def _replace_strategies(condition: str) -> None:
    op.drop_constraint("events_strategy", "compression_events", type_="check")
    op.create_check_constraint("events_strategy", "compression_events", condition)


def upgrade() -> None:
    _replace_strategies("strategy between 0 and 8")


def downgrade() -> None:
    # Refused by PostgreSQL while masking events exist, which is the point: a downgrade must
    # not silently drop what masking recorded.
    _replace_strategies("strategy between 0 and 7")
