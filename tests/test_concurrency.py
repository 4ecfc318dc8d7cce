"""Concurrency (docs/design.md §5): several real processes on one session, and sessions that
never block each other.

Writers of one session serialize on its row lock; the summarizer call holds no lock; a
compressor whose range changed while it was summarizing gives up and records a `conflict`
event. docs/scaling.md explains the locking decision; these tests are its evidence.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import multiprocessing.synchronize
import random
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from autoctx import (
    AutoContextClient,
    AutoContextMemory,
    Conflict,
    Msg,
    OpenAISummarizer,
    RuntimeOptions,
    ToolUseBlock,
)
from tests.dbsql import sql
from tests.histories import SMALL, multi_round
from tests.invariants import assert_consistent, assert_every_original_reachable
from tests.openai_server import OpenAIServer, Reply
from tests.pauses import Pauser

CTX = multiprocessing.get_context("fork")

CONFIG = dataclasses.replace(SMALL, max_tokens=12_000)
OPTIONS = RuntimeOptions(max_llm_calls=4)
WRITERS = 3
COMPRESSORS = 2
BATCHES = 25


@pytest.fixture(scope="module")
def llm() -> Iterator[OpenAIServer]:
    """A slow summarizer endpoint whose first two requests wait for each other: the two
    compressors are then both mid-summary on the same snapshot, so exactly one can win."""
    rendezvous = threading.Barrier(2, timeout=10)
    first_two = iter(range(2))
    lock = threading.Lock()
    rng = random.Random(3)

    def answer(body: Any) -> Reply:
        with lock:
            waiting = next(first_two, None) is not None
            delay = rng.uniform(0.02, 0.1)
        if waiting:
            # A broken barrier (one compressor never asked) just answers: the test then
            # reports that no race happened.
            with contextlib.suppress(threading.BrokenBarrierError):
                rendezvous.wait()
        return Reply.slow(delay)

    with OpenAIServer(default=answer) as srv:
        yield srv


def _summarizer(base_url: str) -> OpenAISummarizer:
    return OpenAISummarizer(base_url=base_url, api_key="test", timeout=20, max_retries=0)


# ---------------------------------------------------------------------------------------------
# Children
# ---------------------------------------------------------------------------------------------


def _group(writer: int, seq: int, rng: random.Random) -> list[Msg]:
    """One complete tool group, tagged with its writer and sequence number."""
    meta = {"writer": writer, "seq": seq}
    call = ToolUseBlock(f"w{writer}-{seq}", "read_file", f'{{"path": "src/w{writer}/{seq}.py"}}')
    body = "\n".join(
        f"line {k} of w{writer}/{seq}: value={rng.randrange(10**6)}"
        for k in range(rng.choice((5, 40, 120)))
    )
    return [Msg.assistant(None, [call], metadata=meta), Msg.tool(call.id, body, metadata=meta)]


def _child(target: Callable[..., Any], results: Any, *args: Any) -> None:
    """Run `target` in a forked child and send back ("ok", value) or ("error", traceback)."""
    # The parent's pooled connections are not the child's to use: the client's at-fork
    # handler (docs/design.md §5) forgets them and the child's memories connect anew.
    try:
        results.put(("ok", target(*args)))
    except BaseException:
        results.put(("error", traceback.format_exc()))
        raise


def _writer(
    db_url: str, sid: str, writer: int, start: multiprocessing.synchronize.Event
) -> tuple[int, list[list[int]]]:
    mem = AutoContextMemory.open(sid, db_url, CONFIG, options=OPTIONS, create=False)
    rng = random.Random(writer)
    start.wait()
    acked: list[list[int]] = []
    for seq in range(BATCHES):
        acked.append([m.id or 0 for m in mem.add(_group(writer, seq, rng))])
        time.sleep(rng.uniform(0, 0.01))
    return writer, acked


def _compressor(
    db_url: str,
    sid: str,
    base_url: str,
    start: multiprocessing.synchronize.Event,
    stop: multiprocessing.synchronize.Event,
) -> dict[str, int]:
    mem = AutoContextMemory.open(
        sid, db_url, CONFIG, options=OPTIONS, summarizer=_summarizer(base_url), create=False
    )
    start.wait()
    seen: dict[str, int] = {}
    while True:
        last_round = stop.is_set()
        for e in mem.compress_if_needed():
            seen[e.status] = seen.get(e.status, 0) + 1
        if last_round:
            return seen


def _collect(results: Any, n: int, procs: list[Any], seconds: float) -> list[Any]:
    out: list[Any] = []
    deadline = time.monotonic() + seconds
    while len(out) < n:
        if time.monotonic() > deadline:
            for p in procs:
                p.kill()
            raise AssertionError(f"only {len(out)} of {n} children reported in {seconds} s")
        if results.empty():
            time.sleep(0.02)
            continue
        status, value = results.get()
        assert status == "ok", value
        out.append(value)
    return out


# ---------------------------------------------------------------------------------------------
# Many processes, one session
# ---------------------------------------------------------------------------------------------


def test_writers_and_compressors_on_one_session_lose_nothing(
    db_url: str, llm: OpenAIServer, session_id: str
) -> None:
    mem = AutoContextMemory.open(session_id, db_url, CONFIG, options=OPTIONS)
    history = mem.add(multi_round(21, rounds=4, steps=8))
    assert mem.needs_compression()

    results = CTX.SimpleQueue()
    start, stop = CTX.Event(), CTX.Event()
    writers = [
        CTX.Process(target=_child, args=(_writer, results, db_url, session_id, w, start))
        for w in range(WRITERS)
    ]
    compressors = [
        CTX.Process(
            target=_child,
            args=(_compressor, results, db_url, session_id, llm.base_url, start, stop),
        )
        for _ in range(COMPRESSORS)
    ]
    procs = writers + compressors
    for p in procs:
        p.start()
    start.set()
    written = dict(_collect(results, WRITERS, procs, 60))
    stop.set()
    outcomes: list[dict[str, int]] = _collect(results, COMPRESSORS, procs, 60)
    for p in procs:
        p.join(10)
        assert p.exitcode == 0

    mem = AutoContextMemory.open(session_id, db_url, CONFIG, options=OPTIONS, create=False)
    events = mem.events()
    by_status = {s: [e for e in events if e.status == s] for s in ("applied", "conflict", "failed")}
    print(
        f"{WRITERS} writers x {BATCHES} appends, {COMPRESSORS} compressors: "
        f"{len(by_status['applied'])} applied, {len(by_status['conflict'])} conflicts, "
        f"{len(by_status['failed'])} failed"
    )
    # Each compressor's own count of what it recorded adds up to the audit table.
    for status, found in by_status.items():
        assert sum(o.get(status, 0) for o in outcomes) == len(found), status
    assert by_status["applied"], "nothing was ever compressed"
    assert by_status["conflict"], "the two compressors never raced on one range"

    # Nothing lost, nothing doubled, each writer's order kept.
    rows = sql(
        mem,
        "select id, metadata from messages where session_id = :s and kind = 'original' order by id",
        s=session_id,
    )
    assert [r.id for r in rows[: len(history)]] == [m.id for m in history]
    for w in range(WRITERS):
        mine = [r for r in rows if r.metadata.get("writer") == w]
        assert [r.metadata["seq"] for r in mine] == [s for s in range(BATCHES) for _ in range(2)]
        assert [r.id for r in mine] == [i for ids in written[w] for i in ids]
    assert len(rows) == len(history) + WRITERS * BATCHES * 2

    # A loser lost to a real winner: some earlier applied event took part of its range, or
    # (docs/design.md §4) the offload handle it was planned with.
    for c in by_status["conflict"]:
        assert c.error and "changed" in c.error
        winners = [
            a
            for a in by_status["applied"]
            if a.id < c.id
            and (set(a.replaced_ids) & set(c.replaced_ids) or "planned handle" in c.error)
        ]
        assert winners, f"conflict {c.id} overlaps no applied compression"
    # assert_consistent also checks that no message was replaced by two applied events.
    assert_consistent(mem)
    assert_every_original_reachable(mem)


# ---------------------------------------------------------------------------------------------
# Two sessions never block each other
# ---------------------------------------------------------------------------------------------

LOCK_TIMEOUT_MS = 2000


def _impatient(db_url: str) -> str:
    """The same database, but every statement gives up after LOCK_TIMEOUT_MS waiting for a
    lock: a memory on this URL raises instead of waiting behind another session's lock."""
    url = make_url(db_url).update_query_dict({"options": f"-c lock_timeout={LOCK_TIMEOUT_MS}"})
    return url.render_as_string(hide_password=False)


def _fill(db_url: str, sid: str, seed: int) -> None:
    mem = AutoContextMemory.open(sid, db_url, CONFIG, options=OPTIONS)
    mem.add(multi_round(seed, rounds=4, steps=8))
    assert mem.needs_compression()


def _hold_in_apply(db_url: str, sid: str, results: Any) -> None:
    """Child: compress session A and stop inside the apply transaction (row locked, rows
    written, not committed)."""
    try:
        mem = AutoContextMemory.open(sid, db_url, CONFIG, options=OPTIONS, create=False)
        Pauser("apply.before_commit").install(mem.engine)
        mem.compress_if_needed()
    except BaseException:
        results.put(("error", traceback.format_exc()))


@pytest.mark.parametrize("holder", ["paused_apply", "select_for_update"])
def test_a_locked_session_never_blocks_another(db_url: str, holder: str) -> None:
    a, b = f"lock-a-{uuid.uuid4().hex[:8]}", f"lock-b-{uuid.uuid4().hex[:8]}"
    _fill(db_url, a, 31)
    _fill(db_url, b, 32)
    engine = sa.create_engine(db_url, poolclass=sa.NullPool)
    results = CTX.SimpleQueue()
    proc = None
    holding = engine.connect()
    try:
        if holder == "paused_apply":
            proc = CTX.Process(target=_hold_in_apply, args=(db_url, a, results))
            proc.start()
            _wait_until_locked(engine, a, proc)
        else:
            holding.execute(
                sa.text("select version from sessions where session_id = :s for update"), {"s": a}
            )
        # A writer of A waits for the lock (and here gives up after the lock timeout)...
        mem_a = AutoContextMemory.open(a, _impatient(db_url), CONFIG, options=OPTIONS, create=False)
        with pytest.raises(Conflict, match="lock_timeout"):
            mem_a.add(Msg.user("this must wait for the lock on A"))
        # ...while B appends and compresses: on the impatient URL, any wait for a lock longer
        # than LOCK_TIMEOUT_MS would raise here, so passing means B never queued behind A.
        started = time.monotonic()
        mem_b = AutoContextMemory.open(b, _impatient(db_url), CONFIG, options=OPTIONS, create=False)
        mem_b.add(Msg.user("B is not blocked"))
        events = mem_b.compress_if_needed()
        print(f"session B appended and compressed in {time.monotonic() - started:.2f} s")
        assert any(e.status == "applied" for e in events)
        assert results.empty(), results.get()
    finally:
        if proc is not None:
            proc.kill()
            proc.join()
        holding.rollback()
        holding.close()
        engine.dispose()
        AutoContextClient.close_shared(db_url)  # reopened through a new client
    mem_a = AutoContextMemory.open(a, db_url, CONFIG, options=OPTIONS, create=False)
    assert_consistent(mem_a)
    assert_consistent(AutoContextMemory.open(b, db_url, CONFIG, options=OPTIONS, create=False))


def _wait_until_locked(engine: sa.Engine, sid: str, proc: Any) -> None:
    """Until a backend other than ours holds a row lock on session `sid`'s row."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.is_alive(), "the lock holder died"
        with engine.connect() as conn:
            conn.execute(sa.text("set lock_timeout = 50"))
            try:
                conn.execute(
                    sa.text("select 1 from sessions where session_id = :s for update nowait"),
                    {"s": sid},
                )
            except sa.exc.OperationalError:
                return
            finally:
                conn.rollback()
        time.sleep(0.05)
    raise AssertionError("session A was never locked")
