"""Compression timings (issue 4, item 5).

(a) `compress_if_needed()` doing previews (S2, then S3) over sessions of 10k, 50k and 100k
    messages holding the same number of large payloads, and twice that many: commit included,
    offline summarizer, no LLM call. Goal: under 3 s, growing with the number of previews, not
    with the session.
(b) The apply transaction of one LLM-strategy compression (an S4 round summary), summarizer
    excluded: the replacement is written beforehand with the offline summarizer and only
    `SessionStore.apply` is timed, ~30 times per session size (1k, 10k, 100k). Goal: p50 under
    20 ms and flat across sizes. The planning snapshot (`SessionStore.snapshot`) is timed
    separately.

    python bench/compress.py                                   # embedded PostgreSQL, both parts
    python bench/compress.py --database-url postgresql://postgres@127.0.0.1:5432/postgres
    python bench/compress.py --part a --sizes 2000,5000 --previews 20   # quick iteration

Sessions are bulk-loaded with `SessionStore.append` in batches of 1,000 (through `add()` 100k
messages take minutes and are what bench/append_load.py measures); repeats of (a) run on
server-side copies of the pristine session.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import datetime as dt
import json
import random
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from _common import (
    BenchDatabase,
    Stopwatch,
    TranscriptGenerator,
    add_database_argument,
    chunks,
    fresh_database,
    machine_description,
    median,
    ms,
    patched,
    percentile,
    print_profile,
    secs,
)
from rich.console import Console
from rich.table import Table

import autoctx._compressor
from autoctx import AutoContextConfig, AutoContextMemory, Msg, OfflineSummarizer, ToolResultBlock
from autoctx._compressor import Compressor, preview
from autoctx._intake import Prepared, count_tokens, prepare
from autoctx._memory import get_engine
from autoctx._plans import PlanContext, Snapshot
from autoctx._prompts import build_request
from autoctx._store.store import Replacement, SessionStore
from autoctx._store.tables import messages, sessions, working_set
from autoctx._strategies import plan_s2, plan_s3, plan_s4
from autoctx._structure import meta_of
from autoctx._tags import offload_tag
from autoctx._tokens import TokenCounter

console = Console(width=120)
APPEND_BATCH = 1000
#: Large payloads placed in the protected tail (the last `last_keep` messages before the final
#: answer), which S3 previews after S2 has done the rest.
TAIL_PREVIEWS = 10


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_database_argument(parser)
    parser.add_argument("--part", choices=("a", "b", "all"), default="all")
    parser.add_argument("--sizes", default="10000,50000,100000", help="(a) session sizes")
    parser.add_argument(
        "--previews", type=int, default=200, help="(a) large payloads per session (then twice that)"
    )
    parser.add_argument("--repeats", type=int, default=2, help="(a) runs per session")
    parser.add_argument("--apply-sizes", default="1000,10000,100000", help="(b) session sizes")
    parser.add_argument("--applies", type=int, default=30, help="(b) applies per size")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--profile", choices=("a", "b"), help="cProfile the timed calls of a part")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    return parser.parse_args(argv)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


# ---------------------------------------------------------------------------------------------
# Loading sessions
# ---------------------------------------------------------------------------------------------


def load_session(
    engine: sa.Engine, session_id: str, prepared: Sequence[Prepared], config: AutoContextConfig
) -> SessionStore:
    counter = TokenCounter(config.model)
    store = SessionStore(engine, session_id)
    store.create_session(config=config, encoding=counter.encoding_name)
    for batch in chunks(prepared, APPEND_BATCH):
        store.append(batch)
    return store


def clone_session(engine: sa.Engine, source: str, target: str) -> None:
    """Copy a session that has never been compressed (its row, messages and working set) on the
    server: much faster than appending it again."""
    with engine.begin() as conn:
        for table in (sessions, messages, working_set):
            cols = [c for c in table.c if c.name != "session_id"]
            conn.execute(
                sa.insert(table).from_select(
                    ["session_id", *[c.name for c in cols]],
                    sa.select(sa.literal(target, sa.Text), *cols).where(
                        table.c.session_id == source
                    ),
                )
            )


def _analyze(engine: sa.Engine) -> None:
    # Fresh tables have no statistics yet; a long-lived database would have them.
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("ANALYZE"))


# ---------------------------------------------------------------------------------------------
# (a) previews
# ---------------------------------------------------------------------------------------------


def preview_session(
    filler: Sequence[Prepared], n_large: int, seed: int, counter: TokenCounter
) -> list[Prepared]:
    """The filler with `n_large` tool outputs made large (8 to 20 KB): TAIL_PREVIEWS of them in
    the last 50 messages before the final answer, the rest spread evenly before those.

    The filler ends with a finished round and a current round of three small messages, so the
    large payloads are all history. The same seed gives the same payloads at every size.
    """
    n = len(filler)
    answer = n - 4  # the latest final answer (see `filler_messages`)
    tail_start = n - 50
    tools = [i for i, p in enumerate(filler) if p.msg.role == "tool" and i < answer]
    tail = [i for i in tools if i >= tail_start][:TAIL_PREVIEWS]
    head = [i for i in tools if i < tail_start]
    wanted = n_large - len(tail)
    if wanted > len(head):
        raise SystemExit(f"a {n}-message session has only {len(head)} tool results to make large")
    chosen = [head[k * len(head) // wanted] for k in range(wanted)] + tail
    r = random.Random(seed)
    gen = TranscriptGenerator(seed)
    out = list(filler)
    for i in chosen:
        result = filler[i].msg.tool_results[0]
        big = gen.text(r.choice(("log", "code", "json")), r.randrange(8_000, 20_001))
        msg = Msg("tool", (ToolResultBlock(result.tool_use_id, big, result.name),))
        out[i] = prepare([msg], counter, max_chars=10**7, session_id="bench")[0]
    return out


def filler_messages(n: int, seed: int, large_payload_chars: int) -> list[Msg]:
    """Realistic rounds with no message over `large_payload_chars`, then a current round of a
    user question and one small tool call."""
    gen = TranscriptGenerator(seed, max_tool_chars=large_payload_chars // 2)
    msgs = gen.messages(n - 3)
    assert msgs[-1].role == "assistant" and not msgs[-1].tool_uses
    tail = gen.round(2)[0:1] + gen.step()[:2]
    call = tail[1].tool_uses[0]
    tail[1] = Msg.assistant(None, (call,))
    return msgs + tail


def s2_s3_config(
    prepared: Sequence[Prepared], base: AutoContextConfig, counter: TokenCounter
) -> tuple[AutoContextConfig, int, int]:
    """A config under which the token trigger holds, S2's previews leave the session above the
    target and S3's bring it below: so S2 then S3 do the work, in two passes, and nothing else.

    Planned here on a local snapshot (the planners are pure), with exact token counts.
    """
    metas = tuple(
        meta_of(p.msg, id=i + 1, final=p.final, tokens=p.tokens) for i, p in enumerate(prepared)
    )
    total = sum(p.tokens for p in prepared)
    snap = Snapshot("plan", 0, metas, total, len(metas))
    ctx = PlanContext(token_pressure=True)
    s2 = {e.start for e in plan_s2(snap, base, ctx)}
    s3 = {e.start for e in plan_s3(snap, base, ctx)} - s2
    dummy = uuid.UUID(int=0)

    def saving(i: int) -> int:
        msg = prepared[i].msg
        kept: int = count_tokens(preview(msg, base, dummy), counter)
        return int(prepared[i].tokens) - kept

    after_s2 = total - sum(saving(i) for i in s2)
    after_s3 = after_s2 - sum(saving(i) for i in s3)
    max_tokens = int(total / base.token_ratio)
    target_ratio = (after_s2 + after_s3) / 2 / max_tokens
    config = dataclasses.replace(
        base, max_tokens=max_tokens, token_ratio=base.token_ratio, target_ratio=target_ratio
    )
    return config, len(s2), len(s3)


def part_a(
    args: argparse.Namespace, db: BenchDatabase, profiler: cProfile.Profile | None
) -> list[dict[str, Any]]:
    # S2 is what fires: the message count never triggers, S1 finds no run long enough, and no
    # LLM call is allowed should the ladder go past S3.
    base = AutoContextConfig(msg_threshold=10**9, min_tool_run=10**6, max_llm_calls=0)
    counter = TokenCounter(base.model)
    engine = get_engine(db.url, auto_upgrade=False)
    results = []
    for n in _ints(args.sizes):
        started = time.perf_counter()
        filler = prepare(
            filler_messages(n, args.seed, base.large_payload_chars),
            counter,
            max_chars=10**7,
            session_id="bench",
        )
        for n_large in (args.previews, 2 * args.previews):
            prepared = preview_session(filler, n_large, args.seed, counter)
            config, n_s2, n_s3 = s2_s3_config(prepared, base, counter)
            sid = f"a-{n}-{n_large}"
            load_session(engine, sid, prepared, config)
            _analyze(engine)
            console.print(
                f"(a) {n:,} messages, {n_large} large ({n_s2} for S2, {n_s3} for S3): loaded in "
                f"{secs(time.perf_counter() - started)}"
            )
            for k in range(args.repeats):
                # Each repeat on its own copy of the pristine session.
                run_sid = f"{sid}-{k}"
                clone_session(engine, sid, run_sid)
                _analyze(engine)
                figures = _compress_once(db, run_sid, config, profiler)
                figures.update(messages=n, large=n_large, expected_previews=n_s2 + n_s3, run=k + 1)
                results.append(figures)
                _print_a_row(figures)
            started = time.perf_counter()
    return results


def _compress_once(
    db: BenchDatabase,
    session_id: str,
    config: AutoContextConfig,
    profiler: cProfile.Profile | None,
) -> dict[str, Any]:
    mem = AutoContextMemory.open(session_id, db.url, config, summarizer=OfflineSummarizer())
    watch = Stopwatch()
    sql = _SqlTimer(mem.engine, watch)
    with (
        patched(SessionStore, "snapshot", watch.wrap("snapshot", SessionStore.snapshot)),
        patched(SessionStore, "apply", watch.wrap("apply", SessionStore.apply)),
        patched(Compressor, "_build", watch.wrap("build", Compressor._build)),
        patched(
            autoctx._compressor,
            "plan_strategy",
            watch.wrap("plan", autoctx._compressor.plan_strategy),
        ),
        sql,
    ):
        if profiler is not None:
            profiler.enable()
        started = time.perf_counter()
        events = mem.compress_if_needed()
        total = time.perf_counter() - started
        if profiler is not None:
            profiler.disable()
    applied = [e for e in events if e.status == "applied"]
    info = mem.refresh()
    return {
        "total": total,
        "snapshot": watch["snapshot"],
        "snapshots": watch.calls.get("snapshot", 0),
        "plan": watch["plan"],
        "build": watch["build"],
        "apply": watch["apply"],
        "apply_sql": sql.apply_seconds,
        "other": total - watch["snapshot"] - watch["plan"] - watch["build"] - watch["apply"],
        "previews": len(applied),
        "strategies": sorted({e.strategy for e in applied}),
        "under_target": info.token_count < config.token_target,
    }


class _SqlTimer:
    """Time spent executing statements inside `SessionStore.apply` (its SQL and commit), to tell the
    database's share of an apply from SQLAlchemy's and autoctx's Python."""

    def __init__(self, engine: sa.Engine, watch: Stopwatch) -> None:
        self.engine = engine
        self.watch = watch
        self.apply_seconds = 0.0
        self._in_apply = False

    def _before(self, conn: Any, *args: Any) -> None:
        conn.info["bench_started"] = time.perf_counter()

    def _after(self, conn: Any, *args: Any) -> None:
        started = conn.info.pop("bench_started", None)
        if started is not None and self._in_apply:
            self.apply_seconds += time.perf_counter() - started

    def __enter__(self) -> _SqlTimer:
        sa.event.listen(self.engine, "before_cursor_execute", self._before)
        sa.event.listen(self.engine, "after_cursor_execute", self._after)
        self._apply = SessionStore.apply
        self._commit = self.engine.dialect.do_commit
        timer = self

        def apply(store: SessionStore, *args: Any, **kwargs: Any) -> Any:
            timer._in_apply = True
            try:
                return timer._apply(store, *args, **kwargs)
            finally:
                timer._in_apply = False

        def do_commit(dbapi_conn: Any) -> None:
            started = time.perf_counter()
            try:
                timer._commit(dbapi_conn)
            finally:
                if timer._in_apply:
                    timer.apply_seconds += time.perf_counter() - started

        # setattr: mypy rightly refuses assigning to methods; here it is the point.
        setattr(SessionStore, "apply", apply)  # noqa: B010
        setattr(self.engine.dialect, "do_commit", do_commit)  # noqa: B010
        return self

    def __exit__(self, *exc: object) -> None:
        setattr(SessionStore, "apply", self._apply)  # noqa: B010
        setattr(self.engine.dialect, "do_commit", self._commit)  # noqa: B010
        sa.event.remove(self.engine, "before_cursor_execute", self._before)
        sa.event.remove(self.engine, "after_cursor_execute", self._after)


def _print_a_row(f: dict[str, Any]) -> None:
    console.print(
        f"    run {f['run']}: total {secs(f['total'])} = snapshot "
        f"{secs(f['snapshot'])} ({f['snapshots']}x) + plan {secs(f['plan'])} + build "
        f"{secs(f['build'])} + apply {secs(f['apply'])} (SQL+commit {secs(f['apply_sql'])}) "
        f"+ other {secs(f['other'])}; "
        f"{f['previews']} previews by S{f['strategies']}, under target: {f['under_target']}"
    )


# ---------------------------------------------------------------------------------------------
# (b) one LLM compression's apply
# ---------------------------------------------------------------------------------------------


@dataclass
class _ApplyRun:
    session_id: str
    applies: list[float] = field(default_factory=list)
    apply_sql: list[float] = field(default_factory=list)
    snapshots: list[float] = field(default_factory=list)
    replaced: list[int] = field(default_factory=list)


def part_b(
    args: argparse.Namespace, db: BenchDatabase, profiler: cProfile.Profile | None
) -> list[dict[str, Any]]:
    config = AutoContextConfig()
    counter = TokenCounter(config.model)
    engine = get_engine(db.url, auto_upgrade=False)
    summarizer = OfflineSummarizer()
    results = []
    for n in _ints(args.apply_sizes):
        started = time.perf_counter()
        msgs = TranscriptGenerator(args.seed + n).messages(n)
        sid = f"b-{n}"
        store = load_session(
            engine, sid, prepare(msgs, counter, max_chars=10**7, session_id=sid), config
        )
        console.print(f"(b) {n:,} messages loaded in {secs(time.perf_counter() - started)}")
        _analyze(engine)
        run = _ApplyRun(sid)
        with _SqlTimer(engine, Stopwatch()) as sql:
            for j in range(args.applies):
                t0 = time.perf_counter()
                snap = store.snapshot()
                run.snapshots.append(time.perf_counter() - t0)
                # Every previous round with something to fold in (no token floor): spread the
                # applies over the session, not always the oldest round.
                edits = plan_s4(snap, config, PlanContext(token_pressure=False))
                if not edits:
                    raise SystemExit(f"{run.session_id}: no round left after {j} applies")
                edit = edits[(j * 7919) % len(edits)]
                replacement = _round_summary(store, edit, summarizer, counter)
                before = sql.apply_seconds
                if profiler is not None:
                    profiler.enable()
                t0 = time.perf_counter()
                outcome = store.apply([replacement], reason="tokens", config=config.to_json())
                elapsed = time.perf_counter() - t0
                if profiler is not None:
                    profiler.disable()
                run.applies.append(elapsed)
                run.apply_sql.append(sql.apply_seconds - before)
                if outcome.conflict or outcome.events[0].status != "applied":
                    raise SystemExit(f"apply {j} on {run.session_id} did not apply: {outcome}")
                run.replaced.append(len(edit.replaced_ids))
        figures: dict[str, Any] = {
            "messages": n,
            "applies": run.applies,
            "apply_p50": median(run.applies),
            "apply_p95": percentile(run.applies, 95),
            "apply_sql_p50": median(run.apply_sql),
            "snapshot_p50": median(run.snapshots),
            "snapshot_p95": percentile(run.snapshots, 95),
            "replaced_median": median([float(x) for x in run.replaced]),
            "replaced_max": max(run.replaced),
        }
        results.append(figures)
        console.print(
            f"    apply p50 {ms(figures['apply_p50'])} "
            f"(SQL+commit {ms(figures['apply_sql_p50'])}), p95 {ms(figures['apply_p95'])}; "
            f"snapshot p50 {ms(figures['snapshot_p50'])}; replaced messages median "
            f"{figures['replaced_median']:.0f}, max {figures['replaced_max']}"
        )
    return results


def _round_summary(
    store: SessionStore, edit: Any, summarizer: OfflineSummarizer, counter: TokenCounter
) -> Replacement:
    """What the compressor would hand to `SessionStore.apply` for an S4 edit, summary written
    offline."""
    originals = store.load_messages(edit.replaced_ids)
    result = summarizer.summarize(build_request(4, [originals[i] for i in edit.replaced_ids]))
    offload = uuid.uuid4()
    msg = Msg.assistant(f"{result.text.strip()}\n{offload_tag(str(offload))}", kind="round_summary")
    new = Prepared(msg, count_tokens(msg, counter), msg.payload_chars, True)
    return Replacement(edit, new, offload, model=result.model, latency_ms=result.latency_ms)


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------


def _table_a(rows: list[dict[str, Any]], machine: str) -> Table:
    table = Table(title=f"(a) compress_if_needed(), S2 then S3, commit included ({machine})")
    for col in (
        "messages",
        "large",
        "run",
        "total",
        "snapshot",
        "plan",
        "build",
        "apply",
        "apply SQL",
        "previews",
    ):
        table.add_column(col, justify="right")
    for f in rows:
        table.add_row(
            f"{f['messages']:,}",
            str(f["large"]),
            str(f["run"]),
            secs(f["total"]),
            f"{secs(f['snapshot'])} ({f['snapshots']}x)",
            secs(f["plan"]),
            secs(f["build"]),
            secs(f["apply"]),
            secs(f["apply_sql"]),
            f"{f['previews']}/{f['expected_previews']}",
        )
    return table


def _table_b(rows: list[dict[str, Any]], machine: str) -> Table:
    table = Table(
        title=f"(b) SessionStore.apply of one S4 round summary, summarizer excluded ({machine})"
    )
    for col in (
        "messages",
        "applies",
        "p50",
        "p95",
        "SQL+commit p50",
        "snapshot p50",
        "replaced (median)",
    ):
        table.add_column(col, justify="right")
    for f in rows:
        table.add_row(
            f"{f['messages']:,}",
            str(len(f["applies"])),
            ms(f["apply_p50"]),
            ms(f["apply_p95"]),
            ms(f["apply_sql_p50"]),
            ms(f["snapshot_p50"]),
            f"{f['replaced_median']:.0f}",
        )
    return table


def run(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"date": dt.date.today().isoformat()}
    profiler = cProfile.Profile() if args.profile else None
    with fresh_database(args.database_url, "autoctx_bench_compress") as db:
        machine = machine_description(db)
        out["machine"] = machine
        console.print(f"database {db.name}, {machine}")
        steps: list[tuple[str, Callable[..., list[dict[str, Any]]]]] = []
        if args.part in ("a", "all"):
            steps.append(("a", part_a))
        if args.part in ("b", "all"):
            steps.append(("b", part_b))
        for name, step in steps:
            out[name] = step(args, db, profiler if args.profile == name else None)
    if "a" in out:
        console.print(_table_a(out["a"], machine))
        worst = max(f["total"] for f in out["a"])
        console.print(
            f"(a) slowest compress_if_needed(): {secs(worst)} "
            f"(goal < 3 s: {'met' if worst < 3 else 'MISSED'})"
        )
    if "b" in out:
        console.print(_table_b(out["b"], machine))
        worst = max(f["apply_p50"] for f in out["b"])
        console.print(
            f"(b) highest apply p50: {ms(worst)} "
            f"(goal < 20 ms: {'met' if worst < 0.020 else 'MISSED'})"
        )
    if profiler is not None:
        print_profile(console, profiler, f"cProfile of part ({args.profile})'s timed calls")
    return out


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    figures = run(args)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2, default=str))


if __name__ == "__main__":
    main()
