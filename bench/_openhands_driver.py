"""The OpenHands SDK side of agent_cost.py, run by a Python 3.12+ interpreter that has
``openhands-sdk`` (which pins ``openai<3``, while autoctx needs ``openai>=3``: the two cannot
share an environment, so agent_cost.py runs this file as a child process).

    python _openhands_driver.py WORKLOAD.json OUT.json BASE_URL WINDOW

It imports nothing of autoctx. It replays the workload's events into an event list the way a
`LocalConversation` records them (a `SystemPromptEvent`, user `MessageEvent`s, one
`ActionEvent` per tool call, sharing the response id of its model call, an `ObservationEvent`
per result, the final answer as an agent `MessageEvent`), and before each model call does what
`Agent.step` does: `prepare_llm_messages(view, condenser, llm)`; a `Condensation` is appended
to the events and the next step (no new event in between, as the agent loop's next iteration)
builds the view again. The condenser is `default_condenser(llm)` (max_size 80, keep_first 4)
with ``max_tokens`` 0.75 of the window; its LLM, and the agent's (used for token counting
only, with ``max_input_tokens`` the window), go through litellm to the bench's summary server.

Written to OUT.json: for each model call, the keys of the messages it was given (an int: the
index of a workload message; a string: a condensation summary, whose text is in "summaries"),
the condensations, and the time spent.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

# OpenHands refuses windows under its minimum (16,000 is one of the bench's); the model cost
# map would otherwise be fetched from the network at import.
os.environ.setdefault("ALLOW_SHORT_CONTEXT_WINDOWS", "true")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("OPENHANDS_SUPPRESS_BANNER", "1")
# One INFO line per over-limit check would flood the parent's captured stderr.
os.environ.setdefault("LOG_LEVEL", "WARNING")


def main(argv: list[str]) -> None:
    workload_path, out_path, base_url, window_text = argv
    window = int(window_text)
    started = time.perf_counter()
    from openhands.sdk import LLM
    from openhands.sdk.agent.utils import prepare_llm_messages
    from openhands.sdk.context.condenser.llm_summarizing_condenser import default_condenser
    from openhands.sdk.context.view import View
    from openhands.sdk.event import (
        ActionEvent,
        Condensation,
        MessageEvent,
        ObservationEvent,
        SystemPromptEvent,
    )
    from openhands.sdk.llm import Message, MessageToolCall, TextContent
    from openhands.sdk.tool.schema import Observation
    from pydantic import SecretStr

    class BenchObservation(Observation):  # type: ignore[misc]  # (mypy runs without the SDK)
        """A tool's text output (the SDK's base observation renders `content` as it is)."""

    imported = time.perf_counter() - started
    with open(workload_path) as src:
        workload = json.load(src)
    messages: list[dict[str, Any]] = workload["messages"]
    points: set[int] = set(workload["model_calls"])

    def llm(name: str, **extra: Any) -> LLM:
        return LLM(
            model=f"openai/{name}",
            base_url=base_url,
            api_key=SecretStr("bench"),
            usage_id=name,
            num_retries=0,
            **extra,
        )

    agent_llm = llm("openhands-agent", max_input_tokens=window)
    condenser = default_condenser(llm("openhands")).model_copy(
        update={"max_tokens": int(window * 0.75)}
    )

    events: list[Any] = []
    index_of: dict[str, int] = {}
    summaries: dict[str, str] = {}
    steps: list[list[int | str]] = []
    condensations = 0
    # Observations answer the action of their call id.
    action_ids: dict[str, str] = {}
    tool_names: dict[str, str] = {}

    def record(view: Any) -> None:
        keys: list[int | str] = []
        for event in view.events:
            key: int | str
            if event.id in index_of:
                key = index_of[event.id]
            else:
                text = getattr(event, "summary", None) or str(event)
                key = f"s:{event.id}"
                summaries[key] = text
            if not keys or keys[-1] != key:  # parallel actions are one assistant message
                keys.append(key)
        steps.append(keys)

    def model_call() -> None:
        nonlocal condensations
        for _ in range(10):
            view = View.from_events(events)
            result = prepare_llm_messages(view, condenser=condenser, llm=agent_llm)
            if isinstance(result, Condensation):
                events.append(result)
                condensations += 1
                continue
            record(view)
            return
        raise SystemExit("openhands: ten condensations in a row before one model call")

    for i, msg in enumerate(messages):
        if i in points:
            model_call()
        role = msg["role"]
        event: Any
        if role == "system":
            event = SystemPromptEvent(system_prompt=TextContent(text=msg["content"]), tools=[])
            index_of[event.id] = i
            events.append(event)
        elif role == "user":
            event = MessageEvent(
                source="user",
                llm_message=Message(role="user", content=[TextContent(text=msg["content"])]),
            )
            index_of[event.id] = i
            events.append(event)
        elif role == "assistant" and msg.get("tool_calls"):
            thought = [TextContent(text=msg["content"])] if msg.get("content") else []
            for n, call in enumerate(msg["tool_calls"]):
                fn = call["function"]
                event = ActionEvent(
                    # The SDK puts the model's text on the first action of a response only.
                    thought=thought if n == 0 else [],
                    action=None,
                    tool_name=fn["name"],
                    tool_call_id=call["id"],
                    tool_call=MessageToolCall(
                        id=call["id"],
                        name=fn["name"],
                        arguments=fn["arguments"],
                        origin="completion",
                    ),
                    llm_response_id=f"response-{i}",
                )
                index_of[event.id] = i
                action_ids[call["id"]] = event.id
                tool_names[call["id"]] = fn["name"]
                events.append(event)
        elif role == "assistant":
            event = MessageEvent(
                source="agent",
                llm_message=Message(
                    role="assistant", content=[TextContent(text=msg.get("content") or "")]
                ),
            )
            index_of[event.id] = i
            events.append(event)
        elif role == "tool":
            event = ObservationEvent(
                tool_name=tool_names[msg["tool_call_id"]],
                tool_call_id=msg["tool_call_id"],
                observation=BenchObservation.from_text(msg["content"]),
                action_id=action_ids[msg["tool_call_id"]],
            )
            index_of[event.id] = i
            events.append(event)
    if len(messages) in points:
        model_call()

    with open(out_path, "w") as out:
        json.dump(
            {
                "steps": steps,
                "summaries": summaries,
                "condensations": condensations,
                "seconds": time.perf_counter() - started,
                "import_seconds": imported,
                "python": sys.version.split()[0],
            },
            out,
        )


if __name__ == "__main__":
    main(sys.argv[1:])
