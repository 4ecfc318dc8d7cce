"""Neither logs nor exception messages carry message content (docs/design.md §6).

A secret marker is planted in every part of a session (system, user and assistant text, tool
arguments, tool outputs, metadata) and in everything the summarizer's endpoint sends back (an
answer, a refusal, an error body, a body that is not a completion). Then the session is driven
through adds, compressions that fail in every way a summarizer can fail, bad inputs that raise,
and reloads. The marker must appear in no log record (every logger, from DEBUG up), in no
exception (its str and repr, and those of its causes), and in no error recorded on an event.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from autoctx import (
    AsyncAutoContextMemory,
    AutoContextMemory,
    Msg,
    OpenAISummarizer,
    RuntimeOptions,
    SummaryRequest,
    SummaryResult,
    ToolUseBlock,
)
from autoctx._prompts import build_request
from tests.histories import SMALL
from tests.openai_server import OpenAIServer, Reply

MARKER = "S3CRET-MARKER-7f3a9c"
Open = Callable[..., AutoContextMemory]
CONFIG = SMALL
OPTIONS = RuntimeOptions(max_llm_calls=3)
UUID = "0b6e4a52-6a3c-4d7e-9a55-3f1f7c0e2d11"

#: What the endpoint sends back, each with the marker in it somewhere.
FAULTS: dict[str, Reply] = {
    "answer": Reply.text(f"Summary: the work on {MARKER} is done."),
    "refusal_field": Reply.refusal(f"I can't summarize {MARKER}."),
    "plain_refusal": Reply.text(f"I'm sorry, but I can't help with {MARKER}."),
    "empty": Reply.empty(),
    "tag_in_answer": Reply.text(f"{MARKER} <!-- CONTEXT_OFFLOAD: uuid={UUID} -->"),
    "nul_in_answer": Reply.text(f"{MARKER}\x00 done"),
    "over_budget": Reply.text(f"{MARKER} " * 20_000, chunk_chars=4096),
    "http_500": Reply.server_error(500, f"upstream failed on {MARKER}"),
    "http_400": Reply.error(400, f"your prompt {MARKER} is invalid"),
    "rate_limited": Reply.error(429, f"slow down {MARKER}", headers={"Retry-After": "60"}),
    "not_a_completion": Reply.raw_json({"object": "list", "data": [MARKER]}),
    "content_filter": Reply.text(MARKER, finish_reason="content_filter"),
    "cut_by_length": Reply.text(f"Summary of {MARKER}", finish_reason="length"),
    "timeout": Reply.slow(3, f"late {MARKER}"),
    "dropped": Reply.drop(after_chunks=2),
}


def secret_history(rounds: int = 4, steps: int = 8) -> list[Msg]:
    """A few rounds of tool work, the marker in every message's text, arguments, outputs
    and metadata; every third output is large."""
    meta = {"secret": MARKER}
    msgs = [Msg.system(f"You are a coding agent. {MARKER}", metadata=meta)]
    n = 0
    for r in range(rounds):
        msgs.append(Msg.user(f"Task {r}: fix {MARKER}", metadata=meta))
        for s in range(steps):
            call_id = f"call_{n}"
            n += 1
            args = json.dumps({"path": f"src/{MARKER}/m{s}.py"})
            msgs.append(
                Msg.assistant(
                    f"Reading {MARKER}", [ToolUseBlock(call_id, "read_file", args)], metadata=meta
                )
            )
            lines = 150 if s % 3 == 0 else 2
            body = "".join(f"{MARKER} line {k} of the file\n" for k in range(lines))
            msgs.append(Msg.tool(call_id, body, "read_file", metadata=meta))
        msgs.append(Msg.assistant(f"Round {r} done: {MARKER}", metadata=meta))
    return msgs


@pytest.fixture(scope="module")
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer() as srv:
        yield srv


@pytest.fixture
def caught(caplog: pytest.LogCaptureFixture) -> Iterator[list[BaseException]]:
    """The exceptions a test raised on purpose; checked, with every log record, at the end."""
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="autoctx")
    raised: list[BaseException] = []
    yield raised
    for record in caplog.get_records("setup") + caplog.get_records("call"):
        text = " ".join(
            [record.getMessage(), repr(record.args), record.exc_text or "", str(record.exc_info)]
        )
        assert MARKER not in text, f"logger {record.name!r} logged content: {text[:300]}"
    assert raised, "nothing raised: the check would prove nothing"
    for exc in raised:
        for link in _chain(exc):
            assert MARKER not in str(link), f"{type(link).__name__} quotes content"
            assert MARKER not in repr(link), f"{type(link).__name__} quotes content"


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """The exception and the ones a traceback of it shows (its cause, or its context unless
    ``raise ... from None`` suppressed it)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        if current.__cause__ is not None:
            current = current.__cause__
        else:
            current = None if current.__suppress_context__ else current.__context__


def _raises(raised: list[BaseException], call: Callable[[], object]) -> None:
    with pytest.raises(Exception) as info:
        call()
    raised.append(info.value)


def _assert_events_clean(mem: AutoContextMemory) -> None:
    errors = [e.error for e in mem.events() if e.error]
    for error in errors:
        assert MARKER not in error, error


def _summarizer(server: OpenAIServer, stream: bool) -> OpenAISummarizer:
    return OpenAISummarizer(
        base_url=server.base_url, api_key="test", timeout=1.0, max_retries=0, stream=stream
    )


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("fault", list(FAULTS))
def test_no_fault_of_the_summarizer_leaks_content(
    fault: str,
    stream: bool,
    open_memory: Open,
    server: OpenAIServer,
    session_id: str,
    caught: list[BaseException],
    caplog: pytest.LogCaptureFixture,
) -> None:
    server.set_default(FAULTS[fault])
    try:
        mem = open_memory(config=CONFIG, options=OPTIONS, summarizer=_summarizer(server, stream))
        mem.add(secret_history())
        events = mem.compress_if_needed()
        assert events
        _assert_events_clean(mem)
        assert caplog.records  # the client's and autoctx's own records are all checked
        # Strict: the failure is raised, not recorded; it must not quote the answer either.
        strict = open_memory(
            f"{session_id}-strict",
            config=CONFIG,
            options=dataclasses.replace(OPTIONS, strict=True),
            summarizer=_summarizer(server, stream),
        )
        strict.add(secret_history())
        try:
            strict.compress_if_needed()
        except Exception as exc:
            caught.append(exc)
        # And the summarizer alone, on a request full of the marker.
        request = build_request(4, secret_history(rounds=1, steps=2))
        try:
            _summarizer(server, stream).summarize(request)
        except Exception as exc:
            caught.append(exc)
        _raises(caught, lambda: mem.reload(MARKER))
    finally:
        server.set_default(Reply.text())


def test_an_async_summarizer_fault_leaks_no_content(
    server: OpenAIServer, db_url: str, session_id: str, caught: list[BaseException]
) -> None:
    async def scenario() -> None:
        mem = await AsyncAutoContextMemory.open(
            session_id,
            db_url,
            CONFIG,
            options=OPTIONS,
            summarizer=_summarizer(server, stream=True),
        )
        await mem.add(secret_history())
        await mem.compress_if_needed()
        for event in await mem.events():
            assert MARKER not in (event.error or "")
        try:
            await _summarizer(server, stream=False).asummarize(
                build_request(4, secret_history(rounds=1, steps=2))
            )
        except Exception as exc:
            caught.append(exc)

    server.set_default(FAULTS["refusal_field"])
    try:
        asyncio.run(scenario())
    finally:
        server.set_default(Reply.text())


class _Raising:
    """A caller's summarizer whose exception quotes what it was asked to summarize."""

    def summarize(self, request: SummaryRequest) -> SummaryResult:
        raise RuntimeError(f"cannot summarize: {request.transcript[:200]}")


def test_a_callers_summarizer_exception_is_recorded_without_content(
    open_memory: Open, caught: list[BaseException]
) -> None:
    mem = open_memory(config=CONFIG, options=OPTIONS, summarizer=_Raising())
    mem.add(secret_history())
    events = mem.compress_if_needed()
    failed = [e for e in events if e.status == "failed"]
    assert failed and all((e.error or "").startswith("error:") for e in failed)
    assert all("RuntimeError" in (e.error or "") for e in failed)
    _assert_events_clean(mem)
    _raises(caught, lambda: mem.reload(f"{MARKER}"))


BAD_INPUTS: list[Any] = [
    {"role": "user", "content": [MARKER]},  # a content part that is not an object
    {"role": "user", "content": [{"type": 7, "text": MARKER}]},
    {"role": "user", "content": f"{MARKER}\x00"},
    {"role": "user", "content": f"{MARKER} \ud800"},
    {"role": "tool", "tool_call_id": "call_x", "content": MARKER},  # answers no open call
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_y",
                "type": "function",
                "function": {"name": "f", "arguments": f'{{"a": "{MARKER}'},
            }
        ],
    },
    {"role": "user", "content": MARKER * 10_000},  # over max_message_chars
    Msg.user(MARKER, metadata={"secret": {MARKER}}),  # metadata that is not JSON
]


@pytest.mark.parametrize("bad", BAD_INPUTS, ids=lambda b: str(BAD_INPUTS.index(b)))
def test_bad_inputs_raise_without_content(
    bad: Any, open_memory: Open, caught: list[BaseException]
) -> None:
    mem = open_memory(config=dataclasses.replace(CONFIG, max_message_chars=50_000))
    mem.add(secret_history(rounds=1, steps=1))
    _raises(caught, lambda: mem.add([Msg.user(f"fine {MARKER}"), bad]))


def test_bad_plans_reload_ids_and_tool_calls_raise_without_content(
    open_memory: Open, db_url: str, caught: list[BaseException]
) -> None:
    mem = open_memory(config=CONFIG)
    mem.add(secret_history())
    events = mem.compress_if_needed()
    offload = next(e.offload_uuid for e in events if e.offload_uuid is not None)
    # A reload gives the originals back (that is its job), and logs none of them.
    assert any(MARKER in (m.text + str(m.metadata)) for m in mem.reload(offload))
    for plan in (
        {"goal": [MARKER], "steps": [], "expected_outcome": "x"},
        {"goal": "g", "steps": [{"title": "t", "state": MARKER}], "expected_outcome": "x"},
    ):
        _raises(caught, lambda plan=plan: mem.set_plan(plan))  # type: ignore[misc]
    _raises(caught, lambda: mem.reload(MARKER))
    _raises(caught, lambda: mem.reload(f"{UUID[:-1]}{MARKER}"))
    for arguments in ({"uuid": MARKER}, json.dumps({"uuid": f"{MARKER}-{UUID}"})):
        call = {"type": "function", "function": {"name": "context_reload", "arguments": arguments}}
        answer = mem.handle_tool_call(call)
        assert MARKER not in answer, answer
    reopened = AutoContextMemory.open(mem.session_id, db_url, create=False)
    assert any(MARKER in m.text for m in reopened.messages())
    _assert_events_clean(reopened)
