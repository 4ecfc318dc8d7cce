"""How long autoctx's own statements wait for a lock, and what a longer wait becomes.

Every connection of autoctx's engines has PostgreSQL's `lock_timeout` set (`LOCK_TIMEOUT_MS`):
a statement that waits longer for a lock another connection holds is cancelled by the server
(SQLSTATE 55P03, lock_not_available), its transaction rolls back, and autoctx says so as a
`Conflict` naming the session, after trying the call again (`RETRIES`). autoctx's own
transactions hold a session's locks for milliseconds (one unit of work), so only a foreign
lock waits that long: a forgotten transaction, an operator's `LOCK TABLE`, a role that should
not hold the table privileges it has (docs/design.md §5). Without the timeout such a lock made
every call of every tenant wait for as long as it was held.

The migrations run with no timeout (`autoctx._store.database.upgrade`): their DDL must wait for
the calls in flight, and other processes wait for the migration's advisory lock.
"""

from __future__ import annotations

from typing import Final

import sqlalchemy as sa

from .._errors import Conflict

#: The server-side `lock_timeout` of autoctx's connections, in milliseconds.
LOCK_TIMEOUT_MS: Final = 5_000
#: How many times a call that met the timeout is tried again before it raises.
RETRIES: Final = 1
#: Seconds between two tries.
RETRY_PAUSE_S: Final = 0.2
#: The connection option that sets it (libpq's `options`).
CONNECT_OPTION: Final = f"-c lock_timeout={LOCK_TIMEOUT_MS}"
#: PostgreSQL's lock_not_available.
_LOCK_NOT_AVAILABLE: Final = "55P03"


class LockWaitTimeout(Conflict):
    """A statement waited for a lock another connection holds past `LOCK_TIMEOUT_MS`; its
    transaction rolled back (nothing of it was written)."""


def is_lock_timeout(exc: BaseException) -> bool:
    return (
        isinstance(exc, sa.exc.DBAPIError)
        and getattr(exc.orig, "sqlstate", None) == _LOCK_NOT_AVAILABLE
    )


def lock_wait_timeout(subject: str) -> LockWaitTimeout:
    """The error for a lock wait of a call on `subject` ("session 'x'") that timed out."""
    return LockWaitTimeout(
        f"{subject}: a lock that another database connection holds kept this call waiting "
        f"past PostgreSQL's lock_timeout (autoctx sets {LOCK_TIMEOUT_MS / 1000:g} s unless the "
        "URL's options set another); nothing of the call was written. Find the "
        "transaction that holds it (pg_locks, pg_stat_activity) and end it, then call again"
    )
