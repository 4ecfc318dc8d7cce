"""Each framework's own loop with a reasoning model (issue 32): a scripted model that reasons
before every reply (tests/agent_model.py's `reasoning_chars`: a Chat Completions
`reasoning_content`, streamed or not; tests/anthropic_server.py's thinking blocks) runs a
long task through the Agents SDK, Pydantic AI (`run` and `run_stream`), AgentScope and the
Anthropic client. Every request stays under the window, and each reply's reasoning is stored in
the same message as the calls it led to, so that a compression keeps or offloads them together.
(LangChain's run is in tests/test_langchain_reasoning.py.)"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pytest

from autoctx import AutoContextConfig, AutoContextMemory, Msg, OfflineSummarizer

from . import framework_runs
from .agent_model import ScriptedAgent, tool_output
from .anthropic_server import AnthropicAgent, AnthropicServer, shape_errors
from .openai_server import OpenAIServer
from .test_integration_agentscope import make_agent as agentscope_agent
from .test_openai_agents import _run_once as sdk_run_once

if TYPE_CHECKING:
    pass

CALLS = 30
REASONING = 800


def _is_reasoning(block: Mapping[str, Any]) -> bool:
    if block.get("type") != "opaque":
        return False
    data = block["data"]
    kind = data.get("type") or (data.get("agentscope") or {}).get("type")
    return kind in ("thinking", "reasoning")


def assert_reasoning_beside_calls(originals: Sequence[Mapping[str, Any]], replies: int) -> None:
    """Each of the model's replies was stored as one assistant message that opens with its
    reasoning, its calls after it in the same message."""
    assistant = [o["content"] for o in originals if o["role"] == "assistant"]
    with_calls = [c for c in assistant if any(b["type"] == "tool_use" for b in c)]
    assert len(with_calls) == CALLS, len(with_calls)
    for content in with_calls:
        assert _is_reasoning(content[0]), content[0]
    assert sum(1 for c in assistant if c and _is_reasoning(c[0])) == replies


@pytest.mark.parametrize("stream", [False, True], ids=["run", "run_streamed"])
def test_agents_sdk_with_a_reasoning_model(db_url: str, session_id: str, stream: bool) -> None:
    from autoctx.integrations.openai_agents import AutoContextSession

    session = AutoContextSession(
        session_id,
        db_url,
        AutoContextConfig(max_tokens=framework_runs.WINDOW),
        summarizer=OfflineSummarizer(),
    )
    agent_model = ScriptedAgent(calls_per_run=CALLS, reasoning_chars=REASONING)
    work = framework_runs.Work()
    final = sdk_run_once(session, agent_model, work, "Do the work", stream=stream, bounded=True)
    assert final == agent_model.final_answer and work.calls == CALLS
    framework_runs.assert_under_window(agent_model)
    mem = session.memory()
    assert [e for e in mem.events() if e.status == "applied"], "the run never compressed"
    # The SDK turns `reasoning_content` into a reasoning item before the function call.
    assert_reasoning_beside_calls(framework_runs.stored_originals(mem), CALLS + 1)
    framework_runs.assert_each_stored_once(mem, prompts=1, calls=CALLS)
    mem.close()


@pytest.mark.parametrize("stream", [False, True], ids=["run", "run_stream"])
def test_pydantic_ai_with_a_reasoning_model(db_url: str, session_id: str, stream: bool) -> None:
    from pydantic_ai import Agent as PydanticAgent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    from autoctx.integrations.pydantic_ai import AutoContextCapability

    capability = AutoContextCapability(
        session_id,
        db_url,
        AutoContextConfig(max_tokens=framework_runs.WINDOW),
        summarizer=OfflineSummarizer(),
    )
    agent_model = ScriptedAgent(calls_per_run=CALLS, reasoning_chars=REASONING)
    calls: list[int] = []

    async def go() -> str:
        with OpenAIServer(default=agent_model) as srv:
            model = OpenAIChatModel(
                "test-model", provider=OpenAIProvider(base_url=srv.base_url, api_key="t")
            )
            agent = PydanticAgent(model, instructions="Run the steps.", capabilities=[capability])

            @agent.tool_plain
            def run_step(step: int) -> str:
                calls.append(step)
                return tool_output(step, framework_runs.output_size(len(calls), stride=5_113))

            if stream:
                async with agent.run_stream("Run the steps.") as result:
                    return str(await result.get_output())
            return str((await agent.run("Run the steps.")).output)

    assert asyncio.run(go()) == agent_model.final_answer and len(calls) == CALLS
    if stream:
        assert all(r.get("stream") for r in agent_model.requests)
    framework_runs.assert_under_window(agent_model)
    memory = asyncio.run(capability.open())
    mem = memory.sync
    assert [e for e in mem.events() if e.status == "applied"], "the run never compressed"
    originals = framework_runs.stored_originals(mem)
    assert_reasoning_beside_calls(originals, CALLS + 1)
    # Every field of the thinking part is kept, so Pydantic AI sends it back as it came: the
    # model's reasoning goes back beside the calls of the latest step.
    thinking = next(o for o in originals if o["role"] == "assistant")["content"][0]["data"]
    assert thinking["id"] == "reasoning_content" and thinking["provider_name"] == "openai"
    last = [m for m in agent_model.requests[-1]["messages"] if m["role"] == "assistant"][-1]
    assert last["tool_calls"] and last["reasoning_content"].startswith("Reasoning before")
    asyncio.run(capability.aclose())


@pytest.mark.parametrize("stream", [False, True], ids=["reply", "streamed"])
def test_agentscope_with_a_reasoning_model(db_url: str, session_id: str, stream: bool) -> None:
    from agentscope.message import UserMsg

    from autoctx.integrations.agentscope import AutoContextMiddleware as AgentScopeMiddleware

    agent_model = ScriptedAgent(calls_per_run=CALLS, reasoning_chars=REASONING)

    async def go() -> AutoContextMemory:
        mw = await AgentScopeMiddleware.open(
            session_id,
            db_url,
            AutoContextConfig(max_tokens=framework_runs.WINDOW),
            summarizer=OfflineSummarizer(),
        )
        with OpenAIServer(default=agent_model) as srv:
            agent = agentscope_agent(srv, mw, stream=stream)
            reply = await agent.reply(UserMsg(name="user", content="Run the job."))
            assert reply.get_text_content() == agent_model.final_answer
        return mw.memory.sync

    mem = asyncio.run(go())
    framework_runs.assert_under_window(agent_model)
    assert [e for e in mem.events() if e.status == "applied"], "the run never compressed"
    # AgentScope reads `reasoning_content` into a ThinkingBlock of the reply's message.
    assert_reasoning_beside_calls(framework_runs.stored_originals(mem), CALLS + 1)


def test_the_anthropic_client_loop_with_extended_thinking(open_memory: Any) -> None:
    import anthropic

    mem = open_memory(config=AutoContextConfig(max_tokens=framework_runs.WINDOW))
    agent_model = AnthropicAgent(calls_per_run=CALLS, thinking=True, thinking_chars=REASONING)
    tools = [{"name": "work", "description": "Work.", "input_schema": {"type": "object"}}]
    mem.add(Msg.system("Work. " + mem.system_prompt_snippet()))
    mem.add({"role": "user", "content": "Do the work"})
    with AnthropicServer(agent_model) as srv:
        client = anthropic.Anthropic(base_url=srv.base_url, api_key="test", max_retries=0)
        for step in range(CALLS + 1):
            mem.compress_if_needed()
            system, messages = mem.to_anthropic()
            response = client.messages.create(
                model="claude-sonnet-4-5",
                max_tokens=1024,
                system=system,
                messages=messages,  # type: ignore[arg-type]
                tools=[*tools, *mem.tools(format="anthropic")],  # type: ignore[list-item]
            )
            mem.add(response)
            calls = [b for b in response.content if b.type == "tool_use"]
            if not calls:
                break
            output = tool_output(step, framework_runs.output_size(step, stride=2_711))
            mem.add(
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": c.id, "content": output}
                        for c in calls
                    ],
                }
            )
    assert srv.rejected == [] and step == CALLS
    framework_runs.assert_under_window(agent_model)  # type: ignore[arg-type]
    assert [e for e in mem.events() if e.status == "applied"], "the loop never compressed"
    for body in agent_model.requests:
        assert shape_errors(body) == []
        for turn in body["messages"]:
            content = turn["content"]
            if turn["role"] == "assistant" and isinstance(content, list):
                kinds = [b["type"] for b in content]
                if "tool_use" in kinds:
                    assert kinds[0] == "thinking", kinds
    assert_reasoning_beside_calls(framework_runs.stored_originals(mem), CALLS + 1)
