"""Alembic environment for autoctx.

The connection comes from `config.attributes["connection"]` when autoctx runs the migrations
itself (under its advisory lock), else from the `sqlalchemy.url` option or AUTOCTX_DATABASE_URL.
"""

from __future__ import annotations

import os

import sqlalchemy as sa
from alembic import context

config = context.config


def _target_metadata() -> list[sa.MetaData]:
    # What `alembic revision --autogenerate` compares the database to.
    from autoctx._store import tables

    return [tables.metadata, tables.tenancy_metadata]


def _url() -> str:
    url = config.get_main_option("sqlalchemy.url") or os.environ.get("AUTOCTX_DATABASE_URL")
    if not url:
        raise RuntimeError("set AUTOCTX_DATABASE_URL (or use `autoctx db upgrade`)")
    return url


def run_migrations_offline() -> None:
    context.configure(url=_url(), literal_binds=True, transaction_per_migration=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(
            connection=connection,
            transaction_per_migration=True,
            target_metadata=_target_metadata(),
        )
        with context.begin_transaction():
            context.run_migrations()
        return
    from autoctx._store.database import normalize_url

    engine = sa.create_engine(normalize_url(_url()), poolclass=sa.NullPool)
    with engine.connect() as conn:
        context.configure(
            connection=conn, transaction_per_migration=True, target_metadata=_target_metadata()
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
