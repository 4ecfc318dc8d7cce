"""autoctx: a working memory for long-running, tool-using LLM agents, kept in PostgreSQL.

from autoctx import AutoContextMemory, AutoContextConfig, Msg

mem = AutoContextMemory.open("agent-42", config=AutoContextConfig(max_tokens=128_000))
mem.add({"role": "user", "content": "Fix the failing test"})
events = mem.compress_if_needed()
messages = mem.to_openai()
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import _arguments, _shared_opening
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
from ._operations import export_session, import_session, purge_sessions
from ._search import AutoContextSearchHit, SearchScope
from ._sessions import SessionInfo
from ._store import tenancy as _tenancy
from ._store.database import upgrade as _upgrade
from ._summarizers import (
    AsyncSummarizer,
    OfflineSummarizer,
    OpenAISummarizer,
    Summarizer,
    SummaryRequest,
    SummaryResult,
)

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

    from ._open_arguments import OpenArguments


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
    from ._store.database import engine_for

    with engine_for(database_url) as engine:
        return _upgrade(engine)


def grant_tenant(role: str, tenant: str, database_url: str | None = None) -> bool:
    """Let the database role `role` run autoctx for `tenant`, and nothing else (database
    tenancy, docs/scaling.md): it gets the privileges a memory uses, and the row-level security
    policies show it only the rows of `tenant`'s sessions, whatever SQL it sends. Run as the
    owner of autoctx's tables; returns True if the grant is new (granting twice is harmless).

        grant_tenant("acme_agent", "acme")   # then connect as acme_agent, open tenant="acme"
    """
    from ._store.database import engine_for

    # Before anything connects (with no URL, the embedded server would start first).
    _arguments.role(role)
    _arguments.required_tenant(tenant)

    with engine_for(database_url) as engine:
        return _tenancy.grant_tenant(engine, role, tenant)


def revoke_tenant(role: str, tenant: str, database_url: str | None = None) -> bool:
    """Take `tenant` away from `role`; returns True if it held it. With its last tenant gone,
    the role loses every privilege on autoctx's tables and views."""
    from ._store.database import engine_for

    _arguments.role(role)
    _arguments.required_tenant(tenant)

    with engine_for(database_url) as engine:
        return _tenancy.revoke_tenant(engine, role, tenant)


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
