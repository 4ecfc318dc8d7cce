"""A LangChain v1 `create_agent` agent whose every model call stays under max_tokens, with
autoctx's middleware.

    python examples/langchain_agent.py --base-url http://127.0.0.1:8000/v1 --model gpt-4.1-mini

Any OpenAI-compatible Chat Completions endpoint serves (`--base-url`; the key comes from
OPENAI_API_KEY, "unused" when unset); the session lives in AUTOCTX_DATABASE_URL, else the
embedded PostgreSQL. Two runs on one thread: the second continues from the first, and the
checkpointed state stays the (bounded) working context.
"""

from __future__ import annotations

import argparse
import os
import uuid

from langchain.agents import create_agent
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver

from autoctx import AutoContextConfig, AutoContextMemory
from autoctx.integrations.langchain import AutoContextMiddleware


@tool
def read_log(name: str) -> str:
    """Read a build log by name."""
    return f"log {name}\n" + f"{name}: step ok, 3 warnings, exit 0\n" * 400


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", required=True, help="an OpenAI-compatible endpoint")
    parser.add_argument("--model", default="gpt-4.1-mini")
    parser.add_argument("--max-tokens", type=int, default=16_000)
    parser.add_argument("--thread", default=f"example-lc-{uuid.uuid4().hex[:8]}")
    args = parser.parse_args()

    model = ChatOpenAI(
        model=args.model,
        base_url=args.base_url,
        api_key=os.environ.get("OPENAI_API_KEY", "unused"),
    )
    middleware = AutoContextMiddleware(config=AutoContextConfig(max_tokens=args.max_tokens))
    agent = create_agent(
        model,
        tools=[read_log],
        system_prompt="Read the logs you are asked about. "
        + AutoContextMemory.system_prompt_snippet(),
        middleware=[middleware],
        checkpointer=InMemorySaver(),
    )
    config = {"configurable": {"thread_id": args.thread}}
    for prompt in (
        "Read the logs build-1 to build-12 one by one and say which had warnings.",
        "Which log did you read first?",
    ):
        result = agent.invoke({"messages": [{"role": "user", "content": prompt}]}, config)
        print(result["messages"][-1].content)
    mem = middleware.memory(config)
    print(
        f"thread {args.thread}: {mem.token_count()} tokens in the working context, "
        f"{len(mem.events())} compression events"
    )
    middleware.close()


if __name__ == "__main__":
    main()
