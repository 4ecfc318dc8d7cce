"""Messages as one plain-text transcript, the offload tag, and the session plan as a hint.

Every LLM request autoctx makes is plain text (SPEC.md section 3): the messages to summarise are
rendered here as a transcript, never sent as raw tool_call/tool messages, so that any
OpenAI-compatible endpoint accepts the request and no pairing rule of the API can reject it.

The offload tag lives here too because the transcript has to neutralise it: a summariser that
sees ``<!-- CONTEXT_OFFLOAD: uuid=... -->`` in its input tends to copy it, and an answer that
carries a tag is rejected (SPEC.md section 4). `autoctx.prompts` re-exports the tag helpers.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeAlias

from .errors import InvalidPlan
from .messages import Msg, OpaqueBlock, TextBlock, ToolResultBlock, ToolUseBlock

__all__ = [
    "OFFLOAD_MARKER",
    "OFFLOAD_TAG_RE",
    "PLAN_STATES",
    "Clip",
    "StepState",
    "clip_middle",
    "neutralise_tags",
    "offload_tag",
    "original_chars",
    "plan_hint",
    "render_transcript",
    "validate_plan",
]

# ---------------------------------------------------------------------------------------------
# The offload tag
# ---------------------------------------------------------------------------------------------

#: Matches one offload tag; group ``uuid`` is the offload id. Whitespace and the id's shape are
#: matched leniently on purpose: the regex also serves to reject LLM answers, and a model that
#: copies a tag rarely copies it byte for byte.
OFFLOAD_TAG_RE: Final = re.compile(r"<!--\s*CONTEXT_OFFLOAD:\s*uuid=(?P<uuid>[^\s>]*?)\s*-->")

#: The bare marker; an answer carrying it even without the comment syntax is refused too.
OFFLOAD_MARKER: Final = "CONTEXT_OFFLOAD"


def offload_tag(uuid: str) -> str:
    """The tag that ends every replacement text: ``<!-- CONTEXT_OFFLOAD: uuid=<uuid> -->``."""
    return f"<!-- {OFFLOAD_MARKER}: uuid={uuid} -->"


def neutralise_tags(text: str) -> str:
    """Replace offload tags by ``[offloaded context <uuid>]`` and drop any stray marker.

    The reference to the offload survives (a reader can still reload it), but nothing that looks
    like a tag reaches a summariser's input or output.
    """
    if OFFLOAD_MARKER not in text:
        return text
    text = OFFLOAD_TAG_RE.sub(lambda m: f"[offloaded context {m.group('uuid')}]", text)
    return text.replace(OFFLOAD_MARKER, "offloaded context")


# ---------------------------------------------------------------------------------------------
# Transcript
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Clip:
    """How much of each entry a summariser's transcript carries (None: all of it).

    The messages a summary replaces are kept whole in its offload, and the agent reloads them
    by the summary's tag, so the summariser needs only what the summary should say: of a long
    tool output (or long tool-call arguments, a file being written) its head and tail, of
    any other long text its head and tail too, past a looser limit. Each cut is marked where
    it is, with what was left out, so that the summariser knows it reads a part.
    """

    #: Tool outputs and tool-call arguments longer than this are cut in the middle.
    tool_chars: int | None = None
    #: Any other text (a message's own text) longer than this is cut in the middle.
    text_chars: int | None = None
    #: The whole transcript's length: past it, the longest entries of original messages are
    #: cut to one common length, the shortest that fits (summaries and previews stay whole).
    total_chars: int | None = None


#: Of the characters a cut entry keeps, the share that comes from its head (the rest is its
#: tail): a result's first lines say what it is, its last lines how it ended.
_HEAD_SHARE: Final = 0.7


def clip_middle(text: str, limit: int | None) -> str:
    """`text` whole when it holds at most `limit` characters; else its head and tail around a
    line that says how many characters were left out (``[TRUNCATED: ...]``, the marker the
    prompts know)."""
    if limit is None or len(text) <= limit:
        return text
    head_chars = max(1, int(limit * _HEAD_SHARE))
    tail_chars = max(0, limit - head_chars)
    head = text[:head_chars]
    tail = text[len(text) - tail_chars :] if tail_chars else ""
    left_out = len(text) - len(head) - len(tail)
    note = (
        f"[TRUNCATED: {left_out} characters left out here; the whole text is kept with the "
        "originals and can be reloaded]"
    )
    if left_out <= 2 * len(note):
        return text  # a cut this small would save less than it costs to say
    return f"{head}\n{note}\n{tail}" if tail else f"{head}\n{note}"


def _speaker(msg: Msg) -> str:
    speaker: str = msg.role
    if msg.name:
        speaker += f" ({msg.name})"
    if msg.kind != "original":
        # The summariser should know it is reading an earlier summary, not a first-hand message.
        speaker += f", earlier {msg.kind.replace('_', ' ')}"
    return speaker


def _opaque_label(block: OpaqueBlock) -> str:
    kind = block.data.get("type")
    if isinstance(kind, str) and "image" in kind:
        return "[image]"
    if isinstance(kind, str) and "audio" in kind:
        return "[audio]"
    return f"[opaque: {kind if isinstance(kind, str) else 'unknown'}]"


def _entry(header: str, body: str) -> str:
    # The body starts on the header's line, so a one-line result stays one line.
    return f"[{header}] {body}" if body else f"[{header}]"


@dataclass(frozen=True, slots=True)
class _Part:
    """One entry of the transcript: its header, its body and whether a total clip may cut it."""

    header: str
    body: str
    #: Parts of original messages: summaries and previews are dense already, and an earlier
    #: summary of the history is what the next one carries forward.
    cuttable: bool


def _render_message(msg: Msg, clip: Clip, keep_tags: bool) -> list[_Part]:
    speaker = _speaker(msg)
    cuttable = msg.kind == "original"
    parts: list[_Part] = []
    pending_text: list[str] = []

    def cut(text: str, limit: int | None) -> str:
        # Tags first, so that a cut never leaves half a tag behind.
        return clip_middle(text if keep_tags else neutralise_tags(text), limit)

    def flush_text() -> None:
        if pending_text:
            body = cut("".join(pending_text), clip.text_chars)
            parts.append(_Part(speaker, body, cuttable))
            pending_text.clear()

    for block in msg.content:
        if isinstance(block, TextBlock):
            pending_text.append(block.text)
        elif isinstance(block, OpaqueBlock):
            pending_text.append(_opaque_label(block))
        elif isinstance(block, ToolUseBlock):
            flush_text()
            arguments = block.arguments if block.arguments.strip() else "(no arguments)"
            parts.append(
                _Part(
                    f"{speaker} -> tool call {block.name} id={block.id}",
                    cut(arguments, clip.tool_chars),
                    cuttable,
                )
            )
        elif isinstance(block, ToolResultBlock):
            flush_text()
            name = block.name or "unknown tool"
            output = block.output_text
            parts.append(
                _Part(
                    f"tool result {name} id={block.tool_use_id}",
                    cut(output, clip.tool_chars) if output.strip() else "(empty output)",
                    cuttable,
                )
            )
    flush_text()
    if not parts:
        parts.append(_Part(speaker, "(no content)", False))
    return parts


#: A total clip leaves every cut entry at least this many characters (its first lines).
_MIN_LEVEL: Final = 200


def _water_level(parts: Sequence[_Part], total_chars: int) -> int | None:
    """The largest length L such that cutting every cuttable body to L characters brings the
    transcript to `total_chars` (the long entries give way first and equally, the short ones
    stay whole), at least `_MIN_LEVEL`; None when the transcript already fits."""
    sizes = [len(p.header) + len(p.body) + 4 for p in parts]
    if sum(sizes) <= total_chars:
        return None
    fixed = sum(size for size, p in zip(sizes, parts, strict=True) if not p.cuttable)
    fixed += sum(len(p.header) + 4 for p in parts if p.cuttable)
    room = total_chars - fixed
    bodies = sorted(len(p.body) for p in parts if p.cuttable)
    whole = 0  # the bodies shorter than the one at k, which stay whole
    for k, size in enumerate(bodies):
        # Bodies [k:] all cut to one level: is there room for them at `size`?
        if whole + size * (len(bodies) - k) > room:
            return max(_MIN_LEVEL, max(0, room - whole) // (len(bodies) - k))
        whole += size
    return None


def render_transcript(
    messages: Sequence[Msg], *, keep_tags: bool = False, clip: Clip | None = None
) -> str:
    """The messages as one plain-text transcript, one entry per text run, call or result.

    ``[user] ...``, ``[assistant] ...``, ``[assistant -> tool call read_file id=call_1] {...}``
    (arguments exactly as the model wrote them), ``[tool result read_file id=call_1] ...``;
    images and other opaque blocks appear as ``[image]`` / ``[opaque: <type>]``. Messages are
    separated by a blank line.

    Offload tags are neutralised (see `neutralise_tags`) unless ``keep_tags=True``: a
    summariser must not see them, but an agent reading reloaded messages needs the tags of
    nested summaries to reload one level deeper.

    With `clip`, long entries are cut in the middle (see `Clip`); a summariser's request
    is clipped, a reloaded page never.
    """
    how = clip if clip is not None else Clip()
    rendered = [_render_message(m, how, keep_tags) for m in messages]
    level = None
    if how.total_chars is not None:
        level = _water_level([p for parts in rendered for p in parts], how.total_chars)
    text = "\n\n".join(
        "\n".join(
            _entry(p.header, clip_middle(p.body, level) if p.cuttable else p.body) for p in parts
        )
        for parts in rendered
    )
    return text if keep_tags else neutralise_tags(text)


def original_chars(messages: Sequence[Msg]) -> int:
    """Characters of all text, tool-input JSON and outputs: the "original size" of SPEC.md S6."""
    return sum(m.payload_chars for m in messages)


# ---------------------------------------------------------------------------------------------
# Plan
# ---------------------------------------------------------------------------------------------

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
    return value


def validate_plan(plan: Mapping[str, Any]) -> dict[str, Any]:
    """Check a plan's shape and return a normalised copy.

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
    pending step and the expected outcome: enough for the summariser to judge what matters,
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
    return neutralise_tags("\n".join(lines))
