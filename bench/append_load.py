"""Append 100,000 realistic agent messages through `AutoContextMemory.add` and load them back,
against a raw psycopg baseline doing the same work on the same database (issue 2).

    python bench/append_load.py                                   # embedded PostgreSQL
    python bench/append_load.py --database-url postgresql://postgres@127.0.0.1:5432/postgres
    python bench/append_load.py --messages 10000 --profile append  # cProfile of the add() calls

Goals: append <= 1.5x the baseline append, load <= 1.5x the raw select.

The baseline inserts the same messages, in the same batches (one transaction per batch, as
`add()` does), into a plain table `bench_raw(session_id, id, role, content jsonb, tokens)`, and
counts their tokens exactly as autoctx does (`autoctx.intake.count_tokens`), so that the ratio
measures the store, not tiktoken. Two baselines are run: `executemany` (what a hand-written store
would issue) and COPY (the fastest way into PostgreSQL). Batches alternate which side goes first,
so that the noise of a shared machine falls on both sides alike.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime as dt
import json
import pstats
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from psycopg.types.json import Jsonb
from rich.console import Console
from rich.table import Table

import autoctx.intake
import autoctx.memory
from _common import (
    BenchDatabase,
    Stopwatch,
    TranscriptGenerator,
    add_database_argument,
    chunks,
    describe_messages,
    fresh_database,
    machine_description,
    median,
    patched,
    raw_connection,
    secs,
)
from autoctx import AutoContextConfig, AutoContextMemory, Msg, OfflineSummarizer
from autoctx.intake import count_tokens
from autoctx.store.store import Store
from autoctx.tokens import TokenCounter

SESSION = "bench-append"
RAW_TABLES = ("bench_raw", "bench_copy")
COLUMNS = "session_id, id, role, content, tokens"

# Wide enough for the tables when the output is a file or a pipe.
console = Console(width=120)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_database_argument(parser)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=100, help="messages per add() call")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--load-repeats", type=int, default=3)
    parser.add_argument(
        "--profile",
        choices=("append", "load"),
        help="run cProfile around autoctx's side of that phase (its times are then inflated)",
    )
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    return parser.parse_args(argv)


# ---------------------------------------------------------------------------------------------
# The two sides
# ---------------------------------------------------------------------------------------------


class AutoctxSide:
    """`AutoContextMemory.add` and `.messages()`, with their internals timed by patching."""

    def __init__(self, mem: AutoContextMemory, watch: Stopwatch) -> None:
        self.mem = mem
        self.watch = watch
        engine = mem.engine

        @sa.event.listens_for(engine, "before_cursor_execute")
        def _before(conn: Any, cursor: Any, stmt: Any, params: Any, context: Any, many: bool) -> None:
            conn.info["bench_started"] = time.perf_counter()

        @sa.event.listens_for(engine, "after_cursor_execute")
        def _after(conn: Any, cursor: Any, stmt: Any, params: Any, context: Any, many: bool) -> None:
            self.watch.add(self.phase + " sql", time.perf_counter() - conn.info.pop("bench_started"))

        # The commit's round trip (and WAL flush) is database time too.
        engine.dialect.do_commit = watch.wrap("commit", engine.dialect.do_commit)  # type: ignore[method-assign]
        self.phase = "append"

    def append(self, batch: Sequence[Msg]) -> None:
        with self.watch.part("append total"):
            self.mem.add(batch)

    def load(self) -> list[Msg]:
        self.phase = "load"
        with self.watch.part("load total"):
            return self.mem.messages()


class RawSide:
    """psycopg 3 straight into a plain table: counting, then executemany or COPY."""

    def __init__(self, db: BenchDatabase, counter: TokenCounter, watch: Stopwatch) -> None:
        self.conn = raw_connection(db)
        self.counter = counter
        self.watch = watch
        self.next_id = 1
        self.next_copy_id = 1
        with self.conn.cursor() as cur:
            for table in RAW_TABLES:
                cur.execute(
                    f"CREATE TABLE {table} (session_id text, id bigint, role text, content jsonb, "
                    "tokens int, PRIMARY KEY (session_id, id))"
                )
        self.conn.commit()

    def _count(self, batch: Sequence[Msg], name: str) -> list[int]:
        with self.watch.part(name):
            return [count_tokens(m, self.counter) for m in batch]

    def append_executemany(self, batch: Sequence[Msg]) -> None:
        tokens = self._count(batch, "executemany count")
        with self.watch.part("executemany db"):
            rows = [
                (SESSION, self.next_id + i, m.role, Jsonb(m.content_json()), t)
                for i, (m, t) in enumerate(zip(batch, tokens, strict=True))
            ]
            with self.conn.cursor() as cur:
                cur.executemany(f"INSERT INTO bench_raw ({COLUMNS}) VALUES (%s, %s, %s, %s, %s)", rows)
            self.conn.commit()
        self.next_id += len(batch)

    def append_copy(self, batch: Sequence[Msg]) -> None:
        tokens = self._count(batch, "copy count")
        with self.watch.part("copy db"):
            with self.conn.cursor() as cur, cur.copy(f"COPY bench_copy ({COLUMNS}) FROM STDIN") as copy:
                for i, (m, t) in enumerate(zip(batch, tokens, strict=True)):
                    copy.write_row((SESSION, self.next_copy_id + i, m.role, Jsonb(m.content_json()), t))
            self.conn.commit()
        self.next_copy_id += len(batch)

    def load(self) -> list[tuple[Any, ...]]:
        with self.watch.part("raw select"), self.conn.cursor() as cur:
            cur.execute(
                "SELECT id, role, content, tokens FROM bench_raw WHERE session_id = %s ORDER BY id",
                (SESSION,),
            )
            rows = cur.fetchall()
        self.conn.commit()
        return rows

    def close(self) -> None:
        self.conn.close()


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    msgs = TranscriptGenerator(args.seed).messages(args.messages)
    console.print(f"generated {describe_messages(msgs)} in {secs(time.perf_counter() - started)}")
    batches = list(chunks(msgs, args.batch))
    watch = Stopwatch()
    profiler = cProfile.Profile() if args.profile else None

    with fresh_database(args.database_url, "autoctx_bench_append") as db:
        console.print(f"database {db.name} on PostgreSQL {db.server_version}")
        config = AutoContextConfig()
        mem = AutoContextMemory.open(SESSION, db.url, config, summarizer=OfflineSummarizer())
        side = AutoctxSide(mem, watch)
        raw = RawSide(db, TokenCounter(config.model), watch)
        try:
            with (
                patched(autoctx.memory, "prepare", watch.wrap("prepare", autoctx.memory.prepare)),
                patched(autoctx.intake, "count_tokens", watch.wrap("count", autoctx.intake.count_tokens)),
                patched(Store, "append", watch.wrap("store", Store.append)),
            ):
                for k, batch in enumerate(batches):
                    mine = _profiled(profiler if args.profile == "append" else None, side.append)
                    steps = [lambda b=batch: mine(b), lambda b=batch: raw.append_executemany(b),
                             lambda b=batch: raw.append_copy(b)]
                    # Alternate who goes first: a noisy neighbour then hurts both sides alike.
                    for step in steps if k % 2 == 0 else reversed(steps):
                        step()
            loads: list[float] = []
            raws: list[float] = []
            for k in range(args.load_repeats):
                before = (watch["load total"], watch["raw select"])
                mine_load = _profiled(profiler if args.profile == "load" else None, side.load)
                if k % 2 == 0:
                    loaded, rows = mine_load(), raw.load()
                else:
                    rows, loaded = raw.load(), mine_load()
                loads.append(watch["load total"] - before[0])
                raws.append(watch["raw select"] - before[1])
                if len(loaded) != len(msgs) or len(rows) != len(msgs):
                    raise SystemExit(f"loaded {len(loaded)} / {len(rows)} messages, expected {len(msgs)}")
            expected_tokens = sum(r[3] for r in rows)
            if mem.token_count != expected_tokens:
                raise SystemExit(f"session tokens {mem.token_count} != baseline {expected_tokens}")
        finally:
            raw.close()
        machine = machine_description(db)

    figures = _figures(args, watch, loads, raws, machine)
    _print(figures)
    if profiler is not None:
        console.rule(f"cProfile of autoctx's {args.profile} (times inflated by profiling)")
        stats = pstats.Stats(profiler, stream=sys.stdout)
        stats.sort_stats("tottime").print_stats(25)
        stats.sort_stats("cumulative").print_stats(30)
    return figures


def _profiled(profiler: cProfile.Profile | None, fn: Any) -> Any:
    if profiler is None:
        return fn

    def call(*args: Any) -> Any:
        profiler.enable()
        try:
            return fn(*args)
        finally:
            profiler.disable()

    return call


def _figures(
    args: argparse.Namespace, w: Stopwatch, loads: list[float], raws: list[float], machine: str
) -> dict[str, Any]:
    append_total = w["append total"]
    counting = w["count"]
    validation = w["prepare"] - counting
    append_sql = w["append sql"] + w["commit"]  # all commits of the run happen in append
    store_python = w["store"] - append_sql
    other = append_total - w["prepare"] - w["store"]
    em = w["executemany count"] + w["executemany db"]
    cp = w["copy count"] + w["copy db"]
    load = median(loads)
    raw_load = median(raws)
    load_sql = w["load sql"] / max(1, len(loads))
    return {
        "date": dt.date.today().isoformat(),
        "machine": machine,
        "messages": args.messages,
        "batch": args.batch,
        "append": {
            "autoctx": {
                "total": append_total,
                "counting": counting,
                "validation": validation,
                "sql_and_commit": append_sql,
                "store_python": store_python,
                "other": other,
            },
            "executemany": {"total": em, "counting": w["executemany count"], "db": w["executemany db"]},
            "copy": {"total": cp, "counting": w["copy count"], "db": w["copy db"]},
            "ratio_executemany": append_total / em,
            "ratio_copy": append_total / cp,
            "ratio_db_executemany": (append_total - counting) / w["executemany db"],
        },
        "load": {
            "autoctx": loads,
            "autoctx_sql_execute": load_sql,
            "raw_select": raws,
            "ratio": load / raw_load,
        },
    }


def _print(f: dict[str, Any]) -> None:
    a = f["append"]
    mine, em, cp = a["autoctx"], a["executemany"], a["copy"]
    table = Table(title=f"append {f['messages']:,} messages, {f['batch']} per call ({f['machine']})")
    table.add_column("part")
    table.add_column("autoctx add()", justify="right")
    table.add_column("raw executemany", justify="right")
    table.add_column("raw COPY", justify="right")
    table.add_row("token counting (tiktoken)", secs(mine["counting"]), secs(em["counting"]), secs(cp["counting"]))
    table.add_row("validation, binding", secs(mine["validation"]), "-", "-")
    # The baselines' database time includes building their rows and JSON: they have no
    # separate store layer to attribute it to.
    table.add_row("database (SQL, commit)", secs(mine["sql_and_commit"]), secs(em["db"]), secs(cp["db"]))
    table.add_row("store Python (rows, SQLAlchemy)", secs(mine["store_python"]), "-", "-")
    table.add_row("facade (coerce)", secs(mine["other"]), "-", "-")
    table.add_row("total", secs(mine["total"]), secs(em["total"]), secs(cp["total"]), style="bold")
    console.print(table)
    goal = 1.5
    console.print(
        f"append / baseline: {a['ratio_executemany']:.2f}x executemany, {a['ratio_copy']:.2f}x COPY "
        f"(goal <= {goal}x: {'met' if a['ratio_executemany'] <= goal else 'MISSED'} vs executemany, "
        f"{'met' if a['ratio_copy'] <= goal else 'MISSED'} vs COPY); without counting "
        f"{a['ratio_db_executemany']:.2f}x executemany's database time"
    )
    ld = f["load"]
    table = Table(title=f"load {f['messages']:,} messages (each repeat; median for the ratio)")
    table.add_column("part")
    table.add_column("times", justify="right")
    table.add_row("autoctx mem.messages()", ", ".join(secs(x) for x in ld["autoctx"]))
    table.add_row("  of which SQL execute (per load)", secs(ld["autoctx_sql_execute"]))
    table.add_row("raw select + fetchall", ", ".join(secs(x) for x in ld["raw_select"]))
    console.print(table)
    console.print(
        f"load / raw select: {ld['ratio']:.2f}x (goal <= {goal}x: "
        f"{'met' if ld['ratio'] <= goal else 'MISSED'})"
    )


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    figures = run(args)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
