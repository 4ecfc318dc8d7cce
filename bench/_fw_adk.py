"""bench/frameworks.py's Google ADK module: ADK's `Runner` with its own `AnthropicLlm` (the
official `anthropic` client) against the local Messages API server and its scripted agent, with
`AutoContextSessionService` and `AutoContextPlugin`, and without them (ADK's
`InMemorySessionService`: every event of the session goes into every request)."""

from __future__ import annotations

import asyncio
import sys
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.*

from anthropic import AsyncAnthropic
from google.adk.agents.llm_agent import LlmAgent
from google.adk.apps import App
from google.adk.models.anthropic_llm import AnthropicLlm
from google.adk.runners import Runner
from google.adk.sessions.in_memory_session_service import InMemorySessionService
from google.genai import types

from autoctx import AutoContextConfig, OfflineSummarizer
from autoctx._strategies.registry import LLM_STRATEGIES
from autoctx.integrations.adk import AutoContextPlugin, AutoContextSessionService, context_tools
from tests.agent_model import tool_output
from tests.anthropic_server import AnthropicAgent, AnthropicServer

NAME = "Google ADK Runner (plugin)"


def _size(n: int) -> int:
    return 2_000 + (n * 7_331) % 18_001  # 2-20 KB, varying


def run(workload: str, *, use_autoctx: bool, database_url: str, window: int) -> dict[str, int]:
    runs, calls_per_run = (1, 48) if workload == "long" else (25, 3)
    scripted = AnthropicAgent(calls_per_run=calls_per_run)
    calls: list[int] = []

    def run_step(step: int) -> str:
        """Do one step of the work and return its log."""
        calls.append(step)
        return tool_output(len(calls), _size(len(calls)))

    async def main(srv: AnthropicServer) -> int:
        service: Any
        if use_autoctx:
            service = AutoContextSessionService(
                database_url,
                config=AutoContextConfig(max_tokens=window),
                summarizer=OfflineSummarizer(),
                namespace=f"bench-{uuid.uuid4().hex[:8]}-",
            )
            tools: list[Any] = [run_step, *context_tools(service)]
            plugins = [AutoContextPlugin(service)]
        else:
            service, tools, plugins = InMemorySessionService(), [run_step], []
        model = AnthropicLlm(
            model="claude-sonnet-4-5", client=AsyncAnthropic(base_url=srv.base_url, api_key="b")
        )
        agent = LlmAgent(name="bench", model=model, instruction="Run the steps.", tools=tools)
        runner = Runner(
            app=App(name="bench", root_agent=agent, plugins=plugins), session_service=service
        )
        await service.create_session(app_name="bench", user_id="u", session_id="s")
        for k in range(runs):
            message = types.Content(role="user", parts=[types.Part(text=f"Run {k}.")])
            async for _ in runner.run_async(user_id="u", session_id="s", new_message=message):
                pass
        if not use_autoctx:
            return 0
        memory = await service.memory("bench", "u", "s")
        events = await memory.events()
        await service.close()
        return sum(1 for e in events if e.strategy in LLM_STRATEGIES and e.status == "applied")

    with AnthropicServer(scripted) as srv:
        summarizer_calls = asyncio.run(main(srv))
    return {
        "largest_request": scripted.largest_request(),
        "requests": len(scripted.inputs),
        "over_window": scripted.over(window),
        "summarizer_calls": summarizer_calls,
        "tool_calls": len(calls),
    }
