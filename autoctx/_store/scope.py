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

from sqlalchemy.engine import Connection, Engine

from .sql import SET_TENANT


class TenantScope:
    """An engine and a tenant: transactions and connections scoped to that tenant."""

    def __init__(self, engine: Engine, tenant: str | None = None) -> None:
        self.engine = engine
        self.tenant = tenant
        #: The same pool, each statement its own transaction: one round trip for a
        #: one-statement read or write, where a transaction would add BEGIN and COMMIT.
        self._autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Connection]:
        """A transaction; with a tenant, scoped to it for the row-level security policies."""
        with self.engine.begin() as conn:
            self.scope(conn)
            yield conn

    @contextlib.contextmanager
    def connection(self) -> Iterator[Connection]:
        """A connection (its transactions are the caller's), scoped to the tenant."""
        with self.engine.connect() as conn:
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
            with self._autocommit.connect() as conn:
                yield conn

    def scope(self, conn: Connection) -> None:
        """Set the tenant for the row-level security policies on `conn`'s transaction."""
        if self.tenant is not None:
            conn.exec_driver_sql(SET_TENANT, {"t": self.tenant})
