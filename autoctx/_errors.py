"""autoctx's small exception hierarchy.

Every message names the thing that is wrong (session, message index, field) and the fix. Catch
a base to handle a family; each class also keeps the built-in base it has always had, so an
``except ValueError`` (or ``LookupError``, ...) written against an older autoctx still holds::

    AutoContextError
    ├── InvalidArgument (ValueError)        a value the caller passed is wrong; nothing changed
    │   ├── ConfigError
    │   │   └── InvalidStoredConfig         a config read back from the database
    │   ├── InvalidMessage (TypeError too)
    │   ├── InvalidSessionId
    │   ├── InvalidMessageId
    │   ├── InvalidEventId
    │   ├── InvalidOffloadId
    │   ├── InvalidPlan
    │   ├── InvalidErasure
    │   ├── InvalidExport
    │   ├── InvalidDuration
    │   ├── InvalidSearch
    │   ├── InvalidPage
    │   ├── TenantGrantError
    │   └── InvalidTenant                   also an InvalidSessionId and a TenantGrantError
    ├── NotFound (LookupError)              well-formed, but no such thing (for this tenant)
    │   ├── SessionNotFound
    │   ├── MessageNotFound
    │   ├── EventNotFound
    │   └── OffloadNotFound
    ├── Conflict                            what is stored does not allow the call
    │   ├── SessionExists (ValueError)
    │   ├── ErasureNotPermitted (PermissionError)
    │   ├── UndoRefused                     `.reason` says which rule refused it
    │   └── ContextOverWindow                a strict read of a context over its window
    └── BackendError                        the database or the summarizer failed
        ├── DatabaseUnavailable (ConnectionError)
        ├── SchemaError (RuntimeError)
        └── SummarizerError (RuntimeError)

A malformed id is always the `Invalid...Id` of its kind, whichever call it was given to; an id
of the right form that is not there is always the `...NotFound` of its kind. The checks of what
callers pass are in `autoctx._arguments`, one per kind of value, so that the same bad value
gets the same class and message in every call that takes it.
"""

from __future__ import annotations


class AutoContextError(Exception):
    """Base class of every error autoctx raises on purpose."""


class InvalidArgument(AutoContextError, ValueError):
    """A value the caller passed is invalid (its type, form or range); nothing was written."""


class NotFound(AutoContextError, LookupError):
    """A well-formed id names no session, message or offload this memory may read."""


class Conflict(AutoContextError):
    """The call is well-formed, but what is stored (or the database role) does not allow it;
    nothing was written."""


class BackendError(AutoContextError):
    """Something autoctx depends on failed: the database, its schema, or the summarizer."""


class ConfigError(InvalidArgument):
    """An `AutoContextConfig` field, or a combination of fields, is invalid."""


class InvalidMessage(InvalidArgument, TypeError):
    """A message (or a list of messages) given to `add()` or to the OpenAI converter is invalid.

    Nothing of the call that raised it was stored. It is also a `TypeError`, because that is
    what the Agents SDK's own session stores raise for an item they cannot store, so code
    written against them catches it unchanged.
    """


class InvalidSessionId(InvalidArgument):
    """A session id is empty, too long, or not storable text."""


class SessionNotFound(NotFound):
    """No session with that id exists (for this tenant)."""


class OffloadNotFound(NotFound):
    """No offloaded context with that uuid exists in this session."""


class InvalidOffloadId(InvalidArgument):
    """An offload id is empty or not a uuid."""


class DatabaseUnavailable(BackendError, ConnectionError):
    """The database cannot be reached, or the embedded server cannot be started."""


class SchemaError(BackendError, RuntimeError):
    """The database schema is missing, behind, or newer than this version of autoctx."""


class SummarizerError(BackendError, RuntimeError):
    """A summarizer failed (timeout, HTTP error, empty or unusable answer).

    Raised to the caller only with `AutoContextConfig(strict=True)`; otherwise recorded as a
    `failed` compression event.
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class InvalidPlan(InvalidArgument):
    """A plan attached to a session does not have the documented shape.

    A plan is ``{"goal": str, "steps": [{"title": str, "state": "pending" | "in_progress" |
    "done"}], "expected_outcome": str}``; the message names the field that is wrong.
    """


class TenantGrantError(InvalidArgument):
    """A role or tenant given to `grant_tenant` or `revoke_tenant` is invalid, the role could not
    be confined to a tenant (a superuser, BYPASSRLS, or the tables' owner), or the caller may
    not grant (it does not own autoctx's tables)."""


class MessageNotFound(NotFound):
    """No stored message with that id exists in that session (`fork`, `erase`), or among the
    sessions this memory may read (a reload by message id: its tenant's, or the untenanted ones
    for an untenanted memory)."""


class SessionExists(Conflict, ValueError):
    """A fork or an import would create a session under an id that is already taken; nothing
    was written. Choose another id (or delete the session that has it)."""


class InvalidErasure(InvalidArgument):
    """An erasure request is invalid (no ids, an id that is not an original, no reason);
    nothing was erased."""


class ErasureNotPermitted(Conflict, PermissionError):
    """The database role may not rewrite messages: a role granted a tenant only appends, and an
    erasure is the tables' owner's act (run it with the owner's URL). Nothing was erased."""


class InvalidExport(InvalidArgument):
    """A document given to `import_session` is not an autoctx export this version can restore
    (wrong format or version, a missing or malformed field, rows that do not fit together);
    the message names the field, never the content. Nothing was written."""


class InvalidDuration(InvalidArgument):
    """A retention age such as ``30d`` or ``12h`` could not be read, or is not positive."""


class InvalidSearch(InvalidArgument):
    """A search's query, scope or limit is invalid (`mem.search`, `autoctx search`)."""


class InvalidMessageId(InvalidArgument):
    """A message id is malformed (not an integer, or not a positive bigint), in every call
    that takes one (`reload`, `fork`, `erase`); or a reload got both (or neither) of an
    offload id and a message id."""


class InvalidStoredConfig(ConfigError):
    """The config recorded on a session (read back from the database: written there outside
    autoctx, or carried by an import) is not a valid `AutoContextConfig`. The session is not
    compressed until it is repaired; its messages are untouched."""


class InvalidPage(InvalidArgument):
    """A reload's page is invalid: `offset` is negative or `limit` is not positive."""


class InvalidTenant(InvalidSessionId, TenantGrantError):
    """A tenant name is not a string, is empty or blank, too long, or not storable text, in
    every call that takes one (`open`, the client, `grant_tenant`, the operations, the CLI).

    It is both an `InvalidSessionId` (what `open` raised for a bad tenant before this class)
    and a `TenantGrantError` (what `grant_tenant` raised), so older `except` clauses hold."""


class ContextOverWindow(Conflict):
    """`to_openai()` or `to_anthropic()` of a strict memory (`RuntimeOptions(strict=True)`)
    found the working context at or over its window (`max_tokens` less `reserve_tokens`):
    call `compress_if_needed()` after `add()` and before reading it for a model call."""


class InvalidEventId(InvalidArgument):
    """An event id is malformed (not an integer, or not a positive bigint), in every call that
    takes one (`undo`, `autoctx undo`, `dropped`, `autoctx dropped`)."""


class EventNotFound(NotFound):
    """No event with that id exists in that session (`undo`, `dropped`)."""


class UndoRefused(Conflict):
    """An undo that the session does not allow; nothing was changed (docs/design.md §7).

    `reason` is one of 'over_window' (the working context would reach the window: make room,
    or pass `force=True`), 'moved' (the compression's replacement is no longer in the working
    context: the message names the event that holds it now), 'erased' (what it replaced was
    erased), 'not_a_compression' (a pop, a clear, a fork, an erasure or an undo),
    'not_applied' (a failed, skipped or conflict attempt), 'busy' (the session kept changing
    while the undo was planned: try again) or 'pairing' (a defect: please report it).
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
