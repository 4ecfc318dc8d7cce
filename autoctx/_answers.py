"""What every summarizer answer must pass before it replaces anything: not empty, not a refusal,
no offload tag or marker (nor a look-alike of one), storable in PostgreSQL text."""

from __future__ import annotations

import logging
import re
import unicodedata
from typing import TYPE_CHECKING, Final

from ._arguments import unstorable
from ._errors import SummarizerError
from ._tags import OFFLOAD_MARKER, OFFLOAD_TAG_RE

if TYPE_CHECKING:
    # The openai package takes about half a second to import; the offline path never needs it.
    pass


_log = logging.getLogger("autoctx")


#: A refusal written as plain text (no `refusal` field, finish_reason "stop"), as many
#: OpenAI-compatible servers send one: short, and opening with an apology or an "I can't".
#: A summary of a transcript does not open that way; a long answer that does is kept.
_REFUSAL_MAX_CHARS: Final = 400
_APOSTROPHE: Final = "['\u2019]"  # typed or typographic
_REFUSAL_RE: Final = re.compile(
    rf"^\W*(?:(?:i{_APOSTROPHE}?m|i\s+am)\s+(?:so\s+|very\s+|really\s+)?sorry|sorry\b"
    r"|(?:my\s+)?apologies|i\s+apologi[sz]e|as\s+an\s+ai\b"
    rf"|(?:i\s+(?:can(?:no|{_APOSTROPHE})t|won{_APOSTROPHE}?t|will\s+not)"
    rf"|(?:i{_APOSTROPHE}?m|i\s+am)\s+(?:not\s+able|unable)\s+to)"
    r"\s+(?:help|assist|comply|provide|do\s+that|summari[sz]e|fulfil))",
    re.IGNORECASE,
)


#: Latin look-alikes of the letters of the marker, from the Cyrillic and Greek alphabets (after
#: NFKC and casefolding), so that a model cannot smuggle a tag past the check by accident.
_LOOKALIKES: Final = str.maketrans(
    {
        "\u0430": "a", "\u03b1": "a",  # Cyrillic a, Greek alpha
        "\u0441": "c", "\u03f2": "c",  # Cyrillic es, Greek lunate sigma
        "\u0501": "d",  # Cyrillic komi de
        "\u0435": "e", "\u03b5": "e",  # Cyrillic ie, Greek epsilon
        "\u04cf": "l", "\u0456": "l", "\u03b9": "l",  # Cyrillic palochka and i, Greek iota
        "\u043e": "o", "\u03bf": "o", "\u03c3": "o",  # Cyrillic o, Greek omicron and sigma
        "\u0442": "t", "\u03c4": "t",  # Cyrillic te, Greek tau
        "\u0445": "x", "\u03c7": "x",  # Cyrillic ha, Greek chi
        "\u043f": "n", "\u03b7": "n",  # Cyrillic pe, Greek eta
    }
)  # fmt: skip
_NOT_MARKER_CHARS: Final = re.compile(r"[^a-z0-9_]+")


def _skeleton(text: str) -> str:
    """`text` in the form the marker check compares: compatibility forms folded (NFKC), lower
    case, look-alike letters mapped to Latin, anything but letters, digits and underscores a
    space (so "context offloading" stays prose, and a look-alike "CONTEXT_OFFLOAD" does not)."""
    folded = unicodedata.normalize("NFKC", text).casefold().translate(_LOOKALIKES)
    return _NOT_MARKER_CHARS.sub(" ", folded)


_MARKER_SKELETON: Final = _skeleton(OFFLOAD_MARKER)


def carries_tag(text: str) -> bool:
    """Whether `text` holds an offload tag or the marker, or a look-alike of either: what no
    summary may carry (docs/design.md §4)."""
    return bool(OFFLOAD_TAG_RE.search(text)) or _MARKER_SKELETON in _skeleton(text)


def check_answer(text: str, *, shared: bool = False) -> str:
    """The answer, stripped, or `SummarizerError` when it cannot become a summary.

    The compressor applies it to every summarizer's answer, a caller's own included. With
    `shared` (the answer to a request shared by several messages, docs/design.md §3), only
    what fails the whole answer is checked, emptiness and a refusal: a tag or a character
    PostgreSQL cannot store fails only the summary it is in, which the compressor checks as
    an answer of its own once the answer is split.
    """
    answer = text.strip()
    if not answer:
        raise SummarizerError(
            "empty", f"the answer is {'empty' if not text else 'only whitespace'}"
        )
    if shared:
        _check_refusal(answer)
        return answer
    # An answer is data, never trusted (docs/design.md §6): what the database cannot store
    # becomes a failed event, not a database error at commit. No excerpt of it is quoted.
    if unstorable(answer) is not None:
        raise SummarizerError(
            "bad_answer",
            "the answer holds a NUL character or a lone UTF-16 surrogate, which PostgreSQL "
            "text cannot store",
        )
    if carries_tag(answer):
        raise SummarizerError(
            "tag_in_answer",
            "the answer contains an offload tag or the CONTEXT_OFFLOAD marker (or a look-alike "
            "of it); a summary must not carry one",
        )
    _check_refusal(answer)
    return answer


def _check_refusal(answer: str) -> None:
    if len(answer) <= _REFUSAL_MAX_CHARS and _REFUSAL_RE.match(answer):
        raise SummarizerError(
            "refusal", f"the answer reads as a refusal ({len(answer)} characters)"
        )
