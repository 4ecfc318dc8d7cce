"""The export document (`autoctx export`, `export_session`) and its reading back for
`autoctx import` (`import_session`). Pure: rows in, JSON out, and back; the SQL is
`autoctx._store.lifecycle.read_rows` and `write_rows`.

Format ``autoctx-export/2`` (docs/operations.md documents every key):

- ``session``: the session row, every column but the incarnation (an identity of one database's
  row: an imported session is a new incarnation);
- ``working_context``: the working context in OpenAI format (a view for readers: it leaves out
  what Chat Completions cannot carry, such as reasoning), and ``working_messages``: each
  working message's position, id, role, kind, pinned flag, tokens, offload uuid and handle;
- ``events``: every event, every column; ``offloads``: each with the messages it holds (in
  OpenAI format, for readers);
- ``messages``: every stored message in autoctx's storage form (content blocks, metadata, kind,
  counts, the event that made it, the erasure that rewrote it, time), and ``lineage``: every row.
  These are what import reads: every block, reasoning included, whatever format it came in.

Times are ISO 8601 in UTC, uuids are strings. Version 1 had no ``messages`` and ``lineage``
(so it could not restore a session): import refuses it. A version 2 document written before
offload handles (no ``session.next_handle``, no offload ``handle``) imports with the handles
the migration gives stored offloads. Export, import and export again give the same document.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final

from ._errors import InvalidExport
from ._import_checks import check_json, check_rows, refused
from ._messages import block_from_json, openai_view
from ._store.lifecycle import (
    EVENT_COLUMNS,
    LINEAGE_COLUMNS,
    MESSAGE_COLUMNS,
    OFFLOAD_COLUMNS,
    SESSION_COLUMNS,
    SessionRows,
)
from ._store.rows import msg_from_mapping

FORMAT: Final = "autoctx-export/2"
_FORMAT_PREFIX: Final = "autoctx-export/"

#: Columns holding times and uuids, which JSON carries as strings.
_TIMES: Final = frozenset({"created_at", "updated_at"})
_UUIDS: Final = frozenset({"offload_uuid", "uuid", "forked_from_incarnation"})


def _json_value(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, tuple):
        return list(value)
    return value


def _json_row(row: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _json_value(v) for k, v in row.items()}


def build_document(rows: SessionRows) -> dict[str, Any]:
    """The export document of a session's rows (JSON values only)."""
    by_id = {m["id"]: m for m in rows.messages}
    # The message that stands for an offload: the one its first message's lineage row, of the
    # same event, names (an event of a masking pass made an offload per output).
    summary_of = {(r["event_id"], r["replaced_id"]): r["summary_id"] for r in rows.lineage}
    offload_of = {
        summary_of[key]: o["uuid"]
        for o in rows.offloads
        if o["message_ids"] and (key := (o["event_id"], o["message_ids"][0])) in summary_of
    }
    strategy_of = {e["id"]: e["strategy"] for e in rows.events}
    handle_of = {o["uuid"]: o["handle"] for o in rows.offloads}
    working = [msg_from_mapping(by_id[w["message_id"]]) for w in rows.working_set]
    return {
        "format": FORMAT,
        "session": _json_row(rows.session),
        "working_context": openai_view(working)[0],
        "working_messages": [
            {
                "index": k,
                "position": w["position"],
                "id": m.id,
                "role": m.role,
                "kind": m.kind,
                "pinned": m.pinned,
                "tokens": m.tokens,
                "offload_uuid": _json_value(offload_of.get(m.id)),
                "offload_handle": handle_of.get(offload_of.get(m.id)),
            }
            for k, (w, m) in enumerate(zip(rows.working_set, working, strict=True))
        ],
        "events": [_json_row(e) for e in rows.events],
        "offloads": [
            {
                **_json_row(o),
                "strategy": strategy_of.get(o["event_id"]),
                "messages": [
                    {
                        "id": i,
                        "kind": by_id[i]["kind"],
                        "message": openai_view([msg_from_mapping(by_id[i])])[0][0],
                    }
                    for i in o["message_ids"]
                ],
            }
            for o in rows.offloads
        ],
        "messages": [_json_row(m) for m in rows.messages],
        "lineage": [_json_row(r) for r in rows.lineage],
    }


# ---------------------------------------------------------------------------------------------
# Reading a document back
# ---------------------------------------------------------------------------------------------


def _fail(where: str, problem: str) -> InvalidExport:
    return refused(where, problem)


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _ints(v: Any) -> bool:
    return isinstance(v, list) and all(_int(x) for x in v)


def _strs(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def _blocks(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(b, dict) for b in v)


def _num(v: Any) -> bool:
    return _int(v) or isinstance(v, float)


Check = Callable[[Any], bool]
_TYPES: Final[dict[str, tuple[Check, str, bool]]] = {
    # column: (check, what it must be, may be null)
    "session_id": (lambda v: isinstance(v, str) and 0 < len(v) <= 255, "a session id", False),
    "tenant": (lambda v: isinstance(v, str) and bool(v.strip()), "a tenant name", True),
    "model": (lambda v: isinstance(v, str), "a string", False),
    "encoding": (lambda v: isinstance(v, str), "a string", False),
    "config": (lambda v: isinstance(v, dict), "an object", False),
    "plan": (lambda v: isinstance(v, dict), "an object", True),
    "open_calls": (lambda v: isinstance(v, dict), "an object", False),
    "forked_from": (lambda v: isinstance(v, str), "a session id", True),
    "forked_at_message": (_int, "an integer", True),
    "settled_version": (_int, "an integer", True),
    "role": (lambda v: v in ("system", "user", "assistant", "tool"), "a role", False),
    "name": (lambda v: isinstance(v, str), "a string", True),
    "content": (_blocks, "a list of blocks", False),
    "metadata": (lambda v: isinstance(v, dict), "an object", False),
    "kind": (lambda v: isinstance(v, str), "a kind", False),
    "pinned": (lambda v: isinstance(v, bool), "true or false", False),
    "final": (lambda v: isinstance(v, bool), "true or false", False),
    "inherited": (lambda v: isinstance(v, bool), "true or false", False),
    "call_ids": (_strs, "a list of strings", False),
    "result_ids": (_strs, "a list of strings", False),
    "tool_names": (_strs, "a list of strings", False),
    "replaced_ids": (_ints, "a list of integers", False),
    "message_ids": (_ints, "a list of integers", False),
    "event_id": (_int, "an integer", True),
    "erased_by": (_int, "an integer", True),
    "search_config": (lambda v: isinstance(v, str), "a text search configuration", False),
    "summary_message_id": (_int, "an integer", True),
    "strategy": (_int, "an integer", False),
    "status": (lambda v: isinstance(v, str), "a status", False),
    "reason": (lambda v: isinstance(v, str), "a reason", False),
    "prompt_tokens": (_int, "an integer", True),
    "completion_tokens": (_int, "an integer", True),
    "latency_ms": (_num, "a number", True),
    "error": (lambda v: isinstance(v, str), "a string", True),
    "note": (lambda v: isinstance(v, str), "a string", True),
    "undoes": (_int, "an integer", True),
    **{
        name: (_int, "an integer", True)
        for name in ("facts_found", "facts_kept", "facts_repaired", "facts_listed", "facts_dropped")
    },
    "dropped_facts": (_strs, "a list of strings", False),
    "facts_repair_calls": (_int, "an integer", False),
}

#: Event columns a document written before they existed lacks, with what such an event holds
#: (the fact check, migration 0016: no check recorded).
_LATER_EVENT_COLUMNS: Final[dict[str, Any]] = {
    "facts_found": None,
    "facts_kept": None,
    "facts_repaired": None,
    "facts_listed": None,
    "facts_dropped": None,
    "dropped_facts": [],
    "facts_repair_calls": 0,
    # What an undo took back (migration 0017).
    "undoes": None,
}


def _column(where: str, key: str, value: Any, *, event: bool = False) -> Any:
    if key in _TIMES:
        if not isinstance(value, str):
            raise _fail(f"{where}.{key}", "must be an ISO 8601 time")
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            raise _fail(f"{where}.{key}", "is not an ISO 8601 time") from None
    if key in _UUIDS:
        if value is None and (key != "uuid"):
            return None
        try:
            return uuid.UUID(str(value))
        except ValueError:
            raise _fail(f"{where}.{key}", "is not a uuid") from None
    if event and key == "model":
        if value is None or isinstance(value, str):
            return value
        raise _fail(f"{where}.{key}", "must be a string or null")
    check, what, nullable = _TYPES.get(key, (_int, "an integer", False))
    if value is None and nullable:
        return None
    if not check(value):
        raise _fail(f"{where}.{key}", f"must be {what}{' or null' if nullable else ''}")
    return value


def _row(where: str, data: Any, columns: Sequence[str], *, event: bool = False) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise _fail(where, "must be an object")
    if event:
        data = {**_LATER_EVENT_COLUMNS, **data}
    missing = [c for c in columns if c not in data]
    if missing:
        raise _fail(where, f"lacks {', '.join(missing)}")
    return {c: _column(where, c, data[c], event=event) for c in columns}


def _rows(doc: Mapping[str, Any], key: str, columns: Sequence[str]) -> list[dict[str, Any]]:
    items = doc.get(key)
    if not isinstance(items, list):
        raise _fail(key, "must be a list")
    return [
        _row(f"{key}[{k}]", item, columns, event=key == "events") for k, item in enumerate(items)
    ]


def parse_document(doc: Any, *, now: datetime | None = None) -> SessionRows:
    """The rows of an export document, checked as untrusted input (`autoctx._import_checks`:
    every value, and that the rows make a sound session) before any SQL; `InvalidExport` names
    the first problem, never the content. `now` bounds the times (default: this clock)."""
    if not isinstance(doc, dict):
        raise _fail("the document", "must be a JSON object")
    fmt = doc.get("format")
    if fmt != FORMAT:
        if isinstance(fmt, str) and fmt.startswith(_FORMAT_PREFIX):
            raise _fail(
                "format",
                f"is {fmt!r}; this version imports {FORMAT!r} only (version 1 lacked the "
                "messages and lineage a restore needs): export the session again",
            )
        raise _fail("format", f"is not {FORMAT!r}: this is not an autoctx export")
    check_json(doc)
    doc = _with_handles(doc)
    session = _row("session", doc.get("session"), SESSION_COLUMNS)
    msgs = _rows(doc, "messages", MESSAGE_COLUMNS)
    for k, m in enumerate(msgs):
        try:
            tuple(block_from_json(b) for b in m["content"])
        except (KeyError, TypeError, AttributeError):
            raise _fail(f"messages[{k}].content", "holds a block autoctx cannot read") from None
    working = doc.get("working_messages")
    if not isinstance(working, list):
        raise _fail("working_messages", "must be a list")
    working_set = [
        {
            "position": _column(f"working_messages[{k}]", "position", _get(w, "position", k)),
            "message_id": _column(f"working_messages[{k}]", "id", _get(w, "id", k)),
        }
        for k, w in enumerate(working)
    ]
    rows = SessionRows(
        session=session,
        messages=msgs,
        working_set=working_set,
        events=_rows(doc, "events", EVENT_COLUMNS),
        offloads=_rows(doc, "offloads", OFFLOAD_COLUMNS),
        lineage=_rows(doc, "lineage", LINEAGE_COLUMNS),
    )
    _check_references(rows)
    check_rows(rows, now=now or datetime.now(UTC))
    return rows


def _with_handles(doc: Mapping[str, Any]) -> Mapping[str, Any]:
    """A document exported before offload handles (no `session.next_handle`, no offload
    `handle`), with the handles migration 0015 gives a stored session's offloads: 1, 2, ... by
    event, then uuid. Any other document as it is (a partial one is refused by the checks)."""
    session, offloads = doc.get("session"), doc.get("offloads")
    if not isinstance(session, dict) or "next_handle" in session or not isinstance(offloads, list):
        return doc
    if not all(isinstance(o, dict) and "handle" not in o for o in offloads):
        return doc

    def key(o: Mapping[str, Any]) -> tuple[int, str]:
        event = o.get("event_id")
        return (event if isinstance(event, int) else 0, str(o.get("uuid")))

    numbered = {id(o): k for k, o in enumerate(sorted(offloads, key=key), start=1)}
    return {
        **doc,
        "session": {**session, "next_handle": len(offloads) + 1},
        "offloads": [{**o, "handle": numbered[id(o)]} for o in offloads],
    }


def _get(item: Any, key: str, k: int) -> Any:
    if not isinstance(item, dict) or key not in item:
        raise _fail(f"working_messages[{k}]", f"lacks {key}")
    return item[key]


def _check_references(rows: SessionRows) -> None:
    """What the database's keys would refuse, said with the field that is wrong."""
    ids = [m["id"] for m in rows.messages]
    if len(set(ids)) != len(ids):
        raise _fail("messages", "hold the same id twice")
    known = set(ids)
    for k, w in enumerate(rows.working_set):
        if w["message_id"] not in known:
            raise _fail(f"working_messages[{k}].id", "names no message of the document")
    for k, r in enumerate(rows.lineage):
        if r["summary_id"] not in known or r["replaced_id"] not in known:
            raise _fail(f"lineage[{k}]", "names a message the document does not hold")
    for k, o in enumerate(rows.offloads):
        if not set(o["message_ids"]) <= known:
            raise _fail(f"offloads[{k}].message_ids", "name a message the document does not hold")
