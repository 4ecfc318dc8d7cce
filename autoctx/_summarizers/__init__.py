"""The summarizer protocol and its implementations.

A summarizer turns one request (strategy, a plain-text transcript, a prompt, a character budget)
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

import os

from .._answers import check_answer
from .._summary import (
    CHARS_PER_BUDGET_TOKEN,
    SUMMARIZER_REASONS,
    AsyncSummarizer,
    Summarizer,
    SummaryRequest,
    SummaryResult,
)
from .offline import OFFLINE_MAX_CHARS, OFFLINE_MIN_CHARS, OFFLINE_MODEL, OfflineSummarizer
from .openai_endpoint import DEFAULT_DEADLINE_S, DEFAULT_SUMMARY_MODEL, OpenAISummarizer

__all__ = [
    "CHARS_PER_BUDGET_TOKEN",
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
    "check_answer",
    "default_summarizer",
    "describe_summarizer",
]


def default_summarizer() -> Summarizer:
    """The OpenAI-compatible summarizer when the environment names an endpoint, else offline."""
    summarizer = OpenAISummarizer.from_env()
    return OfflineSummarizer() if summarizer is None else summarizer


def describe_summarizer(summarizer: Summarizer, *, given: bool) -> str:
    """Which summarizer a memory uses, with which model and endpoint, and why: the line it
    logs when it opens (names and settings only, never a key)."""
    if given:
        what = (
            summarizer.describe()
            if isinstance(summarizer, OpenAISummarizer)
            else type(summarizer).__name__
        )
        return f"summaries by the summarizer passed to open(): {what}"
    if isinstance(summarizer, OpenAISummarizer):
        named = [n for n in ("OPENAI_BASE_URL", "OPENAI_API_KEY") if os.environ.get(n, "").strip()]
        return (
            f"summaries by {summarizer.describe()}; chosen because {' and '.join(named)} "
            f"{'is' if len(named) == 1 else 'are'} set (pass summarizer=OfflineSummarizer() to "
            "keep summaries local)"
        )
    return (
        "summaries by the offline summarizer (extractive, no network): neither "
        "OPENAI_BASE_URL nor OPENAI_API_KEY is set"
    )
