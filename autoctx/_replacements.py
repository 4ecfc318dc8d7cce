"""What a compression writes in place of what it replaces (docs/design.md §3): the replacement
messages (previews and large-message summaries, pure builders), a planned edit paired with its
new message, and what applying a batch of them returns.

Neutral ground between the compressor (which builds them), the stores (which apply them) and
the erasure (which rebuilds previews and large summaries from tombstones): none of those
imports another for these.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from ._config import AutoContextConfig
from ._events import Event, FactCheck
from ._intake import Prepared
from ._messages import Block, Msg, OpaqueBlock, TextBlock, ToolResultBlock, ToolUseBlock
from ._plans import Edit
from ._strategies import s8_mask
from ._strategies.facts import extract, normalize
from ._tags import offload_tag

#: Tool-call arguments longer than this are replaced by a pointer to the offload in S5: the
#: call must stay valid JSON, and short arguments are worth keeping verbatim.
_LARGE_ARGUMENTS_CHARS: Final = 256


@dataclass(frozen=True, slots=True)
class NewOffload:
    """The names of an offload a compression is about to make: its key and its handle."""

    uuid: uuid.UUID
    handle: int


@dataclass(frozen=True, slots=True)
class Replacement:
    """One planned edit with the message that replaces its range, ready to apply."""

    edit: Edit
    #: The new message; its `final` is already what the kinds table says (previews and large
    #: summaries inherit it from what they replace).
    new: Prepared
    offload_uuid: uuid.UUID
    #: The offload's handle, which the new message's tag shows (docs/design.md §4): numbered
    #: from the snapshot's `next_handle`; the store applies it only while that still holds.
    handle: int
    model: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    latency_ms: float | None = None
    #: The fact check of a summary (docs/design.md §6); None for a preview.
    facts: FactCheck | None = None


@dataclass(frozen=True, slots=True)
class ApplyOutcome:
    """What applying a batch of replacements did: its events (one `applied` event per
    `event_groups` group, or `conflict` events for the ranges that changed since the snapshot,
    grouped the same way), and whether it lost such a race (then nothing of the batch was
    written)."""

    events: list[Event]
    conflict: bool


def event_groups(replacements: Sequence[Replacement]) -> list[list[int]]:
    """Which replacements of one batch share an event, as lists of their indexes in order
    (docs/design.md §7, "one masking pass, one event").

    A batch is one rung's replacements in one transaction. Masking writes every old output
    of the context in one pass (hundreds on a long run): one event for the whole pass, with
    the lineage and the offload of each message, keeps the audit readable. Every other rung
    writes one event per range, which names its summary message and its offload."""
    if replacements and all(r.edit.strategy == s8_mask.STRATEGY for r in replacements):
        return [list(range(len(replacements)))]
    return [[k] for k in range(len(replacements))]


def next_handle_after(current: int, replacements: Sequence[Replacement]) -> int:
    """The session's handle counter once `replacements` are applied at counter `current`."""
    return max(current, *(r.handle + 1 for r in replacements))


def _with_tag(text: str, handle: int) -> str:
    return f"{text}\n{offload_tag(handle)}"


def preview(
    msg: Msg, config: AutoContextConfig, handle: int, chars: int | None = None, facts: int = 0
) -> Msg:
    """S2/S3 and masking: the first `preview_chars` characters (`chars` when given: masking's
    `mask_preview_chars`), '...', a newline and the tag; with `facts` (masking's
    `mask_fact_chars`), a line before the tag of the output's best facts that the head does not
    show, within that many characters (docs/design.md §3).

    Role and name stay; a tool message keeps every result's call id and tool name (the tag goes
    on the last one); an assistant message that makes tool calls (masking's, docs/design.md §3)
    keeps every call's id and name, its arguments still a JSON object whose strings longer than
    the preview are cut to their heads, and its opaque blocks (thinking) whole; its text's head
    carries the tag.
    """
    n = config.preview_chars if chars is None else chars
    if msg.role == "tool":
        results = msg.tool_results
        blocks: list[Block] = []
        for k, r in enumerate(results):
            head = r.output_text[:n] + "..."
            line = _facts_line(r.output_text, head, facts)
            if line:
                head = f"{head}\n{line}"
            if k == len(results) - 1:
                head = _with_tag(head, handle)
            blocks.append(ToolResultBlock(r.tool_use_id, head, r.name))
        return Msg("tool", tuple(blocks), name=msg.name, kind="preview")
    if msg.role == "assistant" and msg.tool_uses:
        text = msg.text or ""
        shown = text if len(text) <= n else text[:n] + "..."
        # A provider's opaque blocks (a signed thinking block) stay as they are, first: the
        # Messages API wants a tool-using turn's thinking back unchanged, before its calls.
        out: list[Block] = [b for b in msg.content if isinstance(b, OpaqueBlock)]
        out.append(TextBlock(_with_tag(shown, handle)))
        out += [
            ToolUseBlock(b.id, b.name, _masked_arguments(b.arguments, n), b.extra)
            for b in msg.content
            if isinstance(b, ToolUseBlock)
        ]
        return Msg(msg.role, tuple(out), name=msg.name, kind="preview")
    text = msg.text or _opaque_text(msg)
    return Msg(
        msg.role, (TextBlock(_with_tag(text[:n] + "...", handle)),), name=msg.name, kind="preview"
    )


def _masked_arguments(args: str, n: int) -> str:
    """A masked call's arguments: the same JSON object with every string longer than `n` cut
    to its first `n` characters and '...' (the keys and the short values, such as a path,
    stay in view); arguments that are not a JSON object become `{"masked_arguments": head}`."""
    if len(args) <= n:
        return args
    try:
        value = json.loads(args)
    except ValueError:
        return json.dumps({"masked_arguments": args[:n] + "..."})
    if not isinstance(value, dict):
        return json.dumps({"masked_arguments": args[:n] + "..."})
    return json.dumps(
        {k: (v[:n] + "..." if isinstance(v, str) and len(v) > n else v) for k, v in value.items()}
    )


#: Facts a masked preview's line chooses from (the extractor's best, in its order).
_PREVIEW_FACTS: Final = 12


def _facts_line(text: str, head: str, chars: int) -> str:
    """The facts line of a masked output: its best facts not in `head`, best first while they
    fit in `chars` (a fact that does not fit is passed over for a shorter one after it)."""
    if chars <= 0 or len(text) <= len(head):
        return ""
    shown = normalize(head)
    picked: list[str] = []
    used = len(_FACTS_OPENING)
    for fact in extract([("output", text)], _PREVIEW_FACTS):
        if fact.key in shown:
            continue
        cost = len(fact.text) + len(_FACTS_SEPARATOR)
        if used + cost > chars:
            continue
        picked.append(fact.text)
        used += cost
    return _FACTS_OPENING + _FACTS_SEPARATOR.join(picked) if picked else ""


_FACTS_OPENING: Final = "facts: "
_FACTS_SEPARATOR: Final = " | "


def summarized_payload(msg: Msg, summary: str, handle: int) -> Msg:
    """S5: only the text/output is replaced; every tool_use and tool_result keeps its id and name.

    Large tool-call arguments become a small JSON object naming the offload's handle, so the
    call stays valid JSON.
    """
    tagged = _with_tag(summary, handle)
    if msg.role == "tool":
        results = msg.tool_results
        last = results[-1].tool_use_id
        blocks: list[Block] = [
            ToolResultBlock(
                r.tool_use_id,
                tagged if k == len(results) - 1 else f"[summarized with the result of call {last}]",
                r.name,
            )
            for k, r in enumerate(results)
        ]
        return Msg("tool", tuple(blocks), name=msg.name, kind="large_summary")
    out: list[Block] = [TextBlock(tagged)]
    for b in msg.content:
        if isinstance(b, ToolUseBlock):
            args = b.arguments
            if len(args) > _LARGE_ARGUMENTS_CHARS:
                args = json.dumps({"offloaded_arguments": handle})
            out.append(ToolUseBlock(b.id, b.name, args, b.extra))
    return Msg(msg.role, tuple(out), name=msg.name, kind="large_summary")


def _opaque_text(msg: Msg) -> str:
    kinds = [str(b.data.get("type", "opaque")) for b in msg.content if isinstance(b, OpaqueBlock)]
    return "[" + ", ".join(kinds) + "]"
