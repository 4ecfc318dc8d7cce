"""Crash safety (docs/design.md §5): a real child process killed with SIGKILL at random instants
and inside each phase of tests/pauses.py loses nothing and leaves no half-written compression.

The harness lives in tests/crash_child.py (bench/soak.py runs the same one with a thousand kills).
After every kill the session is opened with a fresh engine and checked: every acknowledged
message present exactly once, in order, with its content; the working context valid; totals
equal to a recount; every offload and lineage row part of an applied event; no event half
written. Then the next child continues the same session.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from autoctx import AutoContextClient
from tests.crash_child import (
    CONFIG,
    KILL_PHASES,
    RANDOM,
    KillStats,
    Workload,
    prefill,
    run_kills,
)
from tests.openai_server import OpenAIServer, Reply
from tests.pauses import PHASES

#: Two rounds of work before the first kill: the session starts near its trigger.
PREFILL_STEPS = 14
#: Kills per phase in CI: 5 phases x 4 + 6 random, and 6 more in the mixed test: 32 kills
#: (bench/soak.py runs the same harness with a thousand).
KILLS = {**{p: 4 for p in PHASES}, RANDOM: 6}


@pytest.fixture(scope="module")
def slow_llm() -> Iterator[OpenAIServer]:
    """A local OpenAI-compatible server that answers every summary request after 20-150 ms,
    so that random kills often land while a summary is in flight."""
    rng = random.Random(7)

    def answer(body: object) -> Reply:
        return Reply.slow(rng.uniform(0.02, 0.15))

    with OpenAIServer(default=answer) as srv:
        yield srv


def _workload(db_url: str, base_url: str, tmp_path: Path, seed: int) -> Workload:
    sid = f"crash-{uuid.uuid4().hex[:10]}"
    work = Workload(db_url, sid, tmp_path / f"{sid}.acks", base_url, seed)
    prefill(work, PREFILL_STEPS)
    return work


@pytest.mark.parametrize("phase", KILL_PHASES)
def test_kills_in_phase_lose_nothing(
    phase: str, db_url: str, slow_llm: OpenAIServer, tmp_path: Path
) -> None:
    work = _workload(db_url, slow_llm.base_url, tmp_path, seed=KILL_PHASES.index(phase))
    stats = run_kills(work, [phase] * KILLS[phase], seed=11)
    print(f"{phase}: {stats.line()}")
    assert stats.kills[phase] == KILLS[phase]
    assert stats.acked > 0, "the children never got an add() through"


def test_mixed_kills_on_one_session_keep_compressing(
    db_url: str, client: AutoContextClient, slow_llm: OpenAIServer, tmp_path: Path
) -> None:
    """Kills of every kind in turn on one session: it keeps working (compressions commit between
    kills) and every check holds after each kill."""
    work = _workload(db_url, slow_llm.base_url, tmp_path, seed=99)
    phases = list(KILL_PHASES)
    stats: KillStats = run_kills(work, phases, seed=5)
    print(f"mixed: {stats.line()}")
    mem = client.open(work.session_id, CONFIG, create=False)
    applied = [e for e in mem.events() if e.status == "applied"]
    assert applied, "no compression ever committed between the kills"
