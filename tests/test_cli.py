"""The `autoctx` command line, against a real migrated PostgreSQL.

One small demo session (`demo --rounds 2 --steps 40`) is generated once per module and every
inspection command is run against it; the checks compare what the commands print or write with
what the store holds.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path

import pytest
import sqlalchemy as sa
from click.testing import Result
from typer.testing import CliRunner

from autoctx import AutoContextConfig, AutoContextMemory
from autoctx.cli import app
from autoctx.demo import generate
from autoctx.memory import get_engine
from autoctx.plot import reconstruct
from autoctx.store.inspect import message_stamps
from autoctx.store.store import Store
from autoctx.summarizers import OfflineSummarizer

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


@pytest.fixture(scope="module")
def store(db_url: str) -> Store:
    return Store(get_engine(db_url, auto_upgrade=False))


# -- demo -----------------------------------------------------------------------------------


def test_demo_runs_end_to_end_and_compresses(demo_run: tuple[str, Result], store: Store) -> None:
    session_id, result = demo_run
    out = result.stdout
    assert session_id.startswith("demo-")
    info = store.get_session(session_id)
    assert info is not None
    events = store.events(session_id)
    applied = [e for e in events if e.status == "applied"]
    assert applied, "the small demo must compress at least once"
    # Every event was printed live with its offload's short id.
    for e in applied:
        assert str(e.offload_uuid)[:8] in out
    assert "offline extractive summariser" in out
    # Window report: the final totals as stored.
    assert f"working context: {info.token_count:,} / 32,000 tokens" in out
    # Reload proof: the originals came back identical; restart proof: identical totals.
    assert re.search(r"(\d+) of \1 original\(s\) identical to what was added", out), out
    assert f"restart: closed, reopened {session_id} by id: {info.message_count} messages" in out
    assert "working context identical" in out and "= session total" in out
    # How rarely and how deeply it compressed, from the same events.
    words = r"compression fired after (\d+) of (\d+) steps and reached the target (\d+) times; "
    rate = re.search((words + r"(\d+) summariser calls").replace(" ", r"\s+"), out)
    assert rate is not None, out
    fired, steps, reached, calls = (int(g) for g in rate.groups())
    assert 0 < reached <= fired < steps
    assert calls == sum(e.model is not None and e.reason != "fallback" for e in events)
    for command in ("history", "show", "reload", "lineage", "plot", "export"):
        assert f"autoctx {command} {session_id}" in out


def test_demo_stays_within_the_window_after_every_step(demo_id: str, db_url: str) -> None:
    series = reconstruct(
        message_stamps(get_engine(db_url, auto_upgrade=False), demo_id),
        Store(get_engine(db_url, auto_upgrade=False)).events(demo_id),
    )
    assert max(p.tokens for p in series.points) < 32_000


def test_demo_is_deterministic_for_a_seed(db_url: str) -> None:
    """The same seed stores the same originals. (Compression figures may differ by a token or
    two: every summary carries a fresh random offload uuid.)"""
    engine = get_engine(db_url, auto_upgrade=False)
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


def test_sessions_lists_and_filters(demo_id: str, db_url: str, store: Store) -> None:
    result = invoke(["sessions", "--prefix", "demo-", "--database-url", db_url])
    assert result.exit_code == 0, result.stderr
    info = store.get_session(demo_id)
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


def test_show_lists_the_working_context(demo_id: str, db_url: str, store: Store) -> None:
    result = invoke(["show", demo_id, "--database-url", db_url])
    assert result.exit_code == 0, result.stderr
    working = store.load_working(demo_id)
    rows = [line.split() for line in result.stdout.splitlines()[2:] if line.strip()]
    assert [(int(r[0]), int(r[1]), r[2], r[3]) for r in rows] == [
        (k, m.id, m.role, m.kind) for k, m in enumerate(working)
    ]
    full = invoke(["show", demo_id, "--full", "-d", db_url])
    assert full.exit_code == 0
    # Every summary and preview is shown whole, its offload tag included.
    derived = [m for m in working if m.kind != "original"]
    assert derived
    assert full.stdout.count("<!-- CONTEXT_OFFLOAD: uuid=") >= len(derived)


def test_history_shows_every_event(demo_id: str, db_url: str, store: Store) -> None:
    result = invoke(["history", demo_id, "--database-url", db_url])
    assert result.exit_code == 0, result.stderr
    events = store.events(demo_id)
    for e in events:
        assert re.search(rf"^\s*{e.id}\s+\S+\s+S{e.strategy} ", result.stdout, re.M)
        assert f"{e.tokens_before:,}→{e.tokens_after:,}" in result.stdout
    assert "events per strategy" in result.stdout


def test_history_fits_a_narrow_terminal(demo_id: str, db_url: str, store: Store) -> None:
    result = invoke(["history", demo_id, "-d", db_url], env={"COLUMNS": "80"})
    assert result.exit_code == 0
    assert max(len(line) for line in result.stdout.splitlines()) <= 80
    first = store.events(demo_id)[0]
    assert str(first.offload_uuid)[:8] in result.stdout  # the id to reload stays whole


def test_lineage_walks_down_to_the_originals(demo_id: str, db_url: str, store: Store) -> None:
    engine = get_engine(db_url, auto_upgrade=False)
    summary = next(e.summary_message_id for e in store.events(demo_id) if e.strategy in (1, 4, 6))
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


def test_reload_prints_the_offloaded_originals(demo_id: str, db_url: str, store: Store) -> None:
    event = next(e for e in store.events(demo_id) if e.offload_uuid is not None)
    originals = store.reload(demo_id, event.offload_uuid)  # type: ignore[arg-type]
    full = invoke(["reload", demo_id, str(event.offload_uuid), "--database-url", db_url])
    assert full.exit_code == 0, full.stderr
    assert f"{len(originals)} message(s)" in full.stdout
    for msg in originals:
        assert f"#{msg.id} {msg.role} {msg.kind}" in full.stdout
    # A unique prefix, as history shows it, is enough; --json gives the OpenAI messages back.
    short = invoke(["reload", demo_id, str(event.offload_uuid)[:8], "--json", "-d", db_url])
    assert short.exit_code == 0, short.stderr
    assert json.loads(short.stdout) == [m.to_openai() for m in originals]


def test_plot_writes_a_png_that_matches_the_totals(
    demo_id: str, db_url: str, store: Store, tmp_path: Path
) -> None:
    out = tmp_path / "tokens.png"
    result = invoke(["plot", demo_id, "-o", str(out), "--database-url", db_url])
    assert result.exit_code == 0, result.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.stat().st_size > 20_000
    # The replayed series ends exactly at the session's stored totals.
    engine = get_engine(db_url, auto_upgrade=False)
    series = reconstruct(message_stamps(engine, demo_id), store.events(demo_id))
    info = store.get_session(demo_id)
    assert info is not None
    last = series.points[-1]
    assert (last.tokens, last.messages) == (info.token_count, info.message_count)
    assert f"now {info.token_count:,}" in result.stdout
    by_time = invoke(["plot", demo_id, "-o", str(tmp_path / "t.png"), "--x", "time", "-d", db_url])
    assert by_time.exit_code == 0 and (tmp_path / "t.png").exists()


def test_export_writes_the_whole_session(
    demo_id: str, db_url: str, store: Store, tmp_path: Path
) -> None:
    out = tmp_path / "session.json"
    result = invoke(["export", demo_id, "-o", str(out), "--database-url", db_url])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(out.read_text())
    mem = AutoContextMemory.open(demo_id, db_url, summarizer=OfflineSummarizer(), create=False)
    assert doc["working_context"] == mem.to_openai()
    assert doc["session"]["token_count"] == mem.token_count
    events = store.events(demo_id)
    assert [e["id"] for e in doc["events"]] == [e.id for e in events]
    with_offload = [e for e in events if e.offload_uuid is not None]
    assert {o["uuid"] for o in doc["offloads"]} == {str(e.offload_uuid) for e in with_offload}
    first = doc["offloads"][0]
    assert [m["message"] for m in first["messages"]] == [
        m.to_openai() for m in store.reload(demo_id, uuid.UUID(first["uuid"]))
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
            "from autoctx.cli import main; main()",
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
    mem.delete()
