"""Pydantic AI: `AutoContextCapability` through the real `Agent.run_sync` / `Agent.run` loop, with
Pydantic AI's own OpenAI chat model talking to the local Chat Completions server and its
scripted tool-calling agent, which counts the input of every request."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from autoctx import (
    AutoContextClient,
    AutoContextConfig,
    AutoContextMemory,
    ConfigError,
    InvalidMessage,
    OfflineSummarizer,
)

from . import framework_runs
from .agent_model import ScriptedAgent, tool_output
from .openai_server import OpenAIServer

if TYPE_CHECKING:
    from pydantic_ai import Agent

    from autoctx.integrations.pydantic_ai import (
        AutoContextCapability,
    )


@pytest.fixture
def server() -> Iterator[tuple[OpenAIServer, ScriptedAgent]]:
    agent = ScriptedAgent(calls_per_run=48)
    with OpenAIServer(default=agent) as srv:
        yield srv, agent


def _agent(srv: OpenAIServer, capability: AutoContextCapability, calls: list[int]) -> Agent[None]:
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel(
        "test-model", provider=OpenAIProvider(base_url=srv.base_url, api_key="t")
    )
    agent = Agent(model, instructions="Run the steps with run_step.", capabilities=[capability])

    @agent.tool_plain
    def run_step(step: int) -> str:
        calls.append(step)
        return tool_output(step, framework_runs.output_size(len(calls), stride=7_331))

    return agent


def _capability(db_url: str, session_id: str) -> AutoContextCapability:
    from autoctx.integrations.pydantic_ai import AutoContextCapability

    return AutoContextCapability(
        session_id,
        db_url,
        AutoContextConfig(max_tokens=framework_runs.WINDOW),
        summarizer=OfflineSummarizer(),
    )


def test_model_messages_convert_both_ways() -> None:
    from pydantic_ai.messages import (
        ImageUrl,
        ModelRequest,
        ModelResponse,
        SystemPromptPart,
        TextPart,
        ThinkingPart,
        ToolCallPart,
        ToolReturnPart,
        UserPromptPart,
    )

    from autoctx.integrations.pydantic_ai import from_model_messages, to_model_messages

    history = [
        ModelRequest([SystemPromptPart("sys"), UserPromptPart("look")]),
        ModelResponse(
            [
                ThinkingPart("two files", signature="sig"),
                TextPart("Reading."),
                ToolCallPart("read", {"path": "a.py"}, tool_call_id="c1"),
                ToolCallPart("read", '{"path": "b.py"}', tool_call_id="c2"),
            ]
        ),
        ModelRequest(
            [
                ToolReturnPart("read", "def a(): ...", tool_call_id="c1"),
                ToolReturnPart("read", {"error": "missing"}, tool_call_id="c2", outcome="failed"),
                UserPromptPart(["and this", ImageUrl(url="https://example.test/x.png")]),
            ]
        ),
        ModelResponse([TextPart("done")]),
    ]
    msgs = from_model_messages(history)
    assert [m.role for m in msgs] == ["system", "user", "assistant", "tool", "user", "assistant"]
    assert msgs[3].tool_results[1].is_error
    back = to_model_messages(msgs)
    assert [type(m) for m in back] == [ModelRequest, ModelResponse, ModelRequest, ModelResponse]
    assert [p.part_kind for p in back[1].parts] == ["thinking", "text", "tool-call", "tool-call"]
    thinking = back[1].parts[0]
    assert isinstance(thinking, ThinkingPart) and thinking.signature == "sig"
    returns = back[2].parts
    assert isinstance(returns[1], ToolReturnPart) and returns[1].outcome == "failed"
    assert returns[1].content == '{"error":"missing"}'
    user = returns[2]
    assert isinstance(user, UserPromptPart) and user.content == [
        "and this",
        ImageUrl(url="https://example.test/x.png"),
    ]
    # And again: what came back converts to the same autoctx messages.
    assert [m.content for m in from_model_messages(back)] == [m.content for m in msgs]


def test_a_part_autoctx_has_no_place_for_is_refused() -> None:
    from pydantic_ai.messages import BinaryContent, FilePart, ModelResponse

    from autoctx.integrations.pydantic_ai import from_model_messages

    response = ModelResponse([FilePart(BinaryContent(b"x", media_type="application/pdf"))])
    with pytest.raises(InvalidMessage, match="FilePart"):
        from_model_messages([response])


def test_long_run_stays_under_the_window(
    server: tuple[OpenAIServer, ScriptedAgent], db_url: str, session_id: str
) -> None:
    from pydantic_ai.messages import ModelRequest, ToolReturnPart

    srv, scripted = server
    # Message ids in the session: 1 the prompt, then a call and its result per step, so step
    # 3's result is message 9.
    scripted.context_calls = {
        30: ("context_search", {"query": '"FACT-0005"'}),
        40: ("context_reload", {"message_id": 9}),
    }
    capability = _capability(db_url, session_id)
    calls: list[int] = []
    agent = _agent(srv, capability, calls)
    result = agent.run_sync("Run the 48 steps.")
    assert result.output == "All steps are done."
    assert len(calls) == 46  # 48 calls, two of them context tools
    framework_runs.assert_under_window(scripted)
    assert len(scripted.inputs) == 49
    assert scripted.largest_request() > framework_runs.WINDOW // 2
    assert {"context_reload", "context_search"} <= set(scripted.offered_tools())

    async def check() -> None:
        memory = await capability.open()
        assert await memory.events(), "the run never compressed"
        # Every message of the run is stored once: the prompt, 48 calls and results, the answer.
        originals = [e for e in await memory.search('"FACT-0007"')]
        assert len(originals) == 1
        for step in range(48):
            if step not in (30, 40):
                assert await memory.search(f'"FACT-{step:04d}"'), step
        assert (
            (await memory.reload(message_id=9))[0]
            .tool_results[0]
            .output_text.startswith("FACT-0003")
        )
        await capability.aclose()

    asyncio.run(check())
    answers = {
        m.tool_name: m.content
        for m in result.all_messages()
        if isinstance(m, ModelRequest)
        for m in m.parts
        if isinstance(m, ToolReturnPart) and m.tool_name.startswith("context_")
    }
    assert "FACT-0005" in str(answers["context_search"]).replace("**", "")
    assert "FACT-0003" in str(answers["context_reload"])
    # The run's own history is Pydantic AI's complete record, not what the model received.
    assert len(result.all_messages()) == 98

    # A reopened session (new capability and agent, same id) continues where it was.
    scripted.calls_per_run = 3
    scripted.context_calls = {}
    again = _capability(db_url, session_id)
    second = _agent(srv, again, calls).run_sync("Three more.")
    assert second.output == "All steps are done."
    first_request = scripted.requests[-4]["messages"]
    assert any("FACT-" in str(m.get("content")) for m in first_request[:-1])
    framework_runs.assert_under_window(scripted)

    async def count() -> int:
        memory = await again.open()
        n = await memory.message_count()
        await again.aclose()
        return n

    assert asyncio.run(count()) > 0
    print(
        f"pydantic-ai long run: {len(scripted.inputs)} requests, largest "
        f"{scripted.largest_request()} / {framework_runs.WINDOW}"
    )


def test_a_long_task_at_a_small_window_hands_the_model_its_tool_results_last(
    server: tuple[OpenAIServer, ScriptedAgent], db_url: str, session_id: str
) -> None:
    """S6 fires right before a model request, when the history ends with the tool returns the
    model is about to read: the request still ends with them (Pydantic AI refuses a history
    that does not end with a `ModelRequest`)."""
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    from autoctx.integrations.pydantic_ai import AutoContextCapability

    srv, scripted = server
    scripted.calls_per_run = 30
    capability = AutoContextCapability(
        session_id,
        db_url,
        AutoContextConfig(max_tokens=framework_runs.SMALL_WINDOW),
        summarizer=OfflineSummarizer(),
    )
    model = OpenAIChatModel(
        "test-model", provider=OpenAIProvider(base_url=srv.base_url, api_key="t")
    )
    agent = Agent(model, instructions="Run the steps.", capabilities=[capability])
    calls: list[int] = []

    @agent.tool_plain
    def run_step(step: int) -> str:
        calls.append(step)
        return tool_output(step, framework_runs.small_output_size(len(calls)))

    result = agent.run_sync("Run the 30 steps.")
    assert result.output == "All steps are done." and len(calls) == 30
    framework_runs.assert_every_request_ends_with_input(scripted)
    framework_runs.assert_under_window(scripted, framework_runs.SMALL_WINDOW)
    memory = asyncio.run(capability.open())
    framework_runs.assert_current_round_summarized(memory.sync)
    framework_runs.assert_reachable(memory.sync, range(30))
    asyncio.run(capability.aclose())


@pytest.mark.parametrize("measured", [True, False], ids=["measured", "reserve_0"])
def test_the_whole_request_with_many_tools_stays_under_a_small_window(
    server: tuple[OpenAIServer, ScriptedAgent], db_url: str, session_id: str, measured: bool
) -> None:
    """The capability measures each request's tool definitions and instructions into the
    session's reserve: messages, tools and instructions together stay under the window. With
    `reserve_tokens=0` set (no room kept) the same run goes over it."""
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider
    from pydantic_ai.tools import Tool

    from autoctx.integrations.pydantic_ai import AutoContextCapability

    srv, scripted = server
    scripted.calls_per_run = 30
    scripted.tool_name = "run_step"
    config = AutoContextConfig(max_tokens=framework_runs.SMALL_WINDOW)
    if not measured:
        config = AutoContextConfig(max_tokens=framework_runs.SMALL_WINDOW, reserve_tokens=0)
    capability = AutoContextCapability(session_id, db_url, config, summarizer=OfflineSummarizer())
    model = OpenAIChatModel(
        "test-model", provider=OpenAIProvider(base_url=srv.base_url, api_key="t")
    )
    extra = [
        Tool.from_schema(lambda **_: "", name=name, description=text, json_schema=schema)
        for name, text, schema in framework_runs.big_tool_specs()
    ]
    agent = Agent(
        model,
        instructions="Run the steps. " + AutoContextMemory.system_prompt_snippet(),
        capabilities=[capability],
        tools=extra,
    )
    calls: list[int] = []

    @agent.tool_plain
    def run_step(step: int) -> str:
        calls.append(step)
        return tool_output(step, framework_runs.small_output_size(len(calls)))

    result = agent.run_sync("Run the 30 steps.")
    assert result.output == "All steps are done." and len(calls) == 30
    assert len(scripted.offered_tools(0)) == 1 + framework_runs.BIG_TOOLS + 2
    memory = asyncio.run(capability.open())
    framework_runs.assert_whole_requests_fit(
        scripted, memory.sync.config.reserve_tokens, measured=measured
    )
    asyncio.run(capability.aclose())


def test_short_runs_through_agent_run(
    server: tuple[OpenAIServer, ScriptedAgent], db_url: str, session_id: str
) -> None:
    srv, scripted = server
    scripted.calls_per_run = 3
    capability = _capability(db_url, session_id)
    calls: list[int] = []
    agent = _agent(srv, capability, calls)

    async def runs() -> None:
        for run in range(25):
            result = await agent.run(f"Run {run}: three steps.")
            assert result.output == "All steps are done."
        memory = await capability.open()
        assert await memory.events()
        await capability.aclose()

    asyncio.run(runs())
    assert len(calls) == 75
    framework_runs.assert_under_window(scripted)
    # Each run stores its prompt, 3 calls, 3 results and the answer, once.
    mem = AutoContextMemory.open(session_id, db_url, summarizer=OfflineSummarizer())
    hits = mem.search('"Run 7"')
    assert len(hits) == 1
    mem.close()
    print(f"pydantic-ai short runs: largest {scripted.largest_request()} / {framework_runs.WINDOW}")


def test_message_history_is_not_stored_again(
    server: tuple[OpenAIServer, ScriptedAgent], db_url: str, session_id: str
) -> None:
    """A run given `message_history` stores only its own messages; the model receives the
    session's working context, not the history the caller passed."""
    srv, scripted = server
    scripted.calls_per_run = 1
    capability = _capability(db_url, session_id)
    agent = _agent(srv, capability, [])
    first = agent.run_sync("First task.")
    agent.run_sync("Second task.", message_history=first.all_messages())

    async def stored() -> list[str]:
        memory = await capability.open()
        roles = [m.role for m in await memory.messages()]
        await capability.aclose()
        return roles

    # Two runs of: prompt, one call, its result, the answer; nothing twice.
    assert asyncio.run(stored()) == ["user", "assistant", "tool", "assistant"] * 2
    last = scripted.requests[-1]["messages"]
    assert [m["role"] for m in last if m["role"] == "user"] == ["user", "user"]


def test_a_given_client_opens_the_memory_and_its_close_closes_it(
    server: tuple[OpenAIServer, ScriptedAgent],
    db_url: str,
    client: AutoContextClient,
    session_id: str,
) -> None:
    from autoctx.integrations.pydantic_ai import AutoContextCapability

    srv, scripted = server
    scripted.calls_per_run = 2
    AutoContextClient.close_shared(db_url)
    capability = AutoContextCapability(
        session_id,
        config=AutoContextConfig(max_tokens=framework_runs.WINDOW),
        summarizer=OfflineSummarizer(),
        client=client,
    )
    result = _agent(srv, capability, []).run_sync("Two steps.")
    assert result.output == "All steps are done."
    memory = asyncio.run(capability.open())
    # The prompt, two calls and results, the answer.
    assert [m.role for m in memory.sync.messages()] == [
        "user",
        *["assistant", "tool"] * 2,
        "assistant",
    ]
    framework_runs.assert_opened_through(client, memory.sync, db_url)
    with pytest.raises(ConfigError, match="not both"):
        AutoContextCapability(session_id, db_url, client=client)


def test_without_pydantic_ai_the_import_error_names_the_extra() -> None:
    message = framework_runs.import_error_without("autoctx.integrations.pydantic_ai", "pydantic_ai")
    assert "needs Pydantic AI" in message
    framework_runs.assert_names_the_extra(message, "pydantic-ai")
