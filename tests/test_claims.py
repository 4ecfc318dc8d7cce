"""Worker claims (migration 0010): a row lock on the session's row of `session_claims`.

- A role granted one tenant cannot take, hold, remove or add another tenant's claim with any
  SQL it can send (advisory locks need no privilege, which is why claims are no longer one):
  the worker compresses the other tenant's session while the role tries. Real roles, as in
  test_tenants.py.
- A role granted a tenant runs a worker for that tenant through its own claims.
- A memory with ``background=True`` takes the same claim while its thread compresses: a worker
  leaves that session alone (it used to compress it too, and one of the two ended in a
  conflict, a summarizer call wasted).
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest
import sqlalchemy as sa

import autoctx
from autoctx import (
    AsyncAutoContextMemory,
    AutoContextMemory,
    OfflineSummarizer,
    OpenAISummarizer,
)
from autoctx._worker import AutoContextWorker, Compressed
from tests.histories import SMALL, multi_round
from tests.openai_server import OpenAIServer, Reply
from tests.test_background import Gate, _at_trigger
from tests.test_tenants import Role, login_role

#: The advisory-lock key space claims used before migration 0010.
OLD_CLAIM_SPACE = 0x61637478


@pytest.fixture(scope="module")
def acme(db_url: str) -> Iterator[Role]:
    with login_role(db_url) as role:
        assert autoctx.grant_tenant(role.name, "acme", db_url) is True
        yield role


def _due(url: str, sid: str, tenant: str) -> str:
    mem = AutoContextMemory.open(sid, url, SMALL, tenant=tenant, summarizer=OfflineSummarizer())
    mem.add(multi_round(11, rounds=4, steps=8))
    assert mem.needs_compression()
    mem.close()
    return sid


def _compressed_by_worker(url: str, tenant: str | None = None) -> list[str]:
    done: list[Compressed] = []
    with AutoContextWorker(
        url, summarizer=OfflineSummarizer(), tenant=tenant, on_compressed=done.append
    ) as worker:
        worker.run(once=True)
    return [d.session_id for d in done]


def test_a_tenant_role_cannot_take_hold_or_remove_another_tenants_claim(
    db_url: str, acme: Role
) -> None:
    victim = _due(db_url, f"victim-{uuid.uuid4().hex[:6]}", "globex")
    engine = sa.create_engine(acme.url, poolclass=sa.NullPool)
    with engine.connect() as locker, engine.connect() as rows:
        # The old claim: an advisory lock on the session id's hash, which any role may take.
        taken = locker.execute(
            sa.text("SELECT pg_try_advisory_lock(:k, hashtext(:s))"),
            {"k": OLD_CLAIM_SPACE, "s": victim},
        ).scalar_one()
        assert taken is True
        locker.commit()
        # The claim rows: whatever tenant the role names, it sees, locks and writes none.
        with rows.begin():
            for tenant in ("globex", "acme", ""):
                rows.execute(
                    sa.text("SELECT set_config('autoctx.tenant', :t, true)"), {"t": tenant}
                )
                locked = rows.execute(
                    sa.text("SELECT session_id FROM session_claims FOR UPDATE")
                ).all()
                assert victim not in {r[0] for r in locked}
        # It writes no claim row at all: the triggers on sessions do (migration 0014).
        for statement in (
            "DELETE FROM session_claims WHERE session_id = :s",
            "INSERT INTO session_claims VALUES (:s)",
        ):
            with pytest.raises(sa.exc.ProgrammingError, match="permission denied"), rows.begin():
                rows.execute(sa.text("SELECT set_config('autoctx.tenant', 'globex', true)"))
                rows.execute(sa.text(statement), {"s": victim})
        # While the role still holds all it could take, the worker compresses the session.
        assert victim in _compressed_by_worker(db_url)
    engine.dispose()
    owner = AutoContextMemory.open(victim, db_url, tenant="globex", create=False)
    assert not owner.needs_compression()
    assert {e.status for e in owner.events()} == {"applied"}


def test_a_granted_role_runs_a_worker_for_its_own_tenant(db_url: str, acme: Role) -> None:
    own = _due(acme.url, f"own-{uuid.uuid4().hex[:6]}", "acme")
    other = _due(db_url, f"other-{uuid.uuid4().hex[:6]}", "globex")
    done = _compressed_by_worker(acme.url, tenant="acme")
    assert own in done and other not in done
    mem = AutoContextMemory.open(own, acme.url, tenant="acme", create=False)
    assert not mem.needs_compression()
    # A deleted session's claim goes with it (the trigger runs as the role).
    mem.delete()
    engine = sa.create_engine(db_url, poolclass=sa.NullPool)
    with engine.connect() as conn:
        left = conn.execute(
            sa.text("SELECT count(*) FROM session_claims WHERE session_id = :s"), {"s": own}
        ).scalar_one()
    engine.dispose()
    assert left == 0


@pytest.fixture(scope="module")
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer() as srv:
        yield srv


def test_a_worker_leaves_a_session_that_its_background_thread_compresses(
    db_url: str, open_memory: Callable[..., AutoContextMemory], server: OpenAIServer
) -> None:
    gate = Gate()
    server.reset()
    server.set_default(gate)
    summarizer = OpenAISummarizer(
        base_url=server.base_url, api_key="test", timeout=20, max_retries=0
    )
    mem = _at_trigger(open_memory, summarizer, background=True)
    try:
        running = mem.compress_in_background()
        assert gate.asked.wait(10.0), "the background compression never asked the summarizer"
        # The background thread waits for its answer: a worker now finds the session held.
        assert mem.session_id not in _compressed_by_worker(db_url)
        gate.release()
        events = running.result(timeout=30)
    finally:
        gate.release()
    assert [e.status for e in events if e.status == "applied"]
    statuses = [e.status for e in mem.events()]
    assert "conflict" not in statuses, statuses


# ---------------------------------------------------------------------------------------------
# A cancelled async compression lets go of its claim at once (the claim was taken before the
# try/finally that released it, and stayed held until the garbage collector ran)
# ---------------------------------------------------------------------------------------------

#: A window the history below is over: `compress_if_needed()` in worker mode compresses in
#: the calling task, holding the claim.
OVER_WINDOW = dataclasses.replace(SMALL, max_tokens=8_000)


def _claim_is_free(engine: sa.Engine, sid: str) -> bool:
    """Whether the session's claim can be taken now (the statement a worker's claim runs)."""
    with engine.begin() as conn:
        row = conn.execute(
            sa.text(
                "SELECT session_id FROM session_claims WHERE session_id = :s FOR UPDATE SKIP LOCKED"
            ),
            {"s": sid},
        ).one_or_none()
    return row is not None


async def _cancel_at_suspension(coro: Coroutine[Any, Any, object], k: int) -> bool:
    """Run `coro` as a task and cancel it when it is suspended for the `k`-th time (a new
    future awaited: each await point of the async path that really waits); True when it was
    cancelled there, False when it finished first."""
    task = asyncio.ensure_future(coro)
    seen: list[object] = []
    while not task.done():
        # CPython's Task keeps the future it waits on here (both the C and the Python Task).
        waiter = getattr(task, "_fut_waiter", None)
        if waiter is not None and (not seen or seen[-1] is not waiter):
            seen.append(waiter)
            if len(seen) == k:
                task.cancel()
                break
        await asyncio.sleep(0)
    try:
        await task
    except asyncio.CancelledError:
        return True
    return False


def test_a_cancelled_async_compression_frees_its_claim_at_every_await_point(
    db_url: str, server: OpenAIServer
) -> None:
    server.reset()
    server.set_default(Reply.text())
    summarizer = OpenAISummarizer(
        base_url=server.base_url, api_key="test", timeout=20, max_retries=0
    )
    engine = sa.create_engine(db_url, poolclass=sa.NullPool)
    history = multi_round(23, rounds=4, steps=8)

    async def scenario(k: int) -> tuple[bool, bool, bool]:
        sid = f"cancel-{k}-{uuid.uuid4().hex[:6]}"
        mem = await AsyncAutoContextMemory.open(
            sid, db_url, OVER_WINDOW, summarizer=summarizer, background="worker"
        )
        try:
            await mem.add(history)
            assert await mem.token_count() >= OVER_WINDOW.max_tokens
            cancelled = await _cancel_at_suspension(mem.compress_if_needed(), k)
            # At once: when the cancellation has reached the caller, no wait.
            free_now = _claim_is_free(engine, sid)
            # And still free once any thread the cancelled call started has ended.
            await asyncio.sleep(0.5)
            free_later = _claim_is_free(engine, sid)
            return cancelled, free_now, free_later
        finally:
            await mem.close()

    points = 0
    for k in range(1, 200):
        cancelled, free_now, free_later = asyncio.run(scenario(k))
        assert free_now and free_later, f"cancelled at suspension {k}: the claim is held"
        if not cancelled:
            break
        points += 1
    engine.dispose()
    # The claim's wait, the summarizer's answer and the database steps all suspend the call.
    assert points >= 5, points


def test_a_session_without_a_count_trigger_is_due_by_tokens_only(db_url: str) -> None:
    """`msg_threshold=None` (the default) is a JSON null in the recorded config: the worker's
    query reads it as no count trigger, not as a threshold it cannot read (which would make
    every such session due at every version)."""
    from autoctx import Msg
    from autoctx._store.claims import due_sessions

    tenant = f"counts-{uuid.uuid4().hex[:8]}"
    config = dataclasses.replace(SMALL, msg_threshold=None)
    many = AutoContextMemory.open(
        f"many-{uuid.uuid4().hex[:6]}",
        db_url,
        config,
        tenant=tenant,
        summarizer=OfflineSummarizer(),
    )
    many.add([Msg.user(f"note {k}") for k in range(200)])  # far over 60 messages, few tokens
    assert not many.needs_compression()
    counted = AutoContextMemory.open(
        f"counted-{uuid.uuid4().hex[:6]}",
        db_url,
        SMALL,
        tenant=tenant,
        summarizer=OfflineSummarizer(),
    )
    counted.add([Msg.user(f"note {k}") for k in range(200)])
    assert counted.needs_compression()
    heavy = _due(db_url, f"heavy-{uuid.uuid4().hex[:6]}", tenant)
    engine = many.engine
    due = {d.session_id for d in due_sessions(engine, limit=10, tenant=tenant)}
    assert due == {counted.session_id, heavy}
    for mem in (many, counted):
        mem.close()
