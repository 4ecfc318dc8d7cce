"""The audit console (`autoctx ui`, issue 23 item 1): pages over a real PostgreSQL, then a real
browser (Debian's chromium, driven by Playwright) clicking through them.

The servers are the console's own (`make_server`, the standard library's threaded server) on
127.0.0.1, reading the module's database through the migrations; the tenancy tests read as a
real LOGIN role granted one tenant. Screenshots go to $AUTOCTX_UI_SCREENSHOTS when set (to
look at them), else to a temporary folder.
"""

from __future__ import annotations

import contextlib
import html
import http.client
import itertools
import json
import logging
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import markupsafe
import psycopg
import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

import autoctx
from autoctx import AutoContextClient, AutoContextConfig, AutoContextMemory, Msg, OfflineSummarizer
from autoctx._cli import app
from autoctx._messages import ToolUseBlock
from autoctx._store import console as db
from autoctx._store.catalog import Catalog
from autoctx._store.inspect import lineage_edges
from autoctx._store.store import SessionStore
from autoctx._ui import lists, timeline
from autoctx._ui.app import parts
from autoctx._ui.server import ConsoleServer, make_server
from tests.dbsql import sql
from tests.histories import SMALL, multi_round
from tests.test_tenants import Role, login_role

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page, Playwright

CHROMIUM = "/usr/bin/chromium"
#: A message whose text is markup: the pages must show it as text.
SCRIPT = '<script>document.title="owned";alert(1)</script><b>bold?</b> & "quotes"'
#: Whitespace that a renderer could fold: the offload page must keep it.
EXACT = "line one\n\tindented with a tab\n    four spaces   and trailing   \n\nlast\n"
MARKER = "quokkazebra4711"


@dataclass
class World:
    main: str
    small: str
    failing: str
    acme: str
    globex: str
    #: 230 messages, all in the working context: three pages.
    long: str
    #: An applied event of `main` whose offload holds originals.
    offload: uuid.UUID
    script_id: int
    exact_id: int
    #: The summary that event wrote.
    summary_id: int


def _tag() -> str:
    return uuid.uuid4().hex[:8]


@pytest.fixture(scope="module")
def world(db_url: str) -> Iterator[World]:
    tag = _tag()

    def open_(sid: str, config: AutoContextConfig = SMALL, **kw: Any) -> AutoContextMemory:
        return AutoContextMemory.open(sid, db_url, config, summarizer=OfflineSummarizer(), **kw)

    main = open_(f"ui-main-{tag}")
    history = multi_round(3, rounds=6, steps=8)
    # The markup and the whitespace ride in the first round, so a compression offloads them.
    history[1:1] = [Msg.user(SCRIPT), Msg.assistant(EXACT), Msg.user(f"find {MARKER} please")]
    applied = []
    # Step by step, as an agent adds them, so that several strategies run.
    for start in range(0, len(history), 12):
        main.add(history[start : start + 12])
        applied += [e for e in main.compress_if_needed() if e.status == "applied"]
    assert applied
    offload = next(
        e.offload_uuid
        for e in applied
        if e.offload_uuid is not None
        and any(m.kind == "original" for m in main.reload(e.offload_uuid))
    )
    summary_id = next(e.summary_message_id for e in applied if e.offload_uuid == offload)
    assert summary_id is not None
    engine = AutoContextClient.shared(db_url, auto_upgrade=False).engine
    stored = SessionStore(engine, main.session_id).load_messages(range(1, 6))
    script_id = next(i for i, m in stored.items() if m.text == SCRIPT)
    exact_id = next(i for i, m in stored.items() if m.text == EXACT)

    long = open_(f"ui-long-{tag}", AutoContextConfig(max_tokens=1_000_000))
    long.add([Msg.user(f"message number {k}") for k in range(230)])
    small = open_(f"ui-small-{tag}")
    small.add([Msg.system("short"), Msg.user("hello")])
    failing = open_(f"ui-failing-{tag}")
    failing.add([Msg.system("short"), Msg.user("fails")])
    for _ in range(3):
        # What the compressor records when a summarizer call fails (the library's own write).
        SessionStore(engine, failing.session_id).record_event(
            strategy=4,
            status="failed",
            reason="tokens",
            error="http_error: HTTP 404",
            config=SMALL.to_json(),
            model="gpt-test",
            prompt_tokens=1000,
            completion_tokens=50,
            latency_ms=12.5,
        )
    acme = open_(f"ui-acme-{tag}", tenant="acme")
    acme.add([Msg.system("acme"), Msg.user("the acmesecret report")])
    globex = open_(f"ui-globex-{tag}", tenant="globex")
    globex.add([Msg.system("globex"), Msg.user("the globexsecret report")])
    yield World(
        main.session_id,
        small.session_id,
        failing.session_id,
        acme.session_id,
        globex.session_id,
        long.session_id,
        offload,
        script_id,
        exact_id,
        summary_id,
    )
    AutoContextClient.close_shared(db_url)


class Served:
    """A console server in a thread of this process; `get` signs in with its token's cookie."""

    def __init__(self, server: ConsoleServer) -> None:
        self.server = server
        host, port = server.server_address[:2]
        self.host, self.port = str(host), int(port)
        self.base = f"http://{host!s}:{port}"
        self.token = server.access.token
        self.cookie = f"{server.access.cookie}={self.token}" if self.token else ""
        self.thread = threading.Thread(target=server.serve_forever, daemon=True)
        self.thread.start()

    def signed(self, path: str) -> str:
        """The URL of `path` with the token, as `autoctx ui` prints it (to open in a browser)."""
        if self.token is None:
            return self.base + path
        return self.base + path + ("&" if "?" in path else "?") + f"token={self.token}"

    def get(self, path: str, method: str = "GET") -> tuple[int, str]:
        request = urllib.request.Request(self.base + path, method=method)
        if self.cookie:
            request.add_header("Cookie", self.cookie)
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextlib.contextmanager
def serve(url: str, tenant: str | None, **options: Any) -> Iterator[Served]:
    served = Served(
        make_server(
            AutoContextClient.shared(url, auto_upgrade=False).engine,
            tenant,
            "127.0.0.1",
            0,
            **options,
        )
    )
    try:
        yield served
    finally:
        served.close()


@pytest.fixture(scope="module")
def ui(db_url: str, world: World) -> Iterator[Served]:
    with serve(db_url, None) as served:
        yield served


@pytest.fixture(scope="module")
def acme_role(db_url: str, world: World) -> Iterator[Role]:
    with login_role(db_url) as role:
        assert autoctx.grant_tenant(role.name, "acme", db_url) is True
        yield role


def _q(sid: str) -> str:
    return urllib.parse.quote(sid, safe="")


def _version(db_url: str, sid: str) -> tuple[int, int]:
    engine = sa.create_engine(db_url, poolclass=sa.NullPool)
    with engine.connect() as conn:
        row = conn.execute(
            sa.text(
                "select version, (select count(*) from compression_events where session_id = :s) "
                "from sessions where session_id = :s"
            ),
            {"s": sid},
        ).one()
    engine.dispose()
    return int(row[0]), int(row[1])


# ---------------------------------------------------------------------------------------------
# Pages over HTTP
# ---------------------------------------------------------------------------------------------


def test_every_page_answers_and_nothing_writes(ui: Served, world: World, db_url: str) -> None:
    before = _version(db_url, world.main)
    s = _q(world.main)
    for path in (
        "/",
        "/?sort=cost",
        "/?sort=failures",
        "/?sort=updated",
        f"/s/{s}",
        f"/s/{s}/events",
        f"/s/{s}/events?after=1",
        f"/s/{s}/events?before=3",
        f"/s/{s}/working",
        f"/s/{s}/working?after=5",
        f"/s/{s}/working?before=50",
        f"/s/{s}/m/{world.script_id}",
        f"/s/{s}/m/{world.summary_id}",
        f"/s/{s}/m/{world.summary_id}?after=1",
        f"/s/{s}/o/{world.offload}",
        f"/s/{s}/o/{world.offload}?page=1",
        # Past any array's end: an empty page, not a database error.
        f"/s/{s}/o/{world.offload}?page={2**62}",
        f"/search?q={MARKER}",
        f"/search?q={MARKER}&session={s}",
    ):
        status, body = ui.get(path)
        assert status == 200, (path, body[:500])
        assert "autoctx console" in body
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        status, body = ui.get(f"/s/{s}", method=method)
        assert status == 405
        assert "read-only" in body
    assert _version(db_url, world.main) == before


def test_a_masking_pass_is_one_row_and_each_preview_names_its_offload(
    ui: Served, db_url: str
) -> None:
    """One masking pass, one event (docs/design.md §7): the events page shows one row that says
    how many offloads it made, and each preview's page names its own offload, which opens."""
    config = AutoContextConfig(max_tokens=6_000, mask_min_chars=200, msg_threshold=None)
    mem = AutoContextMemory.open(
        f"ui-mask-{_tag()}", db_url, config, summarizer=OfflineSummarizer()
    )
    for k in range(12):
        mem.add(
            [
                Msg.user(f"question {k}"),
                Msg.assistant(None, [ToolUseBlock(f"c{k}", "grep", json.dumps({"q": k}))]),
                Msg.tool(
                    f"c{k}", f"match {k}: " + " ".join(f"line{i}={k * i}" for i in range(100))
                ),
                Msg.assistant(f"answer {k}"),
            ]
        )
    passes = [e for e in mem.compress_if_needed() if e.strategy == 8]
    assert len(passes) == 1 and passes[0].offload_uuid is None
    (mask,) = passes
    s = _q(mem.session_id)
    status, body = ui.get(f"/s/{s}/events")
    assert status == 200
    assert body.count('<tr id="e') == len(mem.events())
    assert f"{len(mask.replaced_ids)} outputs, an offload each" in body
    own = {
        r.summary_id: r.uuid
        for r in sql(
            mem,
            "select l.summary_id, o.uuid from offloads o join lineage l on l.session_id = "
            "o.session_id and l.event_id = o.event_id and l.replaced_id = o.message_ids[1] "
            "where o.session_id = :s and o.event_id = :e",
            s=mem.session_id,
            e=mask.id,
        )
    }
    assert len(own) == len(mask.replaced_ids)
    for preview_id, offload in own.items():
        status, body = ui.get(f"/s/{s}/m/{preview_id}")
        assert status == 200 and f"Written by event {mask.id}" in body
        assert f'/o/{offload}" id="offload"' in body
        status, body = ui.get(f"/s/{s}/o/{offload}")
        assert status == 200
    mem.delete()


def test_the_console_reads_in_read_only_transactions(db_url: str, world: World) -> None:
    engine = db.read_only(AutoContextClient.shared(db_url, auto_upgrade=False).engine)
    with pytest.raises(sa.exc.InternalError, match="read-only transaction"), engine.begin() as c:
        c.execute(
            sa.text("update sessions set version = version where session_id = :s"),
            {"s": world.main},
        )


def test_a_page_read_is_one_read_only_transaction_that_leaves_the_pool_clean(
    db_url: str, world: World
) -> None:
    """`db.read` sends a page's statements together in one READ ONLY transaction scoped to the
    tenant: a write among them fails, and the connection goes back to the pool idle."""
    engine = AutoContextClient.shared(db_url, auto_upgrade=False).engine
    store = Catalog(engine, None)
    write = db.Read("UPDATE sessions SET version = version", {}, lambda found: found)
    with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
        db.read(store, db.session_row(store, world.main), write)
    # The same pooled connections serve the next reads: the failed transaction is gone.
    for _ in range(3):
        (info, scope, setting) = db.read(
            store,
            db.session_row(store, world.main),
            db.Read("SELECT current_setting('transaction_read_only')", {}, lambda f: f[0][0]),
            db.Read("SELECT current_setting('autoctx.tenant')", {}, lambda f: f[0][0]),
        )
        assert info.session_id == world.main and scope == "on" and setting == ""
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SHOW transaction_read_only").scalar_one() == "off"
    (setting,) = db.read(
        Catalog(engine, "acme"),
        db.Read("SELECT current_setting('autoctx.tenant')", {}, lambda f: f[0][0]),
    )
    assert setting == "acme"


def test_the_pages_own_pool_is_pinned_to_read_only_and_the_tenant(
    db_url: str, world: World
) -> None:
    """A `PageScope` (the pool a console's pages read through) sends a page's statements alone,
    with no BEGIN or scope of its own: its sessions were pinned at connect to READ ONLY
    transactions, the tenant and no JIT, so a write among them still fails, the tenant is still
    the store's, and the connection goes back idle for the next page."""
    engine = AutoContextClient.shared(db_url, auto_upgrade=False).engine
    for tenant, expected in ((None, ""), ("acme", "acme")):
        store = db.PageScope(engine, tenant, size=1)
        try:
            write = db.Read("UPDATE sessions SET version = version", {}, lambda found: found)
            with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
                db.read(store, db.Read("SELECT 1", {}, lambda f: f), write)
            for _ in range(3):
                (read_only, scope, jit) = db.read(
                    store,
                    db.Read("SELECT current_setting('transaction_read_only')", {}, _one),
                    db.Read("SELECT current_setting('autoctx.tenant')", {}, _one),
                    db.Read("SELECT current_setting('jit')", {}, _one),
                )
                assert (read_only, scope, jit) == ("on", expected, "off")
            if tenant is None:
                (info,) = db.read(store, db.session_row(store, world.main))
                assert info.session_id == world.main
        finally:
            store.close()


def _one(found: list[Any]) -> Any:
    return found[0][0]


def test_kept_alive_answers_do_not_wait_for_a_delayed_ack(ui: Served, world: World) -> None:
    """With Nagle's algorithm on, every answer after the first on a kept-alive connection (what
    a browser does) waited about 40 ms for the client's ACK (when the headers and the body were
    two writes; a long answer is still more than one segment)."""
    connection = http.client.HTTPConnection(ui.host, ui.port, timeout=30)
    took = []
    for _ in range(7):
        started = time.perf_counter()
        connection.request("GET", "/no-such-page", headers={"Cookie": ui.cookie})
        answer = connection.getresponse()
        assert answer.status == 404 and answer.read()
        took.append(time.perf_counter() - started)
    connection.close()
    assert sorted(took)[len(took) // 2] < 0.030, took


def test_markup_in_a_message_is_escaped(ui: Served, world: World) -> None:
    for path in (
        f"/s/{_q(world.main)}/m/{world.script_id}",
        f"/s/{_q(world.main)}/o/{world.offload}",
        f"/s/{_q(world.main)}/working",
    ):
        status, body = ui.get(path)
        assert status == 200
        assert "<script" not in body.lower(), path
        assert "<b>bold?</b>" not in body
    _, body = ui.get(f"/s/{_q(world.main)}/m/{world.script_id}")
    assert str(markupsafe.escape(SCRIPT)) in body


def test_the_session_page_draws_the_timeline_with_limits_and_marks(
    ui: Served, world: World, db_url: str
) -> None:
    status, body = ui.get(f"/s/{_q(world.main)}")
    assert status == 200
    svg = _timeline_svg(body)
    for limit in ("window", "trigger", "target"):
        assert f"limit-{limit}" in svg
    assert "window 20,000" in svg
    marks = sorted(int(k) for k in re.findall(r'class="mark mark-s(\d)"', svg))
    events = SessionStore(
        AutoContextClient.shared(db_url, auto_upgrade=False).engine, world.main
    ).events()
    assert marks == sorted(e.strategy for e in events if e.status != "failed")
    for e in events:  # each mark links to its event's row
        assert f"/events?after={max(e.id - 6, 0)}#e{e.id}" in svg
    status, body = ui.get(f"/s/{_q(world.failing)}")
    assert body.count('class="mark mark-failed"') == 3


def _timeline_svg(body: str) -> str:
    start = body.index('<svg xmlns="http://www.w3.org/2000/svg" class="timeline"')
    return body[start : body.index("</svg>", start)]


def _path_points(svg: str, cls: str) -> list[tuple[float, float]]:
    """The points of the SVG path of class `cls` (M, H and V commands only: anything else, a
    diagonal, fails here)."""
    found = re.search(rf'<path class="{cls}" d="([^"]*)"', svg)
    if found is None:
        return []
    points: list[tuple[float, float]] = []
    for command, args in re.findall(r"([A-Za-z])([^A-Za-z]*)", found.group(1)):
        assert command in "MHV", f"{cls} draws a {command} segment: not a step"
        if command == "M":
            a, b = args.split(",")
            points.append((float(a), float(b)))
        elif command == "H":
            points.append((float(args), points[-1][1]))
        else:
            points.append((points[-1][0], float(args)))
    return points


def _limit_y(svg: str, name: str) -> float:
    found = re.search(rf'class="limit limit-{name}"[^>]*y1="([\d.]+)"', svg)
    assert found is not None
    return float(found.group(1))


def test_the_timeline_states_put_each_append_and_event_in_its_step() -> None:
    """Pure: appends summed between events, a rung's input marked as compressed before any
    read (also between two passes), a failed attempt on the total it found, and a pop (strategy
    0) acting on a total that was read."""
    at = datetime.now(UTC)
    points = [
        db.TimelinePoint(1, 4, "applied", "tokens", 100, 40, 3, at),
        db.TimelinePoint(2, 7, "applied", "tokens", 40, 20, 4, at),
        db.TimelinePoint(3, 4, "failed", "tokens", 50, 50, 4, at),
        db.TimelinePoint(4, 0, "applied", "manual", 50, 30, 6, at),
    ]
    growth = [db.Growth(0, 2, 100), db.Growth(2, 1, 30)]
    drawing = timeline.states(points, growth)
    assert [(s.x, s.tokens, s.compressed) for s in drawing.states] == [
        (0, 0, False),
        (2, 100, True),
        (3, 40, True),
        (4, 20, False),
        (5, 50, False),
        (6, 30, False),
    ]
    assert drawing.marks == {1: (3, 40), 2: (4, 20), 3: (5, 50), 4: (6, 30)}
    svg = timeline.render(
        points,
        growth,
        tokens_now=30,
        version_now=6,
        limits=timeline.Limits(80, 60, 40),
        event_href="/e?after={after}#e{id}",
    )
    # The stored total of 100 is over the window of 80 before the first compression: drawn
    # as stored, and no overflow.
    assert 'class="overflow"' not in svg
    assert min(y for _, y in _path_points(svg, "stored")) < _limit_y(svg, "window")


def test_the_lists_write_times_and_escape_text_as_the_templates_did() -> None:
    """Pure: the lists' own time format, escaping and path segments (issue 33: cheaper than
    strftime, a `Markup` per cell and a `quote` per link) give what `astimezone().strftime(...)`,
    `markupsafe.escape` and `quote(..., safe="")` give, in zones with half-hour offsets and
    across daylight-saving changes, for any year."""
    zones = ("UTC", "Europe/Paris", "America/St_Johns", "Asia/Kathmandu", "Australia/Lord_Howe")
    times = [
        datetime(2026, 3, 29, 0, 59, 59, 999_999, tzinfo=UTC),
        datetime(2026, 3, 29, 1, 0, tzinfo=UTC),
        datetime(2026, 10, 25, 0, 30, tzinfo=UTC),
        datetime(2026, 10, 25, 1, 30, 0, 500_000, tzinfo=UTC),
        datetime(2300, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),
        datetime(999, 5, 1, 12, tzinfo=UTC),
        datetime(1, 1, 2, tzinfo=UTC),
        datetime(1901, 1, 1, tzinfo=UTC),
        datetime(2026, 1, 1, 12, 0, 0, 7),
    ]
    was = os.environ.get("TZ")
    try:
        for zone in zones:
            os.environ["TZ"] = zone
            time.tzset()
            for at in times:
                assert lists.when(at) == at.astimezone().strftime("%Y-%m-%d %H:%M:%S"), (zone, at)
    finally:
        if was is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = was
        time.tzset()
    assert lists.when(None) == ""
    for text in (SCRIPT, "a & b < c > d 'e' \"f\"", "", "plain", "é → ☃ <\x01>"):
        assert lists._text(text) == str(markupsafe.escape(text))
        assert lists._replaced(text) == str(markupsafe.escape(text))
    for value in ("run-1_a.b~", "a b/c?d=e&f#g", "é☃", "", "%41", 42, -7):
        assert lists.q(value) == urllib.parse.quote(str(value), safe="")


def test_the_timeline_is_drawn_in_steps(ui: Served, world: World, db_url: str) -> None:
    """Each append is a rise and each compression a drop: no straight join between two events
    (issue 33)."""
    svg = _timeline_svg(ui.get(f"/s/{_q(world.main)}")[1])
    assert "<polyline" not in svg
    sent = _path_points(svg, "sent")
    events = SessionStore(
        AutoContextClient.shared(db_url, auto_upgrade=False).engine, world.main
    ).events()
    applied = [e for e in events if e.status == "applied"]
    rises = sum(1 for a, b in itertools.pairwise(sent) if b[1] < a[1])
    drops = sum(1 for a, b in itertools.pairwise(sent) if b[1] > a[1])
    # The world adds its history in 12-message steps (one append each) and compresses
    # between them: a rise for every append the solid line shows, a drop for every compression.
    assert drops == len(applied)
    assert rises >= len(applied)
    assert sent[0][0] < sent[-1][0]


def test_a_total_stored_over_the_window_before_a_compression_is_not_an_overflow(
    db_url: str,
) -> None:
    """An append can take the stored total past the window just before the compression that
    brings it back: that total is drawn as stored (dotted), never as what the model was sent
    and never as an overflow (issue 32). A total over the window that nothing compressed is."""
    tag = _tag()
    tenant = f"timeline-{tag}"  # apart from the world's sessions (the sort tests rank them)
    history = multi_round(5, rounds=8, steps=8)
    mem = AutoContextMemory.open(
        f"ui-spike-{tag}", db_url, SMALL, summarizer=OfflineSummarizer(), tenant=tenant
    )
    over = []
    for start in range(0, len(history), 45):
        mem.add(history[start : start + 45])
        over += [e for e in mem.compress_if_needed() if e.tokens_before > 20_000]
    assert over, "an append took the stored total past the window before a compression"
    with serve(db_url, tenant) as ui:
        svg = _timeline_svg(ui.get(f"/s/{_q(mem.session_id)}")[1])
    window = _limit_y(svg, "window")
    stored = _path_points(svg, "stored")
    assert min(y for _, y in stored) < window  # drawn above the window line, as stored
    assert min(y for _, y in _path_points(svg, "sent")) > window  # what was sent stayed under
    assert 'class="overflow"' not in svg
    # An agent that never compresses: over the window, then another append. An overflow.
    careless = AutoContextMemory.open(
        f"ui-careless-{tag}", db_url, SMALL, summarizer=OfflineSummarizer(), tenant=tenant
    )
    for start in range(0, 135, 45):
        careless.add(history[start : start + 45])
    with serve(db_url, tenant) as ui:
        svg = _timeline_svg(ui.get(f"/s/{_q(careless.session_id)}")[1])
    assert 'class="overflow"' in svg
    assert min(y for _, y in _path_points(svg, "sent")) < _limit_y(svg, "window")


def _working_numbers(body: str) -> list[int]:
    return [int(n) for n in re.findall(r"message number (\d+)", body)]


def _link(body: str, anchor: str) -> str | None:
    found = re.search(rf'<a href="([^"]+)" id="{anchor}">', body)
    return html.unescape(found.group(1)) if found else None


def test_working_context_pages_walk_forward_and_back(ui: Served, world: World) -> None:
    status, body = ui.get(f"/s/{_q(world.long)}/working")
    assert status == 200 and _working_numbers(body) == list(range(100))
    assert _link(body, "prev") is None
    pages = [_working_numbers(body)]
    while (nxt := _link(body, "next")) is not None:
        body = ui.get(nxt)[1]
        pages.append(_working_numbers(body))
    assert pages == [list(range(100)), list(range(100, 200)), list(range(200, 230))]
    assert "messages 200 to 229 of 230" in body
    back = ui.get(_link(body, "prev") or "")[1]
    assert _working_numbers(back) == list(range(100, 200))
    assert "messages 100 to 199 of 230" in back
    first = ui.get(_link(back, "prev") or "")[1]
    assert _working_numbers(first) == list(range(100))
    assert _link(first, "prev") is None


def _originals_behind(db_url: str, sid: str, offload: uuid.UUID) -> list[Msg]:
    """Through the library: what the offload removed, each summary among them followed down
    its lineage to the originals."""
    engine = AutoContextClient.shared(db_url, auto_upgrade=False).engine
    removed = SessionStore(engine, sid).reload(offload)
    ids = set()
    for m in removed:
        assert m.id is not None
        if m.kind == "original":
            ids.add(m.id)
            continue
        edges = lineage_edges(engine, sid, m.id)
        below = {e.summary_id for e in edges}
        ids |= {e.replaced_id for e in edges if e.replaced_id not in below}
    found = SessionStore(engine, sid).load_messages(ids)
    return [found[i] for i in sorted(ids)]


def test_an_offload_shows_the_originals_behind_it_down_through_summaries(
    ui: Served, world: World, db_url: str
) -> None:
    events = SessionStore(
        AutoContextClient.shared(db_url, auto_upgrade=False).engine, world.main
    ).events()
    nested = 0
    for e in events:
        if e.offload_uuid is None:
            continue
        expected = _originals_behind(db_url, world.main, e.offload_uuid)
        removed = SessionStore(
            AutoContextClient.shared(db_url, auto_upgrade=False).engine, world.main
        ).reload(e.offload_uuid)
        nested += any(m.kind != "original" for m in removed)
        path: str | None = f"/s/{_q(world.main)}/o/{e.offload_uuid}?view=originals"
        shown: list[list[str]] = []
        while path is not None:
            status, body = ui.get(path)
            assert status == 200, body[-500:]
            blocks = re.findall(r'<div class="msg" id="m\d+">(.*?)\n</div>', body, re.S)
            shown += [
                [html.unescape(t) for t in re.findall(r'<pre class="stored">(.*?)</pre>', b, re.S)]
                for b in blocks
            ]
            path = _link(body, "next")
        assert shown == [[p.text for p in parts(m)] for m in expected], e.id
    assert nested, "the world has an offload that holds a summary"


def test_an_offload_page_takes_a_handle(ui: Served, world: World, db_url: str) -> None:
    """The number a tag shows opens the same page as the uuid, which names both."""
    engine = AutoContextClient.shared(db_url, auto_upgrade=False).engine
    event = next(e for e in SessionStore(engine, world.main).events() if e.offload_uuid)
    with engine.connect() as conn:
        handle = conn.execute(
            sa.text("select handle from offloads where session_id = :s and uuid = :u"),
            {"s": world.main, "u": event.offload_uuid},
        ).scalar_one()
    by_uuid = ui.get(f"/s/{_q(world.main)}/o/{event.offload_uuid}")
    by_handle = ui.get(f"/s/{_q(world.main)}/o/{handle}")
    assert by_uuid[0] == by_handle[0] == 200
    assert by_handle[1] == by_uuid[1]
    assert f'Offload <span class="id">{handle}</span>' in by_handle[1]
    assert ui.get(f"/s/{_q(world.main)}/o/{handle + 100_000}")[0] == 404


def test_a_summarys_page_lists_what_it_replaced_in_order(
    ui: Served, world: World, db_url: str
) -> None:
    engine = AutoContextClient.shared(db_url, auto_upgrade=False).engine
    for e in SessionStore(engine, world.main).events():
        assert e.summary_message_id is not None
        direct = sorted(
            (x for x in lineage_edges(engine, world.main, e.summary_message_id) if x.depth == 1),
            key=lambda x: x.ordinal,
        )
        _, body = ui.get(f"/s/{_q(world.main)}/m/{e.summary_message_id}")
        table = body[body.index('<table id="lineage">') :]
        listed = [int(i) for i in re.findall(r'<td class="id"><a href="[^"]+">#(\d+)</a>', table)]
        assert listed == [x.replaced_id for x in direct], e.id


def test_the_events_and_a_summarys_page_show_its_fact_check_and_dropped_facts(
    ui: Served, db_url: str
) -> None:
    """The fact check's counts on the events page and on the summary's page, and the dropped
    facts as stored, escaped (docs/design.md §6)."""
    config = AutoContextConfig(
        max_tokens=20_000,
        msg_threshold=60,
        last_keep=10,
        min_tool_run=3,
        min_compress_tokens=300,
        large_payload_chars=2000,
        preview_chars=100,
        reload_page_chars=1500,
        mask_min_chars=2**31 - 1,
        fact_index_ratio=0.0,  # no index line: every missing fact is dropped
    )
    mem = AutoContextMemory.open(
        f"ui-facts-{_tag()}", db_url, config, summarizer=OfflineSummarizer()
    )
    history = multi_round(5, rounds=4, steps=8)
    history[1:1] = [Msg.user('Never ship "<b>bold</b> release" to ERR-7731 hosts.')]
    mem.add(history)
    mem.compress_if_needed()
    checked = [e for e in mem.events() if e.status == "applied" and e.facts is not None]
    assert checked and any(e.facts.dropped_facts for e in checked)
    s = _q(mem.session_id)
    _, events = ui.get(f"/s/{s}/events")
    assert "<b>bold</b>" not in events
    for e in checked:
        f = e.facts
        row = events[events.index(f'<tr id="e{e.id}">') :]
        row = row[: row.index("</tr>")]
        assert f"{f.found - f.dropped}/{f.found}</span>" in row
        for fact in f.dropped_facts:
            assert str(markupsafe.escape(fact)) in row
        _, page = ui.get(f"/s/{s}/m/{e.summary_message_id}")
        assert f"Fact check: of {f.found} facts found" in page
        if f.dropped_facts:
            assert 'id="dropped"' in page
    mem.close()


def test_bad_urls_get_the_consoles_own_answers(ui: Served, world: World) -> None:
    s = _q(world.main)
    cases = {
        "/?sort=cheapest": (400, "&#39;sort&#39; takes one of window, cost, failures, updated"),
        "/?page=1": (400, "takes no URL parameter &#39;page&#39;"),
        f"/s/{s}/working?after={2**64}": (400, "&#39;after&#39; takes a number from 0 to"),
        f"/s/{s}/m/{2**64}": (400, "no message id is larger than"),
        f"/s/{s}/events?after=x": (400, "&#39;after&#39; takes a whole number"),
        f"/s/{s}/o/not-a-uuid": (400, "full uuid"),
        f"/s/{s}/o/{world.offload}?view=all": (400, "&#39;view&#39; takes removed or originals"),
        f"/s/{s}/o/{uuid.uuid4()}": (404, "no offloaded context"),
        f"/s/{s}/m/999999": (404, "no message 999999"),
        "/s/no-such-session": (404, "does not exist"),
        "/search?q=%20": (400, "search"),
        "/nowhere": (404, "no console page"),
    }
    for path, (code, text) in cases.items():
        status, body = ui.get(path)
        assert (status, text in body) == (code, True), (path, status, body[-800:])
        assert MARKER not in body


# ---------------------------------------------------------------------------------------------
# The access rule over raw sockets (issue 34): Host, token, bodies, headers, bad parameters
# ---------------------------------------------------------------------------------------------


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


def _exchange(
    served: Served, data: bytes, *, quiet_s: float = 0.5, head_first: bool = False
) -> list[Answer]:
    """Send `data` on one connection and read every answer until the server closes it or
    stays quiet for `quiet_s`; the answers, parsed by their Content-Length (the first has no
    body when it answers a HEAD)."""
    received = b""
    with socket.create_connection((served.host, served.port), timeout=10) as sock:
        sock.sendall(data)
        sock.settimeout(quiet_s)
        while True:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            received += chunk
    answers = []
    while received:
        head, _, rest = received.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        size = 0 if head_first and not answers else int(headers.get("content-length", "0"))
        answers.append(Answer(int(lines[0].split()[1]), headers, rest[:size]))
        received = rest[size:]
    return answers


def _request(
    served: Served,
    path: str,
    *,
    method: str = "GET",
    host: str | None = None,
    cookie: bool = True,
    body: bytes = b"",
    extra: str = "",
) -> bytes:
    lines = [f"{method} {path} HTTP/1.1"]
    if host != "":
        lines.append(f"Host: {host or f'127.0.0.1:{served.port}'}")
    if cookie and served.cookie:
        lines.append(f"Cookie: {served.cookie}")
    if body:
        lines.append(f"Content-Length: {len(body)}")
    text = "\r\n".join(lines) + "\r\n" + extra + "\r\n"
    return text.encode("latin-1") + body


def test_only_the_hosts_it_serves_are_answered(ui: Served, world: World, db_url: str) -> None:
    path = f"/s/{_q(world.main)}/working"
    for host in ("attacker.example", f"attacker.example:{ui.port}", "127.0.0.2", ""):
        (answer,) = _exchange(ui, _request(ui, path, host=host))
        assert answer.status == 403, host
        assert b"Host" in answer.body and MARKER.encode() not in answer.body
        assert world.main.encode() not in answer.body
        assert "content-security-policy" in answer.headers
    for host in (f"127.0.0.1:{ui.port}", "127.0.0.1", f"localhost:{ui.port}", "LOCALHOST"):
        (answer,) = _exchange(ui, _request(ui, path, host=host))
        assert answer.status == 200, host
    with serve(db_url, None, allow_hosts=["box.internal"]) as allowed:
        (answer,) = _exchange(allowed, _request(allowed, path, host="box.internal:80"))
        assert answer.status == 200
        (answer,) = _exchange(allowed, _request(allowed, path, host="other.internal"))
        assert answer.status == 403


def test_every_page_needs_the_token(ui: Served, world: World, db_url: str) -> None:
    path = f"/s/{_q(world.main)}/working"
    (answer,) = _exchange(ui, _request(ui, path, cookie=False))
    assert answer.status == 403 and b"token" in answer.body
    assert world.main.encode() not in answer.body
    (answer,) = _exchange(ui, _request(ui, path + "?token=not-the-token", cookie=False))
    assert answer.status == 403
    wrong = f"Cookie: {ui.server.access.cookie}=not-the-token\r\n"
    (answer,) = _exchange(ui, _request(ui, path, cookie=False, extra=wrong))
    assert answer.status == 403
    # The token URL: a cookie, and the same URL without the token.
    signed = ui.signed(f"/s/{_q(world.main)}/working?after=5")[len(ui.base) :]
    (answer,) = _exchange(ui, _request(ui, signed, cookie=False))
    assert answer.status == 303
    assert answer.headers["location"] == f"/s/{_q(world.main)}/working?after=5"
    cookie = answer.headers["set-cookie"]
    assert cookie.startswith(f"{ui.server.access.cookie}={ui.token};")
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    (answer,) = _exchange(ui, _request(ui, "//elsewhere.example/x?token=" + str(ui.token)))
    assert answer.headers["location"] == "/elsewhere.example/x"
    (answer,) = _exchange(ui, _request(ui, path))
    assert answer.status == 200 and world.main.encode() in answer.body
    # Off only when asked, and only on a loopback address.
    with serve(db_url, None, token=False) as open_:
        (answer,) = _exchange(open_, _request(open_, path, cookie=False))
        assert answer.status == 200
    with pytest.raises(autoctx.ConfigError, match="only on a loopback address"):
        make_server(
            AutoContextClient.shared(db_url, auto_upgrade=False).engine,
            None,
            "0.0.0.0",
            0,
            token=False,
        )


def test_a_refused_request_body_is_never_read_as_a_second_request(ui: Served, world: World) -> None:
    # A body that is itself a request: answered as one would make two answers.
    inner = f"GET /s/{_q(world.main)}/working HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()
    for method in ("POST", "PUT", "DELETE", "PATCH", "OPTIONS", "GET", "HEAD"):
        follow = _request(ui, "/")
        answers = _exchange(
            ui, _request(ui, "/", method=method, body=inner) + follow, head_first=method == "HEAD"
        )
        expected = 405 if method not in ("GET", "HEAD") else 200
        # One answer for the request with the body, one for the request after it, on the
        # same kept-alive connection.
        assert [a.status for a in answers] == [expected, 200], method
        assert MARKER.encode() not in b"".join(a.body for a in answers)
    # A body the console will not read whole (chunked, or over its limit): one answer, then
    # the connection closes.
    chunked = _request(ui, "/", method="POST", extra="Transfer-Encoding: chunked\r\n")
    answers = _exchange(ui, chunked + b"2b\r\n" + inner + b"\r\n0\r\n\r\n")
    assert [a.status for a in answers] == [405]
    assert answers[0].headers["connection"] == "close"
    big = b"x" * (64 * 1024 + 1)
    answers = _exchange(ui, _request(ui, "/", method="POST", body=big) + _request(ui, "/"))
    assert [a.status for a in answers] == [405]


def test_every_status_carries_the_content_security_policy(ui: Served, world: World) -> None:
    requests = {
        200: _request(ui, "/"),
        303: _request(ui, f"/?token={ui.token}", cookie=False),
        400: _request(ui, "/?sort=cheapest"),
        403: _request(ui, "/", cookie=False),
        404: _request(ui, "/nowhere"),
        405: _request(ui, "/", method="POST", body=b"x=1"),
        501: _request(ui, "/", method="BREW"),
        505: b"GET / HTTP/2.0\r\nHost: 127.0.0.1\r\n\r\n",
    }
    for status, data in requests.items():
        answers = _exchange(ui, data)
        assert [a.status for a in answers] == [status]
        headers = answers[0].headers
        assert headers.get("content-security-policy", "").startswith("default-src 'none'"), status
        assert headers.get("x-content-type-options") == "nosniff", status
    (answer,) = _exchange(ui, _request(ui, "/", method="POST"))
    assert answer.headers["allow"] == "GET, HEAD"


HOSTILE = ["", "x", "-1", "0", str(2**63 - 1), str(2**63), str(2**64), "%00", "a%00b", "1e3"]


def test_malformed_parameters_are_400_or_404_and_the_log_prints_no_sql(
    ui: Served, world: World, caplog: pytest.LogCaptureFixture
) -> None:
    s = _q(world.main)
    named = {
        "/?page=9223372036854775807": 400,
        "/s/%00x": 400,
        "/s/a%00b/working": 400,
        f"/search?q=report&session={s}%00": 400,
        "/search?q=report&session=%00": 400,
        "/search?q=a%00b": 400,
        f"/s/{s}?x=%00": 400,
        f"/s/{'x' * 300}": 400,
        f"/s/{s}/events?after=1&after=2": 400,
        "/?after=no-such-session": 200,
    }
    paths = dict(named)
    for template in (
        "/?sort=window&after={v}",
        "/?before={v}",
        f"/s/{s}/events?after={{v}}",
        f"/s/{s}/events?before={{v}}",
        f"/s/{s}/working?after={{v}}",
        f"/s/{s}/working?before={{v}}",
        f"/s/{s}/m/{world.summary_id}?after={{v}}",
        f"/s/{s}/m/{{v}}",
        f"/s/{s}/o/{world.offload}?page={{v}}",
        f"/s/{s}/o/{world.offload}?view=originals&after={{v}}",
        f"/s/{s}/o/{{v}}",
        "/search?q={v}",
        "/search?q=report&session={v}",
    ):
        for value in HOSTILE:
            paths.setdefault(template.format(v=value), 0)
    caplog.set_level(logging.DEBUG, logger="autoctx")
    for path, expected in paths.items():
        status, body = ui.get(path)
        assert status in (200, 400, 404), (path, status, body[-600:])
        if expected:
            assert status == expected, (path, body[-600:])
        if status == 400:
            message = re.search(r'<p class="error">(.*?)</p>', body, re.S)
            assert message and len(message.group(1)) < 400, path
        assert "SELECT" not in body and "psycopg" not in body, path
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "SELECT" not in logged and "%(" not in logged and "\\x00" not in logged
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], logged[-2000:]


# ---------------------------------------------------------------------------------------------
# Paging stays on indexes (checked with EXPLAIN; seq scans off, so a plan without an index
# path would still show a Seq Scan)
# ---------------------------------------------------------------------------------------------


def test_the_paged_queries_use_indexes(db_url: str, world: World) -> None:
    engine = sa.create_engine(db_url, poolclass=sa.NullPool)
    params = {
        "sid": world.main,
        "tenant": None,
        "key": 0,
        "limit": 101,
        "mid": 1,
        "after": 0,
        "buckets": 896,
    }
    queries = {
        "events": db._EVENTS.format(scope="s.tenant IS NULL", op=">", direction="ASC"),
        "working": db._WORKING.format(scope="s.tenant IS NULL", op=">", direction="ASC"),
        "children": db._CHILDREN.format(scope="s.tenant IS NULL"),
        "covering": db._COVERING.format(scope="s.tenant IS NULL"),
        "timeline": db._TIMELINE.format(scope="s.tenant IS NULL"),
        "growth": db._GROWTH.format(scope="s.tenant IS NULL"),
    }
    with engine.begin() as conn:
        conn.execute(sa.text("set local enable_seqscan = off"))
        for name, sql in queries.items():
            plan = "\n".join(r[0] for r in conn.exec_driver_sql("EXPLAIN " + sql, params).all())
            assert "Seq Scan" not in plan, (name, plan)
    engine.dispose()


# ---------------------------------------------------------------------------------------------
# Tenancy: application (the console's tenant) and database (a role granted one tenant)
# ---------------------------------------------------------------------------------------------


def test_a_console_shows_its_tenant_only(ui: Served, world: World, db_url: str) -> None:
    _, body = ui.get("/")
    assert world.main in body and world.acme not in body and world.globex not in body
    assert ui.get(f"/s/{_q(world.acme)}")[0] == 404
    _, found = ui.get("/search?q=acmesecret")
    assert "No hits" in found
    with serve(db_url, "acme") as acme:
        _, body = acme.get("/")
        assert world.acme in body and world.main not in body and world.globex not in body
        assert acme.get(f"/s/{_q(world.globex)}")[0] == 404
        assert acme.get(f"/s/{_q(world.main)}/o/{world.offload}")[0] == 404
        _, found = acme.get("/search?q=report")
        assert world.acme in found and world.globex not in found


def test_a_role_granted_one_tenant_sees_nothing_else_whatever_it_asks(
    world: World, acme_role: Role
) -> None:
    with serve(acme_role.url, "acme") as acme:
        _, body = acme.get("/")
        assert world.acme in body and world.globex not in body
        status, body = acme.get(f"/s/{_q(world.acme)}/working")
        assert status == 200 and "acmesecret" in body
    # Asking for globex (not granted): the policies show nothing, whatever the console asks.
    with serve(acme_role.url, "globex") as other:
        _, body = other.get("/")
        assert "No sessions here" in body and world.globex not in body
        assert other.get(f"/s/{_q(world.globex)}")[0] == 404
        _, found = other.get("/search?q=globexsecret")
        assert "No hits" in found
    with serve(acme_role.url, None) as none:
        _, body = none.get("/")
        assert "No sessions here" in body and world.main not in body


def test_autoctx_ui_serves_the_console_from_the_command_line(db_url: str, world: World) -> None:
    command = [sys.executable, "-u", "-m", "autoctx._cli", "ui", "--port", "0"]
    child = subprocess.Popen(
        [*command, "--database-url", db_url],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        found = re.search(r"http://127\.0\.0\.1:(\d+)/\?token=([A-Za-z0-9_-]{40,})", line)
        assert found, line
        plain = found.group(0).split("?")[0]
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(plain, timeout=30)
        assert refused.value.code == 403
        # As a browser: the token URL sets the cookie and redirects to the plain URL.
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())
        with opener.open(found.group(0), timeout=30) as answer:
            body = answer.read().decode()
            assert answer.status == 200 and answer.url == plain and world.main in body
    finally:
        child.terminate()
        child.wait(timeout=30)


def test_the_cli_command_is_registered_and_refuses_a_bad_tenant() -> None:
    result = CliRunner().invoke(app, ["ui", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and "read-only" in result.output
    result = CliRunner().invoke(app, ["ui", "--tenant", ""])
    assert result.exit_code != 0
    assert (
        "--allow-host" in CliRunner().invoke(app, ["ui", "--help"], env={"COLUMNS": "200"}).output
    )


def test_the_cli_refuses_no_token_off_the_loopback(db_url: str) -> None:
    result = CliRunner().invoke(
        app, ["ui", "--host", "0.0.0.0", "--port", "0", "--no-token", "--database-url", db_url]
    )
    assert result.exit_code != 0
    assert "without a token only on a loopback address" in result.output
    assert "Traceback" not in result.output


# ---------------------------------------------------------------------------------------------
# In a real browser: Debian's chromium, driven by Playwright (never a downloaded browser)
# ---------------------------------------------------------------------------------------------

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]


@pytest.fixture(scope="module")
def playwright_() -> Iterator[Playwright]:
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.skip(
            f"the browser tests drive Debian's chromium at {CHROMIUM}: apt-get install chromium"
        )
    with sync_playwright() as playwright:
        yield playwright


@pytest.fixture(scope="module")
def browser(playwright_: Playwright) -> Iterator[Browser]:
    launched = playwright_.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
    yield launched
    launched.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    wanted = os.environ.get("AUTOCTX_UI_SCREENSHOTS")
    folder = Path(wanted) if wanted else tmp_path_factory.mktemp("console-shots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    opened = context.new_page()
    dialogs: list[str] = []
    opened.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    # Nothing may be fetched from anywhere but the console itself.
    elsewhere: list[str] = []
    opened.on(
        "request",
        lambda r: None if r.url.startswith("http://127.0.0.1:") else elsewhere.append(r.url),
    )
    yield opened
    assert not dialogs, f"a script ran: {dialogs}"
    assert not elsewhere, f"fetched from elsewhere: {elsewhere}"
    context.close()


def test_browser_sessions_sort_and_navigation(
    page: Page, ui: Served, world: World, shots: Path
) -> None:
    page.goto(ui.signed("/"))
    first = page.locator("#sessions tbody tr td.id a").first
    assert first.inner_text() == world.main  # nearest the window by default
    page.screenshot(path=shots / "sessions.png")
    page.click("#sort-failures")
    assert page.url.endswith("sort=failures")
    assert page.locator("#sessions tbody tr td.id a").first.inner_text() == world.failing
    page.click("#sort-cost")  # the failed attempts' summarizer tokens
    assert page.locator("#sessions tbody tr td.id a").first.inner_text() == world.failing
    page.click("#sort-window")
    page.locator("#sessions tbody tr td.id a", has_text=world.main).click()
    assert page.locator("svg.timeline").count() == 1
    assert page.locator("svg.timeline .mark").count() >= 1
    page.screenshot(path=shots / "session.png")
    page.click("text=events (")
    assert page.locator("#events tbody tr").count() >= 1
    page.screenshot(path=shots / "events.png")
    page.click("text=working context (")
    rows = page.locator("#working tbody tr")
    assert rows.count() >= 1
    page.screenshot(path=shots / "working.png")


def test_browser_lineage_click_through_reaches_an_original(
    page: Page, ui: Served, world: World, shots: Path
) -> None:
    page.goto(ui.signed(f"/s/{_q(world.main)}/working"))
    # The first working message some compression wrote.
    page.locator("#working tbody tr", has=page.locator("td.kind")).first.locator("td.id a").click()
    assert page.locator("#kind").inner_text() != "original"
    page.screenshot(path=shots / "lineage.png")
    kinds = [page.locator("#kind").inner_text()]
    for _ in range(6):
        if kinds[-1] == "original":
            break
        # Down through a nested summary when there is one, else to an original.
        nested = page.locator("#lineage tbody tr", has=page.locator("td.kind"))
        target = nested.first if nested.count() else page.locator("#lineage tbody tr").first
        target.locator("td.id a").click()
        kinds.append(page.locator("#kind").inner_text())
    assert kinds[-1] == "original"
    assert len(kinds) >= 3, f"the walk went through a nested summary: {kinds}"
    assert "Covered now by" in page.inner_text("main")
    page.screenshot(path=shots / "original.png")


def test_browser_offload_shows_the_originals_exactly(
    page: Page, ui: Served, world: World, shots: Path, db_url: str
) -> None:
    page.goto(ui.signed(f"/s/{_q(world.main)}/events"))
    page.locator(f"#events a[href$='/o/{world.offload}']").click()
    assert page.url.endswith(f"/o/{world.offload}")
    expected = AutoContextMemory.open(
        world.main, db_url, summarizer=OfflineSummarizer(), create=False
    ).reload(world.offload)
    shown = page.locator(".msg")
    assert shown.count() == min(len(expected), 20)
    for k, msg in enumerate(expected[:20]):
        texts = shown.nth(k).locator("pre.stored").all_text_contents()
        assert texts == [p.text for p in parts(msg)], msg.id
    assert EXACT in page.locator(f"#m{world.exact_id} pre.stored").all_text_contents()
    page.locator(f"#m{world.exact_id}").scroll_into_view_if_needed()
    page.screenshot(path=shots / "offload.png")
    page.click("#view-originals")
    originals = _originals_behind(db_url, world.main, world.offload)
    first = page.locator(".msg").first.locator("pre.stored").all_text_contents()
    assert first == [p.text for p in parts(originals[0])]


def test_browser_search_finds_a_message(page: Page, ui: Served, world: World, shots: Path) -> None:
    page.goto(ui.signed("/"))
    page.fill("header input[name=q]", MARKER)
    page.press("header input[name=q]", "Enter")
    hit = page.locator("#hits tbody tr")
    assert hit.count() == 1
    assert page.locator("#hits mark").first.inner_text() == MARKER
    page.screenshot(path=shots / "search.png")
    hit.locator("td.id a[href*='/m/']").click()
    assert f"find {MARKER} please" in page.locator("#content").inner_text()


def test_browser_markup_stays_text(page: Page, ui: Served, world: World, shots: Path) -> None:
    page.goto(ui.signed(f"/s/{_q(world.main)}/m/{world.script_id}"))
    assert page.locator("#content pre.stored").first.text_content() == SCRIPT
    assert page.evaluate("document.querySelectorAll('script, main b').length") == 0
    assert page.title() != "owned"
    page.screenshot(path=shots / "markup.png")


def test_browser_a_tenant_role_sees_its_tenant(
    page: Page, world: World, acme_role: Role, shots: Path
) -> None:
    with serve(acme_role.url, "acme") as acme:
        page.goto(acme.signed("/"))
        ids = page.locator("#sessions tbody tr td.id a").all_inner_texts()
        assert world.acme in ids and world.globex not in ids and world.main not in ids
        page.screenshot(path=shots / "tenant.png")
        page.goto(f"{acme.base}/s/{_q(world.globex)}")
        assert "404" in page.title()


def test_browser_the_token_url_signs_in_and_leaves_the_plain_url(
    page: Page, ui: Served, world: World, shots: Path
) -> None:
    answer = page.goto(ui.base + "/")
    assert answer is not None and answer.status == 403
    assert "403" in page.title() and world.main not in page.content()
    page.screenshot(path=shots / "token-needed.png")
    path = f"/s/{_q(world.main)}/events"
    answer = page.goto(ui.signed(path))
    assert answer is not None and answer.status == 200
    assert page.url == ui.base + path  # the token is gone from the address bar
    assert page.locator("#events tbody tr").count() >= 1
    page.click("text=working context (")  # the cookie carries on
    assert page.locator("#working tbody tr").count() >= 1
    (cookie,) = page.context.cookies()
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"


def test_browser_a_name_rebound_to_the_console_gets_nothing(
    playwright_: Playwright, ui: Served, world: World, shots: Path
) -> None:
    """DNS rebinding: a name of another site that resolves to the console's address (the
    browser's resolver maps it) reaches the server, whose Host check answers 403."""
    rule = "--host-resolver-rules=MAP attacker.example 127.0.0.1"
    rebinding = playwright_.chromium.launch(executable_path=CHROMIUM, args=[*CHROMIUM_ARGS, rule])
    try:
        opened = rebinding.new_context(viewport={"width": 1280, "height": 900}).new_page()
        for url in (
            f"http://attacker.example:{ui.port}/s/{_q(world.main)}/working",
            f"http://attacker.example:{ui.port}/?token={ui.token}",
        ):
            answer = opened.goto(url)
            assert answer is not None and answer.status == 403, url
            assert world.main not in opened.content()
            assert answer.headers.get("set-cookie") is None
        opened.screenshot(path=shots / "rebound-host.png")
        # The same browser by the console's own address is answered.
        answer = opened.goto(ui.signed("/"))
        assert answer is not None and answer.status == 200 and world.main in opened.content()
    finally:
        rebinding.close()


def test_browser_a_post_from_another_page_is_405_with_the_csp(
    page: Page, ui: Served, world: World
) -> None:
    page.goto(ui.signed("/"))  # signed in: the cookie is there, and still a POST is refused
    page.set_content(
        f'<form method="post" action="{ui.base}/s/{_q(world.main)}/working">'
        '<input name="x" value="GET / HTTP/1.1"></form>'
    )
    with page.expect_response(lambda r: r.request.method == "POST") as posted:
        page.evaluate("document.forms[0].submit()")
    answer = posted.value
    assert answer.status == 405
    assert answer.headers["content-security-policy"].startswith("default-src 'none'")
    assert answer.headers["allow"] == "GET, HEAD"
    page.wait_for_load_state()
    assert "read-only" in page.inner_text("main")


def test_browser_malformed_urls_get_a_plain_400_or_404(
    page: Page, ui: Served, world: World, shots: Path
) -> None:
    page.goto(ui.signed("/"))
    for path, status in (
        ("/?page=9223372036854775807", 400),
        ("/s/%00x", 400),
        (f"/search?q=report&session={_q(world.main)}%00", 400),
        ("/s/no-such-session/events", 404),
    ):
        answer = page.goto(ui.base + path)
        assert answer is not None and answer.status == status, path
        assert answer.headers["content-security-policy"].startswith("default-src 'none'")
        text = page.locator("p.error").inner_text()
        assert text and "SELECT" not in text and "Traceback" not in page.content()
    page.screenshot(path=shots / "bad-url.png")


def _fits(page: Page) -> None:
    """Nothing wider than the window: no sideways scroll at 1,280 pixels."""
    width, inner, scrolled = page.evaluate(
        "[document.documentElement.scrollWidth, window.innerWidth, window.scrollX]"
    )
    assert (width, scrolled) == (inner, 0), page.url


def test_browser_every_page_fits_a_1280_pixel_window(
    page: Page, ui: Served, world: World, shots: Path
) -> None:
    s = _q(world.main)
    page.goto(ui.signed("/"))
    for name, path in (
        ("sessions", "/"),
        ("session", f"/s/{s}"),
        ("events", f"/s/{s}/events"),
        ("events-failed", f"/s/{_q(world.failing)}/events"),
        ("working", f"/s/{s}/working"),
        ("summary", f"/s/{s}/m/{world.summary_id}"),
        ("offload", f"/s/{s}/o/{world.offload}"),
        ("originals", f"/s/{s}/o/{world.offload}?view=originals"),
        ("search", f"/search?q={MARKER}"),
    ):
        page.goto(ui.base + path)
        _fits(page)
        page.screenshot(path=shots / f"fit-{name}.png", full_page=True)


def test_browser_a_timeline_mark_opens_its_event_among_its_neighbours(
    page: Page, ui: Served, world: World, db_url: str, shots: Path
) -> None:
    events = SessionStore(
        AutoContextClient.shared(db_url, auto_upgrade=False).engine, world.main
    ).events()
    last = max(e.id for e in events)
    page.goto(ui.signed(f"/s/{_q(world.main)}"))
    # The latest event's mark: the one that used to open a page of that one row.
    page.locator(f"svg.timeline a[href$='#e{last}']").click()
    assert page.url.endswith(f"#e{last}")
    rows = page.locator("#events tbody tr")
    assert rows.count() == min(len(events), 6)
    assert page.locator(f"#e{last}").is_visible()
    assert page.evaluate("getComputedStyle(document.querySelector(':target')).backgroundColor") in (
        "rgb(255, 243, 196)",
    )
    _fits(page)
    page.screenshot(path=shots / "mark-to-event.png")
