"""bench/frameworks.py's Pydantic AI module: `Agent.run` with its OpenAI chat model against the
local Chat Completions server and the scripted agent, with and without `AutoContextCapability`."""

from __future__ import annotations

import asyncio
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.agent_model

from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from autoctx import AutoContextConfig, OfflineSummarizer
from autoctx._strategies.registry import LLM_STRATEGIES
from autoctx.integrations.pydantic_ai import AutoContextCapability
from tests.agent_model import ScriptedAgent, tool_output
from tests.openai_server import OpenAIServer

NAME = "Pydantic AI Agent (capability)"


def _size(n: int) -> int:
    return 2_000 + (n * 7_331) % 18_001  # 2-20 KB, varying


def run(workload: str, *, use_autoctx: bool, database_url: str, window: int) -> dict[str, int]:
    runs, calls_per_run = (1, 48) if workload == "long" else (25, 3)
    scripted = ScriptedAgent(calls_per_run=calls_per_run)
    calls: list[int] = []
    summarizer_calls = 0
    with OpenAIServer(default=scripted) as srv:
        model = OpenAIChatModel(
            "test-model", provider=OpenAIProvider(base_url=srv.base_url, api_key="bench")
        )
        capability = AutoContextCapability(
            f"bench-pydantic-ai-{workload}-{uuid.uuid4().hex[:8]}",
            database_url,
            AutoContextConfig(max_tokens=window),
            summarizer=OfflineSummarizer(),
        )
        agent = Agent(
            model,
            instructions="Run the steps with run_step.",
            capabilities=[capability] if use_autoctx else [],
        )

        @agent.tool_plain
        def run_step(step: int) -> str:
            calls.append(step)
            return tool_output(step, _size(len(calls)))

        async def main() -> int:
            history = None
            for k in range(runs):
                if use_autoctx:
                    await agent.run(f"Run {k}: do the steps.")
                else:  # the plain framework: the caller carries the history across runs
                    result = await agent.run(f"Run {k}: do the steps.", message_history=history)
                    history = result.all_messages()
            if not use_autoctx:
                return 0
            memory = await capability.open()
            events = await memory.events()
            await capability.aclose()
            return sum(1 for e in events if e.strategy in LLM_STRATEGIES and e.status == "applied")

        summarizer_calls = asyncio.run(main())
    return {
        "largest_request": scripted.largest_request(),
        "requests": len(scripted.inputs),
        "over_window": scripted.over(window),
        "summarizer_calls": summarizer_calls,
        "tool_calls": len(calls),
    }
