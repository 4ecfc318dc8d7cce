"""The salient facts of the messages a compression replaces (docs/design.md §6, the fact check).

Pure, like the planners beside it: text in, ranked facts out; no LLM, no I/O, no clock. The
compressor checks every summary against what this finds (`autoctx._fact_check`), and
`mem.dropped()` asks which facts of a compression's originals the working context lacks now.

What counts as a fact, by rank (lower first):

0. the user's constraints: a sentence of a user message with must / never / do not / always
   (or their cheap equivalents in German, French and Spanish);
1. identifiers and hashes (uuids, hex digests, ``ABC-123``, ``req_8f3a``), error and exception
   names (``FileNotFoundError``, ``ENOENT``);
2. file paths and URLs;
3. numbers with a unit (``250 ms``, ``4 GB``) and ``key=value`` settings;
4. quoted strings in prose (a user's or an assistant's text, not JSON).

The order the bound and the index line keep: the user's constraints first; then what the
messages' prose says (the user's, the assistant's); then the exchanges: the calls' arguments
(what the agent did) and the tools' outputs (what it learned, the bulk, where ids and paths
abound). Each group is taken breadth first over its parts: every part's best fact, by rank,
before any part's second best, then in the order they appear. A path the user named outranks
the hundredth identifier of a file dump, and a fold's bound names something of each call and
each output it replaces. A label that stands more than once in a part (``id=`` on each line of
a log) is a column, not a name: its pairs rank as bare identifiers. What an earlier summary's
index line lists is read back whole, with the rank of what it is, in the part the line is in.

Bounded in every dimension, so that adversarial text costs no more than ordinary text: at most
`SCAN_HEAD + SCAN_TAIL` characters of each part and `SCAN_TOTAL` in all are read; every
pattern's repetitions are bounded and delimited by characters the repeated part cannot match
(no nested ambiguity, so no catastrophic backtracking on ReDoS-shaped input); a fact is at most
`FACT_MAX_CHARS`; at most `limit` facts are returned. A part is read as its head and its tail;
a fact that straddles either cut is left out whole, never returned as a fragment (the cut moves
back to a space, and the sentence or token it cuts is dropped).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Literal, TypeAlias

from .._messages import Msg, TextBlock, ToolResultBlock, ToolUseBlock

#: What a part of a message is: the role of its text, or a tool call's arguments, or a tool's
#: output, or a fact an index line in the part before it listed (read whole, in that part).
#: Quoted strings and constraints are read from prose only.
Source: TypeAlias = Literal["user", "assistant", "system", "arguments", "output", "listed"]

#: How an index line begins (what a reader, or the bench, finds it by), what stands between
#: its opening and its facts, and between two facts: `index_line_text` writes the line (for
#: `autoctx._fact_check`), `_split_index_lines` reads an earlier one back.
INDEX_PREFIX: Final = "Not in this summary"
_INDEX_FACTS_AFTER: Final = " for: "
INDEX_SEPARATOR: Final = " | "

#: Facts one compression lists at most (docs/design.md §6).
DEFAULT_LIMIT: Final = 32
#: Characters read from the head and the tail of one part, and from all parts together.
SCAN_HEAD: Final = 12_000
SCAN_TAIL: Final = 4_000
SCAN_TOTAL: Final = 400_000
#: The longest fact kept (a longer token or sentence is no fact a summary could quote).
FACT_MAX_CHARS: Final = 200
#: Sentences longer than this are not read as constraints.
_SENTENCE_MAX_CHARS: Final = 300

CONSTRAINT: Final = 0
IDENTIFIER: Final = 1
#: An identifier with its label (``request_id=req_8f3a``): an identifier's rank, listed before
#: the bare identifiers of its source (the label says what it identifies).
LABELLED: Final = 5
LOCATION: Final = 2
VALUE: Final = 3
QUOTED: Final = 4

#: The marker of the offload tag (`autoctx._tags.OFFLOAD_MARKER`, spelled here so that the pure
#: core does not import the tag module's regexes): a fact carrying it is never listed, since a
#: summary must not carry a tag (docs/design.md §4).
_MARKER: Final = "context_offload"


@dataclass(frozen=True, slots=True)
class Fact:
    """One fact, verbatim as it stands in the original, with its rank and matching key."""

    text: str
    #: 0 (a user's constraint) to 4 (a quoted string): lower is kept first.
    rank: int
    #: `normalize(text)`: what a summary must contain for the fact to count as kept.
    key: str


# -- normalization -----------------------------------------------------------------------------

_QUOTES: Final = str.maketrans("", "", "\"'`\u2018\u2019\u201c\u201d\u00ab\u00bb")
_SPACES: Final = re.compile(r"\s+")


def normalize(text: str) -> str:
    """The form facts are matched in: case folded, quotes removed, backslashes as slashes,
    runs of whitespace as one space. Applied alike to a fact and to the text searched."""
    folded = text.casefold().translate(_QUOTES).replace("\\", "/")
    return _SPACES.sub(" ", folded).strip()


# -- the patterns: every repetition bounded, each repeated part unable to match its delimiter --

_UUID: Final = re.compile(
    r"(?<![0-9A-Za-z])[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
    r"(?![0-9A-Za-z])"
)
#: A hex digest or commit (7 to 64 hex digits, at least one digit and one letter).
_HEX: Final = re.compile(
    r"(?<![0-9A-Za-z_])(?=[0-9a-f]{0,63}[a-f])(?=[a-f]{0,63}[0-9])[0-9a-f]{7,64}(?![0-9A-Za-z_])"
)
#: An identifier with a separator and a digit: ``ABC-123``, ``req_8f3a``, ``build-2031``.
_IDENT: Final = re.compile(
    r"(?<![\w./-])(?=[A-Za-z0-9_-]{0,63}\d)[A-Za-z][A-Za-z0-9]{0,31}(?:[-_][A-Za-z0-9]{1,32}){1,6}"
    r"(?![\w/-])"
)
#: Error and exception names, and errno names.
_ERROR: Final = re.compile(
    r"(?<![\w.])(?:[A-Za-z_][A-Za-z0-9_]{0,40}\.){0,4}[A-Z][A-Za-z0-9]{0,60}"
    r"(?:Error|Exception|Fault|Failure|Panic|Timeout)(?![\w])"
    r"|(?<![\w])E[A-Z]{3,11}(?![\w])"
)
_URL: Final = re.compile(r"\b(?:https?|ftp|wss?|postgres(?:ql)?|s3|file)://[^\s<>\"'`]{1,190}")
#: A path: two segments or more with a slash (or backslash) between, or one after a root
#: (``/etc``, ``~/x``, ``./x``, ``C:\\x``); segments are runs of characters that cannot be the
#: separator, so the split is unambiguous.
_PATH: Final = re.compile(
    r"(?<![\w:/\\.-])(?:[A-Za-z]:|~|\.{1,2})?"
    r"(?:[/\\][\w.@+-]{1,80}){1,16}[/\\]?"
    r"|(?<![\w:/\\.-])[\w.@+-]{1,80}(?:[/\\][\w.@+-]{1,80}){1,16}"
)
_UNIT: Final = (
    r"(?:ms|us|ns|s|sec|secs|seconds?|min|mins|minutes?|h|hrs?|hours?|days?|"
    r"[kKMGTP]i?B|bytes?|B|kb|mb|gb|%|px|rpm|fps|req/s|rps|qps|tokens?|"
    r"°[CF]|[kKMG]?Hz|mV|V|W|kW|A|mA|cm|mm|km|m|kg|g|lbs?|USD|EUR|\$)"
)
_NUMBER_UNIT: Final = re.compile(
    rf"(?<![\w.])[$€£]?\d{{1,15}}(?:[.,]\d{{1,15}})?\s?{_UNIT}(?![A-Za-z0-9])"
)
_KEY_VALUE: Final = re.compile(
    r"(?<![\w.-])[A-Za-z_][\w.-]{0,40}=(?:[^\s,;&\"'`=]{1,80})(?![^\s,;&\"'`=])"
)
_QUOTED: Final = re.compile(
    r"\"([^\"\n]{3,120})\"|`([^`\n]{3,120})`|\u201c([^\u201d\n]{3,120})\u201d"
    r"|(?<![\w])'([^'\n]{3,120})'(?![\w])"
)
_CONSTRAINT_WORDS: Final = re.compile(
    r"\b(?:must|mustn't|never|always|do\s+not|don't|does\s+not|shall\s+not|should\s+not|"
    r"only\s+use|required?|forbidden|"
    r"muss|musst|müssen|darf(?:st)?\s+nicht|dürfen\s+nicht|niemals|nie|immer|"
    r"doit|doivent|jamais|toujours|ne\s+pas|"
    r"debe|deben|nunca|siempre|no\s+debe)\b",
    re.IGNORECASE,
)
_SENTENCE_END: Final = re.compile(r"(?<=[.!?;])\s+|\n+")
#: Where a window may be cut: nothing but a sentence or a quoted string holds one, and a
#: window's cut sentence is dropped, a quoted string cut in two has lost a quote.
_SEPARATORS: Final = frozenset(" \t\r\n,;\"'`<>()[]{}|")
_SEPARATOR: Final = re.compile(r"[\s,;\"'`<>()\[\]{}|]")
#: How far from a cut a separator is looked for (longer than any fact).
_SEPARATOR_REACH: Final = 256

_PATTERNS: Final[tuple[tuple[re.Pattern[str], int], ...]] = (
    (_UUID, IDENTIFIER),
    (_HEX, IDENTIFIER),
    (_ERROR, IDENTIFIER),
    (_IDENT, IDENTIFIER),
    (_URL, LOCATION),
    (_PATH, LOCATION),
    (_NUMBER_UNIT, VALUE),
    (_KEY_VALUE, VALUE),
)
_PROSE: Final = frozenset({"user", "assistant", "system"})
#: The order of the ranks within a source (a labelled identifier first among identifiers).
_ORDER: Final[dict[int, float]] = {
    CONSTRAINT: 0,
    LABELLED: 0.5,
    IDENTIFIER: 1,
    LOCATION: 2,
    VALUE: 3,
    QUOTED: 4,
}
#: The groups of the sources' facts after the constraints (see the module docstring): the
#: prose, then the exchanges (a call's arguments and the outputs take turns).
_TIERS: Final[dict[str, int]] = {
    "user": 0,
    "assistant": 0,
    "system": 0,
    "arguments": 1,
    "output": 1,
}
_PROSE_ROLES: Final[dict[str, Source]] = {
    "user": "user",
    "assistant": "assistant",
    "system": "system",
}
_TRAILING: Final = ".,;:!?)]}>'\""


# -- windows: what of a part is read --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Window:
    text: str
    #: The window begins (ends) inside the part: its first (last) token or sentence may be
    #: cut, and is not read.
    cut_before: bool
    cut_after: bool


def windows(text: str, head: int = SCAN_HEAD, tail: int = SCAN_TAIL) -> list[_Window]:
    """The head and the tail of `text` that are read, each cut at a separator (a space, a
    comma, a bracket, a quote: nothing a fact other than a sentence holds) near the cut, so
    that no token is split; a side whose cut has no separator near it is not read."""
    if len(text) <= head + tail:
        return [_Window(text, False, False)]
    out = []
    cut = _separator_before(text, head)
    if cut > 0:
        out.append(_Window(text[:cut], False, True))
    start = len(text) - tail
    found = _SEPARATOR.search(text, start, min(len(text), start + _SEPARATOR_REACH))
    if found is not None:
        out.append(_Window(text[found.end() :], True, False))
    return out


def _separator_before(text: str, end: int) -> int:
    """The index of the last separator before `end` within reach, or -1."""
    for k in range(end - 1, max(-1, end - 1 - _SEPARATOR_REACH), -1):
        if text[k] in _SEPARATORS:
            return k
    return -1


# -- extraction ------------------------------------------------------------------------------


def _clean(token: str) -> str:
    return token.rstrip(_TRAILING) if token[-1:] in _TRAILING else token


def _from_window(window: _Window, source: Source) -> Iterable[tuple[int, int, str]]:
    """(rank, position, text) of each fact found in one window."""
    text = window.text
    for pattern, rank in _PATTERNS:
        for m in pattern.finditer(text):
            found = _clean(m.group(0))
            if len(found) >= 3:
                labelled = pattern is _KEY_VALUE and _labels_an_identifier(found)
                yield (LABELLED if labelled else rank), m.start(), found
    if source in _PROSE:
        for m in _QUOTED.finditer(text):
            inner = next(g for g in m.groups() if g is not None).strip()
            if len(inner) >= 3:
                yield QUOTED, m.start(), inner
    if source == "user":
        yield from _constraints(window)


def _labels_an_identifier(pair: str) -> bool:
    """Whether ``key=value`` names an identifier (``request_id=req_8f3a``,
    ``commit=3f9a2c1``): a value with a letter and a digit that is no number with a unit."""
    value = pair.partition("=")[2]
    return (
        any(c.isdigit() for c in value)
        and any(c.isalpha() for c in value)
        and _NUMBER_UNIT.fullmatch(value) is None
    )


def _constraints(window: _Window) -> Iterable[tuple[int, int, str]]:
    text = window.text
    pieces = _SENTENCE_END.split(text)
    # The first and last sentence of a window cut inside the part may be cut themselves.
    start = 1 if window.cut_before else 0
    stop = len(pieces) - 1 if window.cut_after else len(pieces)
    position = 0
    for k, piece in enumerate(pieces):
        if start <= k < stop:
            sentence = piece.strip()
            if (
                8 <= len(sentence) <= _SENTENCE_MAX_CHARS
                and len(sentence) <= FACT_MAX_CHARS
                and _CONSTRAINT_WORDS.search(sentence)
            ):
                yield CONSTRAINT, position, sentence.rstrip(".!?; ")
        position += len(piece) + 1


@dataclass(frozen=True, slots=True)
class _Found:
    """Where `extract` found a key at its best: the place it sorts by (constraints, then the
    sources' tiers, each by rank), the part it stands in and its position in all parts."""

    place: tuple[int, float]
    part: int
    position: int
    text: str
    rank: int


def extract(parts: Iterable[tuple[Source, str]], limit: int = DEFAULT_LIMIT) -> tuple[Fact, ...]:
    """The facts of `parts` ((source, text) in message order), in the order of the module
    docstring; one per matching key, none contained in a better one, at most `limit`."""
    if limit <= 0:
        return ()
    found: dict[str, _Found] = {}
    budget = SCAN_TOTAL
    order = 0
    part = -1
    tier = 0
    for source, text in parts:
        if source != "listed":
            # A listed fact belongs to the part it was listed in, the one before it: it takes
            # that part's turns and stands in its group (a summary's prose, or the exchanges
            # for S5's summary inside a tool's output).
            part += 1
            tier = _TIERS[source]
        if budget <= 0:
            break
        if not text:
            continue
        text = text[: budget + SCAN_TAIL] if len(text) > budget + SCAN_TAIL else text
        head = min(SCAN_HEAD, budget)
        items: list[tuple[int, int, str]] = []
        if source == "listed":
            # A fact an earlier index line listed, whole, as it was found (a constraint is a
            # sentence the patterns would cut into its identifiers).
            budget -= len(text)
            items.append((_listed_rank(text), order, text))
            order += len(text) + 1
        else:
            for window in windows(text, head, SCAN_TAIL):
                budget -= len(window.text)
                items.extend(
                    (rank, order + position, fact)
                    for rank, position, fact in _from_window(window, source)
                )
                order += len(window.text) + 1
        repeated = _repeated_labels(items)
        for rank, position, fact in items:
            if len(fact) > FACT_MAX_CHARS or _MARKER in fact.casefold():
                continue
            key = normalize(fact)
            if len(key) < 3:
                continue
            if rank == LABELLED and fact.partition("=")[0] in repeated:
                rank = IDENTIFIER
            place = (0 if rank == CONSTRAINT else 1 + tier, _ORDER[rank])
            seen = found.get(key)
            if seen is None or place < seen.place:
                reported = IDENTIFIER if rank == LABELLED else rank
                found[key] = _Found(place, part, position, fact, reported)
    out: list[Fact] = []
    for key, best in _breadth_first(found):
        # A fact inside a better one (a path inside a URL, an id inside a constraint) is kept
        # by whatever keeps the better one; listing it too would only spend the bound.
        if any(key in kept.key for kept in out):
            continue
        out.append(Fact(best.text, best.rank, key))
        if len(out) >= limit:
            break
    return tuple(out)


def _repeated_labels(items: Iterable[tuple[int, int, str]]) -> frozenset[str]:
    """The labels of a part's labelled identifiers that stand more than once in it: the
    column of a log or a table (``id=`` on every line), which identifies one row each, not
    what the part is about."""
    seen: set[str] = set()
    repeated: set[str] = set()
    for rank, _, fact in items:
        if rank == LABELLED:
            label = fact.partition("=")[0]
            (repeated if label in seen else seen).add(label)
    return frozenset(repeated)


def _breadth_first(found: dict[str, _Found]) -> list[tuple[str, _Found]]:
    """The keys in the order kept: by group (the user's constraints, the prose, the exchanges:
    a call's arguments and the tools' outputs); within a group, breadth first over the parts
    (every part's best fact before any part's second best, so that a bound names something of
    each message replaced rather than spending itself on the first output's ids), then by rank,
    then in the order they appear."""
    by_part = sorted(found.items(), key=lambda kv: (kv[1].place, kv[1].position))
    rounds: dict[str, int] = {}
    taken: dict[tuple[int, int], int] = {}
    for key, best in by_part:
        slot = (best.place[0], best.part)
        rounds[key] = taken.get(slot, 0)
        taken[slot] = rounds[key] + 1
    return sorted(
        by_part, key=lambda kv: (kv[1].place[0], rounds[kv[0]], kv[1].place[1], kv[1].position)
    )


def _listed_rank(fact: str) -> int:
    """The rank of a fact an index line listed: a sentence with a constraint's words is a
    constraint (only a user's constraint is listed as a sentence), else the rank of the
    pattern it is, else a quoted string's."""
    if " " in fact.strip() and _CONSTRAINT_WORDS.search(fact):
        return CONSTRAINT
    for pattern, rank in _PATTERNS:
        if pattern.fullmatch(fact):
            labelled = pattern is _KEY_VALUE and _labels_an_identifier(fact)
            return LABELLED if labelled else rank
    return QUOTED


def index_line_text(ref: str, facts: Sequence[str]) -> str:
    """The index line naming `facts` and where to reload them from (`ref`, the offload as
    the agent names it)."""
    return f"{INDEX_PREFIX}, reload {ref}{_INDEX_FACTS_AFTER}{INDEX_SEPARATOR.join(facts)}"


def _split_index_lines(text: str) -> tuple[str, list[str]]:
    """`text` without its index lines (an earlier summary's, see `autoctx._fact_check`), and
    the facts those lines listed, in order."""
    if INDEX_PREFIX not in text:
        return text, []
    kept: list[str] = []
    listed: list[str] = []
    for line in text.split("\n"):
        opening, sep, facts = line.partition(_INDEX_FACTS_AFTER)
        if sep and opening.startswith(INDEX_PREFIX):
            listed.extend(f for f in facts.split(INDEX_SEPARATOR) if f.strip())
        else:
            kept.append(line)
    return "\n".join(kept), listed


def parts_of(msgs: Sequence[Msg]) -> list[tuple[Source, str]]:
    """What of each message is read, in order: its text (by role), its calls' arguments and
    its results' outputs. The facts an earlier summary's index line lists follow the text
    they were listed in, to be read whole (docs/design.md §6): read by the patterns, a
    constraint the line carried was only its identifiers at the next compression, and lost."""
    out: list[tuple[Source, str]] = []
    for m in msgs:
        # Only what a compression wrote holds an index line (an original's text that looks
        # like one is read as the text it is).
        written = m.kind != "original"
        for block in m.content:
            if isinstance(block, TextBlock):
                _read(out, _PROSE_ROLES.get(m.role, "output"), block.text, written)
            elif isinstance(block, ToolUseBlock):
                out.append(("arguments", _arguments_text(block.arguments)))
            elif isinstance(block, ToolResultBlock):
                _read(out, "output", block.output_text, written)
    return out


def _read(out: list[tuple[Source, str]], source: Source, text: str, written: bool) -> None:
    if not written:
        out.append((source, text))
        return
    text, listed = _split_index_lines(text)
    out.append((source, text))
    out.extend(("listed", fact) for fact in listed)


def _arguments_text(arguments: str) -> str:
    """A call's arguments as ``key=value`` lines when they are a flat JSON object (how a
    summary states them), else as they are."""
    if len(arguments) > SCAN_HEAD:
        return arguments
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return arguments
    if not isinstance(parsed, dict):
        return arguments
    lines = []
    for key, value in parsed.items():
        if isinstance(value, str | int | float) and not isinstance(value, bool):
            # A string value is stated as itself; a number with its key (``timeout=30``).
            lines.append(value if isinstance(value, str) else f"{key}={value}")
    return "\n".join(lines)


def facts_of(msgs: Sequence[Msg], limit: int = DEFAULT_LIMIT) -> tuple[Fact, ...]:
    """`extract` over the messages `msgs`."""
    return extract(parts_of(msgs), limit)


def missing(facts: Iterable[Fact], text: str) -> list[Fact]:
    """The facts of `facts` that `text` does not contain (normalized), in their order."""
    haystack = normalize(text)
    return [f for f in facts if f.key not in haystack]
