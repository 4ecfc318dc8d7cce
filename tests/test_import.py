"""Restore from export (SPEC.md section 9): export, import into another database, export
again: the same document; the restored session works; bad documents write nothing."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import URL

from autoctx import (
    AutoContextMemory,
    InvalidExport,
    Msg,
    OfflineSummarizer,
    SessionExists,
    SessionNotFound,
    export_session,
    import_session,
)
from autoctx._memory import dispose_engines
from tests.conftest import _drop_database, clone_database
from tests.invariants import assert_totals_match, assert_valid_openai_chat
from tests.lifecycle import CONFIG, build, round_of
from tests.test_cli import assert_one_line_error, invoke

Opener = Callable[..., AutoContextMemory]


@pytest.fixture(scope="module")
def other_db(admin_url: URL, template_db: str) -> Iterator[str]:
    """A second migrated database: where the sessions are restored."""
    url, name = clone_database(admin_url, template_db)
    yield url.render_as_string(hide_password=False)
    dispose_engines()
    _drop_database(admin_url, name)


@pytest.fixture
def rich(open_memory: Opener, session_id: str) -> AutoContextMemory:
    """A forked, compressed, erased, tenanted session with a plan and a popped message: every
    kind of row an export carries."""
    parent = open_memory(f"{session_id}-parent", CONFIG, tenant="acme")
    build(parent, 10)
    mem = parent.fork(session_id)
    build(mem, 4)
    mem.erase([2, 3], reason="user request")
    mem.set_plan({"goal": "ship", "steps": [{"title": "test", "state": "in_progress"}]})
    mem.add(Msg.user("one more"))
    mem.pop_last()
    return mem


def test_export_import_export_gives_the_same_document(
    rich: AutoContextMemory, db_url: str, other_db: str
) -> None:
    document = export_session(rich.session_id, db_url)
    assert document["format"] == "autoctx-export/2"
    assert document["session"]["forked_from"] == f"{rich.session_id}-parent"
    text = json.dumps(document)
    info = import_session(text, other_db)
    assert info.session_id == rich.session_id and info.tenant == "acme"
    again = export_session(rich.session_id, other_db)
    assert again == document

    # The restored session works like the original: same context, reloads, appends, compression.
    restored = AutoContextMemory.open(
        rich.session_id, other_db, tenant="acme", summarizer=OfflineSummarizer(), create=False
    )
    assert restored.to_openai() == rich.to_openai()
    assert restored.events() == rich.events()
    assert restored.refresh().incarnation != rich.refresh().incarnation
    # (Not every original is reachable: `pop_last` took one out, in both.)
    assert_valid_openai_chat(restored.to_openai())
    assert_totals_match(restored)
    for offload in document["offloads"]:
        assert [m.id for m in restored.reload(offload["uuid"])] == offload["message_ids"]
    for mem in (rich, restored):
        build(mem, 3)
    # The same compressions on both (offload uuids are new each time).
    assert [(m.id, m.kind) for m in restored.messages()] == [
        (m.id, m.kind) for m in rich.messages()
    ]


def test_import_never_overwrites(rich: AutoContextMemory, db_url: str) -> None:
    document = export_session(rich.session_id, db_url)
    with pytest.raises(SessionExists, match="refuses to overwrite"):
        import_session(document, db_url)
    assert export_session(rich.session_id, db_url) == document


def _broken(document: dict[str, object], where: str) -> dict[str, object]:
    doc = copy.deepcopy(document)
    if where == "v1":
        doc["format"] = "autoctx-export/1"
    elif where == "other":
        doc["format"] = "something-else"
    elif where == "no lineage":
        del doc["lineage"]
    elif where == "bad time":
        doc["session"]["created_at"] = "yesterday"  # type: ignore[index]
    elif where == "bad tokens":
        doc["messages"][0]["tokens"] = "12"  # type: ignore[index]
    elif where == "dangling lineage":
        doc["lineage"][0]["replaced_id"] = 10**9  # type: ignore[index]
    elif where == "dangling event":
        doc["offloads"][0]["event_id"] = 10**9  # type: ignore[index]
    elif where == "bad block":
        doc["messages"][0]["content"] = [{"type": "text"}]  # type: ignore[index]
    return doc


@pytest.mark.parametrize(
    ("where", "needle"),
    [
        ("v1", "version 1 lacked"),
        ("other", "not an autoctx export"),
        ("no lineage", "lineage must be a list"),
        ("bad time", "session.created_at is not an ISO 8601 time"),
        ("bad tokens", "messages[0].tokens must be an integer"),
        ("dangling lineage", "lineage[0] names a message"),
        ("dangling event", "constraint"),
        ("bad block", "messages[0].content holds a block"),
    ],
)
def test_a_bad_document_imports_nothing(
    rich: AutoContextMemory, db_url: str, other_db: str, where: str, needle: str
) -> None:
    document = export_session(rich.session_id, db_url)
    with pytest.raises(InvalidExport, match=needle.replace("[", r"\[").replace("]", r"\]")) as info:
        import_session(_broken(document, where), other_db)
    assert "nothing was imported" in str(info.value)
    with pytest.raises(SessionNotFound):
        export_session(rich.session_id, other_db)
    with pytest.raises(InvalidExport, match="not JSON"):
        import_session("{not json", other_db)


def test_cli_export_then_import(
    open_memory: Opener, db_url: str, other_db: str, tmp_path: Path
) -> None:
    mem = open_memory(config=CONFIG)
    build(mem, 8)
    mem.add(round_of(99))
    out = tmp_path / "s.json"
    result = invoke(["export", mem.session_id, "-o", str(out), "-d", db_url])
    assert result.exit_code == 0, result.stderr
    result = invoke(["import", str(out), "-d", other_db])
    assert result.exit_code == 0, result.stderr
    assert f"imported {mem.session_id!r}" in result.stdout
    again = invoke(["export", mem.session_id, "-d", other_db])
    assert json.loads(again.stdout) == json.loads(out.read_text())
    assert_one_line_error(invoke(["import", str(out), "-d", other_db]), "refuses to overwrite")
    (tmp_path / "bad.json").write_text("[]")
    assert_one_line_error(
        invoke(["import", str(tmp_path / "bad.json"), "-d", other_db]), "must be a JSON object"
    )
