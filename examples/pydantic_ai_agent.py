"""A Pydantic AI agent whose every model request gets autoctx's working context.

    python examples/pydantic_ai_agent.py --base-url http://127.0.0.1:PORT/v1  # Chat Completions
    python examples/pydantic_ai_agent.py                                    # OPENAI_API_KEY

The repository's tests serve such an endpoint (tests/openai_server.py with the scripted
tool-calling agent of tests/agent_model.py, which calls `run_step` many times, then answers).
The run's model requests stay under `--max-tokens` however many steps it takes; the context
tools are offered and answered; every message is stored in PostgreSQL (`--database-url`, else
AUTOCTX_DATABASE_URL, else the embedded one), and running again with the same `--session`
continues the session.
"""

from __future__ import annotations

import argparse
import asyncio
import uuid

from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from autoctx import AutoContextConfig, AutoContextMemory
from autoctx.integrations.pydantic_ai import AutoContextCapability


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--base-url", default=None)
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--session", default=f"pydantic-ai-{uuid.uuid4().hex[:8]}")
    parser.add_argument("--model", default="gpt-4o")
    parser.add_argument("--max-tokens", type=int, default=16_000)
    parser.add_argument("--task", default="Run the steps of the task with run_step.")
    args = parser.parse_args()

    provider = OpenAIProvider(base_url=args.base_url, api_key="local" if args.base_url else None)
    memory = AutoContextCapability(
        args.session, args.database_url, AutoContextConfig(max_tokens=args.max_tokens)
    )
    agent = Agent(
        OpenAIChatModel(args.model, provider=provider),
        instructions="You run tasks step by step. " + AutoContextMemory.system_prompt_snippet(),
        capabilities=[memory],
    )

    @agent.tool_plain
    def run_step(step: int) -> str:
        """Run one step of the task and return its log."""
        return f"FACT-{step:04d}: step {step} passed.\n" + "log line\n" * 1_500

    async def run() -> None:
        result = await agent.run(args.task)
        mem = await memory.open()
        print(
            f"session {args.session}: {len(result.all_messages())} messages in the run, "
            f"{await mem.token_count()} tokens in context, {len(await mem.events())} "
            "compression events"
        )
        print(result.output)
        await memory.aclose()

    asyncio.run(run())


if __name__ == "__main__":
    main()
