"""autoctx: a working memory for long-running, tool-using LLM agents, kept in PostgreSQL.

from autoctx import AutoContextMemory, AutoContextConfig, Msg

mem = AutoContextMemory.open("agent-42", config=AutoContextConfig(max_tokens=128_000))
mem.add({"role": "user", "content": "Fix the failing test"})
events = mem.compress_if_needed()
messages = mem.to_openai()
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# `import autoctx` loads nothing heavy (issue 33: under 150 ms): each public name is imported
# from its module on first use (PEP 562), and SQLAlchemy, psycopg and the summarizers' clients
# with it. Type checkers read the imports below instead.
from . import _shared_opening

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

    from ._anthropic import from_anthropic_messages
    from ._anthropic import to_anthropic as to_anthropic_messages
    from ._async_memory import AsyncAutoContextMemory
    from ._background import BackgroundMode
    from ._client import AutoContextClient
    from ._config import AutoContextConfig, RuntimeOptions
    from ._erasure_result import AutoContextErasure
    from ._errors import (
        AutoContextError,
        BackendError,
        ConfigError,
        Conflict,
        ContextOverWindow,
        DatabaseUnavailable,
        ErasureNotPermitted,
        EventNotFound,
        InvalidArgument,
        InvalidDuration,
        InvalidErasure,
        InvalidEventId,
        InvalidExport,
        InvalidMessage,
        InvalidMessageId,
        InvalidOffloadId,
        InvalidPage,
        InvalidPlan,
        InvalidSearch,
        InvalidSessionId,
        InvalidStoredConfig,
        InvalidTenant,
        MessageNotFound,
        NotFound,
        OffloadNotFound,
        SchemaError,
        SessionExists,
        SessionNotFound,
        SummarizerError,
        TenantGrantError,
        UndoRefused,
    )
    from ._events import Event, FactCheck
    from ._memory import AutoContextMemory, MessageInput
    from ._memory_reads import ToolFormat
    from ._messages import (
        Msg,
        OpaqueBlock,
        TextBlock,
        ToolResultBlock,
        ToolUseBlock,
        from_openai_messages,
        to_openai_messages,
    )
    from ._observe import CompressionHooks, CompressionInfo, SummarizerUsage
    from ._open_arguments import OpenArguments
    from ._operations import export_session, import_session, purge_sessions
    from ._search import AutoContextSearchHit, SearchScope
    from ._sessions import SessionInfo
    from ._summarizers import (
        AsyncSummarizer,
        OfflineSummarizer,
        OpenAISummarizer,
        Summarizer,
        SummaryRequest,
        SummaryResult,
    )
else:

    def __getattr__(name: str) -> object:
        """A public name, imported from its module on first use (then kept here)."""
        where = _EXPORTS.get(name)
        if where is None:
            raise AttributeError(f"module 'autoctx' has no attribute {name!r}")
        module, attribute = where
        value = getattr(importlib.import_module(f".{module}", __name__), attribute)
        globals()[name] = value
        return value


#: Each public name (but the functions defined below): its module and its name there.
_EXPORTS: dict[str, tuple[str, str]] = {
    "AsyncAutoContextMemory": ("_async_memory", "AsyncAutoContextMemory"),
    "AsyncSummarizer": ("_summarizers", "AsyncSummarizer"),
    "AutoContextClient": ("_client", "AutoContextClient"),
    "AutoContextConfig": ("_config", "AutoContextConfig"),
    "AutoContextErasure": ("_erasure_result", "AutoContextErasure"),
    "AutoContextError": ("_errors", "AutoContextError"),
    "AutoContextMemory": ("_memory", "AutoContextMemory"),
    "AutoContextSearchHit": ("_search", "AutoContextSearchHit"),
    "BackendError": ("_errors", "BackendError"),
    "BackgroundMode": ("_background", "BackgroundMode"),
    "CompressionHooks": ("_observe", "CompressionHooks"),
    "CompressionInfo": ("_observe", "CompressionInfo"),
    "ConfigError": ("_errors", "ConfigError"),
    "Conflict": ("_errors", "Conflict"),
    "ContextOverWindow": ("_errors", "ContextOverWindow"),
    "DatabaseUnavailable": ("_errors", "DatabaseUnavailable"),
    "ErasureNotPermitted": ("_errors", "ErasureNotPermitted"),
    "Event": ("_events", "Event"),
    "EventNotFound": ("_errors", "EventNotFound"),
    "FactCheck": ("_events", "FactCheck"),
    "InvalidArgument": ("_errors", "InvalidArgument"),
    "InvalidDuration": ("_errors", "InvalidDuration"),
    "InvalidErasure": ("_errors", "InvalidErasure"),
    "InvalidEventId": ("_errors", "InvalidEventId"),
    "InvalidExport": ("_errors", "InvalidExport"),
    "InvalidMessage": ("_errors", "InvalidMessage"),
    "InvalidMessageId": ("_errors", "InvalidMessageId"),
    "InvalidOffloadId": ("_errors", "InvalidOffloadId"),
    "InvalidPage": ("_errors", "InvalidPage"),
    "InvalidPlan": ("_errors", "InvalidPlan"),
    "InvalidSearch": ("_errors", "InvalidSearch"),
    "InvalidSessionId": ("_errors", "InvalidSessionId"),
    "InvalidStoredConfig": ("_errors", "InvalidStoredConfig"),
    "InvalidTenant": ("_errors", "InvalidTenant"),
    "MessageInput": ("_memory", "MessageInput"),
    "MessageNotFound": ("_errors", "MessageNotFound"),
    "Msg": ("_messages", "Msg"),
    "NotFound": ("_errors", "NotFound"),
    "OfflineSummarizer": ("_summarizers", "OfflineSummarizer"),
    "OffloadNotFound": ("_errors", "OffloadNotFound"),
    "OpaqueBlock": ("_messages", "OpaqueBlock"),
    "OpenAISummarizer": ("_summarizers", "OpenAISummarizer"),
    "RuntimeOptions": ("_config", "RuntimeOptions"),
    "SchemaError": ("_errors", "SchemaError"),
    "SearchScope": ("_search", "SearchScope"),
    "SessionExists": ("_errors", "SessionExists"),
    "SessionInfo": ("_sessions", "SessionInfo"),
    "SessionNotFound": ("_errors", "SessionNotFound"),
    "Summarizer": ("_summarizers", "Summarizer"),
    "SummarizerError": ("_errors", "SummarizerError"),
    "SummarizerUsage": ("_observe", "SummarizerUsage"),
    "SummaryRequest": ("_summarizers", "SummaryRequest"),
    "SummaryResult": ("_summarizers", "SummaryResult"),
    "TenantGrantError": ("_errors", "TenantGrantError"),
    "TextBlock": ("_messages", "TextBlock"),
    "ToolFormat": ("_memory_reads", "ToolFormat"),
    "ToolResultBlock": ("_messages", "ToolResultBlock"),
    "ToolUseBlock": ("_messages", "ToolUseBlock"),
    "UndoRefused": ("_errors", "UndoRefused"),
    "export_session": ("_operations", "export_session"),
    "from_anthropic_messages": ("_anthropic", "from_anthropic_messages"),
    "from_openai_messages": ("_messages", "from_openai_messages"),
    "import_session": ("_operations", "import_session"),
    "purge_sessions": ("_operations", "purge_sessions"),
    "to_anthropic_messages": ("_anthropic", "to_anthropic"),
    "to_openai_messages": ("_messages", "to_openai_messages"),
}


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


def _open_shared(database_url: str | URL | None, auto_upgrade: bool, args: OpenArguments) -> object:
    """`AutoContextMemory.open` (and the async twin's): through the process's shared client."""
    from ._client import open_shared

    return open_shared(database_url, auto_upgrade, args)


# The memory does not import the client, which is above it (autoctx._shared_opening): the
# package, which Python loads before any of its modules, installs the opening it calls.
_shared_opening.install(_open_shared)


def upgrade_database(database_url: str | None = None) -> str:
    """Run autoctx's migrations on `database_url` (default: AUTOCTX_DATABASE_URL, else the
    embedded PostgreSQL); returns the schema revision."""
    from ._store.database import engine_for, upgrade

    with engine_for(database_url) as engine:
        return upgrade(engine)


def grant_tenant(role: str, tenant: str, database_url: str | None = None) -> bool:
    """Let the database role `role` run autoctx for `tenant`, and nothing else (database
    tenancy, docs/scaling.md): it gets the privileges a memory uses, and the row-level security
    policies show it only the rows of `tenant`'s sessions, whatever SQL it sends. Run as the
    owner of autoctx's tables; returns True if the grant is new (granting twice is harmless).

        grant_tenant("acme_agent", "acme")   # then connect as acme_agent, open tenant="acme"
    """
    from . import _arguments
    from ._store import tenancy
    from ._store.database import engine_for

    # Before anything connects (with no URL, the embedded server would start first).
    _arguments.role(role)
    _arguments.required_tenant(tenant)

    with engine_for(database_url) as engine:
        return tenancy.grant_tenant(engine, role, tenant)


def revoke_tenant(role: str, tenant: str, database_url: str | None = None) -> bool:
    """Take `tenant` away from `role`; returns True if it held it. With its last tenant gone,
    the role loses every privilege on autoctx's tables and views."""
    from . import _arguments
    from ._store import tenancy
    from ._store.database import engine_for

    _arguments.role(role)
    _arguments.required_tenant(tenant)

    with engine_for(database_url) as engine:
        return tenancy.revoke_tenant(engine, role, tenant)


__all__ = [
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
