"""Compression lifecycle hooks and OpenTelemetry spans (docs/design.md §6, issue 23 item 2).

Real compressions on PostgreSQL through the migrations, summarized by `OpenAISummarizer` against
a real local OpenAI-protocol server (tests/openai_server.py); spans go through the OpenTelemetry
API to the SDK's `InMemorySpanExporter`. Sync, async, and background mode; a hook that raises;
and a process without the `opentelemetry` package.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest
from opentelemetry import trace
from opentelemetry.trace import StatusCode

from autoctx import (
    AsyncAutoContextMemory,
    AutoContextClient,
    AutoContextMemory,
    CompressionHooks,
    CompressionInfo,
    ConfigError,
    Event,
    OpenAISummarizer,
    RuntimeOptions,
)
from tests.histories import SMALL, multi_round
from tests.openai_server import OpenAIServer, Reply

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

Open = Callable[..., AutoContextMemory]
MODEL = "test-model"


@pytest.fixture(scope="module")
def exporter() -> InMemorySpanExporter:
    """The in-memory exporter of the process's tracer provider (set here once, or added to
    the SDK provider another module set)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


@pytest.fixture
def spans(exporter: InMemorySpanExporter) -> Iterator[InMemorySpanExporter]:
    exporter.clear()
    yield exporter
    exporter.clear()


@pytest.fixture(scope="module")
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer(model=MODEL) as srv:
        yield srv


def _summarizer(server: OpenAIServer) -> OpenAISummarizer:
    return OpenAISummarizer(base_url=server.base_url, api_key="test", model=MODEL, max_retries=0)


@dataclass
class Seen:
    """What the hooks received, and in which thread."""

    before: list[CompressionInfo] = field(default_factory=list)
    after: list[CompressionInfo] = field(default_factory=list)
    failures: list[CompressionInfo] = field(default_factory=list)
    threads: set[str] = field(default_factory=set)

    def hooks(self) -> CompressionHooks:
        def keep(into: list[CompressionInfo]) -> Callable[[CompressionInfo], None]:
            def hook(info: CompressionInfo) -> None:
                self.threads.add(threading.current_thread().name)
                into.append(info)

            return hook

        return CompressionHooks(
            before=keep(self.before), after=keep(self.after), on_failure=keep(self.failures)
        )


def _finished(exporter: InMemorySpanExporter) -> tuple[list[ReadableSpan], list[ReadableSpan]]:
    """(the compression spans, the summarizer call spans)."""
    finished = list(exporter.get_finished_spans())
    compress = [s for s in finished if s.name == "autoctx.compress"]
    calls = [s for s in finished if s.name.startswith("chat ")]
    return compress, calls


def _check_after(seen: Seen, applied: list[Event], session_id: str) -> None:
    """Each applied event reached the `after` hook once, with its figures and usage."""
    assert [i.event for i in seen.after] == applied
    for info in seen.after:
        event = info.event
        assert event is not None
        assert info.session_id == session_id
        assert (info.strategy, info.reason) == (event.strategy, event.reason)
        assert (info.tokens_before, info.tokens_after) == (event.tokens_before, event.tokens_after)
        if event.model is None:
            assert info.usage is None  # a preview calls no summarizer
        else:
            assert info.usage is not None
            assert info.usage.model == event.model
            assert info.usage.prompt_tokens == event.prompt_tokens
            assert info.usage.completion_tokens == event.completion_tokens
            assert info.usage.latency_ms == event.latency_ms
        # The fact check's counts travel with the event (docs/design.md §6).
        assert info.facts == event.facts
        assert (info.facts is None) == (event.strategy not in (1, 4, 5, 6, 7))
    assert all(i.event is None and i.tokens_after is None for i in seen.before)
    assert all(i.facts is None for i in seen.before)
    assert {i.strategy for i in seen.after} <= {i.strategy for i in seen.before}


def _check_spans(
    exporter: InMemorySpanExporter, seen: Seen, events: list[Event], server: OpenAIServer
) -> None:
    compress, calls = _finished(exporter)
    session_id = seen.before[0].session_id
    # One span per attempt (each `before`), one child span per summarizer request.
    assert len(compress) == len(seen.before)
    assert [s.attributes["autoctx.strategy"] for s in compress] == [i.strategy for i in seen.before]
    assert len(calls) == len(server.requests) > 0
    ids = {s.context.span_id: s for s in compress}
    for span in compress:
        assert span.attributes["gen_ai.conversation.id"] == session_id
    for span in calls:
        assert span.parent is not None and span.parent.span_id in ids
        assert span.kind == trace.SpanKind.CLIENT
        attrs = span.attributes
        assert attrs["gen_ai.operation.name"] == "chat"
        assert attrs["gen_ai.request.model"] == MODEL
        assert attrs["gen_ai.provider.name"] == "openai"
        assert attrs["server.address"] == "127.0.0.1"
        assert attrs["gen_ai.conversation.id"] == session_id
    # The usage on the spans is the usage on the events.
    llm = [e for e in events if e.model == MODEL and e.status == "applied"]
    assert sum(s.attributes.get("gen_ai.usage.input_tokens", 0) for s in calls) == sum(
        e.prompt_tokens or 0 for e in llm
    )
    assert sum(s.attributes.get("gen_ai.usage.output_tokens", 0) for s in calls) == sum(
        e.completion_tokens or 0 for e in llm
    )
    # No span carries message content: attribute values are names and numbers.
    for span in compress + calls:
        for value in span.attributes.values():
            assert not isinstance(value, str) or len(value) < 120


def test_hooks_and_spans_follow_a_blocking_compression(
    open_memory: Open, server: OpenAIServer, spans: InMemorySpanExporter
) -> None:
    seen = Seen()
    mem = open_memory(config=SMALL, summarizer=_summarizer(server), hooks=seen.hooks())
    mem.add(multi_round(8, rounds=4, steps=8))
    server.reset()
    events = mem.compress_if_needed()
    applied = [e for e in events if e.status == "applied"]
    assert applied and any(e.model == MODEL for e in applied)
    assert seen.before[0].tokens_before == applied[0].tokens_before
    assert seen.before[0].reason in ("tokens", "count")
    _check_after(seen, applied, mem.session_id)
    assert seen.failures == []
    assert seen.threads == {threading.current_thread().name}
    _check_spans(spans, seen, events, server)
    compress, _ = _finished(spans)
    done = [s for s in compress if s.attributes.get("autoctx.status") == "applied"]
    assert done and all(s.status.status_code != StatusCode.ERROR for s in done)
    assert {s.attributes["autoctx.tokens_after"] for s in done} <= {e.tokens_after for e in applied}
    # The spans carry the fact check's counts of the attempt's summaries (numbers only).
    for name in ("found", "kept", "repaired", "listed", "dropped"):
        assert sum(s.attributes.get(f"autoctx.facts.{name}", 0) for s in done) == sum(
            getattr(e.facts, name) for e in applied if e.facts is not None
        )
    assert any(s.attributes.get("autoctx.facts.found") for s in done)
    # A span of the caller's is the parent of the compression's spans.
    spans.clear()
    mem.add(multi_round(9, rounds=3, steps=8))
    with trace.get_tracer("tests").start_as_current_span("agent step") as step:
        mem.compress_if_needed()
    compress, _ = _finished(spans)
    assert compress
    assert all(
        s.parent is not None and s.parent.span_id == step.get_span_context().span_id
        for s in compress
    )


def test_a_failing_summarizer_calls_the_failure_hook_and_marks_the_spans(
    open_memory: Open, server: OpenAIServer, spans: InMemorySpanExporter
) -> None:
    seen = Seen()
    mem = open_memory(
        config=SMALL,
        options=RuntimeOptions(max_llm_calls=2),
        summarizer=_summarizer(server),
        hooks=seen.hooks(),
    )
    mem.add(multi_round(8, rounds=4, steps=8))
    server.reset()
    server.set_default(Reply.server_error(500, "boom"))
    try:
        events = mem.compress_if_needed()
    finally:
        server.set_default(Reply.text())
    failed = [e for e in events if e.status == "failed"]
    assert failed
    assert [i.event for i in seen.failures] == failed
    for info in seen.failures:
        assert info.event is not None and info.event.error is not None
        assert info.event.error.startswith("http_error")
        assert info.tokens_after == info.tokens_before  # nothing changed
    _check_after(seen, [e for e in events if e.status == "applied"], mem.session_id)
    compress, calls = _finished(spans)
    assert len(calls) == len(server.requests) == len(failed)
    assert all(s.status.status_code == StatusCode.ERROR for s in calls)
    assert all(s.attributes["error.type"] == "http_error" for s in calls)
    failing = {c.parent.span_id for c in calls if c.parent is not None}
    failed_spans = [s for s in compress if s.attributes.get("autoctx.status") == "failed"]
    assert failed_spans and {s.context.span_id for s in failed_spans} <= failing
    for span in failed_spans:
        assert span.status.status_code == StatusCode.ERROR
        assert [e.name for e in span.events] == ["autoctx.failure"]
        assert span.events[0].attributes is not None
        assert span.events[0].attributes["error.type"] == "http_error"


def test_a_hook_that_raises_does_not_break_the_compression(
    open_memory: Open, server: OpenAIServer, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "the customer's card number 4111-1111"

    def boom(info: CompressionInfo) -> None:
        raise RuntimeError(secret)

    quiet = open_memory(
        "quiet-" + os.urandom(4).hex(), config=SMALL, summarizer=_summarizer(server)
    )
    quiet.add(multi_round(8, rounds=4, steps=8))
    expected = [(e.strategy, e.status) for e in quiet.compress_if_needed()]
    seen = Seen()
    mem = open_memory(
        config=SMALL,
        summarizer=_summarizer(server),
        hooks=[CompressionHooks(before=boom, after=boom, on_failure=boom), seen.hooks()],
    )
    mem.add(multi_round(8, rounds=4, steps=8))
    with caplog.at_level(logging.WARNING, logger="autoctx"):
        events = mem.compress_if_needed()
    # The same compression as without hooks (the offload uuids, and so a token or two, differ).
    assert [(e.strategy, e.status) for e in events] == expected
    assert mem.token_count() < SMALL.token_target
    # The hooks after the one that raised still ran.
    assert [i.event for i in seen.after] == [e for e in events if e.status == "applied"]
    logged = [r.getMessage() for r in caplog.records if "hook raised" in r.getMessage()]
    assert any("the before hook raised RuntimeError" in m for m in logged)
    assert any("the after hook raised RuntimeError" in m for m in logged)
    assert all(secret not in r.getMessage() and not r.exc_info for r in caplog.records)


def test_hooks_in_background_mode_run_in_the_compressing_thread(
    open_memory: Open, server: OpenAIServer, spans: InMemorySpanExporter
) -> None:
    seen = Seen()
    mem = open_memory(
        config=SMALL, summarizer=_summarizer(server), hooks=seen.hooks(), background=True
    )
    mem.add(multi_round(8, rounds=4, steps=8))
    server.reset()
    events = mem.compress_in_background().result(timeout=120)
    applied = [e for e in events if e.status == "applied"]
    assert applied
    _check_after(seen, applied, mem.session_id)
    assert seen.threads and threading.current_thread().name not in seen.threads
    _check_spans(spans, seen, events, server)


def test_client_hooks_and_async_memories_in_both_modes(
    db_url: str, server: OpenAIServer, spans: InMemorySpanExporter
) -> None:
    """Hooks registered on the client observe every memory opened through it, before the
    memory's own; the async memory awaits the summarizer (no thread waits on it)."""
    from_client, own = Seen(), Seen()

    async def main() -> list[list[Event]]:
        out: list[list[Event]] = []
        with AutoContextClient(db_url, hooks=from_client.hooks()) as client:
            for background in (False, True):
                sync = client.open(
                    f"hooks-async-{background}-{os.urandom(4).hex()}",
                    SMALL,
                    summarizer=_summarizer(server),
                    hooks=own.hooks(),
                    background=background,
                )
                mem = AsyncAutoContextMemory(sync)
                await mem.add(multi_round(8, rounds=4, steps=8))
                if background:
                    out.append(await (await mem.compress_in_background()))
                else:
                    out.append(await mem.compress_if_needed())
        return out

    server.reset()
    blocking, background = asyncio.run(main())
    applied = [e for e in blocking + background if e.status == "applied"]
    assert {e.session_id for e in applied} == {e.session_id for e in blocking + background}
    assert len({e.session_id for e in applied}) == 2
    for seen in (from_client, own):
        assert [i.event for i in seen.after] == applied
    compress, calls = _finished(spans)
    assert len(compress) == len(own.before) and len(calls) == len(server.requests) > 0
    by_id = {s.context.span_id for s in compress}
    assert all(c.parent is not None and c.parent.span_id in by_id for c in calls)


def test_bad_hooks_are_refused_with_the_fix(open_memory: Open) -> None:
    with pytest.raises(ConfigError, match="CompressionHooks"):
        open_memory(hooks=lambda info: None)
    with pytest.raises(ConfigError, match="before must be a callable"):
        CompressionHooks(before="print")  # type: ignore[arg-type]


def test_without_opentelemetry_nothing_breaks(db_url: str, session_id: str) -> None:
    """A process where `opentelemetry` cannot be imported compresses as ever, hooks included."""
    code = """
import json, os, sys
sys.modules["opentelemetry"] = None  # import opentelemetry now raises ImportError
from autoctx import AutoContextMemory, CompressionHooks, OfflineSummarizer
from autoctx import _observe
from tests.histories import SMALL, multi_round
assert _observe.otel_trace is None
after = []
mem = AutoContextMemory.open(
    os.environ["SID"], os.environ["URL"], SMALL, summarizer=OfflineSummarizer(),
    hooks=CompressionHooks(after=after.append),
)
mem.add(multi_round(8, rounds=4, steps=8))
events = mem.compress_if_needed()
print(json.dumps({
    "applied": sum(e.status == "applied" for e in events),
    "after": len(after),
    "otel": [m for m in sys.modules if m.startswith("opentelemetry")],
}))
"""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "SID": session_id, "URL": db_url, "PYTHONPATH": root}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["applied"] > 0 and result["after"] == result["applied"]
    assert result["otel"] == ["opentelemetry"]  # only the blocked name itself


def test_a_workers_hooks_observe_its_compressions(db_url: str, open_memory: Open) -> None:
    from autoctx import OfflineSummarizer
    from autoctx._worker import AutoContextWorker

    mem = open_memory("worker-hooks-" + os.urandom(4).hex(), config=SMALL)
    mem.add(multi_round(8, rounds=4, steps=8))
    assert mem.needs_compression()
    seen = Seen()
    worker = AutoContextWorker(db_url, summarizer=OfflineSummarizer(), hooks=seen.hooks())
    try:
        assert worker.run(once=True) >= 1
    finally:
        worker.close()
    # Read back, the events carry their commit time; the hooks got them as committed.
    applied = [
        dataclasses.replace(e, created_at=None) for e in mem.events() if e.status == "applied"
    ]
    assert applied
    seen.after = [
        dataclasses.replace(i, event=dataclasses.replace(i.event, created_at=None))
        for i in seen.after
        if i.event is not None
    ]
    _check_after(seen, applied, mem.session_id)
