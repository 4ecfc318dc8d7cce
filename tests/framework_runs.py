"""What the framework integration tests share (the Agents SDK, LangChain, AgentScope, Pydantic
AI): the check that an integration opened its memory through the client it was given.
"""

from __future__ import annotations

import pytest

from autoctx import AutoContextClient, AutoContextMemory, SessionNotFound
from autoctx._store.database import resolve_url


def no_shared_client(db_url: str) -> bool:
    """Whether the process holds no shared client of `db_url` (`AutoContextClient.shared`)."""
    key = resolve_url(db_url).render_as_string(hide_password=False)
    return key not in AutoContextClient._shared


def assert_opened_through(client: AutoContextClient, mem: AutoContextMemory, db_url: str) -> None:
    """`mem` was opened through `client` and nothing through the shared client of `db_url`
    (closed before the integration ran): the memory is on the client's pool, outlives the
    shared clients, and `client.close()` closes it."""
    assert mem.engine is client.engine
    assert no_shared_client(db_url), "the integration opened a shared client"
    AutoContextClient.close_shared(db_url)
    assert mem.messages(), "closing the shared clients closed a memory of the given client"
    client.close()
    with pytest.raises(SessionNotFound, match="closed"):
        mem.messages()
