"""The fact check after every summary (docs/design.md §6): the counts on every event, one
repair request to the summarizer (a real OpenAI-protocol server), the index line within its
cap, and what a summary left out, asked for later (`dropped`)."""

from __future__ import annotations

import copy
import dataclasses
import json
import random
import re
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest

from autoctx import (
    AutoContextMemory,
    EventNotFound,
    InvalidEventId,
    InvalidExport,
    Msg,
    OfflineSummarizer,
    OpenAISummarizer,
    RuntimeOptions,
    SummaryRequest,
    SummaryResult,
    export_session,
    import_session,
)
from autoctx._strategies.facts import normalize
from autoctx._tags import OFFLOAD_TAG_RE
from autoctx._tokens import TokenCounter
from tests.dbsql import sql
from tests.histories import SMALL, long_task, multi_round
from tests.invariants import assert_every_original_reachable, assert_valid_openai_chat
from tests.openai_server import OpenAIServer, Reply

Open = Callable[..., AutoContextMemory]

#: The facts planted in the first round: one of each kind the extractor knows.
PLANTED = (
    "Never deploy to prod-eu-7 before the smoke test passes",
    "req-8f3a21",
    "FileNotFoundError",
    "/srv/deploy/release-2031.tar.gz",
    "https://ci.example.com/runs/991",
    "timeout=45",
    "250 ms",
)

#: The repair is asked only for what the index line cannot hold: a line of 5% of the budget
#: holds few of the planted facts.
REPAIR = dataclasses.replace(SMALL, fact_repair=True, fact_index_ratio=0.05)


def planted_history(seed: int = 7) -> list[Msg]:
    """Four rounds of tool work (the ladder's own), the facts planted in the first."""
    msgs = multi_round(seed, rounds=4, steps=8)
    first_user = next(k for k, m in enumerate(msgs) if m.role == "user")
    msgs[first_user] = Msg.user(
        f"Task 0: {PLANTED[0]}. Build {PLANTED[1]} failed with {PLANTED[2]} while reading "
        f"{PLANTED[3]}; the log is at {PLANTED[4]}. Use {PLANTED[5]}, the p99 was {PLANTED[6]}."
    )
    return msgs


def lossy(text: str) -> str:
    return "The agent worked through the rounds and reported its progress."


@pytest.fixture(scope="module")
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer() as srv:
        yield srv


def repairing_reply(body: Mapping[str, Any]) -> Reply:
    """A summarizer that leaves every fact out of its summaries, and states each listed fact
    when it is asked to repair one."""
    user = body["messages"][-1]["content"]
    if user.startswith("Summary to revise:"):
        listed = re.findall(r"^- (.+)$", user.split("exactly as written:", 1)[1], re.M)
        return Reply.text("The agent worked through the rounds. Facts: " + "; ".join(listed))
    return Reply.text(lossy(user))


def openai(server: OpenAIServer) -> OpenAISummarizer:
    return OpenAISummarizer(base_url=server.base_url, api_key="test", timeout=10, max_retries=0)


def visible(mem: AutoContextMemory) -> str:
    """The working context's text, as the model reads it."""
    return "\n".join(str(m.get("content") or "") for m in mem.to_openai())


def summaries(mem: AutoContextMemory) -> list[Any]:
    return [e for e in mem.events() if e.status == "applied" and e.facts is not None]


def summary_row(mem: AutoContextMemory, event: Any) -> tuple[str, int]:
    """The stored text and tokens of the summary `event` wrote."""
    (row,) = sql(
        mem,
        "SELECT content, tokens FROM messages WHERE session_id = :sid AND id = :id",
        sid=mem.session_id,
        id=event.summary_message_id,
    )
    return "\n".join(b.get("text") or b.get("output") or "" for b in row.content), row.tokens


def check_counts(mem: AutoContextMemory) -> None:
    for e in mem.events():
        if e.status != "applied" or e.strategy not in (1, 4, 5, 6, 7):
            assert e.facts is None, e
            continue
        f = e.facts
        assert f is not None, e
        assert f.found == f.kept + f.repaired + f.listed + f.dropped
        assert len(f.dropped_facts) == f.dropped


def test_every_summary_is_checked_and_repaired_by_the_summarizer(
    open_memory: Open, server: OpenAIServer
) -> None:
    server.default = repairing_reply
    before = len(server.requests)
    mem = open_memory(config=REPAIR, summarizer=openai(server))
    mem.add(planted_history())
    mem.compress_if_needed()
    checked = summaries(mem)
    assert checked, "a summary was written"
    check_counts(mem)
    bodies = server.requests[before:]
    repairs = [b for b in bodies if b["messages"][-1]["content"].startswith("Summary to revise:")]
    assert sum(e.facts.repair_calls for e in checked) == len(repairs) > 0
    # The repair named the facts the first answer left out, and won: they are in the summary.
    repaired = [e for e in checked if e.facts.repaired]
    assert repaired
    working = visible(mem)
    for fact in PLANTED:
        assert normalize(fact) in normalize(working), fact
    # The audit counts the repair calls with the summarizer's.
    (cost,) = sql(
        mem,
        "SELECT llm_calls, fact_repair_calls FROM autoctx_session_cost WHERE session_id = :sid",
        sid=mem.session_id,
    )
    assert cost.llm_calls == len(bodies) and cost.fact_repair_calls == len(repairs)
    assert_valid_openai_chat(mem.to_openai())
    assert_every_original_reachable(mem)


def test_without_the_repair_the_index_line_lists_the_facts_and_names_the_offload(
    open_memory: Open, server: OpenAIServer
) -> None:
    server.default = repairing_reply
    before = len(server.requests)
    mem = open_memory(config=SMALL, summarizer=openai(server))  # fact_repair=False
    mem.add(planted_history())
    mem.compress_if_needed()
    bodies = server.requests[before:]
    assert not any(b["messages"][-1]["content"].startswith("Summary to revise:") for b in bodies)
    listed = [e for e in summaries(mem) if e.facts.listed]
    assert listed
    check_counts(mem)
    texts = {m.id: m.text for m in mem.messages()}
    shown = [e for e in listed if e.summary_message_id in texts]
    assert shown  # the others were folded away since, their lines into the fold's text
    for event in shown:
        lines = texts[event.summary_message_id].splitlines()
        # The tag stays the last line; the index line is right before it and names the offload.
        tag = OFFLOAD_TAG_RE.fullmatch(lines[-1])
        assert tag and tag.group("handle")
        assert lines[-2].startswith(f"Not in this summary, reload offload {tag.group('handle')} ")
        # The model reloads by what the line names: the same offload as the event's.
        assert mem.reload(int(tag.group("handle"))) == mem.reload(event.offload_uuid)
    working = visible(mem)
    assert normalize(PLANTED[0]) in normalize(working)  # the constraint, ranked first


def test_no_repair_is_asked_for_what_the_index_line_holds(
    open_memory: Open, server: OpenAIServer
) -> None:
    """With the repair on, a summary whose missing facts all fit on its index line is not
    repaired: they are in view already, and a call would add nothing the agent does not see
    (docs/design.md §6). The same history with a line too short for them asks repairs."""
    server.default = repairing_reply
    roomy = dataclasses.replace(REPAIR, fact_index_ratio=0.99)
    before = len(server.requests)
    mem = open_memory(config=roomy, summarizer=openai(server))
    mem.add(planted_history())
    mem.compress_if_needed()
    bodies = server.requests[before:]
    assert bodies, "the summarizer wrote the summaries"
    assert not any(b["messages"][-1]["content"].startswith("Summary to revise:") for b in bodies)
    checked = summaries(mem)
    assert checked and all(e.facts.repair_calls == 0 for e in checked)
    # Every fact a summary lacked went on its line: nothing was dropped for want of a repair.
    assert any(e.facts.listed for e in checked) and all(e.facts.dropped == 0 for e in checked)
    check_counts(mem)
    # A line with room for none of them: the same history asks for repairs.
    tight = dataclasses.replace(REPAIR, fact_index_ratio=0.0)
    before = len(server.requests)
    other = open_memory(f"{mem.session_id}-t", config=tight, summarizer=openai(server))
    other.add(planted_history())
    other.compress_if_needed()
    assert any(
        b["messages"][-1]["content"].startswith("Summary to revise:")
        for b in server.requests[before:]
    )


def test_the_index_line_keeps_to_its_share_of_the_budget(open_memory: Open) -> None:
    """A lossy summarizer keeps nothing: the line lists what fits in `fact_index_ratio` of
    the summary's budget, best rank first, and the summary with its line stays within the
    fold's token budget and margin."""

    class Lossy:
        def summarize(self, request: SummaryRequest) -> SummaryResult:
            return SummaryResult(lossy(request.transcript), "lossy")

    config = dataclasses.replace(SMALL, fact_index_ratio=0.05)
    mem = open_memory(config=config, summarizer=Lossy())
    mem.add(planted_history(11))
    mem.compress_if_needed()
    check_counts(mem)
    counter = TokenCounter(mem.config.model)
    checked = summaries(mem)
    assert any(e.facts.listed for e in checked) and any(e.facts.dropped for e in checked)
    for event in checked:
        text, tokens = summary_row(mem, event)
        index = [ln for ln in text.splitlines() if ln.startswith("Not in this summary")]
        assert bool(index) == bool(event.facts.listed)
        replaced = sum(
            r.tokens
            for r in sql(
                mem,
                "SELECT tokens FROM messages WHERE session_id = :sid AND id = ANY(:ids)",
                sid=mem.session_id,
                ids=list(event.replaced_ids),
            )
        )
        budget = mem.config.fold_budget_tokens if event.strategy == 7 else replaced // 4
        if index:
            assert counter.count(index[0]) <= int(budget * 0.05)
        if event.strategy == 7:
            margin = max(16, budget // 10)
            assert tokens <= budget + margin + 32  # the line within it, and the tag


def test_a_summary_is_asked_for_its_budget_less_the_index_lines_share(open_memory: Open) -> None:
    """A summarizer writes to the budget it is asked for: the fold asks for its budget less
    `fact_index_ratio` of it, so a summary that fills what it was asked still leaves its index
    line the whole share (before, the line had only the budget's margin), and the summary with
    its line stays within the fold's budget and margin."""
    counter = TokenCounter(SMALL.model)
    asked: list[SummaryRequest] = []

    class Filling:
        """Fills the token budget it is asked for with words that hold no fact."""

        def summarize(self, request: SummaryRequest) -> SummaryResult:
            asked.append(request)
            words = "The agent worked through the rounds and reported progress. "
            budget = request.token_budget or 100
            text = counter.clip(words * budget, budget).rstrip()
            return SummaryResult(text, "filling")

    config = dataclasses.replace(SMALL, fact_index_ratio=0.3, msg_threshold=None)
    mem = open_memory(config=config, summarizer=Filling())
    for seed in range(4):
        mem.add(planted_history(seed))
    mem.compress_if_needed()
    check_counts(mem)
    budget = mem.config.fold_budget_tokens
    folds = [e for e in summaries(mem) if e.strategy == 7]
    assert folds, [e.strategy for e in summaries(mem)]
    assert [r.token_budget for r in asked if r.strategy == 7] == [budget - int(budget * 0.3)] * len(
        folds
    )
    margin = max(16, budget // 10)
    for event in folds:
        text, tokens = summary_row(mem, event)
        (index,) = [ln for ln in text.splitlines() if ln.startswith("Not in this summary")]
        # More than the margin alone would have let in, and within its share.
        assert margin < counter.count(index) <= int(budget * 0.3)
        assert tokens <= budget + margin + 32  # the line within it, and the tag


def s6_session(open_memory: Open, share: float) -> tuple[AutoContextMemory, list[str], list[int]]:
    """One long round of tool work added a few messages at a time, every output a large
    payload: masking and S2 leave previews and calls that outgrow the window, so S6 summarizes
    the round again and again, each time after the earlier S6 summary it keeps verbatim. The
    summarizer writes `share` of S6's character budget in words that hold no fact; returns the
    memory, its S6 answers and their character budgets, in order."""
    answers: list[str] = []
    budgets: list[int] = []
    words = "The agent worked through the steps and reported progress on the migration. "

    class Partial:
        def summarize(self, request: SummaryRequest) -> SummaryResult:
            size = request.char_budget or 400
            text = (words * (size // len(words) + 1))[: int(size * share)].rstrip()
            if request.strategy == 6:
                assert request.char_budget is not None
                answers.append(text)
                budgets.append(request.char_budget)
            return SummaryResult(text, "partial")

    mem = open_memory(config=dataclasses.replace(SMALL, msg_threshold=None), summarizer=Partial())
    msgs = long_task(5, 200, big_every=1)
    for k in range(0, len(msgs), 4):
        mem.add(msgs[k : k + 4])
        mem.compress_if_needed()
    return mem, answers, budgets


def index_facts(text: str) -> list[str]:
    """The facts of the last index line of a stored summary."""
    (*_, line) = [ln for ln in text.splitlines() if ln.startswith("Not in this summary")]
    return line.split(" for: ", 1)[1].split(" | ")


def test_s6s_summary_and_its_index_line_keep_within_s6s_character_budget(
    open_memory: Open,
) -> None:
    """S6's budget is characters, converted from the tokens that bring the round to the
    target: the summary and its line together stay within it, and the line within its share
    (before, the line was measured in tokens at three characters each, and a summary of prose
    with its line went past the budget). A summary that fills its budget leaves no line."""
    ratio = SMALL.fact_index_ratio
    mem, answers, budgets = s6_session(open_memory, share=0.7)
    events = [e for e in summaries(mem) if e.strategy == 6]
    assert len(events) == len(answers) >= 3
    for event, answer, budget in zip(events, answers, budgets, strict=True):
        text, _ = summary_row(mem, event)
        (*_, line) = [ln for ln in text.splitlines() if ln.startswith("Not in this summary")]
        assert event.facts.listed > 0
        assert text.index(answer) + len(answer) + 1 == text.index(line)  # the line follows it
        assert len(answer) + 1 + len(line) <= budget
        assert len(line) <= int(budget * ratio)
    check_counts(mem)
    assert mem.token_count() <= mem.config.token_target
    full, answers, budgets = s6_session(
        lambda **kw: open_memory(f"{mem.session_id}-full", **kw), share=1.0
    )
    events = [e for e in summaries(full) if e.strategy == 6]
    assert events and all(e.facts.listed == 0 for e in events)
    check_counts(full)


def test_an_s6_prefix_leaves_the_index_line_to_the_newer_messages_facts(
    open_memory: Open,
) -> None:
    """The earlier S6 summary that S6 keeps verbatim is in view whole, its index line
    included: its facts are not checked again, so they do not fill the extractor's bound, and
    each later line lists facts of the steps summarized since (before, every later S6 found
    the prefix's 32 facts, all kept, and listed none of the newer ones)."""
    mem, _, _ = s6_session(open_memory, share=0.5)
    events = [e for e in summaries(mem) if e.strategy == 6]
    assert len(events) >= 3
    earlier = ""
    for event in events:
        text, _ = summary_row(mem, event)
        listed = index_facts(text)
        assert listed and len(listed) == event.facts.listed
        if earlier:
            assert text.startswith(earlier.rstrip())  # the prefix, kept verbatim
            assert not [f for f in listed if normalize(f) in normalize(earlier)]
        earlier = text  # the next S6 keeps it whole, its tag included
    check_counts(mem)


def test_a_constraint_on_an_index_line_stays_in_view_fold_after_fold(open_memory: Open) -> None:
    """The user's constraint a lossy summary left out goes on the fold's index line; each
    later fold re-reads that line (docs/design.md §6) and finds it a constraint again, first
    of its facts, so it stays in view however many folds follow (before, the second fold read
    the line as prose, found only the constraint's identifier, and the rule vanished)."""

    class Lossy:
        def summarize(self, request: SummaryRequest) -> SummaryResult:
            return SummaryResult(lossy(request.transcript), "lossy")

    mem = open_memory(config=dataclasses.replace(SMALL, msg_threshold=None), summarizer=Lossy())
    mem.add(planted_history())
    folds = 0
    for seed in range(6):
        mem.add(multi_round(100 + seed, rounds=3, steps=8)[1:])
        mem.compress_if_needed()
        folds = sum(e.strategy == 7 and e.status == "applied" for e in mem.events())
        if folds:
            assert normalize(PLANTED[0]) in normalize(visible(mem)), (seed, folds)
    assert folds >= 4
    check_counts(mem)


def test_the_offline_summarizer_is_asked_no_repair(open_memory: Open) -> None:
    requests: list[SummaryRequest] = []

    class Counting(OfflineSummarizer):
        def summarize(self, request: SummaryRequest) -> SummaryResult:
            requests.append(request)
            return super().summarize(request)

    mem = open_memory(config=REPAIR, summarizer=Counting())
    mem.add(planted_history())
    mem.compress_if_needed()
    assert requests and not any(r.missing_facts for r in requests)
    assert all(e.facts.repair_calls == 0 for e in summaries(mem))
    check_counts(mem)


def test_the_repair_counts_against_max_llm_calls(open_memory: Open, server: OpenAIServer) -> None:
    server.default = repairing_reply
    before = len(server.requests)
    mem = open_memory(
        config=REPAIR, summarizer=openai(server), options=RuntimeOptions(max_llm_calls=1)
    )
    mem.add(planted_history())
    mem.compress_if_needed()
    assert len(server.requests) - before == 1  # the summary took the one call: no repair
    assert all(e.facts.repair_calls == 0 for e in summaries(mem))


def test_a_repair_that_fails_a_check_leaves_the_first_answer(
    open_memory: Open, server: OpenAIServer
) -> None:
    """A revision that carries a tag (or comes late, or is empty) is not a summary: the first
    answer stands, with its index line, and the event is applied."""

    def tagging(body: Mapping[str, Any]) -> Reply:
        user = body["messages"][-1]["content"]
        if user.startswith("Summary to revise:"):
            return Reply.text("Revised <!-- CONTEXT_OFFLOAD: uuid=abc --> with everything.")
        return Reply.text(lossy(user))

    server.default = tagging
    mem = open_memory(config=REPAIR, summarizer=openai(server))
    mem.add(planted_history())
    mem.compress_if_needed()
    checked = summaries(mem)
    assert checked and all(e.facts.repaired == 0 for e in checked)
    assert any(e.facts.repair_calls for e in checked)
    assert any(e.facts.listed for e in checked)
    assert "Revised" not in visible(mem)


def test_a_random_history_keeps_the_counts_consistent(open_memory: Open) -> None:
    rng = random.Random(3)
    mem = open_memory(config=SMALL)
    for _seed in range(3):
        mem.add(multi_round(rng.randrange(10**6), rounds=3, steps=6))
        mem.compress_if_needed()
    check_counts(mem)
    assert summaries(mem)


# -- what a compression left out, asked later ---------------------------------------------------

SECRET = "sk-live-4f9a8b7c6d5e"


class Lossy:
    """Keeps no fact at all (the lossy stub of the bench)."""

    def summarize(self, request: SummaryRequest) -> SummaryResult:
        return SummaryResult(lossy(request.transcript), "lossy")


def secret_history() -> list[Msg]:
    msgs = planted_history()
    first_user = next(k for k, m in enumerate(msgs) if m.role == "user")
    msgs[first_user] = Msg.user(msgs[first_user].text + f" The deploy key is {SECRET}.")
    return msgs


def test_dropped_lists_what_the_working_context_lacks_for_every_compression(
    open_memory: Open,
) -> None:
    config = dataclasses.replace(SMALL, fact_index_ratio=0.0)  # no index line: all dropped
    mem = open_memory(config=config, summarizer=Lossy())
    mem.add(secret_history())
    mem.compress_if_needed()
    compressions = [e for e in mem.events() if e.status == "applied" and e.offload_uuid]
    assert compressions
    holding = [e for e in summaries(mem) if SECRET in e.facts.dropped_facts]
    assert holding, "the lossy summary dropped the secret, and the event says so"
    for event in compressions:
        facts = mem.dropped(event.id)
        working = normalize(visible(mem))
        assert all(normalize(f) not in working for f in facts)
    assert SECRET in mem.dropped(holding[-1].id)
    # The agent asks through the context tool, by the offload id.
    answer = mem.handle_tool_call(
        {
            "id": "c",
            "type": "function",
            "function": {
                "name": "context_reload",
                "arguments": json.dumps({"uuid": str(holding[-1].offload_uuid), "dropped": True}),
            },
        }
    )
    assert SECRET in answer and "originals=true" in answer
    # Once the agent's context shows a fact again, it is no longer dropped.
    mem.add(Msg.user(f"Remember {SECRET}."))
    assert SECRET not in mem.dropped(holding[-1].id)


def test_dropped_refuses_what_is_not_a_compression(open_memory: Open) -> None:
    mem = open_memory(config=SMALL)
    mem.add(planted_history())
    mem.compress_if_needed()
    with pytest.raises(InvalidEventId):
        mem.dropped(0)
    with pytest.raises(InvalidEventId):
        mem.dropped("3")  # type: ignore[arg-type]
    with pytest.raises(EventNotFound) as caught:
        mem.dropped(10_000)
    assert mem.session_id in str(caught.value)
    answer = mem.handle_tool_call(
        {
            "id": "c",
            "type": "function",
            "function": {
                "name": "context_reload",
                "arguments": json.dumps({"uuid": str(uuid.uuid4()), "dropped": True}),
            },
        }
    )
    assert answer == "No offloaded context with that id in this session."


def test_erasure_scrubs_a_secret_that_is_a_dropped_fact(open_memory: Open) -> None:
    config = dataclasses.replace(SMALL, fact_index_ratio=0.0)
    mem = open_memory(config=config, summarizer=Lossy())
    added = mem.add(secret_history())
    mem.compress_if_needed()
    assert any(SECRET in e.facts.dropped_facts for e in summaries(mem))
    holder = next(m for m in added if SECRET in m.text)
    before = {e.id: e.facts for e in summaries(mem)}
    assert holder.id is not None
    mem.erase([holder.id], reason="leaked key")
    leaks = sql(
        mem,
        "SELECT id FROM compression_events WHERE session_id = :sid "
        "AND array_to_string(dropped_facts, ' ') LIKE :pat",
        sid=mem.session_id,
        pat=f"%{SECRET}%",
    )
    assert leaks == []
    for event in summaries(mem):
        f = event.facts
        assert f.found == f.kept + f.repaired + f.listed + f.dropped
        old = before[event.id]
        # Only the erased facts left the list: the others stay, as stored.
        assert set(f.dropped_facts) <= set(old.dropped_facts)
        assert len(old.dropped_facts) - len(f.dropped_facts) == old.found - f.found
    for event in summaries(mem):
        assert SECRET not in mem.dropped(event.id)


def test_export_and_import_carry_the_fact_check(open_memory: Open, db_url: str) -> None:
    """The counts and dropped facts travel in an export; a document written before they
    existed imports with none recorded; counts that do not add up are refused whole."""
    config = dataclasses.replace(SMALL, fact_index_ratio=0.0)
    mem = open_memory(f"facts-export-{uuid.uuid4().hex[:8]}", config=config, summarizer=Lossy())
    mem.add(secret_history())
    mem.compress_if_needed()
    expected = [e.facts for e in mem.events()]
    assert any(f is not None and f.dropped_facts for f in expected)
    document = export_session(mem.session_id, db_url)
    mem.delete()
    import_session(document, db_url)
    again = AutoContextMemory.open(mem.session_id, db_url, create=False)
    assert [e.facts for e in again.events()] == expected
    again.delete()
    older = copy.deepcopy(document)
    for event in older["events"]:
        for key in [k for k in event if k.startswith("facts_") or k == "dropped_facts"]:
            del event[key]
    import_session(older, db_url)
    oldest = AutoContextMemory.open(mem.session_id, db_url, create=False)
    assert all(e.facts is None for e in oldest.events())
    oldest.delete()
    broken = copy.deepcopy(document)
    event = next(e for e in broken["events"] if e["facts_found"] is not None)
    event["facts_found"] += 1
    with pytest.raises(InvalidExport, match="facts_found"):
        import_session(broken, db_url)
