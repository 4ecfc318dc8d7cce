"""Conversions between the store's rows and autoctx's objects (`SessionInfo`, `Msg`, `Event`).

The SQL texts are in `sql.py`, the units of work in `store.py`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy.engine import Row

from .._events import Event, FactCheck
from .._intake import Prepared
from .._messages import Msg, block_from_json

# Re-exported: the type lives outside the SQL shell, older imports of it keep working.
from .._sessions import SessionInfo as SessionInfo


def msg_from_columns(
    id_: int,
    role: Any,
    name: str | None,
    content: Any,
    metadata: Any,
    kind: Any,
    pinned: bool,
    tokens: int,
) -> Msg:
    """A `Msg` from the message columns, in the order `LOAD_WORKING` and `MESSAGES_BY_ID`
    select them (a NULL metadata, as `LOAD_WORKING` writes an empty one, is empty)."""
    return Msg(
        role=role,
        content=tuple(block_from_json(b) for b in content),
        name=name,
        metadata=metadata or {},
        kind=kind,
        pinned=pinned,
        id=id_,
        tokens=tokens,
    )


def documents(rows: Sequence[Sequence[Any]]) -> list[tuple[int, str, str, Any, Any]]:
    """(id, role, kind, content, metadata) from rows of `DOCUMENTS_BY_ID`, whose content and
    metadata (NULL: empty) are JSON text: parsed in one `json.loads` of them all, two to three
    times faster than a parse per value (psycopg's for a jsonb column), which on a read of a
    whole history costs more in calls than in parsing."""
    texts = ",".join(t if t is not None else "null" for r in rows for t in (r[3], r[4]))
    parsed = json.loads(f"[{texts}]")
    return [(r[0], r[1], r[2], parsed[2 * k], parsed[2 * k + 1]) for k, r in enumerate(rows)]


def msg_from_mapping(row: Mapping[str, Any]) -> Msg:
    """A `Msg` from the message columns as a mapping (an export document's row)."""
    return msg_from_columns(
        row["id"],
        row["role"],
        row["name"],
        row["content"],
        row["metadata"],
        row["kind"],
        row["pinned"],
        row["tokens"],
    )


def msg_from_row(row: Any) -> Msg:
    """A `Msg` from a row holding the message columns by name."""
    return msg_from_columns(
        row.id, row.role, row.name, row.content, row.metadata, row.kind, row.pinned, row.tokens
    )


def array_literal(items: Sequence[str]) -> str:
    """A PostgreSQL text[] literal: per-row arrays travel as one text each through `unnest`
    (a ragged list of lists is not a PostgreSQL array)."""
    quoted = (s.replace("\\", "\\\\").replace('"', '\\"') for s in items)
    return "{" + ",".join(f'"{q}"' for q in quoted) + "}"


def stored(m: Msg, msg_id: int, tokens: int) -> Msg:
    """`m` with its id and tokens (direct construction: `dataclasses.replace` costs more than
    the rest of the row on the append path)."""
    return Msg(m.role, m.content, m.name, m.metadata, m.kind, m.pinned, msg_id, tokens)


def event_from_row(row: Row[Any]) -> Event:
    return event_of(row._mapping)


def event_of(values: Mapping[Any, Any]) -> Event:
    """An `Event` from the columns of a `compression_events` row: one read back, or one
    `event_row` built (then the database fills its time, and it is not inherited)."""
    return Event(
        session_id=values["session_id"],
        id=values["id"],
        strategy=values["strategy"],
        status=values["status"],
        reason=values["reason"],
        messages_before=values["messages_before"],
        messages_after=values["messages_after"],
        tokens_before=values["tokens_before"],
        tokens_after=values["tokens_after"],
        replaced_ids=tuple(values["replaced_ids"]),
        summary_message_id=values["summary_message_id"],
        offload_uuid=values["offload_uuid"],
        model=values["model"],
        prompt_tokens=values["prompt_tokens"],
        completion_tokens=values["completion_tokens"],
        latency_ms=values["latency_ms"],
        error=values["error"],
        session_version=values["session_version"],
        created_at=values.get("created_at"),
        note=values.get("note"),
        inherited=bool(values.get("inherited", False)),
        undoes=values.get("undoes"),
        facts=facts_of_row(values),
    )


#: The fact check's columns of `compression_events` (migration 0016), as `FactCheck` names them.
FACT_COLUMNS = ("facts_found", "facts_kept", "facts_repaired", "facts_listed", "facts_dropped")


def facts_of_row(values: Mapping[Any, Any]) -> FactCheck | None:
    """The fact check an event row records, or None (no summary was checked)."""
    if values.get("facts_found") is None:
        return None
    return FactCheck(
        found=values["facts_found"],
        kept=values["facts_kept"],
        repaired=values["facts_repaired"],
        listed=values["facts_listed"],
        dropped=values["facts_dropped"],
        dropped_facts=tuple(values.get("dropped_facts") or ()),
        repair_calls=values.get("facts_repair_calls") or 0,
    )


def fact_columns(facts: FactCheck | None) -> dict[str, Any]:
    """The columns of `facts` (all NULL, and no dropped facts, for an event without a check)."""
    if facts is None:
        return {name: None for name in FACT_COLUMNS} | {
            "dropped_facts": [],
            "facts_repair_calls": 0,
        }
    return {
        "facts_found": facts.found,
        "facts_kept": facts.kept,
        "facts_repaired": facts.repaired,
        "facts_listed": facts.listed,
        "facts_dropped": facts.dropped,
        "dropped_facts": list(facts.dropped_facts),
        "facts_repair_calls": facts.repair_calls,
    }


def event_row(
    session_id: str,
    event_id: int,
    *,
    strategy: int,
    status: str,
    reason: str,
    messages: tuple[int, int],
    tokens: tuple[int, int],
    session_version: int,
    config: Mapping[str, Any],
    replaced_ids: Sequence[int] = (),
    replaced_tokens: int = 0,
    summary_message_id: int | None = None,
    offload_uuid: uuid.UUID | None = None,
    model: str | None = None,
    prompt_tokens: int | None = None,
    completion_tokens: int | None = None,
    latency_ms: float | None = None,
    error: str | None = None,
    note: str | None = None,
    undoes: int | None = None,
    facts: FactCheck | None = None,
) -> dict[str, Any]:
    """The `compression_events` row of one event: every writer of events (an apply, a recorded
    attempt, a pop, a clear, a fork, an erasure) builds it here, so that the columns an audit
    reads (docs/design.md §7) are filled the same way. `messages` and `tokens` are the working
    totals (before, after)."""
    return {
        "session_id": session_id,
        "id": event_id,
        "strategy": strategy,
        "status": status,
        "reason": reason,
        "messages_before": messages[0],
        "messages_after": messages[1],
        "tokens_before": tokens[0],
        "tokens_after": tokens[1],
        "replaced_ids": list(replaced_ids),
        "replaced_tokens": replaced_tokens,
        "summary_message_id": summary_message_id,
        "offload_uuid": offload_uuid,
        "model": model,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "latency_ms": latency_ms,
        "error": error,
        "session_version": session_version,
        "config": dict(config),
        "note": note,
        "undoes": undoes,
        **fact_columns(facts),
    }


def message_fields(p: Prepared) -> dict[str, Any]:
    """The columns of a `messages` row that describe the prepared message, apart from its
    content and metadata (the append sends those as the JSON they already are: `_append_rows`)."""
    m = p.msg
    calls = m.tool_uses
    results = m.tool_results
    return {
        "role": m.role,
        "name": m.name,
        "kind": m.kind,
        "pinned": m.pinned,
        "final": p.final,
        "tokens": p.tokens,
        "chars": p.chars,
        "call_ids": [c.id for c in calls],
        "result_ids": [r.tool_use_id for r in results],
        "tool_names": [c.name for c in calls] + [r.name for r in results],
    }


def message_row(session_id: str, msg_id: int, p: Prepared, event_id: int | None) -> dict[str, Any]:
    return {
        "session_id": session_id,
        "id": msg_id,
        "content": p.msg.content_json(),
        "metadata": dict(p.msg.metadata),
        **message_fields(p),
        "event_id": event_id,
    }


def search_config_of(config: Mapping[str, Any]) -> str:
    """The `messages.search_config` of a session's config: the text search configuration its
    originals are indexed with, 'none' for a session created with `search_config=None`, and
    'simple' for one recorded before migration 0008 (its messages were indexed with it)."""
    if "search_config" not in config:
        return "simple"
    value = config["search_config"]
    return value if isinstance(value, str) else "none"


def session_info(row: Row[Any]) -> SessionInfo:
    return SessionInfo(
        session_id=row.session_id,
        tenant=row.tenant,
        version=row.version,
        message_count=row.message_count,
        token_count=row.token_count,
        model=row.model,
        encoding=row.encoding,
        config=row.config,
        plan=row.plan,
        settled_version=row.settled_version,
        created_at=row.created_at,
        updated_at=row.updated_at,
        incarnation=row.incarnation,
    )
