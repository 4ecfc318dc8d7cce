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

import uuid
from collections.abc import Callable, Iterator

import pytest
import sqlalchemy as sa

import autoctx
from autoctx import AutoContextMemory, OfflineSummarizer, OpenAISummarizer
from autoctx._worker import AutoContextWorker, Compressed
from tests.histories import SMALL, multi_round
from tests.openai_server import OpenAIServer
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
                gone = rows.execute(
                    sa.text("DELETE FROM session_claims WHERE session_id = :s"), {"s": victim}
                )
                assert gone.rowcount == 0
        with pytest.raises(sa.exc.ProgrammingError, match="row-level security"), rows.begin():
            rows.execute(sa.text("SELECT set_config('autoctx.tenant', 'globex', true)"))
            rows.execute(sa.text("INSERT INTO session_claims VALUES (:s)"), {"s": "x-" + victim})
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
