"""How an integration opens its memories: through the client the application gave it, else
through the process's shared client for its database URL (docs/design.md §5).

A client of the application's own brings its pool, its hooks and its `close()`: every
memory the integration opens is registered with it and closed by it, and nothing is opened on
the shared client.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import URL

from .._async_memory import AsyncAutoContextMemory
from .._client import AutoContextClient
from .._config import AutoContextConfig
from .._errors import ConfigError
from .._memory import AutoContextMemory


def checked_client(
    client: object, database_url: str | URL | None, where: str
) -> AutoContextClient | None:
    """`client` as given (None: the shared client of `database_url`); `ConfigError` naming
    `where` for one that is not a client, or that comes with a `database_url` as well (the
    client is connected to its own database already)."""
    if client is None:
        return None
    if not isinstance(client, AutoContextClient):
        raise ConfigError(
            f"{where}: client must be an AutoContextClient, got {type(client).__name__}; pass "
            "one, or leave client out to open through the shared client of database_url"
        )
    if database_url is not None:
        raise ConfigError(
            f"{where}: pass client or database_url, not both (a client is connected to its own "
            "database); drop database_url"
        )
    return client


def checked_namespace(namespace: object, where: str, prefixes: str) -> str:
    """`namespace` as given: the text an integration puts before every `prefixes` (ADK's
    app_name, the Claude Agent SDK's project_key) to make its tenant; `ConfigError` naming
    `where` for one that is not a string."""
    if not isinstance(namespace, str):
        raise ConfigError(
            f"{where}: namespace must be a string (put before every {prefixes}), got "
            f"{type(namespace).__name__}"
        )
    return namespace


def open_memory(
    client: AutoContextClient | None,
    database_url: str | URL | None,
    session_id: str,
    config: AutoContextConfig | None,
    **options: Any,
) -> AutoContextMemory:
    """The memory of `session_id`, opened through `client`, else through the shared client
    of `database_url` (`options`: the other arguments of `AutoContextClient.open`)."""
    if client is not None:
        return client.open(session_id, config, **options)
    return AutoContextMemory.open(session_id, database_url, config, **options)


async def open_async_memory(
    client: AutoContextClient | None,
    database_url: str | URL | None,
    session_id: str,
    config: AutoContextConfig | None,
    **options: Any,
) -> AsyncAutoContextMemory:
    """`open_memory`, for asyncio."""
    if client is not None:
        return await client.open_async(session_id, config, **options)
    return await AsyncAutoContextMemory.open(session_id, database_url, config, **options)
