"""What an edit means (docs/design.md §2, §3): `Snapshot.apply` and `splice`, pure.

The SQL store brings its cached snapshot up to date with them after its own apply, and the
in-memory store of the property tests applies with them; these tests hold the meaning itself,
with plain lists.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from autoctx._messages import Role
from autoctx._plans import Edit, Snapshot, splice
from autoctx._structure import MsgMeta


def meta(i: int, tokens: int = 10, role: Role = "user") -> MsgMeta:
    return MsgMeta(i, role, "original", False, False, tokens, tokens * 4)


def snapshot(n: int) -> Snapshot:
    metas = tuple(meta(i, tokens=10 + i) for i in range(n))
    return Snapshot("s", 7, metas, sum(m.tokens for m in metas), n)


def span_edit(snap: Snapshot, start: int, end: int, strategy: int = 4) -> Edit:
    return Edit(
        strategy=strategy,
        start=start,
        end=end,
        replaced_ids=snap.ids(start, end),
        new_kind="round_summary",
        llm=True,
        replaced_tokens=sum(m.tokens for m in snap.messages[start:end]),
    )


def test_a_range_becomes_its_new_message_one_version_later() -> None:
    snap = snapshot(6)
    edit = span_edit(snap, 1, 4)
    after = snap.apply([(edit, meta(100, tokens=5))])
    assert [m.id for m in after.messages] == [0, 100, 4, 5]
    assert after.version == snap.version + 1
    assert after.message_count == 4 == len(after.messages)
    assert after.token_count == sum(m.tokens for m in after.messages)
    assert after.token_count == snap.token_count - edit.replaced_tokens + 5
    assert snap.ids(0, 6) == (0, 1, 2, 3, 4, 5)  # the snapshot itself is unchanged


def test_a_fold_keeps_its_system_and_pinned_messages_in_place_before_it() -> None:
    snap = snapshot(7)
    # The span 1..5 holds a kept message at 3 (a pinned one, say): the members are 1, 2, 4, 5.
    members = (1, 2, 4, 5)
    edit = Edit(
        strategy=7,
        start=1,
        end=6,
        replaced_ids=tuple(snap.messages[i].id for i in members),
        new_kind="history_summary",
        llm=True,
        replaced_tokens=sum(snap.messages[i].tokens for i in members),
        members=members,
        span_ids=snap.ids(1, 6),
    )
    after = snap.apply([(edit, meta(100, tokens=3))])
    assert [m.id for m in after.messages] == [0, 3, 100, 6]
    assert after.message_count == 4
    assert after.token_count == sum(m.tokens for m in after.messages)


def test_several_ranges_of_one_apply_keep_their_indices_in_any_order() -> None:
    snap = snapshot(10)
    first, second = span_edit(snap, 1, 3), span_edit(snap, 6, 9)
    changes = [(second, meta(200)), (first, meta(100))]
    after = snap.apply(changes)
    assert [m.id for m in after.messages] == [0, 100, 3, 4, 5, 200, 9]
    assert after.version == snap.version + 1  # one apply, one version
    assert after.token_count == sum(m.tokens for m in after.messages)


def test_an_edit_of_another_snapshot_is_refused() -> None:
    snap = snapshot(6)
    stale = span_edit(snapshot(6), 1, 3)
    moved = Snapshot("s", 8, snap.messages[1:], snap.token_count, 5)
    with pytest.raises(ValueError, match="plan again from the current snapshot"):
        moved.apply([(stale, meta(100))])


def test_splice_moves_any_items_as_the_edit_moves_messages() -> None:
    """The SQL store splices its working-set positions with the same function: the new
    message takes the position of the last message it replaces."""
    snap = snapshot(5)
    positions = [10, 20, 30, 40, 50]
    edit = span_edit(snap, 1, 4)
    assert splice(positions, [(edit, positions[edit.end - 1])]) == [10, 40, 50]


@given(
    n=st.integers(1, 40),
    cuts=st.lists(st.integers(0, 40), min_size=2, max_size=12, unique=True),
)
def test_any_set_of_disjoint_ranges_applies_as_the_sum_of_its_edits(
    n: int, cuts: list[int]
) -> None:
    """Random disjoint ranges: every replaced id leaves, every other stays in order, each new
    message stands where its range ended, and the totals are the totals of what is left."""
    snap = snapshot(n)
    bounds = sorted(c for c in cuts if c <= n)
    edits = [
        span_edit(snap, a, b) for a, b in zip(bounds[::2], bounds[1::2], strict=False) if a < b
    ]
    changes = [(e, meta(1000 + k, tokens=1)) for k, e in enumerate(edits)]
    after = snap.apply(changes)
    expected: list[int] = []
    k = 0
    while k < n:
        edit = next((e for e in edits if e.start == k), None)
        if edit is None:
            expected.append(k)
            k += 1
        else:
            expected.append(1000 + edits.index(edit))
            k = edit.end
    assert [m.id for m in after.messages] == expected
    assert after.message_count == len(expected)
    assert after.token_count == sum(m.tokens for m in after.messages)
