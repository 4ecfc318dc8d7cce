"""The planners of docs/design.md §3 (S1 to S6 and the fold) on small hand-built histories (pure,
no database)."""

from __future__ import annotations

from typing import Any

import pytest

from autoctx import AutoContextConfig
from autoctx import _compressor as compressor
from autoctx._messages import Kind, Role
from autoctx._plans import Edit, PlanContext, Snapshot
from autoctx._strategies import PLANNERS, RELOAD_TOOL_NAME, plan, registry
from autoctx._strategies import plan_s1 as s1
from autoctx._strategies import plan_s2 as s2
from autoctx._strategies import plan_s3 as s3
from autoctx._strategies import plan_s4 as s4
from autoctx._strategies import plan_s5 as s5
from autoctx._strategies import plan_s6 as s6
from autoctx._strategies import plan_s7 as s7
from autoctx._strategies import plan_s8 as s8
from autoctx._strategies._common import MIN_LLM_RANGE_TOKENS
from autoctx._structure import MsgMeta
from autoctx._tags import TAG_TOKENS

PRESSURE = PlanContext(token_pressure=True)
COUNT_ONLY = PlanContext(token_pressure=False)
BIG = 2000  # chars above the test configs' large_payload_chars (1000)


def cfg(**changes: Any) -> AutoContextConfig:
    """Small thresholds so that histories stay short, and the 0.6 token target these
    hand-built histories are sized for (the default is 0.4)."""
    base: dict[str, Any] = {
        "target_ratio": 0.6,
        "large_payload_chars": 1000,
        "preview_chars": 100,
        "reload_page_chars": 500,
        "last_keep": 4,
        "min_tool_run": 2,
        "min_compress_tokens": 500,
        "max_tokens": 10_000,
    }
    base.update(changes)
    return AutoContextConfig(**base)


class Hist:
    """Builds a list of `MsgMeta` with fresh ids and call ids; each method returns the index (or
    the [start, end) span) of what it added."""

    def __init__(self) -> None:
        self.msgs: list[MsgMeta] = []
        self._calls = 0

    def __len__(self) -> int:
        return len(self.msgs)

    def add(
        self,
        role: Role,
        *,
        kind: Kind = "original",
        final: bool | None = None,
        pinned: bool = False,
        tokens: int = 10,
        chars: int = 40,
        call_ids: tuple[str, ...] = (),
        result_ids: tuple[str, ...] = (),
        tool_names: tuple[str, ...] = (),
    ) -> int:
        if final is None:
            final = kind == "round_summary" or (
                kind == "original" and role == "assistant" and not call_ids
            )
        self.msgs.append(
            MsgMeta(
                id=1000 + len(self.msgs),
                role=role,
                kind=kind,
                final=final,
                pinned=pinned,
                tokens=tokens,
                chars=chars,
                call_ids=call_ids,
                result_ids=result_ids,
                tool_names=tool_names,
            )
        )
        return len(self.msgs) - 1

    def system(self, **kw: Any) -> int:
        return self.add("system", **kw)

    def user(self, **kw: Any) -> int:
        return self.add("user", **kw)

    def answer(self, **kw: Any) -> int:
        return self.add("assistant", **kw)

    def _new_calls(self, n: int) -> tuple[str, ...]:
        ids = tuple(f"call_{self._calls + k}" for k in range(n))
        self._calls += n
        return ids

    def group(
        self,
        calls: int = 1,
        *,
        tokens: int = 100,
        chars: int = 40,
        name: str = "shell",
        pinned: bool = False,
        call_kind: Kind = "original",
        result_kind: Kind = "original",
        one_message: bool = False,
    ) -> tuple[int, int]:
        """An assistant message with `calls` parallel calls, then their results (one tool
        message per call, or one message answering all of them)."""
        ids = self._new_calls(calls)
        names = (name,) * calls
        start = self.add(
            "assistant",
            kind=call_kind,
            pinned=pinned,
            tokens=tokens,
            call_ids=ids,
            tool_names=names,
        )
        answers = [ids] if one_message else [(c,) for c in ids]
        for answered in answers:
            self.add(
                "tool",
                kind=result_kind,
                tokens=tokens,
                chars=chars,
                result_ids=answered,
                tool_names=(name,) * len(answered),
            )
        return start, len(self.msgs)

    def steps(self, n: int, **kw: Any) -> tuple[int, int]:
        start = len(self.msgs)
        for _ in range(n):
            self.group(**kw)
        return start, len(self.msgs)

    def pending(self, calls: int = 2, answered: int = 1, *, chars: int = 40) -> tuple[int, int]:
        """A trailing tool call with only `answered` of its `calls` results so far."""
        ids = self._new_calls(calls)
        start = self.add("assistant", call_ids=ids, tool_names=("shell",) * calls)
        for c in ids[:answered]:
            self.add("tool", chars=chars, result_ids=(c,), tool_names=("shell",))
        return start, len(self.msgs)

    def snap(self) -> Snapshot:
        msgs = tuple(self.msgs)
        return Snapshot("s", 1, msgs, sum(m.tokens for m in msgs), len(msgs))


def spans(edits: list[Edit]) -> list[tuple[int, int]]:
    return [(e.start, e.end) for e in edits]


def starts(edits: list[Edit]) -> list[int]:
    return [e.start for e in edits]


# ---------------------------------------------------------------------------------------------
# The registry
# ---------------------------------------------------------------------------------------------


def test_planners_are_registered_by_number() -> None:
    assert {1: s1, 2: s2, 3: s3, 4: s4, 5: s5, 6: s6, 7: s7, 8: s8} == PLANNERS
    # Masking first, the fold before S5 and S6 (docs/design.md §3).
    assert list(PLANNERS) == [8, 1, 2, 3, 4, 7, 5, 6]


def test_registry_rules_over_rungs_follow_the_records() -> None:
    """Every rule over rungs is read from the rungs' records (docs/design.md §3): the sets the
    compressor uses are those the records imply, and a rung moved in the ladder moves them."""
    assert tuple(PLANNERS) == registry.ORDER
    assert {1, 2, 3, 4, 7, 8} == registry.HISTORY_STRATEGIES
    assert registry.LLM_STRATEGIES == (1, 4, 5, 6, 7)
    assert set(registry.DEFAULT_PROMPTS) == set(registry.LLM_STRATEGIES)
    assert all((r.prompt is not None) == r.llm for r in registry.LADDER)
    # A preview is the only replacement no LLM writes (what `make_edit` relies on).
    assert all(r.llm == (r.writes != "preview") for r in registry.LADDER)
    assert registry.TOKENS_ONLY_STRATEGIES == registry.PREVIEW_STRATEGIES == {2, 3, 8}
    # S1 and S4 leave a call for the fold and S6, S5 for S6 alone.
    assert registry.RESERVED_AFTER == {1: 2, 4: 2, 5: 1}
    assert {1, 4} == registry.YIELD_TO_FOLD
    assert {2, 3} == registry.PREVIEWS_YIELD_TO_FOLD
    assert {1, 5} == registry.YIELD_TO_CURRENT_ROUND
    assert registry.FALLBACK_STRATEGIES == (7, 5, 6)
    assert compressor.STRATEGIES == registry.ORDER
    assert compressor._FALLBACK_STRATEGIES == registry.FALLBACK_STRATEGIES


def test_registry_reserved_calls_follow_the_order() -> None:
    """The calls a rung leaves for later single-call rungs are counted from the ladder, so that
    reordering the records is the whole change: S5 moved after S6 leaves S6 nothing."""
    rungs = [registry.RUNGS[n] for n in registry.ORDER]
    assert registry.reserved_after(rungs) == registry.RESERVED_AFTER
    s5_last = [r for r in rungs if r.number != 5] + [registry.RUNGS[5]]
    assert registry.reserved_after(s5_last) == {1: 2, 4: 2, 5: 0}
    assert registry.reserved_after([r for r in rungs if r.number != 7])[1] == 1


def test_events_are_named_by_rung_or_by_reason() -> None:
    """Manual events keep strategy 0 and are named by their reason; compressions by rung."""
    assert registry.event_kind(0, "manual") == "pop"
    assert [registry.event_kind(0, r) for r in ("clear", "fork", "erase", "undo")] == [
        "clear",
        "fork",
        "erase",
        "undo",
    ]
    assert not registry.is_compression(registry.MANUAL)
    assert registry.event_kind(4, "tokens") == "round summary"
    assert registry.event_label(4, "tokens") == "S4 round summary"
    assert registry.event_label(0, "fork") == "fork"
    assert registry.label(99) == "S99 ?"
    assert set(registry.STRATEGY_NAMES) == {0, *registry.RUNGS}
    assert set(registry.STRATEGY_COLORS) == set(registry.STRATEGY_NAMES)
    assert len(set(registry.STRATEGY_COLORS.values())) == len(registry.STRATEGY_COLORS)


def test_plan_dispatches_and_refuses_unknown_strategies() -> None:
    h = Hist()
    h.user()
    h.answer(chars=BIG)
    h.user()
    h.answer()
    assert plan(2, h.snap(), cfg(last_keep=0), PRESSURE) == s2(h.snap(), cfg(last_keep=0), PRESSURE)
    with pytest.raises(ValueError, match="unknown strategy 9"):
        plan(9, h.snap(), cfg(), PRESSURE)


def test_empty_snapshot_plans_nothing() -> None:
    for planner in PLANNERS.values():
        assert planner(Hist().snap(), cfg(), PRESSURE) == []


# ---------------------------------------------------------------------------------------------
# S1: historical tool runs
# ---------------------------------------------------------------------------------------------


def test_s1_summarizes_a_historical_run_of_whole_groups() -> None:
    h = Hist()
    h.system()
    h.user()
    run = h.steps(3)  # 6 messages, 600 tokens
    h.answer()
    h.user()
    h.steps(3)
    h.answer()
    h.user()
    # n = 18, last_keep = 4: the second run (10..16) is trimmed to the groups before 14.
    edits = s1(h.snap(), cfg(min_compress_tokens=400), PRESSURE)
    assert spans(edits) == [run, (10, 14)]
    e = edits[0]
    assert (e.strategy, e.new_kind, e.llm) == (1, "tool_run_summary", True)
    assert e.replaced_ids == tuple(m.id for m in h.msgs[run[0] : run[1]])
    assert e.verbatim_prefix_id is None and e.char_budget is None


def test_s1_run_must_be_longer_than_min_tool_run() -> None:
    h = Hist()
    h.user()
    h.steps(1)  # 2 messages: not more than min_tool_run=2
    h.answer()
    h.user()
    longer = h.steps(2, tokens=300)  # 4 messages
    h.answer()
    h.user()
    longest = h.steps(3)  # 6 messages
    h.answer()
    assert spans(s1(h.snap(), cfg(last_keep=0), PRESSURE)) == [longer, longest]
    assert spans(s1(h.snap(), cfg(last_keep=0, min_tool_run=4), PRESSURE)) == [longest]


def test_s1_counts_parallel_results_as_messages_and_never_cuts_a_group() -> None:
    h = Hist()
    h.user()
    a = h.group(calls=3, tokens=200)  # 4 messages
    b = h.group(calls=2, tokens=200, one_message=True)  # 2 messages, one answers both calls
    h.answer()
    h.user()
    edits = s1(h.snap(), cfg(last_keep=0), PRESSURE)
    assert spans(edits) == [(a[0], b[1])]


@pytest.mark.parametrize("splitter", ["user", "system", "plain_assistant", "pinned", "summary"])
def test_s1_runs_are_split(splitter: str) -> None:
    h = Hist()
    h.user()
    first = h.steps(2, tokens=300)
    if splitter == "user":
        h.user()
    elif splitter == "system":
        h.system()
    elif splitter == "plain_assistant":
        h.answer()
    elif splitter == "pinned":
        h.group(pinned=True, tokens=300)
    else:
        h.answer(kind="tool_run_summary")
    second = h.steps(2, tokens=300)
    h.answer()
    h.user()
    assert spans(s1(h.snap(), cfg(last_keep=0), PRESSURE)) == [first, second]


def test_s1_pin_on_a_result_protects_the_whole_group() -> None:
    h = Hist()
    h.user()
    first = h.steps(2, tokens=300)
    call = h.add("assistant", call_ids=("x",), tokens=300)
    h.add("tool", result_ids=("x",), pinned=True, tokens=300)
    second = h.steps(2, tokens=300)
    h.answer()
    h.user()
    edits = s1(h.snap(), cfg(last_keep=0), PRESSURE)
    assert spans(edits) == [first, second]
    assert all(not (e.start <= call < e.end) for e in edits)


def test_s1_token_floor_skips_light_runs_and_goes_on() -> None:
    h = Hist()
    h.user()
    tiny = h.steps(2, tokens=20)  # 80 tokens: no summary can gain on it
    h.answer()
    h.user()
    light = h.steps(2, tokens=80)  # 320 tokens
    h.answer()
    h.user()
    heavy = h.steps(2, tokens=200)  # 800 tokens
    h.answer()
    h.user()
    assert spans(s1(h.snap(), cfg(last_keep=0), PRESSURE)) == [heavy]
    # With only the message-count trigger the floor is waived, down to what a summary can gain on.
    assert spans(s1(h.snap(), cfg(last_keep=0), COUNT_ONLY)) == [light, heavy]
    assert tiny[1] - tiny[0] == 4


def test_s1_stays_below_the_latest_final_answer() -> None:
    h = Hist()
    h.user()
    before = h.steps(2, tokens=300)
    h.answer()
    h.steps(3, tokens=300)  # after the latest final answer: protected
    h.user()
    assert spans(s1(h.snap(), cfg(last_keep=0), PRESSURE)) == [before]


def test_s1_stays_out_of_the_last_keep_and_trims_to_whole_groups() -> None:
    h = Hist()
    h.user()
    h.steps(4, tokens=300)  # indices 1..8
    h.answer()  # 9, the latest final answer
    h.user()
    # n = 11, last_keep = 4: tail starts at 7, which cuts the group 7..8; the run ends at 7.
    assert spans(s1(h.snap(), cfg(last_keep=4), PRESSURE)) == [(1, 7)]
    # With min_tool_run=6 the trimmed run (6 messages) is too short.
    assert s1(h.snap(), cfg(last_keep=4, min_tool_run=6), PRESSURE) == []


def test_s1_ignores_runs_of_only_previews_and_large_summaries() -> None:
    h = Hist()
    h.user()
    h.steps(3, tokens=300, call_kind="large_summary", result_kind="preview")
    h.answer()
    h.user()
    mixed = h.steps(3, tokens=300, result_kind="preview")
    h.answer()
    h.user()
    assert spans(s1(h.snap(), cfg(last_keep=0), PRESSURE)) == [mixed]


def test_s1_skips_failed_ranges_only() -> None:
    h = Hist()
    h.user()
    a = h.steps(3)
    h.answer()
    h.user()
    b = h.steps(3)
    h.answer()
    h.user()
    failed = PlanContext(True, frozenset({h.snap().ids(*a)}))
    assert spans(s1(h.snap(), cfg(last_keep=0), failed)) == [b]


def test_s1_long_task_sheds_old_steps_but_keeps_the_tail() -> None:
    """One user request then 400 steps (200 groups) and no final answer."""
    h = Hist()
    h.system()
    user = h.user()
    h.steps(200, tokens=100)
    n = len(h)
    assert n == 402
    edits = s1(h.snap(), cfg(last_keep=50), PRESSURE)
    # H = n - last_keep = 352 falls between groups: the run is every group before it.
    assert spans(edits) == [(user + 1, 352)]
    # A boundary inside a group trims the run to whole groups.
    assert spans(s1(h.snap(), cfg(last_keep=51), PRESSURE)) == [(user + 1, 350)]


def test_s1_long_task_rule_needs_more_than_last_keep_messages() -> None:
    h = Hist()
    h.user()
    h.steps(25, tokens=200)  # exactly 50 messages after the user message
    config = cfg(last_keep=50, min_tool_run=1, min_compress_tokens=0)
    assert s1(h.snap(), config, PRESSURE) == []
    h.group(tokens=200)
    assert spans(s1(h.snap(), config, PRESSURE)) == [(1, 3)]


def test_s1_never_touches_a_trailing_pending_call() -> None:
    h = Hist()
    h.user()
    done = h.steps(3)
    h.pending(calls=3, answered=2)
    # last_keep=0 puts H at the very end; the pending group still stays out.
    assert spans(s1(h.snap(), cfg(last_keep=0), PRESSURE)) == [done]


# ---------------------------------------------------------------------------------------------
# S2 and S3: previews
# ---------------------------------------------------------------------------------------------


def test_s2_previews_every_large_historical_message() -> None:
    h = Hist()
    h.system(chars=BIG)
    old_user = h.user(chars=BIG)
    call, _ = h.group(chars=BIG)
    result = call + 1
    h.add("assistant", call_ids=("big",), tokens=10, chars=BIG)  # a big tool_use message
    h.add("tool", result_ids=("big",), chars=10)
    old_answer = h.answer(chars=BIG)
    h.user()
    h.answer(chars=BIG)  # the latest final answer: H, never previewed
    h.user()
    edits = s2(h.snap(), cfg(last_keep=0), PRESSURE)
    assert starts(edits) == [old_user, result, old_answer]
    assert all(e.end == e.start + 1 for e in edits)
    assert {(e.strategy, e.new_kind, e.llm) for e in edits} == {(2, "preview", False)}


def test_s2_skips_pinned_groups_previews_and_summaries() -> None:
    h = Hist()
    h.user()
    h.add("assistant", call_ids=("p",), pinned=True)
    h.add("tool", result_ids=("p",), chars=BIG)  # pinned through its call
    h.add("tool", kind="original", chars=BIG, pinned=True)
    for kind in ("preview", "large_summary", "tool_run_summary", "current_round_summary"):
        h.answer(kind=kind, chars=BIG, final=False)
    h.answer(kind="round_summary", chars=BIG)
    h.answer()
    h.user()
    assert s2(h.snap(), cfg(last_keep=0), PRESSURE) == []
    assert s3(h.snap(), cfg(last_keep=0), PRESSURE) == []


def test_s2_leaves_the_tail_and_s3_takes_it() -> None:
    h = Hist()
    h.user()
    early = h.answer(chars=BIG)
    h.user()
    late = h.answer(chars=BIG)
    h.answer()  # latest final answer
    h.answer(chars=BIG)  # after it: protected from both
    # n = 6, last_keep = 3: tail starts at 3.
    assert starts(s2(h.snap(), cfg(last_keep=3), PRESSURE)) == [early]
    edits = s3(h.snap(), cfg(last_keep=3), PRESSURE)
    assert starts(edits) == [early, late]
    assert {e.strategy for e in edits} == {3}


def test_s2_and_s3_skip_failed_messages() -> None:
    h = Hist()
    h.user()
    a = h.answer(chars=BIG)
    b = h.answer(chars=BIG)
    h.answer()
    failed = PlanContext(True, frozenset({h.snap().ids(a, a + 1)}))
    assert starts(s2(h.snap(), cfg(last_keep=0), failed)) == [b]
    assert starts(s3(h.snap(), cfg(last_keep=0), failed)) == [b]


def test_s2_long_task_previews_old_results_not_the_user_message() -> None:
    h = Hist()
    user = h.user(chars=BIG)
    for _ in range(200):
        h.group(chars=BIG)
    edits = s2(h.snap(), cfg(last_keep=50), PRESSURE)
    # Results of the groups wholly or partly below n - last_keep = 351 (odd indices 2..350).
    assert starts(edits) == list(range(2, 351, 2))
    assert user not in starts(edits)
    # S3 has the same bound here: H is the tail start.
    assert starts(s3(h.snap(), cfg(last_keep=50), PRESSURE)) == list(range(2, 351, 2))


def test_s2_s3_never_touch_the_pending_call() -> None:
    h = Hist()
    h.user()
    h.steps(3, chars=BIG)
    start, _ = h.pending(calls=2, answered=1, chars=BIG)
    for planner in (s2, s3):
        edits = planner(h.snap(), cfg(last_keep=0), PRESSURE)
        assert starts(edits) == [2, 4, 6]
        assert all(e.end <= start for e in edits)


def test_s2_without_final_answer_or_long_task_plans_nothing() -> None:
    h = Hist()
    h.user()
    h.steps(3, chars=BIG)
    assert s2(h.snap(), cfg(last_keep=10), PRESSURE) == []
    assert s3(h.snap(), cfg(last_keep=10), PRESSURE) == []


# ---------------------------------------------------------------------------------------------
# S4: previous rounds
# ---------------------------------------------------------------------------------------------


def test_s4_summarizes_previous_rounds_but_keeps_their_user_messages() -> None:
    h = Hist()
    h.system()
    u1 = h.user()
    h.steps(3, tokens=200)
    a1 = h.answer()
    u2 = h.user()
    h.steps(3, tokens=200)
    a2 = h.answer()  # the latest final answer, closing the current round
    edits = s4(h.snap(), cfg(), PRESSURE)
    assert spans(edits) == [(u1 + 1, a1 + 1)]
    assert (edits[0].strategy, edits[0].new_kind, edits[0].llm) == (4, "round_summary", True)
    # Once a newer user message arrives, round 2 is a previous round too.
    h.user()
    assert spans(s4(h.snap(), cfg(), PRESSURE)) == [(u1 + 1, a1 + 1), (u2 + 1, a2 + 1)]


def test_s4_range_ends_at_the_last_message_of_the_round() -> None:
    """A previous round is replaced up to its last message, even a step after its last answer,
    but not a system or pinned message that stands before the next user message."""
    h = Hist()
    u = h.user()
    h.answer(tokens=300)  # an intermediate final answer
    h.steps(1, tokens=300)
    h.answer()
    _, end = h.group()  # a trailing step after the round's last answer goes too
    h.system()  # the next task's system message stays
    h.user()
    assert spans(s4(h.snap(), cfg(), PRESSURE)) == [(u + 1, end)]


def test_s4_skips_rounds_with_nothing_between_user_and_answer() -> None:
    h = Hist()
    h.user()
    h.answer(tokens=5000)
    h.user()
    h.answer(kind="round_summary", tokens=5000)  # what S4 left last time
    h.user()
    h.answer(kind="round_summary", tokens=5000)
    h.answer(kind="round_summary", tokens=5000)  # only S4's own output: never again
    h.user()
    assert s4(h.snap(), cfg(), PRESSURE) == []
    assert s4(h.snap(), cfg(), COUNT_ONLY) == []


def test_s4_keeps_earlier_round_and_current_round_summaries() -> None:
    """A round S6 compressed while it was current keeps that summary (it may be compressed again
    only by S6); S4 summarizes what follows it."""
    h = Hist()
    h.user()
    crs = h.answer(kind="current_round_summary", tokens=300)
    h.steps(2, tokens=300)
    a1 = h.answer()
    h.user()
    rs = h.answer(kind="round_summary", tokens=300)
    h.steps(2, tokens=300)  # the agent went on without a new user message
    a2 = h.answer()
    h.user()
    h.answer(kind="current_round_summary", tokens=300)
    h.answer(tokens=300)  # only the answer after the kept summary: nothing to fold in
    h.user()
    assert spans(s4(h.snap(), cfg(), PRESSURE)) == [(crs + 1, a1 + 1), (rs + 1, a2 + 1)]


def test_s4_skips_rounds_holding_system_or_pinned_messages() -> None:
    h = Hist()
    h.user()
    h.steps(3, tokens=200)
    h.system()
    h.answer()
    h.user()
    h.steps(3, tokens=200)
    h.add("assistant", call_ids=("p",), tokens=200)
    h.add("tool", result_ids=("p",), tokens=200, pinned=True)
    h.answer()
    u3 = h.user()
    h.steps(3, tokens=200)
    a3 = h.answer()
    h.user()
    assert spans(s4(h.snap(), cfg(), PRESSURE)) == [(u3 + 1, a3 + 1)]


def test_s4_takes_previous_rounds_without_a_final_answer() -> None:
    """A round is previous once a newer user message exists, answered or not; the current
    round is never S4's (docs/design.md §1)."""
    h = Hist()
    u = h.user()
    _, end = h.steps(3, tokens=300)
    h.user()
    h.steps(3, tokens=300)
    assert spans(s4(h.snap(), cfg(), PRESSURE)) == [(u + 1, end)]
    assert s4(h.snap(), cfg(), PRESSURE)[0].new_kind == "round_summary"


def test_s4_token_floor_and_failed_ranges() -> None:
    h = Hist()
    u1 = h.user()
    h.steps(1, tokens=130)
    a1 = h.answer()
    u0 = h.user()
    h.steps(1, tokens=10)  # under what any summary can gain on, even with the floor waived
    h.answer()
    u2 = h.user()
    h.steps(3, tokens=200)
    a2 = h.answer()
    h.user()
    assert u0 < u2
    assert spans(s4(h.snap(), cfg(), PRESSURE)) == [(u2 + 1, a2 + 1)]
    assert spans(s4(h.snap(), cfg(), COUNT_ONLY)) == [(u1 + 1, a1 + 1), (u2 + 1, a2 + 1)]
    failed = PlanContext(False, frozenset({h.snap().ids(u1 + 1, a1 + 1)}))
    assert spans(s4(h.snap(), cfg(), failed)) == [(u2 + 1, a2 + 1)]


def test_s4_ignores_last_keep_and_h() -> None:
    h = Hist()
    u = h.user()
    h.steps(2, tokens=300)
    a = h.answer()
    h.user()
    assert spans(s4(h.snap(), cfg(last_keep=100), PRESSURE)) == [(u + 1, a + 1)]


# ---------------------------------------------------------------------------------------------
# S5: large messages in the current round
# ---------------------------------------------------------------------------------------------


def _current_round_with_large_messages() -> tuple[Hist, list[int]]:
    h = Hist()
    h.user()
    h.answer(chars=BIG)  # previous round: not S5's business
    wanted: list[int] = []
    # The latest user message, large on its own: S5 may shorten it (docs/design.md §3).
    wanted.append(h.user(chars=BIG))
    call, _ = h.group(chars=BIG)
    wanted.append(call + 1)
    wanted.append(h.add("assistant", call_ids=("w",), chars=BIG, tool_names=("write",)))
    h.add("tool", result_ids=("w",), tool_names=("write",))
    h.add("assistant", call_ids=("r",), tool_names=(RELOAD_TOOL_NAME,))
    h.add("tool", result_ids=("r",), chars=BIG, tool_names=(RELOAD_TOOL_NAME,))
    h.add("assistant", call_ids=("s",), tool_names=("context_search",))
    h.add("tool", result_ids=("s",), chars=BIG, tool_names=("context_search",))
    h.add("tool", chars=BIG, kind="preview")
    h.add("tool", chars=BIG, kind="large_summary")
    h.answer(chars=BIG, kind="tool_run_summary")
    h.answer(chars=BIG, kind="current_round_summary")
    h.answer(chars=BIG, pinned=True)
    h.system(chars=BIG)
    wanted.append(h.answer(chars=BIG))  # a large final answer in the round
    h.pending(calls=2, answered=1, chars=BIG)
    return h, wanted


def test_s5_acts_only_under_token_pressure() -> None:
    h, _ = _current_round_with_large_messages()
    assert s5(h.snap(), cfg(), COUNT_ONLY) == []


def test_s5_summarizes_large_originals_after_the_latest_user_message() -> None:
    h, wanted = _current_round_with_large_messages()
    edits = s5(h.snap(), cfg(), PRESSURE)
    assert starts(edits) == wanted
    assert all(e.end == e.start + 1 for e in edits)
    assert {(e.strategy, e.new_kind, e.llm) for e in edits} == {(5, "large_summary", True)}


def test_s5_skips_failed_messages() -> None:
    h, wanted = _current_round_with_large_messages()
    failed = PlanContext(True, frozenset({h.snap().ids(wanted[0], wanted[0] + 1)}))
    assert starts(s5(h.snap(), cfg(), failed)) == wanted[1:]


def test_s5_leaves_a_latest_step_that_fits_and_shrinks_one_that_does_not() -> None:
    """The latest step is what the model is about to read: while it fits under the target after
    S6's summary, it stays whole (its large results too); when it does not, S5 shrinks each of
    its messages a summary can gain on, large or not, so that S6 can keep it (docs/design.md §3,
    "the latest step stays last")."""
    config = cfg(max_tokens=10_000, target_ratio=0.6)  # token target 6,000

    def round_with_step(third_result_tokens: int) -> tuple[Hist, int, int]:
        h = Hist()
        h.user()
        early = h.group(chars=BIG)[0] + 1
        h.steps(3, tokens=500)
        ids = ("a", "b", "c")
        step = h.add("assistant", call_ids=ids, tool_names=("shell",) * 3, tokens=100)
        for call, tokens, chars in (
            ("a", 400, BIG),
            ("b", 400, BIG),
            ("c", third_result_tokens, 500),
        ):
            h.add("tool", result_ids=(call,), tool_names=("shell",), tokens=tokens, chars=chars)
        return h, early, step

    h, early, _ = round_with_step(300)
    assert starts(s5(h.snap(), config, PRESSURE)) == [early]
    # A third result that leaves no room under the target: S5 takes every one worth it (the
    # call message, 100 tokens, is too small to gain on).
    h, early, step = round_with_step(5_000)
    assert starts(s5(h.snap(), config, PRESSURE)) == [early, step + 1, step + 2, step + 3]


def test_s5_leaves_a_pinned_user_message_whole() -> None:
    h = Hist()
    h.user(chars=BIG, pinned=True)
    answer = h.answer(chars=BIG)
    assert starts(s5(h.snap(), cfg(), PRESSURE)) == [answer]


def test_s5_without_user_starts_after_the_leading_system_messages() -> None:
    h = Hist()
    h.system(chars=BIG)
    first = h.answer(chars=BIG)
    assert starts(s5(h.snap(), cfg(), PRESSURE)) == [first]


# ---------------------------------------------------------------------------------------------
# S6: the whole current round
# ---------------------------------------------------------------------------------------------


def test_s6_acts_only_under_token_pressure() -> None:
    h = Hist()
    h.user()
    h.steps(3)
    assert s6(h.snap(), cfg(), COUNT_ONLY) == []


def test_s6_summarizes_everything_after_the_user_message_with_a_budget() -> None:
    h = Hist()
    h.user()
    h.answer()
    u = h.user()
    h.steps(3, chars=100)  # 3 x (40 + 100) chars
    h.answer(chars=140)  # a round that ended: nothing of it is the model's next input
    edits = s6(h.snap(), cfg(current_round_ratio=0.3), PRESSURE)
    assert spans(edits) == [(u + 1, len(h))]
    e = edits[0]
    assert (e.strategy, e.new_kind, e.llm) == (6, "current_round_summary", True)
    assert e.verbatim_prefix_id is None
    assert e.char_budget == int(0.3 * 560)


def test_s6_keeps_the_latest_step_after_its_summary() -> None:
    """Mid-task, right before a model call, the context ends with the step whose results the
    model is about to read: S6 summarizes what came before it, so that the context still ends
    with those results, parallel calls and all (docs/design.md §3, "the latest step stays
    last")."""
    h = Hist()
    u = h.user()
    h.steps(3, chars=100)
    step, _ = h.group(calls=3)
    edits = s6(h.snap(), cfg(current_round_ratio=0.3), PRESSURE)
    assert spans(edits) == [(u + 1, step)]
    assert edits[0].char_budget == int(0.3 * 420)  # the budget is of what it summarizes


def test_s6_takes_a_latest_step_that_cannot_fit_and_cannot_shrink() -> None:
    """A step that leaves no room under the target even after S6's summary, and whose messages
    are all too small for S5 (or failed with it), is summarized with the rest: the bound first.
    With a message S5 can still shrink, S6 leaves the step to S5 (see the S5 tests)."""
    config = cfg(max_tokens=10_000, target_ratio=0.6)  # token target 6,000
    h = Hist()
    u = h.user()
    h.steps(3, tokens=200)
    h.group(calls=30, tokens=MIN_LLM_RANGE_TOKENS - 1)  # 31 x 255 tokens
    assert h.snap().token_count - 1_200 + MIN_LLM_RANGE_TOKENS >= config.token_target
    assert spans(s6(h.snap(), config, PRESSURE)) == [(u + 1, len(h))]
    # The same step one token larger per message: S5 can shrink it, so S6 leaves it out.
    big = Hist()
    big.user()
    big.steps(3, tokens=200)
    big_step, _ = big.group(calls=30, tokens=MIN_LLM_RANGE_TOKENS)
    assert spans(s6(big.snap(), config, PRESSURE)) == [(1, big_step)]
    # Once S5 failed on all of them, S6 takes the step too.
    failed = frozenset(big.snap().ids(k, k + 1) for k in range(big_step + 1, len(big)))
    failed |= {big.snap().ids(big_step, big_step + 1)}
    ctx = PlanContext(token_pressure=True, failed=failed)
    assert spans(s6(big.snap(), config, ctx)) == [(1, len(big))]


def test_s6_budget_never_leaves_the_summary_over_the_token_target() -> None:
    """A current round many times the window: 0.3 of it would be a summary over the window,
    which nothing could shorten again (S6 never runs on its own output alone). The budget is
    the room under the token target instead, converted at the round's characters per token
    (here a large system prompt leaves less room than the fold's budget)."""
    h = Hist()
    h.system(tokens=3_000, chars=12_000)
    h.user(tokens=100, chars=400)
    for _ in range(40):
        h.group(tokens=1_000, chars=4_000)  # 80,000 tokens, eight times the window
    h.group(tokens=10)  # the latest step, kept after the summary
    config = cfg(max_tokens=10_000, fold_keep_tokens=0, fold_budget_tokens=4_000)
    [e] = s6(h.snap(), config, PRESSURE)
    body_chars = sum(m.chars for m in h.msgs[2:-2])
    room_tokens = config.token_target - 3_100 - 20 - TAG_TOKENS
    assert room_tokens < config.fold_budget_tokens
    assert e.char_budget is not None
    assert e.char_budget < int(0.3 * body_chars)  # the old budget, over the window
    # The body holds 40 + 2 x 40 characters per 1,000 + 2 x 10 tokens.
    assert e.char_budget == int(room_tokens * body_chars / e.replaced_tokens)
    # A round whose 0.3 fits under the target keeps the design's share exactly.
    small = Hist()
    small.user()
    small.steps(4, chars=100)
    assert s6(small.snap(), config, PRESSURE)[0].char_budget == int(0.3 * 420)


def test_s6_budget_follows_the_token_target_like_the_folds() -> None:
    """A long task's round: 0.3 of it and the room under the target are both more than the
    fold's budget, so the summary is held to `fold_budget_tokens` (at the round's characters
    per token), leaving room for many steps before the next compression (docs/design.md §3)."""
    h = Hist()
    h.system(tokens=100, chars=400)
    h.user(tokens=100, chars=400)
    for _ in range(12):
        h.group(tokens=1_000, chars=4_000)  # 24,000 tokens: 0.3 of it is 7,200 tokens
    h.group(tokens=10)  # the latest step, kept after the summary
    config = cfg(max_tokens=20_000)
    [e] = s6(h.snap(), config, PRESSURE)
    assert e.char_budget is not None
    body_chars = sum(m.chars for m in h.msgs[2:-2])
    room_tokens = config.token_target - 200 - 20 - TAG_TOKENS
    deep = int(config.fold_budget_tokens * body_chars / e.replaced_tokens)
    assert config.fold_budget_tokens < min(0.3 * e.replaced_tokens, room_tokens)
    assert e.char_budget == deep
    # A caller's larger fold budget raises S6's cap with it, up to 0.3 of the round.
    roomy = cfg(max_tokens=20_000, fold_keep_tokens=0, fold_budget_tokens=11_000)
    assert s6(h.snap(), roomy, PRESSURE)[0].char_budget == int(0.3 * body_chars)


def test_s6_budget_leaves_room_for_what_arrives_before_it_commits() -> None:
    """A compression beside the agent (`PlanContext.arriving`): the room under the target is
    what is left once the appends expected before the commit are in, so that the summary
    lands under the target with them rather than a pass short of it."""
    h = Hist()
    h.system(tokens=3_000, chars=12_000)
    h.user(tokens=100, chars=400)
    for _ in range(40):
        h.group(tokens=1_000, chars=4_000)
    h.group(tokens=10)  # the latest step, kept after the summary
    # The fold's budget set above the room, so that the room is what holds the summary.
    config = cfg(max_tokens=10_000, fold_keep_tokens=0, fold_budget_tokens=4_000)
    [alone] = s6(h.snap(), config, PRESSURE)
    [beside] = s6(h.snap(), config, PlanContext(token_pressure=True, arriving=2_000))
    body_chars = sum(m.chars for m in h.msgs[2:-2])
    room_tokens = config.token_target - 3_100 - 20 - 2_000 - TAG_TOKENS
    assert beside.char_budget == int(room_tokens * body_chars / beside.replaced_tokens)
    assert alone.char_budget is not None and beside.char_budget < alone.char_budget
    assert beside.replaced_ids == alone.replaced_ids  # the same range, summarized shorter


def test_s6_budget_is_at_least_one() -> None:
    h = Hist()
    h.user()
    h.answer(chars=0, tokens=MIN_LLM_RANGE_TOKENS)
    assert s6(h.snap(), cfg(), PRESSURE)[0].char_budget == 1


def test_s6_leaves_a_round_too_small_to_gain_on() -> None:
    """docs/design.md §2: no range is sent to the summarizer when it cannot gain."""
    h = Hist()
    h.user()
    h.answer(tokens=MIN_LLM_RANGE_TOKENS - 1)
    assert s6(h.snap(), cfg(), PRESSURE) == []


def test_s6_keeps_the_trailing_pending_call_out() -> None:
    h = Hist()
    u = h.user()
    h.steps(2)
    pending, _ = h.pending(calls=3, answered=2)
    assert spans(s6(h.snap(), cfg(), PRESSURE)) == [(u + 1, pending)]


def test_s6_with_only_a_pending_call_plans_nothing() -> None:
    h = Hist()
    h.user()
    h.pending()
    assert s6(h.snap(), cfg(), PRESSURE) == []


@pytest.mark.parametrize("protect", ["system", "pinned", "pinned_result"])
def test_s6_acts_only_after_the_last_system_or_pinned_message(protect: str) -> None:
    h = Hist()
    h.user()
    h.steps(2)
    if protect == "system":
        h.system()
    elif protect == "pinned":
        h.answer(pinned=True)
    else:
        h.add("assistant", call_ids=("p",))
        h.add("tool", result_ids=("p",), pinned=True)
    after = len(h)
    h.steps(3)
    assert spans(s6(h.snap(), cfg(), PRESSURE)) == [(after, len(h) - 2)]


def test_s6_pinned_pending_call_leaves_nothing() -> None:
    h = Hist()
    h.user()
    h.steps(2)
    ids = ("p0", "p1")
    h.add("assistant", call_ids=ids, pinned=True)
    h.add("tool", result_ids=("p0",))
    assert s6(h.snap(), cfg(), PRESSURE) == []


def test_s6_keeps_a_small_earlier_summary_as_verbatim_prefix() -> None:
    h = Hist()
    u = h.user()
    prefix = h.answer(kind="current_round_summary", tokens=100, chars=400)
    h.steps(3, chars=100)  # 2 x 140 chars, and the latest step
    edits = s6(h.snap(), cfg(max_tokens=10_000, target_ratio=0.6), PRESSURE)
    assert spans(edits) == [(u + 1, len(h) - 2)]
    assert edits[0].verbatim_prefix_id == h.msgs[prefix].id
    assert edits[0].char_budget == int(0.3 * 280)  # the prefix is not counted


def test_s6_summarizes_the_prefix_too_when_keeping_it_cannot_reach_the_target() -> None:
    """Protected messages (the system prompts of many tasks) leave little room: summarizing
    only the newest steps would shave a little at every call and never reach the target."""
    config = cfg(max_tokens=10_000, target_ratio=0.6)  # token target 6,000
    h = Hist()
    h.system(tokens=5000)
    u = h.user()
    h.answer(kind="current_round_summary", tokens=900)
    h.steps(2, tokens=200)
    (edit,) = s6(h.snap(), config, PRESSURE)
    assert spans([edit]) == [(u + 1, len(h) - 2)] and edit.verbatim_prefix_id is None
    # With room under the target, the same prefix stays verbatim.
    roomy = cfg(max_tokens=20_000, target_ratio=0.6)
    assert s6(h.snap(), roomy, PRESSURE)[0].verbatim_prefix_id == h.msgs[u + 1].id


def test_s6_summarizes_an_oversized_prefix_too() -> None:
    # token_target = 6000, current_round_ratio 0.3: a prefix above 1800 tokens is summarized
    # (the fold's budget, S6's cap too, set above 0.3 of the round).
    config = cfg(
        max_tokens=10_000,
        target_ratio=0.6,
        current_round_ratio=0.3,
        fold_keep_tokens=0,
        fold_budget_tokens=5_000,
    )
    h = Hist()
    u = h.user()
    h.answer(kind="current_round_summary", tokens=1801, chars=7000)
    h.steps(2, tokens=200, chars=100)
    edits = s6(h.snap(), config, PRESSURE)
    assert spans(edits) == [(u + 1, len(h) - 2)]
    assert edits[0].verbatim_prefix_id is None
    assert edits[0].char_budget == int(0.3 * 7140)
    # Exactly at the bound the prefix is still kept.
    h2 = Hist()
    h2.user()
    kept = h2.answer(kind="current_round_summary", tokens=1800)
    h2.steps(2, tokens=200)
    assert s6(h2.snap(), config, PRESSURE)[0].verbatim_prefix_id == h2.msgs[kept].id


@pytest.mark.parametrize("tokens", [10, 5000])
def test_s6_never_resummarizes_only_its_own_output(tokens: int) -> None:
    h = Hist()
    h.user()
    h.answer(kind="current_round_summary", tokens=tokens)
    assert s6(h.snap(), cfg(), PRESSURE) == []
    h.answer(kind="current_round_summary", tokens=tokens)
    assert s6(h.snap(), cfg(), PRESSURE) == []


def test_s6_single_message_that_is_not_its_own_output_is_enough() -> None:
    h = Hist()
    u = h.user()
    h.answer(kind="tool_run_summary", final=False, tokens=MIN_LLM_RANGE_TOKENS)
    assert spans(s6(h.snap(), cfg(), PRESSURE)) == [(u + 1, u + 2)]


def test_s6_skips_a_failed_range() -> None:
    h = Hist()
    u = h.user()
    h.steps(3)
    assert spans(s6(h.snap(), cfg(), PRESSURE)) == [(u + 1, len(h) - 2)]
    failed = PlanContext(True, frozenset({h.snap().ids(u + 1, len(h) - 2)}))
    assert s6(h.snap(), cfg(), failed) == []


def test_s6_without_user_starts_after_the_leading_system_messages() -> None:
    h = Hist()
    h.system()
    h.system()
    h.steps(3)
    assert spans(s6(h.snap(), cfg(), PRESSURE)) == [(2, 6)]


# ---------------------------------------------------------------------------------------------
# The long task of docs/design.md §3: one request, 400 steps
# ---------------------------------------------------------------------------------------------


def test_long_task_history_part_is_open_to_s1_to_s3_and_the_tail_is_not() -> None:
    h = Hist()
    h.system()
    user = h.user()
    for k in range(200):
        h.group(tokens=100, chars=BIG if k % 2 else 40)
    config = cfg(last_keep=50, min_compress_tokens=1000)
    tail = len(h) - 50
    for planner in (s1, s2, s3):
        edits = planner(h.snap(), config, PRESSURE)
        assert edits
        assert all(e.start > user and e.end <= tail for e in edits)
    # The LLM strategies of the current round still see the whole round, but the latest step.
    assert spans(s6(h.snap(), config, PRESSURE)) == [(user + 1, len(h) - 2)]


def test_planners_are_deterministic() -> None:
    h, _ = _current_round_with_large_messages()
    for planner in PLANNERS.values():
        assert planner(h.snap(), cfg(last_keep=0), PRESSURE) == planner(
            h.snap(), cfg(last_keep=0), PRESSURE
        )


# ---------------------------------------------------------------------------------------------
# The fold (strategy 7): the history before the current round
# ---------------------------------------------------------------------------------------------

FALLBACK = PlanContext(token_pressure=True, count_pressure=False, fallback=True)


def _fold_cfg(**changes: Any) -> AutoContextConfig:
    return cfg(**{"fold_keep_tokens": 0, "fold_budget_tokens": 300, **changes})


def test_fold_takes_the_history_around_system_and_pinned_messages() -> None:
    """Many tasks, each with its own system message: one fold summary, not one per stretch;
    the system and pinned messages keep their places and the summary takes the last folded
    message's."""
    h = Hist()
    h.system()
    u1 = h.user()
    h.steps(2, tokens=200)  # a task without a final answer
    s2_ = h.system()
    h.user()
    pinned, pinned_end = h.group(tokens=200, pinned=True)
    h.answer(tokens=300)
    last = h.answer(kind="round_summary", tokens=200)
    current = h.user()
    h.steps(1)
    (edit,) = s7(h.snap(), _fold_cfg(), PRESSURE)
    members = [i for i in range(u1, current) if i != s2_ and not pinned <= i < pinned_end]
    assert (edit.start, edit.end) == (u1, last + 1)
    assert list(edit.member_indices) == members
    assert edit.replaced_ids == tuple(h.msgs[i].id for i in members)
    assert edit.span_ids == h.snap().ids(u1, last + 1)  # what apply re-checks
    assert edit.replaced_tokens == sum(h.msgs[i].tokens for i in members)
    assert (edit.strategy, edit.new_kind, edit.llm, edit.token_budget) == (
        7,
        "history_summary",
        True,
        300,
    )


def test_fold_keeps_the_most_recent_whole_rounds_within_its_keep() -> None:
    h = Hist()
    u1 = h.user(tokens=100)
    h.answer(tokens=900)  # 1,000 tokens
    u2 = h.user(tokens=100)
    h.answer(tokens=400)  # 500
    u3 = h.user(tokens=100)
    h.answer(tokens=300)  # 400
    h.user()
    assert s7(h.snap(), _fold_cfg(fold_keep_tokens=899), PRESSURE)[0].end == u3
    # The two most recent rounds fit in 900 tokens together; the third does not.
    assert s7(h.snap(), _fold_cfg(fold_keep_tokens=900), PRESSURE)[0].end == u2
    (edit,) = s7(h.snap(), _fold_cfg(fold_keep_tokens=900), PRESSURE)
    assert (edit.start, edit.members) == (u1, None)  # a contiguous range
    # Everything fits: nothing is left to fold.
    assert s7(h.snap(), _fold_cfg(fold_keep_tokens=1900), PRESSURE) == []
    # The fallback keeps no round.
    assert s7(h.snap(), _fold_cfg(fold_keep_tokens=1900), FALLBACK)[0].end == u3 + 2


def test_fold_beside_the_agent_keeps_less_by_what_arrives_before_it_commits() -> None:
    """What the agent appends while the fold's summary is written is the newest of the recent
    rounds when it commits: the fold keeps that much less of the older ones."""
    h = Hist()
    u1 = h.user(tokens=100)
    h.answer(tokens=900)
    u2 = h.user(tokens=100)
    h.answer(tokens=400)
    u3 = h.user(tokens=100)
    h.answer(tokens=300)
    h.user()
    config = _fold_cfg(fold_keep_tokens=900)
    assert s7(h.snap(), config, PRESSURE)[0].end == u2
    beside = PlanContext(token_pressure=True, arriving=500)
    assert s7(h.snap(), config, beside)[0].end == u3  # 400 kept, 500 to come
    assert s7(h.snap(), config, PlanContext(token_pressure=True, arriving=900))[0].end == u3 + 2
    assert s7(h.snap(), config, beside)[0].start == u1


def test_fold_takes_the_previous_fold_but_never_it_alone() -> None:
    h = Hist()
    h.system()
    old = h.answer(kind="history_summary", tokens=600)
    h.user()
    h.answer(tokens=400)
    h.user()
    (edit,) = s7(h.snap(), _fold_cfg(), PRESSURE)
    assert edit.start == old and edit.end == old + 3
    h2 = Hist()
    h2.system()
    h2.answer(kind="history_summary", tokens=6000)
    h2.user()
    assert s7(h2.snap(), _fold_cfg(), PRESSURE) == []
    assert s7(h2.snap(), _fold_cfg(), FALLBACK) == []


def test_fold_floor_applies_to_the_whole_range_never_to_a_round() -> None:
    h = Hist()
    for _ in range(5):
        h.user(tokens=50)
        h.answer(tokens=60)  # 110 tokens a round, 550 in all: over the floor of 500
    h.user()
    assert len(s7(h.snap(), _fold_cfg(), PRESSURE)) == 1
    # 440 tokens: under the floor with tokens as the pressure; the floor is waived under count
    # pressure, but not below what a summary can gain on.
    h2 = Hist()
    for _ in range(4):
        h2.user(tokens=50)
        h2.answer(tokens=60)
    h2.user()
    assert s7(h2.snap(), _fold_cfg(), PRESSURE) == []
    assert len(s7(h2.snap(), _fold_cfg(), COUNT_ONLY)) == 1
    h3 = Hist()
    h3.user(tokens=50)
    h3.answer(tokens=60)
    h3.user()
    assert s7(h3.snap(), _fold_cfg(), COUNT_ONLY) == []


def test_fold_never_touches_the_current_round_and_needs_a_user_message() -> None:
    h = Hist()
    h.system()
    h.steps(5, tokens=300)
    assert s7(h.snap(), _fold_cfg(), PRESSURE) == []  # one long task: S1-S3, S5 and S6's
    u = h.user()
    h.steps(5, tokens=300)
    (edit,) = s7(h.snap(), _fold_cfg(), PRESSURE)
    assert edit.end <= u


def test_fold_skips_a_failed_range_except_in_the_fallback() -> None:
    h = Hist()
    h.user(tokens=300)
    h.answer(tokens=400)
    h.user()
    (edit,) = s7(h.snap(), _fold_cfg(), PRESSURE)
    failed = PlanContext(True, frozenset({edit.replaced_ids}))
    assert s7(h.snap(), _fold_cfg(), failed) == []
    # The offline fallback retries exactly what failed with the configured summarizer.
    failed_fallback = PlanContext(True, failed.failed, count_pressure=False, fallback=True)
    assert s7(h.snap(), _fold_cfg(), failed_fallback) == [edit]


def test_s5_summarizes_only_what_the_target_needs() -> None:
    """S5 takes the current round's large messages oldest first, only as many as are expected
    to land the context `fold_keep_tokens` under the token target (issue: it summarized all of
    a step's qualifying messages at once); all of them when even all would not."""
    config = cfg(max_tokens=50_000, target_ratio=0.6)  # token target 30,000
    room = config.token_target - config.fold_keep_tokens

    def round_of(large: int, tokens: int) -> tuple[Hist, list[int]]:
        h = Hist()
        h.user()
        firsts = [h.group(chars=BIG, tokens=tokens)[0] + 1 for _ in range(large)]
        h.steps(2, tokens=200)
        return h, firsts

    h, firsts = round_of(6, 2_500)
    snap = h.snap()
    edits = s5(snap, config, PRESSURE)
    assert 0 < len(edits) < len(firsts)
    assert starts(edits) == firsts[: len(edits)]  # oldest first
    gains = [e.estimated_gain for e in edits]
    assert snap.token_count - sum(gains) < room <= snap.token_count - sum(gains[:-1])
    # When all of them would not land there, every one is taken.
    small = cfg(max_tokens=10_000, target_ratio=0.6)
    h, firsts = round_of(6, 600)
    snap = h.snap()
    edits = s5(snap, small, PRESSURE)
    room = small.token_target - small.fold_keep_tokens
    assert snap.token_count - sum(e.estimated_gain for e in edits) >= room
    assert starts(edits) == firsts
