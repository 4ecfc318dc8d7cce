"""Every Python block of README.md and docs/ runs as written (so the docs cannot drift).

Each block is extracted and executed on its own, in a fresh namespace, against this module's
test database (`AUTOCTX_DATABASE_URL`); the Agents SDK's default client points at the local
OpenAI-protocol server, which answers for the model.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from agents import set_default_openai_api, set_default_openai_client, set_tracing_disabled
from openai import AsyncOpenAI

from tests.openai_server import OpenAIServer

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def _blocks() -> list[tuple[str, str]]:
    found = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for k, match in enumerate(BLOCK.finditer(text), start=1):
            line = text.count("\n", 0, match.start()) + 1
            found.append((f"{doc.relative_to(ROOT)}:{line} (block {k})", match.group(1)))
    return found


BLOCKS = _blocks()


def test_the_docs_have_python_blocks() -> None:
    # The extraction itself must not silently find nothing.
    assert len(BLOCKS) >= 4


@pytest.fixture(scope="module")
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer() as srv:
        yield srv


@pytest.mark.parametrize(("where", "code"), BLOCKS, ids=[w for w, _ in BLOCKS])
def test_a_python_block_of_the_docs_runs(
    where: str, code: str, db_url: str, server: OpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AUTOCTX_DATABASE_URL", db_url)
    set_default_openai_client(
        AsyncOpenAI(base_url=server.base_url, api_key="test", max_retries=0),
        use_for_tracing=False,
    )
    set_default_openai_api("chat_completions")
    set_tracing_disabled(True)
    if "ChatOpenAI" in code:
        # LangChain's model reads its endpoint from the environment.
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test")
    exec(compile(code, where, "exec"), {"__name__": "__docs__"})
