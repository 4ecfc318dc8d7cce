"""An Agents SDK agent whose every model call stays under max_tokens, with autoctx.

    python examples/openai_agents_agent.py --base-url http://127.0.0.1:8000/v1 --model gpt-4.1-mini

Any OpenAI-compatible Chat Completions endpoint serves (`--base-url`; the key comes from
OPENAI_API_KEY, "unused" when unset); the session lives in AUTOCTX_DATABASE_URL, else the
embedded PostgreSQL. The agent reads a few large "log files" through a tool: the session stores
every output, compresses inside the run, and the model can reload or search what it offloaded.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import uuid

from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI

from autoctx import AutoContextConfig, AutoContextMemory
from autoctx.integrations.openai_agents import AutoContextSession, context_tools


@function_tool
def read_log(name: str) -> str:
    """Read a build log by name."""
    return f"log {name}\n" + f"{name}: step ok, 3 warnings, exit 0\n" * 400


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", required=True, help="an OpenAI-compatible endpoint")
    parser.add_argument("--model", default="gpt-4.1-mini")
    parser.add_argument("--max-tokens", type=int, default=16_000)
    parser.add_argument("--session", default=f"example-sdk-{uuid.uuid4().hex[:8]}")
    args = parser.parse_args()

    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=args.base_url, api_key=os.environ.get("OPENAI_API_KEY", "unused"))
    session = AutoContextSession(args.session, config=AutoContextConfig(max_tokens=args.max_tokens))
    agent = Agent(
        name="builder",
        instructions="Read the logs you are asked about. "
        + AutoContextMemory.system_prompt_snippet(),
        model=OpenAIChatCompletionsModel(model=args.model, openai_client=client),
        tools=[read_log, *context_tools(session)],
    )
    prompt = "Read the logs build-1 to build-12 one by one and say which had warnings."
    # Without run_config=session.run_config(), the SDK would send every log of this run at
    # every model call, whatever the session compressed.
    result = await Runner.run(
        agent, prompt, session=session, run_config=session.run_config(), max_turns=50
    )
    print(result.final_output)
    mem = session.memory()
    print(
        f"session {args.session}: {mem.token_count()} tokens in the working context, "
        f"{len(mem.events())} compression events"
    )
    await client.close()


if __name__ == "__main__":
    asyncio.run(main())
