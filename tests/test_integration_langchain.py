"""AutoContextMiddleware: autoctx inside LangChain v1's `create_agent`, through its real loop.

The agent's model is `ChatOpenAI` pointed at the local Chat Completions server
(tests/openai_server.py) whose replies come from `ScriptedAgent`, which counts the input of
every request the agent loop sends.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import pytest

from autoctx import (
    AutoContextClient,
    AutoContextConfig,
    AutoContextMemory,
    ConfigError,
    OfflineSummarizer,
)
from tests import framework_runs
from tests.agent_model import ScriptedAgent, request_tokens, tool_output
from tests.openai_server import OpenAIServer

if TYPE_CHECKING:
    from autoctx.integrations.langchain import AutoContextMiddleware


def _agent(
    srv: OpenAIServer, middleware: AutoContextMiddleware, work: framework_runs.Work, **kw: Any
) -> Any:
    from langchain.agents import create_agent
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    model = ChatOpenAI(model="test-model", base_url=srv.base_url, api_key="test", max_retries=0)
    return create_agent(
        model,
        tools=[framework_runs.work_tool(tool, work)],
        system_prompt="Work. " + AutoContextMemory.system_prompt_snippet(),
        middleware=[middleware],
        **kw,
    )


@pytest.fixture
def make_middleware(db_url: str) -> Callable[..., AutoContextMiddleware]:
    from autoctx.integrations.langchain import AutoContextMiddleware

    def make(**kw: Any) -> AutoContextMiddleware:
        kw.setdefault("summarizer", OfflineSummarizer())
        kw.setdefault("config", AutoContextConfig(max_tokens=framework_runs.WINDOW))
        return AutoContextMiddleware(db_url, **kw)

    return make


def _tokens(messages: Sequence[Any]) -> int:
    from langchain_core.messages import convert_to_openai_messages

    return request_tokens({"messages": convert_to_openai_messages(list(messages))})


def test_every_model_call_of_a_long_run_stays_under_the_window(
    make_middleware: Callable[..., AutoContextMiddleware], session_id: str
) -> None:
    middleware = make_middleware()
    agent_model = ScriptedAgent(
        calls_per_run=48, context_calls={40: ("context_search", {"query": '"FACT-0003"'})}
    )
    work = framework_runs.Work()
    with OpenAIServer(default=agent_model) as srv:
        agent = _agent(srv, middleware, work)
        result = agent.invoke(
            {"messages": [{"role": "user", "content": "Do the work"}]},
            {"configurable": {"thread_id": session_id}, "recursion_limit": 500},
        )
    assert result["messages"][-1].content == agent_model.final_answer
    assert work.calls == 47 and len(agent_model.inputs) == 49
    framework_runs.assert_under_window(agent_model)
    assert {"context_reload", "context_search"} <= set(agent_model.offered_tools(0))
    # The graph state is the working context (under the window), not every message of the run.
    mem = middleware.memory({"configurable": {"thread_id": session_id}})
    assert _tokens(result["messages"]) < framework_runs.WINDOW
    assert [e for e in mem.events() if e.status == "applied"], "the run never compressed"
    answers = framework_runs.answers_to(agent_model, "context_search")
    assert len(answers) == 1 and "FACT-0003" in answers[0]
    framework_runs.assert_each_stored_once(mem, prompts=1, calls=48)
    framework_runs.assert_reachable(mem, range(1, work.calls + 1))


def test_a_long_task_at_a_small_window_hands_the_model_its_tool_results_last(
    make_middleware: Callable[..., AutoContextMiddleware], session_id: str
) -> None:
    """S6 fires in `before_model`, when the state ends with the tool results the model is
    about to read: the state the model is called with still ends with them."""
    from langchain.agents import create_agent
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    middleware = make_middleware(config=AutoContextConfig(max_tokens=framework_runs.SMALL_WINDOW))
    agent_model = ScriptedAgent(calls_per_run=30)
    sizes = framework_runs.small_output_size
    calls: list[int] = []

    @tool
    def work(step: int) -> str:
        """Do one step of the work and return its log."""
        calls.append(step)
        return tool_output(step, sizes(len(calls)))

    with OpenAIServer(default=agent_model) as srv:
        model = ChatOpenAI(model="test-model", base_url=srv.base_url, api_key="test", max_retries=0)
        agent = create_agent(model, tools=[work], middleware=[middleware])
        result = agent.invoke(
            {"messages": [{"role": "user", "content": "Do the 30 steps"}]},
            {"configurable": {"thread_id": session_id}, "recursion_limit": 500},
        )
    assert result["messages"][-1].content == agent_model.final_answer and len(calls) == 30
    framework_runs.assert_every_request_ends_with_input(agent_model)
    framework_runs.assert_under_window(agent_model, framework_runs.SMALL_WINDOW)
    mem = middleware.memory({"configurable": {"thread_id": session_id}})
    framework_runs.assert_current_round_summarized(mem)
    framework_runs.assert_reachable(mem, range(30))


@pytest.mark.parametrize("measured", [True, False], ids=["measured", "reserve_0"])
def test_the_whole_request_with_many_tools_stays_under_a_small_window(
    make_middleware: Callable[..., AutoContextMiddleware], session_id: str, measured: bool
) -> None:
    """The middleware measures the tool definitions and the system prompt of each model call
    into the session's reserve: messages, tools and system prompt together stay under the
    window. With `reserve_tokens=0` set (no room kept) the same run goes over it."""
    from langchain.agents import create_agent
    from langchain_core.tools import StructuredTool, tool
    from langchain_openai import ChatOpenAI

    config = AutoContextConfig(max_tokens=framework_runs.SMALL_WINDOW)
    if not measured:
        config = AutoContextConfig(max_tokens=framework_runs.SMALL_WINDOW, reserve_tokens=0)
    middleware = make_middleware(config=config)
    agent_model = ScriptedAgent(calls_per_run=30, tool_name="work")
    work = framework_runs.Work(framework_runs.small_output_size)
    extra = [
        StructuredTool(name=name, description=text, args_schema=schema, func=lambda **_: "")
        for name, text, schema in framework_runs.big_tool_specs()
    ]
    with OpenAIServer(default=agent_model) as srv:
        model = ChatOpenAI(model="test-model", base_url=srv.base_url, api_key="test", max_retries=0)
        agent = create_agent(
            model,
            tools=[framework_runs.work_tool(tool, work), *extra],
            system_prompt="Work. " + AutoContextMemory.system_prompt_snippet(),
            middleware=[middleware],
        )
        result = agent.invoke(
            {"messages": [{"role": "user", "content": "Do the 30 steps"}]},
            {"configurable": {"thread_id": session_id}, "recursion_limit": 500},
        )
    assert result["messages"][-1].content == agent_model.final_answer and work.calls == 30
    mem = middleware.memory({"configurable": {"thread_id": session_id}})
    assert len(agent_model.offered_tools(0)) == 1 + framework_runs.BIG_TOOLS + 2
    framework_runs.assert_whole_requests_fit(
        agent_model, mem.config.reserve_tokens, measured=measured
    )


def test_many_short_runs_and_a_restart_with_a_checkpointer(
    make_middleware: Callable[..., AutoContextMiddleware], session_id: str
) -> None:
    from langgraph.checkpoint.memory import InMemorySaver

    agent_model = ScriptedAgent(
        calls_per_run=3, context_calls={1: ("context_search", {"query": '"FACT-0002"'})}
    )
    work = framework_runs.Work()
    checkpointer = InMemorySaver()
    config: Any = {"configurable": {"thread_id": session_id}}
    finals: list[Any] = []

    def runs(middleware: AutoContextMiddleware, prompts: range) -> None:
        with OpenAIServer(default=agent_model) as srv:
            agent = _agent(srv, middleware, work, checkpointer=checkpointer)
            for k in prompts:
                result = agent.invoke(
                    {"messages": [{"role": "user", "content": f"Task {k}"}]}, config
                )
                finals.append(result["messages"][-1].content)

    runs(make_middleware(), range(13))
    # A restart: a new middleware and agent, the same thread; the runs continue.
    agent_model.requests.clear()
    second = make_middleware()
    runs(second, range(13, 25))
    assert finals == [agent_model.final_answer] * 25
    framework_runs.assert_under_window(agent_model)
    assert "Task 12" in json.dumps(agent_model.requests[0]["messages"])
    mem = second.memory(config)
    assert [e for e in mem.events() if e.status == "applied"]
    framework_runs.assert_searches_found_the_fact(agent_model, later_runs=12)
    framework_runs.assert_each_stored_once(mem, prompts=25, calls=75)
    framework_runs.assert_reachable(mem, range(1, work.calls + 1))
    # The checkpointed state stays the working context, not the thread's whole history.
    state = checkpointer.get(config)
    assert state is not None
    assert _tokens(state["channel_values"]["messages"]) < framework_runs.WINDOW


def test_without_a_checkpointer_the_session_carries_the_thread(
    make_middleware: Callable[..., AutoContextMiddleware], session_id: str
) -> None:
    """No checkpointer: each invoke starts from its new message only, and the model still
    gets the thread's history, from autoctx (an explicit session id here)."""
    agent_model = ScriptedAgent(calls_per_run=1)
    work = framework_runs.Work()
    with OpenAIServer(default=agent_model) as srv:
        for k in range(2):
            agent = _agent(srv, make_middleware(session_id=session_id), work)
            agent.invoke({"messages": [{"role": "user", "content": f"Task {k}"}]})
    assert "Task 0" in json.dumps(agent_model.requests[-1]["messages"])


def test_a_run_without_a_thread_id_is_refused_naming_the_fix(
    make_middleware: Callable[..., AutoContextMiddleware],
) -> None:
    agent_model = ScriptedAgent(calls_per_run=1)
    with OpenAIServer(default=agent_model) as srv:
        agent = _agent(srv, make_middleware(), framework_runs.Work())
        with pytest.raises(ConfigError, match="thread_id"):
            agent.invoke({"messages": [{"role": "user", "content": "hi"}]})
    assert agent_model.requests == []


def test_an_async_run_stays_under_the_window_and_stores_each_message_once(
    make_middleware: Callable[..., AutoContextMiddleware], session_id: str
) -> None:
    """`ainvoke` goes through the async hooks (`abefore_model`, `aafter_agent`) and tools."""
    from langgraph.checkpoint.memory import InMemorySaver

    middleware = make_middleware()
    agent_model = ScriptedAgent(
        calls_per_run=12, context_calls={10: ("context_search", {"query": '"FACT-0001"'})}
    )
    work = framework_runs.Work()
    config: Any = {"configurable": {"thread_id": session_id}, "recursion_limit": 100}
    with OpenAIServer(default=agent_model) as srv:
        agent = _agent(srv, middleware, work, checkpointer=InMemorySaver())

        async def runs() -> None:
            for k in range(2):
                prompt = {"messages": [{"role": "user", "content": f"Task {k}"}]}
                result = await agent.ainvoke(prompt, config)
                assert result["messages"][-1].content == agent_model.final_answer

        asyncio.run(runs())
    framework_runs.assert_under_window(agent_model)
    answers = framework_runs.answers_to(agent_model, "context_search")
    assert len(answers) == 2 and all("FACT-0001" in a for a in answers)
    mem = middleware.memory(config)
    assert [e for e in mem.events() if e.status == "applied"]
    framework_runs.assert_each_stored_once(mem, prompts=2, calls=24)


def test_a_given_client_opens_the_memories_and_its_close_closes_them(
    db_url: str, client: AutoContextClient, session_id: str
) -> None:
    from autoctx.integrations.langchain import AutoContextMiddleware

    AutoContextClient.close_shared(db_url)
    middleware = AutoContextMiddleware(
        config=AutoContextConfig(max_tokens=framework_runs.WINDOW),
        summarizer=OfflineSummarizer(),
        client=client,
    )
    agent_model = ScriptedAgent(calls_per_run=2)
    config: Any = {"configurable": {"thread_id": session_id}}
    with OpenAIServer(default=agent_model) as srv:
        agent = _agent(srv, middleware, framework_runs.Work())
        result = agent.invoke({"messages": [{"role": "user", "content": "Do the work"}]}, config)
    assert result["messages"][-1].content == agent_model.final_answer
    mem = middleware.memory(config)
    assert len(mem.messages()) == 6  # the prompt, two calls and results, the answer
    framework_runs.assert_opened_through(client, mem, db_url)
    with pytest.raises(ConfigError, match="not both"):
        AutoContextMiddleware(db_url, client=client)


@pytest.mark.parametrize("package", ["langchain", "langchain_core", "langgraph"])
def test_without_langchain_the_import_error_names_the_extra(package: str) -> None:
    message = framework_runs.import_error_without("autoctx.integrations.langchain", package)
    assert "needs LangChain v1" in message
    framework_runs.assert_names_the_extra(message, "langchain")


def test_a_missing_module_that_is_not_the_framework_passes_through_unchanged() -> None:
    """Only the framework's own packages are reported as the missing extra: a dependency of
    autoctx itself that is missing keeps its own error."""
    from autoctx.integrations._optional import framework_of

    with (
        pytest.raises(ModuleNotFoundError) as caught,
        framework_of("LangChain", needs="LangChain v1", extra="langchain", packages=("langchain",)),
    ):
        raise ModuleNotFoundError("No module named 'tiktoken'", name="tiktoken")
    assert caught.value.name == "tiktoken" and "autoctx-pg" not in str(caught.value)
