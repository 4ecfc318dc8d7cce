"""Crash soak: the harness of tests/test_crash.py with a thousand kills (issue 5).

    python bench/soak.py                                   # 1000 kills, embedded PostgreSQL
    python bench/soak.py --kills 200 --database-url postgresql://postgres@127.0.0.1:5432/postgres

A forked child runs a realistic agent loop (tool rounds with large outputs, compression with an
OpenAI-compatible summarizer on a local server that answers in 20-300 ms) and is killed with
SIGKILL, in turn inside each phase of tests/pauses.py and at random instants. After every
kill the session is reopened with a fresh engine and checked: every acknowledged message present
once, in order, with its content; the working context valid; totals equal to a recount; every
offload and lineage row part of an applied event; no event half written. The next child
continues the same session; a new session starts every --kills-per-session kills so that the
checks stay cheap. Prints the counts per phase; exits non-zero on the first violation.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.crash_child

from _common import add_database_argument, fresh_database, machine_description

from tests.crash_child import (
    KILL_PHASES,
    KillStats,
    Workload,
    prefill,
    run_kills,
)
from tests.openai_server import OpenAIServer, Reply


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_database_argument(parser)
    parser.add_argument("--kills", type=int, default=1000, help="total kills (default 1000)")
    parser.add_argument(
        "--kills-per-session", type=int, default=40, help="kills before a new session"
    )
    parser.add_argument(
        "--seed", type=int, default=None, help="random seed (default: random, printed)"
    )
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(10**6)
    rng = random.Random(seed)
    llm_rng = random.Random(seed + 1)

    def answer(body: object) -> Reply:
        return Reply.slow(llm_rng.uniform(0.02, 0.3))

    stats = KillStats()
    started = time.monotonic()
    with (
        fresh_database(args.database_url, "autoctx_soak") as db,
        OpenAIServer(default=answer) as server,
        tempfile.TemporaryDirectory(prefix="autoctx-soak-") as tmp,
    ):
        print(f"crash soak: {args.kills} kills, seed {seed}; {machine_description(db)}")
        url = db.url.render_as_string(hide_password=False)
        session = 0
        while stats.total_kills < args.kills:
            n = min(args.kills_per_session, args.kills - stats.total_kills)
            sid = f"soak-{session}-{uuid.uuid4().hex[:6]}"
            work = Workload(url, sid, Path(tmp) / f"{sid}.acks", server.base_url, seed + session)
            prefill(work, 14)
            phases = [KILL_PHASES[(stats.total_kills + k) % len(KILL_PHASES)] for k in range(n)]
            rng.shuffle(phases)
            run_kills(work, phases, seed=rng.randrange(10**9), stats=stats)
            session += 1
            print(f"  {time.monotonic() - started:7.1f} s  {stats.line()}", flush=True)
    print(f"done in {time.monotonic() - started:.0f} s, {session} sessions: {stats.line()}")
    print("every check held after every kill")
    return 0


if __name__ == "__main__":
    sys.exit(main())
