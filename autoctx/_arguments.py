"""Checks of the values callers pass, one function per kind of value (pure, no I/O).

Every public entry point that takes a session id, a tenant, a message id, an offload id, a
reload page, an erasure's ids and reason, a retention age or a database role checks it here, so
the same bad value gets the same error class and the same message whichever call it was given
to: the memory's methods, the client, the operations, the CLI, the integrations and the model
tools. Each error names the argument and the fix and never repeats the value where it may be
long or come from a conversation; each check runs before anything touches the database
(docs/design.md §1, "one check per kind of argument").

`unstorable` is the one test of text PostgreSQL cannot hold (a NUL character, a lone UTF-16
surrogate), which message intake, plans, imports, search queries and names share.
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Iterable
from datetime import timedelta
from typing import Final

from ._errors import (
    ConfigError,
    InvalidArgument,
    InvalidDuration,
    InvalidErasure,
    InvalidEventId,
    InvalidMessageId,
    InvalidOffloadId,
    InvalidPage,
    InvalidSessionId,
    InvalidTenant,
    TenantGrantError,
)

#: The longest session id and tenant. Tenant names are indexed with the session id; at 255
#: characters each (4 bytes each at most in UTF-8) the pair stays far below PostgreSQL's btree
#: entry limit of about 2.7 KB.
MAX_SESSION_ID: Final = 255
MAX_TENANT: Final = 255
#: The largest message id (ids are PostgreSQL bigints).
MAX_MESSAGE_ID: Final = 2**63 - 1
#: The longest idempotency key of an add (a framework's message id is far shorter).
MAX_ADD_KEY: Final = 255
#: Characters of an erasure's reason: it is an audit note, not a document.
MAX_REASON: Final = 1000
#: Ids one erasure may name (each is a row it rewrites in one transaction).
MAX_ERASE_IDS: Final = 100_000
#: The longest retention age: 100,000 days (about 273 years), far from the dates Python and
#: PostgreSQL can compute with (`now - age` must stay a date).
MAX_AGE: Final = timedelta(days=100_000)
#: PostgreSQL keeps identifiers to NAMEDATALEN - 1 bytes and silently truncates longer ones: a
#: longer name would be granted to whichever role has the truncated name.
MAX_ROLE_BYTES: Final = 63

NUL_PROBLEM: Final = (
    "contains a NUL character (\\x00), which PostgreSQL text cannot store; remove it (encode "
    "binary data, as base64 say, first)"
)


_UNITS: Final = {"s": 1, "min": 60, "h": 3600, "d": 86_400, "w": 604_800}
#: A number and a unit; `m` alone is read so as to be refused (minutes or months?). The
#: longer units come first so that `min` is not read as `m` and a stray `in`.
_DURATION: Final = re.compile(r"(\d+)\s*(min|[smhdw])(?![a-z])")


def unstorable(text: str) -> str | None:
    """Why PostgreSQL text cannot hold `text` (a phrase that follows the thing's name, with
    the fix), or None when it can."""
    if "\x00" in text:
        return NUL_PROBLEM
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (
            f"is not valid Unicode (a lone UTF-16 surrogate at position {exc.start}), which "
            "PostgreSQL text cannot store; decode the source with errors='replace', which turns a "
            "lone surrogate into U+FFFD"
        )
    return None


def session_id(value: object) -> str:
    """A session id: a non-empty string of at most `MAX_SESSION_ID` characters PostgreSQL can
    store; `InvalidSessionId` otherwise (the message never repeats the id)."""
    if not isinstance(value, str):
        raise InvalidSessionId(f"session id must be a string, got {type(value).__name__}")
    if not value:
        raise InvalidSessionId("session id is empty; pass a non-empty string such as 'agent-42'")
    _check_name(InvalidSessionId, "session id", value, MAX_SESSION_ID)
    return value


def tenant(value: object) -> str | None:
    """A tenant name as given, or None for a session without a tenant; `InvalidTenant`
    otherwise (the message never repeats a name that may be long)."""
    return None if value is None else _tenant_name(value)


def required_tenant(value: object) -> str:
    """A tenant name where one is required (`grant_tenant`, `revoke_tenant`): None is
    refused, anything else as `tenant` refuses it, with the same message."""
    if value is None:
        raise InvalidTenant("tenant is None; a grant names a tenant: pass its name, such as 'acme'")
    return _tenant_name(value)


def _tenant_name(value: object) -> str:
    if not isinstance(value, str):
        raise InvalidTenant(
            f"tenant must be a string or None, got {type(value).__name__}; pass a name such as "
            "'acme', or None for a session without a tenant"
        )
    if not value.strip():
        # Under row-level security an empty tenant means "no tenant": refuse the ambiguity.
        # Quoted: a blank value is short, and shows which blank it was.
        raise InvalidTenant(
            f"tenant is empty or blank (got {value!r}), which is not a tenant name; pass a "
            "non-empty name, or None for a session without a tenant"
        )
    _check_name(InvalidTenant, "tenant", value, MAX_TENANT)
    return value


def _check_name(error: type[Exception], what: str, name: str, limit: int) -> None:
    if len(name) > limit:
        raise error(f"{what} is {len(name)} characters long; the limit is {limit}")
    if (problem := unstorable(name)) is not None:
        raise error(f"{what} {problem}")


def add_key(value: object) -> str | None:
    """An add's idempotency key: None, or a non-empty string of at most `MAX_ADD_KEY`
    characters PostgreSQL can store; `InvalidArgument` otherwise (never repeated)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidArgument(
            f"idempotency_key must be a string or None, got {type(value).__name__}; pass an id "
            "of the add such as the framework's message id"
        )
    if not value:
        raise InvalidArgument("idempotency_key is empty; pass a non-empty string or None")
    _check_name(InvalidArgument, "idempotency_key", value, MAX_ADD_KEY)
    return value


def message_id(value: object, what: str = "message_id") -> int:
    """A message id: an int (not a bool) a bigint can hold, at least 1. The same malformed id
    is `InvalidMessageId` in every call that takes one; an id of the right form that the
    session does not have is `MessageNotFound`, raised where it is looked up."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidMessageId(
            f"{what} must be a message id (an int, as `mem.messages()` gives in `.id` and a "
            f"search hit in `.message_id`), got {type(value).__name__}"
        )
    if not 1 <= value <= MAX_MESSAGE_ID:
        raise InvalidMessageId(f"{what} must be a positive integer message id, got {value}")
    return value


def event_id(value: object) -> int:
    """An event id: an int (not a bool) a bigint can hold, at least 1, as `mem.events()` gives
    in `.id`; `InvalidEventId` otherwise. An id the session does not have is `EventNotFound`,
    raised where it is looked up."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidEventId(
            "event_id must be an event id (an int, as `mem.events()` gives in `.id` and "
            f"`autoctx history` lists), got {type(value).__name__}"
        )
    if not 1 <= value <= MAX_MESSAGE_ID:
        raise InvalidEventId(f"event_id must be a positive integer event id, got {value}")
    return value


#: What names an offload: its uuid (its key), or its handle (the number its tag shows the
#: model, docs/design.md §4).
OffloadRef = uuid.UUID | int

#: A handle as a caller may pass it: the number, optionally after "#" or "offload", or the
#: whole tag copied (a model often copies more than the number).
_HANDLE_TEXT: Final = re.compile(
    r"(?:<!--\s*)?(?:offload\s*[#:=]?\s*|#)?(?P<n>[0-9]{1,19})(?:\s*-->)?", re.IGNORECASE
)


def offload_id(value: object) -> OffloadRef:
    """An offload id: its handle (an int, or its text as the tag shows it: ``12``, ``#12``,
    ``offload 12``, the tag itself), or its uuid (a `uuid.UUID` or its canonical text, as tags
    written before handles show it). `InvalidOffloadId` for an empty or malformed one (never
    quoted: a model may pass any text of the conversation here)."""
    if isinstance(value, uuid.UUID):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return _handle(value)
    if not isinstance(value, str):
        raise InvalidOffloadId(
            f"the offload id must be the number in an offload tag (an int or a string) or an "
            f"offload uuid (a string), got {type(value).__name__}"
        )
    text = value.strip()
    if not text:
        raise InvalidOffloadId("the offload id is empty; pass the number from an offload tag")
    handle = _HANDLE_TEXT.fullmatch(text)
    if handle is not None:
        return _handle(int(handle.group("n")))
    try:
        parsed = uuid.UUID(text)
    except ValueError:
        raise InvalidOffloadId(
            f"the value given ({len(text)} characters) is not an offload id (expected the "
            "number from an offload tag, such as 12, or an offload uuid such as "
            "'123e4567-e89b-12d3-a456-426614174000')"
        ) from None
    if str(parsed) != text.lower() and parsed.hex != text.lower():
        raise InvalidOffloadId("the offload id is not a canonical uuid; copy it from the tag")
    return parsed


def _handle(value: int) -> int:
    if not 1 <= value <= MAX_MESSAGE_ID:
        raise InvalidOffloadId(
            "an offload handle is the positive number in an offload tag (at most "
            f"{MAX_MESSAGE_ID}); copy it from the tag"
        )
    return value


def page(offset: object, limit: object, where: str = "reload") -> tuple[int, int | None]:
    """A page of a reload (or of what `where` names): `offset` an int >= 0 (the first
    message), `limit` a positive int or None (all); `InvalidPage` otherwise."""
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise InvalidPage(
            f"{where}: offset must be an integer >= 0 (the first message of the page), got "
            f"{_shown(offset)}"
        )
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise InvalidPage(
            f"{where}: limit must be a positive integer (messages in the page) or None for "
            f"all, got {_shown(limit)}"
        )
    return offset, limit


def _shown(value: object) -> str:
    """A number (or None) as itself, anything else by its type: a string may be long."""
    return repr(value) if value is None or isinstance(value, int | float) else type(value).__name__


def erasure_ids(values: object) -> list[int]:
    """The distinct message ids of an erasure, in order; at least one."""
    if isinstance(values, str | bytes) or not isinstance(values, Iterable):
        raise InvalidErasure(
            f"message_ids must be a list of message ids (ints), got {type(values).__name__}"
        )
    ids = sorted({message_id(v, "each of message_ids") for v in values})
    if not ids:
        raise InvalidErasure("message_ids is empty: name at least one original to erase")
    if len(ids) > MAX_ERASE_IDS:
        raise InvalidErasure(
            f"{len(ids)} message ids in one erasure; the limit is {MAX_ERASE_IDS}: split it"
        )
    return ids


def reason(value: object) -> str:
    """The reason recorded with an erasure: non-blank text PostgreSQL can store."""
    if not isinstance(value, str):
        raise InvalidErasure(f"reason must be a string, got {type(value).__name__}")
    text = value.strip()
    if not text:
        raise InvalidErasure(
            "reason is empty; say why these messages are erased (for example 'user request "
            "#123'): the audit records it with the ids"
        )
    if len(text) > MAX_REASON:
        raise InvalidErasure(f"reason is {len(text)} characters; the limit is {MAX_REASON}")
    if (problem := unstorable(text)) is not None:
        raise InvalidErasure(f"reason {problem}")
    return text


def duration(text: object) -> timedelta:
    """An age such as ``30d``, ``12h``, ``15min``, ``45s``, ``2w`` or ``1d12h`` (s, min, h, d,
    w), or a timedelta as is; positive. ``m`` is refused: minutes and months both read as it."""
    if isinstance(text, timedelta):
        age = text
    else:
        compact = text.strip().lower() if isinstance(text, str) else ""
        if len(compact) > 64:
            raise InvalidDuration(
                f"the age is {len(compact)} characters long; write a number and a unit (s, "
                "min, h, d, w), such as 30d, 12h or 1d12h"
            )
        parts = _DURATION.findall(compact)
        if not parts or _DURATION.sub("", compact).strip():
            raise InvalidDuration(
                f"cannot read the age {text!r}; write a number and a unit (s, min, h, d, w), "
                "such as 30d, 12h, 15min or 1d12h"
            )
        if any(unit == "m" for _, unit in parts):
            raise InvalidDuration(
                f"the age {text!r} is ambiguous: 'm' could mean minutes or months; write "
                "'min' for minutes (15min) or days for months (30d)"
            )
        seconds = sum(int(n) * _UNITS[u] for n, u in parts)
        if seconds > MAX_AGE.total_seconds():
            raise InvalidDuration(
                f"the age {text!r} is over the longest one autoctx reads ({MAX_AGE.days} "
                "days); write a shorter age"
            )
        age = timedelta(seconds=seconds)
    if age <= timedelta(0):
        raise InvalidDuration(f"the age must be positive, got {text!r}")
    if age > MAX_AGE:
        raise InvalidDuration(
            f"the age is over the longest one autoctx reads ({MAX_AGE.days} days); pass a "
            "shorter timedelta"
        )
    return age


def role(value: object) -> str:
    """A database role name `grant_tenant` and `revoke_tenant` can name exactly (quoted in the
    message: it names a role the caller created, never conversation text)."""
    if not isinstance(value, str) or not value.strip():
        raise TenantGrantError(
            f"role {value!r} is not a role name; pass the name of an existing database role"
        )
    if unstorable(value) is not None or len(value.encode("utf-8")) > MAX_ROLE_BYTES:
        raise TenantGrantError(
            f"role {value!r} cannot be a PostgreSQL role name (at most {MAX_ROLE_BYTES} bytes, "
            "no NUL character, valid Unicode); pass the name exactly as the role was created"
        )
    if value.startswith("pg_"):
        raise TenantGrantError(
            f"role {value!r} is one of PostgreSQL's predefined roles (pg_...); grant tenants "
            "to a role of your own (CREATE ROLE ... LOGIN)"
        )
    return value


def seconds(name: str, value: object, *, owner: str) -> float:
    """A duration in seconds given as a number: positive and finite (`ConfigError` naming
    `owner.name` otherwise)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ConfigError(
            f"{owner}.{name} must be a positive, finite number of seconds, got {value!r}"
        )
    return float(value)
