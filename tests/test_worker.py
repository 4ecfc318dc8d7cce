"""`autoctx worker`: processes that compress the due sessions of a database, sharing the work
through claims (advisory locks), so that no session is ever compressed by two at once; and
agents opened with ``background="worker"`` that leave compression to them.

Real worker processes (the CLI), real PostgreSQL, and the local OpenAI-protocol server, which
watches which session each summarizer request belongs to (every tool output of session k
carries the marker ``session=k``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from autoctx import (
    AutoContextConfig,
    AutoContextMemory,
    Msg,
    OfflineSummarizer,
    OpenAISummarizer,
    RuntimeOptions,
    ToolUseBlock,
)
from autoctx._store.claims import SessionClaim, due_sessions
from autoctx._worker import AutoContextWorker, Compressed
from tests.histories import SMALL, file_dump
from tests.invariants import assert_consistent
from tests.openai_server import OpenAIServer, Reply

CONFIG = SMALL
#: One summarizer call at a time per compression: two requests of one session in flight at
#: once can then only mean two compressors on it.
OPTIONS = RuntimeOptions(summarizer_concurrency=1)
ONE_CALL_AT_A_TIME = ("--summarizer-concurrency", "1")
#: How long a worker process may take to start and reach the summarizer: it imports autoctx
#: and connects first, which took over 20 s while the suite ran on four workers of a busy
#: two-core machine. Only a bound on waiting: no assertion is about this time.
PATIENCE = 60.0
MARKER = re.compile(r"session=(\w+)")


class Watch:
    """A summarizer endpoint that holds each answer `hold_s` seconds and records, per session
    marker, the requests in flight; the first two requests wait for each other (so that two
    compressors are provably at work at the same time)."""

    def __init__(self, hold_s: float, rendezvous: int = 2) -> None:
        self.hold_s = hold_s
        self._lock = threading.Lock()
        self._meet = threading.Barrier(rendezvous, timeout=PATIENCE) if rendezvous > 1 else None
        self._first = iter(range(rendezvous))
        self.in_flight: Counter[str] = Counter()
        self.overlaps: list[str] = []
        self.asked: Counter[str] = Counter()
        self.met = False
        self.arrived = threading.Event()

    def __call__(self, body: dict[str, Any]) -> Reply:
        text = " ".join(str(m.get("content")) for m in body.get("messages") or [])
        found = MARKER.search(text)
        key = found.group(1) if found else "?"
        with self._lock:
            self.asked[key] += 1
            self.in_flight[key] += 1
            if self.in_flight[key] > 1:
                self.overlaps.append(key)
            meet = self._meet is not None and next(self._first, None) is not None
        self.arrived.set()
        try:
            if meet and self._meet is not None:
                with contextlib.suppress(threading.BrokenBarrierError):
                    self._meet.wait()
                    self.met = True
            time.sleep(self.hold_s)
        finally:
            with self._lock:
                self.in_flight[key] -= 1
        return Reply.text()


@pytest.fixture(scope="module")
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer() as srv:
        yield srv


def _task(tag: str, steps: int = 30) -> list[Msg]:
    rng = random.Random(tag)
    msgs = [Msg.system("You are a coding agent."), Msg.user("Check every module.")]
    for s in range(steps):
        call = ToolUseBlock(f"t{s}", "read_file", f'{{"path": "src/{s}.py"}}')
        body = f"session={tag}\n" + file_dump(rng, 20)
        msgs += [Msg.assistant(None, [call]), Msg.tool(call.id, body)]
    return msgs


def _due(open_memory: Callable[..., AutoContextMemory], prefix: str, n: int) -> list[str]:
    """`n` sessions over their (count) trigger, nothing compressed yet."""
    sids = []
    for k in range(n):
        tag = f"{prefix}{k}"
        mem = open_memory(f"{prefix}-{k}", config=CONFIG, summarizer=OfflineSummarizer())
        mem.add(_task(tag))
        assert mem.needs_compression()
        sids.append(mem.session_id)
        mem.close()
    return sids


#: The worker processes the running test started.
_STARTED: list[subprocess.Popen[str]] = []


@pytest.fixture(autouse=True)
def _no_worker_outlives_its_test() -> Iterator[None]:
    """Kill what a test's workers left running, whatever its outcome: a worker left behind by a
    failed test would claim and compress the next tests' sessions and fail them too."""
    yield
    while _STARTED:
        proc = _STARTED.pop()
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def _worker(db_url: str, server: OpenAIServer, *args: str) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "OPENAI_BASE_URL": server.base_url,
        "OPENAI_API_KEY": "test",
        "AUTOCTX_SUMMARY_MODEL": "worker-model",
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "autoctx._cli",
            "worker",
            *ONE_CALL_AT_A_TIME,
            "--database-url",
            db_url,
            *args,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _STARTED.append(proc)
    return proc


def _statuses(mem: AutoContextMemory) -> Counter[str]:
    return Counter(e.status for e in mem.events())


def test_two_worker_processes_share_the_sessions_and_never_compress_one_twice_at_once(
    db_url: str, open_memory: Callable[..., AutoContextMemory], server: OpenAIServer
) -> None:
    watch = Watch(hold_s=0.1)
    server.reset()
    server.set_default(watch)
    sids = _due(open_memory, "share", 8)
    # One thread each: the first request waits at the rendezvous until the second arrives, which
    # then can only come from the other process (a process of two threads could meet itself,
    # and finish every session before a slow-starting other process asks for one).
    workers = [_worker(db_url, server, "--once", "--threads", "1") for _ in range(2)]
    outputs = [w.communicate(timeout=120) for w in workers]
    for w, (_out, err) in zip(workers, outputs, strict=True):
        assert w.returncode == 0, err
    assert watch.met, "the two workers were never at work at the same time"
    assert watch.overlaps == [], f"sessions compressed twice at once: {watch.overlaps}"
    done = [re.findall(r"^compressed (\S+):", out, re.M) for out, _ in outputs]
    assert all(done), f"each process compressed something: {done}"
    assert Counter(s for d in done for s in d) == Counter(sids), "each session once, in all"
    for sid in sids:
        mem = open_memory(sid, summarizer=OfflineSummarizer())
        statuses = _statuses(mem)
        assert statuses["applied"] >= 1 and statuses["conflict"] == 0, (sid, statuses)
        assert not mem.needs_compression()
        assert {e.model for e in mem.events() if e.status == "applied"} == {"worker-model"}
        assert_consistent(mem)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_a_worker_cleanly_mid_compression(
    signum: int,
    db_url: str,
    open_memory: Callable[..., AutoContextMemory],
    server: OpenAIServer,
) -> None:
    # The answer is held 12 s and the worker must be gone within 8 s of the signal: waiting for
    # the answer would take about 12 s, while a clean stop (0.3 s of grace, then closing) took
    # up to 3.1 s on a busy two-core machine running the suite on four workers.
    watch = Watch(hold_s=12.0, rendezvous=1)
    server.reset()
    server.set_default(watch)
    (sid,) = _due(open_memory, f"sig{signum}", 1)
    worker = _worker(db_url, server, "--grace", "0.3", "--poll", "0.05")
    assert watch.arrived.wait(PATIENCE), "the worker never asked the summarizer"
    started = time.monotonic()
    worker.send_signal(signum)
    _out, err = worker.communicate(timeout=PATIENCE)
    assert worker.returncode == 0, err
    assert time.monotonic() - started < 8.0, "it did not wait for the answer in flight"
    assert "stopped after 0 compression(s)" in err
    mem = open_memory(sid, summarizer=OfflineSummarizer())
    assert _statuses(mem)["applied"] == 0, "nothing was applied after the signal"
    assert_consistent(mem)
    assert mem.needs_compression(), "the session is still due, for the next worker"


# ---------------------------------------------------------------------------------------------
# Claims, and agents that leave compression to the workers
# ---------------------------------------------------------------------------------------------


def test_a_claimed_session_is_not_due_for_another_worker(
    open_memory: Callable[..., AutoContextMemory],
) -> None:
    (sid,) = _due(open_memory, "claim", 1)
    mem = open_memory(sid)
    due = [d.session_id for d in due_sessions(mem.engine, limit=100)]
    assert sid in due
    claim = SessionClaim(mem.engine, sid)
    assert claim.acquire()
    try:
        assert not SessionClaim(mem.engine, sid).acquire(), "a claim is held by one at a time"
        assert sid not in [d.session_id for d in due_sessions(mem.engine, limit=100)]
    finally:
        claim.release()
    assert sid in [d.session_id for d in due_sessions(mem.engine, limit=100)]
    assert SessionClaim(mem.engine, sid).acquire(), "released, it can be claimed again"


def test_an_agent_in_worker_mode_leaves_the_trigger_to_the_worker_and_waits_at_the_window(
    db_url: str, open_memory: Callable[..., AutoContextMemory], server: OpenAIServer
) -> None:
    watch = Watch(hold_s=0.5, rendezvous=1)
    server.reset()
    server.set_default(watch)
    summarizer = OpenAISummarizer(base_url=server.base_url, api_key="test", max_retries=0)
    # A tenant of its own: the worker takes this test's session only.
    agent = open_memory(
        config=CONFIG,
        options=OPTIONS,
        summarizer=summarizer,
        background="worker",
        tenant="worker-mode",
    )
    agent.add(_task("agent"))
    assert agent.needs_compression()
    assert agent.compress_if_needed() == [] and sum(watch.asked.values()) == 0, "no compression"

    compressed: list[Compressed] = []
    worker = AutoContextWorker(
        db_url,
        summarizer=summarizer,
        poll_s=0.05,
        tenant="worker-mode",
        on_compressed=compressed.append,
        options=OPTIONS,
    )
    running = threading.Thread(target=worker.run, daemon=True)
    running.start()
    try:
        assert watch.arrived.wait(PATIENCE)
        # The worker holds the session; the agent goes over the window meanwhile.
        rng = random.Random(3)
        k = 0
        while agent.token_count() < CONFIG.max_tokens:
            call = ToolUseBlock(f"big{k}", "read_file", '{"path": "big.py"}')
            agent.add([Msg.assistant(None, [call]), Msg.tool(call.id, file_dump(rng, 150))])
            k += 1
        context = agent.messages()  # waits for the worker's claim, then compresses the rest
        assert sum(m.tokens or 0 for m in context) < CONFIG.max_tokens
    finally:
        worker.stop()
        running.join(PATIENCE)
        worker.close()
    assert [c.session_id for c in compressed][:1] == [agent.session_id]
    assert _statuses(agent)["conflict"] == 0, "the agent waited instead of racing the worker"
    assert_consistent(agent)


def test_a_worker_names_its_summarizer_once_not_once_per_session(
    db_url: str,
    open_memory: Callable[..., AutoContextMemory],
    session_id: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The worker opens a memory per session it compresses; the line naming the summarizer is
    the worker's, at INFO once, and each of those memories says it at DEBUG only."""
    tenant = "worker-log"  # the worker takes this test's sessions only
    sids = []
    for k in range(3):
        mem = open_memory(
            f"{session_id}-{k}", config=CONFIG, summarizer=OfflineSummarizer(), tenant=tenant
        )
        mem.add(_task(f"log{k}"))
        assert mem.needs_compression()
        sids.append(mem.session_id)
        mem.close()
    caplog.clear()
    caplog.set_level(logging.DEBUG, logger="autoctx")
    compressed: list[Compressed] = []
    with AutoContextWorker(
        db_url, summarizer=OfflineSummarizer(), tenant=tenant, on_compressed=compressed.append
    ) as worker:
        assert worker.run(once=True) == len(compressed)
    assert {c.session_id for c in compressed} == set(sids)
    named = [r for r in caplog.records if "summaries by" in r.getMessage()]
    (line,) = [r.getMessage() for r in named if r.levelno >= logging.INFO]
    assert line.startswith("autoctx worker: ")
    quiet = {r.getMessage() for r in named if r.levelno == logging.DEBUG}
    assert quiet == {f"autoctx: session {sid!r}: {line.split(': ', 1)[1]}" for sid in sids}


def _waiting_vectors(db_url: str, session_id: str) -> int:
    engine = sa.create_engine(db_url, poolclass=sa.NullPool)
    with engine.connect() as conn:
        found = conn.execute(
            sa.text(
                "SELECT count(*) FROM messages WHERE session_id = :s AND kind = 'original' "
                "AND search_tsv IS NULL"
            ),
            {"s": session_id},
        ).scalar_one()
    engine.dispose()
    return int(found)


def test_the_worker_fills_the_search_vectors_the_appends_left(db_url: str) -> None:
    """The append path computes no search vector (migration 0013); a worker with nothing due
    fills them, a batch per transaction, so searches (the read-only console's included) read
    the index instead of computing them per query (issue 33)."""
    tenant = f"vectors-{random.randrange(10**9)}"  # apart from the other tests' sessions
    mem = AutoContextMemory.open(
        f"w-vectors-{random.randrange(10**9)}",
        db_url,
        AutoContextConfig(max_tokens=1_000_000, msg_threshold=100_000),
        summarizer=OfflineSummarizer(),
        tenant=tenant,
    )
    mem.add([Msg.user(f"the deploy of build {k} failed") for k in range(2_500)])
    assert _waiting_vectors(db_url, mem.session_id) == 2_500
    with AutoContextWorker(db_url, summarizer=OfflineSummarizer(), tenant=tenant) as worker:
        assert worker.run(once=True) == 0  # nothing was due: it only filled vectors
    assert _waiting_vectors(db_url, mem.session_id) == 0
    mem.add([Msg.user("one more build 2500")])
    assert _waiting_vectors(db_url, mem.session_id) == 1  # an append still leaves its own
    hits = mem.search("build 1234")
    assert [h.message_id for h in hits][:1] == [1235]  # ids start at 1


def test_the_worker_leaves_a_session_between_the_mask_and_the_token_trigger_alone(
    db_url: str,
) -> None:
    """Early masking runs inside `compress_if_needed()` and background mode only; the worker
    compresses at the trigger (docs/design.md §2 and §3, "early masking"): a session over
    `mask_ratio` but under the token trigger is not due, and a worker run writes nothing to it.
    The same session, asked by its own memory, masks alone."""
    tenant = f"early-{random.randrange(10**9)}"  # apart from the other tests' sessions
    config = AutoContextConfig(max_tokens=8_000, msg_threshold=None, mask_min_chars=200)
    mem = AutoContextMemory.open(
        f"w-early-{random.randrange(10**9)}",
        db_url,
        config,
        summarizer=OfflineSummarizer(),
        tenant=tenant,
    )
    mem.add(_task("early", steps=12))
    tokens = mem.token_count()
    assert config.mask_ratio is not None
    assert config.max_tokens * config.mask_ratio <= tokens < config.token_trigger
    assert not mem.needs_compression()
    assert mem.session_id not in [d.session_id for d in due_sessions(mem.engine, limit=1000)]
    before = (mem.refresh().version, len(mem.events()))
    with AutoContextWorker(db_url, summarizer=OfflineSummarizer(), tenant=tenant) as worker:
        assert worker.run(once=True) == 0
    assert (mem.refresh().version, len(mem.events())) == before
    # Its own memory masks it, alone and in one event: what the worker left is still to do.
    assert [(e.strategy, e.status) for e in mem.compress_if_needed()] == [(8, "applied")]
    assert mem.token_count() < tokens
    mem.close()
