"""The `autoctx` command line, against a real migrated PostgreSQL.

One small demo session (`demo --rounds 2 --steps 40`) is generated once per module and every
inspection command is run against it; the checks compare what the commands print or write with
what the store holds.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import typer
from click.testing import Result
from typer.core import TyperGroup
from typer.testing import CliRunner

from autoctx import AutoContextClient, AutoContextConfig, AutoContextMemory, OfflineSummarizer
from autoctx._cli import app
from autoctx._cli import root as cli_root
from autoctx._demo import generate
from autoctx._plot import Mark, Point, Series, reconstruct, render
from autoctx._store.inspect import message_stamps, offload_rows
from autoctx._store.store import SessionStore
from autoctx._tags import OFFLOAD_TAG_RE

UNREACHABLE = "postgresql://x@127.0.0.1:1/db"
# Wide enough that no table column is cut short; the narrow layout has its own test.
WIDE = {"COLUMNS": "200", "OPENAI_BASE_URL": "", "OPENAI_API_KEY": ""}


def invoke(args: Sequence[str], env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(app, list(args), env={**WIDE, **(env or {})})


def assert_one_line_error(result: Result, *needles: str) -> None:
    """Exit code non-zero, stderr one readable line naming the problem, no traceback."""
    assert result.exit_code != 0, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("autoctx: error: "), lines[0]
    assert "Traceback" not in result.output + result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.fixture(scope="module")
def demo_run(db_url: str) -> tuple[str, Result]:
    result = invoke(["demo", "--rounds", "2", "--steps", "40", "--database-url", db_url])
    assert result.exit_code == 0, result.output + result.stderr
    match = re.search(r"autoctx demo: session (\S+)", result.stdout)
    assert match is not None, result.stdout
    return match.group(1), result


@pytest.fixture(scope="module")
def demo_id(demo_run: tuple[str, Result]) -> str:
    return demo_run[0]


#: The store of a session, by its id (a store is bound to one session).
StoreOf = Callable[[str], SessionStore]


@pytest.fixture(scope="module")
def store(db_url: str) -> StoreOf:
    engine = AutoContextClient.shared(db_url, auto_upgrade=False).engine
    return lambda session_id: SessionStore(engine, session_id)


# -- demo -----------------------------------------------------------------------------------


def test_demo_runs_end_to_end_and_compresses(demo_run: tuple[str, Result], store: StoreOf) -> None:
    session_id, result = demo_run
    out = result.stdout
    assert session_id.startswith("demo-")
    info = store(session_id).get_session()
    assert info is not None
    events = store(session_id).events()
    applied = [e for e in events if e.status == "applied"]
    assert applied, "the small demo must compress at least once"
    # Every event was printed live with its offload's short id.
    # A masking pass (one event) says how many offloads it made, one per output.
    for e in applied:
        assert (
            str(e.offload_uuid)[:8] if e.offload_uuid else f"{len(e.replaced_ids)} offloads"
        ) in out
    assert "offline extractive summarizer" in out
    # Window report: the final totals as stored.
    assert f"working context: {info.token_count:,} / 32,000 tokens" in out
    # Reload proof: the originals came back identical; restart proof: identical totals.
    assert re.search(r"(\d+) of \1 original\(s\) identical to what was added", out), out
    assert f"restart: closed, reopened {session_id} by id: {info.message_count} messages" in out
    assert "working context identical" in out and "= session total" in out
    # How rarely and how deeply it compressed, from the same events.
    words = r"compression fired after (\d+) of (\d+) steps and reached the target (\d+) times; "
    rate = re.search((words + r"(\d+) summarizer calls").replace(" ", r"\s+"), out)
    assert rate is not None, out
    fired, steps, reached, calls = (int(g) for g in rate.groups())
    assert 0 < reached <= fired < steps
    assert calls == sum(e.model is not None and e.reason != "fallback" for e in events)
    for command in ("history", "show", "reload", "lineage", "plot", "export"):
        assert f"autoctx {command} {session_id}" in out


def test_demo_stays_within_the_window_after_every_step(demo_id: str, db_url: str) -> None:
    series = reconstruct(
        message_stamps(AutoContextClient.shared(db_url, auto_upgrade=False).engine, demo_id),
        SessionStore(AutoContextClient.shared(db_url, auto_upgrade=False).engine, demo_id).events(),
    )
    assert max(p.tokens for p in series.points) < 32_000


def test_demo_is_deterministic_for_a_seed(db_url: str) -> None:
    """The same seed stores the same originals. (Compression figures may differ by a token or
    two: every summary carries a fresh random offload uuid.)"""
    engine = AutoContextClient.shared(db_url, auto_upgrade=False).engine
    runs = []
    for _ in range(2):
        result = invoke(["demo", "--rounds", "1", "--steps", "8", "--seed", "5", "-d", db_url])
        assert result.exit_code == 0, result.stderr
        sid = re.search(r"autoctx demo: session (\S+)", result.stdout)
        assert sid is not None
        with engine.connect() as conn:
            runs.append(
                conn.execute(
                    sa.text(
                        "SELECT role, tokens, content FROM messages WHERE session_id = :s "
                        "AND kind = 'original' ORDER BY id"
                    ),
                    {"s": sid.group(1)},
                ).all()
            )
    assert runs[0] == runs[1]
    assert len(runs[0]) > 20


def test_generated_session_has_parallel_calls_and_large_outputs() -> None:
    steps = list(generate(rounds=3, steps=30, seed=1))
    messages = [m for s in steps for m in s.messages]
    assert messages[0]["role"] == "system"
    parallel = [m for m in messages if len(m.get("tool_calls", ())) >= 2]
    assert parallel, "some steps call several tools at once"
    for step in steps:
        calls = [c["id"] for m in step.messages for c in m.get("tool_calls", ())]
        answered = [m["tool_call_id"] for m in step.messages if m["role"] == "tool"]
        assert calls == answered  # every call answered, in order, in the same step
    outputs = " ".join(m["content"] for m in messages if m["role"] == "tool")
    assert "FAILURES" in outputs and "Traceback" in outputs  # test logs
    assert max(len(m["content"]) for m in messages if m["role"] == "tool") > 3000
    users = [m for m in messages if m["role"] == "user"]
    assert len(users) == 4  # three rounds and the long task
    assert steps == list(generate(rounds=3, steps=30, seed=1))


def test_demo_prefixes_a_given_session_id_and_refuses_an_existing_one(db_url: str) -> None:
    name = f"mine-{uuid.uuid4().hex[:6]}"
    result = invoke(["demo", "--rounds", "1", "--steps", "0", "--session", name, "-d", db_url])
    assert result.exit_code == 0, result.stderr
    assert f"autoctx demo: session demo-{name}" in result.stdout
    again = invoke(["demo", "--rounds", "1", "--steps", "0", "--session", name, "-d", db_url])
    assert_one_line_error(again, f"demo-{name}", "already exists")


# -- db -------------------------------------------------------------------------------------


def test_db_current_and_upgrade_on_a_fresh_database(empty_db_url: str) -> None:
    before = invoke(["db", "current", "--database-url", empty_db_url])
    assert before.exit_code == 0
    assert "no autoctx schema yet" in before.stdout and "autoctx db upgrade" in before.stdout
    assert invoke(["db", "current", "--check", "-d", empty_db_url]).exit_code == 1
    # A reader never migrates: it says how to.
    assert_one_line_error(invoke(["sessions", "-d", empty_db_url]), "autoctx db upgrade")

    up = invoke(["db", "upgrade", "--database-url", empty_db_url])
    assert up.exit_code == 0, up.stderr
    assert "schema upgraded from nothing to" in up.stdout
    again = invoke(["db", "upgrade", "--database-url", empty_db_url])
    assert "already at revision" in again.stdout
    now = invoke(["db", "current", "--check", "-d", empty_db_url])
    assert now.exit_code == 0 and "up to date" in now.stdout


# -- inspection -----------------------------------------------------------------------------


def test_sessions_lists_and_filters(demo_id: str, db_url: str, store: StoreOf) -> None:
    result = invoke(["sessions", "--prefix", "demo-", "--database-url", db_url])
    assert result.exit_code == 0, result.stderr
    info = store(demo_id).get_session()
    assert info is not None
    row = next(line for line in result.stdout.splitlines() if demo_id in line)
    assert f"{info.token_count:,}" in row and str(info.message_count) in row
    none = invoke(["sessions", "--prefix", "no-such-prefix-", "-d", db_url])
    assert none.exit_code == 0 and "no sessions" in none.stdout


@pytest.mark.parametrize(
    ("tenant", "needle"),
    [("", "tenant is empty"), ("acme\udc80", "not valid Unicode"), ("t" * 256, "limit is 255")],
)
def test_sessions_refuses_a_tenant_filter_that_is_no_tenant_name(
    db_url: str, tenant: str, needle: str
) -> None:
    # A lone surrogate reaches argv from a name that is not UTF-8 (Python's surrogateescape).
    assert_one_line_error(invoke(["sessions", "--tenant", tenant, "-d", db_url]), needle)


def test_show_lists_the_working_context(demo_id: str, db_url: str, store: StoreOf) -> None:
    result = invoke(["show", demo_id, "--database-url", db_url])
    assert result.exit_code == 0, result.stderr
    working = store(demo_id).load_working()
    # One row per message (its content wraps onto lines of its own below the row's first).
    row = re.compile(r"^\s*(\d+)\s+(\d+)\s+(system|user|assistant|tool)\*?\s+(\S+)\s", re.M)
    rows = row.findall(result.stdout)
    assert [(int(r[0]), int(r[1]), r[2], r[3]) for r in rows] == [
        (k, m.id, m.role, m.kind) for k, m in enumerate(working)
    ]
    full = invoke(["show", demo_id, "--full", "-d", db_url])
    assert full.exit_code == 0
    # Every summary and preview is shown whole, its offload tag included.
    derived = [m for m in working if m.kind != "original"]
    assert derived
    assert len(OFFLOAD_TAG_RE.findall(full.stdout)) >= len(derived)


def test_history_shows_every_event(demo_id: str, db_url: str, store: StoreOf) -> None:
    result = invoke(["history", demo_id, "--database-url", db_url])
    assert result.exit_code == 0, result.stderr
    events = store(demo_id).events()
    for e in events:
        assert re.search(rf"^\s*{e.id}\s+\S+\s+S{e.strategy} ", result.stdout, re.M)
        assert f"{e.tokens_before:,}→{e.tokens_after:,}" in result.stdout
    assert "events per kind" in result.stdout


def test_history_and_dropped_show_the_fact_check(demo_id: str, db_url: str, store: StoreOf) -> None:
    """Each summary's fact check in `autoctx history` (table and --json), and `autoctx
    dropped` for a compression (docs/design.md §6)."""
    events = store(demo_id).events()
    checked = [e for e in events if e.facts is not None]
    assert checked
    rows = {
        r["id"]: r for r in json.loads(invoke(["history", demo_id, "--json", "-d", db_url]).stdout)
    }
    for e in events:
        facts = rows[e.id]["facts"]
        if e.facts is None:
            assert facts is None
            continue
        f = e.facts
        assert facts == {
            "found": f.found,
            "kept": f.kept,
            "repaired": f.repaired,
            "listed": f.listed,
            "dropped": f.dropped,
            "repair_calls": f.repair_calls,
            "dropped_facts": list(f.dropped_facts),
        }
    table = invoke(["history", demo_id, "-d", db_url], env={"COLUMNS": "250"}).stdout
    for e in checked:
        assert re.search(
            rf"^\s*{e.id}\s.*\s{e.facts.found - e.facts.dropped}/{e.facts.found}\s", table, re.M
        ), e.id
    narrow = invoke(["history", demo_id, "-d", db_url], env={"COLUMNS": "60"}).stdout
    first = checked[0].facts
    assert re.search(rf"facts\s+{first.found} found: {first.kept} kept, ", narrow)
    event = checked[-1]
    listed = invoke(["dropped", demo_id, str(event.id), "--json", "-d", db_url])
    assert listed.exit_code == 0, listed.stderr
    doc = json.loads(listed.stdout)
    assert doc["event_id"] == event.id and doc["offload_uuid"] == str(event.offload_uuid)
    assert isinstance(doc["dropped"], list)
    plain = invoke(["dropped", demo_id, str(event.id), "-d", db_url])
    assert plain.exit_code == 0 and f"event {event.id}" in plain.stdout
    missing = invoke(["dropped", demo_id, "99999", "-d", db_url])
    assert missing.exit_code != 0
    assert "no compression event 99999" in missing.stderr and "Traceback" not in missing.stderr


def test_history_fits_a_narrow_terminal(demo_id: str, db_url: str, store: StoreOf) -> None:
    result = invoke(["history", demo_id, "-d", db_url], env={"COLUMNS": "80"})
    assert result.exit_code == 0
    assert max(len(line) for line in result.stdout.splitlines()) <= 80
    first = next(e for e in store(demo_id).events() if e.offload_uuid is not None)
    assert str(first.offload_uuid)[:8] in result.stdout  # the id to reload stays whole


def test_lineage_walks_down_to_the_originals(demo_id: str, db_url: str, store: StoreOf) -> None:
    engine = AutoContextClient.shared(db_url, auto_upgrade=False).engine
    summary = next(e.summary_message_id for e in store(demo_id).events() if e.strategy in (1, 4, 6))
    with engine.connect() as conn:
        originals = (
            conn.execute(
                sa.text(
                    """
                WITH RECURSIVE d(id) AS (
                    SELECT replaced_id FROM lineage WHERE session_id = :s AND summary_id = :m
                    UNION ALL
                    SELECT l.replaced_id FROM lineage l JOIN d ON l.summary_id = d.id
                    WHERE l.session_id = :s)
                SELECT d.id FROM d JOIN messages m ON m.session_id = :s AND m.id = d.id
                WHERE m.kind = 'original'
                """
                ),
                {"s": demo_id, "m": summary},
            )
            .scalars()
            .all()
        )
    result = invoke(["lineage", demo_id, str(summary), "--database-url", db_url])
    assert result.exit_code == 0, result.stderr
    shown = {int(i) for i in re.findall(r"#(\d+) \w+ original ", result.stdout)}
    assert shown == set(originals)
    assert f"{len(originals)} original message(s) behind #{summary}" in result.stdout

    # From an original upwards: which working message covers it now.
    below = invoke(["lineage", demo_id, str(min(originals)), "-d", db_url])
    assert below.exit_code == 0
    assert "covered now by #" in below.stdout
    # --json: every node of the tree with its id, tokens and text.
    doc = json.loads(invoke(["lineage", demo_id, str(summary), "--json", "-d", db_url]).stdout)
    stored = store(demo_id).load_messages(set(originals) | {summary})

    def nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
        yield node
        for child in node["children"]:
            yield from nodes(child)

    seen = {n["id"]: n for n in nodes(doc["tree"])}
    assert set(originals) <= set(seen) and sorted(doc["originals"]) == sorted(originals)
    for mid in [summary, *originals]:
        assert seen[mid]["tokens"] == stored[mid].tokens
        assert stored[mid].text in seen[mid]["text"] and seen[mid]["text"]


def test_history_filters_by_strategy_status_and_time(
    demo_id: str, db_url: str, store: StoreOf
) -> None:
    events = store(demo_id).events()

    def shown(*options: str) -> list[int]:
        result = invoke(["history", demo_id, *options, "--json", "-d", db_url])
        assert result.exit_code == 0, result.output
        return [e["id"] for e in json.loads(result.stdout)]

    assert shown() == [e.id for e in events]
    assert shown("--strategy", "fold") == [e.id for e in events if e.strategy == 7]
    assert shown("-s", "S7") == shown("-s", "7") == shown("-s", "history-fold")
    wanted = [e.id for e in events if e.strategy in (5, 6) and e.status == "applied"]
    assert shown("-s", "5", "-s", "6", "--status", "applied") == wanted
    assert shown("--since", "1h") == [e.id for e in events]  # the demo ran just now
    assert shown("--until", "1h") == []
    text = invoke(["history", demo_id, "-s", "fold", "-d", db_url]).stdout
    assert f"of {len(events)} events" in text
    for bad, option in (("bogus", "--strategy"), ("nope", "--status"), ("2x", "--since")):
        assert_one_line_error(invoke(["history", demo_id, option, bad, "-d", db_url]), bad)


def test_reload_prints_the_offloaded_originals(demo_id: str, db_url: str, store: StoreOf) -> None:
    event = next(e for e in store(demo_id).events() if e.offload_uuid is not None)
    originals = store(demo_id).reload(event.offload_uuid)  # type: ignore[arg-type]
    full = invoke(["reload", demo_id, str(event.offload_uuid), "--database-url", db_url])
    assert full.exit_code == 0, full.stderr
    assert f"{len(originals)} message(s)" in full.stdout
    for msg in originals:
        assert f"#{msg.id} {msg.role} {msg.kind}" in full.stdout
    # A unique prefix, as history shows it, is enough; --json gives each message's id, kind,
    # tokens and text, and the message in OpenAI format.
    short = invoke(["reload", demo_id, str(event.offload_uuid)[:8], "--json", "-d", db_url])
    assert short.exit_code == 0, short.stderr
    doc = json.loads(short.stdout)
    assert doc["offload_uuid"] == str(event.offload_uuid) and doc["event_id"] == event.id
    assert doc["strategy"] == event.strategy
    assert [m["message"] for m in doc["messages"]] == [m.to_openai() for m in originals]
    assert [(m["id"], m["role"], m["kind"], m["tokens"]) for m in doc["messages"]] == [
        (m.id, m.role, m.kind, m.tokens) for m in originals
    ]
    assert doc["tokens"] == sum(m.tokens or 0 for m in originals)
    for shown, msg in zip(doc["messages"], originals, strict=True):
        assert msg.text in shown["text"]
        for use in msg.tool_uses:
            assert use.name in shown["text"]


def test_plot_writes_a_png_that_matches_the_totals(
    demo_id: str, db_url: str, store: StoreOf, tmp_path: Path
) -> None:
    out = tmp_path / "tokens.png"
    result = invoke(["plot", demo_id, "-o", str(out), "--database-url", db_url])
    assert result.exit_code == 0, result.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.stat().st_size > 20_000
    # The replayed series ends exactly at the session's stored totals.
    engine = AutoContextClient.shared(db_url, auto_upgrade=False).engine
    series = reconstruct(message_stamps(engine, demo_id), store(demo_id).events())
    info = store(demo_id).get_session()
    assert info is not None
    last = series.points[-1]
    assert (last.tokens, last.messages) == (info.token_count, info.message_count)
    assert f"now {info.token_count:,}" in result.stdout
    by_time = invoke(["plot", demo_id, "-o", str(tmp_path / "t.png"), "--x", "time", "-d", db_url])
    assert by_time.exit_code == 0 and (tmp_path / "t.png").exists()


def test_export_writes_the_whole_session(
    demo_id: str, db_url: str, store: StoreOf, tmp_path: Path
) -> None:
    out = tmp_path / "session.json"
    result = invoke(["export", demo_id, "-o", str(out), "--database-url", db_url])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(out.read_text())
    mem = AutoContextMemory.open(demo_id, db_url, summarizer=OfflineSummarizer(), create=False)
    assert doc["working_context"] == mem.to_openai()
    assert doc["session"]["token_count"] == mem.token_count()
    events = store(demo_id).events()
    assert [e["id"] for e in doc["events"]] == [e.id for e in events]
    stored = offload_rows(store(demo_id).engine, demo_id)
    assert {o["uuid"] for o in doc["offloads"]} == {str(r.uuid) for r in stored}
    first = doc["offloads"][0]
    assert [m["message"] for m in first["messages"]] == [
        m.to_openai() for m in store(demo_id).reload(uuid.UUID(first["uuid"]))
    ]
    # Standard output when no file is given.
    piped = invoke(["export", demo_id, "-d", db_url])
    assert json.loads(piped.stdout)["session"]["session_id"] == demo_id


# -- errors and help ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["show", "no-such-session"],
        ["history", "no-such-session"],
        ["lineage", "no-such-session", "1"],
        ["reload", "no-such-session", str(uuid.uuid4())],
        ["plot", "no-such-session"],
        ["export", "no-such-session"],
    ],
)
def test_unknown_session_is_one_line(args: list[str], db_url: str) -> None:
    assert_one_line_error(
        invoke([*args, "--database-url", db_url]), "no-such-session", "autoctx sessions"
    )


def test_bad_offload_ids_and_message_ids_are_one_line(demo_id: str, db_url: str) -> None:
    assert_one_line_error(
        invoke(["reload", demo_id, str(uuid.uuid4()), "-d", db_url]), "no offloaded context"
    )
    assert_one_line_error(invoke(["reload", demo_id, "not-a-uuid", "-d", db_url]), "not-a-uuid")
    assert_one_line_error(invoke(["reload", demo_id, "ffffffff", "-d", db_url]), "ffffffff")
    assert_one_line_error(invoke(["lineage", demo_id, "999999", "-d", db_url]), "999999")


@pytest.mark.parametrize(
    "args", [["sessions"], ["show", "x"], ["db", "current"], ["db", "upgrade"], ["demo"]]
)
def test_unreachable_database_is_one_line(args: list[str]) -> None:
    assert_one_line_error(
        invoke([*args, "--database-url", UNREACHABLE]), "cannot connect", "127.0.0.1:1"
    )


def test_console_script_exits_non_zero_without_traceback() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "from autoctx._cli import main; main()",
            "sessions",
            "-d",
            UNREACHABLE,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert proc.stderr.startswith("autoctx: error: cannot connect to PostgreSQL")
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1


def test_help_teaches_with_examples() -> None:
    top = invoke(["--help"])
    assert top.exit_code == 0
    for command in (
        "demo",
        "db",
        "sessions",
        "show",
        "history",
        "lineage",
        "reload",
        "plot",
        "export",
    ):
        assert command in top.stdout
    for command in ("demo", "show", "history", "lineage", "reload", "plot", "export", "sessions"):
        page = invoke([command, "--help"])
        assert page.exit_code == 0
        assert "Examples:" in page.stdout and f"autoctx {command}" in page.stdout
        assert "--database-url" in page.stdout


def test_show_and_reload_print_control_characters_as_escapes(db_url: str) -> None:
    """Stored content is data: an ESC sequence in a tool output (clear screen, set the title)
    reaches the terminal as visible text, never as a control sequence."""
    hostile = "\x1b[2J\x1b]0;owned\x07 ran make\r\nok \x9b31m"
    config = AutoContextConfig(max_tokens=2_000, large_payload_chars=400, preview_chars=50)
    mem = AutoContextMemory.open(f"cli-ctl-{uuid.uuid4().hex[:8]}", db_url, config)
    mem.add({"role": "user", "content": "build it"})
    mem.add(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "sh", "arguments": "{}"}}
            ],
        }
    )
    mem.add({"role": "tool", "tool_call_id": "c1", "content": hostile + " log" * 2_000})
    mem.add({"role": "assistant", "content": "Built."})
    mem.add({"role": "user", "content": "thanks"})
    offload = next(e.offload_uuid for e in mem.compress_if_needed() if e.offload_uuid)
    outputs = [
        invoke(["show", mem.session_id, "-d", db_url]),
        invoke(["show", mem.session_id, "--full", "-d", db_url]),
        invoke(["reload", mem.session_id, str(offload), "-d", db_url]),
    ]
    for result in outputs:
        assert result.exit_code == 0, result.output
        assert not set(result.stdout) & {"\x1b", "\x07", "\x9b"}, repr(result.stdout[:300])
    assert "\\x1b[2J" in outputs[2].stdout and "\\x07" in outputs[2].stdout
    # JSON escapes every control character itself (C1 too) and gives the content back as stored.
    for args in (
        ["show", mem.session_id, "--json"],
        ["reload", mem.session_id, str(offload), "--json"],
    ):
        result = invoke([*args, "-d", db_url])
        assert result.exit_code == 0, result.output
        assert not set(result.stdout) & {"\x1b", "\x07", "\x9b"}, repr(result.stdout[:300])
    shown = json.loads(invoke(["show", mem.session_id, "--json", "-d", db_url]).stdout)
    assert [m["message"] for m in shown["messages"]] == mem.to_openai()
    reloaded = json.loads(
        invoke(["reload", mem.session_id, str(offload), "--json", "-d", db_url]).stdout
    )
    assert any(hostile in str(m["message"].get("content")) for m in reloaded["messages"])
    assert any(hostile in m["text"] for m in reloaded["messages"])
    mem.delete()


# -- issue 12: ids a user copies, JSON, version, help, prefixes, the plot --------------------

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def test_demo_hints_keep_the_database_url(demo_run: tuple[str, Result], db_url: str) -> None:
    session_id, result = demo_run
    hints = [line.strip() for line in result.stdout.splitlines() if line.startswith("  autoctx ")]
    assert len(hints) == 6, result.stdout
    for hint in hints:
        assert hint.startswith("autoctx ") and session_id in hint
        assert hint.endswith(f" --database-url {shlex.quote(db_url)}"), hint


def _long_session(db_url: str, length: int) -> str:
    session_id = f"cli-long-{uuid.uuid4().hex}".ljust(length, "x")
    mem = AutoContextMemory.open(session_id, db_url, summarizer=OfflineSummarizer())
    mem.add({"role": "user", "content": "hello"})
    mem.close()
    return session_id


def test_sessions_prints_whole_ids_when_piped(db_url: str) -> None:
    session_id = _long_session(db_url, 90)
    result = invoke(["sessions", "--prefix", session_id[:20], "-d", db_url], {"COLUMNS": "80"})
    assert result.exit_code == 0, result.stderr
    row = next(line for line in result.stdout.splitlines() if "cli-long-" in line)
    assert session_id in row, result.stdout


def test_sessions_keeps_ids_whole_in_a_narrow_terminal(db_url: str) -> None:
    """In a terminal of 80 columns the tenant and time wrap so that the id need not."""
    session_id = _long_session(db_url, 40)
    result = invoke(
        ["sessions", "--prefix", session_id[:20], "-d", db_url],
        {"COLUMNS": "80", "TTY_COMPATIBLE": "1"},
    )
    assert result.exit_code == 0, result.stderr
    lines = [ANSI.sub("", line) for line in result.stdout.splitlines()]
    assert max(len(line) for line in lines) <= 80
    assert any(session_id in line for line in lines), "\n".join(lines)


def test_sessions_history_and_show_print_json(demo_id: str, db_url: str, store: StoreOf) -> None:
    info = store(demo_id).get_session()
    assert info is not None
    listed = invoke(["sessions", "--prefix", demo_id, "--json", "-d", db_url])
    assert listed.exit_code == 0, listed.stderr
    assert json.loads(listed.stdout) == [
        {
            "session_id": demo_id,
            "tenant": info.tenant,
            "version": info.version,
            "message_count": info.message_count,
            "token_count": info.token_count,
            "updated_at": info.updated_at.isoformat(),
        }
    ]

    events = store(demo_id).events()
    history = invoke(["history", demo_id, "--json", "-d", db_url])
    assert history.exit_code == 0, history.stderr
    rows = json.loads(history.stdout)
    assert [r["id"] for r in rows] == [e.id for e in events]
    for row, e in zip(rows, events, strict=True):
        assert row["offload_uuid"] == (str(e.offload_uuid) if e.offload_uuid else None)
        assert datetime.fromisoformat(row["created_at"]) == e.created_at
        assert (row["strategy"], row["status"], row["reason"]) == (e.strategy, e.status, e.reason)
        assert (row["tokens_before"], row["tokens_after"]) == (e.tokens_before, e.tokens_after)

    working = store(demo_id).load_working()
    shown = invoke(["show", demo_id, "--json", "-d", db_url])
    assert shown.exit_code == 0, shown.stderr
    doc = json.loads(shown.stdout)
    assert doc["session"]["token_count"] == info.token_count
    assert [(m["index"], m["id"], m["role"], m["kind"], m["tokens"]) for m in doc["messages"]] == [
        (k, m.id, m.role, m.kind, m.tokens) for k, m in enumerate(working)
    ]
    assert [m["message"] for m in doc["messages"]] == [m.to_openai() for m in working]
    offloads = {m["offload_uuid"] for m in doc["messages"]} - {None}
    assert offloads and all(uuid.UUID(u) for u in offloads)  # whole uuids, not prefixes


def test_version_names_the_installed_distribution(monkeypatch: pytest.MonkeyPatch) -> None:
    result = invoke(["--version"])
    assert result.exit_code == 0, result.stderr
    assert result.stdout == f"autoctx {metadata.version('autoctx-pg')}\n"

    def missing(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(cli_root.metadata, "version", missing)
    bare = invoke(["--version"])
    assert bare.exit_code == 0 and bare.stdout.startswith("autoctx unknown ("), bare.stdout


def _leaf_commands(group: TyperGroup, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for name, command in group.commands.items():
        if isinstance(command, TyperGroup):
            yield from _leaf_commands(command, (*path, name))
        else:
            yield (*path, name)


def test_help_keeps_every_example_on_its_own_line() -> None:
    root = typer.main.get_command(app)
    assert isinstance(root, TyperGroup)
    commands = list(_leaf_commands(root))
    assert ("sessions",) in commands and ("db", "current") in commands
    for path in commands:
        command = root
        for name in path:
            assert isinstance(command, TyperGroup)
            command = command.commands[name]
        examples = [
            line.strip()
            for line in (command.help or "").partition("Examples:")[2].splitlines()
            if line.strip().startswith("autoctx ")
        ]
        assert examples, f"{' '.join(path)} has no examples"
        page = invoke([*path, "--help"])
        assert page.exit_code == 0
        lines = {line.strip() for line in page.stdout.splitlines()}
        for example in examples:
            assert example in lines, f"{' '.join(path)} --help:\n{page.stdout}"


def test_help_piped_pads_no_line_with_spaces() -> None:
    """Typer pads each help line to the page's width; into a pipe those spaces are trimmed,
    as every command's own output is: every help page, and a usage error on stderr, of a real
    process whose output is a pipe."""
    root = typer.main.get_command(app)
    assert isinstance(root, TyperGroup)
    pages = [(), ("db",), *_leaf_commands(root)]
    for path in pages:
        page = invoke([*path, "--help"])
        assert page.exit_code == 0 and "Usage: " in page.stdout, path
        padded = [line for line in page.stdout.splitlines() if line.endswith(" ")]
        assert padded == [], f"{' '.join(path)} --help: {padded[:3]}"
    piped = run_process(["--help"])
    assert piped.returncode == 0 and "Usage: " in piped.stdout and "─ Commands ─" in piped.stdout
    assert [line for line in piped.stdout.splitlines() if line.endswith(" ")] == []
    wrong = run_process(["search"])
    assert wrong.returncode == 2 and "Missing argument" in wrong.stderr
    assert [line for line in wrong.stderr.splitlines() if line.endswith(" ")] == []


def test_reload_refuses_a_prefix_shorter_than_eight(
    demo_id: str, db_url: str, store: StoreOf
) -> None:
    offload = str(next(e.offload_uuid for e in store(demo_id).events() if e.offload_uuid))
    for prefix in (offload[:4], offload[:7]):
        result = invoke(["reload", demo_id, prefix, "-d", db_url])
        assert_one_line_error(result, prefix, "too short", "at least 8", "autoctx history")
        assert "CONTEXT_OFFLOAD" not in result.stderr and len(result.stderr) < 300
    assert invoke(["reload", demo_id, offload[:8], "-d", db_url]).exit_code == 0


def test_plot_merges_dense_markers_into_counted_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cascade of S5 compressions at one step draws markers that do not touch, each
    standing for a counted number of events, and together for all of them."""
    from matplotlib.collections import PathCollection
    from matplotlib.figure import Figure

    cascade = [
        Mark(300 + k // 10, None, 5, "applied", 22_000 - 150 * k, 21_850 - 150 * k, 60 - k, 59 - k)
        for k in range(24)
    ]
    lone = [Mark(100, None, 1, "applied", 24_500, 12_000, 80, 30)]
    points = [Point(s, None, 12_000 + 30 * s, 30 + s // 10) for s in range(0, 400, 5)]
    series = Series(points, lone + cascade)
    config = {"max_tokens": 32_000, "token_ratio": 0.75, "target_ratio": 0.6, "msg_threshold": 120}
    saved: list[Figure] = []
    real_savefig = Figure.savefig

    def keep(fig: Figure, *args: Any, **kwargs: Any) -> None:
        saved.append(fig)
        real_savefig(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    render(series, config, tmp_path / "dense.png", title="dense")
    (fig,) = saved
    for ax in fig.axes:
        markers = [c for c in ax.collections if isinstance(c, PathCollection)]
        drawn = 0
        for collection in markers:
            shown = ax.transData.transform(collection.get_offsets())
            diameter = float(max(collection.get_sizes())) ** 0.5 * fig.dpi / 72
            drawn += len(shown)
            for i in range(len(shown)):
                for j in range(i + 1, len(shown)):
                    gap = float(((shown[i] - shown[j]) ** 2).sum() ** 0.5)
                    assert gap >= diameter, f"two markers {gap:.1f}px apart on {ax.get_ylabel()}"
        counts = [int(t.get_text()[1:]) for t in ax.texts if re.fullmatch(r"x\d+", t.get_text())]
        assert drawn - len(counts) + sum(counts) == len(series.marks), ax.get_ylabel()
        assert counts, "the cascade is shown as counted markers"


# -- issue 23: a lossless CLI (piped, 80 columns), --json everywhere, kinds, durations -------


def _pipe_env(columns: int) -> dict[str, str | None]:
    """A pipe's environment, $COLUMNS wide, without what makes rich treat the output as a
    terminal (None: unset)."""
    return {
        "COLUMNS": str(columns),
        "OPENAI_BASE_URL": "",
        "OPENAI_API_KEY": "",
        "TTY_COMPATIBLE": None,
        "FORCE_COLOR": None,
    }


def run_cli(args: Sequence[str], columns: int = 80) -> Result:
    """`autoctx ARGS` with its output into a pipe, $COLUMNS wide, run in this process through
    the CLI's own app: a pipe and the runner's capture are both not a terminal, so the same code
    writes both (`test_a_real_pipe_gets_what_the_runner_gets` compares them). `run_process` is
    the real process, for what only a process shows."""
    result = CliRunner().invoke(app, list(args), env=_pipe_env(columns))
    # An exception that left the command would be a traceback in a real process.
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def run_process(args: Sequence[str], columns: int = 80) -> subprocess.CompletedProcess[str]:
    """`autoctx ARGS` as a real process whose output is a pipe, $COLUMNS wide."""
    env = {k: v for k, v in os.environ.items() if k not in ("TTY_COMPATIBLE", "FORCE_COLOR")}
    env |= {k: v for k, v in _pipe_env(columns).items() if v is not None}
    return subprocess.run(
        [sys.executable, "-m", "autoctx._cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def flat(text: str) -> str:
    """`text` with the tree guides gone and every run of whitespace one space: what a wrapped
    value reads as (a wrap replaces a space by a line end and an indent)."""
    return " ".join(re.sub("[│├└─]", " ", text).split())


#: An endpoint error with an id in it, longer than any line of 80 columns.
UPSTREAM = (
    "upstream model gateway rejected the request req_7Hc2fQ9kLm3Xp5Wz8Rt1Yv4Bn6 after the "
    "provider timed out; retry later or check the gateway's status page"
)


@pytest.fixture(scope="module")
def kinds_session(db_url: str) -> Iterator[tuple[str, str]]:
    """A session with failed compressions carrying an endpoint's error, fallbacks, a pop, an
    erasure and a clear; and a fork of it (its first event: fork)."""
    from autoctx import OpenAISummarizer
    from tests.histories import SMALL, multi_round
    from tests.openai_server import OpenAIServer, Reply

    session_id = f"cli-kinds-{uuid.uuid4().hex[:8]}"
    with OpenAIServer() as server:
        server.set_default(Reply.server_error(500, UPSTREAM))
        summarizer = OpenAISummarizer(
            base_url=server.base_url, api_key="test", timeout=10, max_retries=0
        )
        mem = AutoContextMemory.open(session_id, db_url, SMALL, summarizer=summarizer)
        mem.add(multi_round(3, rounds=4, steps=8))
        events = mem.compress_if_needed()
        assert any(e.status == "failed" and e.error for e in events)
    mem.add({"role": "user", "content": "one more thing"})
    assert mem.pop_last() is not None
    first = next(m.id for m in mem.messages() if m.kind == "original" and m.role == "user")
    mem.erase([first], reason="user request #5521")
    child = f"{session_id}-fork"
    mem.fork(child)
    mem.clear()
    mem.close()
    yield session_id, child


def test_history_piped_at_80_columns_keeps_every_field_whole(
    kinds_session: tuple[str, str], db_url: str, store: StoreOf
) -> None:
    session_id, _ = kinds_session
    proc = run_cli(["history", session_id, "-d", db_url])
    assert proc.exit_code == 0, proc.stderr
    out = proc.stdout
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80, out
    events = store(session_id).events()
    assert any(e.status == "failed" and e.error for e in events)
    text = flat(out)
    for e in events:
        assert f"event {e.id} " in text
        # time, why, tokens, model, latency and error: all there, whole.
        assert _fmt(e.created_at) in text
        assert f"why {e.reason}" in text
        assert f"{e.tokens_before:,} → {e.tokens_after:,}" in text
        if e.offload_uuid is not None:
            assert any(str(e.offload_uuid) in line for line in lines), e.offload_uuid
        if e.model is not None:
            assert e.model in text
        if e.latency_ms is not None:
            assert f"{e.latency_ms:.0f} ms" in text
        if e.error:
            assert " ".join(e.error.split()) in text


@pytest.mark.parametrize("command", [["history"], ["show"], ["sessions", "--prefix", "cli-kinds-"]])
@pytest.mark.parametrize("columns", [80, 200])
def test_piped_output_has_no_padding_at_line_ends(
    command: list[str], columns: int, kinds_session: tuple[str, str], db_url: str
) -> None:
    session_id, child = kinds_session
    # The parent was cleared at the end: its fork still holds a working context to show.
    shown = child if command[0] == "show" else session_id
    args = [*command, "-d", db_url]
    if command[0] != "sessions":
        args.insert(1, shown)
    proc = run_cli(args, columns=columns)
    assert proc.exit_code == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) > 3, proc.stdout
    padded = [n for n, line in enumerate(lines) if line != line.rstrip()]
    assert not padded, f"lines {padded[:5]} end in spaces: {lines[padded[0]]!r}"


def test_a_real_pipe_gets_what_the_runner_gets(kinds_session: tuple[str, str], db_url: str) -> None:
    """The piped-output tests run the CLI in this process; a real process writing into a real
    pipe prints the same bytes: the widest output (history's blocks at 80 columns) and a table
    of rows, neither padded at line ends."""
    session_id, _ = kinds_session
    for command in (["history", session_id], ["sessions", "--prefix", "cli-kinds-"]):
        args = [*command, "-d", db_url]
        proc = run_process(args)
        assert proc.returncode == 0, proc.stderr
        assert len(proc.stdout.splitlines()) > 3, proc.stdout
        assert proc.stdout == run_cli(args).stdout
        assert [line for line in proc.stdout.splitlines() if line != line.rstrip()] == []


def test_history_names_pop_erase_clear_and_fork_and_saves_nothing_for_them(
    kinds_session: tuple[str, str], db_url: str, store: StoreOf
) -> None:
    session_id, child = kinds_session
    out = run_cli(["history", session_id, "-d", db_url]).stdout
    assert "S0" not in out
    for kind in ("pop", "erase", "clear"):
        event = next(
            e
            for e in store(session_id).events()
            if e.strategy == 0 and e.reason == {"pop": "manual"}.get(kind, kind)
        )
        block = re.search(rf"^event {event.id}  {kind}  applied .*?(?=\n\n)", out, re.S | re.M)
        assert block is not None, out
        assert "saved" not in block.group(0)
        row = re.search(rf"^ {kind}\s+1\s+0\s+0\s+-\s+-\s+0 *$", out, re.M)
        assert row is not None, out
    assert "why erase: user request #5521" in flat(out)
    forked = run_cli(["history", child, "-d", db_url]).stdout
    fork = store(child).events()[-1]
    assert fork.reason == "fork"
    assert re.search(rf"^event {fork.id}  fork  applied ", forked, re.M), forked
    # Wide enough, the same events are a table of every column, the kinds named there too.
    wide = run_cli(["history", session_id, "-d", db_url], columns=400).stdout
    assert re.search(r"^\s*\d+\s+\S+\s+erase\s+applied\s+erase: user request #5521", wide, re.M)
    assert "S0" not in wide
    for e in store(session_id).events():
        if e.error:
            assert " ".join(e.error.split()) in wide


def _fmt(value: datetime | None) -> str:
    return value.astimezone().strftime("%Y-%m-%d %H:%M:%S") if value is not None else ""


def test_lineage_piped_at_80_columns_keeps_event_and_offload_ids_whole(
    demo_id: str, db_url: str, store: StoreOf
) -> None:
    events = {e.id: e for e in store(demo_id).events()}
    top = max(
        (e for e in events.values() if e.summary_message_id and e.strategy in (1, 4, 6, 7)),
        key=lambda e: len(e.replaced_ids),
    )
    proc = run_cli(["lineage", demo_id, str(top.summary_message_id), "-d", db_url])
    assert proc.exit_code == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80, proc.stdout
    text = flat(proc.stdout)
    doc = json.loads(
        run_cli(["lineage", demo_id, str(top.summary_message_id), "--json", "-d", db_url]).stdout
    )

    def summaries(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
        if node["event_id"] is not None:
            yield node
        for child in node["children"]:
            yield from summaries(child)

    shown = list(summaries(doc["tree"]))
    assert shown and shown[0]["id"] == top.summary_message_id
    # Each summary's own offload: its event's, or (a masking pass made one per output) the one
    # that holds its first child.
    own = {
        (r.event_id, r.message_ids[0]): r.uuid for r in offload_rows(store(demo_id).engine, demo_id)
    }
    for node in shown:
        event = events[node["event_id"]]
        offload = event.offload_uuid or own[(event.id, node["children"][0]["id"])]
        assert f"#{node['id']} " in text
        assert f"event {event.id}" in text
        assert node["offload_uuid"] == str(offload)
        assert f"offload {offload}" in text
        assert any(str(offload) in line for line in lines), offload


def test_reload_prints_the_stored_text_exactly(db_url: str) -> None:
    """Tabs, long lines and spacing as stored: no rewrap at 80 columns, no tab expansion."""
    config = AutoContextConfig(max_tokens=2_000, large_payload_chars=400, preview_chars=50)
    mem = AutoContextMemory.open(f"cli-raw-{uuid.uuid4().hex[:8]}", db_url, config)
    table = "".join(f"col_a\tcol_b\t{'x' * 150}  {k:>4}   trailing  \n" for k in range(60))
    mem.add({"role": "user", "content": "dump it"})
    mem.add(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "sh", "arguments": "{}"}}
            ],
        }
    )
    mem.add({"role": "tool", "tool_call_id": "c1", "content": table})
    mem.add({"role": "assistant", "content": "Dumped."})
    mem.add({"role": "user", "content": "thanks"})
    offload = next(e.offload_uuid for e in mem.compress_if_needed() if e.offload_uuid)
    proc = run_cli(["reload", mem.session_id, str(offload), "-d", db_url])
    assert proc.exit_code == 0, proc.stderr
    assert table in proc.stdout
    handle = next(r.handle for r in offload_rows(mem.engine, mem.session_id) if r.uuid == offload)
    assert proc.stdout.startswith(f"offload {handle} ({offload}): ")
    by_handle = run_cli(["reload", mem.session_id, str(handle), "-d", db_url])
    assert by_handle.stdout == proc.stdout
    mem.delete()


def test_show_piped_at_80_columns_shows_content_and_whole_offload_ids(
    demo_id: str, db_url: str, store: StoreOf
) -> None:
    proc = run_cli(["show", demo_id, "-d", db_url])
    assert proc.exit_code == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80, proc.stdout
    text = flat(proc.stdout)
    handles = {r.uuid: r.handle for r in offload_rows(store(demo_id).engine, demo_id)}
    for index, msg in enumerate(store(demo_id).load_working()):
        assert f"[{index}] #{msg.id} {msg.role}" in text
        offload = next(
            (
                f"offload {handles[e.offload_uuid]}"
                for e in store(demo_id).events()
                if e.summary_message_id == msg.id and e.offload_uuid is not None
            ),
            None,
        )
        if offload is not None:
            assert any(line.endswith(offload) for line in lines), offload
    # A useful share of each message: the system prompt's first 200 characters.
    system = store(demo_id).load_working()[0]
    assert " ".join(system.text.split())[:200] in text


def _leaf_paths() -> list[tuple[str, ...]]:
    root = typer.main.get_command(app)
    assert isinstance(root, TyperGroup)
    return list(_leaf_commands(root))


def test_every_command_takes_json_and_verbose_after_its_name() -> None:
    for path in _leaf_paths():
        page = invoke([*path, "--help"])
        assert page.exit_code == 0
        assert "--verbose" in page.stdout, path
        if path != ("export",):  # export prints JSON whatever it is given
            assert "--json" in page.stdout, path


def test_lifecycle_and_db_commands_print_json(
    kinds_session: tuple[str, str], db_url: str, store: StoreOf, tmp_path: Path
) -> None:
    _, session_id = kinds_session  # the fork: the parent was cleared after it
    new = f"{session_id}-j"
    forked = json.loads(run_cli(["fork", session_id, new, "--json", "-d", db_url]).stdout)
    info = store(new).get_session()
    assert info is not None
    assert (forked["parent"], forked["session_id"], forked["token_count"]) == (
        session_id,
        new,
        info.token_count,
    )
    original = next(m.id for m in store(new).load_working() if m.kind == "original")
    erased = run_cli(["erase", new, str(original), "--reason", "test", "--json", "-d", db_url])
    assert erased.exit_code == 0, erased.stderr
    doc = json.loads(erased.stdout)
    assert doc["erased_ids"] == [original]
    assert doc["event"]["id"] == store(new).events()[-1].id and doc["event"]["reason"] == "erase"

    info = store(new).get_session()
    assert info is not None
    export = tmp_path / "s.json"
    assert invoke(["export", new, "-o", str(export), "-d", db_url]).exit_code == 0
    AutoContextMemory.open(new, db_url, create=False).delete()
    imported = json.loads(run_cli(["import", str(export), "--json", "-d", db_url]).stdout)
    assert imported["session_id"] == new and imported["token_count"] == info.token_count

    purge = run_cli(["purge", "--older-than", "3650d", "--dry-run", "--json", "-d", db_url])
    assert json.loads(purge.stdout) == {
        "dry_run": True,
        "older_than_seconds": 3650 * 86_400,
        "sessions": [],
    }
    current = json.loads(run_cli(["db", "current", "--json", "-d", db_url]).stdout)
    assert current["up_to_date"] is True and current["revision"] == current["head"]
    worker = run_cli(["worker", "--once", "--offline", "--json", "-d", db_url])
    assert worker.exit_code == 0, worker.stderr
    for line in worker.stdout.splitlines():
        assert set(json.loads(line)) >= {"session_id", "applied", "failed", "event_ids"}


@pytest.mark.parametrize("age", ["1m", "90m", "5M"])
def test_purge_refuses_a_duration_in_m_and_names_the_fix(age: str, db_url: str) -> None:
    assert_one_line_error(
        invoke(["purge", "--older-than", age, "--dry-run", "-d", db_url]),
        repr(age),
        "ambiguous",
        "min",
        "30d",
    )


def test_purge_reads_min_and_seconds(db_url: str) -> None:
    from autoctx._arguments import duration as parse_duration

    assert parse_duration("15min").total_seconds() == 900
    assert parse_duration("45s").total_seconds() == 45
    assert parse_duration("1d12h").total_seconds() == 129_600
    result = invoke(["purge", "--older-than", "15min", "--dry-run", "-d", db_url])
    assert result.exit_code == 0, result.stderr
    assert "last updated more than 15min ago" in result.stdout


@pytest.mark.parametrize(
    "args", [["sessions"], ["history", "s"], ["show", "s"], ["search", "x"], ["worker", "--once"]]
)
def test_a_schema_behind_says_run_autoctx_db_upgrade(args: list[str], empty_db_url: str) -> None:
    proc = run_cli([*args, "-d", empty_db_url])
    assert proc.exit_code == 1
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert "no autoctx schema yet" in proc.stderr
    assert "run `autoctx db upgrade`" in proc.stderr
    assert "auto_upgrade" not in proc.stderr and "Traceback" not in proc.stderr


def test_verbose_works_after_the_subcommand(db_url: str) -> None:
    after = run_process(["worker", "--once", "-v", "-d", db_url])
    assert after.returncode == 0, after.stderr
    assert "INFO autoctx" in after.stderr
    before = run_process(["-v", "worker", "--once", "-d", db_url])
    assert before.returncode == 0 and "INFO autoctx" in before.stderr
    quiet = run_process(["worker", "--once", "-d", db_url])
    assert quiet.returncode == 0 and "INFO" not in quiet.stderr


def test_demo_json_prints_a_summary_on_stdout_and_the_run_on_stderr(
    db_url: str, store: StoreOf
) -> None:
    proc = run_cli(["demo", "--rounds", "1", "--steps", "0", "--json", "-d", db_url])
    assert proc.exit_code == 0, proc.stderr
    doc = json.loads(proc.stdout)
    info = store(doc["session_id"]).get_session()
    assert info is not None and doc["token_count"] == info.token_count
    assert [e["id"] for e in doc["events"]] == [e.id for e in store(doc["session_id"]).events()]
    assert f"autoctx demo: session {doc['session_id']}" in proc.stderr


def test_piped_search_respects_columns(demo_id: str, db_url: str) -> None:
    """A piped table wider than $COLUMNS is printed one block per row, each field whole."""
    narrow = run_cli(["search", "read_file", "--session", demo_id, "-d", db_url], columns=80)
    assert narrow.exit_code == 0, narrow.stderr
    lines = narrow.stdout.splitlines()
    assert len(lines) > 3 and max(len(line) for line in lines) <= 80, narrow.stdout
    assert demo_id in narrow.stdout
    wide = run_cli(["search", "read_file", "--session", demo_id, "-d", db_url], columns=400)
    assert max(len(line) for line in wide.stdout.splitlines()) > 80
