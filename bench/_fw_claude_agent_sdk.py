"""bench/frameworks.py's Claude Agent SDK module. The SDK's runtime (the `claude` CLI) builds
its own requests and is not run here: the store is what autoctx gives the SDK. So the row
replays the workload's transcript (entries as the CLI writes them: the prompt, each tool call
and its 2-20 KB result, the answer) into `AutoContextSessionStore`, batch by batch, and counts
before each model turn what a request built from it would hold (the Messages API format,
counted as tests/anthropic_server.py counts requests): the store's working context, compressed
when its trigger holds, with autoctx; the whole transcript without."""

from __future__ import annotations

import asyncio
import sys
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.*

from autoctx import AutoContextConfig, OfflineSummarizer
from autoctx._strategies.registry import LLM_STRATEGIES
from autoctx.integrations.claude_agent_sdk import AutoContextSessionStore
from tests.agent_model import tool_output
from tests.anthropic_server import messages_tokens

NAME = "Claude Agent SDK (SessionStore; requests as built from it, CLI not run)"


def _size(n: int) -> int:
    return 2_000 + (n * 7_331) % 18_001  # 2-20 KB, varying


def _entry(kind: str, content: Any, parent: str | None) -> dict[str, Any]:
    uid = uuid.uuid4().hex
    return {
        "type": kind,
        "uuid": uid,
        "parentUuid": parent,
        "message": {"role": kind, "content": content},
    }


def run(workload: str, *, use_autoctx: bool, database_url: str, window: int) -> dict[str, int]:
    runs, calls_per_run = (1, 48) if workload == "long" else (25, 3)

    async def main() -> tuple[list[int], int, int]:
        store = AutoContextSessionStore(
            database_url,
            config=AutoContextConfig(max_tokens=window),
            summarizer=OfflineSummarizer(),
            namespace=f"bench-{uuid.uuid4().hex[:8]}-",
        )
        key: Any = {"project_key": "bench", "session_id": str(uuid.uuid4())}
        transcript: list[dict[str, Any]] = []
        inputs: list[int] = []
        calls = 0
        parent: str | None = None

        async def turn(entries: list[dict[str, Any]]) -> None:
            nonlocal parent
            transcript.extend(entries)
            parent = entries[-1]["uuid"]
            await store.append(key, entries)
            if use_autoctx:
                memory = await store.memory(key)
                await memory.compress_if_needed()
                system, messages = await memory.to_anthropic()
                inputs.append(messages_tokens({"system": system, "messages": messages}))
            else:
                text = [{"role": "user", "content": str(e["message"])} for e in transcript]
                inputs.append(messages_tokens({"messages": text}))

        for k in range(runs):
            await turn([_entry("user", f"Run {k}: do the steps.", parent)])
            for _ in range(calls_per_run):
                calls += 1
                call = {
                    "type": "tool_use",
                    "id": f"toolu_{calls}",
                    "name": "run_step",
                    "input": {"step": calls},
                }
                result = {
                    "type": "tool_result",
                    "tool_use_id": f"toolu_{calls}",
                    "content": tool_output(calls, _size(calls)),
                }
                assistant = _entry("assistant", [call], parent)
                await turn([assistant, _entry("user", [result], assistant["uuid"])])
            transcript.append(_entry("assistant", "All steps are done.", parent))
            await store.append(key, transcript[-1:])
        summarizer_calls = 0
        if use_autoctx:
            memory = await store.memory(key)
            summarizer_calls = sum(
                1
                for e in await memory.events()
                if e.strategy in LLM_STRATEGIES and e.status == "applied"
            )
        await store.delete(key)
        await store.close()
        return inputs, summarizer_calls, calls

    inputs, summarizer_calls, calls = asyncio.run(main())
    return {
        "largest_request": max(inputs),
        "requests": len(inputs),
        "over_window": sum(1 for t in inputs if t >= window),
        "summarizer_calls": summarizer_calls,
        "tool_calls": calls,
    }
