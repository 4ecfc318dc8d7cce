"""The drivers of the compression loop: they execute its effects (`autoctx._effects`) against
a store and the summarizers, the way psycopg's `waiting.py` drives its `generators.py`.

Between two requests to the configured summarizer, the loop's database effects run as one
step, inside `guard` (the memory's lock) when one is given, so that no other call of the
memory runs beside a step; the summarizer is asked outside it, so that the memory's other
calls go on while the LLM writes (docs/design.md §2). Once `stop` is set, no further step
runs: the loop is closed where it waits, with the answers in flight discarded (nothing of
them is written); the events committed so far are the caller's.

- `drive` runs the steps in the calling thread and asks the summarizer for a batch's ranges
  concurrently, at most `concurrency` at once, from a few more threads.
- `adrive` runs each step in a worker thread and awaits an `AsyncSummarizer` on the event
  loop, bounded by each request's deadline, holding no thread and no lock while it writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar

from ._effects import (
    FALLBACK_MODEL,
    Answers,
    ApplyReplacements,
    CompressionStore,
    Effect,
    Effects,
    LoadMessages,
    ReadSnapshot,
    ReadTotals,
    ReadUndone,
    RecordEvent,
    Settle,
    Summarize,
)
from ._errors import SummarizerError
from ._summary import AsyncSummarizer, Summarizer, SummaryRequest, SummaryResult

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class _Done(Generic[_T]):
    """The loop ended (a `StopIteration` cannot cross a worker thread's future, so the end
    comes back as a value); `stopped`: closed by `stop`, with no value."""

    value: _T | None
    stopped: bool = False


def drive(
    steps: Effects[_T],
    store: CompressionStore,
    summarizer: Summarizer,
    fallback: Summarizer,
    *,
    concurrency: int,
    guard: AbstractContextManager[object] | None = None,
    stop: threading.Event | None = None,
) -> _T | None:
    """Run the loop to its end in this thread; its value, or None when `stop` ended it."""
    held = guard if guard is not None else contextlib.nullcontext()
    with contextlib.closing(steps):
        with held:
            step = _step(steps, None, store, fallback, stop)
        while isinstance(step, Summarize):
            answers = _answers(summarizer, step.requests, concurrency)
            with held:
                step = _step(steps, answers, store, fallback, stop)
        return step.value


async def adrive(
    steps: Effects[_T],
    store: CompressionStore,
    summarizer: AsyncSummarizer,
    fallback: Summarizer,
    *,
    concurrency: int,
    guard: AbstractContextManager[object] | None = None,
    stop: threading.Event | None = None,
) -> _T | None:
    """`drive` for asyncio. Cancelled, it lets a step in progress end (its effects are units
    of work either way) and writes nothing of the answers in flight."""
    held = guard if guard is not None else contextlib.nullcontext()

    def advance(answers: Answers | None) -> Summarize | _Done[_T]:
        with held:
            return _step(steps, answers, store, fallback, stop)

    with contextlib.closing(steps):
        step = await _step_in_thread(advance, None)
        while isinstance(step, Summarize):
            limit = asyncio.Semaphore(concurrency)
            answers: Answers = list(
                await asyncio.gather(
                    *(_awaited_answer(summarizer, r, limit) for r in step.requests)
                )
            )
            step = await _step_in_thread(advance, answers)
        return step.value


def _step(
    steps: Effects[_T],
    sent: Answers | None,
    store: CompressionStore,
    fallback: Summarizer,
    stop: threading.Event | None,
) -> Summarize | _Done[_T]:
    """Resume the loop with `sent` and execute its effects up to its next request to the
    configured summarizer, or to its end. Once `stop` is set the loop is closed where it
    waits, so that nothing more of it runs. An effect that raises raises inside the loop, at
    the `yield` that asked for it, as a direct call would have."""
    if stop is not None and stop.is_set():
        steps.close()
        return _Done(None, stopped=True)
    try:
        effect = steps.send(sent)  # None starts the generator
        while True:
            if isinstance(effect, Summarize) and not effect.fallback:
                return effect
            try:
                result = _execute(effect, store, fallback)
            except Exception as exc:
                effect = steps.throw(exc)
            else:
                effect = steps.send(result)
    except StopIteration as done:
        return _Done(done.value)


def _execute(effect: Effect[Any], store: CompressionStore, fallback: Summarizer) -> object:
    """One effect other than a request to the configured summarizer."""
    if isinstance(effect, ReadSnapshot):
        return store.snapshot()
    if isinstance(effect, ReadTotals):
        return store.totals()
    if isinstance(effect, LoadMessages):
        return store.load_messages(effect.ids)
    if isinstance(effect, ApplyReplacements):
        return store.apply(
            effect.replacements,
            reason=effect.reason,
            config=effect.config,
            seen_version=effect.seen_version,
        )
    if isinstance(effect, RecordEvent):
        return store.record_event(
            strategy=effect.strategy,
            status=effect.status,
            reason=effect.reason,
            replaced_ids=effect.replaced_ids,
            error=effect.error,
            config=effect.config,
            model=effect.model,
            prompt_tokens=effect.prompt_tokens,
            completion_tokens=effect.completion_tokens,
            latency_ms=effect.latency_ms,
        )
    if isinstance(effect, Settle):
        store.settle(effect.version)
        return None
    if isinstance(effect, ReadUndone):
        return store.undone_ranges()
    if isinstance(effect, Summarize):
        # Offline and local, so in the step itself; recorded under the fallback's own name.
        return [_fallback_answer(fallback, request) for request in effect.requests]
    raise TypeError(f"the compression loop yielded {effect!r}, which no driver executes")


def _fallback_answer(fallback: Summarizer, request: SummaryRequest) -> SummaryResult | Exception:
    try:
        return replace(fallback.summarize(request), model=FALLBACK_MODEL)
    except Exception as exc:  # handed to the loop, which records it (or raises, when strict)
        return exc


def _answers(
    summarizer: Summarizer, batch: tuple[SummaryRequest, ...], concurrency: int
) -> Answers:
    """The summarizer's answers to a batch, at most `concurrency` at once."""
    summarize = summarizer.summarize
    workers = min(len(batch), concurrency)
    if workers <= 1:
        return [_answer_of(summarize, request) for request in batch]
    with ThreadPoolExecutor(workers, thread_name_prefix="autoctx-summary") as pool:
        return list(pool.map(lambda request: _answer_of(summarize, request), batch))


async def _step_in_thread(
    advance: Callable[[Answers | None], Summarize | _Done[_T]], answers: Answers | None
) -> Summarize | _Done[_T]:
    """One step in a worker thread. A cancellation waits for the step to end: the loop must
    not be closed while a thread is still running it."""
    step = asyncio.ensure_future(asyncio.to_thread(advance, answers))
    try:
        return await asyncio.shield(step)
    except asyncio.CancelledError:
        with contextlib.suppress(BaseException):
            await step
        raise


def _answer_of(
    summarize: Callable[[SummaryRequest], SummaryResult], request: SummaryRequest
) -> SummaryResult | Exception:
    try:
        return summarize(request)
    except Exception as exc:  # handed to the loop, which records it (or raises, when strict)
        return exc


async def _awaited_answer(
    summarizer: AsyncSummarizer, request: SummaryRequest, limit: asyncio.Semaphore
) -> SummaryResult | Exception:
    async with limit:
        left = None if request.deadline is None else max(0.0, request.deadline - time.monotonic())
        try:
            # The deadline holds even for a caller's async summarizer that knows nothing of it.
            async with asyncio.timeout(left):
                return await summarizer.asummarize(request)
        except TimeoutError:
            return SummarizerError("deadline", "the summarizer did not answer within the deadline")
        except Exception as exc:
            return exc
