"""Pause a process inside a phase of its work, from outside the library, so that a test can kill it
there (tests/crash_child.py, tests/test_concurrency.py).

A `Pauser` installs SQLAlchemy event listeners on a memory's engine and wraps its summarizer.
Once armed with a phase, the process writes "PAUSED <phase>" to stderr when it reaches that phase
and sleeps until killed. Unarmed, the listeners only note which statements a transaction ran.

The phases are recognized by the statements the store sends (see `_is_append`, `_is_lock`,
`_is_lineage`), not by hooks in autoctx: a production process has no switch that can hang it.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from autoctx import Summarizer, SummaryRequest, SummaryResult

#: The phases a process can be paused in.
PHASES: tuple[str, ...] = (
    # inside an append transaction, rows written, not committed: only a process's first append
    # (which locks the session row and writes in several statements) has this window; the
    # usual append is one autocommit statement
    "append.before_commit",
    "append.after_commit",  # every append: committed, not yet returned to the caller
    "summarize.during",  # while the summarizer call is in flight (no lock held)
    "apply.after_lock",  # inside the apply transaction, session row locked, nothing written
    "apply.before_commit",  # inside the apply transaction, everything written, not committed
)

#: Keys of a DBAPI connection's `info` dict (shared by its SQLAlchemy connection and pool
#: entry) where the listeners note what the current transaction did.
_MARKS = "tests.pauses.marks"
_COMMITTED_APPEND = "tests.pauses.committed_append"


def _words(statement: str) -> str:
    return " ".join(statement.split()).upper()


def _is_append(statement: str) -> bool:
    """The store's one-statement append: it claims the session row and inserts the messages."""
    s = _words(statement)
    return "UPDATE SESSIONS" in s and "INSERT INTO MESSAGES" in s


def _is_lock(statement: str) -> bool:
    """The session row lock every writing transaction of the store begins with."""
    s = _words(statement)
    return s.startswith("SELECT") and "FROM SESSIONS" in s and s.endswith("FOR UPDATE")


def _is_lineage(statement: str) -> bool:
    """Only an apply writes lineage rows (in the crash workload: no pop_last, no erasure)."""
    return "INSERT INTO LINEAGE" in _words(statement)


def pause(phase: str) -> None:
    """Report `phase` on stderr and sleep until killed."""
    sys.stderr.write(f"PAUSED {phase}\n")
    sys.stderr.flush()
    while True:
        time.sleep(3600)


class Pauser:
    """Pauses the process at `phase` once armed; see the module docstring."""

    def __init__(self, phase: str | None = None) -> None:
        if phase is not None and phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}; one of {', '.join(PHASES)}")
        self.phase = phase

    def arm(self, phase: str) -> None:
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}; one of {', '.join(PHASES)}")
        self.phase = phase

    def _at(self, phase: str) -> None:
        if self.phase == phase:
            pause(phase)

    # -- the engine's listeners -------------------------------------------------------------

    def install(self, engine: sa.Engine) -> None:
        """Listen on `engine` (and so on every engine derived with `execution_options`, such
        as the store's autocommit one, which shares its events and pool)."""
        sa.event.listen(engine, "begin", self._begin)
        sa.event.listen(engine, "before_cursor_execute", self._before_execute)
        sa.event.listen(engine, "after_cursor_execute", self._after_execute)
        sa.event.listen(engine, "commit", self._commit)
        sa.event.listen(engine, "rollback", self._rollback)
        sa.event.listen(engine, "checkin", self._checkin)

    @staticmethod
    def _marks(conn: Connection) -> list[str]:
        marks: list[str] = conn.info.setdefault(_MARKS, [])
        return marks

    def _begin(self, conn: Connection) -> None:
        conn.info[_MARKS] = []
        conn.info.pop(_COMMITTED_APPEND, None)

    def _before_execute(
        self,
        conn: Connection,
        cursor: Any,
        statement: str,
        parameters: Any,
        context: Any,
        executemany: bool,
    ) -> None:
        marks = self._marks(conn)
        # An apply's first statement after the lock is its read of the working set (an append's
        # is its write, a recorded event's an insert): the lock is held, nothing is written.
        if marks and marks[-1] == "lock" and _words(statement).startswith("SELECT"):
            self._at("apply.after_lock")

    def _after_execute(
        self,
        conn: Connection,
        cursor: Any,
        statement: str,
        parameters: Any,
        context: Any,
        executemany: bool,
    ) -> None:
        marks = self._marks(conn)
        if _is_lock(statement):
            marks.append("lock")
        elif _is_append(statement):
            if conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT":
                # An autocommit statement is committed when it returns.
                self._at("append.after_commit")
            marks.append("append")
        elif _is_lineage(statement):
            marks.append("lineage")
        else:
            marks.append("other")

    def _commit(self, conn: Connection) -> None:
        # The event fires before the COMMIT is sent: the transaction's writes are all made.
        marks = self._marks(conn)
        if "append" in marks:
            self._at("append.before_commit")
            conn.info[_COMMITTED_APPEND] = True
        if "lineage" in marks:
            self._at("apply.before_commit")
        marks.clear()

    def _rollback(self, conn: Connection) -> None:
        self._marks(conn).clear()
        conn.info.pop(_COMMITTED_APPEND, None)

    def _checkin(self, dbapi_connection: Any, record: Any) -> None:
        # A transaction's connection goes back to the pool right after its COMMIT returned, and
        # before the store's method returns to the caller.
        if record.info.pop(_COMMITTED_APPEND, False):
            self._at("append.after_commit")

    # -- the summarizer ---------------------------------------------------------------------

    def summarizer(self, inner: Summarizer) -> Summarizer:
        """`inner`, pausing in "summarize.during" with its call in flight once armed."""
        return _PausingSummarizer(self, inner)


class _PausingSummarizer:
    def __init__(self, pauser: Pauser, inner: Summarizer) -> None:
        self._pauser = pauser
        self._inner = inner

    def summarize(self, request: SummaryRequest) -> SummaryResult:
        if self._pauser.phase == "summarize.during":
            # The real call runs on in a thread, so that the kill lands with the request sent
            # and its answer pending or arriving, as during a real LLM call.
            threading.Thread(target=self._inner.summarize, args=(request,), daemon=True).start()
            pause("summarize.during")
        return self._inner.summarize(request)
