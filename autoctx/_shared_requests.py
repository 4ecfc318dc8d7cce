"""Several large messages in one summarizer request (S5, docs/design.md §3).

S5 summarizes each large message of the current round on its own, but the messages of one pass
need not cost one summarizer call each: those that fit one request's input bound go out
together, and each still gets its own summary, offload, event and replacement. This module is
the format such a shared request and its answer take, the same for every summarizer (the
offline one answers it, an LLM is told it by the prompt):

- the transcript holds the messages one after the other, each under a header line
  ``=== MESSAGE k of n (c characters) ===`` (c: the message's original size);
- the answer holds one summary per message, each under a line ``=== SUMMARY k ===``.

A line of a message that could be read as one of these headers is wrapped in parentheses
before it goes out, so that only autoctx's own headers split a transcript, and a summary that
copies such a line verbatim cannot be taken for the start of another message's summary.

It also groups a pass's messages into as few requests as fit the bound (`group`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from ._answers import check_answer
from ._errors import SummarizerError

#: A message's header in a shared request's transcript (what `join_parts` writes).
_MESSAGE_RE: Final = re.compile(
    r"^=== MESSAGE (\d+) of (\d+) \((\d+) characters\) ===[ \t]*$", re.MULTILINE
)
#: A summary's header in an answer. An LLM may dress the line up (bold, a heading, a bullet)
#: or drop its closing signs: all of that is still the header, and nothing else is on it.
_SUMMARY_RE: Final = re.compile(
    r"^[ \t>*#_-]*=+[ \t]*SUMMARY[ \t]+(\d+)[ \t]*[=*_:]*[ \t]*$", re.MULTILINE | re.IGNORECASE
)
#: A line of a message that either kind of header could be read into.
_LOOKALIKE_RE: Final = re.compile(
    r"^([ \t>*#_-]*=+[ \t]*(?:MESSAGE|SUMMARY)\b.*)$", re.MULTILINE | re.IGNORECASE
)


def message_header(number: int, count: int, chars: int) -> str:
    """The header line of message `number` (from 1) of `count` in a shared request."""
    return f"=== MESSAGE {number} of {count} ({chars} characters) ==="


def summary_header(number: int) -> str:
    """The header line of the summary of message `number` in an answer."""
    return f"=== SUMMARY {number} ==="


def _escaped(text: str) -> str:
    return _LOOKALIKE_RE.sub(r"(\1)", text)


def join_parts(transcripts: Sequence[str], chars: Sequence[int]) -> str:
    """The transcript of a shared request: each message's transcript under its header."""
    count = len(transcripts)
    return "\n\n".join(
        f"{message_header(k + 1, count, size)}\n{_escaped(text)}"
        for k, (text, size) in enumerate(zip(transcripts, chars, strict=True))
    )


@dataclass(frozen=True, slots=True)
class Part:
    """One message of a shared request, as a summarizer reads it back (`split_parts`)."""

    transcript: str
    #: The message's original size, as its header states it.
    chars: int


def split_parts(transcript: str) -> list[Part] | None:
    """The messages of a shared request's transcript, or None when `transcript` is not one
    (it must open with the header of message 1 of n and hold the n headers in order)."""
    headers = list(_MESSAGE_RE.finditer(transcript))
    if not headers or transcript[: headers[0].start()].strip():
        return None
    count = int(headers[0][2])
    numbers = [(int(h[1]), int(h[2])) for h in headers]
    if count < 1 or numbers != [(k + 1, count) for k in range(count)]:
        return None
    parts: list[Part] = []
    for k, header in enumerate(headers):
        end = headers[k + 1].start() if k + 1 < len(headers) else len(transcript)
        parts.append(Part(transcript[header.end() : end].strip("\n"), int(header[3])))
    return parts


def join_answers(summaries: Sequence[str]) -> str:
    """An answer to a shared request: each summary under its header, in order."""
    return "\n\n".join(
        f"{summary_header(k + 1)}\n{_escaped(text)}" for k, text in enumerate(summaries)
    )


def split_answer(answer: str, count: int) -> list[str | SummarizerError]:
    """The summary of each of the `count` messages of a shared request, in order, or the
    failure of that message alone.

    A message's summary is the text under its header, up to the next header of any number;
    what comes before the first header (an LLM's preamble) and under the header of a number
    outside 1..count belongs to no message and is dropped. A message whose header is missing,
    or whose summary is empty, fails with reason ``empty``; one whose header comes more than
    once fails with reason ``bad_answer`` (which of them is its summary cannot be known). An
    answer with no header at all fails every message, as an answer of its own would: with the
    reason `check_answer` gives it (empty, a refusal...), else ``empty``. Each summary found is
    still to be checked as an answer of its own (`check_answer`)."""
    headers = list(_SUMMARY_RE.finditer(answer))
    if not headers:
        try:
            check_answer(answer)
        except SummarizerError as exc:
            return [exc] * count
        return [
            SummarizerError(
                "empty",
                f"the shared answer has no summary headers; message {k + 1} of {count} has no "
                "summary",
            )
            for k in range(count)
        ]
    found: dict[int, list[str]] = {}
    for k, header in enumerate(headers):
        end = headers[k + 1].start() if k + 1 < len(headers) else len(answer)
        found.setdefault(int(header[1]), []).append(answer[header.end() : end].strip())
    out: list[str | SummarizerError] = []
    for number in range(1, count + 1):
        texts = found.get(number, [])
        if len(texts) > 1:
            out.append(
                SummarizerError(
                    "bad_answer",
                    f"the shared answer has {len(texts)} summaries of message {number} of {count}",
                )
            )
        elif not texts or not texts[0]:
            out.append(
                SummarizerError(
                    "empty",
                    f"the shared answer has {'an empty' if texts else 'no'} summary of message "
                    f"{number} of {count}",
                )
            )
        else:
            out.append(texts[0])
    return out


def group(sizes: Sequence[int], bound: int) -> list[list[int]]:
    """The indices of `sizes` in as few groups as fit `bound` each (first fit, in order: each
    goes into the first group it fits, or opens one; a group keeps its members in order). A
    size that alone reaches the bound gets a group of its own.

    Taking the first groups whole and grouping their members again gives the same groups, so
    that what the budget of a call lets through (`Compressor._affordable`) is what is sent.
    """
    groups: list[list[int]] = []
    room: list[int] = []
    for i, size in enumerate(sizes):
        need = min(max(size, 0), bound)
        for g, left in enumerate(room):
            if need <= left:
                groups[g].append(i)
                room[g] -= need
                break
        else:
            groups.append([i])
            room.append(bound - need)
    return groups
