"""Checks of what callers pass to fork, erase, reload and purge (pure): each error names the
argument and the fix, never message content, and comes before anything touches the database."""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import timedelta
from typing import Final

from ._errors import InvalidDuration, InvalidErasure, InvalidMessageId

#: Characters of an erasure's reason: it is an audit note, not a document.
MAX_REASON: Final = 1000
#: Ids one erasure may name (each is a row it rewrites in one transaction).
MAX_ERASE_IDS: Final = 100_000
#: The largest message id (ids are PostgreSQL bigints).
MAX_MESSAGE_ID: Final = 2**63 - 1
_UNITS: Final = {"s": 1, "min": 60, "h": 3600, "d": 86_400, "w": 604_800}
#: A number and a unit; `m` alone is read so as to be refused (minutes or months?). The
#: longer units come first so that `min` is not read as `m` and a stray `in`.
_DURATION: Final = re.compile(r"(\d+)\s*(min|[smhdw])(?![a-z])")
#: The longest retention age: 100,000 days (about 273 years), far from the dates Python and
#: PostgreSQL can compute with (`now - age` must stay a date).
MAX_AGE: Final = timedelta(days=100_000)


def message_id(value: object, what: str) -> int:
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


def erasure_ids(values: Iterable[int]) -> list[int]:
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


def erasure_reason(value: object) -> str:
    """The reason recorded with an erasure: non-blank text PostgreSQL can store."""
    if not isinstance(value, str):
        raise InvalidErasure(f"reason must be a string, got {type(value).__name__}")
    reason = value.strip()
    if not reason:
        raise InvalidErasure(
            "reason is empty; say why these messages are erased (for example 'user request "
            "#123'): the audit records it with the ids"
        )
    if len(reason) > MAX_REASON:
        raise InvalidErasure(f"reason is {len(reason)} characters; the limit is {MAX_REASON}")
    if "\x00" in reason:
        raise InvalidErasure("reason contains a NUL character; remove it")
    try:
        reason.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidErasure("reason is not valid Unicode (lone surrogate)") from None
    return reason


def parse_duration(text: str | timedelta) -> timedelta:
    """An age such as ``30d``, ``12h``, ``15min``, ``45s``, ``2w`` or ``1d12h`` (s, min, h, d,
    w), or a timedelta as is; positive. ``m`` is refused: minutes and months both read as it."""
    if isinstance(text, timedelta):
        age = text
    else:
        compact = text.strip().lower() if isinstance(text, str) else ""
        if len(compact) > 64:
            raise InvalidDuration(
                f"the age is {len(compact)} characters long; write a number and a unit (s, m, "
                "h, d, w), such as 30d, 12h or 1d12h"
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
