"""The offline summarizer, and the OpenAI one against a real local Chat Completions server."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoctx import ConfigError, Msg, SummarizerError, ToolUseBlock
from autoctx._agent_plan import plan_hint
from autoctx._prompts import DEFAULT_PROMPTS, build_request
from autoctx._summarizers import (
    OFFLINE_MAX_CHARS,
    SUMMARIZER_REASONS,
    AsyncSummarizer,
    OfflineSummarizer,
    OpenAISummarizer,
    Summarizer,
    SummaryRequest,
    SummaryResult,
    check_answer,
    default_summarizer,
)
from autoctx._tags import OFFLOAD_TAG_RE, offload_tag
from tests.openai_server import OpenAIServer, Reply

UUID = "9a8b7c6d-1234-4abc-8def-0123456789ab"
#: The tag of sessions written before handles: still neutralized and refused.
OLD_TAG = f"<!-- CONTEXT_OFFLOAD: uuid={UUID} -->"
PLAN: dict[str, Any] = {
    "goal": "Make the deploy green",
    "steps": [
        {"title": "Find the failing check", "state": "done"},
        {"title": "Fix the port", "state": "in_progress"},
    ],
    "expected_outcome": "deploy passes",
}
ENV_VARS = ("OPENAI_BASE_URL", "OPENAI_API_KEY", "OPENAI_MODEL", "AUTOCTX_SUMMARY_MODEL")


def _noise(tag: str, n: int) -> str:
    return "\n".join(f"{tag} filler line {k} with nothing in particular to say" for k in range(n))


def tool_work() -> list[Msg]:
    """A long agent run: reads, a failing test with a traceback, a write, a big JSON listing."""
    msgs = [Msg.user("Make the deploy green")]
    msgs.append(
        Msg.assistant(None, [ToolUseBlock("call_1", "read_file", '{"path": "deploy/app.yaml"}')])
    )
    msgs.append(Msg.tool("call_1", "service: web\nport: 8080\n" + _noise("yaml", 300), "read_file"))
    msgs.append(
        Msg.assistant(None, [ToolUseBlock("call_2", "run_shell", '{"cmd": "pytest tests/ -x"}')])
    )
    msgs.append(
        Msg.tool(
            "call_2",
            _noise("pytest", 300)
            + "\nTraceback (most recent call last):\n"
            + '  File "tests/test_deploy.py", line 41, in test_port\n'
            + "AssertionError: expected port 8443, got 8080\n"
            + "FAILED tests/test_deploy.py::test_port - exit code 1",
            "run_shell",
        )
    )
    msgs.append(
        Msg.assistant(
            None,
            [
                ToolUseBlock(
                    "call_3",
                    "write_file",
                    json.dumps({"path": "deploy/app.yaml", "content": "port: 8443\n" * 50}),
                )
            ],
        )
    )
    msgs.append(Msg.tool("call_3", "wrote 550 bytes to deploy/app.yaml", "write_file"))
    listing = json.dumps(
        [{"id": f"job-{k}", "url": f"https://ci.example.com/jobs/{k}"} for k in range(400)]
    )
    msgs.append(Msg.assistant(None, [ToolUseBlock("call_4", "list_jobs", '{"limit": 400}')]))
    msgs.append(Msg.tool("call_4", listing, "list_jobs"))
    msgs.append(Msg.assistant(f"Earlier notes are here. {offload_tag(41)}"))
    msgs.append(Msg.assistant(f"Older notes are here. {OLD_TAG}"))
    return msgs


# ---------------------------------------------------------------------------------------------
# Offline
# ---------------------------------------------------------------------------------------------


def test_offline_is_a_summarizer() -> None:
    assert isinstance(OfflineSummarizer(), Summarizer)


def test_offline_keeps_the_facts_and_shrinks() -> None:
    request = build_request(1, tool_work())
    result = OfflineSummarizer().summarize(request)
    text = result.text
    assert request.input_chars > 40_000
    assert len(text) <= min(OFFLINE_MAX_CHARS, request.input_chars // 4)
    # Every call: tool name, id and exact arguments.
    for expected in (
        '[assistant -> tool call read_file id=call_1] {"path": "deploy/app.yaml"}',
        '[assistant -> tool call run_shell id=call_2] {"cmd": "pytest tests/ -x"}',
        '[assistant -> tool call write_file id=call_3] {"path": "deploy/app.yaml", "content": ',
        '[assistant -> tool call list_jobs id=call_4] {"limit": 400}',
    ):
        assert expected in text
    # Error lines, with where they happened.
    assert "AssertionError: expected port 8443, got 8080" in text
    assert "FAILED tests/test_deploy.py::test_port - exit code 1" in text
    assert 'File "tests/test_deploy.py", line 41, in test_port' in text
    # First lines, numbers, paths, the result of the write, ids and URLs.
    assert "port: 8080" in text
    assert "wrote 550 bytes to deploy/app.yaml" in text
    assert "job-0" in text and "https://ci.example.com/jobs/0" in text
    # A tag it copies is neutralized, never emitted.
    assert "CONTEXT_OFFLOAD" not in text and "<!--" not in text
    assert "[offloaded context 41]" in text
    assert f"[offloaded context {UUID}]" in text
    assert result.model == "autoctx-offline"
    assert result.prompt_tokens is None and result.completion_tokens is None
    assert result.latency_ms >= 0


def test_offline_is_deterministic() -> None:
    request = build_request(4, tool_work())
    first = OfflineSummarizer().summarize(request).text
    assert OfflineSummarizer().summarize(request).text == first


@pytest.mark.parametrize("budget", [1, 20, 150, 600, 2500, 20_000])
def test_offline_respects_the_budget(budget: int) -> None:
    request = build_request(6, tool_work(), char_budget=budget)
    text = OfflineSummarizer().summarize(request).text
    assert 0 < len(text) <= budget
    if budget >= 600:
        assert "[assistant -> tool call read_file id=call_1]" in text


def test_offline_uses_a_larger_budget_for_more_facts() -> None:
    request = build_request(6, tool_work(), char_budget=12_000)
    text = OfflineSummarizer().summarize(request).text
    assert 4000 < len(text) <= 12_000
    assert "job-399" in text or "jobs/399" in text or "job-1" in text


def test_offline_small_input_and_free_text() -> None:
    small = SummaryRequest(5, "p", "just one short line", 19)
    assert OfflineSummarizer().summarize(small).text.endswith("just one short line")
    free = "\n".join([f"log {k}: ok" for k in range(2000)] + ["ERROR disk /dev/sda1 full", "done"])
    result = OfflineSummarizer().summarize(SummaryRequest(5, "p", free, len(free)))
    assert "ERROR disk /dev/sda1 full" in result.text
    assert "log 0: ok" in result.text and "done" in result.text
    assert len(result.text) <= len(free) // 4
    empty = OfflineSummarizer().summarize(SummaryRequest(5, "p", "", 0))
    assert empty.text.strip()


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.text(min_size=0, max_size=300), min_size=1, max_size=8),
    st.one_of(st.none(), st.integers(min_value=1, max_value=3000)),
)
def test_offline_property_budget_and_no_tag(chunks: list[str], budget: int | None) -> None:
    msgs = [Msg.user(chunks[0] + offload_tag(5) + OLD_TAG)] + [
        Msg.tool(f"c{i}", c + "CONTEXT_OFFLOAD", "t") for i, c in enumerate(chunks[1:])
    ]
    request = build_request(6, msgs, char_budget=budget)
    summarizer = OfflineSummarizer()
    text = summarizer.summarize(request).text
    assert text.strip()
    assert len(text) <= summarizer.budget_for(request)
    assert "CONTEXT_OFFLOAD" not in text and OFFLOAD_TAG_RE.search(text) is None


# ---------------------------------------------------------------------------------------------
# OpenAI-compatible, against a real local server
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer(model="served-model") as srv:
        yield srv


@pytest.fixture
def srv(server: OpenAIServer) -> OpenAIServer:
    server.reset()
    return server


@pytest.fixture(autouse=True)
def _no_openai_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)


def summarizer(srv: OpenAIServer, *, stream: bool = False, **kw: Any) -> OpenAISummarizer:
    kw.setdefault("timeout", 1.0)
    kw.setdefault("max_retries", 0)
    return OpenAISummarizer(
        model="summary-model", base_url=srv.base_url, api_key="test-key", stream=stream, **kw
    )


def call(s: OpenAISummarizer, request: SummaryRequest, mode: str) -> SummaryResult:
    """One call through the sync path, or the async one on an event loop of its own."""
    if mode == "async":
        return asyncio.run(s.asummarize(request))
    return s.summarize(request)


MODES = ["sync", "async"]


def small_request(**kw: Any) -> SummaryRequest:
    msgs = [
        Msg.user("Deploy please"),
        Msg.assistant(None, [ToolUseBlock("call_1", "deploy", '{"env": "prod"}')]),
        Msg.tool("call_1", f"deployed v2 on port 8443 {offload_tag(9)} {OLD_TAG}", "deploy"),
        Msg.assistant("Deployed."),
    ]
    return build_request(4, msgs, **kw)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_answer_usage_and_model(srv: OpenAIServer, stream: bool, mode: str) -> None:
    srv.script(Reply.text("  Deployed v2 to prod on port 8443.\n", model="answering-model"))
    s = summarizer(srv, stream=stream)
    assert isinstance(s, AsyncSummarizer)
    result = call(s, small_request(), mode)
    assert result.text == "Deployed v2 to prod on port 8443."
    assert result.model == "answering-model"
    assert result.prompt_tokens is not None and result.prompt_tokens > 0
    assert result.completion_tokens == len("  Deployed v2 to prod on port 8443.\n") // 4
    assert result.latency_ms > 0
    body = srv.requests[-1]
    assert body["model"] == "summary-model"
    assert body["temperature"] == 0
    if stream:
        assert body["stream"] is True
        assert body["stream_options"] == {"include_usage": True}
    else:
        assert "stream" not in body


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_request_is_plain_text_with_plan_last(srv: OpenAIServer, stream: bool) -> None:
    request = small_request(plan=PLAN, char_budget=400)
    summarizer(srv, stream=stream).summarize(request)
    body = srv.requests[-1]
    messages = body["messages"]
    assert [m["role"] for m in messages] == ["system", "user"]
    for message in messages:
        assert set(message) == {"role", "content"}
        assert isinstance(message["content"], str)
    assert "tools" not in body and "tool_choice" not in body
    assert messages[0]["content"] == DEFAULT_PROMPTS[4]
    user = messages[1]["content"]
    hint = plan_hint(PLAN)
    assert hint is not None
    assert user.endswith(hint)
    assert "[assistant -> tool call deploy id=call_1]" in user
    assert user.index("at most 400 characters") < user.index(hint)
    assert "CONTEXT_OFFLOAD" not in json.dumps(body)
    assert not any(OFFLOAD_TAG_RE.search(m["content"]) for m in messages)


def test_default_answer_and_no_plan(srv: OpenAIServer) -> None:
    result = summarizer(srv).summarize(small_request())
    assert result.text.startswith("Summary: Transcript to summarize:")
    assert result.model == "summary-model"  # the server echoes the requested model
    user = srv.requests[-1]["messages"][1]["content"]
    assert "Plan of this session" not in user and "Character budget" not in user


def test_temperature_none_is_left_out(srv: OpenAIServer) -> None:
    summarizer(srv, temperature=None).summarize(small_request())
    assert "temperature" not in srv.requests[-1]
    summarizer(srv, temperature=0.3).summarize(small_request())
    assert srv.requests[-1]["temperature"] == 0.3


FAILURES: list[tuple[str, Reply, str]] = [
    ("429", Reply.rate_limited(retry_after=7), "rate_limited"),
    ("500", Reply.server_error(500, "boom"), "http_error"),
    ("503", Reply.server_error(503), "http_error"),
    ("slow", Reply.slow(3), "timeout"),
    ("drop", Reply.drop(after_chunks=2), "connection"),
    ("stall", Reply.stall(after_chunks=1), "timeout"),
    ("empty", Reply.empty(), "empty"),
    ("whitespace", Reply.whitespace(), "empty"),
    ("tag-only", Reply.tag_only(12), "tag_in_answer"),
    ("tag-inside", Reply.text(f"Done.\n{offload_tag(12)}"), "tag_in_answer"),
    ("tag-copied-loosely", Reply.text("Done. <!--Offload #12-->"), "tag_in_answer"),
    ("old-tag-inside", Reply.text(f"Done.\n{OLD_TAG}"), "tag_in_answer"),
    ("marker", Reply.text("see CONTEXT_OFFLOAD above"), "tag_in_answer"),
    ("refusal", Reply.refusal("I won't summarize this."), "refusal"),
    ("content-filter", Reply.text("partial", finish_reason="content_filter"), "refusal"),
    ("tool-call-only", Reply.tool_call("deploy", {"env": "prod"}), "empty"),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize(
    ("reply", "reason"), [f[1:] for f in FAILURES], ids=[f[0] for f in FAILURES]
)
def test_failures_raise_with_reason(
    srv: OpenAIServer, reply: Reply, reason: str, stream: bool, mode: str
) -> None:
    srv.script(reply)
    with pytest.raises(SummarizerError) as info:
        call(summarizer(srv, stream=stream), small_request(), mode)
    assert info.value.reason == reason
    assert reason in SUMMARIZER_REASONS
    if reason == "rate_limited":
        assert "retry-after=7" in info.value.detail
    if reason == "http_error":
        assert f"HTTP {reply.status}" in info.value.detail
    if reason == "refusal" and reply.refusal_text:
        # Named, never quoted: a refusal may echo the transcript.
        assert "refused" in info.value.detail
        assert reply.refusal_text not in str(info.value)


def test_stream_that_ends_without_finish_is_a_connection_failure(srv: OpenAIServer) -> None:
    srv.script(Reply.drop(after_chunks=3, clean_close=True))
    with pytest.raises(SummarizerError) as info:
        summarizer(srv, stream=True).summarize(small_request())
    assert info.value.reason == "connection"
    assert "finish_reason" in info.value.detail


def test_gigantic_answer_comes_back_whole(srv: OpenAIServer) -> None:
    # Whether it is shorter than its input is the compressor's check (no_gain), not this one's.
    for stream in (False, True):
        srv.script(Reply.gigantic(300_001))
        result = summarizer(srv, stream=stream).summarize(small_request())
        assert len(result.text) == len(Reply.gigantic(300_001).content.strip())  # type: ignore[union-attr]


@pytest.mark.parametrize("mode", MODES)
def test_retries_follow_retry_after(srv: OpenAIServer, mode: str) -> None:
    srv.script(Reply.rate_limited(retry_after="0.01"), Reply.text("second try"))
    result = call(summarizer(srv, max_retries=1), small_request(), mode)
    assert result.text == "second try"
    assert len(srv.requests) == 2


# ---------------------------------------------------------------------------------------------
# Deadlines: every call has one, retries and a slow stream included (docs/design.md §6)
# ---------------------------------------------------------------------------------------------

DEADLINE_S = 4.0
#: What a busy two-core machine may add to a deadline before the call returns: generous, so
#: that the bound cannot flake, and far below what the endpoint alone would cost (the stalls
#: and drips below would hold a call for a minute or more).
SLACK_S = 5.0


def _fails_at_the_deadline(s: OpenAISummarizer, request: SummaryRequest, mode: str) -> float:
    started = time.monotonic()
    with pytest.raises(SummarizerError) as info:
        call(s, request, mode)
    elapsed = time.monotonic() - started
    assert info.value.reason == "deadline", info.value
    assert "deadline" in info.value.detail
    assert elapsed < DEADLINE_S + SLACK_S, elapsed
    return elapsed


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_an_endpoint_that_never_answers_costs_the_deadline(
    srv: OpenAIServer, stream: bool, mode: str
) -> None:
    """Each attempt times out after 1 s and the client would retry twice with a backoff; the
    attempts and the waits between them stay within the call's deadline."""
    srv.set_default(Reply.stall(after_chunks=0))
    try:
        s = summarizer(srv, stream=stream, timeout=1.0, max_retries=5, deadline_s=DEADLINE_S)
        _fails_at_the_deadline(s, small_request(), mode)
    finally:
        srv.set_default(Reply.text())
    assert len(srv.requests) >= 2  # it did retry, within the deadline


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_an_answer_that_drips_is_cut_at_the_deadline(
    srv: OpenAIServer, stream: bool, mode: str
) -> None:
    """A piece every 0.5 s never trips the 30 s read timeout; the whole answer would take
    over 12 s. The deadline cuts it, and what came in is not a summary."""
    srv.script(Reply.drip(0.5, "Deployed v2. " * 40))
    s = summarizer(srv, stream=stream, timeout=30.0, deadline_s=DEADLINE_S)
    _fails_at_the_deadline(s, small_request(), mode)
    assert len(srv.requests) == 1


@pytest.mark.parametrize("mode", MODES)
def test_the_request_deadline_bounds_the_call(srv: OpenAIServer, mode: str) -> None:
    """The compressor's deadline travels on the request (a monotonic instant)."""
    srv.script(Reply.slow(60))
    s = summarizer(srv, timeout=30.0)
    _fails_at_the_deadline(s, small_request(deadline=time.monotonic() + DEADLINE_S), mode)


def test_a_retry_after_beyond_the_deadline_fails_at_once(srv: OpenAIServer) -> None:
    srv.script(Reply.rate_limited(retry_after=30))
    s = summarizer(srv, max_retries=2, deadline_s=DEADLINE_S)
    with pytest.raises(SummarizerError) as info:
        s.summarize(small_request())
    # Waiting 30 s for a retry that the deadline would cut is not worth starting.
    assert info.value.reason == "deadline"
    assert "rate_limited" in info.value.detail
    assert len(srv.requests) == 1


def test_deadline_s_is_validated() -> None:
    with pytest.raises(ConfigError, match="deadline_s"):
        OpenAISummarizer(base_url="http://127.0.0.1:9/v1", api_key="k", deadline_s=0)


def test_connection_refused() -> None:
    with OpenAIServer() as gone:
        url = gone.base_url
    s = OpenAISummarizer(model="m", base_url=url, api_key="k", timeout=1, max_retries=0)
    with pytest.raises(SummarizerError) as info:
        s.summarize(small_request())
    assert info.value.reason == "connection"


def test_given_client_is_used_as_is(srv: OpenAIServer) -> None:
    client = openai.OpenAI(base_url=srv.base_url, api_key="k", max_retries=0, timeout=1)
    s = OpenAISummarizer(client, model="client-model")
    assert s.summarize(small_request()).text.startswith("Summary:")
    assert srv.requests[-1]["model"] == "client-model"
    assert srv.request_headers[-1]["authorization"] == "Bearer k"
    s.close()  # not ours: must leave the client usable
    assert client.models.list().data[0].id == "served-model"
    with pytest.raises(ConfigError):
        OpenAISummarizer(client, model="m", base_url=srv.base_url)


def test_environment(monkeypatch: pytest.MonkeyPatch, srv: OpenAIServer) -> None:
    assert OpenAISummarizer.from_env() is None
    assert isinstance(default_summarizer(), OfflineSummarizer)
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        OpenAISummarizer()
    monkeypatch.setenv("OPENAI_BASE_URL", srv.base_url)
    monkeypatch.setenv("OPENAI_MODEL", "env-model")
    from_env = OpenAISummarizer.from_env()
    assert from_env is not None and from_env.model == "env-model"
    assert str(from_env.client.base_url).rstrip("/") == srv.base_url
    monkeypatch.setenv("AUTOCTX_SUMMARY_MODEL", "autoctx-model")
    chosen = default_summarizer()
    assert isinstance(chosen, OpenAISummarizer) and chosen.model == "autoctx-model"
    chosen.summarize(small_request())
    assert srv.requests[-1]["model"] == "autoctx-model"
    # No key given: local servers need none, a placeholder satisfies the client.
    assert srv.request_headers[-1]["authorization"].startswith("Bearer ")
    assert OpenAISummarizer(model="explicit").model == "explicit"
    assert "test-key" not in repr(summarizer(srv))


# ---------------------------------------------------------------------------------------------
# The test server itself (other tests rely on it)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_server_scripts_tool_calls(srv: OpenAIServer, stream: bool) -> None:
    srv.script(Reply.tool_call("get_weather", {"city": "Oslo"}, call_id="call_w"))
    client = openai.OpenAI(base_url=srv.base_url, api_key="k", max_retries=0, timeout=2)
    messages: Any = [{"role": "user", "content": "weather?"}]
    if stream:
        calls: dict[int, dict[str, str]] = {}
        finish = None
        for chunk in client.chat.completions.create(model="m", messages=messages, stream=True):
            for choice in chunk.choices:
                finish = choice.finish_reason or finish
                for delta in choice.delta.tool_calls or []:
                    entry = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                    entry["id"] += delta.id or ""
                    if delta.function is not None:
                        entry["name"] += delta.function.name or ""
                        entry["arguments"] += delta.function.arguments or ""
        assert finish == "tool_calls"
        assert calls == {
            0: {"id": "call_w", "name": "get_weather", "arguments": '{"city": "Oslo"}'}
        }
    else:
        response = client.chat.completions.create(model="m", messages=messages)
        answer = response.choices[0]
        assert answer.finish_reason == "tool_calls"
        assert answer.message.tool_calls is not None
        call = answer.message.tool_calls[0]
        assert call.type == "function"
        assert call.id == "call_w"
        assert call.function.name == "get_weather"
        assert json.loads(call.function.arguments) == {"city": "Oslo"}


def test_server_callable_script_raw_json_and_models(srv: OpenAIServer) -> None:
    raw = {
        "id": "x",
        "object": "chat.completion",
        "created": 1,
        "model": "raw-model",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "raw!"},
                "finish_reason": "stop",
            }
        ],
    }
    srv.script(
        lambda body: Reply.text(f"echo {len(body['messages'])}"),
        Reply.raw_json(raw),
    )
    assert srv.pending == 2
    client = openai.OpenAI(base_url=srv.base_url, api_key="k", max_retries=0, timeout=2)
    first = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}])
    assert first.choices[0].message.content == "echo 1"
    second = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "b"}])
    assert second.model == "raw-model" and second.choices[0].message.content == "raw!"
    assert srv.pending == 0
    assert [r["messages"][0]["content"] for r in srv.requests] == ["a", "b"]
    assert [m.id for m in client.models.list().data] == ["served-model"]


def test_server_closes_promptly_with_a_stalled_stream() -> None:
    errors: list[BaseException] = []
    with OpenAIServer() as srv:
        srv.script(Reply.stall())
        s = OpenAISummarizer(
            model="m", base_url=srv.base_url, api_key="k", timeout=30, max_retries=0, stream=True
        )

        def call() -> None:
            try:
                s.summarize(small_request())
            except SummarizerError as exc:
                errors.append(exc)

        worker = threading.Thread(target=call)
        worker.start()
        deadline = time.monotonic() + 5
        while not srv.requests and time.monotonic() < deadline:
            time.sleep(0.01)
    worker.join(timeout=20)
    assert not worker.is_alive()
    assert len(errors) == 1 and errors[0].reason == "connection"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        ("Read a.py.\x00 It holds 3 functions.", "bad_answer"),
        ("Read a.py. \ud800 It holds 3 functions.", "bad_answer"),
        ("Done. see context_offload above", "tag_in_answer"),
        ("Done. \u0421\u041enTEXT_OFFLOAD", "tag_in_answer"),  # Cyrillic Es and O
        (
            "Done. \uff43\uff4f\uff4e\uff54\uff45\uff58\uff54\uff3f\uff4f\uff46\uff46load",
            "tag_in_answer",
        ),
        ("<!-- context_offload: uuid=1234 -->", "tag_in_answer"),
    ],
    ids=["nul", "lone-surrogate", "lowercase-marker", "cyrillic-marker", "fullwidth", "tag"],
)
def test_an_answer_is_data_never_trusted(answer: str, reason: str) -> None:
    """docs/design.md §6: what PostgreSQL cannot store, and look-alikes of the tag, are refused
    with a reason, and the error quotes nothing of the answer."""
    with pytest.raises(SummarizerError) as info:
        check_answer(answer)
    assert info.value.reason == reason and reason in SUMMARIZER_REASONS
    assert "functions" not in str(info.value) and "Done" not in str(info.value)


def test_prose_about_offloading_is_not_a_tag() -> None:
    text = "Context offloading happened twice; see offloaded context 1234 for the log."
    assert check_answer(text) == text
