"""The suite's modules import no agent framework at their top level.

Every pytest-xdist worker imports every test module to collect the suite (`.ci/run` runs four),
so a framework imported at a module's top is imported by every worker, whichever runs its
tests. With all of them at the top (the Agents SDK, LangChain, ADK, Pydantic AI, AgentScope,
the Anthropic client, claude-agent-sdk, Playwright, the OpenTelemetry SDK), one collection took
15.5-18.3 s of CPU, and 7.1-7.3 s without them (`pytest --collect-only -q`), in every worker.
A test imports its framework in the function or fixture that uses it; an `if TYPE_CHECKING:`
import serves the annotations. The modules are read with `ast`, not imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent

#: What a test module imports only where it is used (each imports a framework, or is one).
FRAMEWORKS = (
    "agents",
    "agentscope",
    "anthropic",
    "autoctx.integrations",
    "claude_agent_sdk",
    "google",
    "langchain",
    "langchain_anthropic",
    "langchain_core",
    "langchain_openai",
    "langgraph",
    "opentelemetry.sdk",
    "playwright",
    "pydantic_ai",
)


def _is_framework(module: str) -> bool:
    return any(module == f or module.startswith(f + ".") for f in FRAMEWORKS)


def top_level_imports(source: str) -> list[tuple[int, str]]:
    """(line, module) of each import a module runs when it is imported: its top-level
    statements, and those of its top-level `if`, `try` and `with` blocks, but for the `if
    TYPE_CHECKING:` blocks, which never run."""
    found: list[tuple[int, str]] = []

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                found.extend((node.lineno, a.name) for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.append((node.lineno, node.module))
            elif isinstance(node, ast.If):
                if not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                for block in (node.body, node.orelse, node.finalbody):
                    visit(block)
                for handler in node.handlers:
                    visit(handler.body)
            elif isinstance(node, ast.With):
                visit(node.body)

    visit(ast.parse(source).body)
    return found


def test_the_reader_sees_what_runs_and_skips_what_does_not() -> None:
    source = (
        "import anthropic\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from langchain_core.tools import tool\n"
        "try:\n"
        "    from google.adk import Runner\n"
        "except ImportError:\n"
        "    pass\n"
        "def f():\n"
        "    from pydantic_ai import Agent\n"
    )
    assert top_level_imports(source) == [(1, "anthropic"), (2, "typing"), (6, "google.adk")]


def test_no_test_module_imports_a_framework_at_its_top() -> None:
    offenders = [
        f"{path.name}:{line} imports {module}"
        for path in sorted(TESTS.glob("*.py"))
        for line, module in top_level_imports(path.read_text())
        if _is_framework(module)
    ]
    assert not offenders, offenders
