"""A retried add stores nothing twice (docs/design.md §5).

`asyncio.wait_for` cancels the awaiting coroutine at its timeout, but the add it started runs
on in its worker thread and commits: a caller who retries stores the messages twice unless it
gives the add an idempotency key. Here the add is really slow (another connection holds the
session's row lock, as a concurrent writer would) and really times out.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable

import pytest
import sqlalchemy as sa

from autoctx import (
    AsyncAutoContextMemory,
    AutoContextMemory,
    Conflict,
    InvalidArgument,
    OfflineSummarizer,
)
from tests.histories import SMALL

BATCH = [
    {"role": "user", "content": "List the files."},
    {"role": "assistant", "content": "src/a.py and src/b.py"},
]


def _originals(db_url: str, sid: str) -> list[str]:
    engine = sa.create_engine(db_url, poolclass=sa.NullPool)
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT content->0->>'text' FROM messages "
                "WHERE session_id = :s AND kind = 'original' ORDER BY id"
            ),
            {"s": sid},
        ).scalars()
        texts = list(rows)
    engine.dispose()
    return texts


class RowHolder:
    """Another connection that holds the session's row lock until `let_go()`."""

    def __init__(self, db_url: str, sid: str) -> None:
        self.engine = sa.create_engine(db_url, poolclass=sa.NullPool)
        self.conn = self.engine.connect()
        self.conn.begin()
        self.conn.execute(
            sa.text("SELECT 1 FROM sessions WHERE session_id = :s FOR UPDATE"), {"s": sid}
        )

    def let_go(self) -> None:
        self.conn.rollback()
        self.conn.close()
        self.engine.dispose()


async def _timed_out_add(mem: AsyncAutoContextMemory, holder: RowHolder, **kw: str) -> None:
    """An add that times out under `asyncio.wait_for` while it waits for the row; the lock is
    let go just after, so the add's thread goes on and commits."""
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(mem.add(BATCH, **kw), timeout=0.3)
    threading.Timer(0.2, holder.let_go).start()


def test_a_retried_add_with_its_key_stores_nothing_twice(db_url: str) -> None:
    async def scenario() -> tuple[str, list[int], list[int]]:
        sid = f"idem-{uuid.uuid4().hex[:6]}"
        mem = await AsyncAutoContextMemory.open(sid, db_url, SMALL, summarizer=OfflineSummarizer())
        await mem.add({"role": "system", "content": "You are terse."})
        holder = RowHolder(db_url, sid)
        await _timed_out_add(mem, holder, idempotency_key="msg_0042")
        # The caller retries the add it believes failed: the key finds what the first stored.
        retried = await mem.add(BATCH, idempotency_key="msg_0042")
        again = await mem.add(BATCH, idempotency_key="msg_0042")
        await mem.close()
        return sid, [m.id or 0 for m in retried], [m.id or 0 for m in again]

    sid, retried, again = asyncio.run(scenario())
    assert _originals(db_url, sid) == ["You are terse.", "List the files.", "src/a.py and src/b.py"]
    assert retried == again == [2, 3]


def test_without_a_key_the_retry_stores_twice_as_the_docstring_says(db_url: str) -> None:
    async def scenario() -> str:
        sid = f"idem-nokey-{uuid.uuid4().hex[:6]}"
        mem = await AsyncAutoContextMemory.open(sid, db_url, SMALL, summarizer=OfflineSummarizer())
        holder = RowHolder(db_url, sid)
        await _timed_out_add(mem, holder)
        await mem.add(BATCH)
        await mem.close()
        return sid

    sid = asyncio.run(scenario())
    assert _originals(db_url, sid) == [m["content"] for m in BATCH] * 2


def test_a_key_used_for_other_messages_is_a_conflict_and_stores_nothing(
    open_memory: Callable[..., AutoContextMemory], db_url: str
) -> None:
    mem = open_memory(config=SMALL)
    mem.add(BATCH, idempotency_key="k1")
    with pytest.raises(Conflict, match="idempotency key") as info:
        mem.add([{"role": "user", "content": "something else"}], idempotency_key="k1")
    assert "something else" not in str(info.value) and "k1" not in str(info.value)
    mem.add({"role": "user", "content": "next"}, idempotency_key="k2")
    assert [m.text for m in mem.messages()] == [*(m["content"] for m in BATCH), "next"]


@pytest.mark.parametrize(
    ("key", "problem"),
    [("", "empty"), (42, "must be a string"), ("x" * 256, "256 characters"), ("a\x00b", "NUL")],
)
def test_a_bad_key_is_refused_before_anything_is_stored(
    open_memory: Callable[..., AutoContextMemory], key: object, problem: str
) -> None:
    mem = open_memory(config=SMALL)
    with pytest.raises(InvalidArgument, match=problem):
        mem.add(BATCH, idempotency_key=key)  # type: ignore[arg-type]
    assert mem.messages() == []
