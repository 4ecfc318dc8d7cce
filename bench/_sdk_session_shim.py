"""A pytest plugin that runs the OpenAI Agents SDK's own tests with `AutoContextSession` where
they build the SDK's `SQLiteSession` (see bench/sdk_session_suite.py, which loads it).

The stand-in takes `SQLiteSession`'s arguments. Each distinct `db_path` (and each `":memory:"`
session, which SQLite keeps per connection) becomes its own namespace of autoctx session ids in
one PostgreSQL database, so tests that expect two files, or two in-memory stores, to be
independent still see that. The database is `AUTOCTX_DATABASE_URL` when set, otherwise the
embedded PostgreSQL. Every test that built a stand-in is recorded, so the runner can report on
exactly those.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from pathlib import Path
from typing import Any

import agents
import agents.memory
import agents.memory.sqlite_session
import pytest

from autoctx import AutoContextMemory, OfflineSummarizer
from autoctx.integrations.openai_agents import AutoContextSession

_RUN = uuid.uuid4().hex[:8]
_namespaces: dict[str, str] = {}
_namespaces_lock = threading.Lock()
_used: set[str] = set()
_current: list[str] = []


def _namespace(db_path: object) -> str:
    if str(db_path) == ":memory:":
        return uuid.uuid4().hex[:8]
    key = str(Path(str(db_path)).resolve())
    with _namespaces_lock:
        return _namespaces.setdefault(key, uuid.uuid4().hex[:8])


class SQLiteSessionStandIn(AutoContextSession):
    """`SQLiteSession(session_id, db_path=":memory:", sessions_table=..., messages_table=...,
    session_settings=None)`, kept by autoctx."""

    def __init__(
        self,
        session_id: str,
        db_path: str | Path = ":memory:",
        sessions_table: str = "agent_sessions",
        messages_table: str = "agent_messages",
        session_settings: Any = None,
    ) -> None:
        super().__init__(
            session_id,
            os.environ.get("AUTOCTX_DATABASE_URL"),
            summarizer=OfflineSummarizer(),
            session_settings=session_settings,
        )
        self._stored_id = f"sdk-{_RUN}-{_namespace(db_path)}-{sessions_table}-{session_id}"
        if _current:
            _used.add(_current[-1])

    def _open(self, *, create: bool) -> AutoContextMemory:
        return AutoContextMemory.open(
            self._stored_id,
            os.environ.get("AUTOCTX_DATABASE_URL"),
            summarizer=OfflineSummarizer(),
            create=create,
        )

    def close(self) -> None:
        """`SQLiteSession.close()`: the memory's connections go back to the shared pool."""
        mem, self._mem = self._mem, None
        if mem is not None:
            mem.close()


for _module in (agents, agents.memory, agents.memory.sqlite_session):
    _module.SQLiteSession = SQLiteSessionStandIn  # type: ignore[attr-defined, misc]


_outcomes: dict[str, str] = {}


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    _current.append(item.nodeid)
    try:
        return (yield)
    finally:
        _current.pop()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # A test failed if any phase failed; it passed if its call passed.
    if report.failed:
        _outcomes[report.nodeid] = "failed"
    elif report.skipped:
        _outcomes.setdefault(report.nodeid, "skipped")
    elif report.when == "call":
        _outcomes.setdefault(report.nodeid, "passed")


def pytest_sessionfinish(session: pytest.Session) -> None:
    out = os.environ.get("AUTOCTX_SDK_SHIM_REPORT")
    if out:
        Path(out).write_text(json.dumps({"used": sorted(_used), "outcomes": _outcomes}))
