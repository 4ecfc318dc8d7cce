"""Values autoctx reads back from the database, and arguments of its public API, are untrusted:
one bad value gives one of autoctx's own errors, naming the thing and the fix and quoting no
content, and stops nothing else (issue 22, part A).

- A session whose stored config was rewritten outside autoctx is skipped by the worker and
  reported; the other sessions are compressed; `autoctx worker --once` exits 1.
- A search query the tsquery parser cannot take, or a session recording an unknown
  `search_config`, never makes a search raise a database error or a bare ValueError.
- A message the rest of autoctx accepts is never refused by the search index's size limit.
- Small arguments (pop_last's remainder, a plan with a NUL, huge ids and ages, a dict config,
  a bad reload page) and a migration the database refuses.
- The offline summarizer keeps to a token budget measured the way the compressor checks it.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import uuid
from collections.abc import Callable

import pytest
import sqlalchemy as sa

from autoctx import (
    AutoContextConfig,
    AutoContextMemory,
    ConfigError,
    InvalidDuration,
    InvalidMessage,
    InvalidMessageId,
    InvalidPage,
    InvalidPlan,
    InvalidStoredConfig,
    Msg,
    OfflineSummarizer,
    SchemaError,
    ToolUseBlock,
    purge_sessions,
    upgrade_database,
)
from autoctx._prompts import build_request
from autoctx._store.claims import due_sessions
from autoctx._tokens import TokenCounter
from autoctx._worker import AutoContextWorker, Compressed
from tests.histories import SMALL, multi_round

SECRET = "card-4111111111111111"
CLI = [sys.executable, "-m", "autoctx._cli"]


def _due(open_memory: Callable[..., AutoContextMemory], sid: str, tenant: str) -> str:
    mem = open_memory(sid, config=SMALL, tenant=tenant)
    mem.add(multi_round(7, rounds=4, steps=8))
    assert mem.needs_compression()
    mem.close()
    return sid


def _owner_sql(db_url: str, statement: str, **params: object) -> None:
    engine = sa.create_engine(db_url, poolclass=sa.NullPool)
    with engine.begin() as conn:
        conn.execute(sa.text(statement), params)
    engine.dispose()


# -- item 1: one tenant's bad config does not stop the worker for the others -----------------


@pytest.mark.parametrize(
    "rewrite",
    [
        # The UPDATE, on both thresholds the due query reads.
        "jsonb_set(jsonb_set(config, '{max_tokens}', '\"x\"'), '{msg_threshold}', '\"x\"')",
        "jsonb_set(config, '{msg_threshold}', '-5')",
        "'\"not an object\"'::jsonb",
        "jsonb_set(config, '{prompts}', '[1, 2]')",
    ],
    ids=["strings", "negative", "scalar", "prompts-list"],
)
def test_a_session_with_a_bad_stored_config_is_skipped_and_the_others_compressed(
    rewrite: str, db_url: str, open_memory: Callable[..., AutoContextMemory]
) -> None:
    tag = uuid.uuid4().hex[:6]
    bad = _due(open_memory, f"bad-{tag}", "mallory")
    good = _due(open_memory, f"good-{tag}", "alice")
    _owner_sql(db_url, f"UPDATE sessions SET config = {rewrite} WHERE session_id = :s", s=bad)

    done: list[Compressed] = []
    with AutoContextWorker(
        db_url, summarizer=OfflineSummarizer(), on_compressed=done.append
    ) as worker:
        worker.run(once=True)
        assert worker.failures == 1
    assert [d.session_id for d in done if d.session_id in (bad, good)] == [good]
    assert not open_memory(good, tenant="alice").needs_compression()

    # Opening it says which session, which field and how to repair it, and never the value.
    with pytest.raises(InvalidStoredConfig, match=f"session {bad!r}") as refused:
        AutoContextMemory.open(bad, db_url, tenant="mallory", create=False)
    assert "AutoContextConfig(" in str(refused.value)
    assert '"x"' not in str(refused.value) and "not an object" not in str(refused.value)
    # Opening it with a config records valid thresholds: the repair the error names.
    repaired = open_memory(bad, config=SMALL, tenant="mallory")
    assert repaired.needs_compression()
    repaired.close()
    with AutoContextWorker(db_url, summarizer=OfflineSummarizer()) as worker:
        assert worker.run(once=True) >= 1
        assert worker.failures == 0


def test_the_due_query_reads_numbers_past_every_type_without_failing(
    db_url: str, open_memory: Callable[..., AutoContextMemory]
) -> None:
    """Numbers past int and float8 (valid JSON, and valid thresholds to Python) do not make
    the look for due sessions fail for everyone."""
    sid = _due(open_memory, f"huge-{uuid.uuid4().hex[:6]}", "mallory")
    _owner_sql(
        db_url,
        "UPDATE sessions SET config = jsonb_set(jsonb_set(config, '{max_tokens}', '1e400'), "
        "'{msg_threshold}', '1e400') WHERE session_id = :s",
        s=sid,
    )
    engine = sa.create_engine(db_url, poolclass=sa.NullPool)
    assert sid in [d.session_id for d in due_sessions(engine, limit=1000)]
    engine.dispose()
    # A number past a 32-bit integer is no threshold: opening says so, naming the field.
    with pytest.raises(InvalidStoredConfig, match=r"'max_tokens'|'msg_threshold'"):
        AutoContextMemory.open(sid, db_url, tenant="mallory", create=False)
    # Repaired, so that the module's later worker runs find nothing of this test to fail on.
    open_memory(sid, config=SMALL, tenant="mallory").close()


def test_the_worker_command_once_exits_1_when_a_session_failed(
    db_url: str, open_memory: Callable[..., AutoContextMemory]
) -> None:
    tag = uuid.uuid4().hex[:6]
    bad = _due(open_memory, f"cli-bad-{tag}", "mallory")
    good = _due(open_memory, f"cli-good-{tag}", "alice")
    _owner_sql(
        db_url,
        "UPDATE sessions SET config = jsonb_set(jsonb_set(config, '{max_tokens}', '\"x\"'), "
        "'{msg_threshold}', '\"x\"') WHERE session_id = :s",
        s=bad,
    )
    run = [sys.executable, "-m", "autoctx._cli", "worker", "--once", "--offline"]
    out = subprocess.run(
        [*run, "--database-url", db_url], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 1, out.stderr
    assert f"compressed {good}:" in out.stdout
    assert f"{bad!r}" in out.stderr and "InvalidStoredConfig" in out.stderr
    # Nothing left to fail: the bad session is the only one due, and it is repaired.
    open_memory(bad, config=SMALL, tenant="mallory").close()
    again = subprocess.run(
        [*run, "--database-url", db_url], capture_output=True, text=True, timeout=300
    )
    assert again.returncode == 0, again.stderr


# -- item 6: a model-controlled query, and one session's bad search_config ---------------------


@pytest.mark.parametrize("query", ["-" * 33, "- " * 40 + "deploy", "deploy " + "-" * 200])
def test_a_run_of_negations_is_a_search_never_a_database_error(
    query: str, open_memory: Callable[..., AutoContextMemory]
) -> None:
    mem = open_memory(tenant="acme")
    mem.add(Msg.user("the deploy failed on host alpha"))
    for scope in ("session", "tenant"):
        assert isinstance(mem.search(query, scope=scope), list)
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "context_search", "arguments": json.dumps({"query": query})},
    }
    answer = mem.handle_tool_call(call)
    assert isinstance(answer, str) and "error" not in answer.lower()


def test_one_session_with_an_unknown_search_config_does_not_break_tenant_search(
    db_url: str, open_memory: Callable[..., AutoContextMemory]
) -> None:
    tenant = f"t-{uuid.uuid4().hex[:6]}"
    mem = open_memory(tenant=tenant)
    mem.add(Msg.user("the deploy failed on host alpha"))
    other = open_memory(f"other-{uuid.uuid4().hex[:6]}", tenant=tenant)
    other.add(Msg.user("nothing here"))
    _owner_sql(
        db_url,
        "UPDATE sessions SET config = jsonb_set(config, '{search_config}', '\"klingon\"') "
        "WHERE session_id = :s",
        s=other.session_id,
    )
    hits = mem.search("deploy", scope="tenant")
    assert [h.session_id for h in hits] == [mem.session_id]


# -- item 9: the search index never refuses a message autoctx accepts --------------------------

#: Four-byte letters (CJK extension B): with hyphenated pairs of them, each character costs
#: close to 8 bytes of tsvector (the compound and its part both hold it).
_EXT_B = [chr(c) for c in range(0x20000, 0x2A6DF)]


def _hyphenated_pairs(chars: int, offset: int = 0) -> str:
    n, words, total = len(_EXT_B), [], 0
    i = offset
    while total < chars:
        a, b = 2 * i, 2 * i + 1
        word = _EXT_B[a % n] + _EXT_B[(a // n) % n] + "-" + _EXT_B[b % n] + _EXT_B[(b // n) % n]
        words.append(word)
        total += len(word) + 1
        i += 1
    return " ".join(words)[:chars]


def test_to_tsvector_of_the_indexed_cap_of_the_worst_text_is_under_the_limit(db_url: str) -> None:
    """The bound migration 0010's cap rests on: 120,000 characters (its plain and argument caps
    together) of hyphenated pairs of four-byte letters make a vector PostgreSQL accepts, while
    150,000 (migration 0008's caps) do not."""
    engine = sa.create_engine(db_url, poolclass=sa.NullPool)
    with engine.connect() as conn:
        vector = "SELECT length(to_tsvector('simple', :t))"
        assert conn.execute(sa.text(vector), {"t": _hyphenated_pairs(120_000)}).scalar_one()
        conn.rollback()
        with pytest.raises(sa.exc.OperationalError, match="too long for tsvector"):
            conn.execute(sa.text(vector), {"t": _hyphenated_pairs(150_000)})
    engine.dispose()


def test_a_149009_character_message_of_hyphenated_cjk_pairs_is_stored(
    open_memory: Callable[..., AutoContextMemory],
) -> None:
    text = "findme " + _hyphenated_pairs(98_993)
    arguments = json.dumps({"q": _hyphenated_pairs(50_000, offset=40_000)}, ensure_ascii=False)
    msg = Msg.assistant(text, [ToolUseBlock("call_1", "lookup", arguments)])
    assert msg.payload_chars == 149_009
    mem = open_memory()
    (stored,) = mem.add(msg)
    assert mem.messages()[-1].id == stored.id
    # The start of the text is searchable; what lies past the indexed cap is stored only.
    assert [h.message_id for h in mem.search("findme")] == [stored.id]
    assert mem.search(text[-20:].split()[-2]) == []


# -- item 10: small arguments ----------------------------------------------------------------


def test_pop_last_checks_the_remainder_split_returns(
    open_memory: Callable[..., AutoContextMemory],
) -> None:
    mem = open_memory()
    mem.add([Msg.user("start"), Msg.assistant("one; two")])
    before = (mem.version(), [m.id for m in mem.messages()])
    bad: list[object] = [
        Msg.assistant(f"two {SECRET}\x00"),  # not storable
        Msg.tool("call_9", f"{SECRET}"),  # a tool result that answers nothing
        Msg.user("two"),  # another role
        Msg.assistant("x" * 2_000_001),  # over max_message_chars
        f"two {SECRET}",  # not a Msg
    ]
    for rest in bad:
        with pytest.raises(InvalidMessage, match="pop_last") as refused:
            mem.pop_last(lambda _last, rest=rest: rest)  # type: ignore[misc]
        assert SECRET not in str(refused.value)
        assert (mem.version(), [m.id for m in mem.messages()]) == before
    popped = mem.pop_last(lambda last: Msg.assistant("two"))
    assert popped is not None and popped.text == "one; two"
    assert mem.messages()[-1].text == "two"


def test_set_plan_with_a_nul_names_the_field_and_quotes_nothing(
    open_memory: Callable[..., AutoContextMemory],
) -> None:
    mem = open_memory()
    for plan in (
        {"goal": f"ship {SECRET}\x00"},
        {"goal": "ship", "steps": [{"title": f"{SECRET}\x00"}]},
        {"goal": "ship", "expected_outcome": f"{SECRET}\ud800"},
    ):
        with pytest.raises(InvalidPlan) as refused:
            mem.set_plan(plan)
        assert SECRET not in str(refused.value)


@pytest.mark.parametrize("big", [2**63, 2**64 + 5])
def test_message_ids_past_bigint_are_invalid_message_ids(
    big: int, open_memory: Callable[..., AutoContextMemory]
) -> None:
    # Malformed (no bigint holds it), so the same error in every call (test_public_api).
    mem = open_memory()
    mem.add(Msg.user("hello"))
    with pytest.raises(InvalidMessageId, match="positive integer"):
        mem.fork(f"fork-{uuid.uuid4().hex[:6]}", at_message=big)
    with pytest.raises(InvalidMessageId, match="positive integer"):
        mem.erase([big], reason="test")


@pytest.mark.parametrize("age", ["3000000d", "9" * 5000 + "d"])
def test_purge_with_an_age_past_the_calendar_is_an_invalid_duration(age: str, db_url: str) -> None:
    with pytest.raises(InvalidDuration):
        purge_sessions(age, db_url, dry_run=True)


def test_purge_command_with_an_age_past_the_calendar(db_url: str) -> None:
    out = subprocess.run(
        [*CLI, "purge", "--older-than", "3000000d", "--dry-run", "--database-url", db_url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0
    assert "Traceback" not in out.stderr and "100000 days" in out.stderr + out.stdout


def test_open_with_a_dict_config_is_a_config_error(db_url: str, session_id: str) -> None:
    with pytest.raises(ConfigError, match=r"AutoContextConfig\(\*\*"):
        AutoContextMemory.open(session_id, db_url, {"max_tokens": 1000})  # type: ignore[arg-type]


@pytest.mark.parametrize(("offset", "limit"), [(-1, None), (0, 0), (0, -3)])
def test_reload_with_a_bad_page_is_an_invalid_page(
    offset: int, limit: int | None, open_memory: Callable[..., AutoContextMemory]
) -> None:
    mem = open_memory()
    (msg,) = mem.add(Msg.user("hello"))
    with pytest.raises(InvalidPage, match=r"offset|limit"):
        mem.reload(message_id=msg.id, offset=offset, limit=limit)


# -- item 11: a migration the database refuses ------------------------------------------------


def test_a_failed_migration_is_a_schema_error_naming_the_cause(empty_db_url: str) -> None:
    _owner_sql(empty_db_url, "CREATE TABLE working_set (x int)")
    with pytest.raises(SchemaError, match="DuplicateTable") as refused:
        upgrade_database(empty_db_url)
    assert "working_set" in str(refused.value) and "autoctx db upgrade" in str(refused.value)
    engine = sa.create_engine(empty_db_url, poolclass=sa.NullPool)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT to_regclass('sessions')")).scalar() is None
    engine.dispose()


# -- the offline summarizer keeps its token budget --------------------------------------------


def _dense(seed: int) -> list[Msg]:
    """Ids, hashes and numbers: fewer characters a token than prose."""
    rnd = random.Random(seed)
    out: list[Msg] = []
    for i in range(40):
        out.append(
            Msg.user(
                f"step {i}: check {uuid.UUID(int=rnd.getrandbits(128))} at "
                f"/srv/app/{rnd.randrange(10**6)}/x.py port={rnd.randrange(1000, 9999)} "
                f"id={rnd.getrandbits(64):x}"
            )
        )
        out.append(
            Msg.assistant(
                " ".join(f"{rnd.getrandbits(40):x}-{rnd.randrange(999)}" for _ in range(30))
            )
        )
    return out


@pytest.mark.parametrize("budget", [200, 1056])
def test_the_offline_summarizer_keeps_the_token_budget_it_is_given(budget: int) -> None:
    counter = TokenCounter("gpt-4o-mini")
    for seed in range(10):
        request = build_request(7, _dense(seed), token_budget=budget, count_tokens=counter.count)
        text = OfflineSummarizer().summarize(request).text
        assert counter.count(text) <= budget, seed
        assert "lines kept" in text


def test_offline_folds_are_never_over_budget(open_memory: Callable[..., AutoContextMemory]) -> None:
    """End to end: the compressor's check of the fold's answer, with the offline summarizer as
    the session's own (no fallback to clip it)."""
    config = AutoContextConfig(max_tokens=8_000, msg_threshold=1000)
    mem = open_memory(config=config)
    for seed in range(6):
        mem.add(_dense(seed))
        mem.compress_if_needed()
    errors = [e.error or "" for e in mem.events() if e.status == "failed"]
    assert not [e for e in errors if "the request allowed" in e], errors
