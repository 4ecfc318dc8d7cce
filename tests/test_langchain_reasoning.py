"""The LangChain middleware with the chat models' own messages (issue 34, defects 7 and 8; issue
32's reasoning kept): `ChatAnthropic` with extended thinking and tools, against the local
Messages API server (tests/anthropic_server.py), runs through `create_agent`'s own loop under the
window with each thinking block beside its calls; OpenAI's reasoning items (as `ChatOpenAI`'s
Responses API conversion writes them) round-trip; a `ToolMessage`'s status, artifact and name
survive.

On the starting commit the first failed with "unknown keys ['tool_calls'] on an Anthropic
message", the second with "content part 0 has type 'reasoning'", and an error result came
back as `status="success"` without its artifact."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest
from openai.types.responses import Response

from autoctx import AutoContextConfig, AutoContextMemory, OfflineSummarizer
from tests import framework_runs
from tests.agent_model import tool_output
from tests.anthropic_server import AnthropicAgent, AnthropicServer

if TYPE_CHECKING:
    from langchain_anthropic import ChatAnthropic
    from langchain_core.messages import AIMessage

    from autoctx.integrations.langchain import AutoContextMiddleware

Make = Callable[..., "AutoContextMiddleware"]


@pytest.fixture
def make_middleware(db_url: str) -> Make:
    from autoctx.integrations.langchain import AutoContextMiddleware

    def make(**kw: Any) -> AutoContextMiddleware:
        kw.setdefault("summarizer", OfflineSummarizer())
        kw.setdefault("config", AutoContextConfig(max_tokens=framework_runs.WINDOW))
        return AutoContextMiddleware(db_url, **kw)

    return make


def _chat_anthropic(srv: AnthropicServer, **kw: Any) -> ChatAnthropic:
    from langchain_anthropic import ChatAnthropic

    return ChatAnthropic(
        model="claude-sonnet-4-5", base_url=srv.base_url, api_key="test", max_retries=0, **kw
    )


def _thinking_beside_calls(content: list[Any]) -> bool:
    kinds = [b.get("type") for b in content if isinstance(b, dict)]
    return "tool_use" not in kinds or (kinds[0] == "thinking" and kinds.index("tool_use") > 0)


@pytest.mark.parametrize("streaming", [False, True], ids=["invoke", "stream"])
def test_chat_anthropic_with_thinking_and_tools_runs_under_the_window(
    make_middleware: Make, session_id: str, streaming: bool
) -> None:
    from langchain.agents import create_agent
    from langchain_core.tools import tool
    from langgraph.checkpoint.memory import InMemorySaver

    middleware = make_middleware()
    agent_model = AnthropicAgent(calls_per_run=30, thinking=True)
    work = framework_runs.Work()
    thread = {"configurable": {"thread_id": session_id}, "recursion_limit": 200}
    with AnthropicServer(agent_model) as srv:
        agent = create_agent(
            _chat_anthropic(srv),
            tools=[framework_runs.work_tool(tool, work)],
            system_prompt="Work. " + AutoContextMemory.system_prompt_snippet(),
            middleware=[middleware],
            checkpointer=InMemorySaver(),
        )
        request = {"messages": [{"role": "user", "content": "Do the work"}]}
        if streaming:
            for _ in agent.stream(request, thread, stream_mode="updates"):
                pass
            result = agent.get_state(thread).values
        else:
            result = agent.invoke(request, thread)
    assert srv.rejected == []
    assert work.calls == 30 and result["messages"][-1].text == agent_model.final_answer
    framework_runs.assert_under_window(agent_model)
    mem = middleware.memory(thread)
    assert [e for e in mem.events() if e.status == "applied"], "the run never compressed"
    # What the model was sent: every assistant turn that calls a tool opens with its thinking.
    for body in agent_model.requests:
        for turn in body["messages"]:
            if turn["role"] == "assistant" and isinstance(turn["content"], list):
                assert _thinking_beside_calls(turn["content"]), turn["content"]
    last = agent_model.requests[-1]["messages"][-2]
    assert [b["type"] for b in last["content"]] == ["thinking", "text", "tool_use"]
    # What was stored: each of the model's 31 replies whole, its signature byte for byte.
    replies = [o for o in framework_runs.stored_originals(mem) if o["role"] == "assistant"]
    assert len(replies) == 31
    for k, reply in enumerate(replies):
        first = reply["content"][0]["data"]
        then = f"toolu_{k + 1:04d}" if k < 30 else "answer"
        assert first["type"] == "thinking" and first["signature"] == f"sig-{then}-{k}=="
    framework_runs.assert_each_stored_once(mem, prompts=1, calls=30)


def _responses_message() -> AIMessage:
    """An AIMessage as `ChatOpenAI`'s Responses API conversion writes it: a reasoning item,
    then the function call it led to (in the content and in `tool_calls`)."""
    from langchain_core.messages import AIMessage
    from langchain_openai.chat_models.base import _construct_lc_result_from_responses_api

    response = Response.model_construct(
        **Response.model_validate(
            {
                "id": "resp_1",
                "object": "response",
                "created_at": 1,
                "model": "o4-mini",
                "status": "completed",
                "parallel_tool_calls": True,
                "tool_choice": "auto",
                "tools": [],
                "output": [
                    {
                        "type": "reasoning",
                        "id": "rs_1",
                        "summary": [{"type": "summary_text", "text": "Read the file first."}],
                        "encrypted_content": "gAAAA-encrypted",
                    },
                    {
                        "type": "function_call",
                        "id": "fc_1",
                        "call_id": "call_1",
                        "name": "query",
                        "arguments": '{"sql": "select 1"}',
                        "status": "completed",
                    },
                ],
            }
        ).__dict__
    )
    message = _construct_lc_result_from_responses_api(response).generations[0].message
    assert isinstance(message, AIMessage)
    return message


def _anthropic_message(srv: AnthropicServer) -> AIMessage:
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool

    @tool
    def query(sql: str) -> str:
        """Run a query."""
        return ""

    message = _chat_anthropic(srv).bind_tools([query]).invoke("Count the rows")
    assert isinstance(message, AIMessage)
    return message


def test_thinking_and_reasoning_with_tool_calls_round_trip_through_the_middleware(
    make_middleware: Make, session_id: str
) -> None:
    """Defect 7: a ChatAnthropic reply (thinking, text, tool_use) and a ChatOpenAI Responses
    reply (reasoning, function_call) are stored and given back equal, beside their calls."""
    from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage

    from autoctx.integrations.langchain import working_messages

    with AnthropicServer(AnthropicAgent(calls_per_run=1, thinking=True)) as srv:
        anthropic_reply = _anthropic_message(srv)
    assert [b["type"] for b in anthropic_reply.content] == ["thinking", "text", "tool_use"]
    openai_reply = _responses_message()
    messages = [
        SystemMessage("Work."),
        HumanMessage("Count the rows"),
        anthropic_reply,
        ToolMessage("1 row", tool_call_id=anthropic_reply.tool_calls[0]["id"], name="query"),
        HumanMessage("Again, with the other model"),
        openai_reply,
        ToolMessage(
            "no such table",
            tool_call_id="call_1",
            name="query",
            status="error",
            artifact={"rows": [], "error": {"code": 42}},
        ),
    ]
    middleware = make_middleware()
    thread = {"configurable": {"thread_id": session_id}}
    mem = middleware.memory(thread)
    assert middleware._store_new(mem, {"messages": messages}) == len(messages)
    back = working_messages(mem)
    assert back == messages
    assert back[2].content[0]["signature"] == anthropic_reply.content[0]["signature"]
    assert back[5].content[0]["encrypted_content"] == "gAAAA-encrypted"
    # Stored beside their calls: one assistant message holds the reasoning and the call.
    stored = mem.messages()
    assert [b.type for b in stored[2].content] == ["opaque", "text", "tool_use"]
    assert [b.type for b in stored[5].content] == ["opaque", "tool_use"]
    # Read again from the database by another middleware: the same.
    fresh = make_middleware()
    assert working_messages(fresh.memory(thread)) == messages
    fresh.close()


def test_a_tool_messages_status_artifact_and_name_survive_the_agent_loop(
    make_middleware: Make, session_id: str
) -> None:
    """Defect 8: through `create_agent`'s own tool node, an error result stays an error, and a
    tool's artifact and name come back with it, also after the state was replaced."""
    from langchain.agents import create_agent
    from langchain_core.messages import ToolMessage
    from langchain_core.tools import ToolException, tool
    from langgraph.checkpoint.memory import InMemorySaver

    script = AnthropicAgent(
        calls_per_run=3,
        context_calls={0: ("lookup", {"key": "a"}), 1: ("broken", {}), 2: ("lookup", {"key": "b"})},
    )

    @tool(response_format="content_and_artifact")
    def lookup(key: str) -> tuple[str, dict[str, Any]]:
        """Look a key up."""
        return f"value of {key}", {"key": key, "rows": [1, 2, 3]}

    @tool
    def broken() -> str:
        """Always fails."""
        raise ToolException("the service is down")

    broken.handle_tool_error = True
    middleware = make_middleware()
    thread = {"configurable": {"thread_id": session_id}}
    with AnthropicServer(script) as srv:
        agent = create_agent(
            _chat_anthropic(srv),
            tools=[lookup, broken],
            middleware=[middleware],
            checkpointer=InMemorySaver(),
        )
        result = agent.invoke({"messages": [{"role": "user", "content": "Look up"}]}, thread)
    assert srv.rejected == []
    results = [m for m in result["messages"] if isinstance(m, ToolMessage)]
    assert [(m.name, m.status) for m in results] == [
        ("lookup", "success"),
        ("broken", "error"),
        ("lookup", "success"),
    ]
    assert [m.artifact for m in results] == [
        {"key": "a", "rows": [1, 2, 3]},
        None,
        {"key": "b", "rows": [1, 2, 3]},
    ]
    assert results[1].content == "the service is down"
    # The error reached the model as an error.
    sent = [
        b
        for turn in script.requests[-1]["messages"]
        if isinstance(turn["content"], list)
        for b in turn["content"]
        if b.get("type") == "tool_result"
    ]
    assert [b.get("is_error", False) for b in sent] == [False, True, False]


def test_the_async_loop_keeps_thinking_and_status(make_middleware: Make, session_id: str) -> None:
    """`ainvoke` goes through the middleware's async hooks with the same conversion."""
    from langchain.agents import create_agent
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool

    middleware = make_middleware()
    agent_model = AnthropicAgent(calls_per_run=4, thinking=True)
    thread = {"configurable": {"thread_id": session_id}}

    @tool
    def work(step: int) -> str:
        """Do one step of the work and return its log."""
        return tool_output(step, 3_000)

    async def run() -> dict[str, Any]:
        with AnthropicServer(agent_model) as srv:
            agent = create_agent(_chat_anthropic(srv), tools=[work], middleware=[middleware])
            return await agent.ainvoke({"messages": [{"role": "user", "content": "Go"}]}, thread)

    result = asyncio.run(run())
    assert result["messages"][-1].text == agent_model.final_answer
    replies = [m for m in result["messages"] if isinstance(m, AIMessage)]
    assert all(r.content[0]["type"] == "thinking" for r in replies)
