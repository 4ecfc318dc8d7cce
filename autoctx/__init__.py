"""autoctx: a working memory for long-running, tool-using LLM agents, kept in PostgreSQL.

from autoctx import AutoContextMemory, AutoContextConfig, Msg

mem = AutoContextMemory.open("agent-42", config=AutoContextConfig(max_tokens=128_000))
mem.add({"role": "user", "content": "Fix the failing test"})
events = mem.compress_if_needed()
messages = mem.to_openai()
"""

from .config import AutoContextConfig
from .errors import (
    AutoctxError,
    ConfigError,
    DatabaseUnavailable,
    InvalidMessage,
    InvalidOffloadId,
    InvalidSessionId,
    OffloadNotFound,
    SchemaError,
    SessionNotFound,
    SummarizerError,
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


__all__ = [
    "AsyncAutoContextMemory",
    "AsyncSummarizer",
    "AutoContextConfig",
    "AutoContextMemory",
    "AutoctxError",
    "ConfigError",
    "DatabaseUnavailable",
    "Event",
    "InvalidMessage",
    "InvalidOffloadId",
    "InvalidSessionId",
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
    "TextBlock",
    "ToolResultBlock",
    "ToolUseBlock",
    "from_openai_messages",
    "to_openai_messages",
    "upgrade_database",
]
