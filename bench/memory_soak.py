"""Memory of a long-lived process: many sessions, then one long one (issue 33, item 1).

    python bench/memory_soak.py --database-url postgresql://postgres@127.0.0.1:5432/postgres
    python bench/memory_soak.py --sessions 2000 --steps 1000 --unbounded   # the baseline

One process, one `AutoContextClient`, the Agents SDK session (`AutoContextSession`, whose
items cache and ledger are the per-session caches that grew without bound):

1. opens, uses (two `add_items`, one read, one limited read) and closes `--sessions` sessions;
2. runs one session for `--steps` steps (a call and its 2-6 KB output each, the working
   context read back after each step as a run's start and its input filter do), compressing with the
   offline summarizer at a 16,000-token window.

After a warm-up (the first tenth of each phase) it samples the process's RSS (psutil) and the
Python heap (tracemalloc, current traced size), and prints their growth from the warm-up to
the end. The goal: under 50 MB of RSS growth in each phase. `--unbounded` lifts every bound of
these caches for a baseline in the same conditions: the items cache's and the ledger's (which
they did not have before issue 33) and the client's 64 sessions (which it had).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import random
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import add_database_argument, fresh_database, machine_description
from rich.console import Console
from rich.table import Table

from autoctx import AutoContextClient, AutoContextConfig, OfflineSummarizer
from autoctx._session_caches import SessionCaches
from autoctx.integrations import openai_agents
from autoctx.integrations.openai_agents import AutoContextSession

MB = 1024 * 1024
CONFIG = AutoContextConfig(max_tokens=16_000)


def _sample() -> tuple[float, float]:
    gc.collect()
    return psutil.Process().memory_info().rss / MB, tracemalloc.get_traced_memory()[0] / MB


def _output(r: random.Random) -> str:
    lines = r.randint(40, 120)
    return "\n".join(
        f"{n:4d}  def handler_{r.randrange(10**6)}(request): return {r.randrange(10**4)}"
        for n in range(lines)
    )


def _step(r: random.Random, n: int) -> list[dict[str, Any]]:
    call_id = f"call_{n}_{r.randrange(10**6)}"
    return [
        {
            "type": "function_call",
            "call_id": call_id,
            "name": "read_file",
            "arguments": f'{{"path": "src/m{n}.py"}}',
        },
        {"type": "function_call_output", "call_id": call_id, "output": _output(r)},
    ]


def many_sessions(
    client: AutoContextClient, count: int, run: str
) -> list[tuple[int, float, float]]:
    r = random.Random(1)
    samples: list[tuple[int, float, float]] = []
    warm = max(1, count // 10)
    for i in range(count):
        session = AutoContextSession(
            f"soak-{run}-{i}", client=client, config=CONFIG, summarizer=OfflineSummarizer()
        )
        session.add_items_sync([{"role": "user", "content": f"Task {i}: check the module."}])
        session.add_items_sync(_step(r, i))
        session.get_items_sync()
        session.get_items_sync(2)
        session.memory().close()
        if i + 1 == warm or (i + 1) % max(1, count // 10) == 0:
            samples.append((i + 1, *_sample()))
    return samples


def one_long_session(
    client: AutoContextClient, steps: int, run: str
) -> list[tuple[int, float, float]]:
    r = random.Random(2)
    session = AutoContextSession(
        f"soak-long-{run}", client=client, config=CONFIG, summarizer=OfflineSummarizer()
    )
    session.add_items_sync([{"role": "user", "content": "Check every module of the project."}])
    samples: list[tuple[int, float, float]] = []
    warm = max(1, steps // 10)
    loop = asyncio.new_event_loop()
    for n in range(steps):
        session.add_items_sync(_step(r, n))
        # The read a run starts from (the ledger records it), then the input filter's read.
        loop.run_until_complete(session.get_items())
        session.get_items_sync()
        if n + 1 == warm or (n + 1) % max(1, steps // 10) == 0:
            samples.append((n + 1, *_sample()))
    loop.close()
    session.memory().close()
    return samples


def _report(
    console: Console, title: str, unit: str, samples: list[tuple[int, float, float]]
) -> float:
    table = Table(title=title)
    table.add_column(unit, justify="right")
    table.add_column("RSS MB", justify="right")
    table.add_column("Python heap MB", justify="right")
    for n, rss, heap in samples:
        table.add_row(f"{n:,}", f"{rss:.1f}", f"{heap:.1f}")
    console.print(table)
    (_, rss0, heap0), (_, rss1, heap1) = samples[0], samples[-1]
    console.print(
        f"growth after warm-up ({samples[0][0]:,} {unit}): RSS {rss1 - rss0:+.1f} MB, "
        f"Python heap {heap1 - heap0:+.1f} MB"
    )
    return rss1 - rss0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_database_argument(parser)
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--steps", type=int, default=5_000)
    parser.add_argument(
        "--unbounded", action="store_true", help="lift every bound of the caches (the baseline)"
    )
    args = parser.parse_args()
    console = Console()
    if args.unbounded:
        big = 10**12
        openai_agents._ItemCache.capacity = big
        openai_agents._Ledger.capacity = big
        SessionCaches.__init__.__defaults__ = (big,)  # type: ignore[attr-defined]
    tracemalloc.start()
    started = time.monotonic()
    with fresh_database(args.database_url, "autoctx_soak") as db:
        console.print(machine_description(db))
        console.print(
            f"caches: {'unbounded (baseline)' if args.unbounded else 'bounded'}; "
            f"items cache {openai_agents._ItemCache.capacity:,} messages a session, ledger "
            f"{openai_agents._Ledger.capacity:,} items, "
            f"{SessionCaches().capacity:,} sessions a client"
        )
        with AutoContextClient(db.url) as client:
            growth_many = _report(
                console,
                f"{args.sessions:,} sessions opened, used and closed",
                "sessions",
                many_sessions(client, args.sessions, "m"),
            )
            growth_long = _report(
                console,
                f"one session, {args.steps:,} steps",
                "steps",
                one_long_session(client, args.steps, "l"),
            )
    goal = 50.0
    console.print(
        f"goal: RSS growth under {goal:.0f} MB after warm-up: many sessions "
        f"{'met' if growth_many < goal else 'NOT met'} ({growth_many:+.1f} MB), one long "
        f"session {'met' if growth_long < goal else 'NOT met'} ({growth_long:+.1f} MB); "
        f"{time.monotonic() - started:.0f} s in all"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
