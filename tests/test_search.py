"""Recall across sessions (docs/design.md §9, issue 14 item 1): full-text search over originals.

On real PostgreSQL through the migrations: ranking, the two scopes, ids and paths with the
"simple" configuration, what is indexed (originals, their tool arguments and outputs; not
summaries), reload of a hit, bad input, and tenancy in both its cases: another tenant's message
with the same words is never a hit through the API, the `context_search` tool, the CLI, or raw
SQL of a database role granted one tenant.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL
from typer.testing import CliRunner, Result

import autoctx
from autoctx import (
    AsyncAutoContextMemory,
    AutoContextConfig,
    AutoContextError,
    AutoContextMemory,
    AutoContextSearchHit,
    InvalidMessageId,
    InvalidSearch,
    InvalidSessionId,
    MessageNotFound,
    Msg,
    OfflineSummarizer,
    OffloadNotFound,
    SessionNotFound,
    ToolUseBlock,
)
from autoctx._cli import app
from autoctx._store import search as search_store
from autoctx._store.catalog import Catalog
from autoctx._store.console import read_only
from tests.dbsql import sql
from tests.histories import SMALL, multi_round
from tests.test_statements import _TABLE_RE, Captured, Recorder, _check
from tests.test_tenants import Role, login_role

if TYPE_CHECKING:
    pass

Open = Callable[..., AutoContextMemory]

BENCH = Path(__file__).resolve().parent.parent / "bench" / "search.py"
#: The words every tenant's sessions share (a hit of the wrong tenant would carry them too).
SHARED = "kubernetes rollout stalled"


def _tag() -> str:
    return uuid.uuid4().hex[:8]


def _ids(hits: list[AutoContextSearchHit]) -> list[tuple[str, int]]:
    return [(h.session_id, h.message_id) for h in hits]


def _call(name: str, arguments: Any) -> dict[str, Any]:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": "c", "type": "function", "function": {"name": name, "arguments": args}}


def _cli(*args: str) -> Result:
    return CliRunner().invoke(app, ["search", *args], env={"COLUMNS": "250"})


# ---------------------------------------------------------------------------------------------
# What matches, and in which order
# ---------------------------------------------------------------------------------------------


def test_hits_are_ranked_by_cover_density_and_need_every_word(open_memory: Open) -> None:
    mem = open_memory()
    mem.add(
        [
            Msg.user("the deploy of the payments service failed at the migration step"),
            Msg.assistant("deploy failed: the migration lock was held"),
            Msg.user("we deploy on fridays " + "and then " * 30 + "nothing failed"),
            Msg.user("only the word deploy, nothing else of the query"),
        ]
    )
    hits = mem.search("deploy failed")
    # Both words are required: message 4 has one of them only.
    assert [h.message_id for h in hits] == [2, 1, 3]
    assert hits[0].rank > hits[1].rank > hits[2].rank
    assert "**deploy**" in hits[0].snippet and "**failed**" in hits[0].snippet
    assert {h.role for h in hits} == {"user", "assistant"}
    assert all(h.session_id == mem.session_id and h.in_working_context for h in hits)
    assert all(h.created_at.tzinfo is not None for h in hits)
    # A phrase, an exclusion, an alternative: PostgreSQL's web search syntax.
    assert [h.message_id for h in mem.search('"deploy failed"')] == [2]
    assert [h.message_id for h in mem.search("deploy -failed")] == [4]
    assert {h.message_id for h in mem.search("fridays or lock")} == {2, 3}
    assert len(mem.search("deploy", limit=2)) == 2
    assert mem.search("kubernetes") == []


def test_ids_and_paths_match_with_the_simple_configuration(open_memory: Open) -> None:
    request = str(uuid.uuid4())
    mem = open_memory()
    write = json.dumps(
        {"path": "/etc/app/config.yaml", "content": "port: 8443\nreplicas: 3\nhost: db.internal"}
    )
    mem.add(
        [
            Msg.user(f"request {request} failed; see /srv/app/main.py and ERR_4711"),
            Msg.assistant(None, [ToolUseBlock("call_1", "write_file", write)]),
            Msg.tool("call_1", "wrote 44 bytes to C:\\new\\notes.txt"),
            Msg.user("unrelated: the main entry point is elsewhere"),
        ]
    )

    def found(query: str) -> list[int]:
        return [h.message_id for h in mem.search(query)]

    assert found(request) == [1]
    assert found("/srv/app/main.py") == [1]
    assert found("main.py") == [1], "a path is searchable by its parts"
    assert found("app/main.py") == [1]
    assert found("ERR_4711") == [1]
    # Tool arguments are JSON inside JSON: a file written through a call is searchable by its
    # lines (no escape glued to a word) and by its path.
    assert found("replicas") == [2]
    assert found("8443") == [2]
    assert found("db.internal") == [2]
    assert found("/etc/app/config.yaml") == [2]
    assert set(found("write_file")) == {2, 3}  # the tool result names its tool too
    assert found("notes.txt") == [3]
    assert found("new") == [3], "C:\\new stays the word new"
    # "simple" neither stems nor drops stop words.
    assert found("fail") == []
    assert found("the") == [4]
    snippet = mem.search("main.py")[0].snippet
    assert "/srv/app/**main.py**" in snippet, snippet


def test_a_language_configuration_stems_and_stays_with_its_session(
    open_memory: Open, caplog: pytest.LogCaptureFixture
) -> None:
    english = AutoContextConfig(search_config="english")
    mem = open_memory(f"en-{_tag()}", config=english)
    mem.add(Msg.user("the deployments were failing repeatedly"))
    assert [h.message_id for h in mem.search("deployment fails")] == [1]
    # Fixed when the session is created, like the model: reopening with another keeps it.
    with caplog.at_level(logging.WARNING, logger="autoctx"):
        again = open_memory(mem.session_id, config=AutoContextConfig())
    assert again.config.search_config == "english"
    assert "search_config" in caplog.text
    assert [h.message_id for h in again.search("deployment fails")] == [1]
    # A tenant whose sessions use two configurations: each is searched with its own.
    tenant = f"mixed-{_tag()}"
    a = open_memory(f"mixa-{_tag()}", config=english, tenant=tenant)
    b = open_memory(f"mixb-{_tag()}", tenant=tenant)
    a.add(Msg.user("servers were rebooting"))
    b.add(Msg.user("servers rebooting now"))
    assert {h.session_id for h in b.search("servers rebooting", scope="tenant")} == {
        a.session_id,
        b.session_id,
    }
    assert [h.session_id for h in b.search("servers reboot", scope="tenant")] == [a.session_id]


def test_a_session_without_search_indexes_nothing(open_memory: Open, db_url: str) -> None:
    tenant = f"quiet-{_tag()}"
    quiet = open_memory(
        f"quiet-{_tag()}", config=AutoContextConfig(search_config=None), tenant=tenant
    )
    loud = open_memory(f"loud-{_tag()}", tenant=tenant)
    for mem in (quiet, loud):
        mem.add(Msg.user("the invoice numbers were wrong"))
    vectors = sql(
        quiet, "select search_tsv from messages where session_id = :s", s=quiet.session_id
    )
    assert [r.search_tsv for r in vectors] == [None]
    assert quiet.search("invoice") == []
    assert [h.session_id for h in quiet.search("invoice", scope="tenant")] == [loud.session_id]
    assert open_memory(quiet.session_id, tenant=tenant).config.search_config is None
    # A session recorded before migration 0008 (no search_config in its config) indexes with
    # 'simple', as the migration indexed its messages.
    legacy = open_memory(f"legacy-{_tag()}")
    engine = sa.create_engine(db_url, poolclass=sa.NullPool)
    with engine.begin() as conn:
        conn.execute(
            sa.text("update sessions set config = config - 'search_config' where session_id = :s"),
            {"s": legacy.session_id},
        )
    engine.dispose()
    again = open_memory(legacy.session_id, create=False)
    assert again.config.search_config == "simple"
    again.add(Msg.user("legacy invoice"))
    assert [h.message_id for h in again.search("invoice")] == [1]


def test_only_originals_are_indexed_and_a_compressed_hit_says_where_it_is(
    open_memory: Open,
) -> None:
    mem = open_memory(config=SMALL)
    mem.add(multi_round(3, rounds=4, steps=8))
    events = [e for e in mem.compress_if_needed() if e.status == "applied"]
    assert events

    def unindexed_by_kind() -> dict[str, tuple[int, int]]:
        rows = sql(
            mem,
            "select kind, count(*) filter (where search_tsv is null) as unindexed, "
            "count(*) as n from messages where session_id = :s group by kind",
            s=mem.session_id,
        )
        return {r.kind: (r.unindexed, r.n) for r in rows}

    # The append computes no vector (migration 0013): the first search fills them all.
    waiting, originals = unindexed_by_kind()["original"]
    assert waiting == originals > 0
    assert mem.search("no such word anywhere") == []
    by_kind = unindexed_by_kind()
    assert by_kind.pop("original") == (0, originals), "every original is indexed"
    assert by_kind and all(unindexed == n for unindexed, n in by_kind.values()), by_kind
    # An original a compression took out: found, with the offload that holds it.
    event = next(e for e in events if e.offload_uuid is not None)
    assert event.offload_uuid is not None
    held = mem.reload(event.offload_uuid)
    original = next(
        m
        for m in held
        if m.kind == "original" and m.role == "tool" and "handler_" in m.tool_results[0].output_text
    )
    word = next(w for w in original.tool_results[0].output_text.split() if "handler_" in w)
    word = word.split("(")[0]
    hit = next(h for h in mem.search(word, limit=100) if h.message_id == original.id)
    assert hit.offload_uuid == event.offload_uuid
    assert not hit.in_working_context
    assert original.id in {m.id for m in mem.reload(hit.offload_uuid)}
    assert mem.reload(message_id=hit.message_id) == [original]
    # No summary is ever a hit: every hit is an original.
    kinds = {
        r.kind
        for r in sql(
            mem,
            "select kind from messages where session_id = :s and id = any(:ids)",
            s=mem.session_id,
            ids=[h.message_id for h in mem.search("tests pass", limit=100)],
        )
    }
    assert kinds == {"original"}


def test_rewriting_content_rewrites_the_index_entry(open_memory: Open, db_url: str) -> None:
    """The vector is generated from `content` by PostgreSQL: what rewrites a message's content
    (the erasure of docs/design.md §9) cannot leave its words in the index."""
    mem = open_memory()
    mem.add(Msg.user("the secret is hunter2-zebra"))
    assert [h.message_id for h in mem.search("hunter2-zebra")] == [1]
    engine = sa.create_engine(db_url, poolclass=sa.NullPool)
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                'update messages set content = \'[{"type": "text", "text": "[erased]"}]\' '
                "where session_id = :s and id = 1"
            ),
            {"s": mem.session_id},
        )
        vector = conn.execute(
            sa.text("select search_tsv::text from messages where session_id = :s and id = 1"),
            {"s": mem.session_id},
        ).scalar_one()
    engine.dispose()
    assert "hunter2" not in vector and "zebra" not in vector
    assert mem.search("hunter2-zebra") == []
    assert [h.message_id for h in mem.search("erased")] == [1]


def _vectors(mem: AutoContextMemory) -> dict[int, str | None]:
    rows = sql(
        mem,
        "select id, search_tsv::text as v from messages where session_id = :s order by id",
        s=mem.session_id,
    )
    return {r.id: r.v for r in rows}


def test_a_search_that_cannot_fill_the_vectors_still_finds_what_was_just_appended(
    open_memory: Open, db_url: str
) -> None:
    """The append computes no vector (migration 0013). A search that may not write (the
    console's READ ONLY store) computes the waiting ones in its query and writes nothing; a
    message another transaction holds while a search fills the rest is found too, and the
    search does not wait for that transaction."""
    mem = open_memory()
    mem.add([Msg.user("the canary-7731 sings"), Msg.assistant("the kestrel-4410 flies")])
    assert _vectors(mem) == {1: None, 2: None}
    engine = sa.create_engine(db_url, poolclass=sa.NullPool)
    try:
        console = Catalog(read_only(engine))
        hits = search_store.search_session(console, mem.session_id, "canary-7731", 10)
        assert [h.message_id for h in hits] == [1] and "**canary" in hits[0].snippet
        assert _vectors(mem) == {1: None, 2: None}, "a read-only search wrote nothing"
        with engine.connect() as holder:
            holder.execute(
                sa.text("select 1 from messages where session_id = :s and id = 2 for update"),
                {"s": mem.session_id},
            )
            # Message 2 is locked: the fill skips it, the query computes its vector.
            assert [h.message_id for h in mem.search("kestrel-4410")] == [2]
            vectors = _vectors(mem)
            assert vectors[1] is not None and "canary" in vectors[1] and vectors[2] is None
            holder.rollback()
    finally:
        engine.dispose()
    assert {h.message_id for h in mem.search("kestrel-4410 or canary-7731")} == {1, 2}
    assert all(v is not None for v in _vectors(mem).values()), "the next search filled the rest"


def test_a_message_at_the_size_cap_is_stored_and_searchable_by_its_beginning(
    open_memory: Open,
) -> None:
    """A tsvector holds at most 1 MB and PostgreSQL refuses the row that would exceed it: the
    index reads the first 100,000 characters, so the largest message `add()` accepts (here,
    unique words, the worst case for the vector's size) is stored whole."""
    mem = open_memory()
    words = " ".join(f"w{n:07x}" for n in range(220_000))  # 1.98 M characters
    assert len(words) < mem.config.max_message_chars
    mem.add(Msg.user(words))
    assert [h.message_id for h in mem.search("w0000001")] == [1]
    assert mem.search(f"w{219_999:07x}") == [], "past the indexed part"
    assert mem.reload(message_id=1)[0].text == words


# ---------------------------------------------------------------------------------------------
# Scopes and tenants: the API, the tool, the CLI (application tenancy, as the owner)
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tenants(db_url: str) -> dict[str, AutoContextMemory]:
    """Two sessions of acme, one of globex and one without a tenant, each with the same words
    (and a word of its own)."""
    tag = _tag()
    made = {}
    for key, tenant in (("a1", "acme"), ("a2", "acme"), ("g", "globex"), ("none", None)):
        mem = AutoContextMemory.open(
            f"srch-{key}-{tag}", db_url, tenant=tenant, summarizer=OfflineSummarizer()
        )
        mem.add([Msg.user(f"{SHARED} in {key}: own-{key}-{tag}"), Msg.assistant("noted")])
        made[key] = mem
    return made


def test_scopes_never_leave_the_tenant(tenants: dict[str, AutoContextMemory]) -> None:
    a1, a2, g, none = tenants["a1"], tenants["a2"], tenants["g"], tenants["none"]
    assert {h.session_id for h in a1.search(SHARED)} == {a1.session_id}
    assert {h.session_id for h in a1.search(SHARED, scope="tenant")} == {
        a1.session_id,
        a2.session_id,
    }
    assert {h.session_id for h in g.search(SHARED, scope="tenant")} == {g.session_id}
    # Untenanted sessions: only untenanted ones, never a tenant's.
    untenanted = {h.session_id for h in none.search(SHARED, scope="tenant", limit=100)}
    assert none.session_id in untenanted
    assert not untenanted & {a1.session_id, a2.session_id, g.session_id}
    # Even by a word only the other tenant's message holds.
    own_g = g.messages()[0].text.split(": ")[1]
    assert g.search(own_g) and a1.search(own_g, scope="tenant") == []
    assert none.search(own_g, scope="tenant") == []


def test_reload_of_a_hit_stays_in_the_tenant(tenants: dict[str, AutoContextMemory]) -> None:
    a1, a2, g = tenants["a1"], tenants["a2"], tenants["g"]
    hit = next(h for h in a1.search(SHARED, scope="tenant") if h.session_id == a2.session_id)
    [msg] = a1.reload(message_id=hit.message_id, session_id=hit.session_id)
    assert msg.text == a2.messages()[0].text
    assert a1.reload(message_id=1, session_id=a1.session_id) == [a1.messages()[0]]
    answers = set()
    for session, message in ((g.session_id, 1), (a2.session_id, 999), ("never-made", 1)):
        with pytest.raises(MessageNotFound) as info:
            a1.reload(message_id=message, session_id=session)
        answers.add(str(info.value).replace(session, "<s>").replace(str(message), "<m>"))
    assert len(answers) == 1, answers
    # Through the tool: the same plain answer for another tenant's message as for none.
    tool = {
        a1.handle_tool_call(_call("context_reload", {"message_id": m, "session_id": s}))
        for s, m in ((g.session_id, 1), (a2.session_id, 999))
    }
    assert tool == {"No message with that id in that session."}
    read = a1.handle_tool_call(
        _call("context_reload", {"message_id": hit.message_id, "session_id": a2.session_id})
    )
    assert SHARED in read


def test_the_search_tool_answers_within_the_tenant(tenants: dict[str, AutoContextMemory]) -> None:
    a1, a2, g, none = tenants["a1"], tenants["a2"], tenants["g"], tenants["none"]
    assert [t["function"]["name"] for t in a1.tools()] == ["context_reload", "context_search"]
    answer = a1.handle_tool_call(_call("context_search", {"query": SHARED, "scope": "tenant"}))
    assert answer.startswith("2 hit(s) in this tenant's sessions")
    assert a2.session_id in answer and "this session" in answer
    assert g.session_id not in answer and none.session_id not in answer
    own = a1.handle_tool_call(_call("context_search", {"query": SHARED}))
    assert own.startswith("1 hit(s) in this session") and "in your working context" in own
    # The answer says how to read a hit of another session, and that call works.
    reload_args = answer.split("Reload: context_reload ", 1)[1].split(".\n")[0].split(" (")[0]
    assert json.loads(reload_args)["session_id"] == a2.session_id
    assert SHARED in a1.handle_tool_call(_call("context_reload", reload_args))
    none_answer = g.handle_tool_call(
        _call("context_search", {"query": f"own-a1 {a1.session_id[-8:]}", "scope": "tenant"})
    )
    assert none_answer.startswith("No message in this tenant's sessions matches")


def test_the_agents_sdk_search_tool(tenants: dict[str, AutoContextMemory]) -> None:
    from agents.tool_context import ToolContext

    from autoctx.integrations.openai_agents import context_tools

    a1, g = tenants["a1"], tenants["g"]
    (tool,) = [t for t in context_tools(a1) if t.name == "context_search"]
    assert tool.name == "context_search" and tool.params_json_schema["required"] == ["query"]
    arguments = json.dumps({"query": SHARED, "scope": "tenant"})
    ctx = ToolContext(context=None, tool_name=tool.name, tool_call_id="c", tool_arguments=arguments)
    answer = str(asyncio.run(tool.on_invoke_tool(ctx, arguments)))
    assert "2 hit(s)" in answer and g.session_id not in answer


def test_the_cli_searches_as_a_memory_of_the_tenant(
    tenants: dict[str, AutoContextMemory], db_url: str
) -> None:
    a1, a2, g, none = tenants["a1"], tenants["a2"], tenants["g"], tenants["none"]
    result = _cli(SHARED, "--tenant", "acme", "--json", "-d", db_url)
    assert result.exit_code == 0, result.output
    assert {h["session_id"] for h in json.loads(result.stdout)} == {a1.session_id, a2.session_id}
    table = _cli(SHARED, "--tenant", "acme", "-d", db_url)
    assert table.exit_code == 0 and a1.session_id in table.stdout
    assert g.session_id not in table.stdout and "working" in table.stdout
    assert "**" not in table.stdout, "the markers become bold"
    untenanted = json.loads(_cli(SHARED, "--json", "--limit", "100", "-d", db_url).stdout)
    assert none.session_id in {h["session_id"] for h in untenanted}
    assert not {h["session_id"] for h in untenanted} & {a1.session_id, g.session_id}
    one = json.loads(_cli(SHARED, "--session", a2.session_id, "--tenant", "acme", "--json",
                          "-d", db_url).stdout)  # fmt: skip
    assert [h["session_id"] for h in one] == [a2.session_id]
    # Another tenant's session looks like an unknown one.
    for args in (["--session", g.session_id, "--tenant", "acme"], ["--session", a1.session_id]):
        refused = _cli(SHARED, *args, "-d", db_url)
        assert refused.exit_code == 1 and "does not exist" in refused.stderr, refused.output
        assert SHARED not in refused.stderr
    for bad, fragment in ((["   "], "empty"), ([SHARED, "--limit", "0"], "limit")):
        result = _cli(*bad, "-d", db_url)
        assert result.exit_code == 1 and fragment in result.stderr, result.output
        assert "Traceback" not in result.output


# ---------------------------------------------------------------------------------------------
# Database tenancy: a real role granted one tenant
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def acme_role(db_url: str, tenants: dict[str, AutoContextMemory]) -> Iterator[Role]:
    owner = sa.create_engine(db_url, poolclass=sa.NullPool)
    with owner.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        # The index column's statistics exist (its most common lexemes), as pg_stats would
        # show them to a reader the policies do not hide them from.
        conn.execute(sa.text("analyze messages"))
        assert conn.execute(
            sa.text("select count(*) from pg_stats where attname = 'search_tsv'")
        ).scalar_one()
    owner.dispose()
    with login_role(db_url) as role:
        assert autoctx.grant_tenant(role.name, "acme", db_url)
        yield role


def test_a_granted_role_searches_its_tenant_only(
    tenants: dict[str, AutoContextMemory], acme_role: Role
) -> None:
    a1, a2, g = tenants["a1"], tenants["a2"], tenants["g"]
    mem = AutoContextMemory.open(
        f"srch-role-{_tag()}", acme_role.url, tenant="acme", summarizer=OfflineSummarizer()
    )
    mem.add(Msg.user(f"{SHARED} seen by the role"))
    found = {h.session_id for h in mem.search(SHARED, scope="tenant")}
    assert found == {a1.session_id, a2.session_id, mem.session_id}
    assert mem.reload(message_id=1, session_id=a2.session_id)[0].text == a2.messages()[0].text
    with pytest.raises(MessageNotFound):
        mem.reload(message_id=1, session_id=g.session_id)
    # The CLI on the role's URL, naming another tenant: nothing (the policies hide its rows).
    other = _cli(SHARED, "--tenant", "globex", "--json", "-d", acme_role.url)
    assert other.exit_code == 0 and json.loads(other.stdout) == []
    mine = _cli(SHARED, "--tenant", "acme", "--json", "-d", acme_role.url)
    assert {h["session_id"] for h in json.loads(mine.stdout)} == found
    mem.delete()


def test_a_granted_role_can_only_have_the_true_vector_computed(
    tenants: dict[str, AutoContextMemory], acme_role: Role
) -> None:
    """A granted role fills the vectors of its tenant's messages (UPDATE on that one column,
    migration 0013), but whatever it sets, the trigger writes the vector of the content: it
    cannot plant words in the index, nor touch another tenant's rows."""
    mem = AutoContextMemory.open(
        f"srch-plant-{_tag()}", acme_role.url, tenant="acme", summarizer=OfflineSummarizer()
    )
    mem.add(Msg.user("an honest heron-5521 message"))
    g = tenants["g"]
    engine = sa.create_engine(acme_role.url, poolclass=sa.NullPool)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("select set_config('autoctx.tenant', 'acme', true)"))
            planted = conn.execute(
                sa.text(
                    "update messages set search_tsv = to_tsvector('simple', 'planted-word') "
                    "where session_id = any(:s) returning session_id, search_tsv::text"
                ),
                {"s": [mem.session_id, g.session_id]},
            ).all()
            with (
                pytest.raises(sa.exc.ProgrammingError, match="permission denied"),
                conn.begin_nested(),
            ):
                conn.execute(
                    sa.text("update messages set content = '[]' where session_id = :s"),
                    {"s": mem.session_id},
                )
    finally:
        engine.dispose()
    assert [r.session_id for r in planted] == [mem.session_id], "another tenant's row changed"
    assert "planted" not in planted[0].search_tsv and "'heron'" in planted[0].search_tsv
    assert mem.search("planted-word") == []
    assert [h.message_id for h in mem.search("heron-5521")] == [1]
    assert [h.session_id for h in g.search("planted-word", scope="tenant")] == []
    mem.delete()


@pytest.mark.parametrize("tenant", ["globex", ""], ids=["globex", "untenanted"])
def test_a_granted_roles_own_sql_finds_no_other_tenants_words(
    tenants: dict[str, AutoContextMemory], acme_role: Role, tenant: str
) -> None:
    engine = sa.create_engine(acme_role.url, poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("select set_config('autoctx.tenant', :t, false)"), {"t": tenant})
            rows = conn.execute(
                sa.text(
                    "select session_id, ts_headline('simple', content::text, q) from messages, "
                    "websearch_to_tsquery('simple', :q) q where search_tsv @@ q"
                ),
                {"q": SHARED},
            ).all()
            stats = conn.execute(
                sa.text("select count(*) from pg_stats where attname = 'search_tsv'")
            ).scalar_one()
    finally:
        engine.dispose()
    assert rows == []
    assert stats == 0, "the index's lexeme statistics would show other tenants' words"


# ---------------------------------------------------------------------------------------------
# Bad input, deleted sessions, async, and what statements a search sends
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"query": ""}, "empty"),
        ({"query": " \n\t"}, "empty"),
        ({"query": 42}, "must be a string"),
        ({"query": "x" * 1001}, "1001 characters"),
        ({"query": "a\x00b"}, "NUL"),
        ({"query": "\ud800"}, "lone surrogate"),
        ({"query": "ok", "scope": "everything"}, "'session'"),
        ({"query": "ok", "scope": None}, "'tenant'"),
        ({"query": "ok", "limit": 0}, "1 to 100"),
        ({"query": "ok", "limit": 101}, "1 to 100"),
        ({"query": "ok", "limit": True}, "1 to 100"),
        ({"query": "ok", "limit": "5"}, "1 to 100"),
    ],
)
def test_bad_search_input_is_a_clear_error(
    tenants: dict[str, AutoContextMemory], kwargs: dict[str, Any], fragment: str
) -> None:
    mem = tenants["a1"]
    version = mem.version()
    query = kwargs.pop("query")
    with pytest.raises(InvalidSearch, match=fragment) as info:
        mem.search(query, **kwargs)
    assert isinstance(info.value, AutoContextError) and isinstance(info.value, ValueError)
    if isinstance(query, str) and len(query) > 3:
        assert query not in str(info.value)
    assert mem.version() == version


def test_bad_tool_calls_are_answered_not_raised(tenants: dict[str, AutoContextMemory]) -> None:
    mem = tenants["a1"]
    marker = "CONTEXT_OFFLOAD-planted"
    answers = {
        "empty": {"query": ""},
        "no query": {"scope": "tenant"},
        "scope": {"query": "x", "scope": marker},
        "limit": {"query": "x", "limit": 11},
        "json": "{query",
        "nan": '{"query": "x", "limit": NaN}',
    }
    replies = {k: mem.handle_tool_call(_call("context_search", v)) for k, v in answers.items()}
    assert all(r.startswith("Invalid") for r in replies.values()), replies
    assert all(marker not in r and "CONTEXT_OFFLOAD" not in r for r in replies.values())
    reload_replies = [
        mem.handle_tool_call(_call("context_reload", args))
        for args in (
            {"message_id": 0},
            {"message_id": "1"},
            {"message_id": 1, "uuid": str(uuid.uuid4())},
            {"message_id": 1, "session_id": ""},
            {"message_id": 1, "session_id": 7},
        )
    ]
    assert [r.split(":")[0].split(" ")[0] for r in reload_replies] == [
        "Invalid",
        "Invalid",
        "Pass",
        "Invalid",
        "Invalid",
    ], reload_replies
    assert "Unknown tool" in mem.handle_tool_call(_call("context_find", {"query": "x"}))


def test_bad_reload_arguments_are_clear_errors(tenants: dict[str, AutoContextMemory]) -> None:
    mem = tenants["a1"]
    with pytest.raises(InvalidMessageId, match="not both"):
        mem.reload(str(uuid.uuid4()), message_id=1)
    with pytest.raises(InvalidMessageId, match="not neither"):
        mem.reload()
    for bad in (0, -3, True, "1", 2**63):
        with pytest.raises(InvalidMessageId):
            mem.reload(message_id=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidSessionId):
        mem.reload(message_id=1, session_id="")
    with pytest.raises(OffloadNotFound):
        mem.reload(str(uuid.uuid4()), session_id=tenants["a2"].session_id)
    with pytest.raises(MessageNotFound):
        mem.reload(message_id=10**9)


def test_a_deleted_session_cannot_search(open_memory: Open) -> None:
    mem = open_memory()
    mem.add(Msg.user("soon gone"))
    twin = open_memory(mem.session_id)
    mem.delete()
    for scope in ("session", "tenant"):
        with pytest.raises(SessionNotFound):
            twin.search("gone", scope=scope)  # type: ignore[arg-type]
    with pytest.raises(SessionNotFound):
        twin.reload(message_id=1)


def test_the_async_memory_searches_and_reloads(db_url: str) -> None:
    async def main() -> tuple[list[AutoContextSearchHit], list[Msg]]:
        mem = await AsyncAutoContextMemory.open(
            f"srch-async-{_tag()}", db_url, summarizer=OfflineSummarizer()
        )
        await mem.add(Msg.user("async recall works"))
        hits, again = await asyncio.gather(mem.search("recall"), mem.search("async"))
        assert _ids(hits) == _ids(again)
        return hits, await mem.reload(message_id=hits[0].message_id)

    hits, msgs = asyncio.run(main())
    assert len(hits) == 1 and msgs[0].text == "async recall works"


def test_a_session_search_is_pinned_to_its_session(
    tenants: dict[str, AutoContextMemory], recorder: Recorder
) -> None:
    """Scope "session" (and a reload in it) routes to the session's shard like every other
    statement; scope "tenant" is the one read that spans sessions, and names the tenant."""
    mem = tenants["a1"]
    recorder.current = mem.session_id
    mem.search(SHARED)
    mem.reload(message_id=1)
    pinned = [c for c in recorder.statements if _TABLE_RE.search(c.statement)]
    assert len(pinned) >= 3 and not {c.statement[:200]: p for c in pinned if (p := _check(c))}
    recorder.statements.clear()
    mem.search(SHARED, scope="tenant")
    spanning = [c for c in recorder.statements if "FROM messages m" in c.statement]
    assert len(spanning) == 1
    assert "s.tenant = %(tenant)s" in spanning[0].statement
    assert spanning[0].parameters["tenant"] == "acme"
    assert _check(Captured(spanning[0].statement, spanning[0].parameters, mem.session_id))


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    rec = Recorder()
    sa.event.listen(sa.engine.Engine, "before_cursor_execute", rec)
    try:
        yield rec
    finally:
        sa.event.remove(sa.engine.Engine, "before_cursor_execute", rec)


def test_the_search_benchmark_runs_small(admin_url: URL, tmp_path: Path) -> None:
    """bench/search.py at a tiny size, through its command line (the real run loads 1,000,000
    messages and is not part of the suite)."""
    out = tmp_path / "figures.json"
    args = ["--sessions", "4", "--messages-per-session", "50", "--noise-sessions", "2"]
    args += ["--repeats", "2", "--rls-repeats", "1", "--shards", "2", "--json", str(out)]
    proc = subprocess.run(
        [sys.executable, str(BENCH), *args, "--database-url", admin_url.render_as_string(False)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert figures["load"]["originals"] == 200 and figures["load"]["all_originals"] == 300
    by_label = {(q["scope"], q["label"]): q for q in figures["queries"]}
    assert by_label[("tenant", "an id (one message)")]["matches"] == 1
    assert by_label[("tenant", "an id (one message)")]["hits"] == 1
    assert all(len(q["search"]) == len(q["ilike"]) == 2 for q in figures["queries"])
    assert figures["rls"] and figures["fan_out"]


def test_a_search_answer_stays_within_a_reload_page(open_memory: Open) -> None:
    """The tool's answer is never large enough for a compression to offload it
    (docs/design.md §4)."""
    mem = open_memory(config=SMALL)
    mem.add([Msg.user(f"needle {k} " + "haystack " * 120 + f"needle again {k}") for k in range(12)])
    answer = mem.handle_tool_call(_call("context_search", {"query": "needle", "limit": 10}))
    assert len(answer) <= SMALL.reload_page_chars < SMALL.large_payload_chars
    assert answer.startswith("10 hit(s)") and "more hit(s) left out" in answer


# ---------------------------------------------------------------------------------------------
# Hits are content: not autoctx's own tool traffic; marks cover whole tokens (issue 23 item 6)
# ---------------------------------------------------------------------------------------------


def _tool_call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)},
            }
        ],
    }


def test_the_agents_own_context_tool_calls_and_answers_are_not_hits(open_memory: Open) -> None:
    mem = open_memory(config=SMALL)
    mem.add(
        [
            Msg.user("the canary run logged MARKER-0003 before the deploy stalled"),
            Msg.assistant("noted: MARKER-0003 is the last good build"),
        ]
    )
    # The agent searches for the marker, then reloads the hit: calls and answers stored as any
    # other tool traffic of the conversation.
    search_call = _tool_call("call_s", "context_search", {"query": "MARKER-0003"})
    mem.add(search_call)
    answer = mem.handle_tool_call(search_call["tool_calls"][0])
    assert "MARKER" in answer
    mem.add({"role": "tool", "tool_call_id": "call_s", "content": answer})
    reload_call = _tool_call("call_r", "context_reload", {"message_id": 1})
    mem.add(reload_call)
    mem.add(
        {
            "role": "tool",
            "tool_call_id": "call_r",
            "content": mem.handle_tool_call(reload_call["tool_calls"][0]),
        }
    )
    # Another tool's call and answer with the same words are content, and stay hits.
    grep_call = _tool_call("call_g", "grep_logs", {"pattern": "MARKER-0003"})
    mem.add(grep_call)
    mem.add({"role": "tool", "tool_call_id": "call_g", "content": "build.log:12: MARKER-0003"})
    hits = mem.search("MARKER-0003", limit=100)
    assert sorted(h.message_id for h in hits) == [1, 2, 7, 8]
    searched = mem.handle_tool_call(_call("context_search", {"query": "MARKER-0003"}))
    assert searched.startswith("4 hit(s)"), searched


def test_a_highlight_marks_the_whole_token(open_memory: Open) -> None:
    mem = open_memory()
    mem.add(
        [
            Msg.user("the canary run logged MARKER-0003 before the deploy stalled"),
            Msg.user("then req-7f3a failed **badly** at v1.2 in /srv/app/main.py. Then"),
        ]
    )
    snippet = mem.search("MARKER-0003")[0].snippet
    assert "**MARKER-0003**" in snippet and "****" not in snippet, snippet
    # One part of a token marks the token; a `**` of the text is text, not a mark.
    assert "logged **MARKER-0003** before" in mem.search("MARKER")[0].snippet
    snippet = mem.search("req-7f3a")[0].snippet
    assert "then **req-7f3a** failed **badly** at v1.2" in snippet, snippet
    # A path keeps its parts (the index splits it at `/`), and a sentence's period is no part
    # of the word before it.
    snippet = mem.search("main.py")[0].snippet
    assert "/srv/app/**main.py**. Then" in snippet, snippet
