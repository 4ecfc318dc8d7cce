"""autoctx: a working memory for long-running, tool-using LLM agents, kept in PostgreSQL.

from autoctx import AutoContextMemory, AutoContextConfig, Msg

mem = AutoContextMemory.open("agent-42", config=AutoContextConfig(max_tokens=128_000))
mem.add({"role": "user", "content": "Fix the failing test"})
events = mem.compress_if_needed()
messages = mem.to_openai()
"""

from .client import AutoContextClient
from .config import AutoContextConfig
from .errors import (
    AutoctxError,
    ConfigError,
    DatabaseUnavailable,
    InvalidMessage,
    InvalidMessageId,
    InvalidOffloadId,
    InvalidSearch,
    InvalidSessionId,
    MessageNotFound,
    OffloadNotFound,
    SchemaError,
    SessionNotFound,
    SummarizerError,
    TenantGrantError,
)
from .events import Event
from .memory import AsyncAutoContextMemory, AutoContextMemory
from .messages import (
    Msg,
    OpaqueBlock,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    from_openai_messages,
    to_openai_messages,
)
from .search import AutoContextSearchHit
from .store import tenancy as _tenancy
from .store.database import upgrade as _upgrade
from .summarizers import (
    AsyncSummarizer,
    OfflineSummarizer,
    OpenAISummarizer,
    Summarizer,
    SummaryRequest,
    SummaryResult,
)


def upgrade_database(database_url: str | None = None) -> str:
    """Run autoctx's migrations on `database_url` (default: AUTOCTX_DATABASE_URL, else the
    embedded PostgreSQL); returns the schema revision."""
    from .store.database import engine_for

    with engine_for(database_url) as engine:
        return _upgrade(engine)


def grant_tenant(role: str, tenant: str, database_url: str | None = None) -> bool:
    """Let the database role `role` run autoctx for `tenant`, and nothing else (database
    tenancy, docs/scaling.md): it gets the privileges a memory uses, and the row-level security
    policies show it only the rows of `tenant`'s sessions, whatever SQL it sends. Run as the
    owner of autoctx's tables; returns True if the grant is new (granting twice is harmless).

        grant_tenant("acme_agent", "acme")   # then connect as acme_agent, open tenant="acme"
    """
    from .store.database import engine_for

    with engine_for(database_url) as engine:
        return _tenancy.grant_tenant(engine, role, tenant)


def revoke_tenant(role: str, tenant: str, database_url: str | None = None) -> bool:
    """Take `tenant` away from `role`; returns True if it held it. With its last tenant gone,
    the role loses every privilege on autoctx's tables and views."""
    from .store.database import engine_for

    with engine_for(database_url) as engine:
        return _tenancy.revoke_tenant(engine, role, tenant)


__all__ = [
    "AsyncAutoContextMemory",
    "AsyncSummarizer",
    "AutoContextClient",
    "AutoContextConfig",
    "AutoContextMemory",
    "AutoContextSearchHit",
    "AutoctxError",
    "ConfigError",
    "DatabaseUnavailable",
    "Event",
    "InvalidMessage",
    "InvalidMessageId",
    "InvalidOffloadId",
    "InvalidSearch",
    "InvalidSessionId",
    "MessageNotFound",
    "Msg",
    "OfflineSummarizer",
    "OffloadNotFound",
    "OpaqueBlock",
    "OpenAISummarizer",
    "SchemaError",
    "SessionNotFound",
    "Summarizer",
    "SummarizerError",
    "SummaryRequest",
    "SummaryResult",
    "TenantGrantError",
    "TextBlock",
    "ToolResultBlock",
    "ToolUseBlock",
    "from_openai_messages",
    "grant_tenant",
    "revoke_tenant",
    "to_openai_messages",
    "upgrade_database",
]
