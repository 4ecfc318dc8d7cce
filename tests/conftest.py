"""Shared fixtures: a real PostgreSQL, migrated once into a template, cloned per test module.

`AUTOCTX_TEST_DATABASE_URL` (a server URL; its database is used only to connect and create
others) when set, otherwise a throwaway embedded PostgreSQL in a temporary directory.

Safe under pytest-xdist (the README's command runs the suite on several workers): each worker
process has its own template and its own clones, every name carries the worker's id and a random
part, and without a server URL each worker starts its own embedded server in its own directory
(it listens on a Unix socket only, so no two can collide). Cluster-wide objects the tests make
(roles) have random names too.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL

from autoctx import AutoContextClient, AutoContextConfig, AutoContextMemory, OfflineSummarizer
from autoctx._store.database import (
    create_engine,
    embedded_url,
    ensure_database,
    normalize_url,
    start_embedded,
    upgrade,
)

ENV_TEST_URL = "AUTOCTX_TEST_DATABASE_URL"

#: "gw0", "gw1", ... under pytest-xdist, "main" otherwise: part of every database name, so that a
#: database left behind by an interrupted run says which process made it.
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "main")


def _database_name(kind: str) -> str:
    return f"autoctx_{kind}_{WORKER}_{uuid.uuid4().hex[:12]}"


def _create_database(admin_url: URL, name: str, template: str | None = None) -> None:
    """Create `name` with commits that do not wait for the server's disk flush.

    The tests check what autoctx commits and reads back, never what survives a crash of the
    server itself (the crash tests kill clients), so waiting for each commit's WAL flush only
    costs time: on a busy machine a flush is several milliseconds, and the suite commits tens of
    thousands of times. A commit is still atomic and visible to every other session at once.
    """
    ensure_database(admin_url, name, template=template)
    engine = create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
    with engine.connect() as conn:
        conn.execute(sa.text(f'ALTER DATABASE "{name}" SET synchronous_commit = off'))
    engine.dispose()


def _drop_database(admin_url: URL, name: str) -> None:
    engine = create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
    with engine.connect() as conn, contextlib.suppress(sa.exc.DBAPIError):
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    engine.dispose()


@pytest.fixture(scope="session")
def embedded_admin_url() -> Iterator[URL]:
    """A throwaway embedded PostgreSQL 18 (deleted at the end of the run)."""
    root = Path(tempfile.mkdtemp(prefix="autoctx-test-pg-"))
    server = start_embedded(root / "pgdata", cleanup_mode="delete")
    yield embedded_url(server, "postgres")
    server.cleanup()


@pytest.fixture(scope="session")
def admin_url(request: pytest.FixtureRequest) -> URL:
    raw = os.environ.get(ENV_TEST_URL)
    if raw:
        return normalize_url(raw)
    url: URL = request.getfixturevalue("embedded_admin_url")
    return url


def _with_database(url: URL, name: str) -> URL:
    return url.set(database=name)


@pytest.fixture(scope="session")
def template_db(admin_url: URL) -> Iterator[str]:
    """A database migrated to head once, cloned by every module."""
    name = _database_name("tmpl")
    _create_database(admin_url, name)
    engine = create_engine(_with_database(admin_url, name), poolclass=sa.NullPool)
    upgrade(engine)
    engine.dispose()
    yield name
    _drop_database(admin_url, name)


def clone_database(admin_url: URL, template: str) -> tuple[URL, str]:
    name = _database_name("t")
    _create_database(admin_url, name, template=template)
    return _with_database(admin_url, name), name


@pytest.fixture(scope="module")
def db_url(admin_url: URL, template_db: str) -> Iterator[str]:
    """A migrated database of this test module's own (a clone of the template)."""
    url, name = clone_database(admin_url, template_db)
    yield url.render_as_string(hide_password=False)
    # The shared clients (of `AutoContextMemory.open` without a client) are closed with the
    # database: none keeps a pool of a dropped database, or a memory, into the next module.
    AutoContextClient.close_shared(url)
    _drop_database(admin_url, name)


@pytest.fixture
def client(db_url: str) -> Iterator[AutoContextClient]:
    """A client of this module's database, the test's own: closed (with every memory opened
    through it, and its pooled connections) when the test ends."""
    with AutoContextClient(db_url) as own:
        yield own


@pytest.fixture
def empty_db_url(admin_url: URL) -> Iterator[str]:
    """An empty database (no schema), for migration tests."""
    name = _database_name("e")
    _create_database(admin_url, name)
    url = _with_database(admin_url, name)
    yield url.render_as_string(hide_password=False)
    AutoContextClient.close_shared(url)
    _drop_database(admin_url, name)


@pytest.fixture
def session_id(request: pytest.FixtureRequest) -> str:
    """A session id unique to the test."""
    return f"t-{request.node.name[:60]}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def open_memory(db_url: str, session_id: str) -> Callable[..., AutoContextMemory]:
    """Open (or create) a memory on this module's database with the offline summarizer."""

    def _open(
        sid: str | None = None, config: AutoContextConfig | None = None, **kw: Any
    ) -> AutoContextMemory:
        kw.setdefault("summarizer", OfflineSummarizer())
        return AutoContextMemory.open(sid or session_id, db_url, config, **kw)

    return _open
