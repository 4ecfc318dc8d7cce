"""bench/frameworks.py's LangChain v1 workload: `create_agent(...).invoke` with `ChatOpenAI`
against the local server and the scripted agent, a thread checkpointed by `InMemorySaver`; with
autoctx, `AutoContextMiddleware`, without, no middleware.
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from langchain.agents import create_agent
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver

from autoctx import AutoContextConfig, AutoContextMemory, OfflineSummarizer
from autoctx.integrations.langchain import AutoContextMiddleware
from tests.agent_model import ScriptedAgent, tool_output
from tests.openai_server import OpenAIServer

NAME = "LangChain v1 create_agent"

WORKLOADS = {"long": (1, 48), "short": (25, 3)}


def output_size(n: int) -> int:
    """2-20 KB, varying from call to call."""
    return 2_000 + (n * 7_919) % 18_001


def run(workload: str, *, use_autoctx: bool, database_url: str, window: int) -> dict[str, int]:
    runs, calls = WORKLOADS[workload]
    agent_model = ScriptedAgent(calls_per_run=calls)
    done = 0

    @tool
    def work(step: int) -> str:
        """Do one step of the work and return its log."""
        nonlocal done
        done += 1
        return tool_output(done, output_size(done))

    thread = f"fw-langchain-{workload}-{uuid.uuid4().hex[:8]}"
    middleware: list[Any] = []
    if use_autoctx:
        middleware.append(
            AutoContextMiddleware(
                database_url, AutoContextConfig(max_tokens=window), summarizer=OfflineSummarizer()
            )
        )
    config: Any = {"configurable": {"thread_id": thread}, "recursion_limit": 1_000}
    with OpenAIServer(default=agent_model) as srv:
        model = ChatOpenAI(
            model="bench-model", base_url=srv.base_url, api_key="bench", max_retries=0
        )
        agent = create_agent(
            model,
            tools=[work],
            system_prompt="Work. " + AutoContextMemory.system_prompt_snippet(),
            middleware=middleware,
            checkpointer=InMemorySaver(),
        )
        for k in range(runs):
            agent.invoke({"messages": [{"role": "user", "content": f"Task {k}"}]}, config)
    summaries = 0
    if use_autoctx:
        mem = middleware[0].memory(config)
        summaries = sum(1 for e in mem.events() if e.model is not None)
        middleware[0].close()
    return {
        "largest_request": agent_model.largest_request(),
        "requests": len(agent_model.inputs),
        "over_window": agent_model.over(window),
        "summarizer_calls": summaries,
        "tool_calls": done,
    }
