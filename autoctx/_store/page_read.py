"""A console page's read: its statements in one round trip (`read`), and the connections a
console keeps for it (`PageScope`).

A page is one `read`: its statements (each a `Read`: the SQL, its parameters, and what its rows
become) go to the server together, in one READ ONLY transaction with the tenant scope, in one
round trip (psycopg's pipeline mode). So no statement of a page may need another's result.

On any scope's pool the pipeline carries BEGIN READ ONLY, the tenant's setting and COMMIT
around the statements. On a `PageScope`, a pool of the console's own whose every session is
pinned, when it connects, to READ ONLY transactions, the tenant's setting and no JIT, the
pipeline carries the statements alone: they run in the implicit transaction the protocol opens
for a pipeline outside a transaction block and commits at its Sync, READ ONLY by the session's
default. That is three statements fewer on every page (about 0.2 ms of psycopg's Python on a
page whose SQL takes 1 ms, issue 33).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import psycopg
import sqlalchemy as sa
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row, tuple_row
from sqlalchemy.engine import Engine

from .database import create_engine
from .scope import TenantScope

__all__ = ["PageScope", "Read", "read"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Read(Generic[T]):
    """One statement of a page: its SQL, its parameters, and what its rows become."""

    sql: str
    params: Mapping[str, Any]
    build: Callable[[list[Any]], T]
    #: Rows as dicts by column name (else tuples).
    named: bool = False


#: The tenant setting the policies read (as `SET_TENANT` sets it), and no JIT: a page's
#: statements are short, and compiling them cost more than running them (95 ms of 800 in a
#: walk over 20,000 messages' lineage).
_SCOPE = "SELECT set_config('autoctx.tenant', %(t)s, true), set_config('jit', 'off', true)"
#: The same for a whole session of a `PageScope`'s pool, and every transaction READ ONLY.
_PIN = (
    "SELECT set_config('autoctx.tenant', %(t)s, false), set_config('jit', 'off', false), "
    "set_config('default_transaction_read_only', 'on', false)"
)


class PageScope(TenantScope):
    """A tenant scope on a pool of its own (at most `size` connections, opened as pages need
    them), each connection pinned at connect to READ ONLY transactions, the tenant's setting
    for the row-level security policies, and no JIT, and left in autocommit: a console's pages
    read through it (`read`) and nothing else does. `close` closes its connections."""

    def __init__(self, engine: Engine, tenant: str | None = None, *, size: int = 4) -> None:
        own = create_engine(
            engine.url,
            pool_size=size,
            max_overflow=0,
            # `read` gives every connection back idle (it rolls back a failed one).
            pool_reset_on_return=None,
            isolation_level="AUTOCOMMIT",
        )
        pin = {"t": tenant or ""}

        def pinned(dbapi_connection: Any, _record: Any) -> None:
            conn: psycopg.Connection[Any] = dbapi_connection
            was, conn.autocommit = conn.autocommit, True
            conn.execute(_PIN, pin)
            conn.autocommit = was

        sa.event.listen(own, "connect", pinned)
        super().__init__(own, tenant)

    def close(self) -> None:
        self.engine.dispose()


def read(store: TenantScope, *reads: Read[Any]) -> list[Any]:
    """What each of `reads` builds, in order: its statements run in one READ ONLY transaction
    scoped to the store's tenant for the row-level security policies (without a tenant, the
    setting is the empty string: the untenanted sessions), so a page's header and its rows are
    read together.

    One round trip: the statements go to the server in one pipeline (psycopg's), on a
    connection of the store's pool, with BEGIN READ ONLY, the scope and COMMIT around them
    unless the pool is a `PageScope`'s, whose sessions hold all three already; their rows come
    back together. Through SQLAlchemy the same page cost a round trip for each of them (seven
    for a page of four statements) and SQLAlchemy's own work per statement and row."""
    pinned = isinstance(store, PageScope)
    pooled = store.engine.raw_connection()
    try:
        conn = pooled.driver_connection
        assert isinstance(conn, psycopg.Connection)
        # The transaction is the pipeline's own: psycopg must not open one.
        was_autocommit = conn.autocommit
        if not was_autocommit:
            conn.autocommit = True
        try:
            cursors = [conn.cursor(row_factory=dict_row if r.named else tuple_row) for r in reads]
            with conn.pipeline():
                if not pinned:
                    conn.execute("BEGIN READ ONLY")
                    conn.execute(_SCOPE, {"t": store.tenant or ""})
                for cursor, r in zip(cursors, reads, strict=True):
                    cursor.execute(r.sql, r.params)
                if not pinned:
                    conn.execute("COMMIT")
            rows = [cursor.fetchall() for cursor in cursors]
        finally:
            # A statement that failed leaves the transaction open (a pipeline skips the rest
            # up to its end, COMMIT included): the pool gets the connection back idle.
            if conn.info.transaction_status != TransactionStatus.IDLE and not conn.closed:
                conn.rollback()
            if not was_autocommit:
                conn.autocommit = False
    except psycopg.OperationalError:
        pooled.invalidate()
        raise
    finally:
        pooled.close()
    return [r.build(found) for r, found in zip(reads, rows, strict=True)]
