"""The compression planners of docs/design.md §3, cheapest first: S1 to S4, the fold (7), S5, S6.

Each planner is a pure function ``plan_sN(snapshot, config, ctx) -> list[Edit]``: no database, no
clock, no uuid, no randomness. It returns every range it would compress in one pass, in working
order and non-overlapping, each as an `Edit` that replaces ``snapshot.messages[start:end]`` by
one new message; ranges listed in ``ctx.failed`` are left out.

>>> from autoctx._strategies import plan
>>> edits = plan(2, snapshot, config, PlanContext(token_pressure=True))  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Final

from .._config import AutoContextConfig
from .._plans import Edit, PlanContext, Snapshot
from ._common import RELOAD_TOOL_NAME, Planner
from .s1_tool_runs import plan_s1
from .s2_previews import plan_s2
from .s3_tail_previews import plan_s3
from .s4_rounds import plan_s4
from .s5_large import plan_s5
from .s6_current_round import plan_s6
from .s7_fold import plan_s7

__all__ = [
    "PLANNERS",
    "RELOAD_TOOL_NAME",
    "Planner",
    "plan",
    "plan_s1",
    "plan_s2",
    "plan_s3",
    "plan_s4",
    "plan_s5",
    "plan_s6",
    "plan_s7",
]

#: The planners by strategy number, in the order the compressor tries them: the fold is
#: numbered 7 but runs before S5 and S6, because the history before the current round is
#: always cheaper to lose than the current round.
PLANNERS: Final[dict[int, Planner]] = {
    1: plan_s1,
    2: plan_s2,
    3: plan_s3,
    4: plan_s4,
    7: plan_s7,
    5: plan_s5,
    6: plan_s6,
}


def plan(
    strategy: int, snapshot: Snapshot, config: AutoContextConfig, ctx: PlanContext
) -> list[Edit]:
    """The edits strategy `strategy` (1 to 7) would make on `snapshot` in one pass."""
    try:
        planner = PLANNERS[strategy]
    except KeyError:
        raise ValueError(f"unknown strategy {strategy!r}; strategies are 1 to 7") from None
    return planner(snapshot, config, ctx)
