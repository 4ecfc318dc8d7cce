"""The offload tag that ends every replacement text, and how it is kept out of LLM traffic.

The tag names its offload by the offload's handle, a per-session number: ``<!-- offload 12 -->``
(docs/design.md §4). Sessions written before handles hold the design's first form,
``<!-- CONTEXT_OFFLOAD: uuid=... -->``, which still reloads, is still refused in an answer and is
still neutralized. A summarizer that sees a tag in its input tends to copy it, and an answer
that carries a tag is rejected, so every transcript neutralizes the tags it renders.

`offload_tag` is the one place the identifier the model sees is rendered: whatever shows an
offload to a model (a replacement's tag, an index line) goes through it.
"""

from __future__ import annotations

import re
from typing import Final

#: Matches one offload tag, of either form: group ``handle`` is the handle of the current form,
#: group ``uuid`` the offload id of the first form. Whitespace, case and the separator are matched
#: leniently on purpose: the regex also serves to reject LLM answers, and a model that copies a
#: tag rarely copies it byte for byte.
OFFLOAD_TAG_RE: Final = re.compile(
    r"<!--\s*(?:CONTEXT_OFFLOAD:\s*uuid=(?P<uuid>[^\s>]*?)"
    r"|offload\s*[#:=]?\s*(?P<handle>\d+))\s*-->",
    re.IGNORECASE,
)

#: The first form's marker word; an answer carrying it even without the comment syntax is
#: refused too (it names nothing else).
OFFLOAD_MARKER: Final = "CONTEXT_OFFLOAD"

#: The word of the current tag. Unlike the first form's marker it is an ordinary word, so only
#: the tag's syntax around it marks a tag.
OFFLOAD_WORD: Final = "offload"


#: Tokens of a tag and the newline before it, at most, for the estimates of what a replacement
#: costs: 7 in o200k_base and cl100k_base for every handle under a million (measured, and
#: checked by `test_transcript::test_the_tag_costs_at_most_eight_tokens`), and one of margin.
TAG_TOKENS: Final = 8


def offload_tag(handle: int | str) -> str:
    """The tag that ends every replacement text, ``<!-- offload <handle> -->``: at most 8 tokens
    in o200k_base and cl100k_base for any handle under a million (the first form's uuid tag
    cost 45). The model passes the handle to ``context_reload``."""
    return f"<!-- {OFFLOAD_WORD} {handle} -->"


def tag_ids(text: str) -> list[str]:
    """The offload ids the tags of `text` name, in order: a handle's digits, or a uuid."""
    return [m.group("handle") or m.group("uuid") for m in OFFLOAD_TAG_RE.finditer(text)]


def offload_reference(handle: int | str) -> str:
    """How a text other than the tag names an offload (the fact check's index line): as the tag
    names it, ``offload <handle>``, which `context_reload` takes."""
    return f"{OFFLOAD_WORD} {handle}"


def neutralize_tags(text: str) -> str:
    """Replace offload tags by ``[offloaded context <id>]`` and drop any stray first-form marker.

    The reference to the offload survives (a reader can still reload it), but nothing that looks
    like a tag reaches a summarizer's input or output.
    """
    if OFFLOAD_MARKER not in text and "<!--" not in text:
        return text
    text = OFFLOAD_TAG_RE.sub(
        lambda m: f"[offloaded context {m.group('handle') or m.group('uuid')}]", text
    )
    return text.replace(OFFLOAD_MARKER, "offloaded context")
