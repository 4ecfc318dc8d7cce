"""Every Python block of README.md and docs/ runs as written (so the docs cannot drift).

Each block is extracted and executed on its own, in a fresh namespace, against this module's
test database (`AUTOCTX_DATABASE_URL`). A block that needs an LLM endpoint says so on its first
line (`# Needs an LLM endpoint: ...`, the `ENDPOINT_MARK`); it runs with `OPENAI_BASE_URL` and
`OPENAI_API_KEY` pointing at the local OpenAI-protocol server (tests/openai_server.py), as a
reader would point them at theirs. Every other block runs with neither variable set and no
default client for the Agents SDK, so a block that reaches for a model without saying so fails.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.anthropic_server import AnthropicAgent, AnthropicServer
from tests.openai_server import OpenAIServer

if TYPE_CHECKING:
    pass

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
#: How a block says that it needs an LLM endpoint (its first line starts with this).
ENDPOINT_MARK = "# Needs an LLM endpoint:"
#: How a block says that it needs an Anthropic Messages endpoint.
ANTHROPIC_MARK = "# Needs an Anthropic endpoint:"


def _blocks() -> list[tuple[str, str]]:
    found = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for k, match in enumerate(BLOCK.finditer(text), start=1):
            line = text.count("\n", 0, match.start()) + 1
            found.append((f"{doc.relative_to(ROOT)}:{line} (block {k})", match.group(1)))
    return found


BLOCKS = _blocks()


def _needs_endpoint(code: str) -> bool:
    return code.lstrip().startswith(ENDPOINT_MARK)


def _needs_anthropic(code: str) -> bool:
    return code.lstrip().startswith(ANTHROPIC_MARK)


def test_the_docs_have_python_blocks() -> None:
    # The extraction itself must not silently find nothing, and every doc is read.
    assert len(BLOCKS) >= 9
    assert {where.split(":")[0] for where, _ in BLOCKS} >= {
        "README.md",
        "docs/audit.md",
        "docs/operations.md",
    }
    # The framework examples run a model and say so; no block of docs/ needs one.
    marked = [where for where, code in BLOCKS if _needs_endpoint(code) or _needs_anthropic(code)]
    assert len(marked) >= 4 and all(where.startswith("README.md") for where in marked), marked


@pytest.fixture(scope="module")
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer() as srv:
        yield srv


@pytest.fixture(scope="module")
def anthropic_server() -> Iterator[AnthropicServer]:
    with AnthropicServer(AnthropicAgent(calls_per_run=3)) as srv:
        yield srv


@pytest.mark.parametrize(("where", "code"), BLOCKS, ids=[w for w, _ in BLOCKS])
def test_a_python_block_of_the_docs_runs(
    where: str,
    code: str,
    db_url: str,
    server: OpenAIServer,
    anthropic_server: AnthropicServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from agents import set_default_openai_api, set_tracing_disabled
    from agents.models import _openai_shared

    monkeypatch.setenv("AUTOCTX_DATABASE_URL", db_url)
    monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "1")
    # No client left over from another test: the SDK builds its own from the environment.
    monkeypatch.setattr(_openai_shared, "_default_openai_client", None)
    monkeypatch.setattr(_openai_shared, "_default_openai_key", None)
    monkeypatch.setattr(
        _openai_shared, "_use_responses_by_default", _openai_shared._use_responses_by_default
    )
    set_tracing_disabled(True)
    before = len(server.requests)
    if _needs_endpoint(code):
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test")
        # The local server speaks Chat Completions only (the block's doc says what to do then).
        set_default_openai_api("chat_completions")
    else:
        monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
        monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    anthropic_before = len(anthropic_server.agent.requests)
    if _needs_anthropic(code):
        monkeypatch.setenv("ANTHROPIC_BASE_URL", anthropic_server.base_url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "test")
    else:
        monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
        monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    exec(compile(code, where, "exec"), {"__name__": "__docs__"})
    if _needs_endpoint(code):
        assert len(server.requests) > before, f"{where} says it needs an endpoint but called none"
    else:
        assert len(server.requests) == before
    if _needs_anthropic(code):
        assert len(anthropic_server.agent.requests) > anthropic_before
        assert anthropic_server.rejected == [], "the Messages API would refuse a request"
    else:
        assert len(anthropic_server.agent.requests) == anthropic_before


def test_prepare_threshold_none_in_the_url_turns_preparation_off(db_url: str) -> None:
    """What docs/scaling.md and the README tell users behind a transaction-mode pooler."""
    from autoctx._store.database import create_engine, resolve_url

    sep = "&" if "?" in db_url else "?"
    engine = create_engine(resolve_url(db_url + sep + "prepare_threshold=none"))
    try:
        with engine.connect() as conn:
            raw = conn.connection.driver_connection
            assert raw is not None and raw.prepare_threshold is None
    finally:
        engine.dispose()
    for doc in ("README.md", "docs/scaling.md"):
        assert "prepare_threshold=none" in (ROOT / doc).read_text(encoding="utf-8")
    assert "does not expose" not in (ROOT / "docs/scaling.md").read_text(encoding="utf-8")
