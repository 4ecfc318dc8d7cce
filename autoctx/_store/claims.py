"""Claims on sessions, so that the processes that compress them (`autoctx worker`, and a memory
opened with ``background="worker"`` when it must compress itself) never compress one session
twice at once, and which sessions are due.

A claim is a row lock on the session's row of `session_claims` (migration 0010), taken with
`SELECT ... FOR UPDATE SKIP LOCKED` by a transaction of its own, on a connection of its own,
held open for as long as the compression runs: the work queue's SKIP LOCKED, on a table of its
own, so that the agent's appends (which lock the session row) never wait for it. A process that
dies drops its connection, and the server ends its transaction and the claim with it.

Why a row and not an advisory lock: advisory locks need no privilege, so any role (one granted
a single tenant included) could take the key of another tenant's session and hold it, and every
worker would skip that session while its agent waited at the window. A row lock needs the row:
the policies let a granted role see, and so lock, only the claims of its own tenants' sessions.

Every value the due query reads from a session's config is untrusted (a role granted the tenant
may write anything there, and so may an import): no cast in it can fail, whatever one row
holds. A session whose thresholds cannot be read (not numbers, or out of their range) counts
as due, so that a worker opens it and reports it (the open raises `InvalidStoredConfig`)
instead of passing it over in silence.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from typing import Final

from sqlalchemy.engine import Connection, Engine

from .sql import SET_TENANT

#: A session's threshold `key` as a number, NULL when it is not a JSON number in the range
#: `AutoContextConfig` allows (nested CASEs: the cast runs only on a number, in range).
_NUMBER = (
    "CASE WHEN jsonb_typeof(s.config -> '{key}') = 'number' THEN "
    "CASE WHEN (s.config -> '{key}')::numeric {low} AND (s.config -> '{key}')::numeric {high} "
    "THEN (s.config -> '{key}')::numeric END END"
)
_MSG_THRESHOLD = _NUMBER.format(key="msg_threshold", low=">= 1", high="<= 1e18")
_MAX_TOKENS = _NUMBER.format(key="max_tokens", low=">= 1", high="<= 1e18")
_TOKEN_RATIO = _NUMBER.format(key="token_ratio", low="> 0", high="< 1")
#: Absent (a session recorded before the setting) is 0.
_RESERVE = _NUMBER.format(key="reserve_tokens", low=">= 0", high="<= 1e18")
#: Over its token or message trigger (computed as `AutoContextConfig.token_trigger` is, from
#: the thresholds recorded on the session), or with thresholds that cannot be read; not settled
#: at its version; not one of the (session, version) pairs in `skip`.
_DUE_WHERE = f"""
    s.settled_version IS DISTINCT FROM s.version
      AND coalesce((jsonb_typeof(s.config -> 'msg_threshold') IS DISTINCT FROM 'null'
                    AND s.message_count >= {_MSG_THRESHOLD})
                   OR s.token_count >= trunc(({_MAX_TOKENS} - coalesce({_RESERVE}, 0))
                                             * {_TOKEN_RATIO}),
                   true)
      AND (CAST(%(tenant)s AS text) IS NULL OR s.tenant = CAST(%(tenant)s AS text))
      AND NOT (s.session_id || ' ' || s.version::text = ANY (CAST(%(skip)s AS text[])))
    """
#: The due sessions whose claim nobody holds (SKIP LOCKED passes over the held ones), the
#: longest untouched first; their claims are locked until the transaction ends.
_DUE = f"""
    SELECT s.session_id, s.tenant, s.version
    FROM sessions s JOIN session_claims c ON c.session_id = s.session_id
    WHERE {_DUE_WHERE}
    ORDER BY s.updated_at
    LIMIT %(n)s
    FOR UPDATE OF c SKIP LOCKED
    """
_TRY = "SELECT session_id FROM session_claims WHERE session_id = %(sid)s FOR UPDATE SKIP LOCKED"
_EXISTS = "SELECT EXISTS (SELECT 1 FROM session_claims WHERE session_id = %(sid)s)"
#: How often a claim that waits tries again.
_RETRY_S: Final = 0.05


@dataclass(frozen=True, slots=True)
class DueSession:
    session_id: str
    tenant: str | None
    #: The session's version when it was found due.
    version: int


def _skip_keys(skip: Mapping[str, int] | None) -> list[str]:
    return [f"{sid} {version}" for sid, version in (skip or {}).items()]


def due_sessions(
    engine: Engine,
    *,
    limit: int,
    tenant: str | None = None,
    skip: Mapping[str, int] | None = None,
) -> list[DueSession]:
    """Up to `limit` sessions a worker should compress and nobody holds the claim of (see
    `_DUE`); `skip` maps session ids to a version at which they are passed over."""
    with engine.begin() as conn:
        if tenant is not None:
            # Under row-level security (database tenancy) the policies read the scope.
            conn.exec_driver_sql(SET_TENANT, {"t": tenant})
        rows = conn.exec_driver_sql(
            _DUE, {"tenant": tenant, "n": limit, "skip": _skip_keys(skip)}
        ).all()
    return [DueSession(r.session_id, r.tenant, r.version) for r in rows]


def claim_due(
    engine: Engine, *, tenant: str | None = None, skip: Mapping[str, int] | None = None
) -> tuple[DueSession, SessionClaim] | None:
    """The due session nobody holds that was untouched the longest, with its claim held (found
    and taken in one statement, so two workers never race for it); None when there is none."""
    claim = SessionClaim(engine, "", tenant=tenant)
    conn = claim._open()
    try:
        row = conn.exec_driver_sql(
            _DUE, {"tenant": tenant, "n": 1, "skip": _skip_keys(skip)}
        ).one_or_none()
    except BaseException:
        claim._drop(conn)
        raise
    if row is None:
        claim._drop(conn)
        return None
    claim.session_id = row.session_id
    claim._conn = conn
    return DueSession(row.session_id, row.tenant, row.version), claim


class SessionClaim:
    """The claim on one session: `acquire` (at once or within a wait), then `release`. With
    `tenant`, the claim is taken in that tenant's scope (what a role granted the tenant needs
    to see the session's claim)."""

    def __init__(self, engine: Engine, session_id: str, *, tenant: str | None = None) -> None:
        self.engine = engine
        self.session_id = session_id
        self.tenant = tenant
        self._conn: Connection | None = None
        #: Set by `abandon`: an `acquire` running in another thread drops what it takes.
        self._abandoned = threading.Event()
        #: Orders the acquiring thread's "keep it" against `abandon`, so one of them drops it.
        self._mutex = threading.Lock()

    @property
    def held(self) -> bool:
        return self._conn is not None

    def _open(self) -> Connection:
        """A connection of its own, in a transaction (scoped to the tenant)."""
        conn = self.engine.connect()
        try:
            conn.begin()
            if self.tenant is not None:
                conn.exec_driver_sql(SET_TENANT, {"t": self.tenant})
        except BaseException:
            self._drop(conn)
            raise
        return conn

    @staticmethod
    def _drop(conn: Connection) -> None:
        try:
            conn.rollback()
        except Exception:
            conn.invalidate()  # whatever state it is in, it must not go back to the pool
        finally:
            conn.close()

    def acquire(self, wait_s: float = 0.0) -> bool:
        """Take the claim, trying for up to `wait_s` seconds; True when held. False at once
        for a session this engine (and tenant) cannot see."""
        if self._conn is not None:
            return True
        params = {"sid": self.session_id}
        deadline = time.monotonic() + wait_s
        while not self._abandoned.is_set():
            conn = self._open()
            try:
                if conn.exec_driver_sql(_TRY, params).one_or_none() is not None:
                    with self._mutex:
                        if not self._abandoned.is_set():
                            self._conn = conn
                            return True
                    self._drop(conn)  # abandoned while the statement ran
                    return False
                exists = conn.exec_driver_sql(_EXISTS, params).scalar_one()
            except BaseException:
                self._drop(conn)
                raise
            self._drop(conn)
            if not exists or time.monotonic() >= deadline:
                return False
            self._abandoned.wait(_RETRY_S)
        return False

    def release(self) -> None:
        """Give the claim up (end its transaction). A connection that cannot say so is thrown
        away, which ends the claim just as well (the server ends a closed connection's
        transaction)."""
        with self._mutex:
            conn, self._conn = self._conn, None
        if conn is not None:
            self._drop(conn)

    def abandon(self) -> None:
        """Release the claim and make an `acquire` still running in another thread give up,
        dropping whatever it takes from now on; the claim cannot be taken again."""
        with self._mutex:
            self._abandoned.set()
        self.release()


@contextlib.contextmanager
def claimed(
    engine: Engine, session_id: str, wait_s: float, *, tenant: str | None = None
) -> Iterator[bool]:
    """Hold the session's claim for the block once it is free (waiting up to `wait_s`
    seconds); yields whether it is held (the block runs either way)."""
    claim = SessionClaim(engine, session_id, tenant=tenant)
    try:
        yield claim.acquire(wait_s)
    finally:
        claim.release()


@contextlib.asynccontextmanager
async def aclaimed(claim: SessionClaim, wait_s: float) -> AsyncIterator[bool]:
    """`claimed` for a coroutine: taking the claim (in a worker thread) and releasing it are one
    guarded region, so that a cancellation at any await point, the wait for the claim included,
    leaves it free when the `CancelledError` reaches the caller (docs/design.md §5).

    The release runs in the event loop's thread, not in another thread, so that a second
    cancellation cannot skip it; it is one round trip. When the cancellation comes while the
    thread still waits for the claim, the claim is abandoned (the thread drops anything it
    takes from then on) and the thread is awaited, which is one short statement at most; a
    cancellation during that wait leaves the dropping to the thread.
    """
    taking = asyncio.ensure_future(asyncio.to_thread(claim.acquire, wait_s))
    # Its outcome is read here, or not at all once we are cancelled: never "never retrieved".
    taking.add_done_callback(lambda f: f.cancelled() or f.exception())
    try:
        yield await asyncio.shield(taking)
    finally:
        claim.abandon()
        if not taking.done():
            with contextlib.suppress(Exception):  # the error of a claim we no longer want
                await asyncio.shield(taking)
