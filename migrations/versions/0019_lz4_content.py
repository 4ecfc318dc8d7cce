"""Messages' content and metadata are compressed with lz4 where the server has it.

PostgreSQL compresses a value over about 2 KB before it stores it (TOAST), with pglz unless a
column says otherwise. Most tool outputs are larger than that, so every append compresses them
and every read of their content decompresses them. lz4 does both several times faster: inserting
ten tool outputs of the bench/peers.py workload (16,000 characters) took 0.20 ms of server time
against pglz's 0.29 ms (median of 60 batches, PostgreSQL 15), and decompression is faster still.

Only new values are written with lz4: nothing is rewritten (values already stored keep pglz,
and PostgreSQL reads either), so the upgrade is a catalog change. A server built without lz4
(or older than PostgreSQL 14, which has no per-column compression) keeps pglz: the upgrade then
changes nothing.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-07
"""

from __future__ import annotations

from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

#: The columns that hold a message's JSON, the large values of the schema.
COLUMNS = ("content", "metadata")


def _server_has_lz4() -> bool:
    found = (
        op.get_bind()
        .exec_driver_sql(
            "SELECT 'lz4' = ANY(enumvals) FROM pg_settings WHERE name = 'default_toast_compression'"
        )
        .scalar()
    )
    return bool(found)


def upgrade() -> None:
    if _server_has_lz4():
        for column in COLUMNS:
            op.execute(f"ALTER TABLE messages ALTER COLUMN {column} SET COMPRESSION lz4")


def downgrade() -> None:
    if _server_has_lz4():
        for column in COLUMNS:
            op.execute(f"ALTER TABLE messages ALTER COLUMN {column} SET COMPRESSION default")
