"""Connections scoped to a tenant: what every reader and writer of the store opens.

A `TenantScope` is an engine and the tenant its statements run for. With a tenant, each
transaction first sets it for the row-level security policies (database tenancy,
docs/design.md §5); the statements themselves also name it (application tenancy). Both the
store of one session (`SessionStore`) and the reads across sessions (`Catalog`) are scopes, and
the SQL modules that serve either (search, the console) take a scope.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from .locks import is_lock_timeout, lock_wait_timeout
from .sql import SET_TENANT


class TenantScope:
    """An engine and a tenant: transactions and connections scoped to that tenant."""

    def __init__(self, engine: Engine, tenant: str | None = None) -> None:
        self.engine = engine
        self.tenant = tenant
        #: The same pool, each statement its own transaction: one round trip for a
        #: one-statement read or write, where a transaction would add BEGIN and COMMIT.
        self._autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")

    @property
    def subject(self) -> str:
        """What the errors of this scope's calls name."""
        return "the sessions" if self.tenant is None else f"the sessions of tenant {self.tenant!r}"

    @contextlib.contextmanager
    def _lock_waits(self) -> Iterator[None]:
        """A lock wait past `lock_timeout` as `LockWaitTimeout` (autoctx._store.locks)."""
        try:
            yield
        except sa.exc.DBAPIError as exc:
            if is_lock_timeout(exc):
                raise lock_wait_timeout(self.subject) from None
            raise

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Connection]:
        """A transaction; with a tenant, scoped to it for the row-level security policies."""
        with self._lock_waits(), self.engine.begin() as conn:
            self.scope(conn)
            yield conn

    @contextlib.contextmanager
    def connection(self) -> Iterator[Connection]:
        """A connection (its transactions are the caller's), scoped to the tenant."""
        with self._lock_waits(), self.engine.connect() as conn:
            self.scope(conn)
            yield conn

    @contextlib.contextmanager
    def statement(self) -> Iterator[Connection]:
        """A connection for ONE statement (atomic on its own): autocommit, unless a tenant
        scope must be set first, which lasts only as long as its transaction."""
        if self.tenant is not None:
            with self.transaction() as conn:
                yield conn
        else:
            with self._lock_waits(), self._autocommit.connect() as conn:
                yield conn

    def scope(self, conn: Connection) -> None:
        """Set the tenant for the row-level security policies on `conn`'s transaction."""
        if self.tenant is not None:
            conn.exec_driver_sql(SET_TENANT, {"t": self.tenant})
