"""autoctx's small exception hierarchy.

Every message names the thing that is wrong (session, message index, field) and the fix.
"""

from __future__ import annotations


class AutoContextError(Exception):
    """Base class of every error autoctx raises on purpose."""


class ConfigError(AutoContextError, ValueError):
    """An `AutoContextConfig` field, or a combination of fields, is invalid."""


class InvalidMessage(AutoContextError, ValueError, TypeError):
    """A message (or a list of messages) given to `add()` or to the OpenAI converter is invalid.

    Nothing of the call that raised it was stored. It is also a `TypeError`, because that is
    what the Agents SDK's own session stores raise for an item they cannot store, so code
    written against them catches it unchanged.
    """


class InvalidSessionId(AutoContextError, ValueError):
    """A session id is empty, too long, or not storable text."""


class SessionNotFound(AutoContextError, LookupError):
    """No session with that id exists (for this tenant)."""


class OffloadNotFound(AutoContextError, LookupError):
    """No offloaded context with that uuid exists in this session."""


class InvalidOffloadId(AutoContextError, ValueError):
    """An offload id is empty or not a uuid."""


class DatabaseUnavailable(AutoContextError, ConnectionError):
    """The database cannot be reached, or the embedded server cannot be started."""


class SchemaError(AutoContextError, RuntimeError):
    """The database schema is missing, behind, or newer than this version of autoctx."""


class SummarizerError(AutoContextError, RuntimeError):
    """A summarizer failed (timeout, HTTP error, empty or unusable answer).

    Raised to the caller only with `AutoContextConfig(strict=True)`; otherwise recorded as a
    `failed` compression event.
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class InvalidPlan(AutoContextError, ValueError):
    """A plan attached to a session does not have the documented shape.

    A plan is ``{"goal": str, "steps": [{"title": str, "state": "pending" | "in_progress" |
    "done"}], "expected_outcome": str}``; the message names the field that is wrong.
    """


class TenantGrantError(AutoContextError, ValueError):
    """A role or tenant given to `grant_tenant` or `revoke_tenant` is invalid, the role could not
    be confined to a tenant (a superuser, BYPASSRLS, or the tables' owner), or the caller may
    not grant (it does not own autoctx's tables)."""


class MessageNotFound(AutoContextError, LookupError):
    """No stored message with that id exists in that session (`fork`, `erase`), or among the
    sessions this memory may read (a reload by message id: its tenant's, or the untenanted ones
    for an untenanted memory)."""


class SessionExists(AutoContextError, ValueError):
    """A fork or an import would create a session under an id that is already taken; nothing
    was written. Choose another id (or delete the session that has it)."""


class InvalidErasure(AutoContextError, ValueError):
    """An erasure request is invalid (no ids, an id that is not an original, no reason);
    nothing was erased."""


class ErasureNotPermitted(AutoContextError, PermissionError):
    """The database role may not rewrite messages: a role granted a tenant only appends, and an
    erasure is the tables' owner's act (run it with the owner's URL). Nothing was erased."""


class InvalidExport(AutoContextError, ValueError):
    """A document given to `import_session` is not an autoctx export this version can restore
    (wrong format or version, a missing or malformed field, rows that do not fit together);
    the message names the field, never the content. Nothing was written."""


class InvalidDuration(AutoContextError, ValueError):
    """A retention age such as ``30d`` or ``12h`` could not be read, or is not positive."""


class InvalidSearch(AutoContextError, ValueError):
    """A search's query, scope or limit is invalid (`mem.search`, `autoctx search`)."""


class InvalidMessageId(AutoContextError, ValueError):
    """A reload by message id is malformed: the id is not a positive integer, or both (or
    neither) of an offload id and a message id were given."""


class InvalidStoredConfig(ConfigError):
    """The config recorded on a session (read back from the database: written there outside
    autoctx, or carried by an import) is not a valid `AutoContextConfig`. The session is not
    compressed until it is repaired; its messages are untouched."""


class InvalidPage(AutoContextError, ValueError):
    """A reload's page is invalid: `offset` is negative or `limit` is not positive."""
