"""The crash harness shared by tests/test_crash.py and bench/soak.py.

A forked child runs a realistic agent loop on one session: it appends tool rounds with large
outputs, one `add()` per unit (a user message, a tool group, or a final answer), writes an
acknowledgement line (fsynced) after each `add()` returns, and calls `compress_if_needed()` with
an `OpenAISummarizer` pointed at a local server that answers slowly. The parent kills it with
SIGKILL, either at a random instant or when it reports that it reached a phase (tests/pauses.py:
event listeners on the child's engine and a pausing summarizer, nothing inside autoctx), then
opens the session with a fresh engine and checks that nothing was lost or half written
(`check_after_kill`). The next child continues the same session.

The child is forked from a warm parent (autoctx, SQLAlchemy, openai and tiktoken already
imported), so a kill costs a fraction of a second instead of a Python start-up.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import select
import signal
import sys
import time
import traceback
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai  # noqa: F401  (imported here so that forked children start warm)
import sqlalchemy as sa

from autoctx import (
    AutoContextClient,
    AutoContextConfig,
    AutoContextMemory,
    Msg,
    OpenAISummarizer,
    RuntimeOptions,
    ToolUseBlock,
)
from autoctx._store.rows import msg_from_row
from tests.dbsql import sql
from tests.invariants import (
    assert_consistent,
    assert_every_original_reachable,
)
from tests.pauses import PHASES as PAUSE_PHASES
from tests.pauses import Pauser

RANDOM = "random"
#: Where a child can be killed: each phase of tests/pauses.py, and anywhere at all.
KILL_PHASES: tuple[str, ...] = (*PAUSE_PHASES, RANDOM)

#: Small thresholds, so that a few units of work push the session over its trigger and every
#: strategy of the ladder gets its turn within a handful of steps.
CONFIG = AutoContextConfig(
    max_tokens=8_000,
    msg_threshold=40,
    last_keep=8,
    min_tool_run=3,
    min_compress_tokens=300,
    large_payload_chars=1500,
    preview_chars=80,
    reload_page_chars=1000,
)
OPTIONS = RuntimeOptions(max_passes=2, max_llm_calls=3)
#: Units per round: a user message, tool groups, a final answer.
ROUND_UNITS = 7
_TOOLS = ("read_file", "run_shell", "grep", "http_get")
_WORDS = (
    "request",
    "config",
    "service",
    "cache",
    "worker",
    "retry",
    "index",
    "module",
    "handler",
    "queue",
    "build",
    "deploy",
)


# ---------------------------------------------------------------------------------------------
# The workload: deterministic per (seed, step), so a new child picks up where the last stopped
# ---------------------------------------------------------------------------------------------


def _meta(step: int, k: int) -> dict[str, Any]:
    return {"crash": {"step": step, "k": k}}


def _output(rng: random.Random, chars: int) -> str:
    lines: list[str] = []
    total = 0
    while total < chars:
        line = (
            f"{rng.randrange(10_000):5d} {rng.choice(_WORDS)}.{rng.choice(_WORDS)}"
            f"(id={rng.randrange(16**8):08x}) -> {rng.randrange(1000)} ms"
        )
        lines.append(line)
        total += len(line) + 1
    return "\n".join(lines)[:chars]


def unit(seed: int, step: int) -> list[Msg]:
    """The messages of step `step`: one `add()` call, always a complete shape (no open calls
    left behind, so that a kill between two steps never leaves the session mid-group)."""
    rng = random.Random(f"{seed}:{step}")
    position = step % ROUND_UNITS
    task = step // ROUND_UNITS
    if position == 0:
        return [Msg.user(f"Task {task}: fix module {rng.choice(_WORDS)}", metadata=_meta(step, 0))]
    if position == ROUND_UNITS - 1:
        return [
            Msg.assistant(
                f"Task {task} done: patched src/{rng.choice(_WORDS)}.py, tests pass.",
                metadata=_meta(step, 0),
            )
        ]
    width = 2 if rng.random() < 0.25 else 1
    calls = [
        ToolUseBlock(
            f"call_{step}_{j}",
            rng.choice(_TOOLS),
            json.dumps({"path": f"src/{rng.choice(_WORDS)}/{rng.randrange(99)}.py"}),
        )
        for j in range(width)
    ]
    out = [Msg.assistant(None, calls, metadata=_meta(step, 0))]
    for j, call in enumerate(calls, start=1):
        size = rng.choice((150, 400, 900, 2000, 4000))
        out.append(Msg.tool(call.id, _output(rng, size), metadata=_meta(step, j)))
    return out


def digest(msg: Msg) -> str:
    """A fingerprint of what was stored (content and role), to compare acks with the rows."""
    data = json.dumps([msg.role, msg.content_json()], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(data.encode()).hexdigest()[:24]


@dataclass(frozen=True, slots=True)
class Workload:
    db_url: str
    session_id: str
    ack_path: Path
    base_url: str
    seed: int


def _summarizer(work: Workload, generation: int) -> OpenAISummarizer:
    # Half the children stream, so that kills also land inside a streamed answer.
    return OpenAISummarizer(
        base_url=work.base_url,
        api_key="test",
        model="crash-model",
        timeout=10,
        max_retries=0,
        stream=generation % 2 == 1,
    )


def next_step(mem: AutoContextMemory) -> int:
    """The first step not yet stored (each step is one atomic `add()`)."""
    rows = sql(
        mem,
        "select metadata from messages where session_id = :s and kind = 'original' "
        "order by id desc limit 1",
        s=mem.session_id,
    )
    return 0 if not rows else int(rows[0].metadata["crash"]["step"]) + 1


def prefill(work: Workload, steps: int) -> None:
    """Append the first `steps` steps in this process (acknowledged like the child's), so that
    the first child already works on a session near its trigger instead of building one up."""
    with AutoContextClient(work.db_url) as client:
        mem = client.open(work.session_id, CONFIG, options=OPTIONS)
        with work.ack_path.open("a") as acks:
            for step in range(next_step(mem), steps):
                stored = mem.add(unit(work.seed, step))
                acks.write(_ack_line(step, stored))


def _ack_line(step: int, stored: Sequence[Msg]) -> str:
    row = {"step": step, "ids": [m.id for m in stored], "digests": [digest(m) for m in stored]}
    return json.dumps(row) + "\n"


def child_main(work: Workload, generation: int, pause_at: str | None, pause_after: int) -> None:
    """The child's loop; runs until killed. `pause_at` is armed after `pause_after` steps, so
    pauses land at different places in the session's life."""
    pauser = Pauser()
    # A client of the child's own: the parent's pooled connections are not its to use.
    mem = AutoContextClient(work.db_url).open(
        work.session_id,
        CONFIG,
        options=OPTIONS,
        summarizer=pauser.summarizer(_summarizer(work, generation)),
    )
    pauser.install(mem.engine)
    step = next_step(mem)
    fd = os.open(work.ack_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    for done in range(100_000):
        if pause_at is not None and done == pause_after:
            pauser.arm(pause_at)
        stored = mem.add(unit(work.seed, step))
        os.write(fd, _ack_line(step, stored).encode())
        os.fsync(fd)
        mem.compress_if_needed()
        step += 1


# ---------------------------------------------------------------------------------------------
# Checks after a kill
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ack:
    step: int
    ids: tuple[int, ...]
    digests: tuple[str, ...]


def read_acks(path: Path) -> list[Ack]:
    """Complete acknowledgement lines; a line cut by the kill is dropped from the file too, so
    that the next child appends after a clean line end."""
    if not path.exists():
        return []
    data = path.read_bytes()
    cut = data.rfind(b"\n") + 1
    if cut != len(data):
        with path.open("r+b") as f:
            f.truncate(cut)
    acks = []
    for line in data[:cut].decode().splitlines():
        row = json.loads(line)
        acks.append(Ack(row["step"], tuple(row["ids"]), tuple(row["digests"])))
    return acks


def check_after_kill(work: Workload, kills: int) -> tuple[int, int]:
    """Open the session in this process with a fresh engine and check it; returns (steps
    stored, acknowledged steps). Every acknowledged message is present exactly once, in order,
    with the content acknowledged; at most one step per kill was committed without its ack."""
    with AutoContextClient(work.db_url) as client:  # a fresh pool, closed at the end
        return _check_after_kill(work, kills, client)


def _check_after_kill(work: Workload, kills: int, client: AutoContextClient) -> tuple[int, int]:
    acks = read_acks(work.ack_path)
    mem = client.open(work.session_id, CONFIG, options=OPTIONS, create=not acks)
    rows = sql(
        mem,
        "select id, role, name, content, metadata, kind, pinned, tokens from messages "
        "where session_id = :s and kind = 'original' order by id",
        s=work.session_id,
    )
    by_step: dict[int, list[Msg]] = {}
    order: list[tuple[int, int]] = []
    for r in rows:
        m = msg_from_row(r)
        key = (int(m.metadata["crash"]["step"]), int(m.metadata["crash"]["k"]))
        order.append(key)
        by_step.setdefault(key[0], []).append(m)
    assert order == sorted(order) and len(set(order)) == len(order), (
        "originals out of order or doubled"
    )
    steps = sorted(by_step)
    assert steps == list(range(len(steps))), (
        f"steps missing: {sorted(set(range(len(steps))) - set(steps))}"
    )
    for s, msgs in by_step.items():
        expected = unit(work.seed, s)
        assert [m.metadata["crash"]["k"] for m in msgs] == list(range(len(expected))), (
            f"step {s} half stored"
        )
    acked_steps = [a.step for a in acks]
    assert len(set(acked_steps)) == len(acked_steps), "a step was acknowledged twice"
    for a in acks:
        stored = by_step.get(a.step)
        assert stored is not None, f"acknowledged step {a.step} is lost"
        assert tuple(m.id for m in stored) == a.ids, f"step {a.step}: ids differ from the ack"
        assert tuple(digest(m) for m in stored) == a.digests, f"step {a.step}: content differs"
    unacked = set(steps) - set(acked_steps)
    assert len(unacked) <= kills, f"{len(unacked)} steps stored without an ack after {kills} kills"
    assert_consistent(mem)
    assert_every_original_reachable(mem)
    return len(steps), len(acks)


# ---------------------------------------------------------------------------------------------
# Fork, wait, kill
# ---------------------------------------------------------------------------------------------


def _state(work: Workload) -> tuple[Any, ...]:
    """What a reader outside the child's transaction sees of the session (for pause kills)."""
    engine = sa.create_engine(work.db_url, poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            row = conn.execute(
                sa.text(
                    "select version, message_count, token_count, "
                    "(select count(*) from messages m where m.session_id = s.session_id), "
                    "(select count(*) from compression_events e "
                    " where e.session_id = s.session_id), "
                    "(select array_agg(message_id order by position) from working_set w "
                    " where w.session_id = s.session_id) "
                    "from sessions s where s.session_id = :s"
                ),
                {"s": work.session_id},
            ).one_or_none()
    finally:
        engine.dispose()
    return tuple(row) if row is not None else ()


#: The phases inside a transaction that holds the session row lock (the others hold none: the
#: summarizer call in particular, docs/design.md §5).
LOCKED_PHASES = frozenset({"append.before_commit", "apply.after_lock", "apply.before_commit"})


def _row_locked(work: Workload) -> bool:
    """Whether another transaction holds the lock on the session row (checked without waiting),
    so that a pause is known to be inside the transaction it names, or outside any."""
    engine = sa.create_engine(work.db_url, poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            try:
                conn.execute(
                    sa.text("select 1 from sessions where session_id = :s for update nowait"),
                    {"s": work.session_id},
                )
            except sa.exc.OperationalError:
                return True
            finally:
                conn.rollback()
    finally:
        engine.dispose()
    return False


@dataclass
class KillStats:
    """Counts per phase: kills, and steps committed so far."""

    kills: Counter[str] = field(default_factory=Counter)
    #: Wall time from fork to kill, per phase.
    kill_seconds: dict[str, float] = field(default_factory=dict)
    steps: int = 0
    acked: int = 0
    total_kills: int = 0
    steps_of: dict[str, int] = field(default_factory=dict)
    acked_of: dict[str, int] = field(default_factory=dict)

    def line(self) -> str:
        per = ", ".join(
            f"{p}: {self.kills[p]} ({self.kill_seconds.get(p, 0.0):.1f} s)"
            for p in KILL_PHASES
            if self.kills[p]
        )
        return f"{self.total_kills} kills ({per}); {self.steps} steps stored, {self.acked} acked"


class ChildFailed(AssertionError):
    pass


def _read_until(fd: int, pid: int, needle: bytes | None, seconds: float, buf: bytearray) -> bool:
    """Read the child's stderr until `needle` appears, the time is up, or the child exits.
    True when the needle was seen (with needle None: when the time ran out with the child
    alive)."""
    deadline = time.monotonic() + seconds
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return needle is None
        ready, _, _ = select.select([fd], [], [], min(left, 0.05))
        if ready:
            chunk = os.read(fd, 65536)
            if not chunk:  # the child closed stderr: it exited
                return False
            buf.extend(chunk)
            if needle is not None and needle in buf:
                return True
        exited, _ = os.waitpid(pid, os.WNOHANG)
        if exited:
            return False


def fork_child(
    work: Workload, generation: int, pause_at: str | None, pause_after: int
) -> tuple[int, int]:
    """Fork the loop; returns (pid, read end of its stderr)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the parent's code (pytest, the soak)
        code = 0
        try:
            os.close(read_end)
            os.dup2(write_end, 2)
            sys.stderr = os.fdopen(2, "w", buffering=1)
            child_main(work, generation, pause_at, pause_after)
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            with contextlib.suppress(BaseException):
                sys.stderr.flush()
            os._exit(code)
    os.close(write_end)
    return pid, read_end


def kill_once(
    work: Workload,
    phase: str,
    rng: random.Random,
    generation: int,
    *,
    pause_timeout: float = 30.0,
) -> None:
    """Run one child and kill it in `phase`; raises `ChildFailed` if it died on its own or
    never reached the phase. For a paused phase, also checks that the pause is where it says
    (the session row locked inside a transaction, free outside one) and that nothing of the
    paused transaction is visible: the state seen while it is paused is the state after the
    kill."""
    # Nothing pooled is shared with the child: it opens a client of its own.
    pause_at = None if phase == RANDOM else phase
    # A process's first append locks the session row and writes in a transaction; later ones
    # are one autocommit statement, with no window between writing and committing.
    pause_after = 0 if phase == "append.before_commit" else rng.randrange(0, 2)
    pid, fd = fork_child(work, generation, pause_at, pause_after)
    stderr = bytearray()
    try:
        if pause_at is None:
            alive = _read_until(fd, pid, None, rng.uniform(0.05, 1.2), stderr)
            if not alive:
                raise ChildFailed(
                    f"the child exited before the kill:\n{stderr.decode(errors='replace')}"
                )
            before = None
        else:
            seen = _read_until(fd, pid, f"PAUSED {pause_at}".encode(), pause_timeout, stderr)
            if not seen:
                raise ChildFailed(
                    f"the child never reached {pause_at}:\n{stderr.decode(errors='replace')}"
                )
            before = _state(work)
            locked = _row_locked(work)
            assert locked == (pause_at in LOCKED_PHASES), (
                f"paused at {pause_at}, the session row is {'' if locked else 'not '}locked"
            )
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(fd)
    if before is not None and before:
        assert _state(work) == before, "a killed transaction left something behind"


def run_kills(
    work: Workload, phases: Sequence[str], seed: int, stats: KillStats | None = None
) -> KillStats:
    """Kill a child once per entry of `phases` (in that order) on the session of `work`,
    checking the session after each kill."""
    rng = random.Random(seed)
    stats = stats or KillStats()
    for generation, phase in enumerate(phases):
        started = time.monotonic()
        kill_once(work, phase, rng, generation)
        elapsed = time.monotonic() - started
        stats.kill_seconds[phase] = stats.kill_seconds.get(phase, 0.0) + elapsed
        stats.kills[phase] += 1
        stats.total_kills += 1
        steps, acked = check_after_kill(work, kills=generation + 1)
        stats.steps += steps - stats.steps_of.get(work.session_id, 0)
        stats.acked += acked - stats.acked_of.get(work.session_id, 0)
        stats.steps_of[work.session_id], stats.acked_of[work.session_id] = steps, acked
    return stats
