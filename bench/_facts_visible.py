"""The facts a model still sees, and what autoctx's fact check costs (docs/design.md §6).

Shared by agent_cost.py and bounded.py:

- `visible_shares`: of the facts planted so far, the share whose text stands verbatim in the
  input of each model call, from the first call after the first compression on; its mean, and
  its lowest value right after a compression (a call whose input lost or rewrote something the
  call before it had);
- `LossySummarizer`: a stub that drops every fact it is given (it answers one fixed sentence),
  so that the repair request and the index line are what keeps the facts in view;
- `CheckTally`: a summarizer wrapper counting the fact check's repair requests and their tokens
  (the check's own summarizer cost, apart from the summaries');
- `index_line_tokens`: the tokens of the index lines in a message autoctx wrote (what the line
  costs at each model call that sends it again).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from autoctx import SummaryRequest, SummaryResult
from autoctx._strategies.facts import INDEX_PREFIX
from autoctx._tokens import TokenCounter


@dataclass(frozen=True)
class Visible:
    """The planted facts a model saw verbatim, over the calls after the first compression."""

    #: Model calls counted (from the first after the first compression).
    calls: int
    #: Mean share of the facts planted so far that the call's input shows verbatim.
    mean: float | None
    #: Lowest share at a call right after a compression.
    after_compression_min: float | None
    #: Mean share at the calls right after a compression.
    after_compression_mean: float | None
    compressions: int


def visible_shares(
    steps: Sequence[Sequence[Hashable]],
    points: Sequence[int],
    facts_of_key: Callable[[Hashable], frozenset[str]],
    planted_before: Callable[[int], frozenset[str]],
    originals_before: Callable[[int], int],
) -> Visible:
    """`steps[k]` is the input of model call k (message keys: an int for an original of the
    workload, anything else for a message the system made), made at message index `points[k]`;
    `facts_of_key` gives the planted facts a message's text holds verbatim, `planted_before(n)`
    those of the workload's first n messages, `originals_before(n)` how many originals a call
    at n would send uncompressed."""
    shares: list[float] = []
    after: list[float] = []
    compressed = False
    previous: set[Hashable] = set()
    compressions = 0
    for keys, point in zip(steps, points, strict=False):
        present = set(keys)
        originals = sum(1 for k in keys if isinstance(k, int))
        lost = bool(previous - present)
        if not compressed and (lost or originals < originals_before(point)):
            compressed = True
        if compressed:
            planted = planted_before(point)
            if planted:
                seen: set[str] = set()
                for k in keys:
                    seen |= facts_of_key(k)
                share = len(seen & planted) / len(planted)
                shares.append(share)
                if lost:
                    compressions += 1
                    after.append(share)
        previous = present
    return Visible(
        len(shares),
        sum(shares) / len(shares) if shares else None,
        min(after) if after else None,
        sum(after) / len(after) if after else None,
        compressions,
    )


def facts_in(text: str, pattern: re.Pattern[str]) -> frozenset[str]:
    return frozenset(pattern.findall(text))


class LossySummarizer:
    """Drops every fact it is given: each answer is one fixed sentence (a summary request and
    a repair request alike), so that nothing but the fact check's index line keeps a fact of
    the summarized messages in view."""

    model = "lossy-stub"
    #: Asked to repair like any LLM summarizer (and drops the facts again).
    repairs_summaries = True

    def __init__(self) -> None:
        self.counter = TokenCounter("gpt-4o")
        self.calls = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0

    def summarize(self, request: SummaryRequest) -> SummaryResult:
        text = "The agent went on with its work; the details are offloaded."
        prompt = self.counter.count(request.prompt) + self.counter.count(request.user_content())
        completion = self.counter.count(text)
        self.calls += 1
        self.prompt_tokens += prompt
        self.completion_tokens += completion
        return SummaryResult(text, self.model, prompt, completion)


@dataclass
class CheckTally:
    """Wraps a summarizer: counts the fact check's repair requests and their tokens."""

    inner: Any
    counter: TokenCounter = field(default_factory=lambda: TokenCounter("gpt-4o"))
    repairs: int = 0
    repair_in: int = 0
    repair_out: int = 0

    @property
    def answers_shared_requests(self) -> bool:
        return getattr(self.inner, "answers_shared_requests", False) is True

    @property
    def repairs_summaries(self) -> bool:
        return getattr(self.inner, "repairs_summaries", True) is not False

    @property
    def model(self) -> str:
        return str(getattr(self.inner, "model", "summarizer"))

    def summarize(self, request: SummaryRequest) -> SummaryResult:
        result: SummaryResult = self.inner.summarize(request)
        if request.missing_facts:
            self.repairs += 1
            self.repair_in += (
                result.prompt_tokens
                if result.prompt_tokens is not None
                else self.counter.count(request.prompt) + self.counter.count(request.user_content())
            )
            self.repair_out += (
                result.completion_tokens
                if result.completion_tokens is not None
                else self.counter.count(result.text)
            )
        return result


def index_line_tokens(text: str, counter: TokenCounter) -> int:
    """Tokens of the fact check's index lines in `text` (0 for a text without one)."""
    return sum(counter.count(line) for line in text.splitlines() if line.startswith(INDEX_PREFIX))


def check_cost(
    steps: Sequence[Sequence[Hashable]], made: Mapping[Hashable, str], counter: TokenCounter
) -> int:
    """Index-line tokens sent over all model calls (each call sends its input again)."""
    cache: dict[Hashable, int] = {}
    total = 0
    for keys in steps:
        for k in keys:
            if isinstance(k, int):
                continue
            if k not in cache:
                cache[k] = index_line_tokens(made.get(k, ""), counter)
            total += cache[k]
    return total
