"""The compression store contract (`autoctx._effects.CompressionStore`, docs/design.md §2 and
§5), held by both of its implementations with the same test: the SQL store (bound to one
session, on PostgreSQL through the migrations) and the in-memory store the property tests run
on (tests/memory_store.py). What one does, the other must do, or the in-memory properties
would prove nothing of the SQL store."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Iterator, Sequence

import pytest

from autoctx import AutoContextConfig, AutoContextMemory, Msg, ToolUseBlock
from autoctx._effects import CompressionStore
from autoctx._intake import Prepared, count_tokens
from autoctx._plans import Edit, Snapshot
from autoctx._replacements import Replacement, preview
from autoctx._tokens import TokenCounter
from tests.memory_store import MemorySession

CONFIG = AutoContextConfig(preview_chars=40)
COUNTER = TokenCounter(CONFIG.model)

#: (the store, a function that appends messages to its session)
Opened = tuple[CompressionStore, Callable[[Sequence[Msg]], list[Msg]]]


@pytest.fixture(params=["memory", "postgresql"])
def opened(request: pytest.FixtureRequest) -> Iterator[Opened]:
    if request.param == "memory":
        session = MemorySession(CONFIG, summarizer=None)  # type: ignore[arg-type]
        yield session.store, session.add
        return
    db_url: str = request.getfixturevalue("db_url")
    mem = AutoContextMemory.open(f"contract-{uuid.uuid4().hex}", db_url, CONFIG)
    yield mem._store, mem.add
    mem.delete()


def history(add: Callable[[Sequence[Msg]], list[Msg]]) -> list[Msg]:
    return [
        *add([Msg.system("You are an agent.")]),
        *add([Msg.user("Read the logs.")]),
        *add(
            [
                Msg.assistant(None, [ToolUseBlock("c1", "read", '{"path": "a.log"}')]),
                Msg.tool("c1", "log line\n" * 400, "read"),
            ]
        ),
        *add([Msg.assistant("The logs are clean.")]),
    ]


def preview_of(snap: Snapshot, index: int, original: Msg) -> Replacement:
    """S2's replacement of one message, as the compressor builds it."""
    meta = snap.messages[index]
    edit = Edit(2, index, index + 1, (meta.id,), "preview", False, meta.tokens)
    offload = uuid.uuid4()
    new = preview(original, CONFIG, snap.next_handle + index)
    return Replacement(
        edit,
        Prepared(new, count_tokens(new, COUNTER), new.payload_chars, False),
        offload,
        snap.next_handle + index,
    )


def test_appends_and_reads(opened: Opened) -> None:
    store, add = opened
    added = history(add)
    snap = store.snapshot()
    totals = store.totals()
    assert [m.id for m in snap.messages] == [m.id for m in added]
    assert (snap.version, snap.message_count, snap.token_count) == (
        totals.version,
        totals.message_count,
        totals.token_count,
    )
    assert snap.token_count == sum(m.tokens or 0 for m in added)
    assert totals.settled_version is None
    loaded = store.load_messages([added[3].id or 0, added[1].id or 0])
    assert loaded[added[3].id or 0].content == added[3].content


def test_an_event_that_changed_nothing_keeps_the_version(opened: Opened) -> None:
    store, add = opened
    history(add)
    before = store.totals()
    first = store.record_event(
        strategy=4, status="failed", reason="tokens", replaced_ids=(2, 3), error="x", config={}
    )
    second = store.record_event(strategy=7, status="skipped", reason="tokens", config={})
    assert second.id > first.id
    assert first.replaced_ids == (2, 3) and first.error == "x"
    assert (first.tokens_before, first.tokens_after) == (before.token_count,) * 2
    assert first.session_version == before.version
    assert store.totals().version == before.version


def test_an_apply_is_one_version_and_the_new_message_takes_the_place(opened: Opened) -> None:
    store, add = opened
    added = history(add)
    snap = store.snapshot()
    replacement = preview_of(snap, 3, added[3])
    outcome = store.apply([replacement], reason="tokens", config={}, seen_version=snap.version)
    assert not outcome.conflict
    (event,) = outcome.events
    assert event.status == "applied" and event.strategy == 2
    assert event.replaced_ids == (added[3].id,) and event.offload_uuid == replacement.offload_uuid
    assert event.session_version == snap.version + 1
    assert event.tokens_before == snap.token_count
    assert event.tokens_after == snap.token_count - replacement.edit.replaced_tokens + (
        replacement.new.tokens
    )
    after = store.snapshot()
    assert after.version == store.totals().version == snap.version + 1
    assert after.token_count == event.tokens_after == sum(m.tokens for m in after.messages)
    ids = [m.id for m in after.messages]
    assert ids[:3] == [m.id for m in added[:3]] and ids[4:] == [m.id for m in added[4:]]
    assert ids[3] == event.summary_message_id
    new = store.load_messages([ids[3]])[ids[3]]
    assert new.kind == "preview" and new.tool_results[0].tool_use_id == "c1"


def test_a_plan_of_a_changed_working_set_is_a_conflict_and_writes_nothing(opened: Opened) -> None:
    store, add = opened
    added = history(add)
    snap = store.snapshot()
    replacement = preview_of(snap, 3, added[3])
    store.apply([replacement], reason="tokens", config={}, seen_version=snap.version)
    version = store.totals().version
    again = store.apply([replacement], reason="tokens", config={}, seen_version=snap.version)
    assert again.conflict
    assert [(e.status, e.replaced_ids) for e in again.events] == [("conflict", (added[3].id,))]
    assert store.totals().version == version
    assert len(store.snapshot().messages) == len(added)


def test_apply_conflicts_and_writes_nothing_when_the_handle_was_taken(opened: Opened) -> None:
    """Two plans of one snapshot, of disjoint ranges, both numbered from its `next_handle`: the
    first applies and moves the counter; the second is a conflict, although its range is
    intact, and writes nothing. Planned again, it takes the next handle."""
    store, add = opened
    added = history(add)
    snap = store.snapshot()
    first = preview_of(snap, 1, added[1])
    second = preview_of(snap, 3, added[3])
    second = dataclasses.replace(second, handle=first.handle)
    assert not store.apply([first], reason="tokens", config={}).conflict
    after = store.snapshot()
    assert after.next_handle == first.handle + 1
    version = store.totals().version
    lost = store.apply([second], reason="tokens", config={}, seen_version=snap.version)
    assert lost.conflict and [e.status for e in lost.events] == ["conflict"]
    assert store.totals().version == version and store.snapshot().next_handle == after.next_handle
    index = [m.id for m in after.messages].index(added[3].id)
    again = preview_of(after, index, added[3])
    assert again.handle >= after.next_handle
    assert not store.apply([again], reason="tokens", config={}).conflict
    assert store.snapshot().next_handle == again.handle + 1
    assert [m.id for m in store.reload(again.handle)] == [added[3].id]
    assert [m.id for m in store.reload(first.handle)] == [added[1].id]


def test_appends_after_the_snapshot_do_not_conflict(opened: Opened) -> None:
    store, add = opened
    added = history(add)
    snap = store.snapshot()
    later = add([Msg.user("And now?")])
    outcome = store.apply(
        [preview_of(snap, 3, added[3])], reason="tokens", config={}, seen_version=snap.version
    )
    assert not outcome.conflict
    assert store.snapshot().messages[-1].id == later[0].id


def test_settle_holds_only_at_the_current_version(opened: Opened) -> None:
    store, add = opened
    history(add)
    version = store.totals().version
    store.settle(version - 1)
    assert store.totals().settled_version is None
    store.settle(version)
    assert store.totals().settled_version == version
    add([Msg.user("more")])
    assert store.totals().settled_version == version != store.totals().version
