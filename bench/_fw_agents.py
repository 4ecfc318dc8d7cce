"""bench/frameworks.py's OpenAI Agents SDK workload: `Runner.run` with the SDK's Chat Completions
model against the local server and the scripted agent; with autoctx, an `AutoContextSession`
and its `call_model_input_filter` (`session.run_config()`), without, the SDK's `SQLiteSession`.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agents import (
    Agent,
    OpenAIChatCompletionsModel,
    RunConfig,
    Runner,
    SQLiteSession,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

from autoctx import AutoContextConfig, AutoContextMemory, OfflineSummarizer
from autoctx.integrations.openai_agents import AutoContextSession, context_tools
from tests.agent_model import ScriptedAgent, tool_output
from tests.openai_server import OpenAIServer

NAME = "OpenAI Agents SDK Runner.run"

#: (runs, tool calls per run) of each workload.
WORKLOADS = {"long": (1, 48), "short": (25, 3)}


def output_size(n: int) -> int:
    """2-20 KB, varying from call to call."""
    return 2_000 + (n * 7_919) % 18_001


def summarizer_calls(mem: AutoContextMemory) -> int:
    """Compression events that ran a summarizer (they name its model)."""
    return sum(1 for e in mem.events() if e.model is not None)


def run(workload: str, *, use_autoctx: bool, database_url: str, window: int) -> dict[str, int]:
    return asyncio.run(
        _run(workload, use_autoctx=use_autoctx, database_url=database_url, window=window)
    )


async def _run(
    workload: str, *, use_autoctx: bool, database_url: str, window: int
) -> dict[str, int]:
    runs, calls = WORKLOADS[workload]
    set_tracing_disabled(True)
    agent_model = ScriptedAgent(calls_per_run=calls)
    done = 0

    @function_tool
    def work(step: int) -> str:
        """Do one step of the work and return its log."""
        nonlocal done
        done += 1
        return tool_output(done, output_size(done))

    session_id = f"fw-agents-{workload}-{uuid.uuid4().hex[:8]}"
    session: Any
    tools: list[Any] = [work]
    if use_autoctx:
        session = AutoContextSession(
            session_id,
            database_url,
            AutoContextConfig(max_tokens=window),
            summarizer=OfflineSummarizer(),
        )
        tools += context_tools(session)
        run_config = session.run_config()
    else:
        session = SQLiteSession(session_id)
        run_config = RunConfig()
    with OpenAIServer(default=agent_model) as srv:
        client = AsyncOpenAI(base_url=srv.base_url, api_key="bench", max_retries=0)
        agent = Agent(
            name="worker",
            instructions="Work. " + AutoContextMemory.system_prompt_snippet(),
            model=OpenAIChatCompletionsModel(model="bench-model", openai_client=client),
            tools=tools,
        )
        for k in range(runs):
            await Runner.run(
                agent, f"Task {k}", session=session, run_config=run_config, max_turns=1_000
            )
        await client.close()
    return {
        "largest_request": agent_model.largest_request(),
        "requests": len(agent_model.inputs),
        "over_window": agent_model.over(window),
        "summarizer_calls": summarizer_calls(session.memory()) if use_autoctx else 0,
        "tool_calls": done,
    }
