"""autoctx's small exception hierarchy.

Every message names the thing that is wrong (session, message index, field) and the fix.
"""

from __future__ import annotations


class AutoctxError(Exception):
    """Base class of every error autoctx raises on purpose."""


class ConfigError(AutoctxError, ValueError):
    """An `AutoContextConfig` field, or a combination of fields, is invalid."""


class InvalidMessage(AutoctxError, ValueError):
    """A message (or a list of messages) given to `add()` or to the OpenAI converter is invalid.

    Nothing of the call that raised it was stored.
    """


class InvalidSessionId(AutoctxError, ValueError):
    """A session id is empty, too long, or not storable text."""


class SessionNotFound(AutoctxError, LookupError):
    """No session with that id exists (for this tenant)."""


class OffloadNotFound(AutoctxError, LookupError):
    """No offloaded context with that uuid exists in this session."""


class InvalidOffloadId(AutoctxError, ValueError):
    """An offload id is empty or not a uuid."""


class DatabaseUnavailable(AutoctxError, ConnectionError):
    """The database cannot be reached, or the embedded server cannot be started."""


class SchemaError(AutoctxError, RuntimeError):
    """The database schema is missing, behind, or newer than this version of autoctx."""


class SummarizerError(AutoctxError, RuntimeError):
    """A summariser failed (timeout, HTTP error, empty or unusable answer).

    Raised to the caller only with `AutoContextConfig(strict=True)`; otherwise recorded as a
    `failed` compression event.
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class InvalidPlan(AutoctxError, ValueError):
    """A plan attached to a session does not have the documented shape.

    A plan is ``{"goal": str, "steps": [{"title": str, "state": "pending" | "in_progress" |
    "done"}], "expected_outcome": str}``; the message names the field that is wrong.
    """


class TenantGrantError(AutoctxError, ValueError):
    """A role or tenant given to `grant_tenant` or `revoke_tenant` is invalid, the role could not
    be confined to a tenant (a superuser, BYPASSRLS, or the tables' owner), or the caller may
    not grant (it does not own autoctx's tables)."""


class InvalidSearch(AutoctxError, ValueError):
    """A search's query, scope or limit is invalid (`mem.search`, `autoctx search`)."""


class MessageNotFound(AutoctxError, LookupError):
    """No message with that id in that session, among the sessions this memory may read (its
    tenant's, or the untenanted ones for an untenanted memory)."""


class InvalidMessageId(AutoctxError, ValueError):
    """A reload by message id is malformed: the id is not a positive integer, or both (or
    neither) of an offload id and a message id were given."""
