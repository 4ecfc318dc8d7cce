"""What the framework integration tests share (the Agents SDK, LangChain, AgentScope, Pydantic
AI): the check that an integration opened its memory through the client it was given, and the
import error of an integration whose framework is not installed.
"""

from __future__ import annotations

import json
import subprocess
import sys

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


_WITHOUT = """
import importlib, importlib.abc, json, sys
blocked = set(sys.argv[2:])
class Without(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Without())
try:
    importlib.import_module(sys.argv[1])
except ModuleNotFoundError as exc:
    print(json.dumps({"message": str(exc), "name": exc.name}))
"""


def import_error_without(module: str, *packages: str) -> tuple[str, str]:
    """The message and `name` of the `ModuleNotFoundError` that importing `module` raises in a
    child interpreter where `packages` cannot be found, as on an install without the extra."""
    out = subprocess.run(
        [sys.executable, "-c", _WITHOUT, module, *packages],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout, f"importing {module} without {packages} raised nothing"
    error = json.loads(out.stdout)
    return error["message"], error["name"]


def assert_names_the_extra(message: str, extra: str) -> None:
    """The message says which extra to install, from the package index and in a checkout."""
    assert f'pip install "autoctx-pg[{extra}]"' in message, message
    assert f'pip install -e ".[{extra}]"' in message, message
