"""The audit console's page times on 100,000-message sessions (issue 23, item 1).

    python bench/console.py                          # embedded PostgreSQL
    python bench/console.py --database-url postgresql://postgres@127.0.0.1:5432/postgres
    python bench/console.py --messages 20000 --repeats 3     # quick

Two sessions are built through the library's bulk path (`mem.add` with lists of
`--batch` messages): `raw`, `--messages` originals all in the working context (a window large
enough that nothing compresses), and `compressed`, the same number of originals with
`compress_if_needed()` after every batch (the offline summarizer, a 32,000-token window), so that
it holds a long event history, offloads and lineage. Then `autoctx ui`'s server (the console's
own `make_server`, in this process, on 127.0.0.1) answers each page `--repeats` times over HTTP,
on one kept-alive connection as a browser asks; the median is printed beside two baselines: the
same page's SQL (the statements the console sent for that very page, recorded from its answer,
same parameters) sent with raw psycopg 3 on one open connection in one transaction, one statement
after another (the goal's baseline), and the same statements in one round trip (psycopg's
pipeline mode, as the console sends them), median of as many runs each. The difference is the
console's own cost: the pool, the tenant scope, building the objects, rendering the page and
HTTP. EXPLAIN of each page's main statement is checked for sequential scans of the session
tables.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any
from urllib.parse import quote

import psycopg
import psycopg.sql
from _common import (
    BenchDatabase,
    add_database_argument,
    admin_url,
    fresh_database,
    machine_description,
    median,
    psycopg_conninfo,
    raw_connection,
    secs,
)
from rich.console import Console
from rich.table import Table

from autoctx import AutoContextClient, AutoContextConfig, AutoContextMemory, Msg, OfflineSummarizer
from autoctx._search import websearch_text
from autoctx._store import console as db
from autoctx._store import search as search_store
from autoctx._store.store import SessionStore
from autoctx._ui.app import SEARCH_LIMIT
from autoctx._ui.server import make_server

console = Console(width=150)
SCOPE = "s.tenant IS NULL"
WORDS = [
    "build",
    "deploy",
    "test",
    "failing",
    "passing",
    "value",
    "path",
    "branch",
    "commit",
    "schema",
    "table",
    "column",
    "migration",
    "endpoint",
    "response",
    "latency",
    "error",
    "warning",
    "missing",
    "expected",
    "found",
    "update",
    "install",
    "package",
]


def _message(k: int) -> list[Msg]:
    """A short agent step: a user line, an assistant line, every 10th a tool call and result."""
    w = WORDS[k % len(WORDS)]
    if k % 10 == 9:
        call = {"id": f"c{k}", "type": "function", "function": {"name": "grep", "arguments": "{}"}}
        return [
            Msg.from_openai({"role": "assistant", "content": None, "tool_calls": [call]}),
            Msg.from_openai({"role": "tool", "tool_call_id": f"c{k}", "content": f"{w} ok {k}"}),
        ]
    role = "user" if k % 2 == 0 else "assistant"
    return [
        Msg.from_openai({"role": role, "content": f"step {k}: {w} {WORDS[k * 7 % len(WORDS)]} {k}"})
    ]


def build(
    url: Any, sid: str, total: int, batch: int, config: AutoContextConfig, compress: bool
) -> float:
    mem = AutoContextMemory.open(sid, url, config, summarizer=OfflineSummarizer())
    started = time.perf_counter()
    mem.add([Msg.system("You are a coding agent.")])
    k = 0
    while k < total:
        msgs: list[Msg] = []
        while len(msgs) < batch and k < total:
            msgs += _message(k)
            k += 1
        mem.add(msgs)
        if compress:
            mem.compress_if_needed()
    return time.perf_counter() - started


def build_fleet(url: Any, tenant: str, sessions: int) -> float:
    """`sessions` short sessions of one tenant: 4 to 40 steps each, every 7th over a small
    window so that it compresses, every 11th with a failed attempt recorded, so that the
    session list's orders (window, cost, failures) have something to rank."""
    small = AutoContextConfig(max_tokens=2_000)
    started = time.perf_counter()
    client = AutoContextClient.shared(url, auto_upgrade=False)
    for n in range(sessions):
        config = small if n % 7 == 0 else AutoContextConfig(max_tokens=64_000)
        mem = client.open(
            f"{tenant}-{n:04d}", config=config, tenant=tenant, summarizer=OfflineSummarizer()
        )
        msgs = [Msg.system("You are a coding agent.")]
        for k in range(4 + n % 37):
            msgs += _message(n * 100 + k)
        mem.add(msgs)
        if n % 7 == 0:
            mem.compress_if_needed()
        if n % 11 == 0:
            SessionStore(client.engine, mem.session_id, tenant=tenant).record_event(
                strategy=4,
                status="failed",
                reason="tokens",
                error="http_error: HTTP 503",
                config=config.to_json(),
                model="gpt-test",
                prompt_tokens=1_000 + n,
                completion_tokens=0,
                latency_ms=10.0,
            )
        mem.close()
    return time.perf_counter() - started


def timed(fns: Sequence[Callable[[], Any]], repeats: int) -> list[float]:
    """The median time of each of `fns`, run in turns (one warm-up each first: the first
    request opens the pool and parses the templates), the order rotating from turn to turn so
    that a noisy neighbour on the machine slows every side alike."""
    for fn in fns:
        fn()
    runs: list[list[float]] = [[] for _ in fns]
    for turn in range(repeats):
        for k in range(len(fns)):
            which = (k + turn) % len(fns)
            started = time.perf_counter()
            fns[which]()
            runs[which].append(time.perf_counter() - started)
    return [median(r) for r in runs]


def fetch(server: http.client.HTTPConnection, path: str, cookie: str) -> Callable[[], int]:
    """A GET of `path` on one kept-alive connection, as a browser asks for a site's pages."""

    def get() -> int:
        try:
            server.request("GET", path, headers={"Cookie": cookie})
            answer = server.getresponse()
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
            # The console closes a connection idle for 30 s (a slow page's raw runs in
            # between): a browser opens another, and so does this.
            server.close()
            server.request("GET", path, headers={"Cookie": cookie})
            answer = server.getresponse()
        body = answer.read()
        assert answer.status == 200, path
        return len(body)

    return get


def raw(conn: psycopg.Connection[Any], statements: Statements) -> Callable[[], None]:
    """The statements one after another in one transaction, as psycopg sends them unasked."""

    def run() -> None:
        with conn.transaction():
            for sql, params in statements:
                conn.execute(sql, params).fetchall()

    return run


def pipelined(conn: psycopg.Connection[Any], statements: Statements) -> Callable[[], None]:
    """The same statements in one transaction in one round trip (psycopg's pipeline mode), as
    the console sends a page's."""

    def run() -> None:
        with conn.pipeline(), conn.transaction():
            cursors = [conn.execute(sql, params) for sql, params in statements]
        for cursor in cursors:
            cursor.fetchall()

    return run


@contextlib.contextmanager
def recording() -> Iterator[Statements]:
    """The statements of the console's page reads (`autoctx._store.console.read`, which every
    page but the search sends its SQL through) while the block runs, in order."""
    sent: Statements = []
    read = db.read

    def record(store: Any, *reads: db.Read[Any]) -> list[Any]:
        sent.extend((r.sql, dict(r.params)) for r in reads)
        return read(store, *reads)

    db.read = record
    try:
        yield sent
    finally:
        db.read = read


def seq_scans(conn: psycopg.Connection[Any], sql: str, params: dict[str, Any]) -> str:
    plan = "\n".join(r[0] for r in conn.execute("EXPLAIN " + sql, params).fetchall())
    found = [
        t
        for t in ("messages", "working_set", "compression_events", "lineage", "offloads")
        if f"Seq Scan on {t}" in plan
    ]
    return ", ".join(found) or "none"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_database_argument(parser)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=2_000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--sessions", type=int, default=1_000, help="Sessions of the fleet tenant.")
    parser.add_argument("--json", default=None, help="Write the figures to this file.")
    parser.add_argument(
        "--built",
        default=None,
        metavar="NAME",
        help="Keep the built sessions in database NAME (built there on the first run, left for "
        "the next) and measure on a server-side copy of it: runs of several checkouts then "
        "measure the same rows, each on a pristine copy (search vectors still waiting).",
    )
    args = parser.parse_args(argv)
    if args.built is None:
        with fresh_database(args.database_url, "autoctx_bench_console") as bdb:
            build_all(bdb, args)
            run(bdb, args)
        return
    admin = admin_url(args.database_url)
    shape = f"console.py --messages {args.messages} --batch {args.batch} --sessions {args.sessions}"
    if built_shape(admin, args.built) is None:
        with fresh_database(args.database_url, "autoctx_bench_console_build") as bdb:
            build_all(bdb, args)
            AutoContextClient.close_shared()
            copy_database(admin, bdb.name, args.built, comment=shape)
    elif built_shape(admin, args.built) != shape:
        raise SystemExit(
            f"database {args.built!r} holds {built_shape(admin, args.built)!r}, not {shape!r}"
        )
    with fresh_database(args.database_url, "autoctx_bench_console", template=args.built) as bdb:
        console.print(f"measuring on a copy of {args.built!r} ({shape})")
        run(bdb, args)


def built_shape(admin: Any, name: str) -> str | None:
    """The arguments database `name` was built with (its comment), None if it does not exist."""
    with psycopg.connect(psycopg_conninfo(admin), autocommit=True) as conn:
        found = conn.execute(
            "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = %s",
            (name,),
        ).fetchone()
    return None if found is None else str(found[0] or "")


def copy_database(admin: Any, source: str, name: str, *, comment: str) -> None:
    with psycopg.connect(psycopg_conninfo(admin), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{source}"')
        conn.execute(f'COMMENT ON DATABASE "{name}" IS {psycopg.sql.quote(comment)}')


def build_all(bdb: BenchDatabase, args: argparse.Namespace) -> None:
    console.print(f"[bold]console.py[/bold]: {machine_description(bdb)}")
    big = AutoContextConfig(max_tokens=100_000_000)
    bounded = AutoContextConfig(max_tokens=32_000)
    took = build(bdb.url, "raw", args.messages, args.batch, big, compress=False)
    console.print(f"built raw ({args.messages:,} originals, all working) in {secs(took)}")
    took = build(bdb.url, "compressed", args.messages, args.batch, bounded, compress=True)
    console.print(f"built compressed ({args.messages:,} originals) in {secs(took)}")
    took = build_fleet(bdb.url, FLEET, args.sessions)
    console.print(f"built tenant {FLEET!r} ({args.sessions:,} sessions) in {secs(took)}")
    with raw_connection(bdb) as conn:
        conn.autocommit = True
        conn.execute("VACUUM ANALYZE")


def run(bdb: BenchDatabase, args: argparse.Namespace) -> None:
    if args.built is not None:
        console.print(f"[bold]console.py[/bold]: {machine_description(bdb)}")
    with raw_connection(bdb) as conn:
        ev = conn.execute(
            "SELECT count(*), max(id) FROM compression_events WHERE session_id = 'compressed'"
        ).fetchone()
        assert ev is not None
        n_events, last_event = int(ev[0]), int(ev[1])
        w = conn.execute(
            "SELECT count(*), min(position), max(position) FROM working_set "
            "WHERE session_id = 'raw'"
        ).fetchone()
        assert w is not None
        n_working, last_pos = int(w[0]), int(w[2])
        middle = conn.execute(
            "SELECT position FROM working_set WHERE session_id = 'raw' ORDER BY position "
            "OFFSET %s LIMIT 1",
            (n_working // 2,),
        ).fetchone()
        assert middle is not None
        big_summary = conn.execute(
            "SELECT summary_id, count(*) FROM lineage WHERE session_id = 'compressed' "
            "GROUP BY summary_id ORDER BY count(*) DESC LIMIT 1"
        ).fetchone()
        assert big_summary is not None
        offload = conn.execute(
            "SELECT uuid, message_ids FROM offloads WHERE session_id = 'compressed' "
            "ORDER BY cardinality(message_ids) DESC LIMIT 1"
        ).fetchone()
        assert offload is not None
        # The latest offload: the one with the deepest history behind it.
        deep = conn.execute(
            "SELECT uuid FROM offloads WHERE session_id = 'compressed' "
            "ORDER BY event_id DESC LIMIT 1"
        ).fetchone()
        assert deep is not None
        n_behind = conn.execute(
            db._ORIGINALS.format(named="o.uuid = %(ref)s", scope=SCOPE)
            .replace(
                "SELECT m.id, m.role, m.name, m.content, m.metadata, m.kind, m.pinned, m.tokens",
                "SELECT count(*)",
            )
            .replace("ORDER BY m.id\n", ""),
            {"sid": "compressed", "ref": deep[0], "after": 0, "limit": 10**9, "tenant": None},
        ).fetchone()[0]
        counts = conn.execute(
            "SELECT (SELECT count(*) FROM messages), (SELECT count(*) FROM lineage), "
            "(SELECT count(*) FROM offloads)"
        ).fetchone()
    console.print(
        f"{counts[0]:,} stored messages, {n_events:,} events of `compressed`, {counts[1]:,} "
        f"lineage rows, {counts[2]:,} offloads; `raw` has {n_working:,} working messages"
    )

    figures: list[dict[str, Any]] = []
    engine = AutoContextClient.shared(bdb.url, auto_upgrade=False).engine
    with served(engine, None) as (base, cookie):
        summary_id = int(big_summary[0])
        pages: list[Page] = [
            ("timeline of `raw`", "/s/raw", None),
            ("timeline of `compressed`", "/s/compressed", None),
            ("events, first page", "/s/compressed/events", None),
            ("events, last page", f"/s/compressed/events?before={last_event + 1}", None),
            ("working context, first page (raw)", "/s/raw/working", None),
            ("working context, middle page (raw)", f"/s/raw/working?after={middle[0]}", None),
            ("working context, last page (raw)", f"/s/raw/working?before={last_pos + 1}", None),
            (
                f"message + lineage ({big_summary[1]:,} replaced)",
                f"/s/compressed/m/{summary_id}",
                None,
            ),
            (
                f"offload, first page ({len(offload[1]):,} messages)",
                f"/s/compressed/o/{offload[0]}",
                None,
            ),
            (
                f"offload, originals behind it, first page ({n_behind:,})",
                f"/s/compressed/o/{deep[0]}?view=originals",
                None,
            ),
        ]
        figures += measure(f"{args.messages:,}-message sessions", pages, base, cookie, bdb, args)
        word = WORDS[3]
        figures += measure(
            "search, vectors still waiting (no worker has run)",
            [search_page(word, None)],
            base,
            cookie,
            bdb,
            args,
        )
        # What `autoctx worker` does whenever no session is due: one batch per transaction
        # until none is waiting (not the worker itself: `raw` is due by its message count,
        # and compressing it is not what is measured here).
        started, filled = time.perf_counter(), 0
        while (done := search_store.fill_waiting_vectors(engine)) > 0:
            filled += done
        console.print(
            f"the worker's fill: {filled:,} vectors in {secs(time.perf_counter() - started)}"
        )
        figures += measure(
            "search, after the worker filled the vectors",
            [search_page(word, None)],
            base,
            cookie,
            bdb,
            args,
        )
    with served(engine, FLEET) as (base, cookie):
        with raw_connection(bdb) as conn:
            order = [
                r[0]
                for r in conn.execute(
                    db.sessions_sql(FLEET, "window", after=None, before=None),
                    {"tenant": FLEET, "limit": 10**6, "cursor": None},
                )
            ]
        middle, last = order[len(order) // 2], order[-1]

        def fleet_page(
            name: str, sort: db.SessionSort, after: str | None, before: str | None
        ) -> Page:
            path = f"/?sort={sort}" + (
                f"&after={quote(after)}" if after else f"&before={quote(before)}" if before else ""
            )
            return (name, path, None)

        fleet = [
            fleet_page("sessions, first page (nearest the window)", "window", None, None),
            fleet_page("sessions, middle page (after a cursor)", "window", middle, None),
            fleet_page("sessions, last page (before a cursor)", "window", None, last),
            fleet_page("sessions, most expensive", "cost", None, None),
            fleet_page("sessions, most failures", "failures", None, None),
            fleet_page("sessions, recently updated", "updated", None, None),
            search_page(WORDS[5], FLEET),
        ]
        figures += measure(
            f"a tenant of {args.sessions:,} sessions", fleet, base, cookie, bdb, args
        )
    over = [f for f in figures if f["ratio"] > GOAL]
    console.print(
        f"goal: every page at most {GOAL}x its SQL sent raw; "
        + (f"{len(over)} over: " + ", ".join(f["page"] for f in over) if over else "all met")
    )
    if args.json:
        with open(args.json, "w") as out:
            json.dump(figures, out, indent=2)


Statements = list[tuple[str, dict[str, Any]]]
#: A page: its name, its path, and its statements (None: the ones the console sends for it,
#: recorded from its own answer).
Page = tuple[str, str, Statements | None]
#: The issue's goal: a page costs at most this much more than its SQL alone.
GOAL = 1.5
FLEET = "fleet"


@contextlib.contextmanager
def served(engine: Any, tenant: str | None) -> Iterator[tuple[str, str]]:
    """The console's own server for `tenant` in a thread: its address (host:port) and the
    token's cookie (what a browser holds after opening the printed URL)."""
    server = make_server(engine, tenant, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield (
            f"127.0.0.1:{server.server_address[1]}",
            f"{server.access.cookie}={server.access.token}",
        )
    finally:
        server.shutdown()
        server.server_close()


def search_page(word: str, tenant: str | None) -> Page:
    """The console's tenant-wide search page and the statements `search_tenant` sends for it
    (in a READ ONLY transaction it fills nothing: the settings, the configurations, the query
    check, the hits)."""
    scope = "s.tenant = %(tenant)s" if tenant is not None else "s.tenant IS NULL"
    params = {
        "tenant": tenant,
        "query": websearch_text(word),
        "limit": SEARCH_LIMIT,
        "options": search_store.HEADLINE_OPTIONS,
        "table": "messages",
    }
    where = f"m.session_id IN (SELECT s.session_id FROM sessions s WHERE {scope})"
    return (
        f"search {word!r} (tenant-wide)",
        f"/search?q={quote(word)}",
        [
            (search_store._SETTINGS, params),
            (f"SELECT DISTINCT {search_store._CONFIG_OF} FROM sessions s WHERE {scope}", params),
            ("SELECT websearch_to_tsquery('simple', %(query)s)", params),
            (search_store._search_sql(["simple"], where), params),
        ],
    )


def measure(
    title: str,
    pages: Sequence[Page],
    base: str,
    cookie: str,
    bdb: BenchDatabase,
    args: argparse.Namespace,
) -> list[dict[str, Any]]:
    """Each page over HTTP and its statements sent raw, median of `--repeats` after a warm-up
    each, printed as a table with the ratio; the figures."""
    table = Table(
        title=f"{title}: console pages, median of {args.repeats} in turns (after one warm-up)"
    )
    for col in (
        "page",
        "console (HTTP)",
        "raw SQL (psycopg)",
        "ratio",
        "raw SQL, one round trip",
        "ratio",
        "bytes",
        "seq scans",
    ):
        table.add_column(col, justify="left" if col in ("page", "seq scans") else "right")
    figures = []
    server = http.client.HTTPConnection(base, timeout=120)
    with raw_connection(bdb) as conn:
        conn.execute("SET jit = off")  # as the console's transactions run
        conn.commit()
        for name, path, given in pages:
            with recording() as sent:
                size = fetch(server, path, cookie)()
            statements = given if given is not None else sent
            assert statements, path
            page_s, sql_s, one_s = timed(
                [
                    fetch(server, path, cookie),
                    raw(conn, statements),
                    pipelined(conn, statements),
                ],
                args.repeats,
            )
            main_sql, main_params = statements[-1] if len(statements) == 1 else statements[1]
            scans = seq_scans(conn, main_sql, main_params)
            conn.rollback()
            ratio, one_ratio = page_s / sql_s, page_s / one_s
            table.add_row(
                name,
                f"{page_s * 1000:,.1f} ms",
                f"{sql_s * 1000:,.1f} ms",
                f"{ratio:.2f}x",
                f"{one_s * 1000:,.1f} ms",
                f"{one_ratio:.2f}x",
                f"{size:,}",
                scans,
            )
            figures.append(
                {
                    "set": title,
                    "page": name,
                    "path": path,
                    "statements": len(statements),
                    "console_s": page_s,
                    "sql_s": sql_s,
                    "ratio": ratio,
                    "sql_one_round_trip_s": one_s,
                    "ratio_one_round_trip": one_ratio,
                    "bytes": size,
                    "seq_scans": scans,
                }
            )
    server.close()
    console.print(table)
    return figures


if __name__ == "__main__":
    main()
