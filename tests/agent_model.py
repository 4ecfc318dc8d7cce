"""A scripted tool-calling agent behind the local OpenAI Chat Completions server.

Framework tests and `bench/frameworks.py` run a framework's own agent loop against
`tests.openai_server.OpenAIServer` with a `ScriptedAgent` as the server's default reply. The
agent plays a model that calls a work tool a fixed number of times per run, then answers; it
counts the input of **every** request it receives with tiktoken, so a test can assert that no
request the framework sent was over the window.

    agent = ScriptedAgent(calls_per_run=40)
    with OpenAIServer(default=agent) as srv:
        ...  # run the framework against srv.base_url
    assert agent.largest_request() < 16_000

A run begins at a request whose last message is a user message; every later request of the run
(the last message is a tool result) gets the next call until the run has made
`calls_per_run` calls, then a final answer. The state lives here, not in the request, so that a
request whose history autoctx compressed (tool results summarized away) does not restart the
count.

The agent can also be told to call a context tool (`context_search` or `context_reload`) at a
given step, to check that the framework offers and answers them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from autoctx._tokens import get_encoding

from .openai_server import Reply

__all__ = ["ScriptedAgent", "request_tokens", "tool_output"]

_ENCODING = get_encoding("o200k_base")
CONTEXT_TOOLS = frozenset({"context_reload", "context_search"})


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        return " ".join(_text(v) for v in value.values())
    if isinstance(value, Sequence):
        return " ".join(_text(v) for v in value)
    return str(value)


def request_tokens(body: Mapping[str, Any]) -> int:
    """The tokens of a chat-completion request's messages (every text, tool input and output),
    as tiktoken's o200k_base counts them, plus four per message for the framing. The tool
    definitions are not counted: they are the same in every request and small."""
    total = 0
    for message in body.get("messages") or []:
        if not isinstance(message, Mapping):
            continue
        total += 4 + len(_ENCODING.encode_ordinary(_text(message.get("content"))))
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            text = f"{function.get('name', '')} {function.get('arguments', '')}"
            total += len(_ENCODING.encode_ordinary(text))
    return total


def tool_output(step: int, size: int) -> str:
    """A deterministic tool output of about `size` characters that names its step in a fact the
    agent could need later (``FACT-<step>``), so a test can search or reload it."""
    head = f"FACT-{step:04d}: result of step {step} is value-{step * 7919 % 100_003}.\n"
    line = f"step {step} log line with some detail about files and exit codes\n"
    return (head + line * (size // len(line) + 1))[:size]


@dataclass
class ScriptedAgent:
    """A reply source for `OpenAIServer` (pass it as ``default=``); see the module docstring."""

    calls_per_run: int = 40
    #: The work tool to call; None picks the first tool of the request that is not a context tool.
    tool_name: str | None = None
    #: The arguments of call `step` (0-based within the run).
    arguments: Callable[[int], Mapping[str, Any]] = lambda step: {"step": step}
    #: Calls to make instead of the work tool, by step within the run: (tool name, arguments).
    context_calls: Mapping[int, tuple[str, Mapping[str, Any]]] = field(default_factory=dict)
    final_answer: str = "All steps are done."
    #: Reason before each reply, as a reasoning model behind a Chat Completions endpoint does:
    #: the reply's `reasoning_content` (DeepSeek's and vLLM's field, which the Agents SDK,
    #: Pydantic AI and AgentScope read) of about this many characters, naming the step.
    reasoning_chars: int = 0
    #: Input tokens of every request received, in order (see `request_tokens`).
    inputs: list[int] = field(default_factory=list)
    #: Every request body received, in order.
    requests: list[dict[str, Any]] = field(default_factory=list)
    _step: int = 0
    _calls: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, body: dict[str, Any]) -> Reply:
        reply = self._reply(body)
        if not self.reasoning_chars:
            return reply
        then = (reply.message_extra.get("tool_calls") or [{"id": "answer"}])[0]["id"]
        line = f"Reasoning before {then}: the last output decides the next step. "
        text = (line * (self.reasoning_chars // len(line) + 1))[: self.reasoning_chars]
        return replace(reply, message_extra={**reply.message_extra, "reasoning_content": text})

    def _reply(self, body: dict[str, Any]) -> Reply:
        with self._lock:
            self.requests.append(body)
            self.inputs.append(request_tokens(body))
            messages = [m for m in body.get("messages") or [] if isinstance(m, Mapping)]
            if messages and messages[-1].get("role") == "user":
                self._step = 0
            step = self._step
            if step >= self.calls_per_run:
                return Reply.text(self.final_answer)
            self._step += 1
            self._calls += 1
            call_id = f"call_{self._calls}"
        if step in self.context_calls:
            name, args = self.context_calls[step]
            return Reply.tool_call(name, dict(args), call_id=call_id)
        return Reply.tool_call(self._work_tool(body), dict(self.arguments(step)), call_id=call_id)

    def _work_tool(self, body: Mapping[str, Any]) -> str:
        if self.tool_name is not None:
            return self.tool_name
        for tool in body.get("tools") or []:
            name = (tool.get("function") or {}).get("name")
            if isinstance(name, str) and name not in CONTEXT_TOOLS:
                return name
        raise AssertionError("the request offers no work tool")

    def largest_request(self) -> int:
        return max(self.inputs, default=0)

    def over(self, window: int) -> int:
        """How many requests were at or over `window` tokens."""
        return sum(1 for tokens in self.inputs if tokens >= window)

    def offered_tools(self, index: int = -1) -> list[str]:
        """The tool names offered in request `index`."""
        return [
            (tool.get("function") or {}).get("name", "")
            for tool in self.requests[index].get("tools") or []
        ]
