"""A real local HTTP server that speaks the OpenAI Chat Completions protocol, for tests.

It binds 127.0.0.1 on a free port and runs in a background thread; the official ``openai``
client talks to it over real sockets (the client does not go through a transport that a mock
could intercept). Each request to ``POST /v1/chat/completions`` takes the next scripted reply,
or the default one, and is answered as plain JSON or, when the request asks for
``"stream": true``, as server-sent events (with a usage chunk when
``stream_options.include_usage`` is set). ``GET /v1/models`` lists one model.

    with OpenAIServer() as srv:
        srv.script(Reply.rate_limited(retry_after=3), Reply.text("fine"))
        client = openai.OpenAI(base_url=srv.base_url, api_key="test", max_retries=0)
        ...
        assert srv.requests[0]["messages"][0]["role"] == "system"

A script entry is a `Reply` or a callable ``(request_body) -> Reply``. When the script is empty
the server uses its default (`Reply.text()` with no content: "Summary: " followed by the start
of the last user message).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import re
import select
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Literal, TypeAlias

__all__ = ["OpenAIServer", "Reply", "ReplySource", "default_answer"]

Behaviour: TypeAlias = Literal["answer", "error", "drop", "stall", "drip"]
ReplySource: TypeAlias = "Reply | Callable[[dict[str, Any]], Reply]"

_TAG_RE = re.compile(r"<!--.*?-->", re.DOTALL)


def default_answer(body: Mapping[str, Any]) -> str:
    """ "Summary: " and the first 200 characters of the last user message, whitespace collapsed.

    HTML comments and the offload marker are removed, so the default never trips the
    summarizer's tag check.
    """
    text = ""
    for message in reversed(body.get("messages") or []):
        if isinstance(message, Mapping) and message.get("role") == "user":
            text = _content_text(message.get("content"))
            break
    text = _TAG_RE.sub(" ", text).replace("CONTEXT_OFFLOAD", " ")
    return "Summary: " + " ".join(text.split())[:200]


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    return ""


@dataclass(frozen=True)
class Reply:
    """What the server does with one request. Build one with the class methods."""

    behaviour: Behaviour = "answer"
    #: The answer text; None means `default_answer` of the request.
    content: str | None = None
    #: The assistant message's refusal field.
    refusal_text: str | None = None
    finish_reason: str = "stop"
    #: Extra keys of the assistant message (``tool_calls`` ...).
    message_extra: Mapping[str, Any] = field(default_factory=dict)
    #: A complete response body, sent as it is (non-streaming) or cut into chunks (streaming).
    raw: Mapping[str, Any] | None = None
    #: HTTP status and extra headers (errors).
    status: int = 200
    headers: Mapping[str, str] = field(default_factory=dict)
    error_message: str = "error"
    #: Seconds to wait before answering.
    delay: float = 0.0
    #: Reported model; None echoes the request's model.
    model: str | None = None
    #: Report token usage.
    usage: bool = True
    #: drop/stall: content chunks sent before the connection drops or stalls.
    after_chunks: int = 1
    #: drop: end the HTTP body properly, but without a finish_reason, usage or [DONE].
    clean_close: bool = False
    #: Characters of content per streamed chunk.
    chunk_chars: int = 16
    #: drip: seconds between two pieces of the answer.
    interval: float = 0.0

    # -- answers --------------------------------------------------------------------------

    @classmethod
    def text(
        cls,
        content: str | None = None,
        *,
        finish_reason: str = "stop",
        model: str | None = None,
        usage: bool = True,
        delay: float = 0.0,
        chunk_chars: int = 16,
    ) -> Reply:
        """A normal answer; ``content=None`` answers `default_answer` of the request."""
        return cls(
            content=content,
            finish_reason=finish_reason,
            model=model,
            usage=usage,
            delay=delay,
            chunk_chars=chunk_chars,
        )

    @classmethod
    def slow(cls, seconds: float, content: str | None = None) -> Reply:
        """Answer normally, after `seconds`."""
        return cls(content=content, delay=seconds)

    @classmethod
    def empty(cls) -> Reply:
        return cls(content="")

    @classmethod
    def whitespace(cls) -> Reply:
        return cls(content="  \n\t \n")

    @classmethod
    def tag_only(cls, handle: int = 3) -> Reply:
        """An answer that is nothing but an offload tag."""
        return cls(content=f"<!-- offload {handle} -->")

    @classmethod
    def refusal(cls, text: str = "I can't help with that.") -> Reply:
        """A refusal: ``message.refusal`` set, no content, finish_reason ``content_filter``."""
        return cls(content=None, refusal_text=text, finish_reason="content_filter")

    @classmethod
    def gigantic(cls, chars: int = 200_000) -> Reply:
        """A deterministic answer of exactly `chars` characters."""
        unit = "All facts are kept here, line after line, without an end in sight. "
        return cls(content=(unit * (chars // len(unit) + 1))[:chars], chunk_chars=4096)

    @classmethod
    def tool_call(
        cls,
        name: str,
        arguments: str | Mapping[str, Any] = "{}",
        *,
        call_id: str = "call_1",
        content: str | None = None,
    ) -> Reply:
        """An assistant message that calls one tool (finish_reason ``tool_calls``)."""
        args = arguments if isinstance(arguments, str) else json.dumps(arguments)
        call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
        return cls.message({"role": "assistant", "content": content, "tool_calls": [call]})

    @classmethod
    def message(cls, message: Mapping[str, Any], *, finish_reason: str | None = None) -> Reply:
        """Any assistant message (a dict in the OpenAI format), wrapped in a completion."""
        extra = {k: v for k, v in message.items() if k not in ("role", "content", "refusal")}
        if finish_reason is None:
            finish_reason = "tool_calls" if message.get("tool_calls") else "stop"
        return cls(
            content=message.get("content") or "",
            refusal_text=message.get("refusal"),
            finish_reason=finish_reason,
            message_extra=extra,
        )

    @classmethod
    def raw_json(cls, body: Mapping[str, Any], *, status: int = 200) -> Reply:
        """Send `body` exactly (non-streaming); a streaming request gets it as chunks."""
        return cls(raw=body, status=status)

    # -- failures -------------------------------------------------------------------------

    @classmethod
    def error(
        cls,
        status: int,
        message: str = "error",
        *,
        headers: Mapping[str, str] | None = None,
        delay: float = 0.0,
    ) -> Reply:
        """An HTTP error with an OpenAI-shaped error body."""
        return cls(
            behaviour="error",
            status=status,
            error_message=message,
            headers=dict(headers or {}),
            delay=delay,
        )

    @classmethod
    def rate_limited(cls, retry_after: float | str = 2) -> Reply:
        """HTTP 429 with a ``Retry-After`` header."""
        return cls.error(
            429, "Rate limit reached, slow down", headers={"Retry-After": str(retry_after)}
        )

    @classmethod
    def server_error(cls, status: int = 500, message: str = "The server had an error") -> Reply:
        return cls.error(status, message)

    @classmethod
    def drop(cls, after_chunks: int = 2, *, clean_close: bool = False) -> Reply:
        """Drop the connection mid-answer.

        Streaming: after `after_chunks` content chunks the socket is closed inside the chunked
        body (the client sees an incomplete read); with ``clean_close=True`` the body ends
        properly but without a finish_reason or ``[DONE]``. Non-streaming: half the JSON body
        is sent, then the socket is closed.
        """
        return cls(behaviour="drop", after_chunks=after_chunks, clean_close=clean_close)

    @classmethod
    def stall(cls, after_chunks: int = 1) -> Reply:
        """Stop sending (after `after_chunks` chunks when streaming, at once otherwise) until the
        client gives up or the server closes."""
        return cls(behaviour="stall", after_chunks=after_chunks)

    @classmethod
    def drip(cls, interval: float, content: str | None = None, *, chunk_chars: int = 16) -> Reply:
        """Answer slowly but steadily: streaming, one chunk every `interval` seconds;
        non-streaming, the JSON body `chunk_chars` bytes every `interval` seconds. No single
        read waits long, so only an overall deadline ends it early."""
        return cls(content=content, behaviour="drip", interval=interval, chunk_chars=chunk_chars)

    def with_delay(self, seconds: float) -> Reply:
        return replace(self, delay=seconds)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    # Keep-alive connections that a client pool holds open would make joining threads hang;
    # `OpenAIServer.close` shuts the sockets down instead.
    block_on_close = False

    def __init__(self, owner: OpenAIServer) -> None:
        self.owner = owner
        super().__init__(("127.0.0.1", 0), _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients that time out and hang up are part of the tests, not errors worth a traceback.
        pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        self.server.owner._track(self.connection, add=True)

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            super().finish()
        self.server.owner._track(self.connection, add=False)

    # -- routing ----------------------------------------------------------------------------

    def _path(self) -> str:
        path = self.path.split("?", 1)[0].rstrip("/")
        return path[3:] if path.startswith("/v1") else path

    def do_GET(self) -> None:
        if self._path() == "/models":
            owner = self.server.owner
            self._send_json(
                200,
                {
                    "object": "list",
                    "data": [
                        {"id": owner.model, "object": "model", "created": 0, "owned_by": "autoctx"}
                    ],
                },
            )
        else:
            self._send_error(404, f"no route GET {self.path}", "not_found")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if self._path() not in ("/chat/completions", "/responses/compact"):
            self._send_error(404, f"no route POST {self.path}", "not_found")
            return
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            self._send_error(400, "the body is not JSON", "invalid_request_error")
            return
        owner = self.server.owner
        if self._path() == "/responses/compact":
            self._send_json(200, owner._compact(body))
            return
        reply = owner._record_and_next(body, {k.lower(): v for k, v in self.headers.items()})
        try:
            self._serve(reply, body)
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
            self.close_connection = True

    # -- replies ----------------------------------------------------------------------------

    def _serve(self, reply: Reply, body: dict[str, Any]) -> None:
        owner = self.server.owner
        if reply.delay and owner._stopped.wait(reply.delay):
            self.close_connection = True
            return
        if reply.behaviour == "error":
            self._send_error(
                reply.status, reply.error_message, _error_type(reply.status), reply.headers
            )
            return
        stream = bool(body.get("stream"))
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        completion = owner._completion(reply, body)
        if not stream:
            if reply.behaviour == "answer":
                self._send_json(reply.status, completion)
            elif reply.behaviour == "drip":
                data = json.dumps(completion).encode()
                self._start(200, "application/json", {"Content-Length": str(len(data))})
                for piece in range(0, len(data), reply.chunk_chars):
                    if piece and owner._stopped.wait(reply.interval):
                        return
                    self.wfile.write(data[piece : piece + reply.chunk_chars])
                    self.wfile.flush()
            elif reply.behaviour == "drop":
                data = json.dumps(completion).encode()
                self._start(200, "application/json", {"Content-Length": str(len(data))})
                self.wfile.write(data[: len(data) // 2])
                self._hang_up()
            else:
                self._stall()
            return
        chunks = list(_chunks(completion, reply.chunk_chars))
        self._start(
            200, "text/event-stream", {"Transfer-Encoding": "chunked", "Cache-Control": "no-cache"}
        )
        if reply.behaviour in ("drop", "stall"):
            # The role chunk and `after_chunks` content chunks, never the finishing one.
            for chunk in chunks[: 1 + reply.after_chunks][: len(chunks) - 1]:
                self._send_event(chunk)
            if reply.behaviour == "stall":
                self._stall()
            elif reply.clean_close:
                self._end_chunked()
            else:
                self._hang_up()
            return
        for k, chunk in enumerate(chunks):
            if reply.behaviour == "drip" and k and owner._stopped.wait(reply.interval):
                self._hang_up()
                return
            self._send_event(chunk)
        if include_usage:
            self._send_event(
                {
                    **_chunk_base(completion),
                    "choices": [],
                    "usage": completion.get("usage"),
                }
            )
        self._send_chunk(b"data: [DONE]\n\n")
        self._end_chunked()

    def _start(self, status: int, content_type: str, headers: Mapping[str, str]) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()

    def _send_json(
        self, status: int, payload: Any, headers: Mapping[str, str] | None = None
    ) -> None:
        data = json.dumps(payload).encode()
        self._start(
            status,
            "application/json",
            {
                "Content-Length": str(len(data)),
                "x-request-id": f"req_{id(self)}",
                **(headers or {}),
            },
        )
        self.wfile.write(data)

    def _send_error(
        self, status: int, message: str, kind: str, headers: Mapping[str, str] | None = None
    ) -> None:
        self._send_json(
            status,
            {"error": {"message": message, "type": kind, "param": None, "code": kind}},
            headers,
        )

    def _send_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):X}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _send_event(self, payload: Mapping[str, Any]) -> None:
        self._send_chunk(b"data: " + json.dumps(payload).encode() + b"\n\n")

    def _end_chunked(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _hang_up(self) -> None:
        self.wfile.flush()
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def _stall(self) -> None:
        """Send nothing more until the client hangs up or the server stops."""
        self.close_connection = True
        sock = self.connection
        stopped = self.server.owner._stopped
        while not stopped.wait(0.05):
            try:
                readable, _, _ = select.select([sock], [], [], 0)
                if readable and not sock.recv(1, socket.MSG_PEEK):
                    return
            except OSError:
                return


def _error_type(status: int) -> str:
    if status == 429:
        return "rate_limit_exceeded"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


def _chunk_base(completion: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "id": completion.get("id", "chatcmpl-test"),
        "object": "chat.completion.chunk",
        "created": completion.get("created", int(time.time())),
        "model": completion.get("model", "test-model"),
    }


def _pieces(text: str, size: int) -> Iterator[str]:
    for start in range(0, len(text), max(1, size)):
        yield text[start : start + max(1, size)]


def _chunks(completion: Mapping[str, Any], size: int) -> Iterator[dict[str, Any]]:
    """A completion as stream chunks: role, content pieces, refusal, tool calls, finish."""
    base = _chunk_base(completion)
    choices = completion.get("choices") or [{}]
    choice = choices[0]
    message: Mapping[str, Any] = choice.get("message") or {}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            **base,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }

    yield chunk({"role": "assistant", "content": ""})
    for piece in _pieces(message.get("reasoning_content") or "", size):
        yield chunk({"reasoning_content": piece})
    for piece in _pieces(message.get("content") or "", size):
        yield chunk({"content": piece})
    for piece in _pieces(message.get("refusal") or "", size):
        yield chunk({"refusal": piece})
    for index, call in enumerate(message.get("tool_calls") or []):
        fn = call.get("function") or {}
        yield chunk(
            {
                "tool_calls": [
                    {
                        "index": index,
                        "id": call.get("id"),
                        "type": call.get("type", "function"),
                        "function": {"name": fn.get("name"), "arguments": ""},
                    }
                ]
            }
        )
        for piece in _pieces(fn.get("arguments") or "", size):
            yield chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
    yield chunk({}, choice.get("finish_reason") or "stop")


class OpenAIServer:
    """A scriptable OpenAI Chat Completions server on 127.0.0.1 (see the module docstring).

    ``base_url`` is ``http://127.0.0.1:<port>/v1``; ``requests`` holds every chat-completion
    request body received, in order, and ``request_headers`` their headers (lower-case names).
    """

    def __init__(self, *, model: str = "test-model", default: ReplySource | None = None) -> None:
        self.model = model
        self.default: ReplySource = default if default is not None else Reply.text()
        self.requests: list[dict[str, Any]] = []
        self.request_headers: list[dict[str, str]] = []
        #: Bodies of ``POST /v1/responses/compact`` requests, in order.
        self.compactions: list[dict[str, Any]] = []
        self._script: deque[ReplySource] = deque()
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._connections: set[socket.socket] = set()
        self._ids = itertools.count(1)
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- the Responses API's compaction (what the Agents SDK's compaction session calls) -----

    def _compact(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """``POST /v1/responses/compact``: as the real endpoint answers, the input's user
        messages followed by one opaque compaction item; the body goes to ``compactions``."""
        with self._lock:
            self.compactions.append(dict(body))
            n = next(self._ids)
        items = body.get("input") or []
        users = [
            dict(item)
            for item in items
            if isinstance(item, Mapping)
            and item.get("role") == "user"
            and item.get("type", "message") == "message"
        ]
        compaction = {"type": "compaction", "id": f"cmp_item_{n}", "encrypted_content": f"c{n}"}
        return {
            "id": f"cmp_{n}",
            "object": "response.compaction",
            "created_at": int(time.time()),
            "output": [*users, compaction],
            "usage": {
                "input_tokens": 10 * len(items),
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": 5,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": 10 * len(items) + 5,
            },
        }

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> OpenAIServer:
        if self._httpd is not None:
            return self
        self._stopped.clear()
        self._httpd = _HTTPServer(self)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="openai-test-server",
            daemon=True,
        )
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving; stalled and slow replies end at once, open connections are cut."""
        if self._httpd is None:
            return
        self._stopped.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = None
        self._thread = None

    def __enter__(self) -> OpenAIServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("the server is not running; use `with OpenAIServer() as srv:`")
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    # -- scripting --------------------------------------------------------------------------

    def script(self, *replies: ReplySource) -> OpenAIServer:
        """Queue replies: each answers one chat-completion request, in order; then the default
        answers. A callable gets the request body and returns the `Reply`."""
        with self._lock:
            self._script.extend(replies)
        return self

    def set_default(self, reply: ReplySource) -> None:
        """What answers when the script is empty."""
        self.default = reply

    @property
    def pending(self) -> int:
        """Scripted replies not used yet."""
        with self._lock:
            return len(self._script)

    def reset(self) -> None:
        """Forget the received requests and the unused script."""
        with self._lock:
            self._script.clear()
            self.requests.clear()
            self.request_headers.clear()

    # -- internals --------------------------------------------------------------------------

    def _track(self, conn: socket.socket, *, add: bool) -> None:
        with self._lock:
            if add:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)

    def _record_and_next(self, body: dict[str, Any], headers: dict[str, str]) -> Reply:
        with self._lock:
            self.requests.append(body)
            self.request_headers.append(headers)
            source = self._script.popleft() if self._script else self.default
        return source(body) if callable(source) else source

    def _completion(self, reply: Reply, body: Mapping[str, Any]) -> dict[str, Any]:
        if reply.raw is not None:
            return dict(reply.raw)
        content = reply.content
        if content is None and reply.refusal_text is None:
            content = default_answer(body)
        message: dict[str, Any] = {
            "role": "assistant",
            "content": content,
            "refusal": reply.refusal_text,
            **reply.message_extra,
        }
        completion: dict[str, Any] = {
            "id": f"chatcmpl-test-{next(self._ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": reply.model or body.get("model") or self.model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": reply.finish_reason,
                }
            ],
        }
        if reply.usage:
            prompt_chars = sum(
                len(_content_text(m.get("content")))
                for m in body.get("messages") or []
                if isinstance(m, Mapping)
            )
            completion_chars = len(content or "") + len(reply.refusal_text or "")
            prompt_tokens = max(1, prompt_chars // 4)
            completion_tokens = max(1, completion_chars // 4)
            completion["usage"] = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            }
        return completion
