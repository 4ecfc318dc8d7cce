"""An AgentScope 2.x agent whose every model call gets autoctx's working context.

    python examples/agentscope_agent.py [BASE_URL] [DATABASE_URL]

BASE_URL is an OpenAI Chat Completions endpoint (default: OpenAI's, with OPENAI_API_KEY); the
test suite runs this file against its local scripted server. DATABASE_URL defaults to
AUTOCTX_DATABASE_URL, else the embedded PostgreSQL.
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid

from agentscope.agent import Agent
from agentscope.credential import OpenAICredential
from agentscope.message import UserMsg
from agentscope.model import OpenAIChatModel
from agentscope.permission import PermissionBehavior, PermissionDecision
from agentscope.tool import FunctionTool, Toolkit

from autoctx import AutoContextConfig, AutoContextMemory
from autoctx.integrations.agentscope import AutoContextMiddleware


def run_tests(step: int) -> str:
    """Run the test suite once and return its log.

    Args:
        step: which attempt this is
    """
    return f"attempt {step}: 1 failed (test_parse) " + "log line\n" * 2000


async def main(base_url: str | None, database_url: str | None) -> None:
    session_id = f"agentscope-demo-{uuid.uuid4().hex[:8]}"
    middleware = await AutoContextMiddleware.open(
        session_id, database_url, AutoContextConfig(max_tokens=16_000)
    )
    allow = PermissionDecision(behavior=PermissionBehavior.ALLOW, message="read-only")
    agent = Agent(
        name="coder",
        system_prompt="You fix bugs. " + AutoContextMemory.system_prompt_snippet(),
        model=OpenAIChatModel(
            credential=OpenAICredential(
                api_key=os.environ.get("OPENAI_API_KEY", "unused"), base_url=base_url
            ),
            model="gpt-4.1",
            stream=False,
        ),
        # The context tools: the middleware also adds them at the first reply if missing.
        toolkit=Toolkit(
            tools=[FunctionTool(run_tests, permission=allow), *await middleware.list_tools()]
        ),
        middlewares=[middleware],
    )
    reply = await agent.reply(UserMsg(name="user", content="Fix the failing test."))
    print(reply.get_text_content())
    print(f"session {session_id}: {await middleware.memory.token_count()} tokens in context")
    await middleware.close()


if __name__ == "__main__":
    args = sys.argv[1:]
    asyncio.run(main(args[0] if args else None, args[1] if len(args) > 1 else None))
