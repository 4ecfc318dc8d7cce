"""Undo (docs/design.md §7): a compression's originals back in place of its replacement, one
level deep, in one transaction, recorded as an event that names the compression; refused with
a clear error where it must be; never redone by the next compression; audited. On real
PostgreSQL through `AutoContextMemory`, the CLI, the console and killed processes."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import random
import signal
import sys
import traceback
from collections.abc import Callable

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from autoctx import (
    AsyncAutoContextMemory,
    AutoContextConfig,
    AutoContextMemory,
    Event,
    EventNotFound,
    InvalidEventId,
    InvalidExport,
    Msg,
    OfflineSummarizer,
    UndoRefused,
    export_session,
    import_session,
)
from autoctx._cli import app
from tests.crash_child import _read_until
from tests.dbsql import sql
from tests.histories import SMALL, long_task, multi_round, one_heavy_round, tool_group
from tests.invariants import assert_every_original_reachable, assert_totals_match
from tests.invariants import assert_valid_openai_chat as valid_chat

Open = Callable[..., AutoContextMemory]


def working_ids(mem: AutoContextMemory) -> list[int]:
    return [m.id for m in mem.messages() if m.id is not None]


def assert_sound(mem: AutoContextMemory) -> None:
    """A valid working context (tool pairing included), totals equal to a recount, every
    original reachable."""
    valid_chat(mem.to_openai())
    assert_totals_match(mem)
    assert_every_original_reachable(mem)


def written_by(mem: AutoContextMemory, event_id: int) -> tuple[int, ...]:
    """The messages a compression wrote, in id order (by their `event_id` column)."""
    rows = sql(
        mem,
        "select id from messages where session_id = :s and event_id = :e order by id",
        s=mem.session_id,
        e=event_id,
    )
    return tuple(r.id for r in rows)


def compress_and_undo_all(mem: AutoContextMemory) -> tuple[set[int], list[int]]:
    """Compress once, then undo every applied compression of the call, newest first: the
    working context must be what it was before the call. Returns the strategies undone and
    the undo events' ids."""
    before = working_ids(mem)
    applied = [e for e in mem.compress_if_needed() if e.status == "applied"]
    assert applied, "the workload compressed nothing"
    undos = []
    for e in reversed(applied):
        done = mem.undo(e.id, force=True)
        assert (done.strategy, done.reason, done.status, done.undoes) == (
            0,
            "undo",
            "applied",
            e.id,
        )
        # What left the working context: the compression's replacement, or for a masking pass
        # (one event) the preview of each output it masked.
        assert done.replaced_ids == written_by(mem, e.id)
        assert done.tokens_after - done.tokens_before == e.tokens_before - e.tokens_after
        undos.append(done.id)
        assert_sound(mem)
    assert working_ids(mem) == before
    return {e.strategy for e in applied}, undos


#: One heavy previous round that S4 alone brings under the target (`one_heavy_round`).
S4 = dataclasses.replace(SMALL, max_tokens=2_900, large_payload_chars=100_000, min_tool_run=1000)
#: A long task of small steps that only S6 can shrink.
S6 = dataclasses.replace(SMALL, max_tokens=3_000, large_payload_chars=100_000, min_tool_run=1000)
#: Masking on (SMALL turns it off for the other rungs' tests).
MASKING = dataclasses.replace(SMALL, mask_min_chars=200, max_tokens=12_000, msg_threshold=1_000)


@pytest.mark.parametrize(
    ("config", "history", "expected"),
    [
        # Masking: many outputs replaced in one pass, one event for the pass.
        (MASKING, multi_round(1, rounds=5, steps=5), {8}),
        # The fold, around the system message and a pinned group.
        (SMALL, multi_round(3, rounds=6, steps=6), {7}),
        # S4, one previous round (see `one_heavy_round`).
        (S4, one_heavy_round(4), {4}),
        # S6: a long task of small steps (no S1, no previews): the whole current round.
        (S6, long_task(1, steps=40, big_every=10_000), {6}),
        # A long task: S1, S2/S3 previews, S5's partial summaries and S6.
        (dataclasses.replace(SMALL, max_tokens=9_000), long_task(5, steps=40), None),
    ],
    ids=["masking", "fold", "s4", "s6", "long-task"],
)
def test_undo_puts_each_rungs_originals_back_in_place(
    open_memory: Open,
    config: AutoContextConfig,
    history: list[Msg],
    expected: set[int] | None,
) -> None:
    mem = open_memory(config=config)
    mem.add(history)
    undone, _ = compress_and_undo_all(mem)
    if expected is not None:
        assert expected <= undone, undone
    else:
        assert undone & {1, 2, 3, 5, 6}, undone


def test_every_rung_is_undone_on_some_workload(open_memory: Open, session_id: str) -> None:
    """Across a few workloads, every rung's compression is undone and the context comes back
    exactly (the parametrized test above names the cases; this one checks none is missing)."""
    seen: set[int] = set()
    workloads: list[tuple[AutoContextConfig, list[Msg]]] = [
        (MASKING, multi_round(1, rounds=5, steps=5)),
        (SMALL, multi_round(3, rounds=6, steps=6)),
        (S4, one_heavy_round(4)),
        (S6, long_task(1, steps=40, big_every=10_000)),
    ]
    workloads += [
        (dataclasses.replace(SMALL, max_tokens=w, fold_keep_tokens=k), long_task(s, steps=n))
        for s, (w, k, n) in enumerate([(9_000, 500, 40), (6_000, 300, 24), (14_000, 800, 60)])
    ]
    workloads += [
        (dataclasses.replace(SMALL, max_tokens=w, last_keep=4), multi_round(s, rounds=r, steps=6))
        for s, (w, r) in enumerate([(12_000, 4), (30_000, 8)], start=20)
    ]
    for k, (config, history) in enumerate(workloads):
        mem = open_memory(f"{session_id}-{k}", config=config)
        mem.add(history)
        undone, _ = compress_and_undo_all(mem)
        seen |= undone
    assert {1, 4, 5, 6, 7, 8} <= seen, seen


def test_a_fold_comes_back_around_the_messages_it_kept(open_memory: Open) -> None:
    """The fold went around a system message and a pinned group inside its range; the undo
    puts each back between the originals where it stood."""
    msgs = multi_round(6, rounds=6, steps=6)
    at = len(msgs) // 3
    pinned = [
        dataclasses.replace(m, pinned=True) for m in tool_group(random.Random(1), ["p1"], False)
    ]
    msgs = [*msgs[:at], Msg.system("Policy: never touch prod."), *msgs[at:]]
    cut = next(i for i in range(2 * len(msgs) // 3, len(msgs)) if msgs[i].role == "user")
    msgs = [*msgs[:cut], *pinned, *msgs[cut:]]
    mem = open_memory(config=SMALL)
    mem.add(msgs)
    before = working_ids(mem)
    folds = [e for e in mem.compress_if_needed() if e.strategy == 7 and e.status == "applied"]
    assert folds
    fold = folds[-1]
    kept = [m.id for m in mem.messages() if m.pinned or m.role == "system"]
    position = working_ids(mem).index(fold.summary_message_id)
    assert all(working_ids(mem).index(k) < position for k in kept)  # kept before the summary
    for e in reversed([e for e in mem.events() if e.strategy and e.id >= fold.id]):
        mem.undo(e.id, force=True)
    assert working_ids(mem) == before
    assert_sound(mem)


def test_an_undo_is_a_manual_event_with_lineage_in_the_audit(open_memory: Open) -> None:
    mem = open_memory(config=S4)
    mem.add(one_heavy_round(4))
    (s4,) = [e for e in mem.compress_if_needed() if e.strategy == 4 and e.status == "applied"]
    version = mem.version()
    done = mem.undo(s4.id)
    assert mem.version() == version + 1
    assert done.note is None  # not forced
    assert mem.events()[-1] == dataclasses.replace(done, created_at=mem.events()[-1].created_at)
    # The originals are back; the summary is stored still, reachable from the compression.
    back = {m.id for m in mem.messages()}
    assert set(s4.replaced_ids) <= back and s4.summary_message_id not in back
    assert [m.id for m in mem.reload(str(s4.offload_uuid))] == list(s4.replaced_ids)
    (row,) = sql(mem, "SELECT * FROM autoctx_undos WHERE session_id = :s", s=mem.session_id)
    assert (row.undo_event_id, row.undone_event_id, row.undone_strategy) == (done.id, s4.id, 4)
    assert row.removed_message_id == s4.summary_message_id
    assert list(row.restored_ids) == list(s4.replaced_ids)
    assert row.restored_offload_uuid == s4.offload_uuid
    assert row.tokens_given_back == row.tokens_saved_by_compression > 0
    assert row.forced is False
    # The savings view counts the tokens given back against strategy 0, once.
    (manual,) = sql(
        mem,
        "SELECT tokens_saved FROM autoctx_savings_by_strategy WHERE session_id = :s "
        "AND strategy = 0",
        s=mem.session_id,
    )
    assert manual.tokens_saved == -row.tokens_given_back


def test_an_undo_over_the_window_is_refused_unless_forced_and_never_redone(
    open_memory: Open,
) -> None:
    config = dataclasses.replace(SMALL, max_tokens=6_000)
    mem = open_memory(config=config)
    mem.add(multi_round(8, rounds=6, steps=6))
    events = [e for e in mem.compress_if_needed() if e.status == "applied"]
    assert mem.token_count() < config.max_tokens
    big = max(events, key=lambda e: e.tokens_before - e.tokens_after)
    version, context = mem.version(), working_ids(mem)
    with pytest.raises(UndoRefused) as refused:
        mem.undo(big.id)
    assert refused.value.reason == "over_window"
    text = str(refused.value)
    assert f"event {big.id}" in text and repr(mem.session_id) in text and "force=True" in text
    assert (mem.version(), working_ids(mem)) == (version, context)  # nothing changed
    forced = mem.undo(big.id, force=True)
    assert forced.tokens_after >= config.max_tokens and forced.note is not None
    # The next call chooses again: back under the window, without the range it took back.
    later = mem.compress_if_needed()
    assert mem.token_count() < config.max_tokens
    assert all(e.replaced_ids != big.replaced_ids for e in later if e.reason != "fallback")
    assert mem.compress_if_needed() == []  # and it settles: no loop
    assert_sound(mem)
    (row,) = sql(mem, "SELECT forced FROM autoctx_undos WHERE session_id = :s", s=mem.session_id)
    assert row.forced is True


def test_an_undo_of_a_replacement_compressed_further_names_the_event_that_holds_it(
    open_memory: Open,
) -> None:
    config = S4
    mem = open_memory(config=config)
    mem.add(one_heavy_round(4))
    (s4,) = [e for e in mem.compress_if_needed() if e.strategy == 4 and e.status == "applied"]
    # More rounds, until a fold takes the S4 summary in.
    fold = None
    for k in range(30):
        mem.add(multi_round(100 + k, rounds=1, steps=3)[1:])
        for e in mem.compress_if_needed():
            if e.status == "applied" and s4.summary_message_id in e.replaced_ids:
                fold = e
        if fold is not None:
            break
    assert fold is not None
    context = working_ids(mem)
    with pytest.raises(UndoRefused) as refused:
        mem.undo(s4.id)
    assert refused.value.reason == "moved"
    text = str(refused.value)
    assert f"event {fold.id}" in text and f"message {s4.summary_message_id}" in text
    assert working_ids(mem) == context
    # Undoing the holder first, newest first as the message says, makes it possible.
    holders = [
        int(w)
        for w in text.split("undo ", 1)[1].split(" first")[0].replace("event ", "").split(", then ")
    ]
    for h in holders:
        mem.undo(h, force=True)
    mem.undo(s4.id, force=True)
    assert set(s4.replaced_ids) <= set(working_ids(mem))
    assert_sound(mem)
    with pytest.raises(UndoRefused) as again:
        mem.undo(s4.id)
    assert again.value.reason == "moved" and "already undid" in str(again.value)


def test_an_undo_of_a_masking_pass_whose_preview_moved_is_refused_whole(open_memory: Open) -> None:
    """A masking pass is one event and is undone whole (docs/design.md §7): once a later
    compression took one of its previews in, the undo is refused, naming that compression and
    the preview, and nothing comes back, not even the previews still in the working context;
    undoing the holder first makes it possible."""
    mem = open_memory(config=MASKING)
    mem.add(multi_round(1, rounds=5, steps=5))
    (mask,) = [e for e in mem.compress_if_needed() if e.strategy == 8 and e.status == "applied"]
    previews = written_by(mem, mask.id)
    assert len(previews) > 1
    holder = None
    for k in range(40):
        mem.add(multi_round(200 + k, rounds=1, steps=3)[1:])
        for e in mem.compress_if_needed():
            if e.status == "applied" and set(previews) & set(e.replaced_ids):
                holder = e
        if holder is not None:
            break
    assert holder is not None
    still = set(previews) & set(working_ids(mem))
    assert still != set(previews), "the later compression took some previews in"
    context = working_ids(mem)
    with pytest.raises(UndoRefused) as refused:
        mem.undo(mask.id)
    assert refused.value.reason == "moved"
    text = str(refused.value)
    assert f"event {holder.id}" in text and f"event {mask.id}" in text
    assert working_ids(mem) == context  # none of the pass came back
    mem.undo(holder.id, force=True)
    done = mem.undo(mask.id, force=True)
    assert done.replaced_ids == previews
    assert set(mask.replaced_ids) <= set(working_ids(mem))
    assert_sound(mem)


def _until_taken(mem: AutoContextMemory, message_id: int, seed: int) -> Event:
    """Add rounds and compress until an applied compression takes `message_id` in."""
    for k in range(30):
        mem.add(multi_round(seed + k, rounds=1, steps=3)[1:])
        for e in mem.compress_if_needed():
            if e.status == "applied" and message_id in e.replaced_ids:
                return e
    raise AssertionError(f"no compression took message {message_id} in")


def test_a_replacement_compressed_again_after_an_undo_names_the_compression_that_holds_it(
    open_memory: Open,
) -> None:
    """The summary of S4 is folded, the fold undone, and the summary compressed again: of its
    two summaries, the refusal names the one that leads to the working context."""
    mem = open_memory(config=S4)
    mem.add(one_heavy_round(4))
    (s4,) = [e for e in mem.compress_if_needed() if e.strategy == 4 and e.status == "applied"]
    first = _until_taken(mem, s4.summary_message_id, 100)
    mem.undo(first.id, force=True)
    again = _until_taken(mem, s4.summary_message_id, 200)
    assert again.id != first.id and again.replaced_ids != first.replaced_ids
    with pytest.raises(UndoRefused) as refused:
        mem.undo(s4.id)
    text = str(refused.value)
    assert refused.value.reason == "moved"
    assert f"event {again.id}" in text and f"event {first.id}" not in text, text


def test_an_undo_of_erased_originals_is_refused(open_memory: Open) -> None:
    mem = open_memory(config=S4)
    mem.add(one_heavy_round(4))
    (s4,) = [e for e in mem.compress_if_needed() if e.strategy == 4 and e.status == "applied"]
    target = next(i for i in s4.replaced_ids)
    erasure = mem.erase([target], reason="ticket 7")
    with pytest.raises(UndoRefused) as refused:
        mem.undo(s4.id, force=True)
    assert refused.value.reason == "erased"
    assert f"message {target}" in str(refused.value)
    assert f"event {erasure.event.id}" in str(refused.value)


def test_bad_undos_are_refused_naming_the_event_and_quoting_no_content(
    open_memory: Open,
) -> None:
    secret = "SECRET-CONTENT-0042"
    mem = open_memory(config=S4)
    history = one_heavy_round(4)
    history[1] = Msg.user(f"Task: {secret}")
    mem.add(history)
    events = mem.compress_if_needed()
    mem.add([Msg.assistant("ok")])
    popped_event = (mem.pop_last(), mem.events()[-1])[1]
    refusals: list[Exception] = []
    for bad in ("3", 0, -1, True, 2**70, None):
        with pytest.raises(InvalidEventId) as malformed:
            mem.undo(bad)  # type: ignore[arg-type]
        refusals.append(malformed.value)
    with pytest.raises(EventNotFound) as unknown:
        mem.undo(10_000)
    refusals.append(unknown.value)
    assert "10000" in str(unknown.value) and repr(mem.session_id) in str(unknown.value)
    with pytest.raises(UndoRefused) as manual:
        mem.undo(popped_event.id)
    assert manual.value.reason == "not_a_compression" and "pop" in str(manual.value)
    refusals.append(manual.value)
    done = mem.undo(next(e.id for e in events if e.status == "applied"), force=True)
    with pytest.raises(UndoRefused) as undo_of_undo:
        mem.undo(done.id)
    assert undo_of_undo.value.reason == "not_a_compression"
    refusals.append(undo_of_undo.value)
    assert all(secret not in str(r) for r in refusals)


def test_a_fork_undoes_a_compression_its_parent_made(open_memory: Open, session_id: str) -> None:
    parent = open_memory(config=S4)
    parent.add(one_heavy_round(4))
    (s4,) = [e for e in parent.compress_if_needed() if e.strategy == 4 and e.status == "applied"]
    parent_context = working_ids(parent)
    child = parent.fork(f"{session_id}-child")
    (inherited,) = [e for e in child.events() if e.id == s4.id]
    assert inherited.inherited
    done = child.undo(s4.id)
    assert done.undoes == s4.id
    assert set(s4.replaced_ids) <= set(working_ids(child))
    assert_sound(child)
    assert working_ids(parent) == parent_context  # the parent does not change
    # The audit counts the child's undo in the child.
    rows = sql(
        child,
        "SELECT session_id FROM autoctx_undos WHERE session_id IN (:p, :c)",
        p=parent.session_id,
        c=child.session_id,
    )
    assert [r.session_id for r in rows] == [child.session_id]


def test_an_export_carries_the_undo_and_one_made_before_it_still_imports(
    open_memory: Open, db_url: str
) -> None:
    mem = open_memory(config=S4)
    mem.add(one_heavy_round(4))
    (s4,) = [e for e in mem.compress_if_needed() if e.strategy == 4 and e.status == "applied"]
    assert mem.undo(s4.id).undoes == s4.id
    document = export_session(mem.session_id, db_url)
    mem.delete()
    import_session(json.dumps(document), db_url)
    again = AutoContextMemory.open(mem.session_id, db_url, create=False)
    assert again.events()[-1].undoes == s4.id
    assert export_session(again.session_id, db_url) == document
    # The undo counts in the compressor of the imported session too: S4 is not planned again.
    assert all(e.replaced_ids != s4.replaced_ids for e in again.compress_if_needed())
    # A document of an earlier version has no `undoes` key: it imports, read as none.
    plain = open_memory(f"{mem.session_id}-plain", config=S4)
    plain.add(one_heavy_round(5))
    assert plain.compress_if_needed()
    older = export_session(plain.session_id, db_url)
    plain.delete()
    for event in older["events"]:
        del event["undoes"]
    import_session(older, db_url)
    back = AutoContextMemory.open(f"{mem.session_id}-plain", db_url, create=False)
    assert back.events() and all(e.undoes is None for e in back.events())
    # ... and a document that names an event it does not hold is refused, naming the field.
    bad = json.loads(json.dumps(document))
    bad["events"][-1]["undoes"] = 999
    with pytest.raises(InvalidExport, match=r"events\[\d+\]\.undoes"):
        import_session(bad, db_url)


def test_the_async_memory_undoes_too(db_url: str, session_id: str) -> None:
    async def run() -> None:
        config = S4
        mem = await AsyncAutoContextMemory.open(
            session_id, db_url, config, summarizer=OfflineSummarizer()
        )
        try:
            await mem.add(one_heavy_round(4))
            applied = [e for e in await mem.compress_if_needed() if e.status == "applied"]
            done = await mem.undo(applied[-1].id, force=True)
            assert done.undoes == applied[-1].id
            with pytest.raises(UndoRefused):
                await mem.undo(applied[-1].id)
        finally:
            await mem.close()

    asyncio.run(run())


def _cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})
    return result.exit_code, result.output


def test_autoctx_undo_and_history_in_the_cli(open_memory: Open, db_url: str) -> None:
    config = dataclasses.replace(SMALL, max_tokens=6_000)
    mem = open_memory(config=config)
    mem.add(multi_round(8, rounds=6, steps=6))
    applied = [e for e in mem.compress_if_needed() if e.status == "applied"]
    big = max(applied, key=lambda e: e.tokens_before - e.tokens_after)
    sid = mem.session_id
    code, out = _cli("undo", sid, str(big.id), "--database-url", db_url)
    assert code != 0 and out.count("\n") == 1 and "Traceback" not in out
    assert f"event {big.id}" in out and "--force" in out
    code, out = _cli("undo", sid, str(big.id), "--force", "--json", "--database-url", db_url)
    assert code == 0, out
    event = json.loads(out)["event"]
    assert (event["reason"], event["undoes"], event["strategy"]) == ("undo", big.id, 0)
    code, out = _cli("history", sid, "--database-url", db_url)
    assert code == 0 and f"undo of event {big.id}" in out, out
    code, out = _cli("undo", sid, "999999", "--database-url", db_url)
    assert code != 0 and "has no event 999999" in out and out.count("\n") == 1


def test_the_console_links_an_undo_to_the_compression_it_took_back(
    open_memory: Open, db_url: str
) -> None:
    from tests.test_console import serve

    mem = open_memory(config=S4)
    mem.add(one_heavy_round(4))
    (s4,) = [e for e in mem.compress_if_needed() if e.strategy == 4 and e.status == "applied"]
    done = mem.undo(s4.id)
    with serve(db_url, None) as ui:
        code, page = ui.get(f"/s/{mem.session_id}/events")
    assert code == 200
    row = page.split(f'id="e{done.id}"', 1)[1].split("</tr>", 1)[0]
    assert "</span> undo</td>" in row  # named by its reason, as pops and clears are
    assert f'#e{s4.id}">event #{s4.id}</a>' in row


# ---------------------------------------------------------------------------------------------
# Killed processes (the harness of tests/crash_child.py)
# ---------------------------------------------------------------------------------------------

#: Where the undo's transaction is paused before the kill, by the statements it sends.
UNDO_PHASES = ("after_lock", "shifted", "rows_replaced", "before_commit", "after_commit")


def _pause(phase: str) -> None:
    sys.stderr.write(f"PAUSED {phase}\n")
    sys.stderr.flush()
    while True:
        signal.pause()


def _install_pauses(engine: sa.Engine, phase: str) -> None:
    state = {"undo": False}

    def before(conn: object, cursor: object, statement: str, *args: object) -> None:
        s = " ".join(statement.split()).upper()
        if phase == "rows_replaced" and s.startswith("INSERT INTO COMPRESSION_EVENTS"):
            _pause(phase)  # the working set rewritten, no event yet

    def after(conn: object, cursor: object, statement: str, *args: object) -> None:
        s = " ".join(statement.split()).upper()
        if s.endswith("FOR UPDATE") and "FROM SESSIONS" in s and phase == "after_lock":
            _pause(phase)
        if phase == "shifted" and s.startswith("INSERT INTO WORKING_SET") and "UNNEST" in s:
            _pause(phase)  # the positions after the span moved on, nothing else written
        if s.startswith("INSERT INTO COMPRESSION_EVENTS"):
            state["undo"] = True

    def commit(conn: object) -> None:
        if state["undo"] and phase == "before_commit":
            _pause(phase)

    def checkin(*args: object) -> None:
        if state["undo"] and phase == "after_commit":
            _pause(phase)

    sa.event.listen(engine, "before_cursor_execute", before)
    sa.event.listen(engine, "after_cursor_execute", after)
    sa.event.listen(engine, "commit", commit)
    sa.event.listen(engine, "checkin", checkin)


def _kill_during_undo(db_url: str, sid: str, event_id: int, phase: str) -> None:
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 0
        try:
            os.close(read_end)
            os.dup2(write_end, 2)
            sys.stderr = os.fdopen(2, "w", buffering=1)
            mem = AutoContextMemory.open(sid, db_url, summarizer=OfflineSummarizer(), create=False)
            _install_pauses(mem.engine, phase)
            mem.undo(event_id, force=True)
            _pause("returned")
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            with contextlib.suppress(BaseException):
                sys.stderr.flush()
            os._exit(code)
    os.close(write_end)
    buf = bytearray()
    try:
        seen = _read_until(read_end, pid, f"PAUSED {phase}".encode(), 60.0, buf)
        assert seen, buf.decode(errors="replace")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(read_end)


@pytest.mark.parametrize("phase", UNDO_PHASES)
def test_a_kill_at_any_phase_of_an_undo_leaves_it_all_or_nothing(
    phase: str, db_url: str, session_id: str
) -> None:
    """Undone in a fork, whose working set is renumbered densely, so that the restored
    messages need the positions after them moved (the shift phase)."""
    config = S4
    parent = AutoContextMemory.open(session_id, db_url, config, summarizer=OfflineSummarizer())
    parent.add(one_heavy_round(4))
    (s4,) = [e for e in parent.compress_if_needed() if e.strategy == 4 and e.status == "applied"]
    child = parent.fork(f"{session_id}-c")
    before = working_ids(child)
    restored = before[: before.index(s4.summary_message_id)]
    restored += [*s4.replaced_ids, *before[before.index(s4.summary_message_id) + 1 :]]
    child.close()
    _kill_during_undo(db_url, f"{session_id}-c", s4.id, phase)
    fresh = AutoContextMemory.open(
        f"{session_id}-c", db_url, summarizer=OfflineSummarizer(), create=False
    )
    undos = [e for e in fresh.events() if e.reason == "undo"]
    if phase == "after_commit":
        assert working_ids(fresh) == restored and len(undos) == 1
    else:
        assert working_ids(fresh) == before and not undos
        fresh.undo(s4.id)  # and a new process undoes it whole
        assert working_ids(fresh) == restored
    assert_sound(fresh)
    fresh.add([Msg.user("And now?")])  # the session goes on
    assert_sound(fresh)
    fresh.close()
    parent.close()
