"""What the compression loop asks of the outside world, and the store contract it is asked of.

The loop (`autoctx._compressor`) performs no I/O (docs/design.md §2): it is a generator that
yields the small frozen effects below and is sent each one's result, the way psycopg's
`generators.py` yield to the drivers of its `waiting.py`. The drivers (`autoctx._drivers`)
execute them against a `CompressionStore` (the SQL store, or the in-memory one of the property
tests) and the summarizers. `ask` gives each effect's result its type in the loop:

    snapshot = yield from ask(ReadSnapshot())

A store answers for one session: the contract has no session id (the memory binds one).
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Generic, Protocol, TypeAlias, TypeVar

from ._events import Event
from ._messages import Msg
from ._plans import Snapshot
from ._replacements import ApplyOutcome, Replacement
from ._summary import SummaryRequest, SummaryResult

_R = TypeVar("_R")
_T = TypeVar("_T")

#: The model recorded on the events of the offline fallback (docs/design.md §2).
FALLBACK_MODEL: Final = "offline"


class SessionTotals(Protocol):
    """The session row as the loop reads it (no messages): what `SessionInfo` holds of it."""

    @property
    def version(self) -> int: ...

    @property
    def message_count(self) -> int: ...

    @property
    def token_count(self) -> int: ...

    @property
    def settled_version(self) -> int | None: ...

    @property
    def plan(self) -> Mapping[str, Any] | None: ...


class CompressionStore(Protocol):
    """The handful of store operations one session's compression needs (docs/design.md §2).

    Each is one unit of work on its own: `apply` and `record_event` are each one transaction
    that bumps the event counter; `apply` also bumps the version, and refuses (writing one
    `conflict` event per range, nothing else) when a replaced range is no longer in the
    working set where the snapshot saw it, or an erasure committed after `seen_version`.
    """

    def snapshot(self) -> Snapshot:
        """The working context, metadata only, at one version."""
        ...

    def totals(self) -> SessionTotals:
        """The session row, without its messages."""
        ...

    def load_messages(self, ids: Iterable[int]) -> dict[int, Msg]:
        """Stored messages by id, working or not."""
        ...

    def apply(
        self,
        replacements: Sequence[Replacement],
        *,
        reason: str,
        config: Mapping[str, Any],
        seen_version: int | None = None,
    ) -> ApplyOutcome:
        """Apply one strategy's replacements in one transaction (see the class docstring)."""
        ...

    def record_event(
        self,
        *,
        strategy: int,
        status: str,
        reason: str,
        replaced_ids: Sequence[int] = (),
        error: str | None = None,
        config: Mapping[str, Any],
        model: str | None = None,
        prompt_tokens: int | None = None,
        completion_tokens: int | None = None,
        latency_ms: float | None = None,
    ) -> Event:
        """Record an attempt that changed nothing (failed, skipped or conflict)."""
        ...

    def settle(self, version: int) -> None:
        """Remember that compression at `version` could not reach its target, if the session
        is still at it."""
        ...

    def undone_ranges(self) -> frozenset[tuple[int, ...]]:
        """The replaced ids of every compression an undo of the session took back: the loop
        does not plan them again (docs/design.md §7)."""
        ...


class Effect(Generic[_R]):
    """Something the loop asks for; `_R` is the type of the answer it is sent back."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class ReadSnapshot(Effect[Snapshot]):
    """`CompressionStore.snapshot`."""


@dataclass(frozen=True, slots=True)
class ReadTotals(Effect[SessionTotals]):
    """`CompressionStore.totals`."""


@dataclass(frozen=True, slots=True)
class LoadMessages(Effect[dict[int, Msg]]):
    """`CompressionStore.load_messages`."""

    ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ApplyReplacements(Effect[ApplyOutcome]):
    """`CompressionStore.apply`."""

    replacements: tuple[Replacement, ...]
    reason: str
    config: Mapping[str, Any] = field(compare=False, repr=False)
    seen_version: int | None = None


@dataclass(frozen=True, slots=True)
class RecordEvent(Effect[Event]):
    """`CompressionStore.record_event`: an attempt that changed nothing."""

    strategy: int
    status: str
    reason: str
    config: Mapping[str, Any] = field(compare=False, repr=False)
    replaced_ids: tuple[int, ...] = ()
    error: str | None = None
    model: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    latency_ms: float | None = None


@dataclass(frozen=True, slots=True)
class ReadUndone(Effect[frozenset[tuple[int, ...]]]):
    """`CompressionStore.undone_ranges`."""


@dataclass(frozen=True, slots=True)
class Settle(Effect[None]):
    """`CompressionStore.settle`."""

    version: int


#: A summarizer's answers to a batch, in its order: a result, or the exception it raised.
Answers: TypeAlias = list[SummaryResult | Exception]


@dataclass(frozen=True, slots=True)
class Summarize(Effect[Answers]):
    """The requests for the independent ranges of one pass (one range each, or several of
    S5's messages sharing one: docs/design.md §3), that the summarizer may answer at the same
    time; answered in their order.

    `fallback`: the offline summarizer the memory injected writes them, in the step itself
    (local and quick: no lock is given up for it), and its answers are recorded under the
    fallback's name (docs/design.md §2). Otherwise the configured summarizer does, with no
    lock held and at most `summarizer_concurrency` at once.
    """

    requests: tuple[SummaryRequest, ...]
    fallback: bool = False


#: The loop's steps: a generator of effects, sent each one's result, returning `_T`.
Effects: TypeAlias = Generator[Effect[Any], Any, _T]


def ask(effect: Effect[_R]) -> Generator[Effect[_R], _R, _R]:
    """Yield one effect and return its result, typed (`yield from ask(...)`)."""
    return (yield effect)
