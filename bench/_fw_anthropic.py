"""bench/frameworks.py's Anthropic module: a plain `anthropic` client loop against the local
`/v1/messages` server (tests/anthropic_server.py, which checks the API's shape rules), sending
`mem.to_anthropic()` with autoctx, or the whole history without."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.anthropic_server

import anthropic

from autoctx import AutoContextConfig, AutoContextMemory, Msg, OfflineSummarizer
from autoctx._strategies.registry import LLM_STRATEGIES
from tests.agent_model import tool_output
from tests.anthropic_server import AnthropicAgent, AnthropicServer

NAME = "Anthropic Messages API loop (to_anthropic)"
SYSTEM = "Run the steps with run_step."
RUN_STEP = {
    "name": "run_step",
    "description": "Run one step of the task.",
    "input_schema": {"type": "object", "properties": {"step": {"type": "integer"}}},
}


def _size(n: int) -> int:
    return 2_000 + (n * 7_331) % 18_001  # 2-20 KB, varying


def run(workload: str, *, use_autoctx: bool, database_url: str, window: int) -> dict[str, int]:
    runs, calls_per_run = (1, 48) if workload == "long" else (25, 3)
    scripted = AnthropicAgent(calls_per_run=calls_per_run)
    calls = 0
    mem = (
        AutoContextMemory.open(
            f"bench-anthropic-{workload}-{uuid.uuid4().hex[:8]}",
            database_url,
            AutoContextConfig(max_tokens=window),
            summarizer=OfflineSummarizer(),
        )
        if use_autoctx
        else None
    )
    if mem is not None:
        mem.add(Msg.system(SYSTEM))
    history: list[dict[str, Any]] = []
    with AnthropicServer(scripted) as srv:
        client = anthropic.Anthropic(base_url=srv.base_url, api_key="bench", max_retries=0)

        def add(message: Any) -> None:
            if mem is not None:
                mem.add(message)
            else:
                history.append(message if isinstance(message, dict) else message.model_dump())

        for k in range(runs):
            add({"role": "user", "content": f"Run {k}: do the steps."})
            while True:
                if mem is not None:
                    mem.compress_if_needed()
                    system, messages = mem.to_anthropic()
                    tools = [RUN_STEP, *mem.tools(format="anthropic")]
                else:
                    system, messages, tools = SYSTEM, history, [RUN_STEP]
                response = client.messages.create(
                    model="claude-test",
                    max_tokens=1024,
                    system=system,
                    messages=messages,  # type: ignore[arg-type]
                    tools=tools,  # type: ignore[arg-type]
                )
                add(
                    {
                        "role": "assistant",
                        "content": [b.model_dump(exclude_none=True) for b in response.content],
                    }
                )
                uses = [b for b in response.content if b.type == "tool_use"]
                if not uses:
                    break
                results = []
                for use in uses:
                    calls += 1
                    out = tool_output(int(use.input.get("step", calls)), _size(calls))
                    results.append({"type": "tool_result", "tool_use_id": use.id, "content": out})
                add({"role": "user", "content": results})
    summarizer_calls = 0
    if mem is not None:
        summarizer_calls = sum(
            1 for e in mem.events() if e.strategy in LLM_STRATEGIES and e.status == "applied"
        )
        mem.close()
    if srv.rejected:
        raise AssertionError(
            f"the endpoint refused {len(srv.rejected)} requests: {srv.rejected[0][1]}"
        )
    return {
        "largest_request": scripted.largest_request(),
        "requests": len(scripted.inputs),
        "over_window": scripted.over(window),
        "summarizer_calls": summarizer_calls,
        "tool_calls": calls,
    }
