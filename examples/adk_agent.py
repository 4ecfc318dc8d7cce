"""A Google ADK agent whose every model call gets autoctx's working context.

    python examples/adk_agent.py --base-url http://127.0.0.1:PORT   # a Messages API endpoint
    python examples/adk_agent.py                                     # ANTHROPIC_API_KEY

ADK's `Runner` keeps the session in `AutoContextSessionService` (events, state) and
`AutoContextPlugin` replaces every model request's contents with the session's working
context, so the run's requests stay under `--max-tokens` however many steps it takes. The model
is ADK's own `AnthropicLlm` (the official `anthropic` client); the repository's tests serve
such an endpoint (tests/anthropic_server.py, whose scripted agent calls `run_step` many times,
then answers). Running again with the same `--session` continues the session.
"""

from __future__ import annotations

import argparse
import asyncio
import uuid

from anthropic import AsyncAnthropic
from google.adk.agents.llm_agent import LlmAgent
from google.adk.apps import App
from google.adk.models.anthropic_llm import AnthropicLlm
from google.adk.runners import Runner
from google.genai import types

from autoctx import AutoContextConfig, AutoContextMemory
from autoctx.integrations.adk import AutoContextPlugin, AutoContextSessionService, context_tools


def run_step(step: int) -> str:
    """Run one step of the task and return its log."""
    head = f"FACT-{step:04d}: step {step} finished with exit code 0.\n"
    return head + f"step {step} log line with details about files\n" * 120


async def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--base-url", default=None)
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--session", default=f"adk-{uuid.uuid4().hex[:8]}")
    parser.add_argument("--model", default="claude-sonnet-4-5")
    parser.add_argument("--max-tokens", type=int, default=16_000)
    parser.add_argument("--task", default="Run the steps of the task with run_step.")
    args = parser.parse_args()

    sessions = AutoContextSessionService(
        args.database_url, config=AutoContextConfig(max_tokens=args.max_tokens)
    )
    client = AsyncAnthropic(base_url=args.base_url, api_key="local" if args.base_url else None)
    agent = LlmAgent(
        name="coder",
        model=AnthropicLlm(model=args.model, client=client),
        instruction="Run the task's steps. " + AutoContextMemory.system_prompt_snippet(),
        tools=[run_step, *context_tools(sessions)],
    )
    app = App(name="coder", root_agent=agent, plugins=[AutoContextPlugin(sessions)])
    runner = Runner(app=app, session_service=sessions)
    if await sessions.get_session(app_name="coder", user_id="me", session_id=args.session) is None:
        await sessions.create_session(app_name="coder", user_id="me", session_id=args.session)
    message = types.Content(role="user", parts=[types.Part(text=args.task)])
    async for event in runner.run_async(user_id="me", session_id=args.session, new_message=message):
        if event.is_final_response() and event.content and event.content.parts:
            print("".join(p.text or "" for p in event.content.parts))
    memory = await sessions.memory("coder", "me", args.session)
    print(f"session {args.session}: {await memory.token_count()} working tokens")
    await sessions.close()


if __name__ == "__main__":
    asyncio.run(main())
