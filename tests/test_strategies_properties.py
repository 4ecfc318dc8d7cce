"""Property tests: the planners' invariants on random histories and random valid configs."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from autoctx import AutoContextConfig
from autoctx._messages import Kind, Role
from autoctx._plans import Edit, PlanContext, Snapshot
from autoctx._strategies import PLANNERS, RELOAD_TOOL_NAME
from autoctx._strategies._common import MIN_LLM_RANGE_TOKENS, compute_layout
from autoctx._strategies.registry import RUNGS
from autoctx._structure import (
    MsgMeta,
    effective_pinned,
    latest_final_index,
    latest_user_index,
    pending_call_ids,
    tool_group_spans,
)

SETTINGS = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

NEW_KIND: dict[int, Kind] = {
    1: "tool_run_summary",
    2: "preview",
    3: "preview",
    4: "round_summary",
    5: "large_summary",
    6: "current_round_summary",
    7: "history_summary",
    8: "preview",
}
PER_MESSAGE = (2, 3, 5, 8)
#: The strategies that summarize a range with an LLM, which must hold enough to gain on.
RANGE_LLM = (1, 4, 6, 7)
#: What each range strategy may fold in (docs/design.md §1's kinds table).
ALLOWED_KINDS: dict[int, frozenset[Kind]] = {
    1: frozenset({"original", "preview", "large_summary"}),
    4: frozenset({"original", "preview", "large_summary", "tool_run_summary"}),
    6: frozenset(
        {
            "original",
            "preview",
            "large_summary",
            "tool_run_summary",
            "round_summary",
            "current_round_summary",
        }
    ),
    # The fold takes summaries and previews of every kind, its own previous summary included.
    7: frozenset(NEW_KIND.values()) | {"original"},
}


# ---------------------------------------------------------------------------------------------
# Random histories
# ---------------------------------------------------------------------------------------------


class _Builder:
    def __init__(self, draw: st.DrawFn) -> None:
        self.draw = draw
        self.msgs: list[MsgMeta] = []
        self.calls = 0

    def add(
        self,
        role: Role,
        kind: Kind = "original",
        *,
        final: bool = False,
        call_ids: tuple[str, ...] = (),
        result_ids: tuple[str, ...] = (),
        tool_names: tuple[str, ...] = (),
    ) -> None:
        draw = self.draw
        self.msgs.append(
            MsgMeta(
                id=len(self.msgs) + 1,
                role=role,
                kind=kind,
                final=final,
                pinned=draw(st.integers(0, 14)) == 0,
                tokens=draw(st.integers(1, 600)),
                chars=draw(st.one_of(st.integers(0, 300), st.integers(300, 3000))),
                call_ids=call_ids,
                result_ids=result_ids,
                tool_names=tool_names,
            )
        )

    def group(self, *, pending: bool = False) -> None:
        draw = self.draw
        n = draw(st.integers(1, 3))
        ids = tuple(f"c{self.calls + k}" for k in range(n))
        self.calls += n
        names = tuple(draw(st.sampled_from(["shell", "read", RELOAD_TOOL_NAME])) for _ in ids)
        self.add(
            "assistant",
            draw(st.sampled_from(["original", "original", "large_summary"])),
            call_ids=ids,
            tool_names=names,
        )
        answered = draw(st.integers(0, n - 1)) if pending else n
        # Results may come one message per call or several calls in one tool message.
        k = 0
        while k < answered:
            size = draw(st.integers(1, answered - k))
            self.add(
                "tool",
                draw(st.sampled_from(["original", "original", "preview", "large_summary"])),
                result_ids=ids[k : k + size],
                tool_names=names[k : k + size],
            )
            k += size

    def step(self) -> None:
        what = self.draw(
            st.sampled_from(["group"] * 6 + ["text", "summary", "preview", "system", "user"])
        )
        if what == "group":
            self.group()
        elif what == "text":
            self.add("assistant", final=True)  # an assistant message with no call is final
        elif what == "summary":
            kind: Kind = self.draw(
                st.sampled_from(["tool_run_summary", "round_summary", "current_round_summary"])
            )
            self.add("assistant", kind, final=kind == "round_summary")
        elif what == "preview":
            kind = self.draw(st.sampled_from(["preview", "large_summary"]))
            self.add("assistant", kind, final=self.draw(st.booleans()))
        elif what == "system":
            self.add("system")
        else:
            self.add("user", self.draw(st.sampled_from(["original", "preview"])))

    def round(self, steps: int, finished: bool) -> None:
        self.add("user")
        if self.draw(st.booleans()):
            self.add("assistant", "current_round_summary")
        for _ in range(steps):
            self.step()
        if finished:
            kind: Kind = self.draw(st.sampled_from(["original", "round_summary", "preview"]))
            self.add("assistant", kind, final=True)


@st.composite
def histories(draw: st.DrawFn) -> tuple[MsgMeta, ...]:
    b = _Builder(draw)
    for _ in range(draw(st.integers(0, 2))):
        b.add("system")
    rounds = draw(st.integers(0, 4))
    for r in range(rounds):
        last = r == rounds - 1
        # Now and then a long single task: one request and many steps.
        long_task = last and draw(st.integers(0, 3)) == 0
        steps = draw(st.integers(30, 90)) if long_task else draw(st.integers(0, 10))
        b.round(steps, finished=not last or draw(st.booleans()))
    if rounds == 0:
        for _ in range(draw(st.integers(0, 8))):
            b.step()
    if draw(st.booleans()):
        b.group(pending=True)
    return tuple(b.msgs)


@st.composite
def configs(draw: st.DrawFn) -> AutoContextConfig:
    large = draw(st.integers(100, 2000))
    token_ratio = draw(st.floats(0.2, 0.95))
    return AutoContextConfig(
        large_payload_chars=large,
        preview_chars=draw(st.integers(1, large - 1)),
        reload_page_chars=draw(st.integers(1, large)),
        last_keep=draw(st.integers(0, 60)),
        min_tool_run=draw(st.integers(0, 8)),
        min_compress_tokens=draw(st.integers(0, 3000)),
        current_round_ratio=draw(st.floats(0.05, 0.95)),
        max_tokens=draw(st.integers(1000, 50_000)),
        token_ratio=token_ratio,
        target_ratio=draw(st.floats(0.05, token_ratio - 0.01)),
        mask_keep=draw(st.integers(0, 6)),
        mask_preview_chars=draw(st.integers(1, 300)),
    )


def snapshot_of(msgs: tuple[MsgMeta, ...]) -> Snapshot:
    return Snapshot("s", 7, msgs, sum(m.tokens for m in msgs), len(msgs))


# ---------------------------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------------------------


def history_end(msgs: tuple[MsgMeta, ...], config: AutoContextConfig) -> int:
    """H of docs/design.md §3, recomputed independently of the planners."""
    n = len(msgs)
    final = latest_final_index(msgs)
    user = latest_user_index(msgs)
    if user is None:
        lead = 0
        while lead < n and msgs[lead].role == "system":
            lead += 1
        after = n - lead
    else:
        after = n - user - 1
    h = final if final is not None else 0
    if after > config.last_keep:
        h = max(h, n - config.last_keep)
    return h


def pending_start(msgs: tuple[MsgMeta, ...]) -> int:
    return tool_group_spans(msgs)[-1][0] if pending_call_ids(msgs) else len(msgs)


def latest_step(msgs: tuple[MsgMeta, ...]) -> int | None:
    """Start of the trailing answered tool group when the context ends with one."""
    if not msgs or msgs[-1].role != "tool" or pending_call_ids(msgs):
        return None
    return tool_group_spans(msgs)[-1][0]


def step_fits(msgs: tuple[MsgMeta, ...], step: int, config: AutoContextConfig) -> bool:
    """Whether the latest step leaves room under the target for the smallest S6 summary of what
    comes before it in the current round (after its user message and its last protected one)."""
    user = latest_user_index(msgs)
    start = user + 1 if user is not None else 0
    while user is None and start < len(msgs) and msgs[start].role == "system":
        start += 1
    pinned = effective_pinned(msgs)
    protected = [k for k in range(start, len(msgs)) if msgs[k].role == "system" or pinned[k]]
    if protected:
        start = protected[-1] + 1
    before = sum(m.tokens for m in msgs[min(start, step) : step])
    total = sum(m.tokens for m in msgs)
    return total - before + MIN_LLM_RANGE_TOKENS < config.token_target


def step_shrinkable(msgs: tuple[MsgMeta, ...], step: int, ctx: PlanContext) -> list[int]:
    """The latest step's messages S5 could still summarize."""
    return [
        k
        for k in range(step, len(msgs))
        if msgs[k].kind == "original"
        and msgs[k].tokens >= MIN_LLM_RANGE_TOKENS
        and not (
            msgs[k].role == "tool"
            and {RELOAD_TOOL_NAME, "context_search"} & set(msgs[k].tool_names)
        )
        and not msgs[k].pinned
        and (msgs[k].id,) not in ctx.failed
    ]


def check_edits(
    strategy: int,
    edits: list[Edit],
    snap: Snapshot,
    config: AutoContextConfig,
    ctx: PlanContext,
) -> None:
    msgs = snap.messages
    n = len(msgs)
    spans = tool_group_spans(msgs)
    pinned = effective_pinned(msgs)
    user = latest_user_index(msgs)
    h = history_end(msgs, config)
    pend = pending_start(msgs)
    step = latest_step(msgs)
    fits = step is not None and step_fits(msgs, step, config)
    previous_end = 0
    for e in edits:
        assert (e.strategy, e.new_kind) == (strategy, NEW_KIND[strategy])
        assert e.llm == (strategy in (1, 4, 5, 6, 7))
        assert (e.preview_chars is not None) == (strategy == 8)
        # The rung's record says the same as its planner's edits.
        assert (RUNGS[strategy].writes, RUNGS[strategy].llm) == (e.new_kind, e.llm)
        assert previous_end <= e.start < e.end <= n, "in range, in order, non-overlapping"
        previous_end = e.end
        members = e.member_indices
        assert list(members) == sorted(set(members)) and members[0] == e.start
        assert members[-1] == e.end - 1
        assert e.replaced_ids == tuple(msgs[k].id for k in members)
        assert e.expected_span == snap.ids(e.start, e.end)
        assert e.replaced_tokens == sum(msgs[k].tokens for k in members)
        assert e.replaced_ids not in ctx.failed
        assert e.end <= pend, "the trailing pending call is never touched"
        if step is not None and e.end > step and strategy not in PER_MESSAGE:
            # A context that ends with the results the model is about to read still does;
            # only S6 takes the latest step, when it cannot fit and S5 can shrink it no more.
            assert strategy == 6 and not fits, "the latest step is kept"
            assert not step_shrinkable(msgs, step, ctx), "S5 shrinks the latest step first"
        rng = members
        assert all(msgs[k].role != "system" and not pinned[k] for k in rng)
        if strategy == 5 and user in rng:
            # S5 may shorten the current user message when it alone is large.
            assert msgs[user].chars > config.large_payload_chars
        else:
            assert user is None or user not in rng, "the current user message is protected"
        if strategy == 7:
            # The fold: the history before the current round, around what it keeps.
            assert user is not None and e.end <= user
            assert all(
                msgs[k].role == "system" or pinned[k]
                for k in range(e.start, e.end)
                if k not in set(members)
            ), "only protected messages are left between"
            assert e.token_budget == config.fold_budget_tokens
        if strategy in RANGE_LLM:
            body = members[1:] if e.verbatim_prefix_id is not None else members
            assert sum(msgs[k].tokens for k in body) >= MIN_LLM_RANGE_TOKENS, "it can gain"
        if strategy in (1, 2, 3):
            assert e.end <= h
        if strategy == 8:
            # Masking: an old original tool output over its floor, below H or before the
            # current round (anywhere in a long current round, its tail included), outside
            # the most recent tool results; never a context tool's.
            m = msgs[e.start]
            assert m.kind == "original" and (m.role == "tool" or m.call_ids)
            assert m.role in ("tool", "assistant")
            assert m.chars > config.mask_min_chars
            long_round = user is None or len(msgs) - (user + 1) > config.last_keep
            assert long_round or e.end <= max(h, user)
            # The latest step only when it does not fit (it is what the model reads next).
            assert step is None or e.start < step or not fits, "the latest step is kept"
            # A call is masked with its results: after the last of them, as many results as
            # masking keeps.
            last = max(
                (k for k, x in enumerate(msgs) if set(x.result_ids) & set(m.call_ids)),
                default=e.start,
            )
            later = sum(len(x.result_ids) for x in msgs[last + 1 :] if x.role == "tool")
            assert later >= config.mask_keep, "the most recent tool results stay"
            assert not {RELOAD_TOOL_NAME, "context_search"} & set(m.tool_names)
            assert e.preview_chars == config.mask_preview_chars
        if strategy in (1, 2):
            assert e.end <= n - config.last_keep
        if strategy in PER_MESSAGE:
            m = msgs[e.start]
            assert e.end == e.start + 1
            floor = config.mask_min_chars if strategy == 8 else config.large_payload_chars
            in_step = step is not None and e.start >= step
            if strategy == 5 and in_step:
                # The latest step: left whole while it fits, each message worth it otherwise.
                assert not fits
                assert m.chars > floor or m.tokens >= MIN_LLM_RANGE_TOKENS
            else:
                assert m.chars > floor
            assert m.kind == "original"
            if strategy in (2, 3):
                # Masking takes a call whole (its ids kept, its arguments cut): S2 and S3 never.
                assert not m.call_ids, "a tool_use message is never previewed"
            else:
                assert not (m.role == "tool" and RELOAD_TOOL_NAME in m.tool_names)
        else:
            member_set = set(members)
            for s_, e_ in spans:
                inside = [k in member_set for k in range(s_, e_)]
                assert all(inside) or not any(inside), "a tool group is never cut"
            assert all(msgs[k].kind in ALLOWED_KINDS[strategy] for k in rng)
            body = members[1:] if e.verbatim_prefix_id is not None else members
            assert body, "something besides a verbatim prefix is summarized"
            assert any(msgs[k].kind != e.new_kind for k in body), "never only its own output"
        if strategy == 6:
            assert e.char_budget is not None and e.char_budget >= 1
            if e.verbatim_prefix_id is not None:
                assert e.verbatim_prefix_id == msgs[e.start].id
                assert msgs[e.start].kind == "current_round_summary"
        else:
            assert e.verbatim_prefix_id is None and e.char_budget is None
    if strategy in (5, 6) and not ctx.token_pressure:
        assert edits == []
    if strategy in (6, 7):
        assert len(edits) <= 1


def apply(msgs: tuple[MsgMeta, ...], edits: list[Edit]) -> tuple[MsgMeta, ...]:
    """What the store would leave: each range replaced by one smaller message of the new kind.
    A per-message edit keeps role and tool ids; a range becomes one plain assistant message."""
    out = list(msgs)
    for e in reversed(edits):
        first = msgs[e.start]
        tokens = max(1, e.replaced_tokens // 2)
        if e.strategy in PER_MESSAGE:
            new = replace(first, id=-first.id, kind=e.new_kind, tokens=tokens, chars=10)
        else:
            new = MsgMeta(
                id=-first.id,
                role="assistant",
                kind=e.new_kind,
                final=e.new_kind in ("round_summary", "history_summary"),
                pinned=False,
                tokens=tokens,
                chars=10,
            )
        # The new message takes the place of the last replaced one; the others go.
        members = e.member_indices
        out[members[-1]] = new
        for k in reversed(members[:-1]):
            del out[k]
    return tuple(out)


def assert_well_paired(msgs: tuple[MsgMeta, ...]) -> None:
    """Every tool result follows its call in the same group; every call but a trailing pending
    one has all its results."""
    spans = tool_group_spans(msgs)
    for index, (start, end) in enumerate(spans):
        head = msgs[start]
        if head.role == "tool":
            raise AssertionError(f"tool result at {start} has no call before it")
        if not head.call_ids:
            continue
        answered = [rid for m in msgs[start + 1 : end] for rid in m.result_ids]
        assert set(answered) <= set(head.call_ids)
        if index < len(spans) - 1:
            assert set(answered) == set(head.call_ids), f"call at {start} lost a result"


# ---------------------------------------------------------------------------------------------
# Properties
# ---------------------------------------------------------------------------------------------


@SETTINGS
@given(msgs=histories(), config=configs(), pressure=st.booleans())
def test_every_planner_keeps_the_invariants(
    msgs: tuple[MsgMeta, ...], config: AutoContextConfig, pressure: bool
) -> None:
    snap = snapshot_of(msgs)
    ctx = PlanContext(token_pressure=pressure)
    assert_well_paired(msgs)  # the generator itself makes valid histories
    for strategy, planner in PLANNERS.items():
        edits = planner(snap, config, ctx)
        event(f"S{strategy} plans {'something' if edits else 'nothing'}")
        check_edits(strategy, edits, snap, config, ctx)
        assert planner(snap, config, ctx) == edits, "pure: same input, same plan"
        assert_well_paired(apply(msgs, edits))


@SETTINGS
@given(msgs=histories(), config=configs(), data=st.data())
def test_failed_ranges_are_not_planned_again(
    msgs: tuple[MsgMeta, ...], config: AutoContextConfig, data: st.DataObject
) -> None:
    snap = snapshot_of(msgs)
    for strategy, planner in PLANNERS.items():
        edits = planner(snap, config, PlanContext(token_pressure=True))
        failed = frozenset(
            e.replaced_ids for e in edits if data.draw(st.booleans(), label=f"fail s{strategy}")
        )
        ctx = PlanContext(token_pressure=True, failed=failed)
        again = planner(snap, config, ctx)
        check_edits(strategy, again, snap, config, ctx)
        assert not [e for e in again if e.replaced_ids in failed]
        kept = [e for e in edits if e.replaced_ids not in failed]
        if strategy == 5:
            # S5 takes only what the target needs (docs/design.md §3): with a candidate
            # failed, it may take a further one in its place, never the failed one again.
            assert [e for e in again if e in kept] == kept
        else:
            assert again == kept


@SETTINGS
@given(msgs=histories(), config=configs(), pressure=st.booleans())
def test_a_strategy_does_not_rework_its_own_output(
    msgs: tuple[MsgMeta, ...], config: AutoContextConfig, pressure: bool
) -> None:
    """Applying a plan and planning again never selects a range made only of the new messages."""
    ctx = PlanContext(token_pressure=pressure)
    for strategy, planner in PLANNERS.items():
        edits = planner(snapshot_of(msgs), config, ctx)
        after = apply(msgs, edits)
        made = {m.id for m in after if m.id < 0}
        for e in planner(snapshot_of(after), config, ctx):
            summarized = e.replaced_ids[1:] if e.verbatim_prefix_id is not None else e.replaced_ids
            assert not set(summarized) <= made, f"S{strategy} reworked its own output"


@given(
    before=histories(),
    appended=histories(),
    config=configs(),
    data=st.data(),
)
@SETTINGS
def test_a_layout_built_on_the_previous_one_equals_one_built_from_scratch(
    before: tuple[MsgMeta, ...],
    appended: tuple[MsgMeta, ...],
    config: AutoContextConfig,
    data: st.DataObject,
) -> None:
    """`compute_layout` reuses the previous layout of the session for the messages the two
    snapshots share; whatever happened in between (messages appended, the results of a pending
    call among them, a range replaced by one message, the last messages popped), the result is
    the layout computed from nothing."""
    msgs = list(before)
    what = data.draw(st.sampled_from(["append", "replace", "pop", "replace+append", "answer"]))
    fresh_id = 10_000
    pending = pending_call_ids(before)
    if what == "answer" and pending:
        # The trailing pending call gets its results: its tool group grows.
        cut = data.draw(st.integers(1, len(pending)))
        for k, ids in enumerate((pending[:cut], pending[cut:])):
            if ids:
                msgs.append(
                    MsgMeta(fresh_id - 10 + k, "tool", "original", False, False, 5, 5, (), ids, ())
                )
    if what in ("replace", "replace+append") and msgs:
        start = data.draw(st.integers(0, len(msgs) - 1))
        end = data.draw(st.integers(start + 1, len(msgs)))
        summary = replace(msgs[start], id=fresh_id, kind="round_summary", call_ids=())
        msgs[start:end] = [summary]
    if what == "pop" and msgs:
        del msgs[data.draw(st.integers(0, len(msgs) - 1)) :]
    if what in ("append", "replace+append", "answer"):
        msgs += [replace(m, id=fresh_id + 1 + k) for k, m in enumerate(appended)]
    after = tuple(msgs)
    previous = compute_layout(snapshot_of(before), config)
    assert compute_layout(snapshot_of(after), config, previous) == compute_layout(
        snapshot_of(after), config
    )
