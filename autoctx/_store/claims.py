"""Claims on sessions, so that the processes that compress them (`autoctx worker`, and a memory
opened with ``background="worker"`` when it must compress itself) never compress one session
twice at once, and which sessions are due.

A claim is a session-level advisory lock on (`CLAIM_SPACE`, hashtext(session id)), taken with
`pg_try_advisory_lock` on a connection of its own and held for as long as the compression
runs. It is the `SELECT ... FOR UPDATE SKIP LOCKED` of a work queue without its row lock: a row
lock on the session row would hold off the agent's appends (each takes that lock) for the
seconds the summarizer writes, which is exactly what background compression must not do. The
due query skips the sessions whose claim is held (`pg_locks`), as SKIP LOCKED skips locked
rows, and the try-lock settles any race. A process that dies drops its connection, and the
server releases its claims with it. Advisory locks are per server: a worker must reach
PostgreSQL directly or through a session-mode pooler (a transaction-mode pooler may run the
unlock on another server connection).

Two sessions whose ids hash alike share a claim: one waits for the other's compression, which
costs time, never correctness (the compression's apply re-checks its ranges anyway).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from sqlalchemy.engine import Connection, Engine

from .sql import SET_TENANT

#: The first key of every claim: "actx" in ASCII. Migrations lock with a single 64-bit key,
#: a key space of its own.
CLAIM_SPACE: Final = 0x61637478

#: Sessions over their token or message trigger (computed as `AutoContextConfig.token_trigger`
#: is, from the thresholds recorded on the session), not settled at their version, whose claim
#: nobody holds; the longest untouched first.
_DUE = """
    SELECT s.session_id, s.tenant, s.version
    FROM sessions s
    WHERE s.settled_version IS DISTINCT FROM s.version
      AND (s.message_count >= (s.config ->> 'msg_threshold')::int
           OR s.token_count >= trunc((s.config ->> 'max_tokens')::float8
                                     * (s.config ->> 'token_ratio')::float8))
      AND (CAST(%(tenant)s AS text) IS NULL OR s.tenant = CAST(%(tenant)s AS text))
      AND NOT EXISTS (
          SELECT 1 FROM pg_locks l
          WHERE l.locktype = 'advisory' AND l.granted
            AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
            AND l.classid = CAST(%(space)s AS int)::oid
            AND l.objid = hashtext(s.session_id)::oid
            AND l.objsubid = 2)
    ORDER BY s.updated_at
    LIMIT %(n)s
    """
_TRY = "SELECT pg_try_advisory_lock(%(space)s, hashtext(%(sid)s))"
_UNLOCK = "SELECT pg_advisory_unlock(%(space)s, hashtext(%(sid)s))"
#: How often a claim that waits tries again.
_RETRY_S: Final = 0.05


@dataclass(frozen=True, slots=True)
class DueSession:
    session_id: str
    tenant: str | None
    #: The session's version when it was found due.
    version: int


def due_sessions(engine: Engine, *, limit: int, tenant: str | None = None) -> list[DueSession]:
    """Up to `limit` sessions a worker should compress (see `_DUE`)."""
    with engine.begin() as conn:
        if tenant is not None:
            # Under row-level security (database tenancy) the policies read the scope.
            conn.exec_driver_sql(SET_TENANT, {"t": tenant})
        rows = conn.exec_driver_sql(
            _DUE, {"tenant": tenant, "space": CLAIM_SPACE, "n": limit}
        ).all()
    return [DueSession(r.session_id, r.tenant, r.version) for r in rows]


class SessionClaim:
    """The claim on one session: `acquire` (at once or within a wait), then `release`."""

    def __init__(self, engine: Engine, session_id: str) -> None:
        self.engine = engine
        self.session_id = session_id
        self._conn: Connection | None = None

    @property
    def held(self) -> bool:
        return self._conn is not None

    def acquire(self, wait_s: float = 0.0) -> bool:
        """Take the claim, trying for up to `wait_s` seconds; True when held."""
        if self._conn is not None:
            return True
        conn = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        params = {"space": CLAIM_SPACE, "sid": self.session_id}
        deadline = time.monotonic() + wait_s
        try:
            while not conn.exec_driver_sql(_TRY, params).scalar_one():
                if time.monotonic() >= deadline:
                    conn.close()
                    return False
                time.sleep(_RETRY_S)
        except BaseException:
            conn.invalidate()  # whatever state it is in, it must not go back to the pool
            conn.close()
            raise
        self._conn = conn
        return True

    def release(self) -> None:
        """Give the claim up. A connection that cannot say so is thrown away, which ends the
        claim just as well (the server drops a closed connection's locks)."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            conn.exec_driver_sql(_UNLOCK, {"space": CLAIM_SPACE, "sid": self.session_id})
        except Exception:
            conn.invalidate()
        finally:
            conn.close()


@contextlib.contextmanager
def claimed(engine: Engine, session_id: str, wait_s: float) -> Iterator[bool]:
    """Hold the session's claim for the block once it is free (waiting up to `wait_s`
    seconds); yields whether it is held (the block runs either way)."""
    claim = SessionClaim(engine, session_id)
    try:
        yield claim.acquire(wait_s)
    finally:
        claim.release()
