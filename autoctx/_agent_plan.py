"""The agent's plan (`set_plan`): its documented shape, checked, and the short hint of it that
rides on every LLM request.

Not to be confused with a compression plan (`_plans.py`: the edits a strategy proposes).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal, TypeAlias

from ._arguments import unstorable
from ._errors import InvalidPlan
from ._tags import neutralize_tags

StepState: TypeAlias = Literal["pending", "in_progress", "done"]
PLAN_STATES: Final[tuple[StepState, ...]] = ("pending", "in_progress", "done")
_PLAN_KEYS: Final = frozenset({"goal", "steps", "expected_outcome"})
_STEP_KEYS: Final = frozenset({"title", "state"})
#: Longest piece of plan text copied into a hint: the hint rides on every LLM request.
_HINT_FIELD_CHARS: Final = 300


def _text_field(value: object, where: str, *, required: bool) -> str:
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value.strip()):
        got = "an empty string" if isinstance(value, str) else type(value).__name__
        raise InvalidPlan(f"{where} must be a non-empty string, got {got}")
    # What PostgreSQL cannot store in JSONB: refused here, so that no database error (whose
    # text would quote the plan) is ever raised.
    if (problem := unstorable(value)) is not None:
        raise InvalidPlan(f"{where} {problem}")
    return value


def validate_plan(plan: Mapping[str, Any]) -> dict[str, Any]:
    """Check a plan's shape and return a normalized copy.

    Shape: ``{"goal": str, "steps": [{"title": str, "state": "pending" | "in_progress" |
    "done"}], "expected_outcome": str}``. ``goal`` is required; ``steps`` defaults to none and
    ``expected_outcome`` to ``""``; a step's state defaults to ``"pending"``. Unknown keys are
    refused (a typo such as ``"step"`` would otherwise silently drop the steps). Raises
    `InvalidPlan` naming the field.
    """
    if not isinstance(plan, Mapping):
        raise InvalidPlan(f"a plan must be a mapping with a 'goal', got {type(plan).__name__}")
    unknown = set(plan) - _PLAN_KEYS
    if unknown:
        raise InvalidPlan(
            f"plan has unknown keys {sorted(map(str, unknown))}; allowed: {sorted(_PLAN_KEYS)}"
        )
    goal = _text_field(plan.get("goal"), "plan['goal']", required=True)
    outcome = _text_field(plan.get("expected_outcome"), "plan['expected_outcome']", required=False)
    raw_steps = plan.get("steps", [])
    if raw_steps is None:
        raw_steps = []
    if isinstance(raw_steps, str | bytes) or not isinstance(raw_steps, Sequence):
        raise InvalidPlan(f"plan['steps'] must be a list of steps, got {type(raw_steps).__name__}")
    steps: list[dict[str, str]] = []
    for i, step in enumerate(raw_steps):
        where = f"plan['steps'][{i}]"
        if not isinstance(step, Mapping):
            raise InvalidPlan(f"{where} must be a mapping with 'title' and 'state'")
        unknown = set(step) - _STEP_KEYS
        if unknown:
            raise InvalidPlan(
                f"{where} has unknown keys {sorted(map(str, unknown))}; allowed: title, state"
            )
        title = _text_field(step.get("title"), f"{where}['title']", required=True)
        state = step.get("state", "pending")
        if state not in PLAN_STATES:
            raise InvalidPlan(
                f"{where}['state'] is not a state; use one of {', '.join(PLAN_STATES)}"
            )
        steps.append({"title": title, "state": state})
    return {"goal": goal, "steps": steps, "expected_outcome": outcome}


def _clip(text: str) -> str:
    text = " ".join(text.split())
    if len(text) <= _HINT_FIELD_CHARS:
        return text
    return text[: _HINT_FIELD_CHARS - 3] + "..."


def plan_hint(plan: Mapping[str, Any] | None) -> str | None:
    """The session plan as a few lines of text appended to every LLM request, or None.

    It names the goal, the progress ("k of n steps done"), the steps in progress, the next
    pending step and the expected outcome: enough for the summarizer to judge what matters,
    short enough to ride on every request. Raises `InvalidPlan` for a malformed plan.
    """
    if plan is None:
        return None
    valid = validate_plan(plan)
    steps: list[dict[str, str]] = valid["steps"]
    lines = ["Plan of this session (keep what the remaining work needs):"]
    lines.append(f"Goal: {_clip(valid['goal'])}")
    if steps:
        done = sum(1 for s in steps if s["state"] == "done")
        lines.append(f"Progress: {done} of {len(steps)} steps done")
        for step in steps:
            if step["state"] == "in_progress":
                lines.append(f"In progress: {_clip(step['title'])}")
        upcoming = next((s for s in steps if s["state"] == "pending"), None)
        if upcoming is not None:
            lines.append(f"Next: {_clip(upcoming['title'])}")
    if valid["expected_outcome"].strip():
        lines.append(f"Expected outcome: {_clip(valid['expected_outcome'])}")
    return neutralize_tags("\n".join(lines))
