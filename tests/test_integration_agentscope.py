"""AgentScope 2.x with autoctx's middleware: the agent's own ReAct loop, its OpenAI chat model and
a real local Chat Completions server (tests/openai_server.py) scripted by tests/agent_model.py.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Coroutine, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

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
    from agentscope.agent import Agent
    from agentscope.message import (
        Msg,
    )

    from autoctx.integrations.agentscope import AutoContextMiddleware

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def value(step: int) -> str:
    """The fact of step `step` as `tool_output` states it (a search answer bolds its query)."""
    return f"value-{step * 7919 % 100_003}"


def work(step: int) -> str:
    """Run one step of the job.

    Args:
        step: the step number
    """
    return tool_output(step, framework_runs.output_size(step, stride=3571))


def small_work(step: int) -> str:
    """Run one step of the job.

    Args:
        step: the step number
    """
    return tool_output(step, framework_runs.small_output_size(step))


def make_agent(
    srv: OpenAIServer,
    middleware: AutoContextMiddleware | None,
    *,
    context_size: int = 128_000,
    stream: bool = False,
    tool: Any = work,
    extra_tools: Sequence[Any] = (),
    system_prompt: str = "You run the job step by step.",
) -> Agent:
    from agentscope.agent import Agent, InjectionConfig, ReActConfig
    from agentscope.credential import OpenAICredential
    from agentscope.model import OpenAIChatModel
    from agentscope.permission import PermissionBehavior, PermissionDecision
    from agentscope.tool import FunctionTool, Toolkit

    model = OpenAIChatModel(
        credential=OpenAICredential(api_key="test", base_url=srv.base_url),
        model="test-model",
        stream=stream,
        context_size=context_size,
    )
    allow = PermissionDecision(behavior=PermissionBehavior.ALLOW, message="test tool")
    return Agent(
        name="worker",
        system_prompt=system_prompt,
        model=model,
        toolkit=Toolkit(tools=[FunctionTool(tool, permission=allow), *extra_tools]),
        middlewares=[middleware] if middleware is not None else [],
        # The runtime-state hints are user messages; the scripted model reads a user message
        # last as the start of a new run.
        injection_config=InjectionConfig(inject_runtime_state=False),
        react_config=ReActConfig(max_iters=200),
    )


@pytest.fixture
def open_mw(db_url: str, session_id: str) -> Iterator[Any]:
    from autoctx.integrations.agentscope import AutoContextMiddleware

    async def _open(config: AutoContextConfig | None = None) -> AutoContextMiddleware:
        return await AutoContextMiddleware.open(
            session_id,
            db_url,
            config or AutoContextConfig(max_tokens=framework_runs.WINDOW),
            summarizer=OfflineSummarizer(),
        )

    yield _open


async def stored_once(mw: AutoContextMiddleware, steps: range) -> None:
    """Every step's output is stored exactly once, whole, and found by `context_search`."""
    for step in steps:
        fact = f"FACT-{step:04d}"
        hits = await mw.memory.search(f'"{fact}"', limit=20)
        originals = []
        for hit in hits:
            (msg,) = await mw.memory.reload(message_id=hit.message_id)
            if msg.role == "tool" and msg.content[0].output_text == work(step):  # type: ignore[union-attr]
                originals.append(hit.message_id)
        assert len(originals) == 1, (step, originals)
        answer = await mw.memory.handle_tool_call(
            {"function": {"name": "context_search", "arguments": json.dumps({"query": fact})}}
        )
        assert value(step) in answer


# -- the conversion --------------------------------------------------------------------------


def every_block_kind() -> list[Msg]:
    from agentscope.message import (
        Base64Source,
        DataBlock,
        HintBlock,
        Msg,
        TextBlock,
        ThinkingBlock,
        ToolCallBlock,
        ToolResultBlock,
        URLSource,
    )

    return [
        Msg(name="system", role="system", content=[TextBlock(text="Be brief.")]),
        Msg(
            name="user",
            role="user",
            content=[
                TextBlock(text="look at this"),
                DataBlock(
                    source=URLSource(url="https://example.com/a.png", media_type="image/png")
                ),
            ],
            metadata={"channel": "cli"},
        ),
        Msg(
            name="worker",
            role="assistant",
            content=[
                HintBlock(hint="a runtime hint", source="system"),
                ThinkingBlock(thinking="plan", signature="sig-bytes"),
                TextBlock(text="calling two tools"),
                ToolCallBlock(id="c1", name="work", input='{"step": 1}', state="finished"),
                ToolCallBlock(id="c2", name="work", input='{"step": 2}', state="finished"),
                ToolResultBlock(id="c1", name="work", output="plain output", state="success"),
                ToolResultBlock(
                    id="c2",
                    name="work",
                    output=[
                        TextBlock(text="part one"),
                        DataBlock(source=Base64Source(data="aGk=", media_type="image/png")),
                        TextBlock(text="part two"),
                    ],
                    state="error",
                    metadata={"exit": 2},
                ),
                HintBlock(hint=[TextBlock(text="multimodal hint")]),
                TextBlock(text="done"),
            ],
            metadata={"k": [1, 2]},
        ),
    ]


def test_every_block_kind_converts_both_ways_without_loss() -> None:
    from autoctx.integrations.agentscope import _from_autoctx, _to_autoctx

    msgs = every_block_kind()
    converted = [m for msg in msgs for m in _to_autoctx(msg)]
    # One reply's calls and results become messages autoctx pairs: results in tool messages.
    assert [m.role for m in converted] == [
        "system",
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",
    ]
    assert _from_autoctx(converted) == msgs


def test_the_conversion_survives_storage(open_memory: Any) -> None:
    from autoctx.integrations.agentscope import _from_autoctx, _to_autoctx

    msgs = every_block_kind()
    with open_memory() as mem:
        mem.add([m for msg in msgs for m in _to_autoctx(msg)])
        assert _from_autoctx(mem.messages()) == msgs


def test_a_message_stored_in_parts_comes_back_whole() -> None:
    from autoctx.integrations.agentscope import _from_autoctx, _to_autoctx

    msg = every_block_kind()[2]
    parts = _to_autoctx(msg, 0, 4) + _to_autoctx(msg, 4, 5) + _to_autoctx(msg, 5)
    assert _from_autoctx(parts) == [msg]


def test_a_foreign_context_entry_is_invalid_message_naming_it() -> None:
    from autoctx.integrations.agentscope import _to_autoctx

    with pytest.raises(InvalidMessage, match=r"dict, not an agentscope\.message\.Msg") as info:
        _to_autoctx({"role": "user", "content": "secret words"})  # type: ignore[arg-type]
    assert "secret" not in str(info.value)


def test_the_middleware_takes_an_async_memory_only(open_memory: Any) -> None:
    from autoctx.integrations.agentscope import AutoContextMiddleware

    with open_memory() as mem, pytest.raises(TypeError, match="AsyncAutoContextMemory"):
        AutoContextMiddleware(mem)


# -- the agent loop --------------------------------------------------------------------------


def test_a_long_run_stays_under_the_window_and_stores_every_output(open_mw: Any) -> None:
    from agentscope.message import UserMsg

    calls = 48
    agent_model = ScriptedAgent(
        calls_per_run=calls,
        context_calls={
            44: ("context_search", {"query": "FACT-0003"}),
        },
    )

    async def go() -> None:
        mw = await open_mw()
        with OpenAIServer(default=agent_model) as srv:
            agent = make_agent(srv, mw)
            reply = await agent.reply(UserMsg(name="user", content="Run the job."))
            assert reply.get_text_content() == agent_model.final_answer
            # The agent's own context does not keep what autoctx holds.
            assert len(agent.state.context) == 1
        assert len(agent_model.inputs) == calls + 1
        framework_runs.assert_under_window(agent_model)
        assert "context_search" in agent_model.offered_tools(0)
        # The context_search call was answered with the fact of an early, compressed step.
        answered = agent_model.requests[45]["messages"][-1]
        assert answered["role"] == "tool" and value(3) in answered["content"]
        assert any(e.status == "applied" for e in await mw.memory.events())
        await stored_once(mw, range(44))
        await mw.close()

    run(go())


def test_a_long_task_at_a_small_window_hands_the_model_its_tool_results_last(
    open_mw: Any,
) -> None:
    """S6 fires in `on_model_call`, when the context ends with the tool results the model is
    about to read: the messages the model is called with still end with them."""
    from agentscope.message import UserMsg

    agent_model = ScriptedAgent(calls_per_run=30)

    async def go() -> None:
        mw = await open_mw(AutoContextConfig(max_tokens=framework_runs.SMALL_WINDOW))
        with OpenAIServer(default=agent_model) as srv:
            agent = make_agent(srv, mw, tool=small_work)
            reply = await agent.reply(UserMsg(name="user", content="Run the 30 steps."))
            assert reply.get_text_content() == agent_model.final_answer
        framework_runs.assert_every_request_ends_with_input(agent_model)
        framework_runs.assert_under_window(agent_model, framework_runs.SMALL_WINDOW)
        await mw.close()

    run(go())
    assert len(agent_model.inputs) == 31
    mw = run(open_mw())
    framework_runs.assert_current_round_summarized(mw.memory.sync)
    framework_runs.assert_reachable(mw.memory.sync, range(30))
    run(mw.close())


@pytest.mark.parametrize("measured", [True, False], ids=["measured", "reserve_0"])
def test_the_whole_request_with_many_tools_stays_under_a_small_window(
    open_mw: Any, measured: bool
) -> None:
    """The middleware measures each model call's tool schemas and system prompt into the
    session's reserve: messages, tools and system prompt together stay under the window. With
    `reserve_tokens=0` set (no room kept) the same run goes over it."""
    from agentscope.message import UserMsg
    from agentscope.permission import PermissionBehavior, PermissionDecision
    from agentscope.tool import FunctionTool

    agent_model = ScriptedAgent(calls_per_run=30, tool_name="small_work")
    config = AutoContextConfig(max_tokens=framework_runs.SMALL_WINDOW)
    if not measured:
        config = AutoContextConfig(max_tokens=framework_runs.SMALL_WINDOW, reserve_tokens=0)
    allow = PermissionDecision(behavior=PermissionBehavior.ALLOW, message="test tool")

    def unused(**_: Any) -> str:
        return ""

    extra = [
        FunctionTool(unused, name=name, description=text, input_schema=schema, permission=allow)
        for name, text, schema in framework_runs.big_tool_specs()
    ]
    prompt = "You run the job step by step. " + AutoContextMemory.system_prompt_snippet()

    async def go() -> int:
        mw = await open_mw(config)
        with OpenAIServer(default=agent_model) as srv:
            agent = make_agent(srv, mw, tool=small_work, extra_tools=extra, system_prompt=prompt)
            reply = await agent.reply(UserMsg(name="user", content="Run the 30 steps."))
            assert reply.get_text_content() == agent_model.final_answer
        reserve = mw.memory.sync.config.reserve_tokens
        await mw.close()
        return reserve

    reserve = run(go())
    assert len(agent_model.inputs) == 31
    assert len(agent_model.offered_tools(0)) == 1 + framework_runs.BIG_TOOLS + 2
    framework_runs.assert_whole_requests_fit(agent_model, reserve, measured=measured)


def test_without_the_middleware_the_same_run_overflows(db_url: str) -> None:
    """The contrast: AgentScope's agent with its default context settings and no middleware."""
    from agentscope.message import UserMsg

    calls = 48
    agent_model = ScriptedAgent(calls_per_run=calls)

    async def go() -> None:
        with OpenAIServer(default=agent_model) as srv:
            agent = make_agent(srv, None)
            await agent.reply(UserMsg(name="user", content="Run the job."))

    run(go())
    print(f"without autoctx: largest request {agent_model.largest_request()} tokens")
    assert agent_model.largest_request() > 5 * framework_runs.WINDOW
    assert agent_model.over(framework_runs.WINDOW) > 30


def test_many_short_runs_stay_under_the_window_and_a_reopened_session_continues(
    open_mw: Any,
) -> None:
    from agentscope.message import UserMsg

    runs, per_run = 25, 3
    agent_model = ScriptedAgent(calls_per_run=per_run)
    sizes: list[int] = []

    async def go() -> None:
        mw = await open_mw()
        with OpenAIServer(default=agent_model) as srv:
            agent = make_agent(srv, mw)
            for i in range(runs):
                agent_model.arguments = lambda step, i=i: {"step": i * per_run + step}
                await agent.reply(UserMsg(name="user", content=f"Run part {i}."))
                sizes.append(len(agent.state.context))
            await mw.close()
            framework_runs.assert_under_window(agent_model)
            await_count = len(agent_model.requests)
            # A new process would build new objects: a new middleware and a new agent.
            mw2 = await open_mw()
            agent_model.context_calls = {0: ("context_search", {"query": "FACT-0001"})}
            agent_model.arguments = lambda step: {"step": runs * per_run + step}
            agent2 = make_agent(srv, mw2)
            await agent2.reply(UserMsg(name="user", content="Continue."))
            first = agent_model.requests[await_count]["messages"]
            texts = json.dumps(first)
            # The first request of the new agent holds the earlier runs (as autoctx keeps them).
            assert "Run part 24." in texts and "FACT-0074" in texts
            answered = agent_model.requests[await_count + 1]["messages"][-1]
            assert value(1) in answered["content"]
            framework_runs.assert_under_window(agent_model)
            await stored_once(mw2, range(runs * per_run + 1, runs * per_run + per_run))
            await stored_once(mw2, range(runs * per_run))
            # No message of the first agent was stored twice by the second.
            hits = await mw2.memory.search('"Run part 24."', limit=20)
            assert sum(1 for h in hits if h.role == "user") == 1
            await mw2.close()
        # The agent's context stays small across runs: autoctx holds the history.
        assert max(sizes) <= 2

    run(go())


def test_the_context_tools_are_offered_by_list_tools_too(open_mw: Any) -> None:
    async def go() -> list[str]:
        mw = await open_mw()
        names = [t.name for t in await mw.list_tools()]
        await mw.close()
        return names

    assert run(go()) == ["context_reload", "context_search"]


def test_a_reload_call_through_the_agent_returns_the_original(open_mw: Any) -> None:
    from agentscope.message import UserMsg

    agent_model = ScriptedAgent(calls_per_run=3)

    async def go() -> None:
        mw = await open_mw()
        with OpenAIServer(default=agent_model) as srv:
            agent = make_agent(srv, mw)
            await agent.reply(UserMsg(name="user", content="first"))
            (hit,) = [h for h in await mw.memory.search('"FACT-0001"') if h.role == "tool"]
            agent_model.context_calls = {1: ("context_reload", {"message_id": hit.message_id})}
            await agent.reply(UserMsg(name="user", content="second"))
            answer = agent_model.requests[-2]["messages"][-1]
            assert answer["role"] == "tool" and work(1)[:200] in answer["content"]
        await mw.close()

    run(go())


def test_a_given_client_opens_the_memory_and_its_close_closes_it(
    db_url: str, client: AutoContextClient, session_id: str
) -> None:
    from agentscope.message import UserMsg

    from autoctx.integrations.agentscope import AutoContextMiddleware

    AutoContextClient.close_shared(db_url)
    agent_model = ScriptedAgent(calls_per_run=2)

    async def go() -> AutoContextMiddleware:
        mw = await AutoContextMiddleware.open(
            session_id,
            config=AutoContextConfig(max_tokens=framework_runs.WINDOW),
            summarizer=OfflineSummarizer(),
            client=client,
        )
        with OpenAIServer(default=agent_model) as srv:
            reply = await make_agent(srv, mw).reply(UserMsg(name="user", content="Run the job."))
        assert reply.get_text_content() == agent_model.final_answer
        await stored_once(mw, range(2))
        return mw

    mw = run(go())
    framework_runs.assert_opened_through(client, mw.memory.sync, db_url)
    with pytest.raises(ConfigError, match="not both"):
        run(AutoContextMiddleware.open(session_id, db_url, client=client))


def test_without_agentscope_the_import_error_names_the_extra() -> None:
    message = framework_runs.import_error_without("autoctx.integrations.agentscope", "agentscope")
    assert "needs AgentScope 2.x" in message
    framework_runs.assert_names_the_extra(message, "agentscope")


def test_the_example_runs_against_the_local_endpoint(db_url: str) -> None:
    example = Path(__file__).resolve().parents[1] / "examples" / "agentscope_agent.py"
    agent_model = ScriptedAgent(calls_per_run=4)
    with OpenAIServer(default=agent_model) as srv:
        out = subprocess.run(
            [sys.executable, str(example), srv.base_url, db_url],
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert out.returncode == 0, out.stderr[-2000:]
    assert agent_model.final_answer in out.stdout
    assert agent_model.offered_tools(0)[-2:] == ["context_reload", "context_search"]


def test_a_restored_agent_state_is_not_stored_twice(open_mw: Any) -> None:
    """An agent built from a saved AgentState and a new middleware (a restart that restores
    AgentScope's own state too) does not store again what the session already holds."""
    from agentscope.message import UserMsg

    agent_model = ScriptedAgent(calls_per_run=2)

    async def go() -> None:
        mw = await open_mw()
        with OpenAIServer(default=agent_model) as srv:
            agent = make_agent(srv, mw)
            await agent.reply(UserMsg(name="user", content="first run"))
            saved = agent.state.model_copy(deep=True)
            assert saved.context  # the reply's final message stays in the agent's state
            await mw.close()
            mw2 = await open_mw()
            agent2 = make_agent(srv, mw2)
            agent2.state = saved
            await agent2.reply(UserMsg(name="user", content="second run"))
            finals = [
                m
                for m in await mw2.memory.messages()
                if m.role == "assistant"
                and any(getattr(b, "text", None) == agent_model.final_answer for b in m.content)
            ]
            assert len(finals) == 2, [m.id for m in finals]
            await mw2.close()

    run(go())


def test_a_streaming_model_is_bounded_too(open_mw: Any) -> None:
    from agentscope.message import UserMsg

    agent_model = ScriptedAgent(calls_per_run=24)

    async def go() -> None:
        mw = await open_mw()
        with OpenAIServer(default=agent_model) as srv:
            agent = make_agent(srv, mw, stream=True)
            reply = await agent.reply(UserMsg(name="user", content="Run the job."))
            assert reply.get_text_content() == agent_model.final_answer
        assert all(r.get("stream") for r in agent_model.requests)
        framework_runs.assert_under_window(agent_model)
        await stored_once(mw, range(24))
        await mw.close()

    run(go())


def test_a_result_over_agentscopes_limit_is_stored_whole_and_reloads_byte_for_byte(
    open_mw: Any,
) -> None:
    """AgentScope cuts a tool result over its `tool_result_limit` before it reaches the agent's
    context; the middleware's `on_acting` sees the whole one, so autoctx stores it whole and
    offloads it (before issue 32 it stored the cut text and AgentScope's reminder)."""
    from agentscope.message import UserMsg

    big = tool_output(7, 200_000)
    assert len(big.encode()) == 200_000

    def fetch(step: int) -> str:
        """Fetch the whole build log.

        Args:
            step: the step number
        """
        return big

    agent_model = ScriptedAgent(calls_per_run=2)

    async def go() -> None:
        mw = await open_mw()
        with OpenAIServer(default=agent_model) as srv:
            agent = make_agent(srv, mw, tool=fetch)
            agent.context_config.tool_result_limit = 2_000
            reply = await agent.reply(UserMsg(name="user", content="Read the log."))
            assert reply.get_text_content() == agent_model.final_answer
        framework_runs.assert_under_window(agent_model)
        sent = json.dumps(agent_model.requests)
        assert "<<<TRUNCATED>>>" not in sent  # AgentScope's cut never reached the model
        results = [
            m
            for e in await mw.memory.events()
            if e.offload_uuid is not None
            for m in await mw.memory.reload(e.offload_uuid)
            if m.role == "tool"
        ]
        assert len(results) == 2
        for msg in results:
            assert msg.tool_results[0].output_text == big
        hits = await mw.memory.search('"FACT-0007"')
        whole = [
            m
            for h in hits
            for m in await mw.memory.reload(message_id=h.message_id)
            if m.role == "tool" and m.kind == "original"
        ]
        assert len(whole) == 2 and all(m.tool_results[0].output_text == big for m in whole)
        await mw.close()

    run(go())
