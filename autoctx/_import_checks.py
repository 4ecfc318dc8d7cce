"""What an import checks before any row is written: an export document is untrusted input.

`autoctx._exports.parse_document` reads each column with its type; this module checks the rest,
so that a document that could break the session it creates (or another) is refused whole, with
an `InvalidExport` that names the field and never quotes what it holds:

- `check_json`: everything an import reads (not the copies in OpenAI format, for readers),
  without recursion: JSON values only, nesting bounded, no text PostgreSQL cannot store (NUL,
  lone surrogates), no NaN or Infinity, integers within a 64-bit column.
- `check_rows`: the rows fit together as autoctx writes them. The config is the one
  `AutoContextConfig` builds from it (the worker and the search read some of its fields in
  SQL); every message passes the checks of `add()` (`autoctx._intake`), within the session's
  `max_message_chars`, in autoctx's storage form, with its tokens, characters and tool columns
  as `add()` counts them;
  the working context follows the pairing rules of `add()` and leaves open the calls the
  session says are open; the counters are past every id and position in use and the totals
  are those of the working context; every reference names a row of the document; lineage
  runs from a summary to older messages only (so it has no cycle: fork and erasure walk it);
  times are not in the future.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Final, get_args

from ._agent_plan import validate_plan
from ._arguments import unstorable
from ._config import MOVED_FIELDS, AutoContextConfig, RuntimeOptions
from ._errors import ConfigError, InvalidExport, InvalidMessage, InvalidPlan
from ._intake import MAX_JSON_DEPTH, OpenCalls, Prepared, bind, check_stored, count_tokens
from ._messages import Kind, Msg
from ._search import NOT_INDEXED, SEARCH_CONFIGS
from ._store.lifecycle import SessionRows
from ._store.rows import msg_from_mapping, search_config_of
from ._strategies.registry import RUNGS
from ._tokens import TokenCounter, encoding_name_for_model

#: The document's own levels (section, row, column) above a message's metadata or content.
_DOCUMENT_DEPTH: Final = 6
_INT8_MAX: Final = 2**63 - 1
_INT4_MAX: Final = 2**31 - 1
#: The integer columns that are 32-bit (int, smallint) in the database; the others are bigint.
_INT4_COLUMNS: Final = frozenset(
    {"message_count", "tokens", "chars", "messages_before", "messages_after"}
    | {"prompt_tokens", "completion_tokens", "ordinal"}
)
#: The fact check's counts of an event (migration 0016): null, or adding up.
_FACT_COUNTS: Final = (
    "facts_found",
    "facts_kept",
    "facts_repaired",
    "facts_listed",
    "facts_dropped",
)
#: The highest rung number: events' strategies run from 0 (not a compression) to it.
_LAST_STRATEGY: Final = max(RUNGS)
#: How far ahead of this machine's clock a time may be (clock skew between hosts).
_CLOCK_SKEW: Final = timedelta(days=1)
#: Keys a path in an error may show: the document's own, never a key of the caller's data.
_SECTIONS: Final = frozenset(
    {"session", "messages", "events", "offloads", "lineage", "working_messages"}
    | {"working_context"}
)
KINDS: Final[tuple[Kind, ...]] = get_args(Kind)
_RULE_TAIL: Final = re.compile(r"[,;] got .*$", re.DOTALL)
_CONFIG_FIELD: Final = re.compile(r"AutoContextConfig\.(\w+)")
_OPTIONS_FIELD: Final = re.compile(r"RuntimeOptions\.(\w+)")


def refused(where: str, problem: str) -> InvalidExport:
    return InvalidExport(f"export document: {where} {problem}; nothing was imported")


# ---------------------------------------------------------------------------------------------
# The whole document as JSON
# ---------------------------------------------------------------------------------------------


def _path(path: Sequence[str | int]) -> str:
    """Where a value sits, down to the column: deeper keys are the caller's data (metadata
    keys, say), which an error must not quote."""
    shown = ""
    for depth, part in enumerate(path[:3]):
        if isinstance(part, int):
            shown += f"[{part}]"
        elif depth == 0 and part in _SECTIONS:
            shown += part
        elif depth > 0 and part.isidentifier() and len(part) <= 32:
            shown += f".{part}"
        else:
            break
    if len(path) > 3 or not shown:
        shown = f"a value inside {shown or 'the document'}"
    return shown


def _check_text(text: str, path: Sequence[str | int]) -> None:
    if (problem := unstorable(text)) is not None:
        raise refused(_path(path), problem)


def check_json(doc: Mapping[str, Any]) -> None:
    """Raise `InvalidExport` unless what an import reads of `doc` is JSON every reader and
    PostgreSQL's jsonb take (the copies in OpenAI format, for readers, are not read).

    One C-speed `json.dumps` decides the text and numbers, and a walk without recursion (so
    that a hostile depth cannot exhaust the stack) the depth and the integers; only when one of
    them finds a problem does the slow walk run that names where it is.
    """
    roots = _roots(doc)
    try:
        text = json.dumps([v for v, _ in roots], ensure_ascii=False, allow_nan=False)
        suspect = "\\u0000" in text or not _utf8(text) or not _shallow(roots)
    except (ValueError, TypeError, RecursionError):
        suspect = True
    if suspect:
        _locate(roots)


def _roots(doc: Mapping[str, Any]) -> list[tuple[Any, tuple[str | int, ...]]]:
    roots: list[tuple[Any, tuple[str | int, ...]]] = []
    for key, value in doc.items():
        if key == "working_context":
            continue
        if key == "offloads" and isinstance(value, list):
            for k, offload in enumerate(value):
                if isinstance(offload, dict):
                    roots.extend((v, (key, k, c)) for c, v in offload.items() if c != "messages")
                else:
                    roots.append((offload, (key, k)))
        else:
            roots.append((value, (key,)))
    return roots


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _shallow(roots: list[tuple[Any, tuple[str | int, ...]]]) -> bool:
    """Nesting within the bound, integers within 64 bits, keys all strings."""
    limit = MAX_JSON_DEPTH + _DOCUMENT_DEPTH
    stack = [(value, len(path)) for value, path in roots]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            if depth >= limit or not all(isinstance(k, str) for k in value):
                return False
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            if depth >= limit:
                return False
            stack.extend((v, depth + 1) for v in value)
        elif type(value) is int and not -_INT8_MAX - 1 <= value <= _INT8_MAX:
            return False
    return True


def _locate(roots: list[tuple[Any, tuple[str | int, ...]]]) -> None:
    """Raise the `InvalidExport` that names the first value that is not JSON PostgreSQL
    stores (nothing, on a false alarm of `check_json`'s fast checks)."""
    limit = MAX_JSON_DEPTH + _DOCUMENT_DEPTH
    stack = list(reversed(roots))
    while stack:
        value, path = stack.pop()
        if len(path) > limit:
            raise refused(_path(path), f"is nested deeper than {MAX_JSON_DEPTH} levels; flatten it")
        if isinstance(value, str):
            _check_text(value, path)
        elif value is None or isinstance(value, bool):
            continue
        elif isinstance(value, int):
            if not -_INT8_MAX - 1 <= value <= _INT8_MAX:
                raise refused(_path(path), "is an integer beyond 64 bits")
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise refused(
                    _path(path),
                    "holds a NaN or Infinity number, which JSON cannot represent; write it "
                    "as null or as a string",
                )
        elif isinstance(value, dict):
            for key, item in reversed(value.items()):
                if not isinstance(key, str):
                    raise refused(_path(path), "has a key that is not a string")
                _check_text(key, (*path, key))
                stack.append((item, (*path, key)))
        elif isinstance(value, list):
            stack.extend((item, (*path, k)) for k, item in reversed(list(enumerate(value))))
        else:
            raise refused(_path(path), f"holds a {type(value).__name__}, which is not JSON")


# ---------------------------------------------------------------------------------------------
# The rows
# ---------------------------------------------------------------------------------------------


def check_rows(rows: SessionRows, *, now: datetime) -> None:
    """Raise `InvalidExport` for rows that would not make a sound session (module docstring)."""
    session = rows.session
    config = _config(session)
    _check_integers(rows)
    _check_times(rows, now)
    if session["plan"] is not None:
        try:
            validate_plan(session["plan"])
        except InvalidPlan as exc:
            raise refused("session.plan", f"is not a plan set_plan() accepts ({exc})") from None
    model = session["model"]
    if not model.strip() or session["encoding"] != encoding_name_for_model(model):
        raise refused(
            "session.encoding",
            "is not the token encoding of session.model (autoctx fixes it from the model "
            "when the session is created); export the session again",
        )
    counter = TokenCounter(model)
    event_ids = {e["id"] for e in rows.events}
    by_id = {
        m["id"]: _message(k, m, config, counter, event_ids) for k, m in enumerate(rows.messages)
    }
    _check_search_configs(rows)
    _check_working(rows, by_id)
    _check_counters(rows)
    _check_events(rows, by_id, event_ids)
    _check_lineage(rows, event_ids)


def _check_moved(data: Mapping[str, Any]) -> None:
    """An export made before the runtime options left the config (docs/design.md §8) records
    them in it: still restorable, each value valid as it was then (none is read again)."""
    moved = {k: v for k, v in data.items() if k in MOVED_FIELDS and k != "auto_upgrade"}
    try:
        RuntimeOptions(**moved)
    except ConfigError as exc:
        field = _OPTIONS_FIELD.search(str(exc))
        where = f"session.config.{field.group(1)}" if field else "session.config"
        raise refused(where, "is not a valid value of that (former) field") from None
    if not isinstance(data.get("auto_upgrade", True), bool):
        raise refused("session.config.auto_upgrade", "is not true or false")


def _config(session: Mapping[str, Any]) -> AutoContextConfig:
    """The session's config as `AutoContextConfig` builds it; every value the document
    records must be the one in force (the worker reads some of them in SQL)."""
    data = session["config"]
    try:
        config = AutoContextConfig.from_json(data)
    except ConfigError as exc:
        field = _CONFIG_FIELD.search(str(exc))
        where = f"session.config.{field.group(1)}" if field else "session.config"
        rule = _RULE_TAIL.sub("", str(exc))
        raise refused(where, f"is refused by AutoContextConfig ({rule})") from None
    except (TypeError, ValueError, AttributeError):
        raise refused(
            "session.config",
            "is not an AutoContextConfig's JSON (a field of the wrong type); export the "
            "session again",
        ) from None
    in_force = config.to_json()
    _check_moved(data)
    for key, value in data.items():
        if key in MOVED_FIELDS:
            continue
        if key not in in_force or type(value) is not type(in_force[key]) or value != in_force[key]:
            where = f"session.config.{key}" if key.isidentifier() else "session.config"
            raise refused(
                where,
                "is not a field of AutoContextConfig or not the value in force (a derived "
                "value altered); export the session again",
            )
    if config.model != session["model"]:
        raise refused("session.config.model", "is not session.model; export the session again")
    return config


def _check_integers(rows: SessionRows) -> None:
    """Every integer column within its database type, and none negative (counts, ids and
    positions all start at 0 or 1)."""
    tables: list[tuple[str, Sequence[Mapping[str, Any]]]] = [
        ("session", [rows.session]),
        ("messages", rows.messages),
        ("working_messages", rows.working_set),
        ("events", rows.events),
        ("offloads", rows.offloads),
        ("lineage", rows.lineage),
    ]
    for table, items in tables:
        for k, row in enumerate(items):
            for key, value in row.items():
                values = value if isinstance(value, list) else [value]
                for v in values:
                    if not isinstance(v, int) or isinstance(v, bool):
                        continue
                    top = _INT4_MAX if key in _INT4_COLUMNS else _INT8_MAX
                    if not 0 <= v <= top:
                        where = table if table == "session" else f"{table}[{k}]"
                        raise refused(f"{where}.{key}", f"must be an integer from 0 to {top}")


def _check_times(rows: SessionRows, now: datetime) -> None:
    latest = now + _CLOCK_SKEW
    tables: list[tuple[str, Sequence[Mapping[str, Any]]]] = [
        ("session", [rows.session]),
        ("messages", rows.messages),
        ("events", rows.events),
        ("offloads", rows.offloads),
    ]
    for table, items in tables:
        for k, row in enumerate(items):
            where = table if table == "session" else f"{table}[{k}]"
            for key in ("created_at", "updated_at"):
                if key not in row:
                    continue
                t: datetime = row[key]
                if t.tzinfo is None:
                    raise refused(f"{where}.{key}", "has no time zone; write it in UTC")
                if t > latest:
                    raise refused(
                        f"{where}.{key}",
                        "is in the future (retention would never delete the session); "
                        "export the session again",
                    )
    if rows.session["created_at"] > rows.session["updated_at"]:
        raise refused("session.updated_at", "is before session.created_at")


def _message(
    k: int,
    row: Mapping[str, Any],
    config: AutoContextConfig,
    counter: TokenCounter,
    event_ids: set[int],
) -> Msg:
    """The stored message of `messages[k]`, checked as `add()` checks what it stores."""
    where = f"messages[{k}]"
    if row["id"] < 1:
        raise refused(f"{where}.id", "must be positive")
    if row["kind"] not in KINDS:
        raise refused(f"{where}.kind", f"must be one of {', '.join(KINDS)}")
    msg = msg_from_mapping(row)
    try:
        check_stored(msg, where)
    except InvalidMessage as exc:
        raise refused(where, f"is not a message add() would store ({exc})") from None
    if row["content"] != msg.content_json():
        # Keys autoctx does not read would be stored unchecked, and read by nothing.
        raise refused(f"{where}.content", "is not in autoctx's storage form; export it again")
    chars = msg.payload_chars
    if chars > config.max_message_chars:
        raise refused(
            where,
            f"carries {chars} characters, over the session's max_message_chars "
            f"({config.max_message_chars}); raise it in session.config or leave the message out",
        )
    if row["chars"] != chars:
        raise refused(f"{where}.chars", "is not the message's payload size; export it again")
    if row["tokens"] != count_tokens(msg, counter):
        raise refused(
            f"{where}.tokens",
            "is not the message's token count with the session's encoding (the window is "
            "judged by these counts); export the session again",
        )
    calls, results = msg.tool_uses, msg.tool_results
    derived = {
        "call_ids": [c.id for c in calls],
        "result_ids": [r.tool_use_id for r in results],
        "tool_names": [c.name for c in calls] + [r.name for r in results],
    }
    for key, value in derived.items():
        if row[key] != value:
            raise refused(f"{where}.{key}", "does not match the message's tool blocks")
    indexed = row["search_config"]
    if indexed != NOT_INDEXED and indexed not in SEARCH_CONFIGS:
        raise refused(
            f"{where}.search_config",
            f"is not a text search configuration autoctx indexes with ({', '.join(SEARCH_CONFIGS)}"
            f" or {NOT_INDEXED!r})",
        )
    for key in ("event_id", "erased_by"):
        if row[key] is not None and row[key] not in event_ids:
            raise refused(f"{where}.{key}", "names no event of the document")
    return msg


def _check_working(rows: SessionRows, by_id: Mapping[int, Msg]) -> None:
    """The working context follows the pairing rules of `add()` and leaves open exactly the
    calls `session.open_calls` records (the next `add()` binds results to them)."""
    seen: set[int] = set()
    open_calls = OpenCalls()
    order = sorted(range(len(rows.working_set)), key=lambda k: rows.working_set[k]["position"])
    previous = None
    for k in order:
        w = rows.working_set[k]
        if w["position"] < 1 or w["position"] == previous:
            raise refused(f"working_messages[{k}].position", "must be positive and unique")
        previous = w["position"]
        if w["message_id"] in seen:
            raise refused(f"working_messages[{k}].id", "names a message already in the context")
        seen.add(w["message_id"])
        msg = by_id[w["message_id"]]
        prepared = Prepared(msg, msg.tokens or 0, 0, False)
        try:
            bind([prepared], open_calls, session_id=rows.session["session_id"])
        except InvalidMessage:
            raise refused(
                f"working_messages[{k}]",
                "breaks the pairing add() enforces (a tool result follows the call it answers; "
                "nothing else while calls are open; call ids unique among open calls)",
            ) from None
    recorded = rows.session["open_calls"]
    if recorded != open_calls.to_json():
        raise refused(
            "session.open_calls",
            "are not the calls the working context leaves unanswered; export the session again",
        )


def _check_counters(rows: SessionRows) -> None:
    """Each counter is past what is in use (the next add or compression takes it as a key),
    and the totals are those of the working context (compression is triggered by them)."""
    session = rows.session
    in_use = {
        "next_message_id": [m["id"] for m in rows.messages],
        "next_position": [w["position"] for w in rows.working_set],
        "next_event_id": [e["id"] for e in rows.events],
        "next_handle": [o["handle"] for o in rows.offloads],
    }
    for key, used in in_use.items():
        if session[key] < 1 or session[key] <= max(used, default=0):
            raise refused(
                f"session.{key}",
                "is not past every value in use (the next write would take one of them); "
                "export the session again",
            )
    tokens = {m["id"]: m["tokens"] for m in rows.messages}
    if session["message_count"] != len(rows.working_set):
        raise refused("session.message_count", "is not the size of the working context")
    if session["token_count"] != sum(tokens[w["message_id"]] for w in rows.working_set):
        raise refused(
            "session.token_count",
            "is not the sum of the working messages' tokens (compression is triggered by it)",
        )
    settled = session["settled_version"]
    if settled is not None and settled > session["version"]:
        raise refused("session.settled_version", "is past session.version")
    if any(e["session_version"] > session["version"] for e in rows.events):
        raise refused("session.version", "is behind an event's session_version")


def _check_events(rows: SessionRows, by_id: Mapping[int, Msg], event_ids: set[int]) -> None:
    if len(event_ids) != len(rows.events):
        raise refused("events", "hold the same id twice")
    for k, e in enumerate(rows.events):
        if e["id"] < 1:
            raise refused(f"events[{k}].id", "must be positive")
        if not 0 <= e["strategy"] <= _LAST_STRATEGY:
            raise refused(f"events[{k}].strategy", f"must be from 0 to {_LAST_STRATEGY}")
        if e["summary_message_id"] is not None and e["summary_message_id"] not in by_id:
            raise refused(f"events[{k}].summary_message_id", "names no message of the document")
        if not all(i in by_id for i in e["replaced_ids"]):
            raise refused(f"events[{k}].replaced_ids", "name a message the document does not hold")
        undoes = e.get("undoes")
        if undoes is not None and (undoes not in event_ids or undoes >= e["id"]):
            raise refused(f"events[{k}].undoes", "names no earlier event of the document")
        counts = [e.get(c) for c in _FACT_COUNTS]
        if counts[0] is not None and (
            any(c is None or c < 0 for c in counts)
            or counts[0] != sum(c for c in counts[1:] if c is not None)
        ):
            raise refused(
                f"events[{k}].facts_found",
                "must be null, or the sum of facts_kept, facts_repaired, facts_listed and "
                "facts_dropped (none negative)",
            )
    uuids = [o["uuid"] for o in rows.offloads]
    if len(set(uuids)) != len(uuids):
        raise refused("offloads", "hold the same uuid twice")
    handles = [o["handle"] for o in rows.offloads]
    if len(set(handles)) != len(handles):
        raise refused("offloads", "hold the same handle twice")
    for k, o in enumerate(rows.offloads):
        if o["handle"] < 1:
            raise refused(f"offloads[{k}].handle", "must be positive")
    for k, o in enumerate(rows.offloads):
        if o["event_id"] not in event_ids:
            raise refused(f"offloads[{k}].event_id", "names no event of the document")


def _check_lineage(rows: SessionRows, event_ids: set[int]) -> None:
    """A summary is always newer than what it replaced (compression, `pop_last` and fork all
    keep that, and erasure rewrites bottom-up by it): so lineage has no cycle, and every walk
    of it (fork, erasure, `autoctx lineage`) ends."""
    keys: set[tuple[int, int]] = set()
    for k, r in enumerate(rows.lineage):
        if r["replaced_id"] >= r["summary_id"]:
            raise refused(
                f"lineage[{k}]",
                "has a summary that is not newer than a message it replaced (lineage must run "
                "from newer to older messages, or walking it never ends)",
            )
        key = (r["summary_id"], r["ordinal"])
        if key in keys:
            raise refused(f"lineage[{k}]", "repeats a summary_id and ordinal")
        keys.add(key)
        if r["event_id"] is not None and r["event_id"] not in event_ids:
            raise refused(f"lineage[{k}].event_id", "names no event of the document")


def _check_search_configs(rows: SessionRows) -> None:
    """Originals are indexed with the session's search configuration (searches use it)."""
    expected = search_config_of(rows.session["config"])
    for k, m in enumerate(rows.messages):
        if m["kind"] == "original" and m["search_config"] != expected:
            raise refused(
                f"messages[{k}].search_config", "is not the session's search configuration"
            )
