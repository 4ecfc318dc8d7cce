"""AgentScope 2.x for bench/frameworks.py: an `agentscope.agent.Agent` (its own ReAct loop and
OpenAI chat model) against the scripted local Chat Completions server, with and without
autoctx's `AutoContextMiddleware`.

Without autoctx the agent keeps AgentScope's defaults (its model's 128k context size and its
built-in one-shot summary): that is what a user gets who only sets up the model.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.agent_model

from agentscope.agent import Agent, InjectionConfig, ReActConfig
from agentscope.credential import OpenAICredential
from agentscope.message import UserMsg
from agentscope.model import OpenAIChatModel
from agentscope.permission import PermissionBehavior, PermissionDecision
from agentscope.tool import FunctionTool, Toolkit

from autoctx import AutoContextConfig, OfflineSummarizer
from autoctx.integrations.agentscope import AutoContextMiddleware
from tests.agent_model import ScriptedAgent, tool_output
from tests.openai_server import OpenAIServer

NAME = "AgentScope 2.x Agent"

_WORKLOADS = {"long": (1, 48), "short": (25, 3)}


def _size(step: int) -> int:
    return 2000 + (step * 3571) % 18_001


def run(workload: str, *, use_autoctx: bool, database_url: str, window: int) -> dict[str, int]:
    runs, per_run = _WORKLOADS[workload]
    return asyncio.run(_run(runs, per_run, use_autoctx, database_url, window))


async def _run(
    runs: int, per_run: int, use_autoctx: bool, database_url: str, window: int
) -> dict[str, int]:
    scripted = ScriptedAgent(calls_per_run=per_run)
    tool_calls = 0

    def work(step: int) -> str:
        """Run one step of the job.

        Args:
            step: the step number
        """
        nonlocal tool_calls
        tool_calls += 1
        return tool_output(step, _size(step))

    middleware = None
    if use_autoctx:
        middleware = await AutoContextMiddleware.open(
            f"bench-agentscope-{uuid.uuid4().hex[:12]}",
            database_url,
            AutoContextConfig(max_tokens=window),
            summarizer=OfflineSummarizer(),
        )
    with OpenAIServer(default=scripted) as srv:
        agent = Agent(
            name="worker",
            system_prompt="You run the job step by step.",
            model=OpenAIChatModel(
                credential=OpenAICredential(api_key="bench", base_url=srv.base_url),
                model="test-model",
                stream=False,
            ),
            toolkit=Toolkit(
                tools=[
                    FunctionTool(
                        work,
                        permission=PermissionDecision(
                            behavior=PermissionBehavior.ALLOW, message="bench tool"
                        ),
                    )
                ]
            ),
            middlewares=[middleware] if middleware is not None else [],
            # Its runtime-state hints are user messages, which the scripted model reads as a
            # new run.
            injection_config=InjectionConfig(inject_runtime_state=False),
            react_config=ReActConfig(max_iters=per_run + 10),
        )
        for i in range(runs):
            scripted.arguments = lambda step, i=i: {"step": i * per_run + step}
            await agent.reply(UserMsg(name="user", content=f"Run part {i} of the job."))
    summarizer_calls = 0
    if middleware is not None:
        events = await middleware.memory.events()
        summarizer_calls = sum(1 for e in events if e.status == "applied" and e.model)
        await middleware.close()
    return {
        "largest_request": scripted.largest_request(),
        "requests": len(scripted.inputs),
        "over_window": scripted.over(window),
        "summarizer_calls": summarizer_calls,
        "tool_calls": tool_calls,
    }


if __name__ == "__main__":
    import os

    url = os.environ.get("AUTOCTX_DATABASE_URL", "")
    for name in _WORKLOADS:
        for use in (False, True):
            print(name, use, run(name, use_autoctx=use, database_url=url, window=16_000))
