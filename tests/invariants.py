"""Checks shared by the ladder, property, crash and concurrency tests.

Each check reads the database directly (plain SQL) and compares it with what the public API says,
so that a bug in one cannot hide a bug in the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from autoctx import AutoContextMemory, Msg
from autoctx.intake import count_tokens
from autoctx.store.rows import msg_from_row
from autoctx.store.tables import messages as messages_table
from autoctx.store.tables import offloads, working_set
from autoctx.tokens import TokenCounter


def assert_valid_openai_chat(openai_messages: Sequence[dict[str, Any]]) -> None:
    """No tool result without its call before it; no call without a result, except a trailing
    pending one."""
    open_calls: set[str] = set()
    for i, m in enumerate(openai_messages):
        if m["role"] == "tool":
            assert m["tool_call_id"] in open_calls, f"orphan tool result at {i}: {m}"
            open_calls.discard(m["tool_call_id"])
            continue
        assert not open_calls, f"calls {open_calls} unanswered before message {i}"
        for call in m.get("tool_calls") or []:
            open_calls.add(call["id"])


def recount(mem: AutoContextMemory) -> int:
    counter = TokenCounter(mem.config.model)
    return sum(count_tokens(m, counter) for m in mem.messages())


def assert_totals_match(mem: AutoContextMemory) -> None:
    """Session totals equal the sum of stored tokens of the working set, and stored tokens equal
    a fresh count."""
    with mem.engine.connect() as conn:
        row = conn.execute(
            sa.text(
                "select count(*), coalesce(sum(m.tokens), 0) from working_set w join messages m "
                "on m.session_id = w.session_id and m.id = w.message_id where w.session_id = :s"
            ),
            {"s": mem.session_id},
        ).one()
    info = mem.refresh()
    assert (info.message_count, info.token_count) == (row[0], row[1])
    assert info.token_count == recount(mem)


def originals(mem: AutoContextMemory) -> list[Msg]:
    with mem.engine.connect() as conn:
        rows = conn.execute(
            sa.select(messages_table)
            .where(
                messages_table.c.session_id == mem.session_id, messages_table.c.kind == "original"
            )
            .order_by(messages_table.c.id)
        )
        return [msg_from_row(r) for r in rows]


def assert_every_original_reachable(mem: AutoContextMemory) -> None:
    """Every original is in the working set or reachable by reload from a working message,
    following offloads down (reload is one level deep)."""
    with mem.engine.connect() as conn:
        working = {
            r[0]
            for r in conn.execute(
                sa.select(working_set.c.message_id).where(
                    working_set.c.session_id == mem.session_id
                )
            )
        }
        uuid_of_summary = {
            r.summary: r.uuid
            for r in conn.execute(
                sa.text(
                    "select e.summary_message_id as summary, o.uuid from offloads o join "
                    "compression_events e on e.session_id = o.session_id and e.id = o.event_id "
                    "where o.session_id = :s"
                ),
                {"s": mem.session_id},
            )
        }
        n_offloads = conn.execute(
            sa.select(sa.func.count())
            .select_from(offloads)
            .where(offloads.c.session_id == mem.session_id)
        ).scalar_one()
    assert len(uuid_of_summary) == n_offloads
    reachable = set(working)
    frontier = [i for i in working if i in uuid_of_summary]
    while frontier:
        summary = frontier.pop()
        for m in mem.reload(str(uuid_of_summary[summary])):
            assert m.id is not None
            reachable.add(m.id)
            if m.id in uuid_of_summary:
                frontier.append(m.id)
    missing = [m.id for m in originals(mem) if m.id not in reachable]
    assert not missing, f"originals not reachable by reload: {missing}"
