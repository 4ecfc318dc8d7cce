"""When a memory compresses and when a call waits: the window policy, written once.

A memory in background mode (`background=True` or ``"worker"``) never lets the agent's next
model call read a working context at the window (`max_tokens` tokens or more), and waits for
nothing else (docs/design.md §5): under the window a call goes on (at the trigger, with
``background=True``, after starting a background compression); at the window it waits for the
compression under way, only until one of its commits brings the context under the window, and
then compresses here whatever is still over, holding the claim a worker takes. Without
background mode, `compress_if_needed()` waits for a compression started with
`compress_in_background()` and compresses in the call.

The policy decides and the memories act: each policy is a generator of `Step`s that the sync
memory runs in its thread (`run`) and the async memory awaits (`arun`), so the rule exists once
and the two memories differ only in how they wait (a thread's future or an asyncio task).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any, Generic, TypeAlias, TypeVar

from ._background import BackgroundMode, BackgroundState
from ._config import AutoContextConfig
from ._events import Event
from ._store.rows import SessionInfo
from ._trigger import is_due, masking_due

_R = TypeVar("_R")


@dataclass(frozen=True, slots=True)
class ReadTotals:
    """Re-read the session row. Answer: its `SessionInfo`."""


@dataclass(frozen=True, slots=True)
class StartBackground:
    """Start a background compression (one already running is left to run). Answer: None."""


@dataclass(frozen=True, slots=True)
class BackgroundRunning:
    """Whether this memory's background compression is still running. Answer: a bool."""


@dataclass(frozen=True, slots=True)
class WaitForStep:
    """Wait until a step of the background compression after the `seen`-th ends (a commit
    may have brought the context under the window), or the compression ends. Answer: None."""

    seen: int


@dataclass(frozen=True, slots=True)
class WaitForBackground:
    """Wait until this memory's background compression, if one runs, ends. Answer: None."""


@dataclass(frozen=True, slots=True)
class Compress:
    """Run the compression loop here; with `over_window`, only when the working context is at
    the window; with `claim`, holding the claim a worker takes on the session (waiting for a
    worker's compression first). With `hand_over`, the events kept since the last hand-over
    are taken in the same hold of the memory's lock (one call's events, never another
    caller's). Answer: those events (an empty list without `hand_over`)."""

    over_window: bool
    claim: bool
    hand_over: bool


@dataclass(frozen=True, slots=True)
class TakeEvents:
    """Hand over the events of the compressions that finished since the last hand-over (an
    error that ended a background compression is raised instead, once). Answer: the events."""


Step: TypeAlias = (
    ReadTotals
    | StartBackground
    | BackgroundRunning
    | WaitForStep
    | WaitForBackground
    | Compress
    | TakeEvents
)
#: A policy: the steps it asks for, each answered as its class says, then its result.
Policy: TypeAlias = Generator[Step, Any, _R]


def compress_if_needed(
    mode: BackgroundMode, config: AutoContextConfig, background: BackgroundState
) -> Policy[list[Event]]:
    """`compress_if_needed()`: this call's events and those that finished meanwhile."""
    if mode is False:
        yield WaitForBackground()  # one started with compress_in_background(), if any
        events: list[Event] = yield Compress(over_window=False, claim=False, hand_over=True)
        return events
    yield from keep_window(config, background, start=mode is True)
    taken: list[Event] = yield TakeEvents()
    return taken


def before_read(
    mode: BackgroundMode, config: AutoContextConfig, background: BackgroundState
) -> Policy[None]:
    """Before a read of the working context (what the next model call sends): in background
    mode, keep it under the window."""
    if mode is not False:
        yield from keep_window(config, background, start=False)


def keep_window(
    config: AutoContextConfig, background: BackgroundState, *, start: bool
) -> Policy[None]:
    """Background mode: keep the next model call under the window, and (with `start`) start a
    background compression at the trigger."""
    info: SessionInfo = yield ReadTotals()
    if info.token_count < config.message_window:
        # Masking alone may start under the trigger (docs/design.md §3); the memory checks
        # its floor (`Compressor.wanted`) before it starts anything.
        if start and (is_due(info, config) or masking_due(info, config, None)):
            yield StartBackground()
        return
    while (yield BackgroundRunning()):
        seen = background.steps
        now: SessionInfo = yield ReadTotals()
        if now.token_count < config.message_window:
            # Under the window while the background compression goes on (holding the claim,
            # which the compression below would wait for): the agent goes on.
            return
        yield WaitForStep(seen)
    yield Compress(over_window=True, claim=True, hand_over=False)


@dataclass(frozen=True, slots=True)
class _Done(Generic[_R]):
    """What a policy returned."""

    value: _R


def _advance(policy: Policy[_R], answer: object) -> Step | _Done[_R]:
    """The policy's next step given `answer` to the last one, or what it returned: the one
    place both runners below drive a policy, so that they differ only in awaiting."""
    try:
        return policy.send(answer)
    except StopIteration as done:
        return _Done(done.value)


def run(policy: Policy[_R], take_step: Callable[[Step], object]) -> _R:
    """Run `policy` to its result, answering each step with `take_step`."""
    step = _advance(policy, None)
    while not isinstance(step, _Done):
        step = _advance(policy, take_step(step))
    return step.value


async def arun(policy: Policy[_R], take_step: Callable[[Step], Awaitable[object]]) -> _R:
    """`run`, with steps that are awaited."""
    step = _advance(policy, None)
    while not isinstance(step, _Done):
        step = _advance(policy, await take_step(step))
    return step.value
