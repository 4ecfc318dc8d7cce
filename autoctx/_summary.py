"""What a summarizer is (the contract between the compressor and the implementations in
`autoctx._summarizers`): the request it is given, the result it returns, the two protocols
(sync and awaitable), and the machine reasons a `SummarizerError` carries."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, Protocol, runtime_checkable

from ._tags import neutralize_tags

if TYPE_CHECKING:
    # The openai package takes about half a second to import; the offline path never needs it.
    pass


_log = logging.getLogger("autoctx")


@dataclass(frozen=True, slots=True)
class SummaryRequest:
    #: 1, 4, 5, 6 or 7, the fold (docs/design.md §3).
    strategy: int
    #: The system prompt: what the summary must keep.
    prompt: str
    #: The messages to summarize, as one plain-text transcript.
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
    #: to the summarizer.
    deadline: float | None = None
    #: How the answer's tokens are counted against `token_budget` (the session's encoding, as
    #: the compressor checks the answer): a summarizer that measures its own output, such as
    #: the offline one, keeps to the budget with it. None: no such counting is offered.
    count_tokens: Callable[[str], int] | None = field(default=None, compare=False, repr=False)
    #: How many messages the request holds when several share it (S5, docs/design.md §3), else
    #: 0. The transcript then holds each under its ``=== MESSAGE k of n (c characters) ===``
    #: line, the prompt asks for each summary under its ``=== SUMMARY k ===`` line, and the
    #: compressor splits the answer and checks each summary as an answer of its own (a
    #: summarizer checks only what fails the whole answer: `check_answer`'s ``shared``).
    parts: int = 0
    #: A repair request of the fact check (docs/design.md §6): the facts, verbatim, that the
    #: summary in `transcript` left out and must state. Empty for a summary request.
    missing_facts: tuple[str, ...] = ()

    def user_content(self) -> str:
        """The user message an LLM receives: the transcript (of a repair request, the summary
        to revise and the facts it must state), then the character budget when there is one,
        then the plan hint, always last (docs/design.md §3)."""
        if self.missing_facts:
            facts = "\n".join(f"- {neutralize_tags(f)}" for f in self.missing_facts)
            parts = [
                "Summary to revise:",
                neutralize_tags(self.transcript),
                f"Facts of the original it must state, exactly as written:\n{facts}",
            ]
        else:
            parts = ["Transcript to summarize:", neutralize_tags(self.transcript)]
        if self.char_budget is not None:
            parts.append(
                f"Character budget: your answer must be at most {self.char_budget} characters "
                f"(the original content of the transcript is {self.input_chars} characters)."
            )
        if self.token_budget is not None:
            parts.append(
                f"Length budget: your answer must be at most {self.token_budget} tokens (about "
                f"{self.token_budget * CHARS_PER_BUDGET_TOKEN} characters); the transcript is "
                f"{self.input_chars} characters. Keep what matters most within it."
            )
        if self.plan_hint:
            parts.append(neutralize_tags(self.plan_hint))
        return "\n\n".join(parts)


#: Characters per token a token budget is converted at, where characters are what is measured
#: (the request's wording, the offline summarizer): a cautious figure, since code, JSON and
#: ids take fewer characters per token than prose.
CHARS_PER_BUDGET_TOKEN: Final = 3


@dataclass(frozen=True, slots=True)
class SummaryResult:
    text: str
    model: str
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    latency_ms: float = 0.0


@runtime_checkable
class Summarizer(Protocol):
    """Anything with this method can summarize for autoctx. The independent ranges of one pass
    are summarized concurrently (`AutoContextConfig.summarizer_concurrency`), so the method may
    be called from several threads at once; set that to 1 for one that cannot be.

    A summarizer that answers a request shared by several messages (``request.parts > 0``) as
    its prompt asks, one summary under each message's header, says so with a class attribute
    ``answers_shared_requests = True`` (`answers_shared_requests`): S5 then sends several large
    messages in one request (docs/design.md §3). `OpenAISummarizer` and `OfflineSummarizer` do;
    any other gets one request per message, as it always did."""

    def summarize(self, request: SummaryRequest) -> SummaryResult: ...


def answers_shared_requests(summarizer: object) -> bool:
    """Whether `summarizer` declared that it answers shared requests (see `Summarizer`): a
    summarizer written before they existed would answer one with a single summary, and every
    message of it would fail."""
    return getattr(summarizer, "answers_shared_requests", False) is True


@runtime_checkable
class AsyncSummarizer(Protocol):
    """A summarizer that can also be awaited: `AsyncAutoContextMemory` then waits for the LLM
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
    "model_not_found": "HTTP 404: the endpoint does not serve the model (or has no chat "
    "completions at that URL); the detail names the setting to change",
    "auth": "HTTP 401 or 403: the endpoint refused the API key; the detail names the setting "
    "to change",
    "backoff": "not called: the endpoint kept failing and is retried after a back-off; the "
    "detail says why and when",
    "connection": "the connection failed, or a stream ended before the answer was complete",
    "bad_response": "the endpoint answered with something that is not a chat completion",
    "api_error": "the endpoint reported an error inside a stream, or the client failed",
    "empty": "the answer is empty or only whitespace (of a request shared by several messages: "
    "this message's summary is missing or empty)",
    "refusal": "the model refused (refusal set, or finish_reason content_filter)",
    "tag_in_answer": "the answer contains an offload tag or the CONTEXT_OFFLOAD marker, or a "
    "look-alike of either (any case, compatibility forms, Cyrillic or Greek look-alike letters)",
    "bad_answer": "the answer holds what PostgreSQL text cannot store (NUL, a lone surrogate), "
    "or, of a request shared by several messages, more than one summary of this message",
}
