"""The public face: the exact names `autoctx` exports, every type a public method's signature
names is one of them, and the error tree keeps each class's built-in bases (so `except`
clauses written against older versions still catch)."""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import json
import subprocess
import sys
import typing
from collections.abc import Callable

import pytest

import autoctx
from autoctx import (
    AsyncAutoContextMemory,
    AutoContextClient,
    AutoContextMemory,
    InvalidMessageId,
    MessageNotFound,
    Msg,
    SessionNotFound,
)

EXPORTED = [
    "AsyncAutoContextMemory",
    "AsyncSummarizer",
    "AutoContextClient",
    "AutoContextConfig",
    "AutoContextErasure",
    "AutoContextError",
    "AutoContextMemory",
    "AutoContextSearchHit",
    "BackendError",
    "BackgroundMode",
    "CompressionHooks",
    "CompressionInfo",
    "ConfigError",
    "Conflict",
    "ContextOverWindow",
    "DatabaseUnavailable",
    "ErasureNotPermitted",
    "Event",
    "EventNotFound",
    "FactCheck",
    "InvalidArgument",
    "InvalidDuration",
    "InvalidErasure",
    "InvalidEventId",
    "InvalidExport",
    "InvalidMessage",
    "InvalidMessageId",
    "InvalidOffloadId",
    "InvalidPage",
    "InvalidPlan",
    "InvalidSearch",
    "InvalidSessionId",
    "InvalidStoredConfig",
    "InvalidTenant",
    "MessageInput",
    "MessageNotFound",
    "Msg",
    "NotFound",
    "OfflineSummarizer",
    "OffloadNotFound",
    "OpaqueBlock",
    "OpenAISummarizer",
    "RuntimeOptions",
    "SchemaError",
    "SearchScope",
    "SessionExists",
    "SessionInfo",
    "SessionNotFound",
    "Summarizer",
    "SummarizerError",
    "SummarizerUsage",
    "SummaryRequest",
    "SummaryResult",
    "TenantGrantError",
    "TextBlock",
    "ToolFormat",
    "ToolResultBlock",
    "ToolUseBlock",
    "UndoRefused",
    "export_session",
    "from_anthropic_messages",
    "from_openai_messages",
    "grant_tenant",
    "import_session",
    "purge_sessions",
    "revoke_tenant",
    "to_anthropic_messages",
    "to_openai_messages",
    "upgrade_database",
]


def test_all_is_pinned_and_every_name_imports() -> None:
    assert sorted(autoctx.__all__) == sorted(EXPORTED)
    assert len(set(autoctx.__all__)) == len(autoctx.__all__)
    for name in EXPORTED:
        assert getattr(autoctx, name) is not None, name


def _is_foreign(name: str, obj: object) -> bool:
    """True for a name of Python's or another library's (int, Any, Iterable, Engine, uuid)."""
    if inspect.ismodule(obj) or getattr(builtins, name, None) is obj:
        return True
    if getattr(typing, name, None) is obj:
        return True
    module = getattr(obj, "__module__", None) or ""
    # An alias autoctx defines (a union, a Literal) reports typing's module: it is autoctx's.
    return isinstance(obj, type) and not module.startswith("autoctx")


def _signature_names() -> dict[str, str]:
    """Each name used in a public method's annotations, with one method that uses it."""
    names: dict[str, str] = {}
    for cls in (AutoContextMemory, AsyncAutoContextMemory, AutoContextClient):
        for attr, member in inspect.getmembers(cls):
            if attr.startswith("_"):
                continue
            fn = member.fget if isinstance(member, property) else member
            for annotation in getattr(fn, "__annotations__", {}).values():
                assert isinstance(annotation, str), (cls, attr)  # postponed annotations
                for node in ast.walk(ast.parse(annotation, mode="eval")):
                    if isinstance(node, ast.Name):
                        names.setdefault(node.id, f"{cls.__name__}.{attr}")
    return names


def test_every_type_in_a_public_signature_is_exported() -> None:
    names = _signature_names()
    assert {"MessageInput", "BackgroundMode", "SearchScope", "Msg"} <= set(names)
    modules = [vars(sys.modules[c.__module__]) for c in (AutoContextMemory, AutoContextClient)]
    missing = []
    for name, where in sorted(names.items()):
        obj = next((ns[name] for ns in modules if name in ns), getattr(builtins, name, None))
        if obj is None:  # imported for type checking only
            obj = getattr(autoctx, name, None)
        if (obj is None or not _is_foreign(name, obj)) and name not in autoctx.__all__:
            missing.append(f"{name} (in {where})")
    assert not missing, f"types in public signatures that autoctx does not export: {missing}"


def test_no_public_name_is_defined_in_the_sql_shell() -> None:
    """The public types live outside `autoctx._store` (the store builds them, it does not own
    them); the old module paths stay importable for code written against them."""
    defined_in_store = [
        name
        for name in autoctx.__all__
        if getattr(getattr(autoctx, name), "__module__", "").startswith("autoctx._store")
    ]
    assert defined_in_store == []
    from autoctx._store.lifecycle import AutoContextErasure
    from autoctx._store.rows import SessionInfo

    assert SessionInfo is autoctx.SessionInfo
    assert AutoContextErasure is autoctx.AutoContextErasure


#: Each error: its intermediate base, and the built-in bases it had before the tree.
TREE: dict[str, tuple[str, tuple[type[BaseException], ...]]] = {
    "ConfigError": ("InvalidArgument", (ValueError,)),
    "InvalidMessage": ("InvalidArgument", (ValueError, TypeError)),
    "InvalidSessionId": ("InvalidArgument", (ValueError,)),
    "InvalidMessageId": ("InvalidArgument", (ValueError,)),
    "InvalidEventId": ("InvalidArgument", (ValueError,)),
    "InvalidOffloadId": ("InvalidArgument", (ValueError,)),
    "InvalidPlan": ("InvalidArgument", (ValueError,)),
    "InvalidErasure": ("InvalidArgument", (ValueError,)),
    "InvalidExport": ("InvalidArgument", (ValueError,)),
    "InvalidDuration": ("InvalidArgument", (ValueError,)),
    "InvalidSearch": ("InvalidArgument", (ValueError,)),
    "TenantGrantError": ("InvalidArgument", (ValueError,)),
    "InvalidStoredConfig": ("InvalidArgument", (ValueError,)),
    "InvalidPage": ("InvalidArgument", (ValueError,)),
    # Also an InvalidSessionId and a TenantGrantError: what open and grant_tenant raised
    # for a bad tenant before the class existed.
    "InvalidTenant": (
        "InvalidArgument",
        (ValueError, autoctx.InvalidSessionId, autoctx.TenantGrantError),
    ),
    "SessionNotFound": ("NotFound", (LookupError,)),
    "MessageNotFound": ("NotFound", (LookupError,)),
    "EventNotFound": ("NotFound", (LookupError,)),
    "OffloadNotFound": ("NotFound", (LookupError,)),
    "SessionExists": ("Conflict", (ValueError,)),
    "UndoRefused": ("Conflict", ()),
    "ErasureNotPermitted": ("Conflict", (PermissionError,)),
    "ContextOverWindow": ("Conflict", ()),
    "DatabaseUnavailable": ("BackendError", (ConnectionError,)),
    "SchemaError": ("BackendError", (RuntimeError,)),
    "SummarizerError": ("BackendError", (RuntimeError,)),
}


@pytest.mark.parametrize("name", sorted(TREE))
def test_each_error_sits_under_one_base_and_keeps_its_builtin_bases(name: str) -> None:
    base, builtin_bases = TREE[name]
    cls = getattr(autoctx, name)
    assert issubclass(cls, getattr(autoctx, base))
    assert issubclass(cls, autoctx.AutoContextError)
    for builtin in builtin_bases:
        assert issubclass(cls, builtin), (name, builtin)
    others = {"InvalidArgument", "NotFound", "Conflict", "BackendError"} - {base}
    assert not any(issubclass(cls, getattr(autoctx, o)) for o in others), name


def test_every_error_class_is_in_the_tree() -> None:
    errors = {
        n
        for n in autoctx.__all__
        if isinstance(getattr(autoctx, n), type) and issubclass(getattr(autoctx, n), Exception)
    }
    bases = {"AutoContextError", "InvalidArgument", "NotFound", "Conflict", "BackendError"}
    assert errors - bases == set(TREE)


def test_a_message_id_is_checked_alike_by_reload_fork_and_erase(
    open_memory: Callable[..., AutoContextMemory],
) -> None:
    mem = open_memory()
    mem.add([Msg.user("secret words"), Msg.assistant("more secret words")])
    before = [(m.id, m.text) for m in mem.messages()]

    def calls(value: object) -> list[Callable[[], object]]:
        return [
            lambda: mem.reload(message_id=value),  # type: ignore[arg-type]
            lambda: mem.fork(f"{mem.session_id}-f", at_message=value),  # type: ignore[arg-type]
            lambda: mem.erase([value], reason="a test"),  # type: ignore[list-item]
        ]

    for malformed in ("1", 1.0, True, 0, -3, 2**63):
        for call in calls(malformed):
            with pytest.raises(InvalidMessageId, match=r"message.id") as info:
                call()
            assert "secret" not in str(info.value)
    for unknown in (10**9, 2**63 - 1):
        for call in calls(unknown):
            with pytest.raises(MessageNotFound) as found:
                call()
            assert "secret" not in str(found.value)
    assert [(m.id, m.text) for m in mem.messages()] == before
    with pytest.raises(SessionNotFound):  # no fork was made
        AutoContextMemory.open(f"{mem.session_id}-f", mem.engine.url, create=False)


#: Libraries `import autoctx` must not load (issue 33: the import stays under 150 ms; these
#: are most of what it cost, see bench/import_time.py): they load with the first public name
#: that needs them.
HEAVY = ("sqlalchemy", "psycopg", "openai", "tiktoken", "alembic")


def test_importing_autoctx_loads_no_heavy_library() -> None:
    """A fresh interpreter: `import autoctx` loads none of `HEAVY`; the first use of
    `AutoContextMemory` loads SQLAlchemy and psycopg (so the check sees them when they load)."""
    code = (
        "import json, sys\n"
        "import autoctx\n"
        f"heavy = {HEAVY!r}\n"
        "loaded = lambda: sorted({m.split('.')[0] for m in sys.modules} & set(heavy))\n"
        "at_import = loaded()\n"
        "autoctx.AutoContextMemory\n"
        "print(json.dumps([at_import, loaded()]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout
    at_import, after_use = json.loads(out)
    assert at_import == []
    assert {"sqlalchemy", "psycopg"} <= set(after_use)


def test_every_public_name_is_importable_lazily_and_by_type_checkers() -> None:
    """Each name of `__all__` resolves through the package's lazy imports to the object its
    module defines, and `dir(autoctx)` lists it; an unknown name is an AttributeError."""
    for name in autoctx.__all__:
        assert name in dir(autoctx), name
        value = getattr(autoctx, name)
        module, attribute = autoctx._EXPORTS.get(name, (None, name))
        if module is not None:
            assert value is getattr(importlib.import_module(f"autoctx.{module}"), attribute)
    with pytest.raises(AttributeError, match="no attribute 'NoSuchName'"):
        autoctx.NoSuchName  # noqa: B018
