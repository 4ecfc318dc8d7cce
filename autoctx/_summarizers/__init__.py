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

import logging

from .answers import check_answer
from .offline import OFFLINE_MAX_CHARS, OFFLINE_MIN_CHARS, OFFLINE_MODEL, OfflineSummarizer
from .openai_endpoint import DEFAULT_DEADLINE_S, DEFAULT_SUMMARY_MODEL, OpenAISummarizer
from .protocol import (
    CHARS_PER_BUDGET_TOKEN,
    SUMMARIZER_REASONS,
    AsyncSummarizer,
    Summarizer,
    SummaryRequest,
    SummaryResult,
)

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
]

_log = logging.getLogger("autoctx")


def default_summarizer() -> Summarizer:
    """The OpenAI-compatible summarizer when the environment names an endpoint, else offline."""
    summarizer = OpenAISummarizer.from_env()
    if summarizer is None:
        _log.info("autoctx: no OPENAI_BASE_URL or OPENAI_API_KEY set; using the offline summarizer")
        return OfflineSummarizer()
    return summarizer
