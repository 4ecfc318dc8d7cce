"""What a compression's originals said that the working context does not show now
(`mem.dropped(event_id)`, `autoctx dropped`, the `context_dropped` tool: docs/design.md §6).

Pure: the originals behind a compression and the working context in, the missing facts out,
through the same extractor and matching as the check after every summary
(`autoctx._strategies.facts`). A fact counts as shown when any working message holds it
(normalized): the summary itself, its index line, or a later message that repeats it.
"""

from __future__ import annotations

from collections.abc import Sequence

from ._messages import Msg
from ._strategies.facts import facts_of, missing, normalize, parts_of


def working_text(working: Sequence[Msg]) -> str:
    """The working context as the facts are looked up in: every text, every call's arguments
    (as sent, and as `parts_of` reads them) and every result's output."""
    out: list[str] = []
    for m in working:
        out.extend(text for _, text in parts_of([m]))
        out.extend(call.arguments for call in m.tool_uses)
    return "\n".join(out)


def scrub_facts(facts: Sequence[str], erased: Sequence[Msg]) -> list[str]:
    """`facts` without those an erasure removes: every fact that stands in the erased
    messages' content (matched as the check matches, normalized), so that no stored fact list
    keeps a copy of erased text (docs/design.md §9)."""
    gone = normalize(working_text(erased))
    return [f for f in facts if normalize(f) not in gone]


def dropped_facts(originals: Sequence[Msg], working: Sequence[Msg]) -> list[str]:
    """The facts of `originals` (bounded and ranked as the check's) that `working` lacks."""
    return [f.text for f in missing(facts_of(originals), working_text(working))]
