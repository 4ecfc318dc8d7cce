"""What autoctx knows of a session apart from its messages (`SessionInfo`).

A public type, kept outside the SQL shell: the store builds it from a row, the compressor and
the facade read it, and neither has to import the store for it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """A session row, without its messages."""

    session_id: str
    tenant: str | None
    version: int
    message_count: int
    token_count: int
    model: str
    encoding: str
    config: dict[str, Any]
    plan: dict[str, Any] | None
    settled_version: int | None
    created_at: Any = None
    updated_at: Any = None
    #: Which creation of the id this is (docs/design.md §5): a session deleted and created
    #: again under the same id has another one.
    incarnation: uuid.UUID | None = None
