"""The ladder end to end on real PostgreSQL: apply, offload, lineage, events, reload, the loop."""

from __future__ import annotations

import dataclasses
import json
import random
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from autoctx import (
    AutoContextConfig,
    AutoContextMemory,
    InvalidOffloadId,
    Msg,
    OfflineSummarizer,
    OffloadNotFound,
    RuntimeOptions,
    SummaryRequest,
    SummaryResult,
    ToolUseBlock,
)
from autoctx import _compressor as compressor
from autoctx._intake import count_tokens
from autoctx._strategies import PLANNERS, registry
from autoctx._tags import OFFLOAD_TAG_RE, tag_ids
from autoctx._tokens import TokenCounter
from autoctx._transcript import render_transcript
from tests.dbsql import handle_of, sql
from tests.histories import SMALL, file_dump, long_task, multi_round, one_heavy_round, tool_group
from tests.invariants import (
    assert_every_original_reachable,
    assert_totals_match,
    assert_valid_openai_chat,
    originals,
)

Open = Callable[..., AutoContextMemory]


class CountingSummarizer:
    """The offline summarizer, counting its calls; optionally running a hook mid-call."""

    answers_shared_requests = True  # as the offline summarizer it passes requests to

    def __init__(self, hook: Callable[[SummaryRequest], None] | None = None) -> None:
        self.inner = OfflineSummarizer()
        self.calls = 0
        self.requests: list[SummaryRequest] = []
        self.hook = hook

    def summarize(self, request: SummaryRequest) -> SummaryResult:
        self.calls += 1
        self.requests.append(request)
        if self.hook is not None:
            hook, self.hook = self.hook, None
            hook(request)
        return self.inner.summarize(request)


def check_all(mem: AutoContextMemory) -> None:
    assert_valid_openai_chat(mem.to_openai())
    assert_totals_match(mem)
    assert_every_original_reachable(mem)


def test_history_compresses_under_target_with_every_step_recorded(open_memory: Open) -> None:
    mem = open_memory(config=SMALL)
    added = mem.add(multi_round(1, rounds=4, steps=8))
    assert mem.needs_compression()
    events = mem.compress_if_needed()
    assert events and all(e.status == "applied" for e in events)
    assert {e.strategy for e in events} <= {1, 2, 3, 4, 7}
    assert mem.token_count() < SMALL.token_target or mem.message_count() < SMALL.msg_target
    assert [e.id for e in mem.events()] == [e.id for e in events]
    check_all(mem)
    # Originals are untouched and in order.
    assert [m.id for m in originals(mem)] == [m.id for m in added]
    assert [m.content for m in originals(mem)] == [m.content for m in added]


def test_preview_keeps_role_call_id_and_name_and_ends_with_the_tag(open_memory: Open) -> None:
    # No tool run is long enough for S1, so the cheapest work left is S2's previews (one
    # round: no fold, which previews of folded rounds would give way to).
    mem = open_memory(config=dataclasses.replace(SMALL, min_tool_run=1000))
    mem.add(multi_round(2, rounds=1, steps=30))
    events = mem.compress_if_needed()
    previews = [m for m in mem.messages() if m.kind == "preview"]
    assert previews, [e.strategy for e in events]
    for p in previews:
        event = next(e for e in events if e.summary_message_id == p.id)
        assert event.strategy in (2, 3)
        text = p.tool_results[-1].output_text if p.role == "tool" else p.text
        last_line = text.splitlines()[-1]
        handle = handle_of(mem, event.offload_uuid)
        assert last_line == f"<!-- offload {handle} -->"
        (original,) = mem.reload(str(event.offload_uuid))
        assert original.role == p.role
        assert mem.reload(handle) == mem.reload(str(handle)) == [original]
        if p.role == "tool":
            assert [r.tool_use_id for r in p.tool_results] == [
                r.tool_use_id for r in original.tool_results
            ]
            assert [r.name for r in p.tool_results] == [r.name for r in original.tool_results]
            assert text.startswith(
                original.tool_results[0].output_text[: SMALL.preview_chars] + "...\n"
            )


def test_event_offload_and_lineage_rows_agree(open_memory: Open) -> None:
    mem = open_memory(config=SMALL)
    mem.add(multi_round(3, rounds=4, steps=8))
    events = mem.compress_if_needed()
    for e in events:
        rows = sql(
            mem,
            "select replaced_id, ordinal from lineage where session_id = :s and summary_id = :m "
            "order by ordinal",
            s=mem.session_id,
            m=e.summary_message_id,
        )
        assert tuple(r.replaced_id for r in rows) == e.replaced_ids
        offload_ids = sql(
            mem,
            "select message_ids from offloads where session_id = :s and uuid = :u",
            s=mem.session_id,
            u=e.offload_uuid,
        )[0].message_ids
        assert tuple(offload_ids) == e.replaced_ids
        assert [m.id for m in mem.reload(str(e.offload_uuid))] == list(e.replaced_ids)
        # The summary's tag names the offload by its handle, which reloads the same messages.
        (summary,) = [m for m in mem.messages() if m.id == e.summary_message_id]
        handle = handle_of(mem, e.offload_uuid)
        assert tag_ids(render_transcript([summary], keep_tags=True))[-1] == str(handle)
        assert [m.id for m in mem.reload(handle)] == list(e.replaced_ids)
        assert e.tokens_after < e.tokens_before
    # Handles are unique within the session and the session's counter is past every one.
    handles = [
        r.handle
        for r in sql(mem, "select handle from offloads where session_id = :s", s=mem.session_id)
    ]
    assert len(set(handles)) == len(handles) == len([e for e in events if e.offload_uuid])
    (row,) = sql(mem, "select next_handle from sessions where session_id = :s", s=mem.session_id)
    assert row.next_handle > max(handles)


def test_long_single_task_sheds_old_tool_output_without_an_llm(open_memory: Open) -> None:
    summarizer = CountingSummarizer()
    config = AutoContextConfig(
        max_tokens=200_000,
        msg_threshold=10_000,
        last_keep=20,
        large_payload_chars=2000,
        preview_chars=100,
        reload_page_chars=1500,
        min_tool_run=10_000,
    )
    mem = open_memory(config=config, summarizer=summarizer)
    mem.add(long_task(4, steps=200))
    before = mem.token_count()
    assert before >= config.token_trigger, "the history must be over the token trigger"
    events = mem.compress_if_needed()
    applied = [e for e in events if e.status == "applied"]
    # Masking and the previews: the rungs no LLM writes.
    assert applied and {e.strategy for e in applied} <= registry.PREVIEW_STRATEGIES == {2, 3, 8}
    assert summarizer.calls == 0
    assert mem.token_count() < config.token_target
    # Only the last `last_keep` messages keep their full output.
    working = mem.messages()
    assert all(
        m.payload_chars <= config.large_payload_chars for m in working[2 : -config.last_keep]
    )
    assert any(m.payload_chars > config.large_payload_chars for m in working[-config.last_keep :])
    check_all(mem)


def test_second_call_without_new_messages_does_nothing(open_memory: Open) -> None:
    summarizer = CountingSummarizer()
    tight = AutoContextConfig(
        max_tokens=4000,
        msg_threshold=20,
        last_keep=4,
        min_compress_tokens=100,
        large_payload_chars=1000,
        preview_chars=50,
        reload_page_chars=500,
    )
    mem = open_memory(config=tight, summarizer=summarizer)
    mem.add(long_task(5, steps=40))
    first = mem.compress_if_needed()
    assert first
    calls, version = summarizer.calls, mem.version()
    assert mem.compress_if_needed() == []
    assert summarizer.calls == calls
    assert mem.version() == version


def test_appends_during_the_llm_call_are_kept_after_the_summary(
    open_memory: Open, session_id: str
) -> None:
    other = open_memory()

    def append_meanwhile(_: SummaryRequest) -> None:
        other.add([Msg.user("a late question"), Msg.assistant("a late answer")])

    summarizer = CountingSummarizer(hook=append_meanwhile)
    mem = open_memory(config=SMALL, summarizer=summarizer)
    mem.add(multi_round(6, rounds=4, steps=8))
    events = mem.compress_if_needed()
    assert summarizer.calls >= 1
    assert any(e.status == "applied" and e.strategy in (1, 4, 5, 6, 7) for e in events)
    texts = [m.text for m in mem.messages()]
    assert texts[-2:] == ["a late question", "a late answer"]
    check_all(mem)


def test_a_compression_that_lost_the_race_records_a_conflict(open_memory: Open) -> None:
    rival = open_memory(config=SMALL)

    def compress_meanwhile(_: SummaryRequest) -> None:
        rival.compress_if_needed()

    mem = open_memory(config=SMALL, summarizer=CountingSummarizer(hook=compress_meanwhile))
    # Only LLM work: no large payloads, so S2/S3 find nothing and S1 asks the summarizer.
    mem.add(multi_round(7, rounds=4, steps=8, big_every=10_000))
    events = mem.compress_if_needed()
    statuses = [e.status for e in events]
    assert "conflict" in statuses
    conflict = next(e for e in events if e.status == "conflict")
    assert conflict.tokens_before == conflict.tokens_after
    assert "changed" in (conflict.error or "")
    check_all(mem)


def test_reload_is_scoped_to_the_session(open_memory: Open) -> None:
    mem = open_memory(config=SMALL)
    mem.add(multi_round(8, rounds=3, steps=6))
    event = mem.compress_if_needed()[0]
    stranger = open_memory(sid=f"stranger-{uuid.uuid4().hex[:6]}", config=SMALL)
    with pytest.raises(OffloadNotFound):
        stranger.reload(str(event.offload_uuid))
    call = {
        "id": "c",
        "function": {"name": "context_reload", "arguments": f'{{"uuid": "{event.offload_uuid}"}}'},
    }
    unknown = {
        "id": "c",
        "function": {"name": "context_reload", "arguments": f'{{"uuid": "{uuid.uuid4()}"}}'},
    }
    assert stranger.handle_tool_call(call) == stranger.handle_tool_call(unknown)
    assert "No offloaded context with that id in this session" in stranger.handle_tool_call(call)
    assert "No offloaded context" not in mem.handle_tool_call(call)
    # By handle: the stranger has no offload, so its handle 1 names nothing either.
    by_handle = {
        "id": "c",
        "function": {"name": "context_reload", "arguments": json.dumps({"offload": 1})},
    }
    assert stranger.handle_tool_call(by_handle) == stranger.handle_tool_call(unknown)
    with pytest.raises(OffloadNotFound):
        stranger.reload(1)
    assert "No offloaded context" not in mem.handle_tool_call(by_handle)


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("", InvalidOffloadId),
        ("   ", InvalidOffloadId),
        ("not-a-uuid", InvalidOffloadId),
        ("123e4567-e89b-12d3-a456-426614174000'; drop table messages; --", InvalidOffloadId),
        ("12; drop table messages", InvalidOffloadId),
        ("0", InvalidOffloadId),
        ("-1", InvalidOffloadId),
        ("99999999999999999999", InvalidOffloadId),
    ],
)
def test_reload_refuses_malformed_ids(
    open_memory: Open, value: str, error: type[Exception]
) -> None:
    with pytest.raises(error):
        open_memory().reload(value)


def test_reload_tool_answers_are_distinct_and_paged(open_memory: Open) -> None:
    mem = open_memory(config=SMALL)
    mem.add(multi_round(9, rounds=4, steps=8))
    events = mem.compress_if_needed()
    big = max(events, key=lambda e: e.tokens_before - e.tokens_after)

    def ask(args: str) -> str:
        return mem.handle_tool_call({"function": {"name": "context_reload", "arguments": args}})

    answers = {
        "missing": ask("{}"),
        "empty": ask('{"uuid": ""}'),
        "malformed": ask('{"uuid": "xyz"}'),
        "unknown": ask(f'{{"uuid": "{uuid.uuid4()}"}}'),
        "bad json": ask("{uuid"),
        "handle not a number": ask('{"offload": true}'),
        "handle and uuid": ask(f'{{"offload": 1, "uuid": "{uuid.uuid4()}"}}'),
    }
    assert len(set(answers.values())) == len(answers), answers
    version = mem.version()
    # The biggest offload is longer than a page: read it page by page and put it back together.
    pages, offset = [], 0
    while True:
        answer = ask(f'{{"uuid": "{big.offload_uuid}", "offset": {offset}}}')
        if "\n[page: characters " not in answer:
            pages.append(answer)
            break
        page, footer = answer.rsplit("\n[page: characters ", 1)
        assert len(page) <= SMALL.reload_page_chars
        pages.append(page)
        offset = int(footer.rsplit("offset=", 1)[1].split(" ")[0])
    assert len(pages) > 1
    full = render_transcript(mem.reload(str(big.offload_uuid)), keep_tags=True)
    assert "".join(pages) == full
    # The handle (the number its tag shows) answers the same pages as the uuid.
    handle = handle_of(mem, big.offload_uuid)
    assert ask(json.dumps({"offload": handle})) == ask(json.dumps({"uuid": str(big.offload_uuid)}))
    assert ask(json.dumps({"offload": str(handle)})) == ask(json.dumps({"offload": handle}))
    tool, search = mem.tools()
    assert (tool["function"]["name"], search["function"]["name"]) == (
        "context_reload",
        "context_search",
    )
    # offload (or an older tag's uuid), or message_id for a search hit (issue 14): none is
    # required on its own.
    assert set(tool["function"]["parameters"]["properties"]) >= {
        "offload",
        "uuid",
        "offset",
        "message_id",
    }
    # Reloading never changes the working context.
    assert mem.version() == version
    # Error answers land in the context: they must not look like offload markers.
    assert all(
        not OFFLOAD_TAG_RE.search(a) and "CONTEXT_OFFLOAD" not in a for a in answers.values()
    )


def test_reload_pages_by_message(open_memory: Open) -> None:
    mem = open_memory(config=SMALL)
    mem.add(multi_round(10, rounds=4, steps=8))
    event = max(mem.compress_if_needed(), key=lambda e: len(e.replaced_ids))
    everything = mem.reload(str(event.offload_uuid))
    assert mem.reload(str(event.offload_uuid), offset=1, limit=2) == everything[1:3]


def test_plan_hint_reaches_the_summarizer_last(open_memory: Open) -> None:
    summarizer = CountingSummarizer()
    mem = open_memory(config=SMALL, summarizer=summarizer)
    mem.set_plan(
        {
            "goal": "Ship the parser rewrite",
            "steps": [
                {"title": "port tests", "state": "done"},
                {"title": "port code", "state": "in_progress"},
            ],
            "expected_outcome": "all tests green",
        }
    )
    mem.add(multi_round(11, rounds=4, steps=8, big_every=10_000))
    mem.compress_if_needed()
    assert summarizer.requests
    for request in summarizer.requests:
        assert request.plan_hint and "Ship the parser rewrite" in request.plan_hint


def test_compression_survives_a_restart(open_memory: Open, session_id: str) -> None:
    mem = open_memory(config=SMALL)
    mem.add(multi_round(12, rounds=4, steps=8))
    mem.compress_if_needed()
    before: list[dict[str, Any]] = mem.to_openai()
    mem.close()
    again = open_memory(config=SMALL)
    assert again.to_openai() == before
    check_all(again)


def test_the_kept_snapshot_always_equals_a_fresh_read(open_memory: Open) -> None:
    """The store keeps its last snapshot and splices its own applies into it; whatever happens
    (appends, compressions, another writer's compression), it must equal a full read."""
    from autoctx._store.store import SessionStore

    mem = open_memory(config=SMALL)
    rival = open_memory(config=SMALL)
    kept = mem._store

    def fresh() -> object:
        return SessionStore(mem.engine, mem.session_id).snapshot()

    history = multi_round(13, rounds=6, steps=8)
    for chunk in (history[:40], history[40:90], history[90:]):
        mem.add(chunk)
        assert kept.snapshot() == fresh()  # appends only: incremental read
        mem.compress_if_needed()
        assert kept.snapshot() == fresh()  # own applies: spliced
    rival.add(Msg.user("x " * 4000))
    rival.add(Msg.assistant("y"))
    rival.compress_if_needed()
    assert kept.snapshot() == fresh()  # someone else's events: full read


def test_a_fold_around_kept_messages_keeps_the_snapshot_and_the_order(open_memory: Open) -> None:
    """Tasks each opened by their own system message, one with a pinned tool group: the fold
    replaces the history around them with one summary at the place of the last folded message,
    and the store's spliced snapshot (with the working-set positions it keeps) equals a full
    read."""
    from autoctx._store.store import SessionStore

    config = dataclasses.replace(SMALL, max_tokens=12_000, large_payload_chars=100_000)
    mem = open_memory(config=config)
    kept = mem._store
    for task in range(4):
        mem.add(Msg.system(f"Task {task}: you are the migration agent."))
        rounds = multi_round(40 + task, rounds=2, steps=4, big_every=10_000)[1:]
        if task == 1:
            rounds[2] = dataclasses.replace(rounds[2], pinned=True)  # a call: pins its group
        mem.add(rounds)
    mem.add(Msg.user("Now the summary of all of it."))
    events = [e for e in mem.compress_if_needed() if e.status == "applied"]
    folds = [e for e in events if e.strategy == 7]
    assert folds, [(e.strategy, e.status) for e in events]
    working = mem.messages()
    (summary,) = [m for m in working if m.kind == "history_summary"]
    # Every system message and the pinned group stay, in order; the summary sits after the
    # last system message that precedes folded history, before the kept rounds.
    systems = [m.text for m in working if m.role == "system"]
    assert systems == [f"Task {t}: you are the migration agent." for t in range(4)]
    assert sum(m.pinned for m in working) == 1
    replaced = set(folds[-1].replaced_ids)
    assert not replaced & {m.id for m in working}
    # It folded around them: system messages stood between the messages it replaced.
    between = [m for m in working if m.role == "system" and min(replaced) < (m.id or 0)]
    assert [m for m in between if (m.id or 0) < max(replaced)], "a scattered fold"
    assert kept.snapshot() == SessionStore(mem.engine, mem.session_id).snapshot()
    positions = [
        r.position
        for r in sql(
            mem,
            "select position from working_set where session_id = :s order by position",
            s=mem.session_id,
        )
    ]
    assert kept._snapshot is not None and list(kept._snapshot.positions) == positions
    assert summary.id == folds[-1].summary_message_id
    # docs/design.md §3: the history holds no more than the kept rounds, the fold's summary
    # (its budget, a margin and the tag) and the protected messages.
    current = max(i for i, m in enumerate(working) if m.role == "user")
    history = sum(m.tokens or 0 for m in working[:current] if m.role != "system" and not m.pinned)
    budget = config.fold_budget_tokens
    assert history <= config.fold_keep_tokens + budget + max(16, budget // 10) + 40, history
    check_all(mem)


def test_s5_shortens_a_large_current_user_message_and_keeps_its_head(open_memory: Open) -> None:
    """docs/design.md §3: a pasted log as the user's request: its first `preview_chars`
    characters stay verbatim, the rest is summarized, and the tag reloads the original."""
    config = dataclasses.replace(SMALL, max_tokens=6_000)
    summarizer = CountingSummarizer()
    mem = open_memory(config=config, summarizer=summarizer)
    pasted = "Why does the build fail? Here is the log:\n" + file_dump(random.Random(51), 300)
    (original,) = mem.add(Msg.user(pasted))
    assert len(pasted) > config.large_payload_chars and mem.needs_compression()
    events = [e for e in mem.compress_if_needed() if e.status == "applied"]
    assert [e.strategy for e in events] == [5]
    (shortened,) = mem.messages()
    assert (shortened.role, shortened.kind) == ("user", "large_summary")
    assert shortened.text.startswith(pasted[: config.preview_chars] + "...")
    # Only the rest went to the summarizer: the head is not in the request.
    (request,) = summarizer.requests
    assert pasted[: config.preview_chars] not in request.transcript
    tag = OFFLOAD_TAG_RE.search(shortened.text.splitlines()[-1])
    assert tag is not None and tag.group("handle") == str(handle_of(mem, events[0].offload_uuid))
    assert [m.text for m in mem.reload(tag.group("handle"))] == [original.text]
    assert mem.token_count() < config.token_target
    check_all(mem)


def test_max_llm_calls_bounds_the_summarizer_calls_of_one_call(open_memory: Open) -> None:
    summarizer = CountingSummarizer()
    # Only LLM work (no large payloads) and room for many ranges: the budget is what stops it.
    mem = open_memory(config=SMALL, options=RuntimeOptions(max_llm_calls=1), summarizer=summarizer)
    mem.add(multi_round(14, rounds=6, steps=8, big_every=10_000))
    events = mem.compress_if_needed()
    assert summarizer.calls == 1
    # One call of the summarizer; what the budget left undone, if the context is still over
    # the window, the offline fallback writes (no summarizer call).
    assert len([e for e in events if e.strategy in (1, 4, 5, 6, 7) and e.reason != "fallback"]) == 1


def test_max_passes_bounds_the_strategies_applied_by_one_call(open_memory: Open) -> None:
    # A low target: one pass cannot reach it, so only max_passes ends the call early.
    deep = dataclasses.replace(SMALL, target_ratio=0.2)
    mem = open_memory(config=deep, options=RuntimeOptions(max_passes=1))
    mem.add(multi_round(15, rounds=6, steps=8))
    events = [e for e in mem.compress_if_needed() if e.status == "applied"]
    # One pass applies the first strategy that finds work, with all of its ranges.
    assert events and len({e.strategy for e in events}) == 1
    assert len({e.session_version for e in events}) == 1
    unbounded = open_memory(sid=f"{mem.session_id}-free", config=deep)
    unbounded.add(multi_round(15, rounds=6, steps=8))
    assert len({e.session_version for e in unbounded.compress_if_needed()}) > 1


def _current_round_pressure(
    seed: int, pinned_note: bool = False
) -> tuple[list[Msg], AutoContextConfig]:
    """Many small finished rounds that no history strategy may touch (runs too short, rounds
    under the token floor, no large payload), then a current round with two large tool
    outputs: only S5 and S6 can act, and the target stays out of reach. With `pinned_note`,
    a pinned tool group and one more step follow the large outputs, so that S6 (which acts only
    after the round's last pinned message) does not cover them and S5 acts first."""
    rng = random.Random(seed)
    history = [Msg.system("You are a coding agent.")]
    for r in range(150):
        history.append(Msg.user(f"Task {r}: rename helper {r}"))
        history += tool_group(rng, [f"c{r}_1"], big=False)
        history += tool_group(rng, [f"c{r}_2"], big=False)
        history.append(Msg.assistant(f"Round {r} done: renamed it, tests pass."))
    current = [Msg.user("Now refactor the parser.")]
    current += tool_group(random.Random(seed), ["big_1"], big=True)
    current += tool_group(random.Random(seed + 1), ["big_2"], big=True)
    if pinned_note:
        # A pinned tool group (a pinned plain answer would be a final answer, and S3's).
        note = ToolUseBlock("note", "read_file", json.dumps({"path": "API.md"}))
        current += [
            Msg.assistant(None, [note], pinned=True),
            Msg.tool("note", "Keep the public API."),
        ]
        # Under the large threshold (no S5 candidate), heavy enough for S6 to gain on.
        read = ToolUseBlock("after_1", "read_file", json.dumps({"path": "src/parser.py"}))
        current += [Msg.assistant(None, [read]), Msg.tool("after_1", file_dump(rng, 40))]
    current += tool_group(random.Random(seed + 2), ["small_3"], big=False)
    msgs = history + current
    config = dataclasses.replace(
        SMALL,
        max_tokens=10_000_000,
        msg_threshold=10_000,
        min_tool_run=100,
        min_compress_tokens=1_000_000,
        large_payload_chars=3_000,
    )
    return msgs, config


def test_after_a_current_round_compression_the_history_strategies_are_not_planned_again(
    open_memory: Open, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S5 and S6 rewrite only what follows the latest user message, so the passes after them
    skip S1 to S4 and the fold (which found nothing before) and end exactly where planning them
    would."""
    msgs, config = _current_round_pressure(31)
    tokens = sum(count_tokens(m, TokenCounter(config.model)) for m in msgs)
    # The token trigger (75%) holds, and still holds after S5 (whose two summaries save about
    # 3,000 tokens): the token floor of S1 and S4 stays up. The target (60%) is out of reach.
    config = dataclasses.replace(config, max_tokens=int((tokens - 3_500) / 0.75))
    planned: list[int] = []
    for strategy, planner in list(PLANNERS.items()):

        def counted(*args: Any, _s: int = strategy, _p: Any = planner) -> Any:
            planned.append(_s)
            return _p(*args)

        monkeypatch.setitem(PLANNERS, strategy, counted)

    def run(sid: str) -> tuple[list[tuple[Any, ...]], list[str]]:
        mem = open_memory(sid=sid, config=config)
        mem.add(msgs)
        events = mem.compress_if_needed()
        check_all(mem)
        # Token figures differ by a token or two between runs: every summary carries its own
        # random offload uuid.
        shape = [
            (e.strategy, e.status, e.messages_before, e.messages_after, e.replaced_ids)
            for e in events
        ]
        return shape, [(m.id, m.kind) for m in mem.messages()]

    skipping = run("skip-history")
    # S5's two summaries could not take the tokens under the target and S6's range holds them:
    # S5 gives way to S6 (one call, not three).
    assert [e[0] for e in skipping[0] if e[1] == "applied"] == [6]
    # Pass 1 plans masking, S1 to S4, the fold, S5 and S6 (S6 applies); the passes after it
    # plan S5 and S6 only.
    assert planned[:8] == [8, 1, 2, 3, 4, 7, 5, 6], planned
    assert planned[7:] and set(planned[7:]) <= {5, 6}, planned
    planned.clear()
    monkeypatch.setattr(compressor, "HISTORY_STRATEGIES", frozenset())
    full = run("plan-everything")
    assert {1, 2, 3, 4, 7, 8} <= set(planned[7:]), "the reference run plans the history every pass"
    assert skipping == full


def _medium_long_task(seed: int, steps: int) -> list[Msg]:
    """One request and `steps` tool groups whose outputs are under the large threshold (no
    preview, no S5): only S1 (on the long task's older part) and S6 can act."""
    rng = random.Random(seed)
    msgs = [Msg.system("You are a coding agent."), Msg.user("Migrate the whole repository.")]
    for s in range(steps):
        call = ToolUseBlock(f"t{s}", "read_file", json.dumps({"path": f"src/m{s}.py"}))
        msgs += [Msg.assistant(None, [call]), Msg.tool(f"t{s}", file_dump(rng, 25))]
    return msgs


@pytest.mark.parametrize(
    ("max_tokens", "first"),
    [
        # The protected tail (last_keep messages) alone is over the token target: S1's runs
        # of the older part cannot bring the call there, and the call would go on to S6 anyway,
        # whose range holds them: S1 gives way to S6, one call instead of several.
        (3_000, [6]),
        # S1 would reach the target (3,400 tokens after it, the target 5,400), but not
        # `fold_keep_tokens` (1,350) under it: the next trigger would be a few steps away. S6's
        # one summary lands far deeper, S1 gives way (fewer, deeper calls: docs/design.md §3).
        (9_000, [6]),
        # A target the older part's summary reaches deeply: S1 alone, S6 never runs.
        (12_000, [1]),
    ],
)
def test_a_long_task_s1_gives_way_to_s6_unless_it_lands_deep_under_the_target(
    open_memory: Open, max_tokens: int, first: list[int]
) -> None:
    config = dataclasses.replace(SMALL, max_tokens=max_tokens, msg_threshold=10_000)
    msgs = _medium_long_task(41, steps=30)
    summarizer = CountingSummarizer()
    mem = open_memory(config=config, summarizer=summarizer)
    mem.add(msgs)
    assert mem.needs_compression()
    events = [e for e in mem.compress_if_needed() if e.status == "applied"]
    assert [e.strategy for e in events][:1] == first
    if first == [6]:
        assert 1 not in {e.strategy for e in events}
    else:
        assert {e.strategy for e in events} == {1}
    assert summarizer.calls == len(events)
    assert mem.token_count() < config.max_tokens
    check_all(mem)


class FoldFails(CountingSummarizer):
    """The offline summarizer, except that every fold request fails."""

    def summarize(self, request: SummaryRequest) -> SummaryResult:
        if request.strategy == 7:
            self.calls += 1
            raise RuntimeError("the endpoint is down")
        return super().summarize(request)


@pytest.mark.parametrize("fold_works", [True, False], ids=["fold", "fold-fails"])
def test_previews_give_way_to_a_fold_whose_range_holds_them(
    open_memory: Open, fold_works: bool
) -> None:
    """Large outputs of previous rounds are folded, not previewed first: the fold takes them
    anyway and lands deeper, and each preview would rewrite the agent's context from far back
    (a broken prompt cache) to shave a few steps off the next trigger. When the fold fails,
    the previews get their turn and the call still ends under the window."""
    # No S1 (its runs would take the outputs first), previous rounds with large outputs.
    config = dataclasses.replace(SMALL, min_tool_run=1000)
    summarizer = CountingSummarizer() if fold_works else FoldFails()
    mem = open_memory(config=config, summarizer=summarizer)
    mem.add(multi_round(1, rounds=4, steps=8))
    assert mem.needs_compression()
    before = mem.messages()
    latest_user = max(k for k, m in enumerate(before) if m.role == "user")
    candidates = {
        m.id for m in before if m.role == "tool" and m.payload_chars > config.large_payload_chars
    }
    # What the fold would take: the large outputs of the rounds before the current one.
    history = {m.id for m in before[:latest_user]} & candidates
    assert history, "the history must hold large outputs for S2 to preview"
    events = mem.compress_if_needed()
    applied = [e for e in events if e.status == "applied"]
    previewed = {i for e in applied if e.strategy in (2, 3) for i in e.replaced_ids}
    if fold_works:
        # The fold came first: the large outputs the fold does not hold (the finished
        # current round, near the end) could not reach the target alone.
        assert applied[0].strategy == 7, [(e.strategy, e.status) for e in events]
        folded = candidates & set(applied[0].replaced_ids)
        assert folded == history, "the fold must hold the history's large outputs"
        assert not folded & previewed, "a large output was previewed, then folded"
        assert mem.token_count() < config.token_target
    else:
        assert [e.strategy for e in events if e.status == "failed"][:1] == [7]
        assert history <= previewed
        assert mem.token_count() < config.max_tokens
    check_all(mem)


def test_summarizer_requests_carry_head_and_tail_of_long_outputs_and_reload_is_whole(
    open_memory: Open,
) -> None:
    """The summarizer sees each long tool output by its head and tail (the cut said in the
    request); the offload keeps the output whole, and the agent reloads it whole."""
    config = dataclasses.replace(SMALL, max_tokens=3_000, msg_threshold=10_000)
    msgs = _medium_long_task(42, steps=30)
    summarizer = CountingSummarizer()
    mem = open_memory(config=config, summarizer=summarizer)
    mem.add(msgs)
    events = mem.compress_if_needed()
    request = summarizer.requests[0]
    outputs = [m.tool_results[0].output_text for m in msgs if m.role == "tool"]
    assert all(len(o) > config.transcript_clip_chars for o in outputs)
    assert not any(o in request.transcript for o in outputs)
    assert request.transcript.count("[TRUNCATED: ") >= len(outputs) // 2
    assert request.input_chars > 3 * len(request.transcript) // 2  # the original size
    first = next(e for e in events if e.status == "applied")
    assert first.offload_uuid is not None
    reloaded = mem.reload(str(first.offload_uuid))
    assert {r.tool_results[0].output_text for r in reloaded if r.role == "tool"} <= set(outputs)
    assert any(r.tool_results[0].output_text == outputs[0] for r in reloaded if r.role == "tool")


def test_a_call_fired_by_tokens_goes_on_to_the_target_and_keeps_the_token_floor(
    open_memory: Open,
) -> None:
    """Once S5 has brought the tokens under the trigger (still over the target), the call goes
    on to the target (compress rarely, and deeply: docs/design.md §2), with S6 this time; S1,
    S4 and the fold keep their `min_compress_tokens` floor, so the small rounds of the history
    are not summarized one by one. (A pinned note after the large outputs keeps them out of
    S6's range, so S5 does not give way to S6.)"""
    msgs, config = _current_round_pressure(32, pinned_note=True)
    tokens = sum(count_tokens(m, TokenCounter(config.model)) for m in msgs)
    # S5's two summaries (about 3,000 tokens saved) take the session under the 75% trigger.
    config = dataclasses.replace(config, max_tokens=int(tokens / 0.77))
    summarizer = CountingSummarizer()
    mem = open_memory(config=config, summarizer=summarizer)
    mem.add(msgs)
    assert mem.needs_compression()
    events = mem.compress_if_needed()
    assert [(e.strategy, e.status) for e in events] == [
        (5, "applied"),
        (5, "applied"),
        (6, "applied"),
    ]
    assert events[1].tokens_after < config.token_trigger  # S6 acted under the trigger
    # S5's two messages share one request (docs/design.md §3), and S6 makes one more.
    assert summarizer.calls == 2
    assert mem.token_count() < config.token_target  # the call ended under the target
    check_all(mem)


class LLMStandIn(CountingSummarizer):
    """The offline summarizer under another model's name: it stands for an LLM in the audit
    (the offline summarizer's own events are not LLM calls)."""

    def summarize(self, request: SummaryRequest) -> SummaryResult:
        return dataclasses.replace(super().summarize(request), model="stand-in-llm")


def test_the_bound_holds_when_the_config_blocks_the_history_strategies(
    open_memory: Open, caplog: pytest.LogCaptureFixture
) -> None:
    """Many small rounds under a floor (min_compress_tokens) that no history range reaches,
    and a current round S5 and S6 can only shrink so far: the ladder ends over the window, so
    the offline fallback folds the history (no floor, no kept rounds), recorded as such, and
    the call ends under the window with nothing to report."""
    msgs, config = _current_round_pressure(33)
    tokens = sum(count_tokens(m, TokenCounter(config.model)) for m in msgs)
    # S5 and S6 take about 3,500 tokens off the current round: not enough for this window.
    config = dataclasses.replace(config, max_tokens=int(tokens * 0.7))
    summarizer = LLMStandIn()
    mem = open_memory(config=config, summarizer=summarizer)
    mem.add(msgs)
    with caplog.at_level("WARNING", logger="autoctx"):
        events = mem.compress_if_needed()
    fallback = [e for e in events if e.reason == "fallback"]
    assert [(e.strategy, e.status, e.model) for e in fallback] == [(7, "applied", "offline")]
    assert {e.strategy for e in events if e.reason != "fallback"} <= {5, 6}
    assert summarizer.calls == sum(e.reason != "fallback" for e in events)  # no LLM call
    assert mem.token_count() < config.token_target
    assert not [r for r in caplog.records if "over its window" in r.getMessage()]
    # The fallback's summary is a fold like any other: it closes the history it replaced, and
    # the audit does not count it as an LLM call.
    (fold,) = [m for m in mem.messages() if m.kind == "history_summary"]
    assert fold.id == fallback[0].summary_message_id
    (cost,) = sql(
        mem, "select llm_calls from autoctx_session_cost where session_id = :s", s=mem.session_id
    )
    assert cost.llm_calls == summarizer.calls
    check_all(mem)


def test_without_a_count_trigger_many_small_messages_do_not_compress(open_memory: Open) -> None:
    """docs/design.md §2: by default only tokens trigger a compression; with the design's
    `msg_threshold=100` the same messages do."""
    small = [Msg.user(f"note {k}: the build is green") for k in range(300)]
    plain = open_memory(config=AutoContextConfig(max_tokens=16_000))
    plain.add(small)
    assert plain.config.msg_threshold is None and plain.token_count() < 16_000 * 0.75
    assert not plain.needs_compression() and plain.compress_if_needed() == []
    counted = open_memory(
        sid=f"counted-{uuid.uuid4().hex[:6]}",
        config=AutoContextConfig(max_tokens=16_000, msg_threshold=100),
    )
    counted.add(small)
    assert counted.needs_compression()
    events = [e for e in counted.compress_if_needed() if e.status == "applied"]
    assert events and {e.reason for e in events} == {"count"}
    assert counted.message_count() < 60


def test_add_never_compresses_by_itself(open_memory: Open) -> None:
    mem = open_memory(config=SMALL)
    added = mem.add(multi_round(4, rounds=4, steps=8))
    assert mem.message_count() >= SMALL.msg_threshold and mem.token_count() >= SMALL.token_trigger
    assert mem.needs_compression()
    assert mem.events() == []
    assert [m.id for m in mem.messages()] == [m.id for m in added]


@pytest.mark.parametrize("trigger", ["count", "tokens"])
def test_each_event_records_why_it_ran_and_the_thresholds_of_its_call(
    open_memory: Open, trigger: str
) -> None:
    """docs/design.md §5 and 7: the reason is the trigger that held, and every event carries
    the thresholds in force for its call, which a later open with another config changes."""
    only = (
        dataclasses.replace(SMALL, max_tokens=10_000_000)
        if trigger == "count"
        else dataclasses.replace(SMALL, msg_threshold=10_000)
    )
    mem = open_memory(config=only)
    mem.add(multi_round(5, rounds=4, steps=8))
    first = mem.compress_if_needed()
    assert first and {e.reason for e in first} == {trigger}

    def configs(events: list[Any]) -> list[Any]:
        rows = sql(
            mem,
            "select id, config from compression_events where session_id = :s",
            s=mem.session_id,
        )
        by_id = {r.id: r.config for r in rows}
        return [by_id[e.id] for e in events]

    assert configs(first) == [only.to_json()] * len(first)
    # Reopened with other thresholds: the next call's events record those.
    other = dataclasses.replace(only, target_ratio=only.target_ratio / 2)
    again = open_memory(config=other)
    again.add(multi_round(6, rounds=2, steps=8))
    second = again.compress_if_needed()
    assert second and configs(second) == [other.to_json()] * len(second)


def test_compressions_store_the_final_answer_flag_of_the_kinds_table(open_memory: Open) -> None:
    """docs/design.md §1: a round summary and a history summary are final answers, a tool-run
    or current-round summary is not, and a preview or large-message summary is one exactly when
    the message it replaced was."""
    no_s1 = dataclasses.replace(SMALL, min_tool_run=1000)
    no_previews = dataclasses.replace(no_s1, large_payload_chars=100_000)
    # The pinned group keeps S5's messages out of S6's range: S5 acts, then S6.
    pressure, pressure_config = _current_round_pressure(34, pinned_note=True)
    tokens = sum(count_tokens(m, TokenCounter(SMALL.model)) for m in pressure)
    kinds: set[str] = set()
    kept_finals = 0  # previews and large summaries of a final answer
    # A long final answer outside the protected tail, for S2 to preview: in the one round of
    # the session, which no fold takes (previews of folded rounds give way to the fold).
    big_answer = [
        Msg.system("You are a coding agent."),
        Msg.user("Write up the findings."),
        Msg.assistant("Findings:\n" + file_dump(random.Random(35), 120)),
    ]
    big_answer += [Msg.assistant(f"Point {k} is fine.") for k in range(SMALL.last_keep)]
    answer_tokens = sum(count_tokens(m, TokenCounter(SMALL.model)) for m in big_answer)
    for sid, history, config in (
        # One long finished task: no previous round to fold, so S1 takes its tool runs.
        ("final-runs", multi_round(8, rounds=1, steps=40), SMALL),
        ("final-rounds", multi_round(8, rounds=5, steps=8), no_s1),
        ("final-answer", big_answer, dataclasses.replace(no_s1, max_tokens=answer_tokens)),
        # One heavy previous round that S4 alone brings under the target.
        ("final-round", one_heavy_round(8), dataclasses.replace(no_previews, max_tokens=2_900)),
        ("final-current", pressure, dataclasses.replace(pressure_config, max_tokens=tokens)),
    ):
        mem = open_memory(sid=f"{sid}-{uuid.uuid4().hex[:6]}", config=config)
        mem.add(history)
        mem.compress_if_needed()
        rows = sql(
            mem,
            "select m.id, m.kind, m.final, r.final as replaced_final "
            "from messages m join lineage l on l.session_id = m.session_id "
            "and l.summary_id = m.id and l.ordinal = 0 "
            "join messages r on r.session_id = l.session_id and r.id = l.replaced_id "
            "where m.session_id = :s and m.kind <> 'original'",
            s=mem.session_id,
        )
        for r in rows:
            kinds.add(r.kind)
            if r.kind in ("round_summary", "history_summary"):
                assert r.final, r
            elif r.kind in ("tool_run_summary", "current_round_summary"):
                assert not r.final, r
            else:
                assert r.final == r.replaced_final, r
                kept_finals += r.final
    assert kinds == {
        "tool_run_summary",
        "preview",
        "round_summary",
        "history_summary",
        "large_summary",
        "current_round_summary",
    }, kinds
    assert kept_finals > 0


class _AnswersWith:
    """A summarizer whose every answer carries `poison` (NUL, a lone surrogate)."""

    def __init__(self, poison: str) -> None:
        self.inner = OfflineSummarizer()
        self.poison = poison
        self.calls = 0

    def summarize(self, request: SummaryRequest) -> SummaryResult:
        self.calls += 1
        result = self.inner.summarize(request)
        return dataclasses.replace(result, text=result.text + self.poison + " the end")


@pytest.mark.parametrize("poison", ["\x00", "\udc80"], ids=["nul", "lone-surrogate"])
def test_an_answer_the_database_cannot_store_is_a_failed_event(
    open_memory: Open, poison: str
) -> None:
    """docs/design.md §6: never a raw database error, and not paid for again at the same
    version; the bound still holds (the offline fallback writes what the window needs)."""
    summarizer = _AnswersWith(poison)
    mem = open_memory(config=SMALL, summarizer=summarizer)
    mem.add(multi_round(21, rounds=5, steps=8, big_every=10_000))
    events = mem.compress_if_needed()
    failed = [e for e in events if e.status == "failed"]
    assert failed and all(e.error and e.error.startswith("bad_answer: ") for e in failed)
    assert all(poison not in (e.error or "") for e in failed)
    assert mem.token_count() < SMALL.max_tokens
    calls = summarizer.calls
    assert mem.compress_if_needed() == [] and summarizer.calls == calls
    check_all(mem)
