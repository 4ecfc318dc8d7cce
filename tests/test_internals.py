"""One owner for a memory's state: outside `AutoContextMemory` itself and its named internal API
(`MemoryInternals`), no code of autoctx (the async twin, the client, the worker, the
integrations, the CLI) touches a private member of a memory (docs/design.md §5)."""

from __future__ import annotations

import ast
from pathlib import Path

from autoctx import AsyncAutoContextMemory, AutoContextMemory
from autoctx._memory import MemoryInternals, internals

PACKAGE = Path(__file__).resolve().parent.parent / "autoctx"
#: The memory's own modules (one class in layers, one module per job): everything in them is
#: the memory's own code (the async twin has its own module, `_async_memory`, and is checked
#: like any other code).
OWN_MODULES = tuple(
    PACKAGE / f"{name}.py"
    for name in ("_memory", "_memory_state", "_memory_compress", "_memory_reads")
)
#: The classes the memory is made of, and its internal API.
OWN_CLASSES = ("AutoContextMemory", "MemoryState", "MemoryCompression", "MemoryReads")
#: Receivers that name a memory in autoctx's code (`mem._lock`, `self.sync._store`, ...).
MEMORY_RECEIVERS = ("mem", "memory", "sync", "child", "parent")


def _defined_in(tree: ast.AST) -> dict[str, set[str]]:
    """Each class of `tree` with its private methods and the private attributes it sets."""
    classes: dict[str, set[str]] = {}
    for cls in ast.walk(tree):
        if not isinstance(cls, ast.ClassDef):
            continue
        names = classes.setdefault(cls.name, set())
        for node in ast.walk(cls):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                names.add(node.name)
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
            ):
                names.add(node.attr)
    return {
        c: {n for n in ns if n.startswith("_") and not n.startswith("__")}
        for c, ns in classes.items()
    }


def _trees() -> dict[Path, ast.Module]:
    return {p: ast.parse(p.read_text(encoding="utf-8")) for p in sorted(PACKAGE.rglob("*.py"))}


def _private_members() -> set[str]:
    """The memory's private methods and the private attributes it sets, in any of its layers."""
    trees = _trees()
    return {
        name
        for path in OWN_MODULES
        for cls, names in _defined_in(trees[path]).items()
        if cls in OWN_CLASSES
        for name in names
    }


def _reaches(
    tree: ast.AST, private: set[str], unique: set[str], *, only: str | None
) -> list[tuple[int, str]]:
    """`x._name` for a private member of the memory, where `x` is not the object's own
    `self`/`cls` and either the name is the memory's alone or `x` names a memory; with
    `only`, within that class only."""
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST, checked: bool) -> None:
        if isinstance(node, ast.ClassDef) and only is not None:
            checked = node.name == only
        if (
            checked
            and isinstance(node, ast.Attribute)
            and node.attr in private
            and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
            and (node.attr in unique or any(r in ast.unparse(node.value) for r in MEMORY_RECEIVERS))
        ):
            found.append((node.lineno, ast.unparse(node)))
        for child in ast.iter_child_nodes(node):
            visit(child, checked)

    visit(tree, only is None)
    return found


def test_the_memory_has_private_members_to_protect() -> None:
    private = _private_members()
    # The check below is only as good as this list: it must hold the state and the reaches the
    # async twin and the integrations used to make.
    assert {"_lock", "_store", "_background", "_background_mode", "_working"} <= private
    assert {"_working_ids", "_message_documents", "_compression", "_running"} <= private


def test_no_code_outside_the_memory_touches_its_private_members() -> None:
    trees = _trees()
    private = _private_members()
    # A name another class of autoctx defines too (a store's `_lock`) counts only on a receiver
    # that names a memory.
    others = {
        name
        for path, tree in trees.items()
        for cls, names in _defined_in(tree).items()
        if not (path in OWN_MODULES and cls in (*OWN_CLASSES, "MemoryInternals"))
        for name in names
    }
    unique = private - others
    reaches = {
        f"{path.relative_to(PACKAGE.parent)}:{line}: {text}"
        for path, tree in trees.items()
        if path not in OWN_MODULES
        for line, text in _reaches(tree, private, unique, only=None)
    }
    assert reaches == set()


def test_the_check_sees_the_reaches_it_forbids() -> None:
    """The shapes of the reaches this check replaced (the async twin's, the worker's, the Agents
    SDK session's) are found."""
    private = _private_members()
    code = """
class AsyncAutoContextMemory:
    async def f(self):
        self.sync._lock
        self.sync._background.take()
def g(mem, child):
    mem._working_ids(1)
    child._count_originals()
"""
    found = _reaches(ast.parse(code), private, set(), only=None)
    assert [text for _, text in found] == [
        "self.sync._lock",
        "self.sync._background",
        "mem._working_ids",
        "child._count_originals",
    ]


def test_the_async_memory_drives_the_sync_one_through_its_internal_api(
    open_memory: object,
) -> None:
    sync = open_memory()  # type: ignore[operator]
    assert isinstance(sync, AutoContextMemory)
    inner = internals(sync)
    assert isinstance(inner, MemoryInternals)
    assert internals(sync) is inner, "one internal API per memory"
    twin = AsyncAutoContextMemory(sync)
    assert twin._inner is inner
