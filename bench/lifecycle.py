"""Fork and erasure (issue 14), each beside a raw-SQL baseline measured in the same run.

Part fork: a session of `--messages` originals (the realistic transcript generator, appended
through `mem.add`, no compression: every message is working, the largest fork there is) is
forked whole and at its middle message with `mem.fork`; the baseline copies the same rows
(session row, messages, working set) with raw psycopg `INSERT ... SELECT` in one transaction,
none of autoctx's work (lineage closure, events, offloads, the fork's checks).

Part erase: a chat of `--rounds` rounds on a small window, compressed after every round with the
offline summarizer, so that the fold stacks summaries of summaries; then one original under
the deepest chain (message 1) is erased with `mem.erase`, and one in the newest summary's
range. The baseline rewrites the same rows (the original and every summary above it) to a
tombstone with one raw `UPDATE`, without the offline summarizer's rewrite.

    python bench/lifecycle.py [--messages 100000] [--rounds 1000] [--database-url URL]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autoctx import AutoContextConfig, AutoContextMemory, Msg, OfflineSummarizer, ToolUseBlock
from autoctx._store.inspect import covering_chain
from bench._common import (
    BenchDatabase,
    TranscriptGenerator,
    add_database_argument,
    fresh_database,
    machine_description,
    ms,
    raw_connection,
    secs,
)
from tests.dbsql import sql

_SESSION_COPY = """
INSERT INTO sessions (session_id, tenant, version, message_count, token_count, model, encoding,
                      config, plan, open_calls, next_message_id, next_position, next_event_id)
SELECT %(child)s, tenant, 1, message_count, token_count, model, encoding, config, plan,
       open_calls, next_message_id, next_position, next_event_id
FROM sessions WHERE session_id = %(sid)s
"""
_MESSAGES_COPY = """
INSERT INTO messages (session_id, id, role, name, content, metadata, kind, pinned, final, tokens,
                      chars, call_ids, result_ids, tool_names, event_id, created_at)
SELECT %(child)s, id, role, name, content, metadata, kind, pinned, final, tokens, chars,
       call_ids, result_ids, tool_names, event_id, created_at
FROM messages WHERE session_id = %(sid)s
"""
_WORKING_COPY = """
INSERT INTO working_set (session_id, position, message_id)
SELECT %(child)s, position, message_id FROM working_set WHERE session_id = %(sid)s
"""


def _timed(fn: object, *args: object, **kw: object) -> float:
    started = time.perf_counter()
    fn(*args, **kw)  # type: ignore[operator]
    return time.perf_counter() - started


def bench_fork(db: BenchDatabase, n: int) -> None:
    url = db.url.render_as_string(hide_password=False)
    gen = TranscriptGenerator(7)
    mem = AutoContextMemory.open(
        "fork-parent", url, AutoContextConfig(msg_threshold=10**9), summarizer=OfflineSummarizer()
    )
    started = time.perf_counter()
    msgs = gen.messages(n)
    for k in range(0, len(msgs), 500):
        mem.add(msgs[k : k + 500])
    print(
        f"  built {mem.message_count():,} working messages in {secs(time.perf_counter() - started)}"
    )
    with raw_connection(db) as conn:
        conn.autocommit = True
        conn.execute("VACUUM ANALYZE")
    middle = mem.messages()[n // 2].id
    rows = []
    for k in range(3):
        whole = _timed(mem.fork, f"fork-whole-{k}")
        half = _timed(mem.fork, f"fork-half-{k}", at_message=middle)
        with raw_connection(db) as conn:
            started = time.perf_counter()
            with conn.transaction():
                params = {"sid": "fork-parent", "child": f"raw-{k}"}
                conn.execute(_SESSION_COPY, params)
                conn.execute(_MESSAGES_COPY, params)
                conn.execute(_WORKING_COPY, params)
            raw = time.perf_counter() - started
        rows.append((whole, half, raw))
        print(
            f"  run {k + 1}: mem.fork whole {secs(whole)}, at the middle {secs(half)}, "
            f"raw INSERT ... SELECT of the same rows {secs(raw)}"
        )
    best = [min(r[i] for r in rows) for i in range(3)]
    print(
        f"  best of 3: fork {secs(best[0])} vs raw copy {secs(best[2])} "
        f"(x{best[0] / best[2]:.2f}); fork at the middle {secs(best[1])}"
    )
    child = AutoContextMemory.open("fork-whole-0", url, create=False)
    assert child.message_count() == mem.message_count()


def _round(i: int) -> list[Msg]:
    return [
        Msg.user(f"task {i}: check module m{i}"),
        Msg.assistant(None, [ToolUseBlock(f"c{i}", "read_file", f'{{"path": "/src/m{i}.py"}}')]),
        Msg.tool(f"c{i}", "\n".join(f"{n:4d} def f{n}(x): return x + {n}" for n in range(40))),
        Msg.assistant(f"done {i}: m{i} ok"),
    ]


def _depth(mem: AutoContextMemory, message_id: int) -> int:
    """Lineage steps from the working message that stands for `message_id` down to it."""
    return len(covering_chain(mem.engine, mem.session_id, message_id))


def bench_erase(db: BenchDatabase, rounds: int) -> None:
    url = db.url.render_as_string(hide_password=False)
    config = AutoContextConfig(max_tokens=3000, msg_threshold=40, min_compress_tokens=300)
    mem = AutoContextMemory.open("erase-deep", url, config, summarizer=OfflineSummarizer())
    started = time.perf_counter()
    for i in range(rounds):
        mem.add(_round(i))
        mem.compress_if_needed()
    stored = mem._count_originals()
    print(
        f"  built {stored:,} originals, {len(mem.events())} events in "
        f"{secs(time.perf_counter() - started)}"
    )
    # The newest original a working summary replaced directly: the shallowest erasure.
    (shallow,) = sql(
        mem,
        "SELECT max(l.replaced_id) AS id FROM working_set w JOIN lineage l "
        "ON l.session_id = w.session_id AND l.summary_id = w.message_id "
        "JOIN messages m ON m.session_id = l.session_id AND m.id = l.replaced_id "
        "WHERE w.session_id = :s AND m.kind = 'original'",
        s=mem.session_id,
    )
    for label, target in (
        ("deepest (message 1)", 1),
        (f"shallowest (message {shallow.id})", shallow.id),
    ):
        depth = _depth(mem, target)
        took = time.perf_counter()
        done = mem.erase([target], reason="bench")
        took = time.perf_counter() - took
        ids = [target, *done.rewritten_ids]
        with raw_connection(db) as conn:
            started = time.perf_counter()
            with conn.transaction():
                conn.execute(
                    'UPDATE messages SET content = \'[{"type": "text", "text": "[erased]"}]\''
                    " FROM unnest(%(ids)s::bigint[]) AS u(id) "
                    "WHERE session_id = %(sid)s AND messages.id = u.id",
                    {"sid": mem.session_id, "ids": ids},
                )
            raw = time.perf_counter() - started
        print(
            f"  erase {label}: lineage depth {depth}, {len(done.rewritten_ids)} summaries "
            f"rewritten; mem.erase {ms(took)}, raw UPDATE of the same {len(ids)} rows "
            f"{ms(raw)}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--part", choices=("fork", "erase", "all"), default="all")
    add_database_argument(parser)
    args = parser.parse_args()
    with fresh_database(args.database_url, "autoctx_bench_lifecycle") as db:
        print(f"lifecycle: {machine_description(db)}")
        if args.part in ("fork", "all"):
            print(f"fork of a {args.messages:,}-message session:")
            bench_fork(db, args.messages)
        if args.part in ("erase", "all"):
            print(f"erase under a deep lineage chain ({args.rounds} rounds, folded):")
            bench_erase(db, args.rounds)


if __name__ == "__main__":
    main()
