"""Checks shared by the ladder, property, crash and concurrency tests.

Each check reads the database directly (plain SQL) and compares it with what the public API says,
so that a bug in one cannot hide a bug in the other.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import sqlalchemy as sa

from autoctx import AutoContextMemory, Msg, to_openai_messages
from autoctx._intake import count_tokens
from autoctx._store.rows import msg_from_row
from autoctx._store.tables import messages as messages_table
from autoctx._store.tables import offloads, working_set
from autoctx._tags import tag_ids
from autoctx._tokens import TokenCounter
from autoctx._transcript import render_transcript
from tests.dbsql import offload_of_summaries, sql

#: The audit views migration 0002 creates (docs/design.md §7).
AUDIT_VIEWS = (
    "autoctx_savings_by_strategy",
    "autoctx_session_cost",
    "autoctx_lineage",
    "autoctx_coverage",
    "autoctx_problem_sessions",
)
#: The view of forks migration 0009 creates (docs/audit.md, "Forks and erasures").
LIFECYCLE_VIEWS = ("autoctx_forks", "autoctx_undos")
#: The view of the fact check migration 0016 creates (docs/audit.md, "What summaries left out").
FACT_VIEWS = ("autoctx_fact_checks",)


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


def assert_every_tag_reloads(
    working: Sequence[Msg],
    reload: Callable[[int], list[Msg]],
    replaced_by: Mapping[int, Sequence[int]],
    original_ids: Sequence[int],
) -> None:
    """Every offload tag the model can read reloads, and following tags alone reaches every
    original (docs/design.md §4): the tags of the working context, then those of what they
    reload, and so on. Each tag names a handle (no uuid: every offload here was made with
    one), and the tag that ends a message reloads exactly what that message replaced
    (`replaced_by`: summary id -> replaced ids, one level); an earlier tag in it (S6's
    verbatim earlier summary) reloads too. `reload` takes a handle."""
    reachable = {m.id for m in working}
    frontier = list(working)
    seen: set[int] = set()
    while frontier:
        msg = frontier.pop()
        assert msg.id is not None
        tags = tag_ids(render_transcript([msg], keep_tags=True))
        if msg.id in replaced_by:
            assert tags, f"message {msg.id} replaced {replaced_by[msg.id]} but shows no tag"
        for k, tag in enumerate(tags):
            assert tag.isdigit(), f"message {msg.id} names an offload by {tag!r}, not a handle"
            handle = int(tag)
            back = reload(handle)
            if k == len(tags) - 1 and msg.id in replaced_by:
                assert [m.id for m in back] == list(replaced_by[msg.id]), (msg.id, handle)
            if handle in seen:
                continue
            seen.add(handle)
            for m in back:
                assert m.id is not None
                reachable.add(m.id)
                frontier.append(m)
    missing = [i for i in original_ids if i not in reachable]
    assert not missing, f"originals no tag leads to: {missing}"


def assert_every_handle_reloads(mem: AutoContextMemory) -> None:
    """`assert_every_tag_reloads` on PostgreSQL, with the lineage read in SQL."""
    replaced_by: dict[int, list[int]] = {}
    for r in sql(
        mem,
        "select summary_id, replaced_id from lineage where session_id = :s "
        "order by summary_id, ordinal",
        s=mem.session_id,
    ):
        replaced_by.setdefault(r.summary_id, []).append(r.replaced_id)
    working = mem.messages()
    assert_every_tag_reloads(
        working,
        lambda h: mem.reload(h),
        replaced_by,
        [m.id for m in originals(mem) if m.id is not None],
    )


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
        n_offloads = conn.execute(
            sa.select(sa.func.count())
            .select_from(offloads)
            .where(offloads.c.session_id == mem.session_id)
        ).scalar_one()
    uuid_of_summary = offload_of_summaries(mem)
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


def assert_consistent(mem: AutoContextMemory) -> None:
    """Structural invariants of a session, read with plain SQL.

    - every offload and lineage row belongs to an applied (committed) event and agrees with it;
    - every applied event is whole: its offload (one per output of a masking pass, which is
      one event), and each offload's message with one lineage row per replaced message in
      order;
    - every message is in exactly one place: in the working set, or replaced by exactly one
      applied event (never both, never twice: two compressions never applied over one message);
    - expanding the working set through lineage gives back every original, once, in id order;
    - the working context is valid OpenAI chat and its totals equal a recount.
    """
    sid = mem.session_id
    events = sql(
        mem,
        "select id, status, replaced_ids, summary_message_id, offload_uuid from compression_events "
        "where session_id = :s order by id",
        s=sid,
    )
    applied = {e.id: e for e in events if e.status == "applied"}
    for e in events:
        if e.status != "applied":
            assert e.summary_message_id is None and e.offload_uuid is None, e
    offloads = sql(
        mem, "select uuid, event_id, message_ids from offloads where session_id = :s", s=sid
    )
    owned: dict[int, list[Any]] = {}
    for o in offloads:
        assert o.event_id in applied, f"offload {o.uuid} belongs to no applied event"
        owned.setdefault(o.event_id, []).append(o)
    assert set(owned) == set(applied), "an applied event without an offload"
    for event_id, its in owned.items():
        owner = applied[event_id]
        # One range, one offload, named by the event; a masking pass (one event) has an offload
        # per output it masked and names none (docs/design.md §7).
        if len(its) > 1:
            assert (owner.summary_message_id, owner.offload_uuid) == (None, None), owner
        else:
            assert owner.offload_uuid == its[0].uuid, (its[0], owner)
        its.sort(key=lambda o: list(owner.replaced_ids).index(o.message_ids[0]))
        assert [i for o in its for i in o.message_ids] == list(owner.replaced_ids), owner
    lineage: dict[int, list[tuple[int, int, int]]] = {}
    for r in sql(
        mem,
        "select summary_id, ordinal, replaced_id, event_id from lineage where session_id = :s",
        s=sid,
    ):
        lineage.setdefault(r.summary_id, []).append((r.ordinal, r.replaced_id, r.event_id))
    summaries = {
        r.id: r
        for r in sql(
            mem,
            "select id, kind, event_id from messages where session_id = :s and kind <> 'original'",
            s=sid,
        )
    }
    # Each offload's message: the one whose first lineage row, of the same event, is the
    # offload's first message.
    first_of = {(r[2], r[1]): sid_ for sid_, rows in lineage.items() for r in rows if r[0] == 0}
    made = set()
    for o in offloads:
        summary_id = first_of.get((o.event_id, o.message_ids[0]))
        assert summary_id is not None and summary_id in summaries, o
        made.add(summary_id)
        owner = applied[o.event_id]
        if owner.summary_message_id is not None:
            assert owner.summary_message_id == summary_id, (o, owner)
        assert summaries[summary_id].event_id == o.event_id, (summaries[summary_id], o)
        rows = sorted(lineage[summary_id])
        assert [r[0] for r in rows] == list(range(len(o.message_ids))), o
        assert [r[1] for r in rows] == list(o.message_ids), o
        assert {r[2] for r in rows} == {o.event_id}, o
    assert set(summaries) == made, (
        "every made message belongs to an offload of an applied event, and every offload made one"
    )
    assert set(lineage) <= set(summaries), "lineage rows without a summary of an applied event"
    replaced = Counter(i for e in applied.values() for i in e.replaced_ids)
    twice = [i for i, n in replaced.items() if n > 1]
    assert not twice, f"messages replaced by more than one applied event: {twice}"
    working = [
        r.message_id
        for r in sql(
            mem, "select message_id from working_set where session_id = :s order by position", s=sid
        )
    ]
    both = set(working) & set(replaced)
    assert not both, f"messages both working and replaced: {sorted(both)}"
    all_ids = [
        r.id for r in sql(mem, "select id from messages where session_id = :s order by id", s=sid)
    ]
    homeless = set(all_ids) - set(working) - set(replaced)
    assert not homeless, f"messages neither working nor replaced: {sorted(homeless)}"

    children = {s: [r[1] for r in sorted(rows)] for s, rows in lineage.items()}

    def expand(i: int) -> Iterator[int]:
        if i in children:
            for c in children[i]:
                yield from expand(c)
        else:
            yield i

    flat = [o for w in working for o in expand(w)]
    original_ids = [i for i in all_ids if i not in summaries]
    assert flat == original_ids, "the working set does not stand for every original once, in order"
    # The stored context's shape, not a read for a model call (which a strict memory over its
    # window refuses, docs/design.md §2).
    assert_valid_openai_chat(to_openai_messages(mem.messages()))
    assert_totals_match(mem)
