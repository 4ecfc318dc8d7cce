"""What the compressor keeps of one call (`CallState`: its budgets, deadline, failed ranges
and events) and of one session between calls (`SessionState`, owned by the memory).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from ._config import AutoContextConfig
from ._events import Event
from ._strategies._common import Layouts
from ._trigger import MaskFloor

#: Passes whose arrivals `SessionState.arriving` averages: a few, so that it follows a change
#: of the agent's pace, and more than one, so that one large tool output does not set it.
_ARRIVALS_KEPT: Final = 4


@dataclass
class CallState:
    """Budgets and memory of one `compress_if_needed()` call."""

    #: The plan attached to the session (for the summaries' plan hint), read once per call.
    plan: Mapping[str, Any] | None = None
    #: The token trigger fired this call: S5 and S6 may then act until the target is reached.
    by_tokens: bool = False
    llm_calls: int = 0
    failed: set[tuple[int, ...]] = field(default_factory=set)
    events: list[Event] = field(default_factory=list)
    #: Whether the token floor was waived when S1 to S4 last planned nothing, if only S5 or S6
    #: have applied since (else None). Those two rewrite only what follows the latest user
    #: message and only lower the totals, which can only take candidates away from S1 to S4
    #: (their ranges end below the current round; S2 and S3 need tokens over the target), so
    #: with the same floor the history strategies would find nothing again: the next pass
    #: skips them.
    history_quiet: bool | None = None
    #: (strategy, replaced ids) the offline fallback already tried in this call.
    fell_back: set[tuple[int, tuple[int, ...]]] = field(default_factory=set)
    #: The `time.monotonic()` instant after which no summarizer call starts (and the one in
    #: flight is cut): `compress_deadline_s` from the start of the call.
    deadline: float = float("inf")
    #: The deadline was found passed (said once in the log).
    out_of_time: bool = False
    #: The call runs beside the caller's appends (`Compressor.steps`).
    beside: bool = False
    #: The summarizer said it cannot be used now (a wrong model, a refused key, a back-off):
    #: the call asks it nothing more, and its failure is one event (docs/design.md §6).
    unavailable: bool = False
    #: Tokens expected to come in while one pass summarizes: 0 unless `beside` (see
    #: `SessionState.arriving`).
    arriving: int = 0


@dataclass
class SessionState:
    """What the compressor keeps about one session between calls, owned by its memory (so that
    nothing of it lives in module globals): the latest layout, the incremental base of the
    next one; and whether the over-window warning was logged (once per memory: it would
    otherwise repeat on every call, since each append moves the session to a new version and
    the ladder tries again)."""

    layouts: Layouts = field(default_factory=Layouts)
    warned_over_window: bool = False
    #: Tokens appended beside the latest passes that ran beside the caller (between a pass's
    #: snapshot and its commit), newest last: see `arriving`. A tuple, replaced whole: the
    #: agent's thread reads it while a background compression records.
    arrivals: tuple[int, ...] = ()
    #: The working tokens and messages the latest call of this process left (None before
    #: one): masking alone looks again once the context has moved on from them
    #: (`masking_due`). Not stored: a new process looks once more, which costs one plan.
    mask_floor: MaskFloor | None = None

    def arriving(self, config: AutoContextConfig) -> int:
        """Tokens a pass that runs beside the caller should expect to come in before it
        commits: the mean of what came in during the latest such passes.

        A pass plans from a snapshot, and the agent goes on appending while the summarizer
        writes; a pass that aims at the target from its snapshot alone commits over it by
        what came in meanwhile, and the loop then chases the target one summarizer call (and,
        for an agent with a prompt cache, one re-billed context) after another. Planned
        against the target less what will come in, the pass picks a rung that lands under the
        target on its own. Capped at half the target: one burst of large appends must not
        turn a compression into a rewrite of the whole context.
        """
        arrivals = self.arrivals
        if not arrivals:
            return 0
        return min(sum(arrivals) // len(arrivals), config.token_target // 2)

    def record_arrivals(self, tokens: int) -> None:
        self.arrivals = (*self.arrivals, tokens)[-_ARRIVALS_KEPT:]
