"""A real local HTTP server that speaks the Anthropic Messages API (`POST /v1/messages`).

It binds 127.0.0.1 on a free port in a background thread; the official ``anthropic`` client
talks to it over real sockets. Every request is checked against the Messages API's shape rules,
strictly (a request that breaks one gets the API's 400 ``invalid_request_error`` and is kept in
``rejected``):

- ``model``, ``max_tokens`` and a non-empty ``messages`` list; ``system`` a string or text blocks;
- the first message is a user turn and roles alternate user/assistant;
- content is a non-empty string or a non-empty list of known blocks; text blocks are non-empty;
- ``tool_use`` only in assistant turns, ``tool_result`` only in user turns, first in the turn;
- every ``tool_use`` of an assistant turn is answered by a ``tool_result`` in the user turn right
  after it (except in the last turn), and every ``tool_result`` answers a call of the assistant
  turn right before it.

The reply comes from `AnthropicAgent`, a scripted tool-calling model like
`tests.agent_model.ScriptedAgent`: it calls the work tool `calls_per_run` times per run (a run
begins at a user turn with no tool results), then answers, and counts the input tokens of every
request (o200k_base, as `tests.agent_model.request_tokens` counts chat requests).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from autoctx._tokens import get_encoding

__all__ = ["AnthropicAgent", "AnthropicServer", "messages_tokens", "shape_errors"]

_ENCODING = get_encoding("o200k_base")
CONTEXT_TOOLS = frozenset({"context_reload", "context_search"})
_USER_BLOCKS = frozenset({"text", "image", "document", "tool_result"})
_ASSISTANT_BLOCKS = frozenset({"text", "tool_use", "thinking", "redacted_thinking"})


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        return " ".join(_text(v) for k, v in value.items() if k not in ("type", "id"))
    if isinstance(value, Sequence):
        return " ".join(_text(v) for v in value)
    return "" if value is None else str(value)


def messages_tokens(body: Mapping[str, Any]) -> int:
    """Tokens of a request's system text and messages (every text, tool input and output), plus
    four per message; tool definitions are not counted (the same in every request)."""
    total = len(_ENCODING.encode_ordinary(_text(body.get("system"))))
    for message in body.get("messages") or []:
        if isinstance(message, Mapping):
            total += 4 + len(_ENCODING.encode_ordinary(_text(message.get("content"))))
    return total


def _blocks(content: Any) -> list[Mapping[str, Any]]:
    return [b for b in content if isinstance(b, Mapping)] if isinstance(content, list) else []


def shape_errors(body: Mapping[str, Any]) -> list[str]:
    """What the Messages API would refuse in a request body (empty when it is valid)."""
    errors: list[str] = []
    if not isinstance(body.get("model"), str):
        errors.append("model: field required")
    if not isinstance(body.get("max_tokens"), int):
        errors.append("max_tokens: field required")
    system = body.get("system")
    if (
        system is not None
        and not isinstance(system, str)
        and (not isinstance(system, list) or any(b.get("type") != "text" for b in _blocks(system)))
    ):
        errors.append("system: must be a string or a list of text blocks")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return [*errors, "messages: at least one message is required"]
    open_calls: set[str] = set()
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, Mapping) else None
        where = f"messages.{i}"
        if role not in ("user", "assistant"):
            errors.append(f"{where}.role: must be user or assistant")
            continue
        expected = "user" if i % 2 == 0 else "assistant"
        if role != expected:
            errors.append(
                f"{where}: roles must alternate between user and assistant, starting with user"
            )
        content = message.get("content")
        if isinstance(content, str):
            if not content:
                errors.append(f"{where}.content: must be non-empty")
            blocks: list[Mapping[str, Any]] = []
        elif isinstance(content, list) and content:
            blocks = _blocks(content)
            if len(blocks) != len(content):
                errors.append(f"{where}.content: every block must be an object")
        else:
            errors.append(f"{where}.content: a non-empty string or list of blocks")
            blocks = []
        allowed = _USER_BLOCKS if role == "user" else _ASSISTANT_BLOCKS
        answered: set[str] = set()
        seen_other = False
        calls: set[str] = set()
        for j, block in enumerate(blocks):
            kind = block.get("type")
            at = f"{where}.content.{j}"
            if kind not in allowed:
                errors.append(f"{at}: a {kind!r} block is not allowed in a {role} message")
                continue
            if kind == "text" and (not isinstance(block.get("text"), str) or not block["text"]):
                errors.append(f"{at}: text content blocks must be non-empty")
            if kind == "tool_result":
                if seen_other:
                    errors.append(f"{at}: tool_result blocks must come first in the user turn")
                call_id = block.get("tool_use_id")
                if call_id not in open_calls:
                    errors.append(
                        f"{at}: unexpected tool_use_id {call_id!r}: each tool_result block must "
                        "have a corresponding tool_use block in the previous message"
                    )
                answered.add(str(call_id))
            else:
                seen_other = True
            if kind == "tool_use":
                if not isinstance(block.get("input"), Mapping):
                    errors.append(f"{at}.input: must be an object")
                calls.add(str(block.get("id")))
        if role == "user":
            missing = open_calls - answered
            if missing:
                errors.append(
                    f"{where}: tool_use ids {sorted(missing)} were found without tool_result "
                    "blocks immediately after"
                )
            open_calls = set()
        else:
            open_calls = calls
    tools = body.get("tools") or []
    for k, tool in enumerate(tools if isinstance(tools, list) else []):
        if not isinstance(tool.get("name"), str) or not isinstance(
            tool.get("input_schema"), Mapping
        ):
            errors.append(f"tools.{k}: needs 'name' and an 'input_schema' object")
    return errors


@dataclass
class AnthropicAgent:
    """A scripted tool-calling model behind `AnthropicServer` (see the module docstring)."""

    calls_per_run: int = 40
    #: Calls to make instead of the work tool, by step within the run: (tool name, arguments or
    #: a function giving them when the call is made).
    context_calls: Mapping[int, tuple[str, Mapping[str, Any] | Callable[[], Mapping[str, Any]]]] = (
        field(default_factory=dict)
    )
    final_answer: str = "All steps are done."
    #: Start each reply with a thinking block (with a signature), as a model with extended
    #: thinking does; its text is about `thinking_chars` long and names the step.
    thinking: bool = False
    thinking_chars: int = 400
    inputs: list[int] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    _step: int = 0
    _calls: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        """The content blocks of the reply to a (valid) request."""
        with self._lock:
            self.requests.append(body)
            self.inputs.append(messages_tokens(body))
            last = body["messages"][-1]
            blocks = _blocks(last.get("content"))
            if last["role"] == "user" and not any(b.get("type") == "tool_result" for b in blocks):
                self._step = 0
            step = self._step
            if step >= self.calls_per_run:
                return [*self._thought(step, "answer"), {"type": "text", "text": self.final_answer}]
            self._step += 1
            self._calls += 1
            call_id = f"toolu_{self._calls:04d}"
        if step in self.context_calls:
            name, args = self.context_calls[step]
            arguments = dict(args() if callable(args) else args)
        else:
            name, arguments = self._work_tool(body), {"step": step}
        return [
            *self._thought(step, call_id),
            {"type": "text", "text": f"Step {step}."},
            {"type": "tool_use", "id": call_id, "name": name, "input": arguments},
        ]

    def _thought(self, step: int, then: str) -> list[dict[str, Any]]:
        if not self.thinking:
            return []
        line = f"Thinking before {then} at step {step}: weigh the last output. "
        text = (line * (self.thinking_chars // len(line) + 1))[: self.thinking_chars]
        return [{"type": "thinking", "thinking": text, "signature": f"sig-{then}-{step}=="}]

    def _work_tool(self, body: Mapping[str, Any]) -> str:
        for tool in body.get("tools") or []:
            if tool.get("name") not in CONTEXT_TOOLS:
                return str(tool["name"])
        raise AssertionError("the request offers no work tool")

    def largest_request(self) -> int:
        return max(self.inputs, default=0)

    def over(self, window: int) -> int:
        """How many requests were at or over `window` tokens."""
        return sum(1 for tokens in self.inputs if tokens >= window)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, owner: AnthropicServer) -> None:
        self.owner = owner
        super().__init__(("127.0.0.1", 0), _Handler)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if self.path.split("?", 1)[0].rstrip("/") != "/v1/messages":
            self._send(404, _error("not_found_error", f"no route POST {self.path}"))
            return
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            self._send(400, _error("invalid_request_error", "the body is not JSON"))
            return
        owner = self.server.owner
        errors = shape_errors(body)
        if errors:
            with owner.lock:
                owner.rejected.append((body, errors))
            self._send(400, _error("invalid_request_error", "; ".join(errors)))
            return
        content = owner.agent(body)
        with owner.lock:
            n = next(owner.ids)
        stop = "tool_use" if any(b["type"] == "tool_use" for b in content) else "end_turn"
        self._send(
            200,
            {
                "id": f"msg_{n:06d}",
                "type": "message",
                "role": "assistant",
                "model": body["model"],
                "content": content,
                "stop_reason": stop,
                "stop_sequence": None,
                "usage": {"input_tokens": owner.agent.inputs[-1], "output_tokens": 10},
            },
        )

    def _send(self, status: int, payload: Mapping[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        with contextlib.suppress(OSError):
            self.wfile.write(data)


def _error(kind: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}


class AnthropicServer:
    """``with AnthropicServer(agent) as srv:`` then ``anthropic.Anthropic(base_url=srv.base_url,
    api_key="test")``; ``rejected`` holds every request the shape rules refused, with why."""

    def __init__(self, agent: AnthropicAgent | None = None) -> None:
        self.agent = agent if agent is not None else AnthropicAgent()
        self.rejected: list[tuple[dict[str, Any], list[str]]] = []
        self.lock = threading.Lock()
        self.ids = itertools.count(1)
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        assert self._httpd is not None, "start the server first"
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def __enter__(self) -> AnthropicServer:
        self._httpd = _HTTPServer(self)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="anthropic-test-server",
            daemon=True,
        )
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._httpd is not None and self._thread is not None
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)
