"""The compression planners of docs/design.md §3, cheapest first, in the order of
`registry.LADDER` (the one record of each rung).

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
from .registry import LADDER, unknown_strategy
from .s1_tool_runs import plan_s1
from .s2_previews import plan_s2
from .s3_tail_previews import plan_s3
from .s4_rounds import plan_s4
from .s5_large import plan_s5
from .s6_current_round import plan_s6
from .s7_fold import plan_s7
from .s8_mask import plan_s8

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
    "plan_s8",
]

#: The planners by strategy number, in the order the compressor tries them (`registry.LADDER`).
#: A dict of its own, so that a test can stand in for one planner.
PLANNERS: Final[dict[int, Planner]] = {rung.number: rung.planner for rung in LADDER}


def plan(
    strategy: int, snapshot: Snapshot, config: AutoContextConfig, ctx: PlanContext
) -> list[Edit]:
    """The edits strategy `strategy` would make on `snapshot` in one pass."""
    try:
        planner = PLANNERS[strategy]
    except KeyError:
        raise unknown_strategy(strategy) from None
    return planner(snapshot, config, ctx)
