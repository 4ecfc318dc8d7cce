"""Messages as one plain-text transcript, for LLM requests and for reload answers.

Every LLM request autoctx makes is plain text (SPEC.md section 3): the messages to summarize are
rendered here as a transcript, never sent as raw tool_call/tool messages, so that any
OpenAI-compatible endpoint accepts the request and no pairing rule of the API can reject it.
"""

from __future__ import annotations

from collections.abc import Sequence

from ._messages import Msg, OpaqueBlock, TextBlock, ToolResultBlock, ToolUseBlock
from ._tags import neutralize_tags


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


def _render_message(msg: Msg) -> list[str]:
    speaker = _speaker(msg)
    entries: list[str] = []
    pending_text: list[str] = []

    def flush_text() -> None:
        if pending_text:
            entries.append(_entry(speaker, "".join(pending_text)))
            pending_text.clear()

    for block in msg.content:
        if isinstance(block, TextBlock):
            pending_text.append(block.text)
        elif isinstance(block, OpaqueBlock):
            pending_text.append(_opaque_label(block))
        elif isinstance(block, ToolUseBlock):
            flush_text()
            arguments = block.arguments if block.arguments.strip() else "(no arguments)"
            entries.append(_entry(f"{speaker} -> tool call {block.name} id={block.id}", arguments))
        elif isinstance(block, ToolResultBlock):
            flush_text()
            name = block.name or "unknown tool"
            output = block.output_text
            entries.append(
                _entry(
                    f"tool result {name} id={block.tool_use_id}",
                    output if output.strip() else "(empty output)",
                )
            )
    flush_text()
    if not entries:
        entries.append(_entry(speaker, "(no content)"))
    return entries


def render_transcript(messages: Sequence[Msg], *, keep_tags: bool = False) -> str:
    """The messages as one plain-text transcript, one entry per text run, call or result.

    ``[user] ...``, ``[assistant] ...``, ``[assistant -> tool call read_file id=call_1] {...}``
    (arguments exactly as the model wrote them), ``[tool result read_file id=call_1] ...``;
    images and other opaque blocks appear as ``[image]`` / ``[opaque: <type>]``. Messages are
    separated by a blank line.

    Offload tags are neutralized (see `neutralize_tags`) unless ``keep_tags=True``: a
    summarizer must not see them, but an agent reading reloaded messages needs the tags of
    nested summaries to reload one level deeper.
    """
    text = "\n\n".join("\n".join(_render_message(m)) for m in messages)
    return text if keep_tags else neutralize_tags(text)


def original_chars(messages: Sequence[Msg]) -> int:
    """Characters of all text, tool-input JSON and outputs: the "original size" of SPEC.md S6."""
    return sum(m.payload_chars for m in messages)
