"""The offload tag that ends every replacement text, and how it is kept out of LLM traffic.

A summarizer that sees ``<!-- CONTEXT_OFFLOAD: uuid=... -->`` in its input tends to copy it, and
an answer that carries a tag is rejected (docs/design.md §4), so every transcript neutralizes
the tags it renders.
"""

from __future__ import annotations

import re
from typing import Final

#: Matches one offload tag; group ``uuid`` is the offload id. Whitespace and the id's shape are
#: matched leniently on purpose: the regex also serves to reject LLM answers, and a model that
#: copies a tag rarely copies it byte for byte.
OFFLOAD_TAG_RE: Final = re.compile(r"<!--\s*CONTEXT_OFFLOAD:\s*uuid=(?P<uuid>[^\s>]*?)\s*-->")

#: The bare marker; an answer carrying it even without the comment syntax is refused too.
OFFLOAD_MARKER: Final = "CONTEXT_OFFLOAD"


def offload_tag(uuid: str) -> str:
    """The tag that ends every replacement text: ``<!-- CONTEXT_OFFLOAD: uuid=<uuid> -->``."""
    return f"<!-- {OFFLOAD_MARKER}: uuid={uuid} -->"


def offload_reference(offload_id: str) -> str:
    """How a text other than the tag names an offload (the fact check's index line): by the
    id its tag carries, which `context_reload` takes."""
    return f"offload {offload_id}"


def neutralize_tags(text: str) -> str:
    """Replace offload tags by ``[offloaded context <uuid>]`` and drop any stray marker.

    The reference to the offload survives (a reader can still reload it), but nothing that looks
    like a tag reaches a summarizer's input or output.
    """
    if OFFLOAD_MARKER not in text:
        return text
    text = OFFLOAD_TAG_RE.sub(lambda m: f"[offloaded context {m.group('uuid')}]", text)
    return text.replace(OFFLOAD_MARKER, "offloaded context")
