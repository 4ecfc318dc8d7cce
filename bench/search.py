"""Search over a 1,000,000-message tenant: `mem.search` against a plain ILIKE scan of the same
rows, in the same run (issue 14, item 1).

    python bench/search.py                                  # embedded PostgreSQL
    python bench/search.py --database-url postgresql://postgres@127.0.0.1:5432/postgres
    python bench/search.py --sessions 100 --messages-per-session 200 --repeats 5   # quick

The data is generated in SQL (`generate_series`, no `add()` per message): `--sessions` sessions
(1,000) of tenant `bench` with `--messages-per-session` originals each (1,000), plus
`--noise-sessions` sessions (100) of another tenant with the same vocabulary, which a search of
`bench` must read past. Each message holds 10 to 60 words drawn with a skew from a vocabulary of
about 5,000 (agent words first, then terms `t0001`..`t4999`, rarer as they go), a path
`/srv/app/<module>/<function>_<n>.py` in 30% of them and a unique request id `req-<hex>` in 20%;
a third are user messages, a third assistant answers, a third tool outputs. In every `bench`
session the oldest 80% of the originals are offloaded under eight round summaries (events,
offloads and lineage as a compression writes them), and the rest is the working context, so a
hit's reload location is looked up as in production. The GIN index is dropped for the load and
built again from its own definition afterwards, then the tables are vacuumed and analysed.

Measured, each query `--repeats` times, the two sides interleaved:

- `mem.search(query, scope="tenant")` of a memory of one `bench` session, connected as the
  tables' owner (application tenancy): the GIN index, ranking, ts_headline snippets of the ten
  best, and each hit's reload location;
- the baseline: `content::text ILIKE '%word%'` over the same tenant's originals, newest ten
  first (ILIKE cannot rank), planner settings as `mem.search` has them (no JIT);
- scope "session" on one session, both ways;
- the same tenant search by a database role granted `bench` (database tenancy: row-level
  security keeps PostgreSQL from using the GIN index for `@@`, see docs/scaling.md);
- a fan-out: the same ranked query over a copy of the vectors hash-partitioned by session_id
  into `--shards` partitions (the single-node picture of a tenant search on Citus, where
  sessions are distributed by session_id), against the one index;
- with `--compare-plain-gin`, both scopes again with a plain `gin (search_tsv)` index instead of
  `gin (session_id, search_tsv)`.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import secrets
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
import sqlalchemy as sa
from _common import (
    BenchDatabase,
    add_database_argument,
    fresh_database,
    machine_description,
    median,
    percentile,
    raw_connection,
    secs,
)
from psycopg import sql as psql
from rich.console import Console
from rich.table import Table

import autoctx
from autoctx import AutoContextClient, AutoContextConfig, AutoContextMemory, OfflineSummarizer

console = Console(width=140)

TENANT = "bench"
NOISE = "noise"
_AGENT_WORDS = tuple(
    " ".join(
        (
            "the request config service cache worker retry timeout index module handler queue",
            "token user session build deploy test failing passing value path branch commit",
            "schema table column migration endpoint response latency error warning missing",
            "expected found update install package version release header payload client",
            "server socket port status check result output input file directory function",
            "class method argument default option flag",
        )
    ).split(" ")
)
_MODULES = ("core", "api", "db", "auth", "utils", "models", "views", "tasks", "cli", "io")
_FUNCS = ("load", "save", "parse", "render", "fetch", "apply", "merge", "close", "open", "run")
VOCABULARY = (*_AGENT_WORDS, *(f"t{n:04d}" for n in range(1, 5000)))

#: One message's text, from the outer row's `s` (session number) and `i` (message id): the
#: subquery refers to them, so PostgreSQL draws new words for every row.
_TEXT = """
array_to_string(ARRAY(
    SELECT (%(vocab)s::text[])[1 + floor(%(nvocab)s * power(random(), 3))::int]
    FROM generate_series(1, 10 + (i * 7 + s) %% 51)
), ' ')
|| CASE WHEN random() < 0.3 THEN ' /srv/app/' || (%(modules)s::text[])[1 + (i %% 10)] || '/'
        || (%(funcs)s::text[])[1 + ((i / 10) %% 10)] || '_' || (floor(random() * 1000))::int
        || '.py' ELSE '' END
|| CASE WHEN random() < 0.2 THEN ' req-' || substr(md5(s || ':' || i), 1, 10) ELSE '' END
"""


def _sid(tenant: str) -> str:
    return f"'{tenant}-' || lpad(s::text, 5, '0')"


def load(conn: psycopg.Connection[Any], args: argparse.Namespace) -> dict[str, float]:
    """Generate the sessions in SQL; returns the seconds each step took."""
    m, n_offloads = args.messages_per_session, 8
    chunk = max(1, m // 10)
    offloaded = chunk * n_offloads
    config = json.dumps(AutoContextConfig().to_json())
    params = {
        "vocab": list(VOCABULARY),
        "nvocab": len(VOCABULARY),
        "modules": list(_MODULES),
        "funcs": list(_FUNCS),
        "config": config,
        "m": m,
        "chunk": chunk,
        "offloaded": offloaded,
    }
    took: dict[str, float] = {}
    index = conn.execute("SELECT pg_get_indexdef('messages_search_idx'::regclass)").fetchone()
    assert index is not None
    conn.execute("DROP INDEX messages_search_idx")
    started = time.perf_counter()
    for tenant, count in ((TENANT, args.sessions), (NOISE, args.noise_sessions)):
        if not count:
            continue
        summaries = n_offloads if tenant == TENANT else 0
        conn.execute(
            f"""
            INSERT INTO sessions (session_id, tenant, model, encoding, config, version,
                                  message_count, token_count, next_message_id, next_position,
                                  next_event_id)
            SELECT {_sid(tenant)}, %(tenant)s, 'gpt-4o', 'o200k_base', %(config)s::jsonb, 1,
                   %(working)s::int, %(working)s::int * 50, %(m)s::int + %(summaries)s::int + 1,
                   %(m)s::int + %(summaries)s::int + 1, %(summaries)s::int + 1
            FROM generate_series(1, %(count)s::int) s
            """,
            {
                **params,
                "tenant": tenant,
                "count": count,
                "summaries": summaries,
                "working": m - (offloaded if summaries else 0) + summaries,
            },
        )
        step = 50
        for first in range(1, count + 1, step):
            last = min(count, first + step - 1)
            conn.execute(
                f"""
                INSERT INTO messages (session_id, id, role, content, kind, tokens, chars,
                                      created_at)
                SELECT {_sid(tenant)}, i, r.role,
                       CASE WHEN r.role = 'tool' THEN jsonb_build_array(jsonb_build_object(
                                'type', 'tool_result', 'tool_use_id', 'call_' || i,
                                'name', 'run_shell', 'output', x.t))
                            ELSE jsonb_build_array(jsonb_build_object('type', 'text', 'text', x.t))
                       END,
                       'original', 50, length(x.t),
                       now() - interval '1 day' + (s * %(m)s::int + i) * interval '10 ms'
                FROM generate_series(%(first)s::int, %(last)s::int) s,
                     generate_series(1, %(m)s::int) i,
                     LATERAL (SELECT (ARRAY['user', 'assistant', 'tool'])[1 + i %% 3] AS role) r,
                     LATERAL (SELECT {_TEXT} AS t) x
                """,
                {**params, "first": first, "last": last},
            )
            conn.commit()
            console.print(f"  {tenant}: sessions {last:,}/{count:,} loaded", end="\r")
        console.print()
        if not summaries:
            continue
        # Eight round summaries per session, each replacing `chunk` originals (as S4 would).
        conn.execute(
            f"""
            INSERT INTO compression_events (session_id, id, strategy, status, reason,
                messages_before, messages_after, tokens_before, tokens_after, replaced_ids,
                replaced_tokens, summary_message_id, offload_uuid, model, session_version, config)
            SELECT {_sid(tenant)}, k, 4, 'applied', 'tokens', 0, 0, 0, 0,
                   ARRAY(SELECT generate_series((k - 1) * %(chunk)s::int + 1,
                                                k * %(chunk)s::int))::bigint[],
                   %(chunk)s::int * 50, %(m)s::int + k, gen_random_uuid(), 'bench', 1,
                   %(config)s::jsonb
            FROM generate_series(1, %(count)s::int) s, generate_series(1, 8) k
            """,
            {**params, "count": count},
        )
        conn.execute(
            f"""
            INSERT INTO messages (session_id, id, role, content, kind, tokens, chars, event_id)
            SELECT {_sid(tenant)}, %(m)s::int + k, 'assistant',
                   jsonb_build_array(jsonb_build_object('type', 'text',
                       'text', 'round ' || k || ' summarized')), 'round_summary', 20, 20, k
            FROM generate_series(1, %(count)s::int) s, generate_series(1, 8) k
            """,
            {**params, "count": count},
        )
        conn.execute(
            """
            INSERT INTO offloads (session_id, uuid, handle, event_id, message_ids)
            SELECT e.session_id, e.offload_uuid, e.id, e.id, e.replaced_ids
            FROM compression_events e JOIN sessions s ON s.session_id = e.session_id
            WHERE s.tenant = %(tenant)s
            """,
            {"tenant": tenant},
        )
        conn.execute(
            """
            UPDATE sessions s SET next_handle = e.top + 1
            FROM (SELECT session_id, max(id) AS top FROM compression_events GROUP BY session_id) e
            WHERE e.session_id = s.session_id AND s.tenant = %(tenant)s
            """,
            {"tenant": tenant},
        )
        conn.execute(
            f"""
            INSERT INTO lineage (session_id, summary_id, ordinal, replaced_id, event_id)
            SELECT {_sid(tenant)}, %(m)s::int + k, j - 1, (k - 1) * %(chunk)s::int + j, k
            FROM generate_series(1, %(count)s::int) s, generate_series(1, 8) k,
                 generate_series(1, %(chunk)s::int) j
            """,
            {**params, "count": count},
        )
        conn.execute(
            f"""
            INSERT INTO working_set (session_id, position, message_id)
            SELECT {_sid(tenant)}, p, CASE WHEN p <= 8 THEN %(m)s::int + p
                                           ELSE %(offloaded)s::int + p - 8 END
            FROM generate_series(1, %(count)s::int) s,
                 generate_series(1, 8 + %(m)s::int - %(offloaded)s::int) p
            """,
            {**params, "count": count},
        )
        conn.commit()
    took["load"] = time.perf_counter() - started
    # An append writes no vector (migration 0013); the first search fills them, with this
    # statement's shape (the trigger computes each row's vector, whatever is set).
    started = time.perf_counter()
    conn.execute(
        "UPDATE messages SET search_tsv = NULL "
        "WHERE search_tsv IS NULL AND kind = 'original' AND search_config <> 'none'"
    )
    conn.commit()
    took["vectors"] = time.perf_counter() - started
    started = time.perf_counter()
    conn.execute("SET maintenance_work_mem = '256MB'")
    conn.execute(index[0])
    conn.commit()
    took["index"] = time.perf_counter() - started
    started = time.perf_counter()
    conn.autocommit = True
    conn.execute("VACUUM ANALYZE")
    conn.autocommit = False
    took["vacuum"] = time.perf_counter() - started
    return took


def pick_queries(conn: psycopg.Connection[Any], args: argparse.Namespace) -> list[tuple[str, str]]:
    """(label, query) of every selectivity, taken from the data, with how many originals of the
    tenant match."""
    sid = f"{TENANT}-{1:05d}"
    found = conn.execute(
        "SELECT substring(content::text from 'req-[0-9a-f]{10}') FROM messages "
        "WHERE session_id = %s AND content::text LIKE %s ORDER BY id LIMIT 1",
        (sid, "%req-%"),
    ).fetchone()
    path = conn.execute(
        "SELECT substring(content::text from '/srv/app/[a-z]+/[a-z]+_[0-9]+[.]py') FROM messages "
        "WHERE session_id = %s AND content::text LIKE %s ORDER BY id DESC LIMIT 1",
        (sid, "%/srv/app/%"),
    ).fetchone()
    assert found and found[0] and path and path[0]
    return [
        ("an id (one message)", found[0]),
        ("a path", path[0]),
        ("a rare term", "t3000"),
        ("a middling term", "t0300"),
        ("a frequent term", "t0030"),
        ("a common word", "deploy"),
        ("two words", "deploy t0300"),
    ]


def ilike_sql(query: str, scope: str) -> tuple[str, list[Any]]:
    words = query.split()
    conds = " AND ".join("m.content::text ILIKE %s" for _ in words)
    where = (
        "m.session_id = %s"
        if scope == "session"
        else "m.session_id IN (SELECT s.session_id FROM sessions s WHERE s.tenant = %s)"
    )
    text = (
        f"SELECT m.session_id, m.id FROM messages m WHERE m.kind = 'original' AND {conds} "
        f"AND {where} ORDER BY m.created_at DESC LIMIT 10"
    )
    return text, [f"%{w}%" for w in words]


def fetch(conn: psycopg.Connection[Any], text: str, params: Sequence[Any]) -> list[Any]:
    return conn.execute(text, params).fetchall()


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    out = fn()
    return time.perf_counter() - started, out


def p50_p95(values: Sequence[float]) -> str:
    return f"{median(values) * 1000:,.1f} / {percentile(values, 95) * 1000:,.1f}"


def count_matches(conn: psycopg.Connection[Any], query: str, where: str, arg: str) -> int:
    from autoctx._search import websearch_text

    row = conn.execute(
        f"SELECT count(*) FROM messages m WHERE m.search_tsv @@ "
        f"websearch_to_tsquery('simple', %s) AND {where}",
        (websearch_text(query), arg),
    ).fetchone()
    assert row is not None
    return int(row[0])


@contextlib.contextmanager
def granted_role(db: BenchDatabase) -> Iterator[str | None]:
    """The URL of a fresh LOGIN role granted tenant `bench`, or None if the server asks for
    a password (the role has none)."""
    name = f"autoctx_bench_{secrets.token_hex(4)}"
    url = db.url.render_as_string(hide_password=False)
    owner = sa.create_engine(url, poolclass=sa.NullPool)
    with owner.begin() as conn:
        conn.execute(sa.text(f'CREATE ROLE "{name}" LOGIN NOSUPERUSER NOBYPASSRLS'))
    try:
        autoctx.grant_tenant(name, TENANT, url)
        role_url = db.url.set(username=name, password=None).render_as_string(hide_password=False)
        try:
            probe = sa.create_engine(role_url, poolclass=sa.NullPool)
            with probe.connect():
                pass
            probe.dispose()
        except sa.exc.OperationalError:
            yield None
        else:
            yield role_url
    finally:
        AutoContextClient.close_shared()
        with owner.begin() as conn:
            conn.execute(
                sa.text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = :r"
                ),
                {"r": name},
            )
            conn.execute(sa.text(f'DROP OWNED BY "{name}"'))
            conn.execute(sa.text(f'DROP ROLE "{name}"'))
        owner.dispose()


def fan_out_table(conn: psycopg.Connection[Any], shards: int) -> float:
    """A copy of the originals' vectors, hash-partitioned by session_id into `shards`
    partitions with the same index; returns the seconds it took."""
    started = time.perf_counter()
    conn.execute(
        "CREATE TABLE bench_shards (session_id text, id bigint, created_at timestamptz, "
        "search_tsv tsvector) PARTITION BY HASH (session_id)"
    )
    for k in range(shards):
        conn.execute(
            psql.SQL(
                "CREATE TABLE {} PARTITION OF bench_shards FOR VALUES WITH (MODULUS {}, "
                "REMAINDER {})"
            ).format(psql.Identifier(f"bench_shard_{k}"), psql.Literal(shards), psql.Literal(k))
        )
    conn.execute(
        "INSERT INTO bench_shards SELECT session_id, id, created_at, search_tsv FROM messages "
        "WHERE search_tsv IS NOT NULL"
    )
    conn.execute("SET maintenance_work_mem = '256MB'")
    conn.execute("CREATE INDEX ON bench_shards USING gin (session_id, search_tsv)")
    conn.commit()
    conn.autocommit = True
    conn.execute("ANALYZE bench_shards")
    conn.autocommit = False
    return time.perf_counter() - started


_RANKED = """
SELECT m.session_id, m.id, ts_rank_cd(m.search_tsv, q, 1) AS rank
FROM {table} m, websearch_to_tsquery('simple', %s) q
WHERE m.search_tsv @@ q
  AND m.session_id IN (SELECT s.session_id FROM sessions s WHERE s.tenant = %s)
ORDER BY rank DESC, m.created_at DESC LIMIT 10
"""


def run(args: argparse.Namespace) -> dict[str, Any]:
    from autoctx._search import websearch_text

    figures: dict[str, Any] = {"args": vars(args) | {"json": None}}
    with fresh_database(args.database_url, "autoctx_bench_search") as db:
        console.print(f"database {db.name} on PostgreSQL {db.server_version}")
        url = db.url.render_as_string(hide_password=False)
        with raw_connection(db) as conn:
            took = load(conn, args)
            total = conn.execute(
                "SELECT count(*) FILTER (WHERE s.tenant = %s), count(*) FROM messages m "
                "JOIN sessions s ON s.session_id = m.session_id WHERE m.kind = 'original'",
                (TENANT,),
            ).fetchone()
            sizes = conn.execute(
                "SELECT pg_size_pretty(pg_table_size('messages')), "
                "pg_size_pretty(pg_relation_size('messages_search_idx'))"
            ).fetchone()
            assert total is not None and sizes is not None
            console.print(
                f"loaded {total[0]:,} originals of tenant {TENANT!r} in {args.sessions:,} "
                f"sessions and {total[1] - total[0]:,} of {args.noise_sessions:,} others in "
                f"{secs(took['load'])} ({took['load'] / total[1] * 1e6:,.0f} µs per message); "
                f"vectors computed in {secs(took['vectors'])} (as the first search does), "
                f"GIN index built in {secs(took['index'])}, "
                f"vacuum analyze {secs(took['vacuum'])}; messages {sizes[0]}, index {sizes[1]}"
            )
            figures["load"] = {**took, "originals": total[0], "all_originals": total[1]}
            figures["sizes"] = {"messages": sizes[0], "index": sizes[1]}
            queries = pick_queries(conn, args)
            conn.execute("SET jit = off")
            tenant_where = "m.session_id IN (SELECT session_id FROM sessions WHERE tenant = %s)"
            counts = {q: count_matches(conn, q, tenant_where, TENANT) for _, q in queries}
            sid = f"{TENANT}-{1:05d}"
            session_counts = {
                q: count_matches(conn, q, "m.session_id = %s", sid) for _, q in queries
            }
            mem = AutoContextMemory.open(
                sid, url, tenant=TENANT, create=False, summarizer=OfflineSummarizer()
            )
            mem.search("warm up", scope="tenant")
            results: list[dict[str, Any]] = []
            for scope in ("tenant", "session"):
                for label, query in queries:
                    ours: list[float] = []
                    base: list[float] = []
                    text, params = ilike_sql(query, scope)
                    params.append(TENANT if scope == "tenant" else sid)
                    hits: list[Any] = []
                    search = functools.partial(mem.search, query, scope=scope)
                    scan = functools.partial(fetch, conn, text, params)
                    for k in range(args.repeats):
                        # Interleaved, each side first every other time.
                        for side in ("ours", "base") if k % 2 == 0 else ("base", "ours"):
                            if side == "ours":
                                seconds, hits = timed(search)
                                ours.append(seconds)
                            else:
                                base.append(timed(scan)[0])
                    matches = counts[query] if scope == "tenant" else session_counts[query]
                    results.append(
                        {
                            "scope": scope,
                            "label": label,
                            "query": query,
                            "matches": matches,
                            "hits": len(hits),
                            "search": ours,
                            "ilike": base,
                        }
                    )
                    console.print(
                        f"  {scope:<7} {label:<20} {matches:>9,} matches: search "
                        f"{p50_p95(ours)} ms, ILIKE {p50_p95(base)} ms"
                    )
            figures["queries"] = results
            _print_table(results, db)
            conn.rollback()

            if args.rls_repeats:
                figures["rls"] = _rls(
                    db, queries, {"tenant": counts, "session": session_counts}, args
                )
            if args.shards:
                figures["fan_out"] = _fan_out(conn, queries, counts, args, websearch_text)
            if args.compare_plain_gin:
                figures["plain_gin"] = _plain_gin(conn, mem, queries, args)
            mem.close()
    return figures


def _print_table(results: list[dict[str, Any]], db: BenchDatabase) -> None:
    table = Table(
        title=f"search vs ILIKE, p50 / p95 in ms ({machine_description(db)})", title_justify="left"
    )
    for name in ("scope", "query", "matches", "mem.search", "ILIKE scan", "p50 ratio"):
        table.add_column(name, justify="right" if name not in ("scope", "query") else "left")
    for r in results:
        ratio = median(r["ilike"]) / median(r["search"])
        table.add_row(
            r["scope"],
            f"{r['label']}: {r['query']}",
            f"{r['matches']:,}",
            p50_p95(r["search"]),
            p50_p95(r["ilike"]),
            f"{ratio:,.1f}x faster" if ratio >= 1 else f"{1 / ratio:,.1f}x slower",
        )
    console.print(table)


def _rls(
    db: BenchDatabase,
    queries: list[tuple[str, str]],
    counts: dict[str, dict[str, int]],
    args: argparse.Namespace,
) -> list[dict[str, Any]]:
    """The tenant search by a role granted `bench` (row-level security applies)."""
    out: list[dict[str, Any]] = []
    with granted_role(db) as role_url:
        if role_url is None:
            console.print("database tenancy: skipped (the server asks the new role for a password)")
            return out
        mem = AutoContextMemory.open(
            f"{TENANT}-{1:05d}", role_url, tenant=TENANT, create=False,
            summarizer=OfflineSummarizer(),
        )  # fmt: skip
        for scope in ("tenant", "session"):
            for label, query in queries:
                search = functools.partial(mem.search, query, scope=scope)
                times = [timed(search)[0] for _ in range(args.rls_repeats)]
                out.append({"scope": scope, "label": label, "query": query, "search": times})
                console.print(
                    f"  granted role, {scope:<7} {label:<20} {counts[scope][query]:>9,} "
                    f"matches: {p50_p95(times)} ms"
                )
        mem.close()
    return out


def _fan_out(
    conn: psycopg.Connection[Any],
    queries: list[tuple[str, str]],
    counts: dict[str, int],
    args: argparse.Namespace,
    websearch_text: Callable[[str], str],
) -> list[dict[str, Any]]:
    seconds = fan_out_table(conn, args.shards)
    console.print(f"fan-out copy in {args.shards} hash partitions built in {secs(seconds)}")
    conn.execute("SET jit = off")
    out = []
    for label, query in queries:
        text = websearch_text(query)
        one: list[float] = []
        many: list[float] = []
        single = functools.partial(fetch, conn, _RANKED.format(table="messages"), (text, TENANT))
        spread = functools.partial(
            fetch, conn, _RANKED.format(table="bench_shards"), (text, TENANT)
        )
        for k in range(args.repeats):
            for side in (single, spread) if k % 2 == 0 else (spread, single):
                (one if side is single else many).append(timed(side)[0])
        out.append({"label": label, "query": query, "one_index": one, "shards": many})
        console.print(
            f"  ranked top 10, {label:<20} {counts[query]:>9,} matches: one index "
            f"{p50_p95(one)} ms, {args.shards} partitions {p50_p95(many)} ms"
        )
    conn.rollback()
    return out


def _plain_gin(
    conn: psycopg.Connection[Any],
    mem: AutoContextMemory,
    queries: list[tuple[str, str]],
    args: argparse.Namespace,
) -> list[dict[str, Any]]:
    """Both scopes with each index: (session_id, search_tsv) by btree_gin, then search_tsv."""
    out = []
    definition = conn.execute("SELECT pg_get_indexdef('messages_search_idx'::regclass)").fetchone()
    assert definition is not None
    for variant in ("session_id, search_tsv", "search_tsv"):
        if variant == "search_tsv":
            started = time.perf_counter()
            conn.execute("DROP INDEX messages_search_idx")
            conn.execute("SET maintenance_work_mem = '256MB'")
            conn.execute(
                "CREATE INDEX messages_search_idx ON messages USING gin (search_tsv) "
                "WHERE search_tsv IS NOT NULL"
            )
            conn.commit()
            conn.autocommit = True
            conn.execute("ANALYZE messages")
            conn.autocommit = False
            console.print(f"plain gin (search_tsv) built in {secs(time.perf_counter() - started)}")
        size = conn.execute(
            "SELECT pg_size_pretty(pg_relation_size('messages_search_idx'))"
        ).fetchone()
        conn.rollback()
        for scope in ("session", "tenant"):
            for label, query in queries:
                search = functools.partial(mem.search, query, scope=scope)
                times = [timed(search)[0] for _ in range(args.repeats)]
                out.append(
                    {"index": variant, "size": size[0] if size else "", "scope": scope,
                     "label": label, "search": times}
                )  # fmt: skip
                console.print(
                    f"  gin ({variant}) {size[0] if size else ''}, {scope:<7} {label:<20} "
                    f"{p50_p95(times)} ms"
                )
    conn.execute("DROP INDEX messages_search_idx")
    conn.execute(definition[0])
    conn.commit()
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--messages-per-session", type=int, default=1000)
    parser.add_argument("--noise-sessions", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=20, help="timed runs per query and side")
    parser.add_argument(
        "--rls-repeats", type=int, default=3, help="runs per query by a granted role (0: skip)"
    )
    parser.add_argument(
        "--shards", type=int, default=16, help="partitions of the fan-out copy (0: skip)"
    )
    parser.add_argument("--compare-plain-gin", action="store_true")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    add_database_argument(parser)
    args = parser.parse_args(argv)
    if args.messages_per_session < 10:
        parser.error("--messages-per-session must be at least 10")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    figures = run(args)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2, default=str))


if __name__ == "__main__":
    main()
