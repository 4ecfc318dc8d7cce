"""The SQL of recall across sessions: full-text search over originals (migration 0008) and the
reads that reload a hit, in one session or across the sessions of a tenant.

The one read that spans sessions is a search or reload of scope "tenant": it names the tenant
(`sessions.tenant = <tenant>`, or `IS NULL` for an untenanted memory), never one session, so on
a sharded PostgreSQL it fans out to every shard (docs/scaling.md, "Search across sessions").
Everything of scope "session" is pinned to its session_id like every other statement of the
store. Each call is one transaction, scoped to the store's tenant for the row-level security
policies (database tenancy) on top of the explicit tenant condition (application tenancy).

The vectors are computed off the append path (migration 0013): an append writes its originals
without one, and a search first fills the vectors of the originals still waiting in the
sessions it covers (one UPDATE; a trigger computes each from the row's content), then queries.
A message it could not fill (a read-only console store, a role without the column privilege,
a row another search is filling at that moment) is still found: the query computes the vector
of every original still waiting as it reads it. So a message appended just now is always a
hit, and the work of indexing is done once, by the first search that needs it
(docs/design.md §9).

The text search configuration comes from the sessions searched (each session indexes its
originals with its own, fixed at creation); the configuration names are inlined as literals
from autoctx's fixed list, never from input, so that PostgreSQL folds
`websearch_to_tsquery('simple', $1)` into a constant when it plans and can estimate how many
rows the words match.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from typing import Any, Final

import psycopg
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, Engine

from .._arguments import OffloadRef
from .._errors import InvalidSearch, MessageNotFound, OffloadNotFound, SessionNotFound
from .._messages import Msg
from .._search import (
    MARK_START,
    MARK_STOP,
    NOT_INDEXED,
    SEARCH_CONFIGS,
    SLASH_STAND_IN,
    AutoContextSearchHit,
    clean_snippet,
    websearch_text,
)
from .._tools import SEARCH_TOOL_NAME, TOOL_NAME
from .rows import msg_from_columns
from .scope import TenantScope
from .sql import SET_TENANT, messages_by_id, originals_below

#: Characters of a hit's text that ts_headline reads (what the index covers, migration 0008).
HEADLINE_CHARS: Final = 100_000
HEADLINE_OPTIONS: Final = (
    f"StartSel={MARK_START}, StopSel={MARK_STOP}, MaxWords=18, MinWords=6, ShortWord=2, "
    'MaxFragments=2, FragmentDelimiter=" … "'
)

#: Planner settings local to the search's transaction: a custom plan for every execution (the
#: words' selectivity decides between the GIN index and a scan of the session, and a generic
#: plan of a prepared statement cannot know them), and no JIT, whose compilation costs more
#: than a search saves on the rows it reads.
_SETTINGS = (
    "SELECT set_config('plan_cache_mode', 'force_custom_plan', true), "
    "set_config('jit', 'off', true), "
    # Whether this transaction may fill vectors: not in a READ ONLY one (the console's), and
    # not for a role without UPDATE on the column (a role granted a tenant before 0013 has it
    # from the migration; one given privileges by hand may not).
    "current_setting('transaction_read_only') = 'off' "
    # (The table's name is a parameter: the statement reads no session's rows.)
    "AND has_column_privilege(%(table)s, 'search_tsv', 'UPDATE')"
)

#: An original whose vector is not computed yet: the predicate of `messages_unindexed_idx`
#: (migration 0013), word for word, so that PostgreSQL reads them through it.
_WAITING = "{m}.search_tsv IS NULL AND {m}.kind = 'original' AND {m}.search_config <> 'none'"
#: The vector of a waiting original, computed in the query (the trigger's function).
_COMPUTED = "autoctx_search_vector(m.content, m.kind, m.search_config)"

#: A session's `messages.search_config` (as `rows.search_config_of` reads it).
_CONFIG_OF = (
    "CASE WHEN s.config ? 'search_config' THEN coalesce(s.config->>'search_config', 'none') "
    "ELSE 'simple' END"
)

#: The text ts_headline marks: the message's text as the index reads it (text blocks, tool
#: names, outputs, the model's reasoning (migration 0018), then the arguments, decoded from
#: their JSON), its `/` a separator for the parser and restored by `clean_snippet`.
_PLAIN_PATHS = (
    "$[*].text",
    "$[*].name",
    '$[*].output ? (@.type() == "string")',
    "$[*].output[*].text",
    '$[*].data ? (@.type == "thinking").thinking',
    '$[*].data.agentscope ? (@.type == "thinking").thinking',
    '$[*].data ? (@.type == "reasoning").summary[*].text',
    '$[*].data ? (@.type == "reasoning").content[*].text',
    '$[*].data ? (@.type == "reasoning").reasoning ? (@.type() == "string")',
)
_PLAIN_ARRAY = " || ".join(f"jsonb_path_query_array(m.content, '{p}')" for p in _PLAIN_PATHS)
_ARGUMENT_TEXT = (
    "replace(regexp_replace(regexp_replace(regexp_replace(x, '\\\\\\\\', chr(57344), 'g'), "
    "'\\\\\"', '\"', 'g'), '\\\\([/bfnrt]|u[0-9a-fA-F]{4})', ' ', 'g'), chr(57344), '\\')"
)
_DISPLAY_TEXT = f"""
translate(left(
    coalesce((SELECT string_agg(x, ' ') FROM jsonb_array_elements_text({_PLAIN_ARRAY}) AS x), '')
    || ' ' ||
    coalesce((SELECT string_agg({_ARGUMENT_TEXT}, ' ')
              FROM jsonb_array_elements_text(jsonb_path_query_array(m.content, '$[*].arguments'))
                   AS x), ''),
    {HEADLINE_CHARS}), '/' || chr({ord(MARK_START)}) || chr({ord(MARK_STOP)}),
    chr({ord(SLASH_STAND_IN)}) || '  ')"""

#: The offload that holds a hit (the first compression that replaced it): its uuid and handle
#: (of its event's offloads, a masking pass has one per output, the one that took the hit).
_OFFLOAD_OF_HIT = """
LEFT JOIN LATERAL (
 SELECT o.uuid, o.handle
 FROM lineage l
 JOIN offloads o ON o.session_id = l.session_id AND o.event_id = l.event_id
                AND l.replaced_id = ANY(o.message_ids)
 WHERE l.session_id = h.session_id AND l.replaced_id = h.id
 ORDER BY l.event_id LIMIT 1) oh ON true"""

#: A call of autoctx's own model tools (`context_search`, `context_reload`) or its answer, with
#: no text of its own: never a hit. The agent's search call matches its own query word for
#: word, and a reload's answer repeats originals that are hits themselves.
_OWN_TOOL_TRAFFIC = f"""
(cardinality(m.tool_names) > 0
 AND m.tool_names <@ ARRAY['{TOOL_NAME}', '{SEARCH_TOOL_NAME}']::text[]
 AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements(m.content) AS b
                 WHERE b->>'type' = 'text' AND btrim(b->>'text') <> ''))"""

_IN_WORKING = """
EXISTS (SELECT 1 FROM working_set w
        WHERE w.session_id = h.session_id AND w.message_id = h.id)"""


logger = logging.getLogger("autoctx")


def _check_query(conn: Connection, configs: Sequence[str], params: dict[str, Any]) -> None:
    """Parse the query once, alone, with each configuration the search uses: a query that
    PostgreSQL cannot turn into a tsquery (operators nested past its stack, and whatever else
    the parser refuses) is the caller's `InvalidSearch`, never a database error. The query is
    the model's or the user's text and the error concerns it alone, so any refusal here is
    the query's; the message does not repeat it."""
    parsed = ", ".join(f"websearch_to_tsquery({_literal(c)}, %(query)s)" for c in configs)
    try:
        conn.exec_driver_sql(f"SELECT {parsed}", params)
    except (sa_exc.InternalError, sa_exc.DataError, sa_exc.OperationalError) as exc:
        if isinstance(exc.orig, psycopg.OperationalError) and not isinstance(
            exc.orig, psycopg.errors.ProgramLimitExceeded
        ):
            raise  # the connection, not the query
        raise InvalidSearch(
            "PostgreSQL cannot parse the search query "
            f"({type(exc.orig).__name__}: too many operators in a row?); search for plain "
            "words, ids or paths"
        ) from None


def _known_configs(configs: Sequence[str], what: str) -> list[str]:
    """The configurations autoctx indexes with among those `what` records (a session's config
    is read back from the database, where anyone with the tables' privileges may have written
    anything): the others are left out, and logged without the value."""
    known = [c for c in configs if c in SEARCH_CONFIGS]
    if len(known) < len(configs):
        logger.warning(
            "autoctx: %s records a search_config autoctx does not index with; it is left out "
            "of the search (repair the session's config)",
            what,
        )
    return known


def _tenant_condition(tenant: str | None, alias: str = "s") -> str:
    return f"{alias}.tenant = %(tenant)s" if tenant is not None else f"{alias}.tenant IS NULL"


def _literal(config: str) -> str:
    # Only names of autoctx's fixed list ever reach the SQL text (they come from sessions'
    # configs, which may have been written by anyone with the owner's rights).
    if config not in SEARCH_CONFIGS:
        raise ValueError(f"not a search configuration autoctx indexes with: {config!r}")
    return f"'{config}'"


def _match(configs: Sequence[str], vector: str) -> tuple[str, str]:
    """(the WHERE condition on `vector`, the tsquery expression for ranking) for the
    configurations of the sessions searched; one configuration (the usual case) needs no
    per-row test."""
    query = {c: f"websearch_to_tsquery({_literal(c)}, %(query)s)" for c in configs}
    if len(configs) == 1:
        only = query[configs[0]]
        return f"{vector} @@ {only}", only
    match = " OR ".join(
        f"(m.search_config = {_literal(c)} AND {vector} @@ {q})" for c, q in query.items()
    )
    ranked = (
        "CASE m.search_config "
        + " ".join(f"WHEN {_literal(c)} THEN {q}" for c, q in query.items())
        + " END"
    )
    return f"({match})", ranked


def _search_sql(configs: Sequence[str], where: str) -> str:
    """The search over the originals `where` selects (a condition on `m`): those with a vector
    through the GIN index, and those still waiting for one with it computed here (the
    lateral subquery is kept apart, `OFFSET 0`, so that each is parsed once)."""
    match, tsquery = _match(configs, "m.search_tsv")
    computed_match, computed_tsquery = _match(configs, "v.tsv")
    return f"""
WITH found AS (
    SELECT m.session_id, m.id, m.role, m.created_at, m.search_config,
           ts_rank_cd(m.search_tsv, {tsquery}, 1) AS rank
    FROM messages m
    WHERE {match} AND {where} AND NOT {_OWN_TOOL_TRAFFIC}
  UNION ALL
    SELECT m.session_id, m.id, m.role, m.created_at, m.search_config,
           ts_rank_cd(v.tsv, {computed_tsquery}, 1) AS rank
    FROM messages m CROSS JOIN LATERAL (SELECT {_COMPUTED} AS tsv OFFSET 0) v
    WHERE {_WAITING.format(m="m")} AND {where} AND {computed_match}
      AND NOT {_OWN_TOOL_TRAFFIC}
), hits AS (
    SELECT * FROM found
    ORDER BY rank DESC, created_at DESC, session_id, id
    LIMIT %(limit)s
)
SELECT h.session_id, h.id, h.role, h.created_at, h.rank,
       ts_headline(h.search_config::regconfig, {_DISPLAY_TEXT},
                   websearch_to_tsquery(h.search_config::regconfig, %(query)s),
                   %(options)s) AS headline,
       oh.uuid AS offload_uuid, oh.handle AS offload_handle,
       {_IN_WORKING} AS working
FROM hits h JOIN messages m ON m.session_id = h.session_id AND m.id = h.id
{_OFFLOAD_OF_HIT}
ORDER BY h.rank DESC, h.created_at DESC, h.session_id, h.id
"""


def _fill_waiting(conn: Connection, scope: str, params: dict[str, Any]) -> None:
    """Compute the vectors of the originals still waiting among those `scope` selects (a
    condition on the alias `{m}`), in this transaction: the trigger of migration 0013
    computes each row's from its content, whatever the statement sets. Rows another
    transaction holds (another search filling them, an erasure rewriting them) are skipped,
    never waited for: the query computes theirs itself. `FOR NO KEY UPDATE` leaves appends and
    applies, whose foreign-key checks lock the messages they reference FOR KEY SHARE, free to
    go on."""
    conn.exec_driver_sql(
        f"""
UPDATE messages m SET search_tsv = NULL
FROM (SELECT p.session_id, p.id FROM messages p
      WHERE {_WAITING.format(m="p")} AND {scope.format(m="p")}
      ORDER BY p.session_id, p.id
      FOR NO KEY UPDATE SKIP LOCKED) w
WHERE {scope.format(m="m")} AND m.session_id = w.session_id AND m.id = w.id
""",
        params,
    )


#: Originals the worker fills per transaction (each one short: a few hundred ms at most).
FILL_BATCH: Final = 2_000

_FILL_BATCH_SQL = f"""
UPDATE messages m SET search_tsv = NULL
FROM (SELECT p.session_id, p.id FROM messages p
      WHERE {_WAITING.format(m="p")}
        AND (CAST(%(tenant)s AS text) IS NULL OR p.session_id IN (
             SELECT s.session_id FROM sessions s WHERE s.tenant = CAST(%(tenant)s AS text)))
      ORDER BY p.session_id, p.id
      LIMIT %(limit)s
      FOR NO KEY UPDATE SKIP LOCKED) w
WHERE m.session_id = w.session_id AND m.id = w.id
"""


def fill_waiting_vectors(
    engine: Engine, *, tenant: str | None = None, limit: int = FILL_BATCH
) -> int:
    """Compute the search vectors of up to `limit` originals still waiting (of `tenant`'s
    sessions, or of every session the role may see), in one transaction of their own;
    returns how many. The worker runs it whenever no session is due (docs/design.md §9), so
    that with a worker running, searches (the console's, which may not write, included) read
    the index instead of computing vectors: the append path stays free of `to_tsvector`, and
    the work is done once, off every agent's path. Rows another transaction holds are skipped
    (the next call takes them)."""
    with engine.begin() as conn:
        if tenant is not None:
            conn.exec_driver_sql(SET_TENANT, {"t": tenant})
        conn.exec_driver_sql("SELECT set_config('jit', 'off', true)")
        done = conn.exec_driver_sql(_FILL_BATCH_SQL, {"tenant": tenant, "limit": limit})
        return int(done.rowcount or 0)


def _prepare(conn: Connection) -> bool:
    """The search's planner settings; whether this transaction may fill vectors."""
    return bool(conn.exec_driver_sql(_SETTINGS, {"table": "messages"}).one()[2])


def _hits(conn: Connection, sql: str, params: dict[str, Any]) -> list[AutoContextSearchHit]:
    rows = conn.exec_driver_sql(sql, params).all()
    return [
        AutoContextSearchHit(
            session_id=r.session_id,
            message_id=r.id,
            role=r.role,
            created_at=r.created_at,
            snippet=clean_snippet(r.headline or ""),
            rank=float(r.rank),
            offload_uuid=r.offload_uuid,
            in_working_context=bool(r.working),
            offload_handle=r.offload_handle,
        )
        for r in rows
    ]


def search_session(
    store: TenantScope,
    session_id: str,
    query: str,
    limit: int,
    *,
    incarnation: uuid.UUID | None = None,
) -> list[AutoContextSearchHit]:
    """The best `limit` originals of one session that match `query`.

    With `incarnation` (a memory's own session), a session deleted since raises
    `SessionNotFound`; without it (the CLI), the session must be one of the store's tenant
    (untenanted for a store without one), else `SessionNotFound`.
    """
    params: dict[str, Any] = {
        "sid": session_id,
        "tenant": store.tenant,
        "inc": incarnation,
        "query": websearch_text(query),
        "limit": limit,
        "options": HEADLINE_OPTIONS,
    }
    which = (
        "s.incarnation = %(inc)s" if incarnation is not None else _tenant_condition(store.tenant)
    )
    with store.transaction() as conn:
        may_fill = _prepare(conn)
        configs = (
            conn.exec_driver_sql(
                f"SELECT {_CONFIG_OF} FROM sessions s WHERE s.session_id = %(sid)s AND {which}",
                params,
            )
            .scalars()
            .all()
        )
        if not configs:
            raise _no_session(session_id, store.tenant, incarnation is not None)
        if configs[0] == NOT_INDEXED:
            return []
        if configs[0] not in SEARCH_CONFIGS:
            raise InvalidSearch(
                f"session {session_id!r} records a search_config autoctx does not index with, so "
                "it cannot be searched; reopen it with config=AutoContextConfig(search_config="
                "...) naming the configuration it was created with (or None)"
            )
        _check_query(conn, configs, params)
        scope = "{m}.session_id = %(sid)s"
        if may_fill:
            _fill_waiting(conn, scope, params)
        return _hits(conn, _search_sql(configs, scope.format(m="m")), params)


def search_tenant(
    store: TenantScope,
    query: str,
    limit: int,
    *,
    alive: tuple[str, uuid.UUID] | None = None,
) -> list[AutoContextSearchHit]:
    """The best `limit` originals of every session of the store's tenant (every untenanted
    session for a store without one) that match `query`. With `alive` (a memory's own session
    and incarnation), raises `SessionNotFound` once that session is gone."""
    params: dict[str, Any] = {
        "tenant": store.tenant,
        "query": websearch_text(query),
        "limit": limit,
        "options": HEADLINE_OPTIONS,
    }
    in_tenant = _tenant_condition(store.tenant)
    with store.transaction() as conn:
        may_fill = _prepare(conn)
        if alive is not None and not _alive(conn, *alive):
            raise _no_session(alive[0], store.tenant, True)
        configs = [
            c
            for c in conn.exec_driver_sql(
                f"SELECT DISTINCT {_CONFIG_OF} FROM sessions s WHERE {in_tenant} ORDER BY 1",
                params,
            ).scalars()
            if c != NOT_INDEXED
        ]
        configs = _known_configs(configs, f"a session of tenant {store.tenant!r}")
        if not configs:
            return []
        _check_query(conn, configs, params)
        scope = "{m}.session_id IN (SELECT s.session_id FROM sessions s WHERE " + in_tenant + ")"
        if may_fill:
            _fill_waiting(conn, scope, params)
        return _hits(conn, _search_sql(configs, scope.format(m="m")), params)


def _alive(conn: Connection, session_id: str, incarnation: uuid.UUID) -> bool:
    """Whether the session is still the incarnation a memory works on."""
    return bool(
        conn.exec_driver_sql(
            "SELECT EXISTS (SELECT 1 FROM sessions s WHERE s.session_id = %(sid)s "
            "AND s.incarnation = %(inc)s)",
            {"sid": session_id, "inc": incarnation},
        ).scalar_one()
    )


def _no_session(session_id: str, tenant: str | None, own: bool) -> SessionNotFound:
    if own:
        return SessionNotFound(
            f"session {session_id!r} does not exist any more (it was deleted, and the id may "
            "have been created again since); open the session again to work on what now has "
            "that id"
        )
    among = f"tenant {tenant!r}" if tenant is not None else "the sessions without a tenant"
    return SessionNotFound(
        f"session {session_id!r} does not exist among {among}; list the sessions with "
        "`autoctx sessions`, and name the session's tenant with --tenant"
    )


# ---------------------------------------------------------------------------------------------
# Reloading a hit: a message by id, or another session's offload, within the tenant
# ---------------------------------------------------------------------------------------------

_MESSAGE_IN_TENANT = """
SELECT m.id, m.role, m.name, m.content, m.metadata, m.kind, m.pinned, m.tokens
FROM messages m JOIN sessions s ON s.session_id = m.session_id
WHERE m.session_id = %(sid)s AND m.id = %(id)s AND {which}
"""

_OFFLOAD_IN_TENANT = """
SELECT o.message_ids, s.incarnation
FROM offloads o JOIN sessions s ON s.session_id = o.session_id
WHERE o.session_id = %(sid)s AND {named} AND {which}
"""


def _which(store: TenantScope, incarnation: uuid.UUID | None) -> str:
    return "s.incarnation = %(inc)s" if incarnation is not None else _tenant_condition(store.tenant)


def load_message(
    store: TenantScope, session_id: str, message_id: int, *, incarnation: uuid.UUID | None = None
) -> Msg:
    """One stored message (an original or one autoctx wrote) of `session_id`, which must be
    the memory's own (`incarnation`) or a session of the store's tenant; `MessageNotFound`
    otherwise, exactly as for an unknown id (`SessionNotFound` when the memory's own session
    is gone)."""
    params = {"sid": session_id, "id": message_id, "tenant": store.tenant, "inc": incarnation}
    with store.transaction() as conn:
        row = conn.exec_driver_sql(
            _MESSAGE_IN_TENANT.format(which=_which(store, incarnation)), params
        ).one_or_none()
        if row is None and incarnation is not None and not _alive(conn, session_id, incarnation):
            raise _no_session(session_id, store.tenant, True)
    if row is None:
        raise MessageNotFound(
            f"no message {message_id} in session {session_id!r} among the sessions this "
            "memory may read; take the session id and message id from a search hit"
        )
    return msg_from_columns(*row)


def reload_in_tenant(
    store: TenantScope, session_id: str, offload: OffloadRef, *, originals: bool = False
) -> list[Msg]:
    """The messages an offload of another session of the store's tenant removed (one level
    deep; with `originals`, the originals behind them); `OffloadNotFound` for an unknown one,
    or one of a session outside the tenant."""
    params = {"sid": session_id, "ref": offload, "tenant": store.tenant}
    named = "o.handle = %(ref)s" if isinstance(offload, int) else "o.uuid = %(ref)s"
    with store.transaction() as conn:
        row = conn.exec_driver_sql(
            _OFFLOAD_IN_TENANT.format(named=named, which=_tenant_condition(store.tenant)), params
        ).one_or_none()
        if row is None:
            raise OffloadNotFound(
                f"no offloaded context with id {offload} in session {session_id!r}"
            )
        ids, incarnation = list(row[0]), row[1]
        if originals:
            ids = originals_below(conn, session_id, ids)
        by_id = messages_by_id(conn, session_id, incarnation, ids)
    return [by_id[i] for i in ids]
