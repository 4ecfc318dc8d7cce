"""The summarizer for any OpenAI-compatible Chat Completions endpoint, through the official
`openai` client (plain or streaming, sync or awaited), with retries, a per-call deadline and a
watchdog that hangs up on a stalled stream."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import random
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Final, TypeAlias

from .. import _arguments
from .._errors import ConfigError, SummarizerError

if TYPE_CHECKING:
    # The openai package takes about half a second to import; the offline path never needs it.
    import openai
    from openai.types.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionMessageParam

from .._answers import check_answer
from .._summary import SummaryRequest, SummaryResult

_log = logging.getLogger("autoctx")


#: Model used when neither the caller nor the environment names one.
DEFAULT_SUMMARY_MODEL: Final = "gpt-4o-mini"
#: The overall deadline of a call whose request names none (a request built outside the
#: compressor, which names the config's `summarizer_deadline_s`).
DEFAULT_DEADLINE_S: Final = 120.0
# Local OpenAI-compatible servers need no key, but the official client refuses to start
# without one.
_PLACEHOLDER_KEY: Final = "autoctx-no-key"
#: Statuses worth another attempt (the official client's own rule): request timeout, lock
#: timeout, rate limit, server errors.
_RETRY_STATUSES: Final = frozenset({408, 409, 429})
#: The backoff between attempts when the server names no Retry-After (the official client's
#: figures), and the longest Retry-After still worth waiting for.
_FIRST_RETRY_S: Final = 0.5
_MAX_RETRY_S: Final = 8.0
_MAX_RETRY_AFTER_S: Final = 120.0
#: Reasons that say the endpoint failed (not the answer): enough of them in a row, or one that
#: retrying cannot cure, and the endpoint is not called again until a back-off has passed.
_ENDPOINT_FAILURES: Final = frozenset(
    {
        "timeout",
        "deadline",
        "rate_limited",
        "http_error",
        "connection",
        "bad_response",
        "api_error",
        "model_not_found",
        "auth",
    }
)
#: Failures that no retry cures: the endpoint backs off after the first.
_PERMANENT: Final = frozenset({"model_not_found", "auth"})

_Answer: TypeAlias = "tuple[str, str, int | None, int | None]"


def _env(name: str) -> str | None:
    value = os.environ.get(name, "").strip()
    return value or None


class OpenAISummarizer:
    """Summaries from any OpenAI-compatible Chat Completions endpoint (official `openai` client).

    ``OpenAISummarizer(model="gpt-4o-mini")`` reads ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY``;
    the model falls back to ``AUTOCTX_SUMMARY_MODEL``, then ``OPENAI_MODEL``, then
    ``gpt-4o-mini``. Pass ``client=`` to use a configured `openai.OpenAI` (and
    ``async_client=`` a configured `openai.AsyncOpenAI`): their timeout (per attempt) and
    retries apply. With ``stream=True`` the answer is streamed and the usage read from the
    final chunk.

    Every call has an overall deadline: the request's (the compressor sets the config's
    `summarizer_deadline_s`), else ``deadline_s`` (default 120 s); the tighter of the two when
    both are set. It covers every attempt, the waits between them and a slow stream; a call
    past it fails with reason ``deadline`` and is never a summary. `summarize` waits in the
    calling thread; `asummarize` awaits the endpoint on the event loop (an `AsyncSummarizer`).

    Every failure raises `SummarizerError`; its ``reason`` is one of `SUMMARIZER_REASONS`, and
    its detail never quotes the answer, a refusal or an error body (they may echo the
    transcript). Whether the summary is shorter than its input is the compressor's check.
    """

    #: The model reads the shared request's prompt and answers each message under its header.
    answers_shared_requests: ClassVar[bool] = True

    def __init__(
        self,
        client: openai.OpenAI | None = None,
        *,
        async_client: openai.AsyncOpenAI | None = None,
        model: str | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float = 60,
        max_retries: int = 2,
        stream: bool = False,
        temperature: float | None = 0,
        deadline_s: float | None = None,
        backoff_after: int = 3,
        backoff_s: float = 30.0,
        max_backoff_s: float = 600.0,
    ) -> None:
        self.model, model_from = _pick_model(model)
        _check_backoff(backoff_after, backoff_s, max_backoff_s)
        #: Consecutive failures of the endpoint, and the back-off they started.
        self._health = _Health(backoff_after, backoff_s, max_backoff_s)
        #: Where the model, the endpoint and the key came from (the open log line, the hints of
        #: a model-not-found or authentication failure).
        self.chosen: dict[str, str] = {"model": model_from}
        self.stream = stream
        self.temperature = temperature
        if deadline_s is not None and not (isinstance(deadline_s, int | float) and deadline_s > 0):
            raise ConfigError(
                f"OpenAISummarizer: deadline_s must be a positive number of seconds, got "
                f"{deadline_s!r}"
            )
        self.deadline_s = deadline_s
        self._owns_client = client is None
        self._async_given = async_client
        # Settings for the async clients `asummarize` makes. None when a client was given:
        # its configuration is the caller's, not one to copy.
        self._async_settings: dict[str, Any] | None = None
        if client is not None:
            if base_url is not None or api_key is not None:
                raise ConfigError(
                    "OpenAISummarizer: pass either a configured client or base_url/api_key, "
                    "not both"
                )
            self.client = client
            self.chosen.update(endpoint="the client= argument", key="the client= argument")
            return
        import openai

        self.chosen["endpoint"] = (
            "the base_url= argument"
            if base_url
            else "OPENAI_BASE_URL"
            if _env("OPENAI_BASE_URL")
            else "the default endpoint (OPENAI_BASE_URL is not set)"
        )
        self.chosen["key"] = (
            "the api_key= argument"
            if api_key
            else "OPENAI_API_KEY"
            if _env("OPENAI_API_KEY")
            else "no key (OPENAI_API_KEY is not set)"
        )
        base_url = base_url or _env("OPENAI_BASE_URL")
        api_key = api_key or _env("OPENAI_API_KEY") or (_PLACEHOLDER_KEY if base_url else None)
        if api_key is None:
            raise ConfigError(
                "OpenAISummarizer needs an endpoint: set OPENAI_API_KEY (for api.openai.com) "
                "or OPENAI_BASE_URL (for a local OpenAI-compatible server), or pass "
                "base_url=/api_key=; without one, use OfflineSummarizer()"
            )
        settings: dict[str, Any] = {
            "api_key": api_key,
            "base_url": base_url,
            "timeout": timeout,
            "max_retries": max_retries,
        }
        self.client = openai.OpenAI(**settings)
        if async_client is None:
            self._async_settings = settings

    @classmethod
    def from_env(cls) -> OpenAISummarizer | None:
        """A summarizer for the endpoint the environment names, or None when it names none."""
        if _env("OPENAI_BASE_URL") is None and _env("OPENAI_API_KEY") is None:
            return None
        return cls()

    def __repr__(self) -> str:
        base_url = str(self.client.base_url).rstrip("/")
        return f"OpenAISummarizer(model={self.model!r}, base_url={base_url!r})"

    def describe(self) -> str:
        """Which model and endpoint, and why (for the line a memory logs when it opens)."""
        base_url = str(self.client.base_url).rstrip("/")
        return (
            f"OpenAISummarizer, model {self.model!r} (from {self.chosen['model']}) at "
            f"{base_url} (from {self.chosen['endpoint']}; key from {self.chosen['key']})"
        )

    def _settings_hint(self, reason: str) -> str:
        """What to change for a failure that retrying cannot cure."""
        if reason == "model_not_found":
            model_from = self.chosen["model"]
            where = (
                "pass another model= to OpenAISummarizer"
                if model_from.startswith("the model=")
                else "set AUTOCTX_SUMMARY_MODEL to a model it serves (or pass model= to "
                f"OpenAISummarizer; the model now comes from {model_from})"
            )
            return (
                f"model not found: the endpoint does not serve model {self.model!r}, or has no "
                f"chat completions at this URL; {where}, or check the endpoint (from "
                f"{self.chosen['endpoint']})"
            )
        key_from = self.chosen.get("key", "the client= argument")
        return (
            f"authentication failed: the endpoint refused the API key (from {key_from}); set "
            "OPENAI_API_KEY (or pass api_key= to OpenAISummarizer) to a key it accepts for "
            f"model {self.model!r}"
        )

    def _checked(self, failure: SummarizerError, ticket: int) -> SummarizerError:
        """A failure as the caller sees it (with the settings to change when retrying cannot
        cure it), counted against the endpoint's health (`ticket`: what `_Health.check` gave
        the call when it started)."""
        if failure.reason in _PERMANENT:
            failure = SummarizerError(
                failure.reason, f"{failure.detail}: {self._settings_hint(failure.reason)}"
            )
        if failure.reason in _ENDPOINT_FAILURES:
            self._health.failed(failure.reason, self._where(), ticket)
        return failure

    def close(self) -> None:
        """Close the HTTP client, when this summarizer created it."""
        if self._owns_client:
            self.client.close()

    # -- one call, sync -------------------------------------------------------------------------

    def summarize(self, request: SummaryRequest) -> SummaryResult:
        import openai

        ticket = self._health.check(self._where())
        call = self._begin(request, self.client.timeout, self.client.max_retries)
        while True:
            try:
                answer = self._attempt(call)
            except openai.OpenAIError as err:
                wait = call.after(err)
            except SummarizerError as failure:
                raise self._checked(failure, ticket) from None
            else:
                return self._answered(call, answer, ticket)
            # Raised outside the handler, so that the client's error (whose text may quote
            # what the server sent) is neither its cause nor its context.
            if isinstance(wait, SummarizerError):
                raise self._checked(wait, ticket)
            time.sleep(wait)

    def _answered(self, call: _Call, answer: _Answer, ticket: int) -> SummaryResult:
        try:
            result = call.result(answer, self.model)
        except SummarizerError as failure:
            raise self._checked(failure, ticket) from None
        self._health.succeeded()
        return result

    def _attempt(self, call: _Call) -> _Answer:
        client = self.client.with_options(timeout=call.next_timeout(), max_retries=0)
        # Neither a body that trickles in nor a stream that drips a chunk now and then trips
        # the read timeout (each read is short): a watchdog hangs up on the response at the
        # deadline, so that the read waiting on it ends there.
        if not self.stream:
            raw = client.chat.completions.with_streaming_response.create(
                model=self.model, messages=call.messages, temperature=self._temperature()
            )
            with raw as response, _watchdog(call, response.http_response):
                _read_body(response.http_response)
                return _plain_answer(response.parse(), call.where)
        collected = _Streamed()
        stream = client.chat.completions.create(
            model=self.model,
            messages=call.messages,
            stream=True,
            stream_options={"include_usage": True},
            temperature=self._temperature(),
        )
        with stream, _watchdog(call, stream.response):
            for chunk in stream:
                call.check()
                collected.add(chunk)
        return collected.answer(call.where)

    # -- one call, async ------------------------------------------------------------------------

    async def asummarize(self, request: SummaryRequest) -> SummaryResult:
        """`summarize` for asyncio: the endpoint is awaited on the event loop, no thread waits.

        With a given sync client and no async one, the sync call runs in a worker thread.
        """
        given, settings = self._async_given, self._async_settings
        if given is not None:
            return await self._acall(given, request, self._health.check(self._where()))
        if settings is None:
            return await asyncio.to_thread(self.summarize, request)  # it checks the health
        ticket = self._health.check(self._where())
        import openai

        # A client of its own per call: pooled async connections belong to the event loop that
        # opened them, and a summarizer may serve several loops (one per `asyncio.run`). One
        # connection per summary costs little beside the seconds the summary takes.
        async with openai.AsyncOpenAI(**settings) as client:
            return await self._acall(client, request, ticket)

    async def _acall(
        self, client: openai.AsyncOpenAI, request: SummaryRequest, ticket: int
    ) -> SummaryResult:
        import openai

        call = self._begin(request, client.timeout, client.max_retries)
        while True:
            try:
                async with asyncio.timeout(call.remaining()):
                    answer = await self._aattempt(client, call)
            except openai.OpenAIError as err:
                wait = call.after(err)
            except TimeoutError:
                wait = call.expired()
            except SummarizerError as failure:
                raise self._checked(failure, ticket) from None
            else:
                return self._answered(call, answer, ticket)
            if isinstance(wait, SummarizerError):
                raise self._checked(wait, ticket)  # outside the handler, as in `summarize`
            await asyncio.sleep(wait)

    async def _aattempt(self, client: openai.AsyncOpenAI, call: _Call) -> _Answer:
        attempt = client.with_options(timeout=call.next_timeout(), max_retries=0)
        if not self.stream:
            response = await attempt.chat.completions.create(
                model=self.model, messages=call.messages, temperature=self._temperature()
            )
            return _plain_answer(response, call.where)
        collected = _Streamed()
        stream = await attempt.chat.completions.create(
            model=self.model,
            messages=call.messages,
            stream=True,
            stream_options={"include_usage": True},
            temperature=self._temperature(),
        )
        async with stream:
            async for chunk in stream:
                collected.add(chunk)
        return collected.answer(call.where)

    # -- shared by both ---------------------------------------------------------------------------

    def _begin(self, request: SummaryRequest, timeout: object, max_retries: int) -> _Call:
        started = time.monotonic()
        own = self.deadline_s if self.deadline_s is not None else DEFAULT_DEADLINE_S
        deadline = started + own
        if request.deadline is not None:
            deadline = (
                request.deadline if self.deadline_s is None else min(deadline, request.deadline)
            )
        messages: list[ChatCompletionMessageParam] = [
            {"role": "system", "content": request.prompt},
            {"role": "user", "content": request.user_content()},
        ]
        return _Call(
            where=self._where(),
            messages=messages,
            started=started,
            deadline=deadline,
            timeout=timeout,
            attempts=max_retries + 1,
            shared=request.parts > 0,
        )

    def _where(self) -> str:
        return f"model {self.model} at {str(self.client.base_url).rstrip('/')}"

    def _temperature(self) -> float | openai.Omit:
        import openai

        # None means "the endpoint's default": the parameter is left out, not sent as null,
        # which some OpenAI-compatible servers reject.
        return openai.omit if self.temperature is None else self.temperature


@dataclass(slots=True)
class _Call:
    """One summarizer call: its request, its deadline and its attempts (sync and async alike).

    The client's timeout and retries hold per attempt; this object runs the attempts itself
    (the client makes none), cutting each one's timeout to the time left, so that neither a
    retry nor the wait before it outlasts the deadline.
    """

    where: str
    messages: list[ChatCompletionMessageParam]
    started: float
    deadline: float
    #: The client's timeout of one attempt (a number, an `openai.Timeout` or None).
    timeout: object
    attempts: int
    #: The request is shared by several messages: its answer is checked whole only for what
    #: fails it whole (`check_answer`), each summary in it by the compressor.
    shared: bool = False
    made: int = 0
    #: The running attempt's timeout was cut to the time left before the deadline.
    cut: bool = False
    #: The reason the latest attempt failed with, for the deadline's error.
    last: str | None = None

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def expired(self) -> SummarizerError:
        last = f" (the last attempt failed: {self.last})" if self.last else ""
        return SummarizerError(
            "deadline",
            f"{self.where}: the call's deadline of {self.deadline - self.started:.1f} s passed "
            f"after {self.made} attempt{'s' if self.made != 1 else ''}{last}",
        )

    def check(self) -> None:
        if self.remaining() <= 0:
            raise self.expired()

    def next_timeout(self) -> openai.Timeout:
        import openai

        left = self.remaining()
        if left <= 0:
            raise self.expired()
        self.made += 1
        base = self.timeout if isinstance(self.timeout, openai.Timeout) else None
        whole = None if base is not None else _seconds(self.timeout)

        def cut(value: float | None) -> float:
            return left if value is None else min(value, left)

        parts = (
            (base.connect, base.read, base.write, base.pool) if base is not None else (whole,) * 4
        )
        self.cut = any(p is None or p > left for p in parts)
        connect, read, write, pool = (cut(p) for p in parts)
        return openai.Timeout(connect=connect, read=read, write=write, pool=pool)

    def after(self, err: openai.OpenAIError) -> float | SummarizerError:
        """Seconds to wait before the next attempt, or the `SummarizerError` that ends the
        call (not worth retrying, no attempt left, or the deadline comes first)."""
        import openai

        if isinstance(err, openai.APITimeoutError) and self.cut:
            return self.expired()
        failure = _failure(err, self.where)
        self.last = failure.reason
        delay = _retry_after(err)
        if self.made >= self.attempts or delay is None:
            return failure
        if delay >= self.remaining():
            return self.expired()
        return delay if delay > 0 else _backoff(self.made)

    def result(self, answer: _Answer, model: str) -> SummaryResult:
        # An answer that came in after the deadline is not a summary either.
        self.check()
        text, answered_by, prompt_tokens, completion_tokens = answer
        return SummaryResult(
            text=check_answer(text, shared=self.shared),
            model=answered_by or model,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            latency_ms=(time.monotonic() - self.started) * 1000,
        )


@contextlib.contextmanager
def _watchdog(call: _Call, response: Any) -> Iterator[None]:
    """Hang up on the response at the call's deadline; a read that this cuts is the deadline."""
    timer = threading.Timer(max(0.0, call.remaining()), _hang_up, (response,))
    timer.daemon = True
    timer.start()
    try:
        yield
    except Exception:
        call.check()
        raise
    finally:
        timer.cancel()


def _read_body(response: Any) -> None:
    """Read a streamed response's body, failing as the client would have: a body read outside
    the client raises the HTTP library's own errors, which the retry rule must see as the
    client's timeout and connection errors."""
    import openai

    try:
        response.read()
    except Exception as err:
        # The client's HTTP library (httpx or its successor) names its timeouts this way.
        if any(c.__name__ == "TimeoutException" for c in type(err).__mro__):
            raise openai.APITimeoutError(request=response.request) from err
        raise openai.APIConnectionError(request=response.request) from err


def _hang_up(response: Any) -> None:
    """End a response that another thread is reading: closing it would wait for that read,
    shutting its socket down wakes the read at once (the pool then drops the connection)."""
    stream = response.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    if isinstance(sock, socket.socket):
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
    else:
        response.close()


def _seconds(timeout: object) -> float | None:
    return float(timeout) if isinstance(timeout, int | float) else None


def _retry_after(err: openai.OpenAIError) -> float | None:
    """0 for "retry after the usual backoff", the server's Retry-After when it gave one, None
    when `err` is not worth another attempt."""
    import openai

    if isinstance(err, openai.APIConnectionError):  # timeouts included
        return 0.0
    if not isinstance(err, openai.APIStatusError):
        return None
    headers = err.response.headers
    verdict = headers.get("x-should-retry")
    if verdict == "false" or (
        verdict != "true" and err.status_code not in _RETRY_STATUSES and err.status_code < 500
    ):
        return None
    wait = _header_seconds(headers.get("retry-after-ms"), 1000) or _header_seconds(
        headers.get("retry-after"), 1
    )
    if wait is not None and wait > _MAX_RETRY_AFTER_S:
        return None
    return wait or 0.0


def _header_seconds(value: str | None, per_second: float) -> float | None:
    try:
        seconds = float(value) / per_second if value is not None else None
    except ValueError:
        return None  # an HTTP date: the usual backoff serves
    return seconds if seconds is not None and math.isfinite(seconds) and seconds > 0 else None


def _backoff(attempts_made: int) -> float:
    delay = min(_FIRST_RETRY_S * 2.0 ** (attempts_made - 1), _MAX_RETRY_S)
    return delay * (1 - 0.25 * random.random())  # jitter, so that clients do not march in step


def _failure(err: openai.OpenAIError, where: str) -> SummarizerError:
    """The `SummarizerError` of a client error. Its detail names the endpoint and the kind of
    failure, never the error body or message the server sent: a server may echo the request."""
    import openai

    if isinstance(err, openai.APITimeoutError):
        return SummarizerError("timeout", f"{where}: no answer within the timeout{_cause(err)}")
    if isinstance(err, openai.RateLimitError):
        retry_after = err.response.headers.get("retry-after")
        return SummarizerError(
            "rate_limited", f"{where}: HTTP 429, retry-after={retry_after or 'not given'}"
        )
    if isinstance(err, openai.APIStatusError) and err.status_code == 404:
        return SummarizerError("model_not_found", f"{where}: HTTP 404")
    if isinstance(err, openai.APIStatusError) and err.status_code in (401, 403):
        return SummarizerError("auth", f"{where}: HTTP {err.status_code}")
    if isinstance(err, openai.APIStatusError):
        return SummarizerError("http_error", f"{where}: HTTP {err.status_code}")
    if isinstance(err, openai.APIConnectionError):
        return SummarizerError("connection", f"{where}: the connection failed{_cause(err)}")
    if isinstance(err, openai.APIResponseValidationError):
        return SummarizerError("bad_response", f"{where}: the answer is not a chat completion")
    return SummarizerError("api_error", f"{where}: the client failed ({type(err).__name__})")


def _cause(err: BaseException) -> str:
    # The client's own message ("Connection error.") hides what happened underneath; the type
    # of the cause says it (its text could carry what the server sent).
    cause = err.__cause__
    return f" ({type(cause).__name__})" if cause is not None else ""


def _plain_answer(response: ChatCompletion, where: str) -> _Answer:
    if not response.choices:
        raise SummarizerError("bad_response", f"{where}: the answer has no choices")
    choice = response.choices[0]
    if choice.message.refusal:
        raise SummarizerError(
            "refusal", f"{where}: the model refused ({_length(choice.message.refusal)})"
        )
    _check_finish(choice.finish_reason, where)
    usage = response.usage
    return (
        choice.message.content or "",
        response.model,
        usage.prompt_tokens if usage else None,
        usage.completion_tokens if usage else None,
    )


def _length(text: str) -> str:
    return f"{len(text)} characters"


@dataclass(slots=True)
class _Streamed:
    """The answer of a stream, chunk by chunk (the sync and async streams alike)."""

    pieces: list[str] = field(default_factory=list)
    refusal: list[str] = field(default_factory=list)
    model: str = ""
    finish: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None

    def add(self, chunk: ChatCompletionChunk) -> None:
        self.model = chunk.model or self.model
        if chunk.usage is not None:
            # The usage chunk comes last and carries no choices.
            self.prompt_tokens = chunk.usage.prompt_tokens
            self.completion_tokens = chunk.usage.completion_tokens
        for choice in chunk.choices[:1]:
            if choice.delta.content:
                self.pieces.append(choice.delta.content)
            if choice.delta.refusal:
                self.refusal.append(choice.delta.refusal)
            if choice.finish_reason is not None:
                self.finish = choice.finish_reason

    def answer(self, where: str) -> _Answer:
        if self.refusal:
            refused = "".join(self.refusal)
            raise SummarizerError("refusal", f"{where}: the model refused ({_length(refused)})")
        if self.finish is None:
            # Every OpenAI-compatible server ends a complete answer with a finish_reason; a
            # stream that stops without one was cut, and half a summary must not replace
            # the originals.
            raise SummarizerError(
                "connection",
                f"{where}: the stream ended after {sum(map(len, self.pieces))} characters "
                "without a finish_reason (connection dropped?)",
            )
        _check_finish(self.finish, where)
        return "".join(self.pieces), self.model, self.prompt_tokens, self.completion_tokens


def _check_finish(finish_reason: str | None, where: str) -> None:
    if finish_reason == "content_filter":
        raise SummarizerError("refusal", f"{where}: the answer was stopped by a content filter")
    if finish_reason == "length":
        # Kept: a cut summary still beats none, and the originals stay reloadable. Logged so
        # that an operator can raise the endpoint's output limit.
        _log.warning("autoctx: the summary from %s hit the output token limit", where)


def _pick_model(model: str | None) -> tuple[str, str]:
    """The model and where it came from."""
    if model:
        return model, "the model= argument"
    for name in ("AUTOCTX_SUMMARY_MODEL", "OPENAI_MODEL"):
        value = _env(name)
        if value is not None:
            return value, name
    return (
        DEFAULT_SUMMARY_MODEL,
        "the default: neither AUTOCTX_SUMMARY_MODEL nor OPENAI_MODEL is set",
    )


def _check_backoff(after: object, first: object, most: object) -> None:
    if isinstance(after, bool) or not isinstance(after, int) or after < 1:
        raise ConfigError(
            f"OpenAISummarizer: backoff_after must be an integer >= 1 (failed calls in a row "
            f"before the endpoint is left alone), got {after!r}"
        )
    first = _arguments.seconds("backoff_s", first, owner="OpenAISummarizer")
    most = _arguments.seconds("max_backoff_s", most, owner="OpenAISummarizer")
    if most < first:
        raise ConfigError(
            f"OpenAISummarizer: max_backoff_s ({most}) must be at least backoff_s ({first})"
        )


class _Health:
    """Whether the endpoint may be called: after `after` failed calls in a row (one, for a
    failure that retrying cannot cure) it is left alone for `first` seconds, then tried once
    again; each failure of that try doubles the wait (up to `most`), a success ends it. Meanwhile
    every call fails at once with reason ``backoff`` (the compressor's offline fallback keeps
    the bound), so a dead endpoint is not paid for at every compression.

    A failure counts only for a call that started after the last failure counted (or success):
    the requests one compression has in flight at once meet the same outage, and counting
    each of them would start the back-off at once and double it at every answer (a 4-second
    outage cost 4 minutes of offline summaries, docs/design.md §6). `check` hands each call a
    ticket, the state it started in; an answer under an older ticket reports nothing new.
    """

    def __init__(self, after: int, first: float, most: float) -> None:
        self.after = after
        self.first = first
        self.most = most
        self._lock = threading.Lock()
        self.failures = 0
        self.last: str | None = None
        #: `time.monotonic()` before which no call goes out (0: none pending).
        self.until = 0.0
        #: The current back-off (0: not backing off).
        self.wait = 0.0
        #: Bumped by every counted failure and by a success that ended failures: the ticket
        #: of the calls that start now.
        self.generation = 0

    def check(self, where: str) -> int:
        """The call's ticket, or `SummarizerError` ``backoff`` while the endpoint is left alone.
        When a back-off has run out, the first call is its one try: the others wait the
        back-off again until that try answers."""
        with self._lock:
            now = time.monotonic()
            left = self.until - now
            if left <= 0:
                if self.wait > 0.0:
                    self.until = now + self.wait  # this call is the try; the rest wait for it
                return self.generation
            failures, last, wait = self.failures, self.last, self.wait
        raise SummarizerError(
            "backoff",
            f"{where}: not called: it failed {failures} call{'s' if failures != 1 else ''} in a "
            f"row (last: {last}); retried in {left:.0f} s (back-off {wait:.0f} s, doubling up "
            f"to {self.most:.0f} s while it keeps failing)",
        )

    def failed(self, reason: str, where: str, ticket: int) -> None:
        with self._lock:
            self.last = reason
            if ticket != self.generation:
                return  # in flight beside a call whose failure was counted
            self.failures += 1
            self.generation += 1
            if self.wait == 0.0 and reason not in _PERMANENT and self.failures < self.after:
                return
            self.wait = self.first if self.wait == 0.0 else min(self.wait * 2, self.most)
            self.until = time.monotonic() + self.wait
            failures, wait = self.failures, self.wait
        _log.warning(
            "autoctx: the summarizer endpoint (%s) failed %d call%s in a row (last: %s); not "
            "calling it for %.0f s (the offline summarizer keeps the bound meanwhile)",
            where,
            failures,
            "s" if failures != 1 else "",
            reason,
            wait,
        )

    def succeeded(self) -> None:
        with self._lock:
            backing_off = self.wait > 0.0
            if self.failures:
                self.generation += 1
            self.failures, self.last, self.until, self.wait = 0, None, 0.0, 0.0
        if backing_off:
            _log.info("autoctx: the summarizer endpoint answers again; back-off ended")
