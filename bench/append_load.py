"""Append 100,000 realistic agent messages through `AutoContextMemory.add` and load them back,
against a raw psycopg baseline doing the same work on the same database (issue 2).

    python bench/append_load.py                                   # embedded PostgreSQL
    python bench/append_load.py --database-url postgresql://postgres@127.0.0.1:5432/postgres
    python bench/append_load.py --messages 10000 --profile append  # cProfile of the add() calls

Goals: append <= 1.5x the same-rows executemany baseline, load <= 1.5x the raw select.

The baseline writes the same rows autoctx writes, in the same batches (one transaction per
batch, as `add()` does): into tables created `LIKE messages` / `LIKE working_set INCLUDING ALL`
(same columns, defaults, checks, primary keys and indexes; `LIKE` copies no foreign keys), every
column of each message plus its working-set row. It counts tokens exactly as autoctx does
(`autoctx._intake.count_tokens`), so that the ratio measures the store, not tiktoken. Two
baselines are run: `executemany` (what a hand-written store would issue) and COPY (the fastest
way into PostgreSQL). The raw load is the same read autoctx makes: the working set joined to its
messages, in position order, fetched with a plain psycopg cursor. Batches alternate which side
goes first, so that the noise of a shared machine falls on every side alike.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import datetime as dt
import functools
import json
import time
from collections.abc import Callable, Iterator, Sequence, Sized
from pathlib import Path
from typing import Any

import sqlalchemy as sa
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
    print_profile,
    raw_connection,
    secs,
)
from psycopg.types.json import Jsonb
from rich.console import Console
from rich.table import Table

import autoctx._intake
import autoctx._memory
from autoctx import AutoContextConfig, AutoContextMemory, Msg, OfflineSummarizer
from autoctx._intake import count_tokens
from autoctx._store.store import SessionStore
from autoctx._tokens import TokenCounter

SESSION = "bench-append"
RAW_TABLES = ("bench_raw", "bench_copy")
# The same rows autoctx writes: every column of a message, and its working-set row.
COLUMNS = (
    "session_id, id, role, name, content, metadata, kind, pinned, final, tokens, chars, "
    "call_ids, result_ids, tool_names"
)

# Wide enough for the tables when the output is a file or a pipe.
console = Console(width=120)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
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
    """`AutoContextMemory.add` and `.messages()` of one session, its internals timed into its own
    stopwatch."""

    def __init__(self, mem: AutoContextMemory, watch: Stopwatch) -> None:
        self.mem = mem
        self.watch = watch
        self.phase = "append"

    def append(self, batch: Sequence[Msg]) -> None:
        _current[0] = self
        with self.watch.part("append total"):
            self.mem.add(batch)

    def load(self) -> list[Msg]:
        _current[0] = self
        self.phase = "load"
        with self.watch.part("load total"):
            loaded: list[Msg] = self.mem.messages()
        return loaded


#: The side whose call is in progress: the patched internals time into its stopwatch.
_current: list[AutoctxSide] = [None]  # type: ignore[list-item]


@contextlib.contextmanager
def instrumented(engine: sa.Engine) -> Iterator[None]:
    """Time autoctx's internals into the current side's stopwatch."""

    def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                _current[0].watch.add(name, time.perf_counter() - started)

        return call

    def before(conn: Any, *args: Any) -> None:
        conn.info["bench_started"] = time.perf_counter()

    def after(conn: Any, *args: Any) -> None:
        side = _current[0]
        side.watch.add(side.phase + " sql", time.perf_counter() - conn.info.pop("bench_started"))

    sa.event.listen(engine, "before_cursor_execute", before)
    sa.event.listen(engine, "after_cursor_execute", after)
    try:
        with (
            patched(autoctx._memory, "prepare", timed("prepare", autoctx._memory.prepare)),
            patched(autoctx._intake, "count_tokens", timed("count", autoctx._intake.count_tokens)),
            patched(SessionStore, "append", timed("store", SessionStore.append)),
            # The commit's round trip (and WAL flush) is database time too.
            patched(engine.dialect, "do_commit", timed("commit", engine.dialect.do_commit)),
        ):
            yield
    finally:
        sa.event.remove(engine, "before_cursor_execute", before)
        sa.event.remove(engine, "after_cursor_execute", after)


def _raw_row(msg_id: int, m: Msg, tokens: int) -> tuple[Any, ...]:
    """One message row as a hand-written store would build it."""
    calls, results = m.tool_uses, m.tool_results
    final = m.role == "assistant" and not calls
    return (
        SESSION, msg_id, m.role, m.name, Jsonb(m.content_json()), Jsonb(dict(m.metadata)),
        m.kind, m.pinned, final, tokens, m.payload_chars, [c.id for c in calls],
        [r.tool_use_id for r in results], [c.name for c in calls] + [r.name for r in results],
    )  # fmt: skip


class RawSide:
    """psycopg 3 straight into a plain table: counting, then executemany or COPY."""

    def __init__(self, db: BenchDatabase, counter: TokenCounter, watch: Stopwatch) -> None:
        self.conn = raw_connection(db)
        self.counter = counter
        self.watch = watch
        self.next_id = 1
        self.next_copy_id = 1
        with self.conn.cursor() as cur:
            # Copies of autoctx's own tables (columns, defaults, checks, keys, indexes), so that
            # the baseline writes the same rows a hand-written store would.
            for table in RAW_TABLES:
                cur.execute(f"CREATE TABLE {table} (LIKE messages INCLUDING ALL)")
                cur.execute(f"CREATE TABLE {table}_working (LIKE working_set INCLUDING ALL)")
        self.conn.commit()

    def _count(self, batch: Sequence[Msg], name: str) -> list[int]:
        with self.watch.part(name):
            return [count_tokens(m, self.counter) for m in batch]

    def append_executemany(self, batch: Sequence[Msg]) -> None:
        tokens = self._count(batch, "executemany count")
        with self.watch.part("executemany db"):
            rows = [
                _raw_row(self.next_id + i, m, t)
                for i, (m, t) in enumerate(zip(batch, tokens, strict=True))
            ]
            with self.conn.cursor() as cur:
                cur.executemany(
                    f"INSERT INTO bench_raw ({COLUMNS}) VALUES ({', '.join(['%s'] * 14)})", rows
                )
                cur.executemany(
                    "INSERT INTO bench_raw_working (session_id, position, message_id) "
                    "VALUES (%s, %s, %s)",
                    [(SESSION, r[1], r[1]) for r in rows],
                )
            self.conn.commit()
        self.next_id += len(batch)

    def append_copy(self, batch: Sequence[Msg]) -> None:
        tokens = self._count(batch, "copy count")
        with self.watch.part("copy db"):
            with self.conn.cursor() as cur:
                with cur.copy(f"COPY bench_copy ({COLUMNS}) FROM STDIN") as copy:
                    for i, (m, t) in enumerate(zip(batch, tokens, strict=True)):
                        copy.write_row(_raw_row(self.next_copy_id + i, m, t))
                with cur.copy(
                    "COPY bench_copy_working (session_id, position, message_id) FROM STDIN"
                ) as copy:
                    for i in range(len(batch)):
                        copy.write_row((SESSION, self.next_copy_id + i, self.next_copy_id + i))
            self.conn.commit()
        self.next_copy_id += len(batch)

    def load(self) -> list[tuple[Any, ...]]:
        with self.watch.part("raw select"), self.conn.cursor() as cur:
            # The same read autoctx makes: the working set joined to its messages, in order.
            cur.execute(
                "SELECT m.id, m.role, m.name, m.content, m.metadata, m.kind, m.pinned, m.tokens "
                "FROM bench_raw_working w JOIN bench_raw m "
                "ON m.session_id = w.session_id AND m.id = w.message_id "
                "WHERE w.session_id = %s ORDER BY w.position",
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
    profiler = cProfile.Profile() if args.profile else None
    raw_watch = Stopwatch()

    with fresh_database(args.database_url, "autoctx_bench_append") as db:
        console.print(f"database {db.name} on PostgreSQL {db.server_version}")
        config = AutoContextConfig()
        sides = [
            AutoctxSide(
                AutoContextMemory.open(SESSION, db.url, config, summarizer=OfflineSummarizer()),
                Stopwatch(),
            )
        ]
        raw = RawSide(db, TokenCounter(config.model), raw_watch)
        try:
            with instrumented(sides[0].mem.engine):
                mine = [
                    _profiled(profiler if args.profile == "append" else None, side.append)
                    for side in sides
                ]
                for k, batch in enumerate(batches):
                    steps: list[Callable[[], None]] = [
                        *[functools.partial(m, batch) for m in mine],
                        functools.partial(raw.append_executemany, batch),
                        functools.partial(raw.append_copy, batch),
                    ]
                    # Rotate who goes first: a noisy neighbour then hurts every side alike.
                    for step in steps[k % len(steps) :] + steps[: k % len(steps)]:
                        step()
                loads: dict[str, list[float]] = {"raw": []}
                for k in range(args.load_repeats):
                    readers: list[tuple[str, Callable[[], Sized]]] = [
                        ("raw", raw.load),
                        *[
                            (
                                _label(side),
                                _profiled(profiler if args.profile == "load" else None, side.load),
                            )
                            for side in sides
                        ],
                    ]
                    for label, reader in readers[k % len(readers) :] + readers[: k % len(readers)]:
                        t0 = time.perf_counter()
                        loaded = reader()
                        loads.setdefault(label, []).append(time.perf_counter() - t0)
                        if len(loaded) != len(msgs):
                            raise SystemExit(f"{label} loaded {len(loaded)}, not {len(msgs)}")
            expected_tokens = sum(row[-1] for row in raw.load())
            for side in sides:
                if side.mem.token_count() != expected_tokens:
                    raise SystemExit(
                        f"{_label(side)}: session tokens {side.mem.token_count()} != "
                        f"baseline {expected_tokens}"
                    )
        finally:
            raw.close()
        machine = machine_description(db)

    figures = _figures(args, sides, raw_watch, loads, machine)
    _print(figures)
    if profiler is not None:
        print_profile(
            console, profiler, f"cProfile of autoctx's {args.profile} (times inflated by profiling)"
        )
    return figures


def _label(side: AutoctxSide) -> str:
    return "autoctx"


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


def _side_figures(w: Stopwatch, raw_em: float, raw_copy: float, raw_em_db: float) -> dict[str, Any]:
    total = w["append total"]
    counting = w["count"]
    sql = w["append sql"] + w["commit"]  # every commit of the run happens in append
    return {
        "total": total,
        "counting": counting,
        "validation": w["prepare"] - counting,
        "sql_and_commit": sql,
        "store_python": w["store"] - sql,
        "other": total - w["prepare"] - w["store"],
        "ratio_executemany": total / raw_em,
        "ratio_copy": total / raw_copy,
        "ratio_db_executemany": (total - counting) / raw_em_db,
    }


def _figures(
    args: argparse.Namespace,
    sides: list[AutoctxSide],
    w: Stopwatch,
    loads: dict[str, list[float]],
    machine: str,
) -> dict[str, Any]:
    em = w["executemany count"] + w["executemany db"]
    cp = w["copy count"] + w["copy db"]
    raw_load = median(loads["raw"])
    return {
        "date": dt.date.today().isoformat(),
        "machine": machine,
        "messages": args.messages,
        "batch": args.batch,
        "append": {
            **{_label(s): _side_figures(s.watch, em, cp, w["executemany db"]) for s in sides},
            "executemany": {
                "total": em,
                "counting": w["executemany count"],
                "db": w["executemany db"],
            },
            "copy": {"total": cp, "counting": w["copy count"], "db": w["copy db"]},
        },
        "load": {
            "times": loads,
            "sql_execute": {
                _label(s): s.watch["load sql"] / max(1, len(loads["raw"])) for s in sides
            },
            "ratio": {_label(s): median(loads[_label(s)]) / raw_load for s in sides},
        },
    }


def _print(f: dict[str, Any]) -> None:
    a = f["append"]
    mine = [k for k in ("autoctx",) if k in a]
    em, cp = a["executemany"], a["copy"]
    table = Table(
        title=f"append {f['messages']:,} messages, {f['batch']} per call ({f['machine']})"
    )
    table.add_column("part")
    for k in mine:
        table.add_column(f"{k} add()", justify="right")
    table.add_column("raw executemany", justify="right")
    table.add_column("raw COPY", justify="right")
    rows = [
        ("token counting (tiktoken)", "counting", em["counting"], cp["counting"]),
        ("validation, binding", "validation", None, None),
        # The baselines' database time includes building their rows and JSON: they have no
        # separate store layer to attribute it to.
        ("database (SQL, commit)", "sql_and_commit", em["db"], cp["db"]),
        ("store Python (rows, SQLAlchemy)", "store_python", None, None),
        ("facade (coerce)", "other", None, None),
        ("total", "total", em["total"], cp["total"]),
    ]
    for label, key, raw_em, raw_cp in rows:
        table.add_row(
            label,
            *[secs(a[k][key]) for k in mine],
            secs(raw_em) if raw_em is not None else "-",
            secs(raw_cp) if raw_cp is not None else "-",
            style="bold" if key == "total" else None,
        )
    console.print(table)
    goal = 1.5
    for k in mine:
        r = a[k]
        console.print(
            f"{k} append / baseline: {r['ratio_executemany']:.2f}x executemany, "
            f"{r['ratio_copy']:.2f}x COPY (goal <= {goal}x: "
            f"{_verdict(r['ratio_executemany'] <= goal)} vs executemany, "
            f"{_verdict(r['ratio_copy'] <= goal)} vs COPY); without counting "
            f"{r['ratio_db_executemany']:.2f}x executemany's database time"
        )
    ld = f["load"]
    table = Table(title=f"load {f['messages']:,} messages (each repeat; median for the ratio)")
    table.add_column("reader")
    table.add_column("times", justify="right")
    table.add_column("SQL execute", justify="right")
    table.add_row("raw select + fetchall", ", ".join(secs(x) for x in ld["times"]["raw"]), "")
    for k in mine:
        table.add_row(
            f"{k} mem.messages()",
            ", ".join(secs(x) for x in ld["times"][k]),
            secs(ld["sql_execute"][k]),
        )
    console.print(table)
    for k in mine:
        console.print(
            f"{k} load / raw select: {ld['ratio'][k]:.2f}x "
            f"(goal <= {goal}x: {_verdict(ld['ratio'][k] <= goal)})"
        )


def _verdict(met: bool) -> str:
    return "met" if met else "MISSED"


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    figures = run(args)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
