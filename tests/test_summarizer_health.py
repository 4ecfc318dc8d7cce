"""A summarizer that says what it is doing (docs/design.md §6, issue 23 item 4).

The line a memory logs when it opens (which summarizer, model and endpoint, and why); a model
that is not found and a refused key say so and name the setting to change; an endpoint that
keeps failing is left alone for a back-off (counted in requests at a real local OpenAI-protocol
server across many compressions) while the offline fallback keeps the bound, and the events say
so.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from autoctx import (
    AutoContextMemory,
    ConfigError,
    Event,
    OfflineSummarizer,
    OpenAISummarizer,
    RuntimeOptions,
    SummarizerError,
    SummaryRequest,
)
from autoctx._summarizers import SUMMARIZER_REASONS
from tests.histories import SMALL, long_task
from tests.openai_server import OpenAIServer, Reply

Open = Callable[..., AutoContextMemory]

#: A window that the history below keeps filling, so that most steps compress and the bound
#: needs the offline fallback while the endpoint is left alone.
CONFIG = dataclasses.replace(SMALL, max_tokens=6000, min_tool_run=10_000)
OPTIONS = RuntimeOptions(max_llm_calls=2)
ENV = ("OPENAI_BASE_URL", "OPENAI_API_KEY", "AUTOCTX_SUMMARY_MODEL", "OPENAI_MODEL")


@pytest.fixture(scope="module")
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer() as srv:
        yield srv


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def _request() -> SummaryRequest:
    return SummaryRequest(strategy=1, prompt="Summarize.", transcript="[user] hello", input_chars=5)


def _opened(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "summaries by" in r.getMessage()]


# ---------------------------------------------------------------------------------------------
# The line at open
# ---------------------------------------------------------------------------------------------


def test_the_open_line_names_the_summarizer_model_endpoint_and_why(
    open_memory: Open,
    server: OpenAIServer,
    clean_env: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="autoctx")
    # Nothing in the environment: offline, and which variables would have changed that.
    open_memory("open-offline", summarizer=None).close()
    (line,) = _opened(caplog)
    assert "offline summarizer" in line and "OPENAI_BASE_URL" in line and "'open-offline'" in line
    # An endpoint in the environment: the OpenAI-compatible summarizer, the default model, and
    # the variables that chose them.
    caplog.clear()
    clean_env.setenv("OPENAI_BASE_URL", server.base_url)
    open_memory("open-env", summarizer=None).close()
    (line,) = _opened(caplog)
    assert "OpenAISummarizer" in line and "'gpt-4o-mini'" in line
    assert "the default: neither AUTOCTX_SUMMARY_MODEL nor OPENAI_MODEL is set" in line
    assert server.base_url.rstrip("/") in line and "from OPENAI_BASE_URL" in line
    assert "chosen because OPENAI_BASE_URL is set" in line
    assert "OfflineSummarizer()" in line, "how to keep summaries local"
    caplog.clear()
    clean_env.setenv("AUTOCTX_SUMMARY_MODEL", "local-llama")
    clean_env.setenv("OPENAI_API_KEY", "sk-test-secret-key")
    open_memory("open-model", summarizer=None).close()
    (line,) = _opened(caplog)
    assert "'local-llama' (from AUTOCTX_SUMMARY_MODEL)" in line
    assert "key from OPENAI_API_KEY" in line and "sk-test-secret-key" not in line
    assert "OPENAI_BASE_URL and OPENAI_API_KEY are set" in line
    # A summarizer the caller passed.
    caplog.clear()
    open_memory("open-given", summarizer=OfflineSummarizer()).close()
    (line,) = _opened(caplog)
    assert "the summarizer passed to open(): OfflineSummarizer" in line


# ---------------------------------------------------------------------------------------------
# Failures that retrying cannot cure
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "reason", "setting"),
    [
        (404, "model_not_found", "AUTOCTX_SUMMARY_MODEL"),
        (401, "auth", "OPENAI_API_KEY"),
        (403, "auth", "OPENAI_API_KEY"),
    ],
)
def test_a_failure_that_retrying_cannot_cure_says_so_and_names_the_setting(
    server: OpenAIServer, status: int, reason: str, setting: str
) -> None:
    assert reason in SUMMARIZER_REASONS
    summarizer = OpenAISummarizer(base_url=server.base_url, api_key="k", max_retries=2)
    server.reset()
    server.set_default(Reply.error(status, "secret body: the transcript says hello"))
    try:
        with pytest.raises(SummarizerError) as failure:
            summarizer.summarize(_request())
    finally:
        server.set_default(Reply.text())
    assert failure.value.reason == reason
    detail = failure.value.detail
    assert f"HTTP {status}" in detail and setting in detail, detail
    assert ("model not found" if status == 404 else "authentication failed") in detail
    assert "gpt-4o-mini" in detail and "secret body" not in detail and "hello" not in detail
    # Not retried (the client's rule), and the endpoint is left alone after the first.
    assert len(server.requests) == 1
    with pytest.raises(SummarizerError) as again:
        summarizer.summarize(_request())
    assert again.value.reason == "backoff" and reason in again.value.detail
    assert len(server.requests) == 1


# ---------------------------------------------------------------------------------------------
# Backing off at the memory level
# ---------------------------------------------------------------------------------------------


def _steps(mem: AutoContextMemory, history: list, size: int) -> Iterator[list[Event]]:
    for start in range(0, len(history), size):
        mem.add(history[start : start + size])
        yield mem.compress_if_needed()
        assert mem.token_count() < mem.config.max_tokens, "the bound holds meanwhile"


def test_a_missing_model_is_not_called_at_every_compression(
    open_memory: Open, server: OpenAIServer, caplog: pytest.LogCaptureFixture
) -> None:
    summarizer = OpenAISummarizer(
        base_url=server.base_url, api_key="k", backoff_s=3600, max_backoff_s=3600
    )
    mem = open_memory(config=CONFIG, options=OPTIONS, summarizer=summarizer)
    server.reset()
    server.set_default(Reply.error(404, "The model `gpt-4o-mini` does not exist"))
    try:
        with caplog.at_level(logging.WARNING, logger="autoctx"):
            events = [
                e for step in _steps(mem, long_task(3, steps=80, big_every=3), 4) for e in step
            ]
    finally:
        server.set_default(Reply.text())
    compressions = sum(1 for e in events if e.status == "applied")
    failed = [e for e in events if e.status == "failed"]
    assert compressions >= 10
    # One request in all: the first 404 started the back-off.
    assert len(server.requests) == 1
    assert failed[0].error is not None and failed[0].error.startswith("model_not_found")
    assert "AUTOCTX_SUMMARY_MODEL" in failed[0].error
    later = failed[1:]
    assert later and all(e.error is not None and e.error.startswith("backoff") for e in later)
    assert all("model_not_found" in (e.error or "") for e in later)
    # The offline fallback kept the bound: its summaries applied meanwhile.
    assert any(e.reason == "fallback" and e.status == "applied" for e in events)
    # Said once, not at every compression.
    warnings = [r.getMessage() for r in caplog.records]
    assert sum("not calling it for" in w for w in warnings) == 1
    assert sum("model_not_found" in w for w in warnings) <= 2
    assert not any("(backoff)" in w for w in warnings)


def test_a_failing_endpoint_is_retried_after_the_back_off(
    open_memory: Open, server: OpenAIServer
) -> None:
    summarizer = OpenAISummarizer(
        base_url=server.base_url,
        api_key="k",
        model="test-model",
        max_retries=0,
        backoff_after=3,
        backoff_s=0.5,
        max_backoff_s=1.0,
    )
    server.reset()
    server.set_default(Reply.server_error(503, "down"))
    try:
        reasons = []
        for _ in range(8):
            try:
                summarizer.summarize(_request())
            except SummarizerError as exc:
                reasons.append(exc.reason)
        # Three failed calls in a row, then no request until the back-off has passed.
        assert reasons == ["http_error"] * 3 + ["backoff"] * 5
        assert len(server.requests) == 3
        time.sleep(0.6)
        with pytest.raises(SummarizerError) as failure:
            summarizer.summarize(_request())
        assert failure.value.reason == "http_error"  # one try after the back-off
        assert len(server.requests) == 4
        with pytest.raises(SummarizerError) as waiting:
            summarizer.summarize(_request())
        assert waiting.value.reason == "backoff" and "back-off 1 s" in waiting.value.detail
    finally:
        server.set_default(Reply.text())
    time.sleep(1.1)
    assert summarizer.summarize(_request()).text  # it answers again: the back-off ends
    assert len(server.requests) == 5
    server.set_default(Reply.server_error(503, "down"))
    try:
        # A fresh count: two failures do not start a back-off again.
        for _ in range(2):
            with pytest.raises(SummarizerError, match="HTTP 503"):
                summarizer.summarize(_request())
    finally:
        server.set_default(Reply.text())
    assert summarizer.summarize(_request()).text


def test_the_async_summarizer_backs_off_too(open_memory: Open, server: OpenAIServer) -> None:
    import asyncio

    summarizer = OpenAISummarizer(
        base_url=server.base_url, api_key="k", backoff_s=3600, max_backoff_s=3600
    )
    server.reset()
    server.set_default(Reply.error(401, "bad key"))
    try:

        async def main() -> list[str]:
            out = []
            for _ in range(5):
                try:
                    await summarizer.asummarize(_request())
                except SummarizerError as exc:
                    out.append(exc.reason)
            return out

        assert asyncio.run(main()) == ["auth"] + ["backoff"] * 4
    finally:
        server.set_default(Reply.text())
    assert len(server.requests) == 1


def test_bad_back_off_settings_are_refused(server: OpenAIServer) -> None:
    for kwargs in ({"backoff_after": 0}, {"backoff_s": -1}, {"max_backoff_s": float("nan")}):
        with pytest.raises(ConfigError, match="OpenAISummarizer"):
            OpenAISummarizer(base_url=server.base_url, api_key="k", **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="at least backoff_s"):
        OpenAISummarizer(base_url=server.base_url, api_key="k", backoff_s=60, max_backoff_s=1)


def test_an_answering_endpoint_counts_no_failure(server: OpenAIServer) -> None:
    summarizer = OpenAISummarizer(base_url=server.base_url, api_key="k", backoff_after=1)
    server.reset()
    for _ in range(3):
        assert summarizer.summarize(_request()).text
    assert len(server.requests) == 3


# ---------------------------------------------------------------------------------------------
# One compression meets one outage once (issue: a 4-second outage cost 4 minutes)
# ---------------------------------------------------------------------------------------------


def _one_big_call(mem: AutoContextMemory) -> list[Event]:
    """One `compress_if_needed()` over a history that gives the ladder many ranges at once."""
    mem.add(long_task(2, steps=40, big_every=2))
    return mem.compress_if_needed()


def test_requests_in_flight_together_count_as_one_failure(server: OpenAIServer) -> None:
    """An outage met by requests in flight at once (a compression's batch) is one failure:
    the back-off starts at its first length, not doubled by each answer in flight; and when
    it runs out, one request tries the endpoint while the others still wait."""
    summarizer = OpenAISummarizer(
        base_url=server.base_url,
        api_key="k",
        model="test-model",
        max_retries=0,
        backoff_after=1,
        backoff_s=0.5,
        max_backoff_s=600,
    )
    server.reset()
    # Slow enough that the four requests are all in flight when the first fails.
    server.set_default(Reply.server_error(503, "down").with_delay(0.3))

    def together(count: int) -> list[str]:
        start = threading.Barrier(count)

        def one() -> str:
            start.wait()
            try:
                summarizer.summarize(_request())
            except SummarizerError as exc:
                return exc.reason
            return "answered"

        with ThreadPoolExecutor(count) as pool:
            return list(pool.map(lambda _: one(), range(count)))

    try:
        assert together(4) == ["http_error"] * 4
        assert len(server.requests) == 4
        with pytest.raises(SummarizerError) as waiting:
            summarizer.summarize(_request())
        assert waiting.value.reason == "backoff"
        detail = waiting.value.detail
        assert "failed 1 call in a row" in detail and "back-off 0 s" in detail, detail
        time.sleep(0.6)
        # The back-off ran out: one of four tries, the others are told to wait for it.
        assert sorted(together(4)) == ["backoff"] * 3 + ["http_error"]
        assert len(server.requests) == 5
        with pytest.raises(SummarizerError) as doubled:
            summarizer.summarize(_request())
        assert "failed 2 calls in a row" in doubled.value.detail
        assert "back-off 1 s" in doubled.value.detail, doubled.value.detail
    finally:
        server.set_default(Reply.text())


def test_a_wrong_model_name_fails_a_call_once_with_one_event(
    open_memory: Open, server: OpenAIServer
) -> None:
    summarizer = OpenAISummarizer(base_url=server.base_url, api_key="k", model="no-such-model")
    mem = open_memory(config=CONFIG, summarizer=summarizer)
    server.reset()
    server.set_default(Reply.error(404, "The model `no-such-model` does not exist"))
    try:
        events = _one_big_call(mem)
        sent = len(server.requests)
        mem.add(long_task(1, steps=20, big_every=2))
        again = mem.compress_if_needed()
    finally:
        server.set_default(Reply.text())
    failed = [e for e in events if e.status == "failed"]
    assert len(failed) == 1, [e.error for e in failed]
    (event,) = failed
    assert event.error is not None and event.error.startswith("model_not_found")
    assert "no-such-model" in event.error and "pass another model=" in event.error
    assert mem.token_count() < mem.config.max_tokens
    assert sent <= RuntimeOptions().summarizer_concurrency
    # The next call is backed off: one event again, no request, and the fallback's summaries.
    (later,) = [e for e in again if e.status == "failed"]
    assert (later.error or "").startswith("backoff") and "model_not_found" in later.error
    assert any(e.reason == "fallback" and e.status == "applied" for e in again)
    assert mem.token_count() < mem.config.max_tokens
    assert len(server.requests) == sent
