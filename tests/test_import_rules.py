"""The import rules between autoctx's layers (docs/design.md §2: a pure core, a thin shell).

Every module's imports are read with `ast` (at any depth: a function's lazy import and a
`TYPE_CHECKING` import count too) as (module, name) pairs, and checked against three rules:

1. **The core performs no I/O.** The compression loop and what it is made of (the loop in
   `_compressor` and the layers it is built on, `_summarizing` and `_compression_state`; its
   effects and drivers, the planners in `_strategies`, the plans, the replacements, the
   prompts) import nothing of the SQL shell (`_store`) nor of the summarizer
   implementations (`_summarizers`). They talk to a store through the contract in `_effects`
   and to a summarizer through the one in `_summary`; the memory hands both in.
2. **The store does no planning.** Nothing in `_store` imports a planning module, that is a
   module that decides what a compression or an append writes: the loop and its drivers
   (`_compressor`, `_drivers`), the planners (`_strategies`), the prompts (`_prompts`,
   `_agent_plan`), the summarizers (`_summarizers`, `_summary`, `_answers`), nor the two rules
   the intake and the structure apply to messages (`_intake.bind`, the open-call rule of an
   append; `_structure.is_final_answer`, the final-answer rule). The vocabulary both sides
   speak is allowed: what planning reads and writes (`_plans`: `Snapshot`, `Edit`, and what
   an edit means, `Snapshot.apply`), `_replacements`, `_effects`, messages, events, config.
3. **Nothing below the facade imports it.** The facade is `autoctx` (its `__init__`),
   `_memory`, `_async_memory`, `_memory_open` and `_client`; above it are only the callers
   that are handed memories: the CLI (`_cli`), the integrations, the worker and the
   operators' calls (`_operations`).

An import another area of the code still owns (being moved as this is written) is listed in
`EXCEPTIONS` with its reason, so that the rule holds for everything else and the list shows
what is left; an exception that no longer occurs fails the test, so the list only shrinks.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "autoctx"

#: Rule 1: the core.
CORE = (
    "autoctx._compressor",
    "autoctx._summarizing",
    "autoctx._compression_state",
    "autoctx._drivers",
    "autoctx._effects",
    "autoctx._plans",
    "autoctx._replacements",
    "autoctx._prompts",
    "autoctx._strategies",
    "autoctx._trigger",
)
#: Rule 1: what the core never imports.
SHELL = ("autoctx._store", "autoctx._summarizers")
#: Rule 2: planning modules, and planning names of other modules.
PLANNING_MODULES = (
    "autoctx._compressor",
    "autoctx._summarizing",
    "autoctx._compression_state",
    "autoctx._drivers",
    "autoctx._strategies",
    "autoctx._trigger",
    "autoctx._prompts",
    "autoctx._agent_plan",
    "autoctx._summarizers",
    "autoctx._summary",
    "autoctx._answers",
)
PLANNING_NAMES = (
    ("autoctx._intake", "bind"),
    ("autoctx._structure", "is_final_answer"),
)
#: Rule 3.
FACADE = (
    "autoctx",
    "autoctx._memory",
    "autoctx._memory_state",
    "autoctx._memory_compress",
    "autoctx._memory_reads",
    "autoctx._async_memory",
    "autoctx._memory_open",
    "autoctx._client",
)
ABOVE_FACADE = ("autoctx._cli", "autoctx.integrations", "autoctx._worker", "autoctx._operations")

#: (importing module, imported module, name or None): imports that break a rule today, each
#: owned by another change under way.
EXCEPTIONS: dict[tuple[str, str, str | None], str] = {
    # The append binds the batch to the calls left open at the session's tail, which only the
    # locked transaction sees as they are; the store calls the one pure rule (`_intake.bind`)
    # from the one method both append paths use (`SessionStore._append_at`).
    ("autoctx._store.store", "autoctx._intake", "bind"): "the open-call rule, under the lock",
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def is_module(name: str) -> bool:
    path = PACKAGE.parent / name.replace(".", "/")
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def imports_of(path: Path) -> Iterator[tuple[str, str | None]]:
    """(module, name) for each name imported from an autoctx module (name None for
    `import x`); `from package import submodule` is an import of the submodule."""
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "autoctx":
                    yield alias.name, None
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            if target.split(".")[0] != "autoctx":
                continue
            for alias in node.names:
                if is_module(f"{target}.{alias.name}"):
                    yield f"{target}.{alias.name}", None
                else:
                    yield target, alias.name


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def broken_rules() -> dict[tuple[str, str, str | None], str]:
    """Every import that breaks a rule: (importer, imported, name) -> which rule."""
    found: dict[tuple[str, str, str | None], str] = {}
    for path in modules():
        importer = module_name(path)
        for imported, name in imports_of(path):
            key = (importer, imported, name)
            if under(importer, CORE) and under(imported, SHELL):
                found[key] = "the core imports the shell"
            planning = under(imported, PLANNING_MODULES) or (imported, name) in PLANNING_NAMES
            if under(importer, ("autoctx._store",)) and planning:
                found[key] = "the store imports planning"
            if (
                imported in FACADE
                and not under(importer, FACADE)
                and not under(importer, ABOVE_FACADE)
            ):
                found[key] = "below the facade, an import of the facade"
    return found


def test_the_reader_sees_each_form_of_import() -> None:
    """The rules are only as good as the reader: it resolves each form an import takes."""
    found = dict.fromkeys(imports_of(PACKAGE / "_compressor.py"))
    assert ("autoctx._effects", "ask") in found  # relative, a name
    assert ("autoctx._strategies._common", "layout_of") in found  # relative, a dotted module
    found = dict.fromkeys(imports_of(PACKAGE / "_memory.py"))
    assert ("autoctx._arguments", None) in found  # `from . import submodule`
    found = dict.fromkeys(imports_of(PACKAGE / "_store" / "store.py"))
    assert ("autoctx._intake", "bind") in found  # two levels up


def test_the_core_imports_neither_the_store_nor_the_summarizers() -> None:
    broken = {k: v for k, v in broken_rules().items() if v == "the core imports the shell"}
    assert not broken, broken


def test_the_store_imports_no_planning_module() -> None:
    broken = {
        k: v
        for k, v in broken_rules().items()
        if v == "the store imports planning" and k not in EXCEPTIONS
    }
    assert not broken, broken


def test_nothing_below_the_facade_imports_it() -> None:
    broken = {
        k: v for k, v in broken_rules().items() if v == "below the facade, an import of the facade"
    }
    assert not broken, broken


@pytest.mark.parametrize("exception", sorted(EXCEPTIONS, key=str), ids=str)
def test_each_exception_still_occurs(exception: tuple[str, str, str | None]) -> None:
    """An exception whose import is gone is struck from the list (it only shrinks)."""
    assert exception in broken_rules(), f"{exception} no longer occurs: remove it from EXCEPTIONS"


def test_nothing_the_compressor_loads_imports_the_shell() -> None:
    """Beyond its own imports: no module the loop imports, directly or through others,
    imports the SQL shell or the summarizer implementations (the OpenAI client among them)."""
    closure = _core_closure()
    assert "autoctx._strategies.s7_fold" in closure  # the walk follows imports down
    assert not [m for m in closure if under(m, SHELL)], sorted(closure)


def _core_closure() -> set[str]:
    """The autoctx modules the compressor imports, directly or through others (packages'
    `__init__` included, but not `autoctx`'s own, which is the facade)."""
    by_name = {module_name(p): p for p in modules()}
    seen: set[str] = set()
    todo = ["autoctx._compressor"]
    while todo:
        name = todo.pop()
        if name in seen or name not in by_name:
            continue
        seen.add(name)
        parts = name.split(".")
        todo.extend(".".join(parts[:k]) for k in range(2, len(parts)))  # parent packages
        todo.extend(imported for imported, _ in imports_of(by_name[name]))
    return seen


def import_graph() -> dict[str, set[str]]:
    """Each autoctx module -> the autoctx modules it imports (at any depth, lazy and
    `TYPE_CHECKING` imports included: a circle hidden in a function is still a circle)."""
    return {module_name(path): {imported for imported, _ in imports_of(path)} for path in modules()}


def circles(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, with an
    explicit stack): each is a set of modules that import one another, directly or not."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[tuple[str, ...]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next((c for c in children if c in graph), None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(tuple(sorted(component)))
    return found


def test_the_circle_finder_finds_a_circle() -> None:
    """The finder sees a circle through three modules, a lazy one among them, and no more."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"d"}}
    assert circles(graph) == [("a", "b", "c")]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_itself_back() -> None:
    """No import circle (docs/design.md §2): the Anthropic codec is a leaf `_messages` does not
    import back (the dispatch between formats is `_coerce`, above both); the config takes the
    LLM rungs from a leaf (`_llm_rungs`) the registry imports too, not from the registry,
    which imports the planners, which import the config; the memory holds a contract of its
    client (`MemoryClient`) and reaches the shared client through a leaf the package fills
    (`_shared_opening`), so that only the client imports the memory."""
    found = circles(import_graph())
    assert not found, found


#: The memory's modules, and the async twin and the opening, which the client is above.
MEMORY_MODULES = (
    "autoctx._memory",
    "autoctx._memory_state",
    "autoctx._memory_compress",
    "autoctx._memory_reads",
    "autoctx._memory_open",
    "autoctx._async_memory",
)


def test_the_memory_does_not_import_its_client() -> None:
    """The client opens memories; a memory never imports the client (nor the package, which
    holds it): it holds a `MemoryClient`, and `open` goes through `_shared_opening`."""
    graph = import_graph()
    assert "autoctx._client" in graph["autoctx._worker"]  # the reader sees the client's users
    reaches = {
        (module, imported)
        for module in MEMORY_MODULES
        for imported in graph[module]
        if imported in ("autoctx._client", "autoctx")
    }
    assert reaches == set()


#: The most lines a module of autoctx may have (issue 33): past it, split the module by job.
MAX_MODULE_LINES = 800


def test_no_module_is_over_800_lines() -> None:
    """Each module holds one job, small enough to read whole: a module over the limit is split
    by job (the memory, the compressor and the store are classes built in layers, one module
    per job)."""
    sizes = {
        str(path.relative_to(PACKAGE.parent)): len(path.read_text(encoding="utf-8").splitlines())
        for path in modules()
    }
    assert sizes, "no module found"
    over = {name: n for name, n in sizes.items() if n > MAX_MODULE_LINES}
    assert not over, f"modules over {MAX_MODULE_LINES} lines: {over}"
