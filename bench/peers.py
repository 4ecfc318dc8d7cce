"""autoctx's Agents SDK session against the SDK's own SQLAlchemySession (issue 6, item 4).

The same workload, on the same PostgreSQL, through four writers:

- raw psycopg: each item's JSON inserted into a plain table (`executemany`, one transaction
  per batch), read back with one select: the floor of the database work;
- the OpenAI Agents SDK's `SQLAlchemySession` (async engine, `postgresql+psycopg`), the
  Session backend the SDK ships for PostgreSQL;
- `AutoContextSession` with compression off (the same work as the SDK's session: store and give
  back items; autoctx also validates, counts tokens and keeps the working set);
- `AutoContextSession` with compression on (default thresholds, the offline summarizer).

The workload is N items of agent turns: a user message, 1 to 3 parallel function calls, their
outputs (realistic text; sizes log-normal, median 800 characters, up to 20 KB) and an assistant
message, added `--batch` items per `add_items` call (a cut never splits a model response's
parallel calls: the SDK saves a response in one call). Each batch goes through the four
writers in a rotating order, so that the noise of a shared machine falls on all alike.

    python bench/peers.py                                    # 20,000 items, embedded PostgreSQL
    python bench/peers.py --items 5000 --database-url postgresql://postgres@127.0.0.1:5432/postgres
    python bench/peers.py --items 5000 --profile add         # cProfile of autoctx's add path

Goals (issue 24): autoctx (compression off, full-text search on: the default
`search_config`) adds at least 1.5x faster than SQLAlchemySession, and reads (`get_items()` of
the whole history, from the object that wrote it and from a new one, and
`get_items(limit=100)`) no slower. A new `AutoContextSession` object shares the items its client
cached (`AutoContextClient.session_caches`); the script also reads from a new object with those
caches emptied, as a new process would (shown, not a goal).

An append computes no search vector (migration 0012): the first search of a session fills the
vectors of everything appended since. The script times that search after the reads (the cost
the append no longer pays, paid once) and the next one, and checks that the last item added
is a hit.

After the timed run, autoctx's add and a new process's read are split into their parts (item
conversion, validation, token counting, the statement; working ids, content fetch, conversion)
on a fresh session, to show where the time goes.

Needs the `openai-agents` package and SQLAlchemy's asyncio support (`greenlet`).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import datetime as dt
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from _common import (
    TOOL_OUTPUT_KINDS,
    BenchDatabase,
    Stopwatch,
    TranscriptGenerator,
    add_database_argument,
    fresh_database,
    machine_description,
    median,
    patched,
    percentile,
    print_profile,
    raw_connection,
    secs,
    tool_arguments,
)
from agents.extensions.memory.sqlalchemy_session import SQLAlchemySession
from psycopg.types.json import Jsonb
from rich.console import Console
from rich.table import Table
from sqlalchemy.ext.asyncio import create_async_engine

import autoctx._intake
import autoctx._memory
from autoctx import AutoContextClient, AutoContextConfig, OfflineSummarizer
from autoctx.integrations import openai_agents as agents_mod
from autoctx.integrations.openai_agents import AutoContextSession

Item = dict[str, Any]

console = Console(width=130)

SIDES = ("raw", "sdk", "autoctx", "autoctx_c")
LABELS = {
    "raw": "raw psycopg",
    "sdk": "SDK SQLAlchemySession",
    "autoctx": "AutoContextSession (compress off)",
    "autoctx_c": "AutoContextSession (compress on)",
}
LIMIT = 100


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_database_argument(parser)
    parser.add_argument("--items", type=int, default=20_000, help="items in the workload")
    parser.add_argument("--batch", type=int, default=10, help="items per add_items() call")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--get-repeats", type=int, default=3, help="full-history reads per side")
    parser.add_argument(
        "--profile",
        choices=("add", "get"),
        help="after the timed run, cProfile autoctx's sync twin of that call on a fresh session",
    )
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    return parser.parse_args(argv)


# ---------------------------------------------------------------------------------------------
# The workload
# ---------------------------------------------------------------------------------------------


class ItemGenerator:
    """Deterministic agent turns as Responses-API input items, as the SDK stores them."""

    def __init__(self, seed: int) -> None:
        self.gen = TranscriptGenerator(seed)
        self.r = self.gen.r
        self.n = 0

    def _arguments(self, tool: str) -> str:
        r = self.r
        if tool in ("read_file", "list_dir", "run_shell", "grep", "http_get"):
            return tool_arguments(r, tool)
        # Code arguments here are generated text, not a one-liner: the SDK stores them as is.
        return json.dumps({"code": self.gen.text("code", r.randrange(60, 400))})

    def turn(self) -> list[Item]:
        gen, r = self.gen, self.r
        self.n += 1
        items: list[Item] = [{"role": "user", "content": gen.user().text}]
        calls = []
        for k in range(r.choice((1, 1, 2, 3))):
            tool = r.choice(tuple(TOOL_OUTPUT_KINDS))
            calls.append(
                {
                    "type": "function_call",
                    "id": f"fc_{self.n}_{k}",
                    "call_id": f"call_{self.n}_{k}",
                    "name": tool,
                    "arguments": self._arguments(tool),
                    "status": "completed",
                }
            )
        items.extend(calls)
        items.extend(
            {
                "type": "function_call_output",
                "call_id": c["call_id"],
                "output": gen.text(TOOL_OUTPUT_KINDS[c["name"]], gen.tool_output_size()),
            }
            for c in calls
        )
        items.append(
            {
                "type": "message",
                "role": "assistant",
                "id": f"msg_{self.n}",
                "status": "completed",
                "content": [{"type": "output_text", "text": gen.answer().text, "annotations": []}],
            }
        )
        return items

    def items(self, n: int) -> list[Item]:
        """Whole turns, `n` items or a few more (a turn is never cut)."""
        out: list[Item] = []
        while len(out) < n:
            out.extend(self.turn())
        return out


def batches(items: Sequence[Item], size: int) -> list[list[Item]]:
    """`size` items per batch, except that a run of function calls is never cut."""
    out: list[list[Item]] = []
    current: list[Item] = []
    for k, item in enumerate(items):
        splits_calls = (
            k > 0
            and item.get("type") == "function_call"
            and items[k - 1].get("type") == "function_call"
        )
        if len(current) >= size and not splits_calls:
            out.append(current)
            current = []
        current.append(item)
    if current:
        out.append(current)
    return out


# ---------------------------------------------------------------------------------------------
# The sides
# ---------------------------------------------------------------------------------------------


class RawSide:
    """psycopg 3 straight into a table shaped like the SDK's (session, serial id, JSON)."""

    def __init__(self, db: BenchDatabase, session_id: str) -> None:
        self.conn = raw_connection(db)
        self.session_id = session_id
        self.conn.execute(
            "CREATE TABLE bench_peers_raw (id bigserial PRIMARY KEY, session_id text NOT NULL, "
            "message_data jsonb NOT NULL)"
        )
        self.conn.execute("CREATE INDEX ON bench_peers_raw (session_id, id)")
        self.conn.commit()

    async def add_items(self, items: list[Item]) -> None:
        with self.conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO bench_peers_raw (session_id, message_data) VALUES (%s, %s)",
                [(self.session_id, Jsonb(item)) for item in items],
            )
        self.conn.commit()

    async def get_items(self, limit: int | None = None) -> list[Item]:
        with self.conn.cursor() as cur:
            if limit is None:
                cur.execute(
                    "SELECT message_data FROM bench_peers_raw WHERE session_id = %s ORDER BY id",
                    (self.session_id,),
                )
                rows = [r[0] for r in cur.fetchall()]
            else:
                cur.execute(
                    "SELECT message_data FROM bench_peers_raw WHERE session_id = %s "
                    "ORDER BY id DESC LIMIT %s",
                    (self.session_id, limit),
                )
                rows = [r[0] for r in cur.fetchall()][::-1]
        self.conn.commit()
        return rows

    def close(self) -> None:
        self.conn.close()


Side = Any  # an object with async add_items(items) and get_items(limit=None)


async def _timed(fn: Callable[[], Awaitable[Any]]) -> tuple[float, Any]:
    started = time.perf_counter()
    result = await fn()
    return time.perf_counter() - started, result


async def run_sides(
    args: argparse.Namespace, db: BenchDatabase, items: list[Item], parts: list[list[Item]]
) -> dict[str, Any]:
    sdk_engine = create_async_engine(db.url.set(drivername="postgresql+psycopg"))
    sides: dict[str, Side] = {
        "raw": RawSide(db, "bench-raw"),
        "sdk": SQLAlchemySession("bench-sdk", engine=sdk_engine, create_tables=True),
        "autoctx": AutoContextSession(
            "bench-autoctx", db.url, summarizer=OfflineSummarizer(), compress=False
        ),
        "autoctx_c": AutoContextSession(
            "bench-autoctx-c",
            db.url,
            AutoContextConfig(),
            summarizer=OfflineSummarizer(),
            compress=True,
        ),
    }
    try:
        # Warm up outside the clock: tables, pools, the schema check, the token encoding.
        for side in sides.values():
            await side.get_items()
        adds: dict[str, list[float]] = {name: [] for name in SIDES}
        for k, batch in enumerate(parts):
            order = SIDES[k % 4 :] + SIDES[: k % 4]
            for name in order:
                # Each side gets its own copy: no writer may see another's mutations.
                copy = json.loads(json.dumps(batch))
                seconds, _ = await _timed(lambda s=sides[name], c=copy: s.add_items(c))
                adds[name].append(seconds)
            if (k + 1) % max(1, len(parts) // 10) == 0:
                console.print(f"  {k + 1:,} / {len(parts):,} batches", highlight=False)

        # Fresh statistics, as autovacuum would have them on a live server: without them the
        # planner takes a just-filled table for a small one and picks worse plans for all.
        sides["raw"].conn.execute("ANALYZE")
        sides["raw"].conn.commit()

        gets: dict[str, list[float]] = {name: [] for name in SIDES}
        got: dict[str, int] = {}
        for k in range(args.get_repeats):
            for name in SIDES[k % 4 :] + SIDES[: k % 4]:
                seconds, result = await _timed(lambda s=sides[name]: s.get_items())
                gets[name].append(seconds)
                got[name] = len(result)
                if name in ("raw", "sdk", "autoctx") and result != items:
                    raise SystemExit(f"{LABELS[name]}: get_items() differs from what was added")
        limited: dict[str, list[float]] = {name: [] for name in SIDES}
        for k in range(10):
            for name in SIDES[k % 4 :] + SIDES[: k % 4]:
                seconds, result = await _timed(lambda s=sides[name]: s.get_items(limit=LIMIT))
                limited[name].append(seconds)
                if name != "autoctx_c" and result != items[-LIMIT:]:
                    raise SystemExit(f"{LABELS[name]}: get_items(limit) differs from the input")
        # A new session object (autoctx's shares the items its client cached: what an earlier
        # object of the process read or wrote), then a new object with the client's caches
        # emptied, as a new process would have it (autoctx then reads every working message;
        # the SDK's session caches nothing, so its two reads are the same).
        cold: dict[str, list[float]] = {name: [] for name in SIDES}
        empty: dict[str, list[float]] = {name: [] for name in SIDES}
        # (All reads from new objects first: emptying the caches drops every session's.)
        for timings, emptied in ((cold, False), (empty, True)):
            for _ in range(args.get_repeats):
                for name in SIDES:
                    fresh = _fresh_side(name, sides[name], db, sdk_engine)
                    if emptied:
                        AutoContextClient.shared(db.url).session_caches.clear()
                    seconds, result = await _timed(fresh.get_items)
                    timings[name].append(seconds)
                    if name in ("raw", "sdk", "autoctx") and result != items:
                        raise SystemExit(f"{LABELS[name]}: new get_items() differs from the input")
        searched = _first_search(sides["autoctx"], items)
        mem = sides["autoctx_c"].memory()
        compressed = {
            "working_messages": mem.message_count(),
            "working_tokens": mem.token_count(),
            "events_applied": sum(1 for e in mem.events() if e.status == "applied"),
        }
    finally:
        sides["raw"].close()
        await sdk_engine.dispose()
    return {
        "adds": adds,
        "gets": gets,
        "cold": cold,
        "empty": empty,
        "limited": limited,
        "got": got,
        "compressed": compressed,
        "search": searched,
    }


def _first_search(side: AutoContextSession, items: list[Item]) -> dict[str, float]:
    """The first search of the compression-off session (it fills every vector the appends left
    out), then the same search again; the last assistant message must be a hit."""
    mem = side.memory()
    # A phrase of the last answer's first line: the generated vocabulary is small, so single
    # words match thousands of messages.
    phrase = " ".join(items[-1]["content"][0]["text"].split("\n")[0].split()[:8])
    timings = []
    for _ in range(2):
        started = time.perf_counter()
        hits = mem.search(f'"{phrase}"', limit=100)
        timings.append(time.perf_counter() - started)
        if not any(phrase in mem.reload(message_id=h.message_id)[0].text for h in hits):
            raise SystemExit(f"search for {phrase!r}: the last message added is not a hit")
    return {"first": timings[0], "next": timings[1]}


def _fresh_side(name: str, side: Side, db: BenchDatabase, sdk_engine: Any) -> Side:
    if name == "raw":
        return side
    if name == "sdk":
        return SQLAlchemySession(side.session_id, engine=sdk_engine)
    fresh = AutoContextSession(side.session_id, db.url, side.config, summarizer=OfflineSummarizer())
    fresh.memory()  # opening (one read of the session row) is not part of the read
    return fresh


# ---------------------------------------------------------------------------------------------
# Where autoctx's time goes (sync twins on a fresh session, internals timed by patching)
# ---------------------------------------------------------------------------------------------


def split(db: BenchDatabase, parts: list[list[Item]]) -> dict[str, float]:
    """Per `add_items` call (medians are not additive, so means): item conversion, validation
    and token counting, the statement (from SQLAlchemy's cursor events: parameter dumping, the
    round trip, the server), the rest; the worker-thread hop of the async call, measured bare;
    and the new-object read split into the working-id query, the content fetch and the
    conversion to items."""
    session = AutoContextSession(
        "bench-split", db.url, summarizer=OfflineSummarizer(), compress=False
    )
    engine = session.memory().engine
    watch = Stopwatch()
    phase = ["add"]

    def before(conn: Any, *args: Any) -> None:
        conn.info["bench_started"] = time.perf_counter()

    def after(conn: Any, *args: Any) -> None:
        watch.add(phase[0] + " sql", time.perf_counter() - conn.info.pop("bench_started"))

    count_tokens = autoctx._intake.count_tokens
    sa.event.listen(engine, "before_cursor_execute", before)
    sa.event.listen(engine, "after_cursor_execute", after)
    try:
        with (
            patched(agents_mod, "convert", watch.wrap("convert", agents_mod.convert)),
            patched(autoctx._memory, "prepare", watch.wrap("prepare", autoctx._intake.prepare)),
            patched(autoctx._intake, "count_tokens", watch.wrap("count", count_tokens)),
        ):
            for batch in parts:
                with watch.part("add"):
                    session.add_items_sync(batch)
            phase[0] = "get"
            store = session.memory()._store
            with (
                patched(store, "working_ids", watch.wrap("ids", store.working_ids)),
                patched(store, "message_documents", watch.wrap("docs", store.message_documents)),
            ):
                for _ in range(3):
                    # The same memory (so the patched store), the client's caches emptied: the
                    # read of a new process.
                    fresh = AutoContextSession.from_memory(session.memory(), compress=False)
                    AutoContextClient.shared(db.url).session_caches.clear()
                    with watch.part("get"):
                        fresh.get_items_sync()
    finally:
        sa.event.remove(engine, "before_cursor_execute", before)
        sa.event.remove(engine, "after_cursor_execute", after)

    async def hops() -> float:
        started = time.perf_counter()
        for _ in parts:
            await asyncio.to_thread(lambda: None)
        return time.perf_counter() - started

    n = len(parts)
    return {
        "convert": watch["convert"] / n,
        "validate": (watch["prepare"] - watch["count"]) / n,
        "count": watch["count"] / n,
        "sql": watch["add sql"] / n,
        "add": watch["add"] / n,
        "hop": asyncio.run(hops()) / n,
        "get": watch["get"] / 3,
        "get_ids": watch["ids"] / 3,
        "get_fetch": watch["docs"] / 3,
    }


# ---------------------------------------------------------------------------------------------
# Profiling (sync twins, in this thread, where cProfile sees them)
# ---------------------------------------------------------------------------------------------


def profile(args: argparse.Namespace, db: BenchDatabase, parts: list[list[Item]]) -> None:
    session = AutoContextSession(
        "bench-profile", db.url, summarizer=OfflineSummarizer(), compress=False
    )
    profiler = cProfile.Profile()
    session.get_items_sync()
    if args.profile == "add":
        profiler.enable()
    for batch in parts:
        session.add_items_sync(batch)
    if args.profile == "add":
        profiler.disable()
    else:
        profiler.enable()
        for _ in range(args.get_repeats):
            session.get_items_sync()
        profiler.disable()
    print_profile(
        console,
        profiler,
        f"cProfile of AutoContextSession {args.profile} (sync twin; times inflated)",
    )


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    items = ItemGenerator(args.seed).items(args.items)
    parts = batches(items, args.batch)
    chars = sum(len(json.dumps(i)) for i in items)
    console.print(
        f"generated {len(items):,} items ({chars / 1e6:,.1f} M chars of JSON) in {len(parts):,} "
        f"batches in {secs(time.perf_counter() - started)}"
    )
    with fresh_database(args.database_url, "autoctx_bench_peers") as db:
        console.print(f"database {db.name} on PostgreSQL {db.server_version}")
        raw = asyncio.run(run_sides(args, db, items, parts))
        machine = machine_description(db)
        figures = _figures(args, raw, len(items), len(parts), machine)
        figures["autoctx_split"] = split(db, parts)
        _print(figures)
        if args.profile:
            profile(args, db, parts)
    return figures


def _figures(
    args: argparse.Namespace, r: dict[str, Any], n_items: int, n_batches: int, machine: str
) -> dict[str, Any]:
    sides: dict[str, Any] = {}
    for name in SIDES:
        adds = r["adds"][name]
        sides[name] = {
            "add_total": sum(adds),
            "add_median": median(adds),
            "add_p95": percentile(adds, 95),
            "get_all": median(r["gets"][name]),
            "get_all_items": r["got"][name],
            "get_cold": median(r["cold"][name]),
            "get_empty": median(r["empty"][name]),
            "get_limit": median(r["limited"][name]),
        }
    sdk = sides["sdk"]
    return {
        "date": dt.date.today().isoformat(),
        "machine": machine,
        "items": n_items,
        "batches": n_batches,
        "batch": args.batch,
        "sides": sides,
        "compressed": r["compressed"],
        "search": r["search"],
        "ratios": {
            name: {
                "add": sdk["add_total"] / sides[name]["add_total"],
                "get_all": sdk["get_all"] / sides[name]["get_all"],
                "get_cold": sdk["get_cold"] / sides[name]["get_cold"],
                "get_empty": sdk["get_empty"] / sides[name]["get_empty"],
                "get_limit": sdk["get_limit"] / sides[name]["get_limit"],
            }
            for name in ("raw", "autoctx", "autoctx_c")
        },
    }


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.2f} ms"


def _print(f: dict[str, Any]) -> None:
    s = f["sides"]
    table = Table(
        title=(
            f"{f['items']:,} items in {f['batches']:,} add_items() calls of ~{f['batch']} "
            f"({f['machine']})"
        )
    )
    table.add_column("")
    for name in SIDES:
        table.add_column(LABELS[name], justify="right")
    rows: list[tuple[str, str, Callable[[float], str]]] = [
        ("add, total", "add_total", secs),
        ("add, median call", "add_median", _ms),
        ("add, p95 call", "add_p95", _ms),
        ("get_items(), whole history", "get_all", secs),
        ("  the same, new session object", "get_cold", secs),
        ("  the same, caches emptied", "get_empty", secs),
        (f"get_items(limit={LIMIT})", "get_limit", _ms),
    ]
    for label, key, fmt in rows:
        table.add_row(label, *(fmt(s[name][key]) for name in SIDES))
    table.add_row("items given back", *(f"{s[name]['get_all_items']:,}" for name in SIDES))
    console.print(table)

    ratios = Table(title="SDK SQLAlchemySession time / this side's time (> 1: this side is faster)")
    ratios.add_column("")
    for name in ("raw", "autoctx", "autoctx_c"):
        ratios.add_column(LABELS[name], justify="right")
    for label, key in (
        ("add", "add"),
        ("get_items()", "get_all"),
        ("get_items(), new session object", "get_cold"),
        ("  the same, caches emptied (a new process)", "get_empty"),
        (f"get_items(limit={LIMIT})", "get_limit"),
    ):
        ratios.add_row(
            label, *(f"{f['ratios'][n][key]:.2f}x" for n in ("raw", "autoctx", "autoctx_c"))
        )
    console.print(ratios)

    c = f["compressed"]
    console.print(
        f"compress on: {c['events_applied']:,} compressions applied; the working context holds "
        f"{c['working_messages']:,} messages, {c['working_tokens']:,} tokens "
        f"({s['autoctx_c']['get_all_items']:,} items) instead of {f['items']:,} items"
    )
    sp = f["autoctx_split"]
    rest = sp["add"] - sp["convert"] - sp["validate"] - sp["count"] - sp["sql"]
    console.print(
        "autoctx (compress off, sync twin on a fresh session), mean per add_items call: "
        f"{_ms(sp['add'])} = item conversion {_ms(sp['convert'])} + validation "
        f"{_ms(sp['validate'])} + token counting {_ms(sp['count'])} + the statement "
        f"{_ms(sp['sql'])} + the rest {_ms(rest)}; the async call adds a worker-thread hop of "
        f"{_ms(sp['hop'])}. A new process's get_items(): {secs(sp['get'])} = working ids "
        f"{secs(sp['get_ids'])} + content fetch (JSONB to Python) {secs(sp['get_fetch'])} + "
        f"conversion to items {secs(sp['get'] - sp['get_ids'] - sp['get_fetch'])}",
        highlight=False,
    )
    console.print(
        f"autoctx (compress off): the first search filled the vectors of {f['items']:,} items in "
        f"{secs(f['search']['first'])}; the next search took {_ms(f['search']['next'])}",
        highlight=False,
    )
    mine = f["ratios"]["autoctx"]
    add_met = mine["add"] >= 1.5
    get_met = mine["get_all"] >= 1 and mine["get_limit"] >= 1 and mine["get_cold"] >= 1
    console.print(
        f"goal add >= 1.5x faster than the SDK: {'met' if add_met else 'MISSED'} "
        f"({mine['add']:.2f}x); "
        f"goal get no slower: {'met' if get_met else 'MISSED'} "
        f"({mine['get_all']:.2f}x whole, {mine['get_cold']:.2f}x whole from a new object, "
        f"{mine['get_empty']:.2f}x from a new object with the caches emptied (not a goal), "
        f"{mine['get_limit']:.2f}x limit={LIMIT})"
    )


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    figures = run(args)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
