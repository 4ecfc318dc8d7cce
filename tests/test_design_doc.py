"""docs/design.md names, for each rule, the tests that prove it: every name it cites must be a
test that exists, so the document cannot drift from the suite unnoticed."""

from __future__ import annotations

import ast
import fnmatch
import functools
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DESIGN = ROOT / "docs" / "design.md"
#: The behaviour was once filed outside the repository under this name (spelled in two parts
#: here so that this file does not cite it).
OUTSIDE_DOCUMENT = "SPEC" + ".md"
_CITATION = re.compile(r"`(test_[a-z0-9_]+)::([a-z0-9_*]+)`")


@functools.cache  # the document cites most modules many times: each is parsed once
def _tests_of(module: str) -> frozenset[str]:
    tree = ast.parse((ROOT / "tests" / f"{module}.py").read_text(encoding="utf-8"))
    # What pytest collects: module-level functions and the methods of module-level classes.
    nodes = [*tree.body, *(n for c in tree.body if isinstance(c, ast.ClassDef) for n in c.body)]
    return frozenset(
        node.name
        for node in nodes
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name.startswith("test_")
    )


def test_every_test_the_design_cites_exists() -> None:
    citations = _CITATION.findall(DESIGN.read_text(encoding="utf-8"))
    assert len(citations) > 100
    missing = [
        f"{module}::{pattern}"
        for module, pattern in citations
        if not (ROOT / "tests" / f"{module}.py").exists()
        or not fnmatch.filter(_tests_of(module), pattern)
    ]
    assert missing == []


def test_the_code_cites_the_repositorys_own_document() -> None:
    """Comments cite docs/design.md; no file of the repository cites a document it lacks."""
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    citing = [
        path
        for path in tracked
        if path.endswith((".py", ".md", ".toml"))
        and OUTSIDE_DOCUMENT in (ROOT / path).read_text(encoding="utf-8")
    ]
    assert citing == []
