"""Fork (docs/design.md §9): a new session that starts from another's working context, with
copies of every row it needs, the parent untouched, and the origin in the audit."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable

import pytest

from autoctx import (
    AsyncAutoContextMemory,
    AutoContextMemory,
    InvalidMessageId,
    InvalidSessionId,
    MessageNotFound,
    Msg,
    OfflineSummarizer,
    SessionExists,
    SessionNotFound,
    export_session,
)
from tests.dbsql import sql
from tests.lifecycle import CONFIG, assert_valid_session, build, round_of, session_rows
from tests.test_cli import assert_one_line_error, invoke

Opener = Callable[..., AutoContextMemory]


@pytest.fixture
def parent(open_memory: Opener) -> AutoContextMemory:
    mem = open_memory(config=CONFIG)
    build(mem, 14)
    kinds = {m.kind for m in mem.messages()}
    assert kinds - {"original"}, "the parent should hold summaries (lineage to follow)"
    return mem


def _new_id() -> str:
    return f"fork-{uuid.uuid4().hex[:10]}"


def test_fork_then_diverge(parent: AutoContextMemory, db_url: str) -> None:
    before = session_rows(parent)
    document = export_session(parent.session_id, db_url)
    child = parent.fork(_new_id())

    # The child starts from the same working context, and its reloads work on its own rows.
    assert child.to_openai() == parent.to_openai()
    assert [m.id for m in child.messages()] == [m.id for m in parent.messages()]
    assert (child.token_count(), child.message_count()) == (
        parent.token_count(),
        parent.message_count(),
    )
    assert child.tenant == parent.tenant and child.config == parent.config
    assert_valid_session(child)
    # The parent did not change, down to the last row (and so its export).
    assert session_rows(parent) == before
    assert export_session(parent.session_id, db_url) == document

    # Diverge: each goes on alone.
    child.add(round_of(100))
    child.compress_if_needed()
    assert session_rows(parent) == before
    parent.add(round_of(200))
    parent_working = [m.id for m in parent.messages()]
    child_working = [m.id for m in child.messages()]
    assert child.messages()[-1].text == "done 100: module 100 is fine"
    assert parent.messages()[-1].text == "done 200: module 200 is fine"
    assert [m.id for m in parent.messages()] == parent_working
    assert [m.id for m in child.messages()] == child_working
    assert_valid_session(child)
    assert_valid_session(parent)

    # The audit follows the fork back.
    (row,) = sql(parent, "SELECT * FROM autoctx_forks WHERE session_id = :c", c=child.session_id)
    assert row.forked_from == parent.session_id
    assert row.forked_from_incarnation == parent.refresh().incarnation
    assert row.parent_exists and row.messages_at_fork == len(before["working_set"])
    forks = [e for e in child.events() if e.reason == "fork"]
    assert len(forks) == 1 and forks[0].status == "applied"
    # What the parent paid for is counted once, in the parent.
    (cost,) = sql(
        parent,
        "SELECT applied_count, prompt_tokens FROM autoctx_session_cost WHERE session_id = :c",
        c=child.session_id,
    )
    inherited = sql(
        parent,
        "SELECT count(*) AS n FROM compression_events WHERE session_id = :c AND inherited",
        c=child.session_id,
    )[0].n
    assert inherited > 0
    applied_own = [e for e in child.events() if e.status == "applied"]
    assert cost.applied_count == len(applied_own) - inherited


def test_the_fork_point_is_recorded(parent: AutoContextMemory) -> None:
    last = parent.messages()[-1].id
    child = parent.fork(_new_id())
    (row,) = sql(
        parent,
        "SELECT forked_at_message FROM sessions WHERE session_id = :c",
        c=child.session_id,
    )
    assert row.forked_at_message == last


def test_fork_at_a_working_message(parent: AutoContextMemory) -> None:
    working = parent.messages()
    cut = next(k for k in range(len(working) - 3, 0, -1) if working[k].role == "user")
    child = parent.fork(_new_id(), at_message=working[cut].id)
    assert [m.id for m in child.messages()] == [m.id for m in working[: cut + 1]]
    assert_valid_session(child)


def test_fork_at_an_original_a_summary_stands_for(parent: AutoContextMemory) -> None:
    """Message 4 (the first round's answer) was compressed long ago: the child starts with
    the context up to it, opened down the lineage, and nothing that came after it."""
    working_ids = {m.id for m in parent.messages()}
    assert 4 not in working_ids
    child = parent.fork(_new_id(), at_message=4)
    msgs = child.messages()
    assert msgs[-1].id == 4 and msgs[-1].text == "done 0: module 0 is fine"
    assert all(m.id is not None and (m.kind != "original" or m.id <= 4) for m in msgs)
    assert_valid_session(child)
    # A tool call cut from its result: the child starts with that call pending.
    pending = parent.fork(_new_id(), at_message=2)
    assert pending.messages()[-1].tool_uses
    with pytest.raises(Exception, match=r"unanswered|answer|pending|open"):
        pending.add(Msg.user("next"))
    pending.add(Msg.tool("c0", "the result"))
    assert_valid_session(pending)


def test_bad_forks_write_nothing(parent: AutoContextMemory, open_memory: Opener) -> None:
    before = session_rows(parent)
    other = open_memory(f"taken-{uuid.uuid4().hex[:8]}")
    other.add(Msg.user("mine"))
    taken = session_rows(other)
    with pytest.raises(SessionExists, match=repr(other.session_id)):
        parent.fork(other.session_id)
    assert session_rows(other) == taken
    with pytest.raises(SessionExists):
        parent.fork(parent.session_id)
    new = _new_id()
    with pytest.raises(MessageNotFound, match="message 99999 does not exist"):
        parent.fork(new, at_message=99999)
    with pytest.raises(InvalidMessageId, match="an int"):
        parent.fork(new, at_message="5")  # type: ignore[arg-type]
    with pytest.raises(InvalidMessageId, match="an int"):
        parent.fork(new, at_message=True)
    with pytest.raises(InvalidSessionId):
        parent.fork("")
    with pytest.raises(SessionNotFound):
        AutoContextMemory.open(new, parent.engine.url, create=False)
    assert session_rows(parent) == before


def test_a_fork_keeps_its_tenant_and_another_tenants_id_is_taken(
    open_memory: Opener, session_id: str
) -> None:
    acme = open_memory(f"{session_id}-acme", CONFIG, tenant="acme")
    build(acme, 3)
    beta = open_memory(f"{session_id}-beta", tenant="beta")
    beta.add(Msg.user("beta's"))
    child = acme.fork(f"{session_id}-acme-2")
    assert child.tenant == "acme" and child.refresh().tenant == "acme"
    assert child.to_openai() == acme.to_openai()
    with pytest.raises(SessionExists, match="cannot see"):
        acme.fork(beta.session_id)
    assert beta.messages()[-1].text == "beta's"


def test_async_fork(parent: AutoContextMemory) -> None:
    async def run() -> tuple[list[int | None], list[int | None]]:
        amem = AsyncAutoContextMemory(parent)
        child = await amem.fork(_new_id())
        return [m.id for m in await child.messages()], [m.id for m in await amem.messages()]

    child_ids, parent_ids = asyncio.run(run())
    assert child_ids == parent_ids


def test_cli_fork(parent: AutoContextMemory, db_url: str) -> None:
    new = _new_id()
    result = invoke(["fork", parent.session_id, new, "--at", "5", "-d", db_url])
    assert result.exit_code == 0, result.stderr
    assert f"into {new!r} at message 5" in result.stdout
    child = AutoContextMemory.open(new, db_url, summarizer=OfflineSummarizer(), create=False)
    assert child.messages()[-1].id == 5
    assert_one_line_error(
        invoke(["fork", parent.session_id, new, "-d", db_url]), repr(new), "already exists"
    )
    assert_one_line_error(
        invoke(["fork", parent.session_id, _new_id(), "--tenant", "acme", "-d", db_url]),
        "does not exist for tenant 'acme'",
    )


def test_two_forks_onto_one_id_at_once_one_wins(parent: AutoContextMemory, db_url: str) -> None:
    """Two memories (two connections) fork into the same id at the same moment."""
    new = _new_id()
    mems = [
        AutoContextMemory.open(parent.session_id, db_url, summarizer=OfflineSummarizer())
        for _ in range(2)
    ]
    gate = threading.Barrier(2)
    outcomes: list[object] = []

    def run(mem: AutoContextMemory) -> None:
        gate.wait()
        try:
            outcomes.append(mem.fork(new).session_id)
        except Exception as exc:  # collected and asserted below
            outcomes.append(exc)

    threads = [threading.Thread(target=run, args=(m,)) for m in mems]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcomes.count(new) == 1, outcomes
    (lost,) = [o for o in outcomes if o != new]
    assert isinstance(lost, SessionExists), lost
    child = AutoContextMemory.open(new, db_url, summarizer=OfflineSummarizer(), create=False)
    assert child.to_openai() == parent.to_openai()
    assert_valid_session(child)


def test_a_fork_of_an_erased_session_compresses_without_conflicts(
    parent: AutoContextMemory,
) -> None:
    """The erasure a fork inherits is the parent's past: it never makes the child's own
    compressions give way."""
    parent.erase([1, 2, 3, 4], reason="before the fork")
    child = parent.fork(_new_id())
    assert child.refresh().version == parent.refresh().version + 1
    build(child, 6)
    own = [e for e in child.events() if not e.inherited]
    assert [e for e in own if e.status == "applied" and e.strategy > 0]
    assert not [e for e in own if e.status == "conflict"]
    assert_valid_session(child)
