"""Restore from export (docs/design.md §9): export, import into another database, export
again: the same document; the restored session works; bad documents write nothing."""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL
from typer.testing import CliRunner

from autoctx import (
    AutoContextClient,
    AutoContextMemory,
    InvalidExport,
    Msg,
    OfflineSummarizer,
    SessionExists,
    SessionNotFound,
    export_session,
    grant_tenant,
    import_session,
)
from autoctx._cli import app
from autoctx._exports import parse_document
from autoctx._store.catalog import Catalog
from autoctx._store.lifecycle import write_rows
from tests.conftest import _drop_database, clone_database
from tests.invariants import assert_totals_match, assert_valid_openai_chat
from tests.lifecycle import CONFIG, build, round_of
from tests.test_cli import assert_one_line_error, invoke
from tests.test_tenants import login_role

Opener = Callable[..., AutoContextMemory]


@pytest.fixture(scope="module")
def other_db(admin_url: URL, template_db: str) -> Iterator[str]:
    """A second migrated database: where the sessions are restored."""
    url, name = clone_database(admin_url, template_db)
    yield url.render_as_string(hide_password=False)
    AutoContextClient.close_shared(url)
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
        ("dangling event", "offloads[0].event_id names no event"),
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


# ---------------------------------------------------------------------------------------------
# Hostile documents (issue 22, items 7 and 8): refused whole, before any SQL, by one autoctx
# error that names the field and quotes no content.
# ---------------------------------------------------------------------------------------------

#: What a hostile document plants in the values it breaks: no error may quote it.
SECRET = "card 4111 1111 1111 1111"
Doc = dict[str, Any]


@pytest.fixture(scope="module")
def sound(db_url: str) -> Doc:
    """The export of a forked, compressed, erased session with a plan and an open call at its
    tail: every kind of row, built once for the module's hostile variants of it."""
    parent = AutoContextMemory.open(
        "hostile-parent", db_url, CONFIG, tenant="acme", summarizer=OfflineSummarizer()
    )
    build(parent, 10)
    mem = parent.fork("hostile")
    build(mem, 4)
    mem.erase([2, 3], reason="user request")
    mem.set_plan({"goal": "ship", "steps": [{"title": "test", "state": "in_progress"}]})
    mem.add(round_of(50)[:2])  # an assistant's call, its result not yet added
    return export_session(mem.session_id, db_url)


def _index(doc: Doc, key: str, test: Callable[[Doc], bool]) -> int:
    return next(k for k, row in enumerate(doc[key]) if test(row))


def _message_index(doc: Doc, message_id: int) -> int:
    return _index(doc, "messages", lambda m: m["id"] == message_id)


def _calls_answered(doc: Doc) -> int:
    """The working index of an assistant message whose call is answered in the context."""
    working = doc["working_messages"]
    return next(
        k
        for k in range(len(working) - 1)
        if working[k]["role"] == "assistant" and working[k + 1]["role"] == "tool"
    )


def _lineage_cycle(doc: Doc) -> None:
    # A summary made its own ancestor: fork and lineage walks would go round for ever.
    row = doc["lineage"][0]
    doc["lineage"].append(
        {**row, "summary_id": row["replaced_id"], "replaced_id": row["summary_id"], "ordinal": 0}
    )


def _over_the_cap(doc: Doc) -> None:
    doc["session"]["config"]["max_message_chars"] = 100


def _unpaired_result(doc: Doc) -> None:
    # The call's message taken out of the working context, its result left there.
    k = _calls_answered(doc)
    del doc["working_messages"][k]


def _set(path: str, value: Any) -> Callable[[Doc], None]:
    """A mutation setting the value at `path` (dots; `messages[id=N]` picks by message id)."""

    def mutate(doc: Doc) -> None:
        target: Any = doc
        parts = path.split(".")
        for part in parts[:-1]:
            target = _step(doc, target, part)
        last = parts[-1]
        if isinstance(target, list):
            target[int(last)] = value
        else:
            target[last] = value

    return mutate


def _step(doc: Doc, target: Any, part: str) -> Any:
    if part.startswith("messages[id="):
        return doc["messages"][_message_index(doc, int(part[len("messages[id=") : -1]))]
    if isinstance(target, list):
        return target[int(part)]
    return target[part]


def _working_original(doc: Doc) -> int:
    """The id of a user original in the working context."""
    return next(w["id"] for w in doc["working_messages"] if w["role"] == "user")


def _deep(levels: int) -> Any:
    value: Any = SECRET
    for _ in range(levels):
        value = {"k": value}
    return value


BREAKS_THE_SESSION: list[tuple[str, Callable[[Doc], None], str]] = [
    ("low next_message_id", _set("session.next_message_id", 2), "session.next_message_id"),
    ("low next_position", _set("session.next_position", 1), "session.next_position"),
    ("low next_event_id", _set("session.next_event_id", 1), "session.next_event_id"),
    ("negative token_count", _set("session.token_count", -72283), "session.token_count"),
    ("low token_count", _set("session.token_count", 10), "session.token_count is not the sum"),
    ("negative tokens", _set("messages.0.tokens", -5), "messages[0].tokens"),
    ("miscounted tokens", _set("messages.0.tokens", 1), "messages[0].tokens is not"),
    ("lineage cycle", _lineage_cycle, "is not newer than a message it replaced"),
    ("unpaired tool result", _unpaired_result, "breaks the pairing"),
    ("bad max_tokens", _set("session.config.max_tokens", "x"), "session.config.max_tokens"),
    ("bad derived ratio", _set("session.config.token_ratio", "x"), "session.config.token_ratio"),
    ("bad search_config", _set("session.config.search_config", "x'"), "config.search_config"),
    ("bad message search_config", _set("messages.0.search_config", "x'"), "search_config"),
    ("year 9999", _set("session.updated_at", "9999-12-31T00:00:00+00:00"), "in the future"),
    ("over max_message_chars", _over_the_cap, "over the session's max_message_chars"),
    ("wrong open_calls", _set("session.open_calls", {}), "session.open_calls"),
    ("unread content key", _set("messages.0.content.0.more", _deep(100)), "storage form"),
    ("unknown kind", _set("messages.0.kind", "x"), "messages[0].kind must be one of"),
    ("smallint strategy", _set("events.0.strategy", 40000), "events[0].strategy must be from"),
    ("int ordinal", _set("lineage.0.ordinal", 2**40), "lineage[0].ordinal must be an integer"),
]

RAW_ERRORS: list[tuple[str, Callable[[Doc], None], str]] = [
    ("NUL in text", _set("messages.0.content.0.text", SECRET + "\x00"), "contains a NUL"),
    ("NaN in metadata", _set("messages.0.metadata", {"x": math.nan, SECRET: 1}), "NaN"),
    ("NUL in name", _set("messages.0.name", SECRET + "\x00"), "messages[0].name contains a NUL"),
    ("2**40 tokens", _set("messages.0.tokens", 2**40), "messages[0].tokens must be an integer"),
    ("deep metadata", _set("messages.0.metadata", _deep(5000)), "nested deeper than 200"),
    ("lone surrogate", _set("messages.0.content.0.text", SECRET + "\ud800"), "not valid Unicode"),
    ("NUL in a metadata key", _set("messages.0.metadata", {SECRET + "\x00": 1}), "a NUL"),
    ("2**70 position", _set("working_messages.0.position", 2**70), "beyond 64 bits"),
]


def _hostile(sound: Doc, mutate: Callable[[Doc], None]) -> Doc:
    doc = copy.deepcopy(sound)
    mutate(doc)
    return doc


def _assert_refused(exc: InvalidExport, needle: str) -> None:
    text = str(exc)
    assert needle in text, text
    assert "nothing was imported" in text
    for said in (text, repr(exc), repr(exc.__cause__)):
        assert SECRET not in said and "4111" not in said


def test_the_sound_document_imports(sound: Doc, other_db: str) -> None:
    """The control of the hostile variants below: unchanged, the document imports."""
    info = import_session(sound, other_db)
    assert export_session(info.session_id, other_db) == sound


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [pytest.param(m, n, id=i) for i, m, n in BREAKS_THE_SESSION + RAW_ERRORS],
)
def test_a_hostile_document_is_refused_whole(
    sound: Doc, other_db: str, mutate: Callable[[Doc], None], needle: str
) -> None:
    doc = _hostile(sound, mutate)
    doc["session"]["session_id"] = "hostile-2"
    with pytest.raises(InvalidExport) as info:
        import_session(doc, other_db)
    _assert_refused(info.value, needle)
    with pytest.raises(SessionNotFound):
        export_session("hostile-2", other_db)
    # As JSON text, the same refusal (NaN and lone surrogates as JSON writes them; Python's
    # json cannot write the deepest metadata).
    try:
        text = json.dumps(doc)
    except RecursionError:
        return
    with pytest.raises(InvalidExport) as info:
        import_session(text, other_db)
    _assert_refused(info.value, needle)


#: The tables an import writes.
_TABLES = ("sessions", "messages", "working_set", "compression_events", "offloads", "lineage")


def _snapshot(url: str) -> dict[str, list[Any]]:
    """Every row of every table an import writes, as text."""
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    with engine.connect() as conn:
        found = {
            table: sorted(str(tuple(r)) for r in conn.execute(sa.text(f"select * from {table}")))
            for table in _TABLES
        }
    engine.dispose()
    return found


def test_a_refused_import_leaves_the_database_unchanged(sound: Doc, db_url: str) -> None:
    before = _snapshot(db_url)
    for _, mutate, _ in BREAKS_THE_SESSION + RAW_ERRORS:
        doc = _hostile(sound, mutate)
        doc["session"]["session_id"] = "hostile-3"
        with pytest.raises(InvalidExport):
            import_session(doc, db_url)
    assert _snapshot(db_url) == before


def test_a_document_of_another_tenant_is_refused_to_a_granted_role(
    sound: Doc, other_db: str
) -> None:
    doc = copy.deepcopy(sound)
    doc["session"]["session_id"] = "hostile-5"
    with login_role(other_db) as role:
        assert grant_tenant(role.name, "globex", other_db) is True
        with pytest.raises(InvalidExport) as info:
            import_session(doc, role.url)
        _assert_refused(info.value, "belongs to tenant 'acme', which this database role may not")
        assert "grant-tenant" in str(info.value)
    with pytest.raises(SessionNotFound):
        export_session("hostile-5", other_db)


def test_cli_refuses_a_hostile_file_in_one_line(other_db: str, tmp_path: Path) -> None:
    cases = {
        "latin1.json": (b'{"format": "' + SECRET.encode() + b'\xff"}', "not UTF-8"),
        "deep.json": (b"[" * 100_000 + b"]" * 100_000, "nested deeper"),
        "nan.json": (b"NaN", "export document: the document must be a JSON object"),
    }
    for name, (content, needle) in cases.items():
        (tmp_path / name).write_bytes(content)
        result = invoke(["import", str(tmp_path / name), "-d", other_db])
        assert_one_line_error(result, needle, "nothing was imported")
        assert "4111" not in result.output + result.stderr
        result = CliRunner().invoke(app, ["import", "-", "-d", other_db], input=content)
        assert_one_line_error(result, needle, "nothing was imported")


def test_what_the_database_still_refuses_is_one_autoctx_error(sound: Doc, db_url: str) -> None:
    """The store's side: rows past the pure checks (here changed after them) that the database
    refuses give one `InvalidExport` without the driver's text, and write nothing."""
    before = _snapshot(db_url)
    doc = copy.deepcopy(sound)
    doc["session"]["session_id"] = "hostile-4"
    rows = parse_document(doc)
    rows.lineage[0]["ordinal"] = 2**40  # an integer column: "integer out of range"
    rows.messages[0]["name"] = SECRET
    catalog = Catalog(AutoContextClient.shared(db_url, auto_upgrade=False).engine)
    with pytest.raises(InvalidExport) as info:
        write_rows(catalog, rows)
    _assert_refused(info.value, "holds a value the database refused (SQLSTATE 22003)")
    assert "out of range" not in str(info.value)
    assert _snapshot(db_url) == before
