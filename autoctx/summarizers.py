"""The summariser protocol and its implementations.

A summariser turns one request (strategy, a plain-text transcript, a prompt, a character budget)
into text. It never sees raw tool_call/tool messages, holds no database lock and knows nothing of
sessions. Failures raise `SummarizerError` with a short machine reason (one of
`SUMMARIZER_REASONS`: ``timeout``, ``rate_limited``, ``http_error``, ``connection``,
``bad_response``, ``api_error``, ``empty``, ``refusal``, ``tag_in_answer``, ``bad_answer``), which
the compressor records on a `failed` event.

Two implementations: `OpenAISummarizer` (any OpenAI-compatible Chat Completions endpoint,
through the official client, plain or streaming) and `OfflineSummarizer` (extractive, no
network). `default_summarizer()` picks the first when the environment names an endpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import random
import re
import socket
import threading
import time
import unicodedata
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeAlias, runtime_checkable

from .errors import ConfigError, SummarizerError
from .transcript import OFFLOAD_MARKER, OFFLOAD_TAG_RE, neutralise_tags

if TYPE_CHECKING:
    # The openai package takes about half a second to import; the offline path never needs it.
    import openai
    from openai.types.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionMessageParam

__all__ = [
    "DEFAULT_DEADLINE_S",
    "DEFAULT_SUMMARY_MODEL",
    "OFFLINE_MAX_CHARS",
    "OFFLINE_MIN_CHARS",
    "OFFLINE_MODEL",
    "SUMMARIZER_REASONS",
    "AsyncSummarizer",
    "OfflineSummarizer",
    "OpenAISummarizer",
    "Summarizer",
    "SummaryRequest",
    "SummaryResult",
    "default_summarizer",
]

_log = logging.getLogger("autoctx")


@dataclass(frozen=True, slots=True)
class SummaryRequest:
    #: 1, 4, 5, 6 or 7, the fold (SPEC.md section 3).
    strategy: int
    #: The system prompt: what the summary must keep.
    prompt: str
    #: The messages to summarise, as one plain-text transcript.
    transcript: str
    #: Characters of the original (text, tool-input JSON and outputs).
    input_chars: int
    #: The most characters the answer may have (S6 states it in the request).
    char_budget: int | None = None
    #: Appended as the last part of the request when a plan is attached to the session.
    plan_hint: str | None = None
    #: The most tokens the answer may have (the fold states it in the request; an answer over
    #: it, beyond a small margin, is not a summary).
    token_budget: int | None = None
    #: The `time.monotonic()` instant the answer must be in by, every retry and a slow stream
    #: included (the compressor sets it from the config's deadlines); None leaves the deadline
    #: to the summariser.
    deadline: float | None = None

    def user_content(self) -> str:
        """The user message an LLM receives: the transcript, then the character budget when
        there is one, then the plan hint, always last (SPEC.md section 3)."""
        parts = ["Transcript to summarise:", neutralise_tags(self.transcript)]
        if self.char_budget is not None:
            parts.append(
                f"Character budget: your answer must be at most {self.char_budget} characters "
                f"(the original content of the transcript is {self.input_chars} characters)."
            )
        if self.token_budget is not None:
            parts.append(
                f"Length budget: your answer must be at most {self.token_budget} tokens (about "
                f"{self.token_budget * _CHARS_PER_BUDGET_TOKEN} characters); the transcript is "
                f"{self.input_chars} characters. Keep what matters most within it."
            )
        if self.plan_hint:
            parts.append(neutralise_tags(self.plan_hint))
        return "\n\n".join(parts)


#: Characters per token a token budget is converted at, where characters are what is measured
#: (the request's wording, the offline summariser): a cautious figure, since code, JSON and
#: ids take fewer characters per token than prose.
_CHARS_PER_BUDGET_TOKEN: Final = 3


@dataclass(frozen=True, slots=True)
class SummaryResult:
    text: str
    model: str
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    latency_ms: float = 0.0


@runtime_checkable
class Summarizer(Protocol):
    """Anything with this method can summarise for autoctx. The independent ranges of one pass
    are summarised concurrently (`AutoContextConfig.summarizer_concurrency`), so the method may
    be called from several threads at once; set that to 1 for one that cannot be."""

    def summarize(self, request: SummaryRequest) -> SummaryResult: ...


@runtime_checkable
class AsyncSummarizer(Protocol):
    """A summariser that can also be awaited: `AsyncAutoContextMemory` then waits for the LLM
    on the event loop instead of holding a worker thread for the whole call."""

    def summarize(self, request: SummaryRequest) -> SummaryResult: ...

    async def asummarize(self, request: SummaryRequest) -> SummaryResult: ...


#: The machine reasons a `SummarizerError` carries, with what each means.
SUMMARIZER_REASONS: Final[Mapping[str, str]] = {
    "timeout": "the endpoint did not answer (or stopped streaming) within the timeout",
    "deadline": "the call's overall deadline passed (every attempt, the waits between them and "
    "a slow stream included)",
    "rate_limited": "HTTP 429; the detail carries the Retry-After value when the server sent one",
    "http_error": "any other HTTP error status; the detail carries the status",
    "connection": "the connection failed, or a stream ended before the answer was complete",
    "bad_response": "the endpoint answered with something that is not a chat completion",
    "api_error": "the endpoint reported an error inside a stream, or the client failed",
    "empty": "the answer is empty or only whitespace",
    "refusal": "the model refused (refusal set, or finish_reason content_filter)",
    "tag_in_answer": "the answer contains an offload tag or the CONTEXT_OFFLOAD marker, or a "
    "look-alike of either (any case, compatibility forms, Cyrillic or Greek look-alike letters)",
    "bad_answer": "the answer holds what PostgreSQL text cannot store (NUL, a lone surrogate)",
}


# ---------------------------------------------------------------------------------------------
# Offline, extractive
# ---------------------------------------------------------------------------------------------

#: Without a budget, the offline summary aims at a quarter of the input, between these bounds:
#: small enough that a large input always shrinks, large enough to hold the key lines.
OFFLINE_MAX_CHARS: Final = 4000
OFFLINE_MIN_CHARS: Final = 200
OFFLINE_MODEL: Final = "autoctx-offline"

# An entry of `render_transcript`: a bracketed header naming a role or a tool result.
_ENTRY_RE: Final = re.compile(
    r"^\[(?P<header>(?:system|user|assistant|tool)\b[^\]\n]{0,400}|tool result [^\]\n]{1,400})\]"
    r"(?: |$)",
    re.MULTILINE,
)
_ERROR_RE: Final = re.compile(
    r"error|exception|traceback|fail|fatal|panic|denied|refused|not found|no such|cannot|"
    r"can't|unable|timed? ?out|abort|invalid|\bE\d{3,}\b|exit (?:code|status) [1-9]|"
    r"status(?: code)?[ :=]+[45]\d\d|\b[45]\d\d (?:[A-Z][a-z]+ ?)+",
    re.IGNORECASE,
)
# Tokens worth keeping even when the line around them is dropped or cut.
_FACT_RE: Final = re.compile(
    r"https?://[^\s\"'<>)\]]+"  # URLs
    r"|\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"  # uuids
    r"|(?<![\w/.-])(?:~|\.{1,2})?/?(?:[\w.@-]+/)+[\w.@-]+"  # paths with a slash
    r"|\b[\w-]+\.(?:py|js|ts|tsx|json|ya?ml|toml|ini|cfg|conf|md|txt|sql|sh|log|html|css|go|rs"
    r"|java|c|h|cpp|rb|php|lock|env|csv|xml)\b"  # file names
    r"|\b[\w.-]+=[^\s,;\"']+"  # key=value
    r"|\b(?:id|port|pid|status|code|version|count|size)[\s:=#]+[\w.:/-]+"  # named values
    r"|\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b"  # hex ids and hashes
    r"|\b(?:call|toolu|tool|run|job|task|req|request|msg|session|chatcmpl)[_-][\w-]+",  # ids
    re.IGNORECASE,
)
_NUMBER_RE: Final = re.compile(r"\d")
_LINE_CHARS: Final = 200
_ERROR_LINE_CHARS: Final = 300
_ARGS_CHARS: Final = 400
_FACTS_PER_ENTRY: Final = 12
_ERROR_CONTEXT_LINES: Final = 6
_SCAN_CHARS: Final = 4000
_FACT_SCAN_CHARS: Final = 200_000

# Priorities of the candidate lines, most important first. Tool calls come first, but only
# up to half the budget (`_CALL_SHARE`): the calls beyond it wait behind the errors and the
# first and last lines of the results (`_P_MORE_CALLS`).
_P_CALL, _P_ERROR, _P_EDGE, _P_MORE_CALLS, _P_FACT_LINE, _P_FACTS, _P_NUMBER = range(7)
_CALL_SHARE: Final = 0.5


@dataclass(slots=True)
class _Entry:
    header: str
    lines: list[str]


@dataclass(slots=True)
class _Candidate:
    priority: int
    entry: int
    #: Index of the body line; -1 is the header line (which, for a call, holds its arguments).
    line: int
    text: str
    #: Rank among the candidates of the same priority (and entry): the budget goes round the
    #: entries (every result's first error before any result's second) instead of letting
    #: the first long result eat it all.
    order: int = 0


def _clip(text: str, limit: int) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 6].rstrip() + " [...]"


def _split_entries(transcript: str) -> list[_Entry]:
    starts = list(_ENTRY_RE.finditer(transcript))
    if not starts:
        # Not a transcript of `render_transcript` (a caller may build its own): one body.
        return [_Entry("", transcript.splitlines())]
    entries: list[_Entry] = []
    if transcript[: starts[0].start()].strip():
        entries.append(_Entry("", transcript[: starts[0].start()].splitlines()))
    for i, match in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(transcript)
        entries.append(_Entry(match.group("header"), transcript[match.end() : end].splitlines()))
    return entries


def _dedupe(lines: Iterable[str]) -> list[str]:
    """Non-blank lines, consecutive repeats folded into one line with a count."""
    out: list[str] = []
    previous: str | None = None
    repeats = 0
    for raw in lines:
        line = raw.rstrip()
        if not line.strip():
            continue
        if line == previous:
            repeats += 1
            continue
        if repeats:
            out[-1] += f" (x{repeats + 1})"
        out.append(line)
        previous, repeats = line, 0
    if repeats:
        out[-1] += f" (x{repeats + 1})"
    return out


def _call_candidate(index: int, entry: _Entry, args_chars: int) -> _Candidate:
    # The call itself (tool name, id, exact arguments) on one line: the arguments are JSON,
    # whose line breaks carry nothing.
    args = " ".join(line.strip() for line in entry.lines if line.strip())
    entry.lines = []
    text = f"[{entry.header}] {_clip(args, args_chars)}" if args else f"[{entry.header}]"
    return _Candidate(_P_CALL, index, -1, text)


def _body_candidates(index: int, entry: _Entry) -> list[_Candidate]:
    lines = entry.lines = _dedupe(entry.lines)
    # No candidate for the header alone: it comes with the first of its lines that is kept.
    found: list[_Candidate] = []
    kept_text: list[str] = []
    error_context = 0
    for j, line in enumerate(lines):
        # Classify on the head of a line: a kept line is clipped anyway, and scanning a
        # megabyte of minified JSON for markers costs more than it finds.
        head = line[:_SCAN_CHARS]
        if _ERROR_RE.search(head):
            priority, limit = _P_ERROR, _ERROR_LINE_CHARS
            error_context = _ERROR_CONTEXT_LINES
        elif error_context and line[:1].isspace():
            # The indented lines after an error (traceback frames, details) say where it
            # happened; they count as part of the error.
            priority, limit = _P_ERROR, _ERROR_LINE_CHARS
            error_context -= 1
        else:
            error_context = 0
            if j in (0, len(lines) - 1):
                priority, limit = _P_EDGE, _LINE_CHARS
            elif _FACT_RE.search(head):
                priority, limit = _P_FACT_LINE, _LINE_CHARS
            elif _NUMBER_RE.search(head):
                priority, limit = _P_NUMBER, _LINE_CHARS
            else:
                continue
        text = _clip(line, limit)
        found.append(_Candidate(priority, index, j, text))
        if priority <= _P_EDGE:
            kept_text.append(text)
    # Facts hidden in what the important lines leave out (long JSON, dropped middle lines).
    kept = "\n".join(kept_text)
    facts: list[str] = []
    for match in _FACT_RE.finditer("\n".join(lines)[:_FACT_SCAN_CHARS]):
        fact = _clip(match.group(0).rstrip(".,:"), 120)
        if len(fact) > 2 and fact not in kept and fact not in facts:
            facts.append(fact)
            if len(facts) == _FACTS_PER_ENTRY:
                break
    if facts:
        found.append(_Candidate(_P_FACTS, index, len(lines), "facts: " + ", ".join(facts)))
    ranks: dict[int, int] = {}
    for c in found:
        c.order = ranks.get(c.priority, 0)
        ranks[c.priority] = c.order + 1
    return found


def _sort_key(c: _Candidate, entries: int) -> tuple[int, int, int, int, int]:
    # Within a priority and rank, entries are taken from both ends of the transcript inward:
    # what the work started with and what it came to matter most.
    return (c.priority, c.order, min(c.entry, entries - 1 - c.entry), c.entry, c.line)


def _demote_calls(calls: list[_Candidate], budget: int, entries: int) -> None:
    """Demote the calls beyond the calls' share of the budget (taken from both ends)."""
    used = 0
    for c in sorted(calls, key=lambda c: _sort_key(c, entries)):
        used += len(c.text) + 1
        if used > budget * _CALL_SHARE:
            c.priority = _P_MORE_CALLS


def _gap(count: int, one: str = "line", many: str = "lines") -> str:
    return f"  [... {count} {one if count == 1 else many}]"


def _render(entries: list[_Entry], chosen: Mapping[tuple[int, int], str]) -> str:
    """The chosen lines in transcript order, each entry under its header, gaps marked."""
    by_entry: dict[int, list[int]] = {}
    for entry_index, line_index in chosen:
        by_entry.setdefault(entry_index, []).append(line_index)
    out: list[str] = []
    previous_entry = -1
    for i in sorted(by_entry):
        if i - previous_entry > 1:
            out.append(_gap(i - previous_entry - 1, "entry", "entries"))
        previous_entry = i
        entry = entries[i]
        if (i, -1) in chosen:
            out.append(chosen[(i, -1)])
        elif entry.header:
            out.append(f"[{entry.header}]")
        previous = -1
        for j in sorted(line for line in by_entry[i] if line >= 0):
            # Index len(lines) is the facts line, which stands after the last body line.
            position = min(j, len(entry.lines))
            if position - previous > 1:
                out.append(_gap(position - previous - 1))
            out.append("  " + chosen[(i, j)])
            previous = position
        if len(entry.lines) - previous > 1:
            out.append(_gap(len(entry.lines) - previous - 1))
    if previous_entry >= 0 and len(entries) - previous_entry > 1:
        out.append(_gap(len(entries) - previous_entry - 1, "entry", "entries"))
    return "\n".join(out)


class OfflineSummarizer:
    """An extractive summariser: deterministic, no network, no model.

    It keeps, in order of importance: the tool calls (name, id, exact arguments; the first
    and the latest first when they do not all fit), every error line with the indented
    lines under it, the first and last line of each message or result, lines that carry
    paths, URLs, ids or key=value settings, a list of such facts found in what it drops, and
    then whatever else holds numbers. Gaps are marked ``[... N lines]``. It stays within the
    request's ``char_budget``, or without one within a quarter of the input (between
    `OFFLINE_MIN_CHARS` and `OFFLINE_MAX_CHARS`), so that a large input always shrinks.
    Offload tags it copies become ``[offloaded context <uuid>]``.
    """

    model: str = OFFLINE_MODEL

    def budget_for(self, request: SummaryRequest) -> int:
        """The most characters the summary of `request` may have."""
        if request.char_budget is not None:
            return max(1, request.char_budget)
        if request.token_budget is not None:
            # A quarter of the input, as without a budget, but never over the budget.
            quarter = max(OFFLINE_MIN_CHARS, request.input_chars // 4)
            return max(1, min(quarter, request.token_budget * _CHARS_PER_BUDGET_TOKEN))
        return min(OFFLINE_MAX_CHARS, max(OFFLINE_MIN_CHARS, request.input_chars // 4))

    def summarize(self, request: SummaryRequest) -> SummaryResult:
        started = time.perf_counter()
        text = _extract(neutralise_tags(request.transcript), self.budget_for(request))
        return SummaryResult(
            text=text,
            model=self.model,
            latency_ms=(time.perf_counter() - started) * 1000,
        )


def _extract(transcript: str, budget: int) -> str:
    entries = _split_entries(transcript)
    total_lines = sum(len(e.lines) + (1 if e.header else 0) for e in entries)
    is_call = ["-> tool call " in entry.header for entry in entries]
    # Long arguments (a file being written) are clipped harder when many calls share a small
    # budget, so that more calls keep their names and the start of their arguments.
    args_chars = max(80, min(_ARGS_CHARS, budget // (2 * max(1, sum(is_call)))))
    calls: list[_Candidate] = []
    candidates: list[_Candidate] = []
    for i, entry in enumerate(entries):
        if is_call[i]:
            calls.append(_call_candidate(i, entry, args_chars))
        else:
            candidates.extend(_body_candidates(i, entry))
    _demote_calls(calls, budget, len(entries))
    ranked = sorted(calls + candidates, key=lambda c: _sort_key(c, len(entries)))
    # Greedy on an estimate (a line, its indent, the header it drags in, a gap marker); the
    # rendering below settles the truth and drops the least important lines while it
    # overshoots.
    chosen: dict[tuple[int, int], str] = {}
    used = len("[offline extract: 9999 of 99999 lines kept]")
    headed: set[int] = set()
    for c in ranked:
        cost = len(c.text) + 1 if c.line == -1 else len(c.text) + 3 + 12
        if c.entry not in headed and c.line != -1 and entries[c.entry].header:
            cost += len(entries[c.entry].header) + 3
        if used + cost > budget:
            continue
        used += cost
        chosen[(c.entry, c.line)] = c.text
        headed.add(c.entry)
    droppable = [(c.entry, c.line) for c in reversed(ranked) if (c.entry, c.line) in chosen]
    while True:
        head = f"[offline extract: {len(chosen)} of {total_lines} lines kept]"
        body = _render(entries, chosen)
        out = f"{head}\n{body}" if body else head
        if len(out) <= budget or not droppable:
            break
        del chosen[droppable.pop(0)]
    if len(out) > budget:
        # Only when even the note does not fit (a budget of a few characters).
        out = out[:budget]
    out = neutralise_tags(out)
    return out if out.strip() else "(nothing to summarise)"[:budget]


# ---------------------------------------------------------------------------------------------
# OpenAI-compatible endpoint
# ---------------------------------------------------------------------------------------------

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
    ) -> None:
        self.model = (
            model or _env("AUTOCTX_SUMMARY_MODEL") or _env("OPENAI_MODEL") or DEFAULT_SUMMARY_MODEL
        )
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
            return
        import openai

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
        """A summariser for the endpoint the environment names, or None when it names none."""
        if _env("OPENAI_BASE_URL") is None and _env("OPENAI_API_KEY") is None:
            return None
        return cls()

    def __repr__(self) -> str:
        base_url = str(self.client.base_url).rstrip("/")
        return f"OpenAISummarizer(model={self.model!r}, base_url={base_url!r})"

    def close(self) -> None:
        """Close the HTTP client, when this summariser created it."""
        if self._owns_client:
            self.client.close()

    # -- one call, sync -------------------------------------------------------------------------

    def summarize(self, request: SummaryRequest) -> SummaryResult:
        import openai

        call = self._begin(request, self.client.timeout, self.client.max_retries)
        while True:
            try:
                answer = self._attempt(call)
            except openai.OpenAIError as err:
                wait = call.after(err)
            else:
                return call.result(answer, self.model)
            # Raised outside the handler, so that the client's error (whose text may quote
            # what the server sent) is neither its cause nor its context.
            if isinstance(wait, SummarizerError):
                raise wait
            time.sleep(wait)

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
        if self._async_given is not None:
            return await self._acall(self._async_given, request)
        if self._async_settings is None:
            return await asyncio.to_thread(self.summarize, request)
        import openai

        # A client of its own per call: pooled async connections belong to the event loop that
        # opened them, and a summariser may serve several loops (one per `asyncio.run`). One
        # connection per summary costs little beside the seconds the summary takes.
        async with openai.AsyncOpenAI(**self._async_settings) as client:
            return await self._acall(client, request)

    async def _acall(self, client: openai.AsyncOpenAI, request: SummaryRequest) -> SummaryResult:
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
            else:
                return call.result(answer, self.model)
            if isinstance(wait, SummarizerError):
                raise wait  # outside the handler, as in `summarize`
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
    """One summariser call: its request, its deadline and its attempts (sync and async alike).

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
            text=check_answer(text),
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


#: A refusal written as plain text (no `refusal` field, finish_reason "stop"), as many
#: OpenAI-compatible servers send one: short, and opening with an apology or an "I can't".
#: A summary of a transcript does not open that way; a long answer that does is kept.
_REFUSAL_MAX_CHARS: Final = 400
_APOSTROPHE: Final = "['\u2019]"  # typed or typographic
_REFUSAL_RE: Final = re.compile(
    rf"^\W*(?:(?:i{_APOSTROPHE}?m|i\s+am)\s+(?:so\s+|very\s+|really\s+)?sorry|sorry\b"
    r"|(?:my\s+)?apologies|i\s+apologi[sz]e|as\s+an\s+ai\b"
    rf"|(?:i\s+(?:can(?:no|{_APOSTROPHE})t|won{_APOSTROPHE}?t|will\s+not)"
    rf"|(?:i{_APOSTROPHE}?m|i\s+am)\s+(?:not\s+able|unable)\s+to)"
    r"\s+(?:help|assist|comply|provide|do\s+that|summari[sz]e|fulfil))",
    re.IGNORECASE,
)


#: Latin look-alikes of the letters of the marker, from the Cyrillic and Greek alphabets (after
#: NFKC and casefolding), so that a model cannot smuggle a tag past the check by accident.
_LOOKALIKES: Final = str.maketrans(
    {
        "\u0430": "a", "\u03b1": "a",  # Cyrillic a, Greek alpha
        "\u0441": "c", "\u03f2": "c",  # Cyrillic es, Greek lunate sigma
        "\u0501": "d",  # Cyrillic komi de
        "\u0435": "e", "\u03b5": "e",  # Cyrillic ie, Greek epsilon
        "\u04cf": "l", "\u0456": "l", "\u03b9": "l",  # Cyrillic palochka and i, Greek iota
        "\u043e": "o", "\u03bf": "o", "\u03c3": "o",  # Cyrillic o, Greek omicron and sigma
        "\u0442": "t", "\u03c4": "t",  # Cyrillic te, Greek tau
        "\u0445": "x", "\u03c7": "x",  # Cyrillic ha, Greek chi
        "\u043f": "n", "\u03b7": "n",  # Cyrillic pe, Greek eta
    }
)  # fmt: skip
_NOT_MARKER_CHARS: Final = re.compile(r"[^a-z0-9_]+")


def _skeleton(text: str) -> str:
    """`text` in the form the marker check compares: compatibility forms folded (NFKC), lower
    case, look-alike letters mapped to Latin, anything but letters, digits and underscores a
    space (so "context offloading" stays prose, and a look-alike "CONTEXT_OFFLOAD" does not)."""
    folded = unicodedata.normalize("NFKC", text).casefold().translate(_LOOKALIKES)
    return _NOT_MARKER_CHARS.sub(" ", folded)


_MARKER_SKELETON: Final = _skeleton(OFFLOAD_MARKER)


def check_answer(text: str) -> str:
    """The answer, stripped, or `SummarizerError` when it cannot become a summary.

    The compressor applies it to every summariser's answer, a caller's own included.
    """
    answer = text.strip()
    if not answer:
        raise SummarizerError(
            "empty", f"the answer is {'empty' if not text else 'only whitespace'}"
        )
    # An answer is data, never trusted (SPEC.md section 6): what the database cannot store
    # becomes a failed event, not a database error at commit. No excerpt of it is quoted.
    if "\x00" in answer:
        raise SummarizerError(
            "bad_answer", "the answer holds a NUL character, which PostgreSQL text cannot store"
        )
    try:
        answer.encode("utf-8")
    except UnicodeEncodeError:
        raise SummarizerError(
            "bad_answer", "the answer holds a lone UTF-16 surrogate, which is not valid text"
        ) from None
    if OFFLOAD_TAG_RE.search(answer) or _MARKER_SKELETON in _skeleton(answer):
        raise SummarizerError(
            "tag_in_answer",
            "the answer contains an offload tag or the CONTEXT_OFFLOAD marker (or a look-alike "
            "of it); a summary must not carry one",
        )
    if len(answer) <= _REFUSAL_MAX_CHARS and _REFUSAL_RE.match(answer):
        raise SummarizerError(
            "refusal", f"the answer reads as a refusal ({len(answer)} characters)"
        )
    return answer


def default_summarizer() -> Summarizer:
    """The OpenAI-compatible summariser when the environment names an endpoint, else offline."""
    summarizer = OpenAISummarizer.from_env()
    if summarizer is None:
        _log.info("autoctx: no OPENAI_BASE_URL or OPENAI_API_KEY set; using the offline summariser")
        return OfflineSummarizer()
    return summarizer
