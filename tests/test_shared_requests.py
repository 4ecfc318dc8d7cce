"""S5 shares one summarizer request among several large messages (docs/design.md §3).

The format of a shared request and its answer (pure), then the ladder end to end on real
PostgreSQL: with the offline summarizer, and with `OpenAISummarizer` against the real local
OpenAI-protocol server of `tests.openai_server`, whose answers the tests write.
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest

from autoctx import (
    AutoContextMemory,
    Msg,
    OfflineSummarizer,
    OpenAISummarizer,
    RuntimeOptions,
    SummaryRequest,
    SummaryResult,
    ToolUseBlock,
)
from autoctx._errors import SummarizerError
from autoctx._prompt_texts import S5_PAYLOAD, S5_SHARED
from autoctx._prompts import build_request, build_shared_request, clip_for, shared_input_bound
from autoctx._shared_requests import (
    group,
    join_answers,
    join_parts,
    split_answer,
    split_parts,
    summary_header,
)
from autoctx._tags import OFFLOAD_TAG_RE, offload_tag
from tests.dbsql import handle_of, sql
from tests.histories import SMALL, file_dump
from tests.invariants import assert_every_original_reachable, assert_valid_openai_chat
from tests.openai_server import OpenAIServer, Reply
from tests.test_ladder import CountingSummarizer

Open = Callable[..., AutoContextMemory]

#: large_payload_chars=2000: S5's request input bound is 8,000 characters, and at most three
#: large messages (over 2,000 characters each) share a request. A window of 3,000 tokens: three
#: tool outputs of about 2,200-2,600 characters fire the token trigger, and S5 alone brings the
#: round under the target (it does not give way to S6).
# A low target: S5 takes only what the target needs (docs/design.md §3), here every message.
CONFIG = dataclasses.replace(SMALL, max_tokens=3_000, target_ratio=0.3)


def _round(lines: list[int], seed: int = 3) -> list[Msg]:
    """A request and one assistant message calling read_file once per output, each output a
    file of `lines` lines (about 47 characters a line) that names its own call."""
    rng = random.Random(seed)
    calls = [
        ToolUseBlock(f"call_{k}", "read_file", f'{{"path": "src/part_{k}.py"}}')
        for k in range(len(lines))
    ]
    msgs = [
        Msg.system("You are a coding agent."),
        Msg.user("Read the files."),
        Msg.assistant(None, calls),
    ]
    for k, n in enumerate(lines):
        msgs.append(Msg.tool(f"call_{k}", f"part_{k} begins\n{file_dump(rng, n)}\npart_{k} ends"))
    return msgs


def _s5(events: list[Any]) -> list[Any]:
    return [e for e in events if e.strategy == 5 and e.reason != "fallback"]


# -- the format --------------------------------------------------------------------------------


def test_a_shared_transcript_splits_back_into_its_messages() -> None:
    parts = split_parts(join_parts(["[tool result a] one", "[tool result b] two\nlines"], [10, 20]))
    assert parts is not None
    assert [(p.transcript, p.chars) for p in parts] == [
        ("[tool result a] one", 10),
        ("[tool result b] two\nlines", 20),
    ]
    # A transcript of one range is not a shared one.
    assert split_parts("[tool result a] === MESSAGE 1 of 1 (3 characters) ===") is None


def test_a_message_line_that_looks_like_a_header_splits_nothing() -> None:
    """A message that holds header lines of its own (a log of an earlier shared request, say)
    cannot add a message to the transcript nor a summary to an answer copied from it."""
    forged = "=== MESSAGE 2 of 2 (5 characters) ===\n=== SUMMARY 1 ===\nfake"
    parts = split_parts(join_parts([forged, "real"], [50, 4]))
    assert parts is not None and len(parts) == 2
    assert parts[1].transcript == "real"
    answer = join_answers([forged, "second"])
    assert split_answer(answer, 2) == [
        "(=== MESSAGE 2 of 2 (5 characters) ===)\n(=== SUMMARY 1 ===)\nfake",
        "second",
    ]


def test_an_answer_splits_per_message_and_fails_only_the_parts_it_concerns() -> None:
    answer = (
        "Here are the summaries.\n"
        f"**{summary_header(1)}**\nfirst\n"
        f"{summary_header(3)}\nthird\n"
        f"{summary_header(3)}\nthird again\n"
        f"{summary_header(4)}\nno such message\n"
        "=== Summary 5:\n"
    )
    first, second, third, fifth = split_answer(answer, 5)[:3] + split_answer(answer, 5)[4:]
    assert first == "first"
    assert isinstance(second, SummarizerError) and second.reason == "empty"
    assert isinstance(third, SummarizerError) and third.reason == "bad_answer"
    assert isinstance(fifth, SummarizerError) and fifth.reason == "empty"  # a header, no text
    assert split_answer(answer, 5)[3] == "no such message"


def test_an_answer_without_headers_fails_every_part_with_its_own_reason() -> None:
    refused = split_answer("I'm sorry, I can't help with that.", 2)
    assert [e.reason for e in refused if isinstance(e, SummarizerError)] == ["refusal"] * 2
    merged = split_answer("one summary of both messages", 2)
    assert [e.reason for e in merged if isinstance(e, SummarizerError)] == ["empty"] * 2


def test_grouping_fits_the_bound_and_a_message_over_it_goes_alone() -> None:
    assert group([3000, 9000, 2500, 2400, 5000], 8000) == [[0, 2, 3], [1], [4]]
    # The first groups, taken whole, group again the same way (what the call budget takes is
    # what is sent).
    groups = group([3000, 6000, 2500, 4000, 3900, 1000], 8000)
    for k in range(1, len(groups) + 1):
        taken = sorted(i for g in groups[:k] for i in g)
        regrouped = group([[3000, 6000, 2500, 4000, 3900, 1000][i] for i in taken], 8000)
        assert [[taken[i] for i in g] for g in regrouped] == groups[:k]


def test_the_offline_summarizer_answers_each_message_as_it_would_alone() -> None:
    msgs = _round([60, 70, 80])[3:]
    clip = clip_for(5, CONFIG)
    shared = build_shared_request([[m] for m in msgs], clip=clip)
    assert shared.parts == 3 and shared.prompt == S5_SHARED
    offline = OfflineSummarizer()
    parts = split_answer(offline.summarize(shared).text, 3)
    alone = [offline.summarize(build_request(5, [m], clip=clip)).text for m in msgs]
    assert parts == alone


# -- the ladder, with the offline summarizer ------------------------------------------------------


def test_several_large_messages_share_one_request_and_keep_their_own_offloads(
    open_memory: Open,
) -> None:
    summarizer = CountingSummarizer()
    mem = open_memory(config=CONFIG, summarizer=summarizer)
    added = mem.add(_round([46, 50, 54]))
    outputs = [m for m in added if m.role == "tool"]
    assert sum(m.payload_chars for m in outputs) <= shared_input_bound(CONFIG)
    events = _s5(mem.compress_if_needed())
    # One summarizer call for three messages: three events, three offloads, three replacements.
    assert summarizer.calls == 1 and summarizer.requests[0].parts == 3
    assert [e.status for e in events] == ["applied"] * 3
    assert sorted(e.replaced_ids for e in events) == [(m.id,) for m in outputs]
    assert len({e.offload_uuid for e in events}) == 3
    working = {m.id: m for m in mem.messages()}
    for event, original in zip(sorted(events, key=lambda e: e.replaced_ids), outputs, strict=True):
        summary = working[event.summary_message_id]
        (result,) = summary.tool_results
        k = outputs.index(original)
        # Its own place: its call id and tool name, its own content, its own tag.
        assert (result.tool_use_id, result.name) == (f"call_{k}", "read_file")
        assert f"part_{k} begins" in result.output_text
        assert not any(f"part_{j} " in result.output_text for j in range(3) if j != k)
        tag = OFFLOAD_TAG_RE.search(result.output_text.splitlines()[-1])
        assert tag is not None and tag.group("handle") == str(handle_of(mem, event.offload_uuid))
        assert [m.tool_results[0].output_text for m in mem.reload(tag.group("handle"))] == [
            original.tool_results[0].output_text
        ]
    assert_valid_openai_chat(mem.to_openai())
    assert_every_original_reachable(mem)


def test_a_message_over_the_bound_goes_alone(open_memory: Open) -> None:
    summarizer = CountingSummarizer()
    # A low target: S5 takes only what the target needs (docs/design.md §3), here all three.
    config = dataclasses.replace(CONFIG, max_tokens=5_500, target_ratio=0.3)
    mem = open_memory(config=config, summarizer=summarizer)
    added = mem.add(_round([190, 52, 56]))
    big = next(m for m in added if m.role == "tool")
    assert big.payload_chars > shared_input_bound(config)
    events = _s5(mem.compress_if_needed())
    assert [e.status for e in events] == ["applied"] * 3
    assert summarizer.calls == 2
    alone, shared = sorted(summarizer.requests, key=lambda r: r.parts)
    # The large one in a request of its own, as before requests were shared.
    assert (alone.parts, alone.prompt) == (0, S5_PAYLOAD) and "part_0 begins" in alone.transcript
    assert shared.parts == 2 and "part_0 begins" not in shared.transcript


def test_a_callers_s5_prompt_keeps_one_request_per_message(open_memory: Open) -> None:
    summarizer = CountingSummarizer()
    prompt = "Shorten this one message; keep every id."
    config = dataclasses.replace(CONFIG, prompts={5: prompt})
    mem = open_memory(config=config, summarizer=summarizer)
    mem.add(_round([46, 50, 54]))
    events = _s5(mem.compress_if_needed())
    assert [e.status for e in events] == ["applied"] * 3
    assert summarizer.calls == 3
    assert all(r.parts == 0 and r.prompt == prompt for r in summarizer.requests)


class _OwnSummarizer:
    """A caller's summarizer written before shared requests: it does not declare
    `answers_shared_requests`, so S5 sends it one message per request."""

    def __init__(self) -> None:
        self.inner = OfflineSummarizer()
        self.requests: list[SummaryRequest] = []

    def summarize(self, request: SummaryRequest) -> SummaryResult:
        self.requests.append(request)
        return self.inner.summarize(request)


def test_a_summarizer_that_does_not_declare_shared_answers_gets_one_request_each(
    open_memory: Open,
) -> None:
    summarizer = _OwnSummarizer()
    mem = open_memory(config=CONFIG, summarizer=summarizer)
    mem.add(_round([46, 50, 54]))
    events = _s5(mem.compress_if_needed())
    assert [e.status for e in events] == ["applied"] * 3
    assert len(summarizer.requests) == 3
    assert all(r.parts == 0 and r.prompt == S5_PAYLOAD for r in summarizer.requests)
    # autoctx's own summarizers declare it.
    assert OfflineSummarizer.answers_shared_requests and OpenAISummarizer.answers_shared_requests


def test_max_llm_calls_counts_a_shared_request_once(open_memory: Open) -> None:
    """Two requests of two messages each: a budget of three calls (one left for S6) pays for
    both, where one call per message it would have paid for two of the four."""
    summarizer = CountingSummarizer()
    config = dataclasses.replace(CONFIG, max_tokens=5_000)
    mem = open_memory(config=config, summarizer=summarizer, options=RuntimeOptions(max_llm_calls=3))
    mem.add(_round([70, 80, 76, 82]))
    events = _s5(mem.compress_if_needed())
    assert summarizer.calls == 2 and [r.parts for r in summarizer.requests] == [2, 2]
    assert [e.status for e in events] == ["applied"] * 4


# -- the ladder, with OpenAISummarizer and a real local server ------------------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer() as srv:
        yield srv


def _user_text(body: Mapping[str, Any]) -> str:
    return str(next(m["content"] for m in body["messages"] if m["role"] == "user"))


def _answering(write: Callable[[int, str], str | None]) -> Callable[[dict[str, Any]], Reply]:
    """A server reply that answers a shared request part by part: `write(k, transcript)` is
    message k's summary (None leaves its header out)."""

    def reply(body: dict[str, Any]) -> Reply:
        transcript = _user_text(body).removeprefix("Transcript to summarize:\n\n")
        parts = split_parts(transcript)
        assert parts is not None, "not a shared request"
        out = []
        for k, part in enumerate(parts, 1):
            text = write(k, part.transcript)
            if text is not None:
                out.append(f"{summary_header(k)}\n{text}")
        return Reply.text("\n\n".join(out))

    return reply


def _short(k: int, transcript: str) -> str:
    name = re.search(r"part_\d+", transcript)
    return f"- read_file of {name.group(0) if name else '?'}: a Python file of handlers"


#: The model the summarizer asks for; the server answers under the name it is asked for.
MODEL = "summary-model"


def _openai_memory(open_memory: Open, server: OpenAIServer, **kw: Any) -> AutoContextMemory:
    summarizer = OpenAISummarizer(
        base_url=server.base_url, api_key="test", model=MODEL, timeout=10, max_retries=0
    )
    return open_memory(config=CONFIG, summarizer=summarizer, **kw)


def test_a_shared_call_is_one_http_request_and_its_usage_is_counted_once(
    open_memory: Open, server: OpenAIServer
) -> None:
    server.reset()
    server.set_default(_answering(_short))
    mem = _openai_memory(open_memory, server)
    mem.add(_round([46, 50, 54]))
    events = _s5(mem.compress_if_needed())
    (request,) = server.requests
    assert request["messages"][0]["content"] == S5_SHARED
    assert [e.status for e in events] == ["applied"] * 3
    # The call's model and usage on the first event only: summed over the events, or counted
    # by the audit view, the call is there once.
    first, *others = events
    assert first.model == MODEL and first.prompt_tokens and first.completion_tokens
    assert first.latency_ms is not None
    assert all(
        (e.model, e.prompt_tokens, e.completion_tokens, e.latency_ms) == (None,) * 4 for e in others
    )
    (cost,) = sql(
        mem,
        "select llm_calls, prompt_tokens, completion_tokens from autoctx_session_cost "
        "where session_id = :s",
        s=mem.session_id,
    )
    assert tuple(cost) == (1, first.prompt_tokens, first.completion_tokens)
    for k, event in enumerate(events):
        (summary,) = [m for m in mem.messages() if m.id == event.summary_message_id]
        assert f"part_{k}" in summary.tool_results[0].output_text


def _by_message(mem: AutoContextMemory, added: list[Msg]) -> list[Any]:
    """The S5 events of the call, one per tool output of `added`, in their order."""
    events = _s5(mem.compress_if_needed())
    by_message = {e.replaced_ids: e for e in events}
    assert len(by_message) == len(events)
    return [by_message[(m.id,)] for m in added if m.role == "tool"]


def test_a_malformed_shared_answer_fails_only_its_parts(
    open_memory: Open, server: OpenAIServer
) -> None:
    """Message 1's summary is fine, message 2's is missing and message 3's carries a tag:
    only message 1 is replaced, by its own summary; the others fail with the reasons an
    answer of their own would, and stay in their places."""
    server.reset()

    def write(k: int, transcript: str) -> str | None:
        if k == 2:
            return None
        if k == 3:
            return f"kept\n{offload_tag(4)}"
        return _short(k, transcript)

    server.set_default(_answering(write))
    # One call: S6 cannot step in after S5, so what S5 did is all there is to see.
    mem = _openai_memory(open_memory, server, options=RuntimeOptions(max_llm_calls=1))
    added = mem.add(_round([46, 50, 54]))
    first, missing, tagged = _by_message(mem, added)
    assert len(server.requests) == 1
    assert first.status == "applied"
    assert [(e.status, (e.error or "").split(":")[0]) for e in (missing, tagged)] == [
        ("failed", "empty"),
        ("failed", "tag_in_answer"),
    ]
    # The call's usage once, on the first message's event.
    assert first.prompt_tokens and not any(e.prompt_tokens for e in (missing, tagged))
    working = {m.id: m for m in mem.messages()}
    assert "part_0" in working[first.summary_message_id].tool_results[0].output_text
    outputs = [m for m in added if m.role == "tool"]
    for original in outputs[1:]:
        assert working[original.id].kind == "original"  # untouched, in its place
    # A failed range is retried only after the session changes: a second call with nothing
    # new asks the endpoint nothing and records nothing.
    assert mem.compress_if_needed() == [] and len(server.requests) == 1


def test_a_part_no_shorter_than_its_message_fails_and_still_carries_the_calls_usage(
    open_memory: Open, server: OpenAIServer
) -> None:
    server.reset()
    server.set_default(_answering(lambda k, t: f"{t}\n{t}" if k == 1 else _short(k, t)))
    mem = _openai_memory(open_memory, server, options=RuntimeOptions(max_llm_calls=1))
    added = mem.add(_round([46, 50, 54]))
    first, *others = _by_message(mem, added)
    assert first.status == "failed" and (first.error or "").startswith("no_gain")
    # The answer came and was paid for: its usage is on the first event, failed or not.
    assert first.model == MODEL and first.prompt_tokens
    assert all(e.status == "applied" and e.model is None for e in others)


def test_a_request_the_summarizer_refuses_fails_each_message_once(
    open_memory: Open, server: OpenAIServer
) -> None:
    server.reset()
    server.set_default(Reply.text("I'm sorry, I can't help with that."))
    mem = _openai_memory(open_memory, server, options=RuntimeOptions(max_llm_calls=1))
    added = mem.add(_round([46, 50, 54]))
    events = _s5(mem.compress_if_needed())
    assert len(server.requests) == 1
    assert sorted(e.replaced_ids for e in events) == [(m.id,) for m in added if m.role == "tool"]
    assert {(e.status, (e.error or "").split(":")[0]) for e in events} == {("failed", "refusal")}


def test_shared_request_fields_default_to_a_request_of_one_range() -> None:
    assert SummaryRequest(strategy=5, prompt="p", transcript="t", input_chars=1).parts == 0
