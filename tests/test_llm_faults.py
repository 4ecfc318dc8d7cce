"""LLM faults at the memory level (docs/design.md §6), against a real local OpenAI-compatible
server and the official client (no retries, short timeouts).

For every fault: no summary that makes things worse reaches the working context, a `failed`
event records the reason (its error starts with it), the ladder moves on (S2/S3 need no LLM and
still apply), a second call at the same version makes no LLM call, and no exception escapes
unless the runtime options say `strict=True` (then `SummarizerError`, and nothing changed).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from autoctx import (
    AutoContextConfig,
    AutoContextMemory,
    ConfigError,
    Msg,
    OpenAISummarizer,
    RuntimeOptions,
    SummarizerError,
    SummaryRequest,
    SummaryResult,
)
from tests.histories import SMALL, multi_round
from tests.invariants import assert_consistent, assert_every_original_reachable
from tests.openai_server import OpenAIServer, Reply

Open = Callable[..., AutoContextMemory]

TIMEOUT = 0.5
#: Kinds an LLM writes: none of them may come out of a faulty answer.
LLM_KINDS = {
    "tool_run_summary",
    "round_summary",
    "large_summary",
    "current_round_summary",
    "history_summary",
}
# Two LLM attempts per call bound the time a stalling endpoint costs the test.
CONFIG = SMALL
OPTIONS = RuntimeOptions(max_llm_calls=2)


@dataclass(frozen=True)
class Fault:
    name: str
    reply: Reply
    #: The machine reason the failed event's error starts with.
    reason: str
    stream: bool = False
    #: A fragment of the error detail.
    detail: str = ""


REFUSAL_TEXT = "I'm sorry, but I can't help with summarizing this conversation."

FAULTS = [
    Fault(
        "429_retry_after", Reply.rate_limited(retry_after=7), "rate_limited", detail="retry-after=7"
    ),
    Fault("500", Reply.server_error(500, "boom"), "http_error", detail="HTTP 500"),
    Fault(
        "503_streaming",
        Reply.server_error(503, "overloaded"),
        "http_error",
        stream=True,
        detail="HTTP 503",
    ),
    Fault("dropped_mid_stream", Reply.drop(after_chunks=2), "connection", stream=True),
    Fault(
        "stream_ends_without_finish",
        Reply.drop(after_chunks=2, clean_close=True),
        "connection",
        stream=True,
        detail="finish_reason",
    ),
    Fault("dropped_mid_body", Reply.drop(), "connection"),
    Fault("stream_never_finishes", Reply.stall(after_chunks=1), "timeout", stream=True),
    Fault("no_answer_within_timeout", Reply.slow(5), "timeout"),
    Fault("empty", Reply.empty(), "empty"),
    Fault("empty_streaming", Reply.empty(), "empty", stream=True),
    Fault("whitespace", Reply.whitespace(), "empty", detail="whitespace"),
    Fault("only_the_offload_tag", Reply.tag_only(), "tag_in_answer"),
    Fault("refusal_field", Reply.refusal(), "refusal", detail="refused"),
    Fault("refusal_streaming", Reply.refusal(), "refusal", stream=True),
    Fault("content_filter", Reply.text("partial", finish_reason="content_filter"), "refusal"),
    Fault("not_a_completion", Reply.raw_json({"object": "list", "data": []}), "bad_response"),
    Fault("gigantic", Reply.gigantic(120_000), "no_gain"),
]


@pytest.fixture(scope="module")
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer() as srv:
        yield srv


def _summarizer(server: OpenAIServer, stream: bool) -> OpenAISummarizer:
    return OpenAISummarizer(
        base_url=server.base_url, api_key="test", timeout=TIMEOUT, max_retries=0, stream=stream
    )


def _reasons(fault: Fault, strategy: int) -> set[str]:
    """The reasons a failed event of `strategy` may carry for `fault`: an answer too long to
    gain is over the fold's token budget before it is measured against what it replaces."""
    if fault.reason == "no_gain" and strategy == 7:
        return {"no_gain", "over_budget"}
    return {fault.reason}


def _history_memory(
    open_memory: Open, server: OpenAIServer, fault: Fault, **options: Any
) -> AutoContextMemory:
    mem = open_memory(
        config=CONFIG,
        options=dataclasses.replace(OPTIONS, **options),
        summarizer=_summarizer(server, fault.stream),
    )
    mem.add(multi_round(8, rounds=4, steps=8))
    assert mem.needs_compression()
    return mem


@pytest.mark.parametrize("fault", FAULTS, ids=[f.name for f in FAULTS])
def test_a_faulty_answer_never_becomes_a_summary(
    fault: Fault, open_memory: Open, server: OpenAIServer
) -> None:
    mem = _history_memory(open_memory, server, fault)
    before_tokens = mem.token_count()
    server.reset()
    server.set_default(fault.reply)
    try:
        events = mem.compress_if_needed()
        calls = len(server.requests)
        # The same version again: nothing new to try, so no LLM call and no event.
        assert mem.compress_if_needed() == []
        assert len(server.requests) == calls
    finally:
        server.set_default(Reply.text())

    failed = [e for e in events if e.status == "failed"]
    applied = [e for e in events if e.status == "applied"]
    assert failed, [(e.strategy, e.status) for e in events]
    assert calls == len(failed) <= OPTIONS.max_llm_calls
    for e in failed:
        assert e.strategy in (1, 4, 5, 6, 7)
        assert e.error is not None and e.error.split(":")[0] in _reasons(fault, e.strategy), e.error
        assert fault.detail in e.error
        assert e.tokens_after == e.tokens_before and e.summary_message_id is None
    # The ladder moved on: the previews need no LLM, and what the endpoint did not write, if
    # the context was still over the window, the offline fallback did.
    fallback = [e for e in applied if e.reason == "fallback"]
    assert applied and {e.strategy for e in applied if e not in fallback} <= {2, 3}
    assert all(e.model == "offline" for e in fallback)
    assert all(e.tokens_after < e.tokens_before for e in applied)
    written = {e.summary_message_id for e in fallback}
    assert not [m for m in mem.messages() if m.kind in LLM_KINDS and m.id not in written]
    assert mem.token_count() < before_tokens
    assert_consistent(mem)
    assert_every_original_reachable(mem)


@pytest.mark.parametrize(
    "fault",
    [
        f
        for f in FAULTS
        if f.name in ("500", "dropped_mid_stream", "stream_never_finishes", "empty", "gigantic")
    ],
    ids=lambda f: f.name,
)
def test_strict_raises_summarizer_error_and_changes_nothing(
    fault: Fault, open_memory: Open, server: OpenAIServer
) -> None:
    mem = _history_memory(open_memory, server, fault, strict=True)
    version, tokens = mem.version(), mem.token_count()
    server.set_default(fault.reply)
    try:
        with pytest.raises(SummarizerError) as info:
            mem.compress_if_needed()
    finally:
        server.set_default(Reply.text())
    assert info.value.reason in _reasons(fault, 7)
    # The failed rung changed nothing and recorded nothing; what committed before the raise
    # is only what the cheaper rungs before it did (previews, no LLM).
    events = mem.events()
    assert all(e.status == "applied" and e.strategy in (2, 3) for e in events), events
    assert mem.version() == version + len({e.session_version for e in events})
    assert mem.token_count() == (events[-1].tokens_after if events else tokens)
    assert not [m for m in mem.messages() if m.kind in LLM_KINDS]
    assert_consistent(mem)


def test_one_failure_then_good_answers_compress_with_the_llm(
    open_memory: Open, server: OpenAIServer
) -> None:
    """A fault on the first request only: that range fails, the others get real summaries."""
    fault = FAULTS[1]
    mem = _history_memory(open_memory, server, fault, max_llm_calls=8)
    server.reset()
    server.script(fault.reply)
    events = mem.compress_if_needed()
    first = next(e for e in events if e.status == "failed")
    assert all(
        e.status == "applied" and e.strategy in (2, 3) for e in events[: events.index(first)]
    )
    assert first.error is not None and first.error.startswith("http_error:")
    llm_applied = [
        e
        for e in events
        if e.status == "applied" and e.strategy in (1, 4, 5, 6, 7) and e.reason != "fallback"
    ]
    assert llm_applied, [(e.strategy, e.status, e.reason) for e in events]
    # The failed range was not retried within the call (by the summarizer).
    later = events[events.index(first) + 1 :]
    assert all(
        e.replaced_ids != first.replaced_ids
        for e in later
        if e.strategy == first.strategy and e.reason != "fallback"
    )
    assert_consistent(mem)


def test_a_plain_text_refusal_never_becomes_a_summary(
    open_memory: Open, server: OpenAIServer
) -> None:
    fault = Fault("plain_text_refusal", Reply.text(REFUSAL_TEXT), "refusal")
    mem = _history_memory(open_memory, server, fault)
    server.set_default(fault.reply)
    try:
        mem.compress_if_needed()
    finally:
        server.set_default(Reply.text())
    texts = [m.text for m in mem.messages() if m.kind in LLM_KINDS]
    assert not [t for t in texts if REFUSAL_TEXT in t], texts


# ---------------------------------------------------------------------------------------------
# Deadlines (docs/design.md §6): a stalled endpoint costs a compress_if_needed() its deadline
# ---------------------------------------------------------------------------------------------

#: What a busy two-core machine may add to a deadline (the database work around the LLM calls
#: and the offline fallback included) before the call returns: generous, so that the bound
#: cannot flake, and far below what the stalled endpoint alone would cost.
SLACK_S = 10.0


def _chat(rounds: int) -> list[Msg]:
    """Rounds of plain talk, every message under the large-payload size: over the window, and
    nothing a preview can shorten, so only summaries (or the fallback) keep the bound."""
    msgs = [Msg.system("You are a helpful assistant.")]
    for r in range(rounds):
        words = " ".join(f"point{r}_{k} is settled" for k in range(90))
        msgs += [Msg.user(f"Question {r}: {words}"), Msg.assistant(f"Answer {r}: {words}")]
    return msgs


def _over_the_window(open_memory: Open, summarizer: Any, **options: Any) -> AutoContextMemory:
    mem = open_memory(
        config=CONFIG, options=dataclasses.replace(OPTIONS, **options), summarizer=summarizer
    )
    mem.add(_chat(rounds=45))
    assert mem.token_count() >= CONFIG.max_tokens
    return mem


def test_the_compress_deadline_cuts_the_ladder_and_the_fallback_keeps_the_bound(
    open_memory: Open, server: OpenAIServer
) -> None:
    """An endpoint that takes a minute per answer, a per-call deadline of a minute and a
    compress deadline of 3 s: the call in flight is cut at 3 s, no other call starts, and the
    offline fallback brings the context under the window."""
    summarizer = OpenAISummarizer(
        base_url=server.base_url, api_key="test", timeout=120, max_retries=2
    )
    mem = _over_the_window(
        open_memory, summarizer, summarizer_deadline_s=60, compress_deadline_s=3, max_llm_calls=8
    )
    server.reset()
    server.set_default(Reply.slow(60))
    try:
        started = time.monotonic()
        events = mem.compress_if_needed()
        elapsed = time.monotonic() - started
    finally:
        server.set_default(Reply.text())
    print(f"compress_if_needed with a 3 s deadline took {elapsed:.2f} s")
    assert elapsed < 3 + SLACK_S
    failed = [e for e in events if e.status == "failed"]
    assert len(failed) == 1 and len(server.requests) == 1, [(e.strategy, e.error) for e in events]
    assert failed[0].error is not None and failed[0].error.startswith("deadline:")
    fallback = [e for e in events if e.status == "applied" and e.reason == "fallback"]
    assert fallback and all(e.model == "offline" for e in fallback)
    assert mem.token_count() < CONFIG.max_tokens
    # Every event of the call is recorded.
    assert [e.id for e in mem.events()][-len(events) :] == [e.id for e in events]
    assert_consistent(mem)
    assert_every_original_reachable(mem)


class _LateSummarizer:
    """A caller's summarizer that knows nothing of deadlines: it answers after `seconds`."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.calls = 0

    def summarize(self, request: SummaryRequest) -> SummaryResult:
        self.calls += 1
        time.sleep(self.seconds)
        return SummaryResult(text="A fine summary, but too late.", model="late")


def test_an_answer_after_the_call_deadline_is_never_a_summary(open_memory: Open) -> None:
    late = _LateSummarizer(1.5)
    mem = _over_the_window(open_memory, late, summarizer_deadline_s=0.5, max_llm_calls=2)
    events = mem.compress_if_needed()
    failed = [e for e in events if e.status == "failed"]
    assert failed and len(failed) == late.calls
    assert all(e.error is not None and e.error.startswith("deadline:") for e in failed)
    assert not [m for m in mem.messages() if "too late" in m.text]
    assert mem.token_count() < CONFIG.max_tokens


@pytest.mark.parametrize("name", ["summarizer_deadline_s", "compress_deadline_s"])
@pytest.mark.parametrize("value", [0, -1.5, float("inf"), float("nan"), True, "10"])
def test_deadlines_are_validated(name: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=name):
        RuntimeOptions(**{name: value})


def test_deadlines_are_the_processs_options_never_recorded_with_the_thresholds() -> None:
    """docs/design.md §8: a deadline is how this process runs a compression; the session's
    record holds its thresholds only, so a worker and an agent may each keep their own."""
    options = RuntimeOptions(summarizer_deadline_s=30, compress_deadline_s=90.5)
    assert (options.summarizer_deadline_s, options.compress_deadline_s) == (30, 90.5)
    data = AutoContextConfig().to_json()
    assert not {"summarizer_deadline_s", "compress_deadline_s"} & set(data)
    assert AutoContextConfig.from_json(data) == AutoContextConfig()
    defaults = RuntimeOptions()
    assert (defaults.summarizer_deadline_s, defaults.compress_deadline_s) == (120.0, 300.0)
