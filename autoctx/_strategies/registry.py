"""The rungs of the ladder, one record each (docs/design.md §3): the only place that says what a
strategy number means.

Every rule over rungs reads this module: the order of a pass, which rungs act on the history,
which call the LLM (and so take a prompt), which give way to a deeper rung, which the offline
fallback may run, and the names and colours the audit, the CLI, the console and the plots
show. Adding or reordering a rung is a planner module and a record here.

Events that are not compressions (a pop, a clear, a fork's first event, an erasure) carry
strategy `MANUAL` (0) and are told apart by their reason, which already names what they did
(docs/design.md §7): `event_kind` names them, so that no column repeats the reason.

>>> from autoctx._strategies.registry import LADDER, label
>>> [rung.number for rung in LADDER][:2], label(7)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal, TypeAlias

from .. import _prompt_texts as texts
from .._events import MANUAL
from .._llm_rungs import LLM_STRATEGIES as LLM_STRATEGIES  # its owner is the leaf
from .._messages import Kind
from . import (
    s1_tool_runs,
    s2_previews,
    s3_tail_previews,
    s4_rounds,
    s5_large,
    s6_current_round,
    s7_fold,
    s8_mask,
)
from ._common import Planner

#: What a rung rewrites: the history (what precedes the current round, and the older part of a
#: long current round), or only what follows the latest user message (that message included).
ActsOn: TypeAlias = Literal["history", "current round"]
#: A deeper rung this one gives way to in a pass (docs/design.md §2, "compress rarely, and
#: deeply"): "fold" when it would need more summarizer calls than the fold's one, or would
#: not reach the target; "fold range" (previews) when the fold's range holds some of its
#: messages and the others alone would not reach the target; "current round" when S6's range
#: holds all of its ranges and they alone would not land `fold_keep_tokens` under the token
#: target (S6's one summary lands deeper).
GivesWay: TypeAlias = Literal["fold", "fold range", "current round"]


@dataclass(frozen=True, slots=True)
class Rung:
    """One strategy of the ladder."""

    number: int
    #: Short name for legends, tables and the audit.
    name: str
    #: Its colour in the plots, the CLI and the console (the Okabe-Ito palette, colour-blind safe).
    color: str
    planner: Planner
    #: The kind of the message that replaces what it compresses (a preview is the only one no
    #: LLM writes).
    writes: Kind
    acts_on: ActsOn
    #: It plans at most one range a pass (the fold, S6): the rungs before it leave it a call.
    one_range: bool
    #: It saves tokens only, never messages: it acts only while tokens are over the target.
    tokens_only: bool = False
    gives_way: frozenset[GivesWay] = frozenset()
    #: The offline summarizer may run it to keep the bound (docs/design.md §2).
    fallback: bool = False
    #: autoctx's own prompt (LLM rungs only); a caller replaces it by number.
    prompt: str | None = None

    @property
    def llm(self) -> bool:
        """Whether the summarizer writes its replacements (it then has a prompt)."""
        return self.number in LLM_STRATEGIES


#: The ladder, in the order of a pass (docs/design.md §3). Masking (8) comes first: it needs
#: no LLM and loses nothing. The fold is numbered 7 but runs before S5 and S6: the history
#: before the current round is always cheaper to lose than the current round.
LADDER: Final[tuple[Rung, ...]] = (
    Rung(
        s8_mask.STRATEGY,
        "mask",
        "#999999",
        s8_mask.plan_s8,
        writes="preview",
        acts_on="history",
        one_range=False,
        tokens_only=True,
    ),
    Rung(
        s1_tool_runs.STRATEGY,
        "tool-run summary",
        "#0072B2",
        s1_tool_runs.plan_s1,
        writes="tool_run_summary",
        acts_on="history",
        one_range=False,
        gives_way=frozenset({"fold", "current round"}),
        prompt=texts.S1_TOOL_RUNS,
    ),
    Rung(
        s2_previews.STRATEGY,
        "preview",
        "#E69F00",
        s2_previews.plan_s2,
        writes="preview",
        acts_on="history",
        one_range=False,
        tokens_only=True,
        gives_way=frozenset({"fold range"}),
    ),
    Rung(
        s3_tail_previews.STRATEGY,
        "tail preview",
        "#F0E442",
        s3_tail_previews.plan_s3,
        writes="preview",
        acts_on="history",
        one_range=False,
        tokens_only=True,
        gives_way=frozenset({"fold range"}),
    ),
    Rung(
        s4_rounds.STRATEGY,
        "round summary",
        "#009E73",
        s4_rounds.plan_s4,
        writes="round_summary",
        acts_on="history",
        one_range=False,
        gives_way=frozenset({"fold"}),
        prompt=texts.S4_ROUND,
    ),
    Rung(
        s7_fold.STRATEGY,
        "history fold",
        "#56B4E9",
        s7_fold.plan_s7,
        writes="history_summary",
        acts_on="history",
        one_range=True,
        fallback=True,
        prompt=texts.S7_FOLD,
    ),
    Rung(
        s5_large.STRATEGY,
        "large-msg summary",
        "#CC79A7",
        s5_large.plan_s5,
        writes="large_summary",
        acts_on="current round",
        one_range=False,
        gives_way=frozenset({"current round"}),
        fallback=True,
        prompt=texts.S5_PAYLOAD,
    ),
    Rung(
        s6_current_round.STRATEGY,
        "current-round summary",
        "#D55E00",
        s6_current_round.plan_s6,
        writes="current_round_summary",
        acts_on="current round",
        one_range=True,
        fallback=True,
        prompt=texts.S6_CURRENT_ROUND,
    ),
)

#: The rungs by number.
RUNGS: Final[Mapping[int, Rung]] = {rung.number: rung for rung in LADDER}
#: The numbers of the rungs other modules name a rule after.
FOLD: Final = s7_fold.STRATEGY
MASKING: Final = s8_mask.STRATEGY
LARGE: Final = s5_large.STRATEGY
CURRENT_ROUND: Final = s6_current_round.STRATEGY

#: The order of a pass, by number.
ORDER: Final[tuple[int, ...]] = tuple(rung.number for rung in LADDER)
#: The rungs that act on what precedes the current round (the others rewrite only what follows
#: the latest user message, the current user message included).
HISTORY_STRATEGIES: Final = frozenset(r.number for r in LADDER if r.acts_on == "history")
#: autoctx's own prompt of each LLM rung, by number.
DEFAULT_PROMPTS: Final[Mapping[int, str]] = {
    n: prompt for n in LLM_STRATEGIES if (prompt := RUNGS[n].prompt) is not None
}
#: The rungs that save tokens only: they act while tokens are over the target.
TOKENS_ONLY_STRATEGIES: Final = frozenset(r.number for r in LADDER if r.tokens_only)
#: The rungs whose replacement is a preview (one original, cut, with its tag).
PREVIEW_STRATEGIES: Final = frozenset(r.number for r in LADDER if r.writes == "preview")


def reserved_after(ladder: Sequence[Rung]) -> dict[int, int]:
    """For each LLM rung of `ladder` that summarizes several ranges (one call each), the calls
    it leaves for the single-call LLM rungs after it."""
    return {
        r.number: sum(1 for later in ladder[k + 1 :] if later.llm and later.one_range)
        for k, r in enumerate(ladder)
        if r.llm and not r.one_range
    }


#: LLM rungs that summarize several ranges one call each, and how many single-call rungs after
#: them (the fold, S6) they leave a call of the budget for.
RESERVED_AFTER: Final[Mapping[int, int]] = reserved_after(LADDER)
#: Rungs that give way to the fold's one call (see `GivesWay`).
YIELD_TO_FOLD: Final = frozenset(r.number for r in LADDER if "fold" in r.gives_way)
#: Previews that give way to the fold when its range holds some of theirs (see `GivesWay`).
PREVIEWS_YIELD_TO_FOLD: Final = frozenset(r.number for r in LADDER if "fold range" in r.gives_way)
#: Rungs that give way to S6 when its range holds all of theirs (see `GivesWay`).
YIELD_TO_CURRENT_ROUND: Final = frozenset(
    r.number for r in LADDER if "current round" in r.gives_way
)
#: The rungs the offline fallback may run, in ladder order (docs/design.md §2).
FALLBACK_STRATEGIES: Final[tuple[int, ...]] = tuple(r.number for r in LADDER if r.fallback)

# -- events that are not compressions ------------------------------------------------------------

#: What such an event did, by its reason: `pop_last` records reason 'manual'.
MANUAL_KINDS: Final[Mapping[str, str]] = {
    "manual": "pop",
    "clear": "clear",
    "fork": "fork",
    "erase": "erase",
    "undo": "undo",
}
_MANUAL_COLOR: Final = "#000000"

#: Short names by strategy number, `MANUAL` included (as "pop": the plots mark pops).
STRATEGY_NAMES: Final[Mapping[int, str]] = {
    MANUAL: MANUAL_KINDS["manual"],
    **{r.number: r.name for r in sorted(LADDER, key=lambda r: r.number)},
}
#: Colours by strategy number, `MANUAL` included.
STRATEGY_COLORS: Final[Mapping[int, str]] = {
    MANUAL: _MANUAL_COLOR,
    **{r.number: r.color for r in sorted(LADDER, key=lambda r: r.number)},
}


def is_compression(strategy: int) -> bool:
    """Whether an event of `strategy` is a compression (a rung's), not a manual event."""
    return strategy != MANUAL


def label(strategy: int) -> str:
    """`S4 round summary`: a rung's number and name ('?' for a number no rung has)."""
    return f"S{strategy} {STRATEGY_NAMES.get(strategy, '?')}"


def event_kind(strategy: int, reason: str) -> str:
    """What an event was: the rung's name for a compression (`round summary`), else `pop`,
    `clear`, `fork` or `erase`, named by the event's reason."""
    if is_compression(strategy):
        return STRATEGY_NAMES.get(strategy, "?")
    return MANUAL_KINDS.get(reason, reason or MANUAL_KINDS["manual"])


def event_label(strategy: int, reason: str) -> str:
    """`event_kind` with the rung's number for a compression (`S4 round summary`)."""
    return label(strategy) if is_compression(strategy) else event_kind(strategy, reason)


def unknown_strategy(strategy: object) -> ValueError:
    """The error for a number no rung has."""
    return ValueError(f"unknown strategy {strategy!r}; the strategies are {sorted(RUNGS)}")
