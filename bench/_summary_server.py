"""One deterministic summarizer for every system of agent_cost.py, behind the OpenAI protocol.

A real HTTP server on 127.0.0.1 (a free port, a background thread) that answers
``POST /v1/chat/completions`` with autoctx's `OfflineSummarizer` applied to the request, so
that autoctx (through `OpenAISummarizer`), LangChain (through `ChatOpenAI`) and the OpenHands
SDK (through litellm) all pay the same HTTP path and get summaries made by the same code. It is
built on the idea of tests/openai_server.py (which is a test helper, not importable from a
plain checkout's bench/ without putting the repository root on the path).

The summary budget: a request that states one (autoctx's S6 "Character budget" and the fold's
"Length budget") gets it; any other gets the offline default (a quarter of the input, between
200 and 4,000 characters). Usage is counted server-side with tiktoken (o200k_base) over the
text of every message of the request and of the answer, the same way for every client, and
kept per model name: each system names its own model, which is how calls are attributed.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

from autoctx import OfflineSummarizer, SummaryRequest
from autoctx._tokens import TokenCounter

_TRANSCRIPT_HEAD = "Transcript to summarize:\n\n"
_CHAR_BUDGET_RE = re.compile(
    r"\n\nCharacter budget: your answer must be at most (\d+) characters \(the original "
    r"content of the transcript is (\d+) characters\)\."
)
_TOKEN_BUDGET_RE = re.compile(
    r"\n\nLength budget: your answer must be at most (\d+) tokens \(about \d+ characters\); "
    r"the transcript is (\d+) characters\. Keep what matters most within it\."
)


@dataclass
class Usage:
    """What one client (one model name) asked of the summarizer."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    return ""


def summary_request(messages: list[Mapping[str, Any]]) -> SummaryRequest:
    """The `SummaryRequest` a chat-completion request stands for: the system messages are the
    prompt, the last user message the transcript (with autoctx's framing and budgets read
    back, so that autoctx through HTTP gets what the direct offline summarizer would give)."""
    prompt = "\n\n".join(_text(m.get("content")) for m in messages if m.get("role") == "system")
    user = next(
        (_text(m.get("content")) for m in reversed(messages) if m.get("role") == "user"), ""
    )
    char_budget = token_budget = None
    input_chars = len(user)
    if user.startswith(_TRANSCRIPT_HEAD):
        user = user[len(_TRANSCRIPT_HEAD) :]
        if found := _CHAR_BUDGET_RE.search(user):
            char_budget, input_chars = int(found[1]), int(found[2])
            user = user[: found.start()] + user[found.end() :]
        if found := _TOKEN_BUDGET_RE.search(user):
            token_budget, input_chars = int(found[1]), int(found[2])
            user = user[: found.start()] + user[found.end() :]
    return SummaryRequest(
        strategy=0,
        prompt=prompt,
        transcript=user,
        input_chars=input_chars,
        char_budget=char_budget,
        token_budget=token_budget,
    )


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._send(200, {"object": "list", "data": []})

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if not self.path.rstrip("/").endswith("/chat/completions"):
            self._send(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
            return
        body = json.loads(raw or b"{}")
        if body.get("stream"):
            # None of the three clients streams here; say so rather than answer wrongly.
            self._send(400, {"error": {"message": "stream is not served", "type": "invalid"}})
            return
        self._send(200, self.server.owner.complete(body))

    def _send(self, status: int, payload: Mapping[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, owner: SummaryServer) -> None:
        self.owner = owner
        super().__init__(("127.0.0.1", 0), _Handler)


class SummaryServer:
    """``with SummaryServer() as srv: ... srv.base_url ... srv.usage["langchain"]``."""

    def __init__(self) -> None:
        self.usage: dict[str, Usage] = {}
        self._summarizer = OfflineSummarizer()
        self._counter = TokenCounter("gpt-4o")
        self._lock = threading.Lock()
        self._ids = 0
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> SummaryServer:
        self._httpd = _HTTPServer(self)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    @property
    def base_url(self) -> str:
        if self._httpd is None:
            raise RuntimeError("the summary server is not running")
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def complete(self, body: Mapping[str, Any]) -> dict[str, Any]:
        started = time.perf_counter()
        messages = [m for m in body.get("messages") or [] if isinstance(m, Mapping)]
        summary = self._summarizer.summarize(summary_request(messages)).text
        prompt_tokens = sum(self._counter.count(_text(m.get("content"))) for m in messages)
        completion_tokens = self._counter.count(summary)
        # litellm sends "openai/<name>" as "<name>"; the name is the client's label.
        model = str(body.get("model") or "?")
        with self._lock:
            self._ids += 1
            usage = self.usage.setdefault(model, Usage())
            usage.calls += 1
            usage.prompt_tokens += prompt_tokens
            usage.completion_tokens += completion_tokens
            usage.seconds += time.perf_counter() - started
            ident = self._ids
        return {
            "id": f"chatcmpl-bench-{ident}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": summary},
                    "logprobs": None,
                    "finish_reason": "stop",
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }
