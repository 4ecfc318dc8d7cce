"""Idempotent adds: what a retried `add()` with the same key must match (docs/design.md §5).

An `add()` given an idempotency key stores the key with its messages, and the store looks for
it under the session row's lock before it writes: a retry of an add that committed (after a
timeout, a cancelled task, a lost connection) gets the messages the first one stored and
stores nothing. A key names one add of one session; the same key with other messages is a
caller's bug, which this module refuses rather than answering with messages the caller did not
send.
"""

from __future__ import annotations

from collections.abc import Sequence

from ._errors import Conflict
from ._intake import Prepared
from ._messages import Msg


def check_same_add(
    session_id: str, key: str, earlier: Sequence[Msg], prepared: Sequence[Prepared]
) -> None:
    """Raise `Conflict` unless `prepared` are the messages the add with `key` stored as
    `earlier`: as many, with the same roles and token counts (content is never quoted)."""
    same = len(earlier) == len(prepared) and all(
        m.role == p.msg.role and m.tokens == p.tokens
        for m, p in zip(earlier, prepared, strict=True)
    )
    if not same:
        raise Conflict(
            f"session {session_id!r}: idempotency key of length {len(key)} was already used by "
            f"an add of {len(earlier)} other message(s); nothing was stored. Give each add a "
            "key of its own (a framework's message id, say), and the same key only to a retry "
            "of that add with the same messages"
        )
