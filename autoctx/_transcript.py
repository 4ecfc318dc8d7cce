"""Messages as one plain-text transcript, for LLM requests and for reload answers.

Every LLM request autoctx makes is plain text (docs/design.md §3): the messages to summarize are
rendered here as a transcript, never sent as raw tool_call/tool messages, so that any
OpenAI-compatible endpoint accepts the request and no pairing rule of the API can reject it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from ._messages import Msg, OpaqueBlock, TextBlock, ToolResultBlock, ToolUseBlock
from ._tags import neutralize_tags


@dataclass(frozen=True, slots=True)
class Clip:
    """How much of each entry a summarizer's transcript carries (None: all of it).

    The messages a summary replaces are kept whole in its offload, and the agent reloads them
    by the summary's tag, so the summarizer needs only what the summary should say: of a long
    tool output (or long tool-call arguments, a file being written) its head and tail, of
    any other long text its head and tail too, past a looser limit. Each cut is marked where
    it is, with what was left out, so that the summarizer knows it reads a part.
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
        # The summarizer should know it is reading an earlier summary, not a first-hand message.
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
        return clip_middle(text if keep_tags else neutralize_tags(text), limit)

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

    Offload tags are neutralized (see `neutralize_tags`) unless ``keep_tags=True``: a
    summarizer must not see them, but an agent reading reloaded messages needs the tags of
    nested summaries to reload one level deeper.

    With `clip`, long entries are cut in the middle (see `Clip`); a summarizer's request
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
    return text if keep_tags else neutralize_tags(text)


def original_chars(messages: Sequence[Msg]) -> int:
    """Characters of all text, tool-input JSON and outputs: S6's "original size"
    (docs/design.md §3)."""
    return sum(m.payload_chars for m in messages)
