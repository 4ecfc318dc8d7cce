"""Recall across sessions (docs/design.md §9): what a search returns and the rules of its input.

Pure: the SQL is `autoctx._store.search`'s. A search is PostgreSQL full-text search over the
originals of one session, or of every session of the memory's tenant (an untenanted memory's:
every untenanted session), ranked by cover density; each hit says where its original is now,
so that it can be reloaded.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final, Literal, TypeAlias

from ._arguments import unstorable
from ._errors import InvalidSearch
from ._tags import neutralize_tags

SearchScope: TypeAlias = Literal["session", "tenant"]
SCOPES: Final[tuple[SearchScope, ...]] = ("session", "tenant")

#: The text search configurations of PostgreSQL 15, the oldest server autoctx supports (a copy
#: of migration 0008's list, which maps each to its constant in the generated column).
SEARCH_CONFIGS: Final = (
    "simple",
    "arabic",
    "armenian",
    "basque",
    "catalan",
    "danish",
    "dutch",
    "english",
    "finnish",
    "french",
    "german",
    "greek",
    "hindi",
    "hungarian",
    "indonesian",
    "irish",
    "italian",
    "lithuanian",
    "nepali",
    "norwegian",
    "portuguese",
    "romanian",
    "russian",
    "serbian",
    "spanish",
    "swedish",
    "tamil",
    "turkish",
    "yiddish",
)
#: No stemming and no stop words: ids, paths and exact words match as written.
DEFAULT_SEARCH_CONFIG: Final = "simple"
#: What `messages.search_config` holds for a session created with ``search_config=None``
#: (not indexed: its appends skip the vector, and a search finds nothing in it). No text search
#: configuration of PostgreSQL has this name.
NOT_INDEXED: Final = "none"

DEFAULT_LIMIT: Final = 10
MAX_LIMIT: Final = 100
#: Longer text is not a query but a document; PostgreSQL would still parse it whole.
MAX_QUERY_CHARS: Final = 1000
#: Characters of a snippet: enough for a couple of highlighted fragments on one line.
SNIPPET_CHARS: Final = 240
#: How ts_headline marks a matched word (`**word**`: plain Markdown bold, which models and
#: terminals both read).
HIGHLIGHT: Final = "**"
#: The separator the snippet's text carries instead of `/` while ts_headline parses it (the
#: index splits paths at `/`; so must the headline, to find and mark `main.py` in a path).
SLASH_STAND_IN: Final = "\x01"
#: How ts_headline marks a match in the SQL (control characters, which the text it reads never
#: holds: the SQL turns them into spaces), so that a `**` of the text is never taken for a mark.
MARK_START: Final = "\x02"
MARK_STOP: Final = "\x03"
#: A whole token around a match: word characters, and `-` or `.` between two of them
#: (`MARKER-0003`, `req-7f3a`, `v1.2`), which ts_headline marks part by part.
_TOKEN_JOINERS: Final = "-."


@dataclass(frozen=True, slots=True)
class AutoContextSearchHit:
    """One original that matches a search, best first in the list a search returns.

    Reload it with ``mem.reload(message_id=hit.message_id, session_id=hit.session_id)`` (that
    original, whole); when a compression took it out of the working context, `offload_handle`
    (the number its tag shows) and `offload_uuid` also name the offload that holds it with its
    neighbours (``mem.reload(hit.offload_handle, session_id=hit.session_id)``).
    """

    session_id: str
    message_id: int
    role: str
    created_at: datetime
    #: A short extract around the matched words, each marked ``**like this**``.
    snippet: str
    #: PostgreSQL's cover-density rank (`ts_rank_cd`, normalized by the message's length):
    #: higher is better, comparable within one search only.
    rank: float
    #: The offload that holds this original, if a compression replaced it; None otherwise.
    offload_uuid: uuid.UUID | None
    #: Whether the original is in its session's working context now (then nothing needs
    #: reloading for an agent working in that session).
    in_working_context: bool
    #: The handle of that offload (the number in its tag), if any.
    offload_handle: int | None = None


def validate_query(query: object) -> str:
    """The query as given; `InvalidSearch` for one that is empty, too long or not storable
    text (the message never repeats it)."""
    if not isinstance(query, str):
        raise InvalidSearch(
            f"the search query must be a string, got {type(query).__name__}; pass words, an id "
            "or a path, such as 'deploy failed' or '/srv/app/main.py'"
        )
    if not query.strip():
        raise InvalidSearch(
            "the search query is empty; pass words, an id or a path to look for, such as "
            "'deploy failed'"
        )
    if len(query) > MAX_QUERY_CHARS:
        raise InvalidSearch(
            f"the search query is {len(query)} characters long; the limit is {MAX_QUERY_CHARS}: "
            "search for the few words, ids or paths that matter"
        )
    if (problem := unstorable(query)) is not None:
        raise InvalidSearch(f"the search query {problem}")
    return query


def validate_scope(scope: object) -> SearchScope:
    if scope == "session":
        return "session"
    if scope == "tenant":
        return "tenant"
    # Not quoted: a model's tool call passes it, and the answer lands in its context.
    what = "another string" if isinstance(scope, str) else f"a {type(scope).__name__}"
    raise InvalidSearch(
        f"search scope must be 'session' (this session) or 'tenant' (every session of this "
        f"memory's tenant), got {what}"
    )


def validate_limit(limit: object, maximum: int = MAX_LIMIT) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= maximum:
        shown = repr(limit) if isinstance(limit, int | float) else type(limit).__name__
        raise InvalidSearch(
            f"search limit must be an integer from 1 to {maximum}, got {shown}; ask for the "
            "best few hits and refine the query for more"
        )
    return limit


def validate_search_config(value: object) -> str | None:
    """A text search configuration name autoctx can index with, or None for no index (raises
    ValueError)."""
    if value is not None and (not isinstance(value, str) or value not in SEARCH_CONFIGS):
        raise ValueError(
            f"search_config must be one of PostgreSQL's text search configurations "
            f"{', '.join(SEARCH_CONFIGS)}, or None (no search); got {value!r} ('simple', the "
            "default, matches ids, paths and words exactly as written; a language stems words)"
        )
    return value


def stored_search_config(value: str | None) -> str:
    """The `messages.search_config` value of a config's `search_config`."""
    return NOT_INDEXED if value is None else value


_TERM = re.compile(r"\S+")
_NEGATIONS = re.compile(r"-(?:\s*-)+")


def websearch_text(query: str) -> str:
    """The text given to `websearch_to_tsquery`: a term with `/` becomes the phrase of its
    parts, as the index splits paths (migration 0008), so that `/srv/app/main.py` matches that
    path and `main.py` matches it too. In a query that quotes phrases itself, `/` only
    separates."""
    # A run of negations is one negation to the reader, but PostgreSQL's parser stacks each
    # (32 at most: `"-" * 33` is an error): the run is collapsed first.
    query = _NEGATIONS.sub("-", query)
    if '"' in query:
        return query.replace("/", " ")

    def phrase(match: re.Match[str]) -> str:
        term = match.group(0)
        if "/" not in term:
            return term
        sign = "-" if term.startswith("-") else ""
        parts = term[len(sign) :].replace("/", " ").split()
        return f'{sign}"{" ".join(parts)}"' if parts else ""

    return _TERM.sub(phrase, query)


def clean_snippet(headline: str) -> str:
    """ts_headline's extract on one line, with its slashes back, each mark widened to the whole
    token it falls in (ts_headline marks `MARKER-0003` as two matches), tags neutralized and
    its length bounded (a cut never leaves a highlight open)."""
    text = " ".join(headline.replace(SLASH_STAND_IN, "/").split())
    plain, spans = _marks(text)
    spans = _whole_tokens(plain, spans)
    cut = len(plain) > SNIPPET_CHARS
    if cut:
        plain = plain[: SNIPPET_CHARS - 1].rstrip()
        spans = [(start, min(end, len(plain))) for start, end in spans if start < len(plain)]
    pieces: list[str] = []
    at = 0
    for start, end in spans:
        pieces += [plain[at:start], HIGHLIGHT, plain[start:end], HIGHLIGHT]
        at = end
    pieces.append(plain[at:])
    return neutralize_tags("".join(pieces) + ("…" if cut else ""))


def _marks(text: str) -> tuple[str, list[tuple[int, int]]]:
    """The text without ts_headline's marks, and the marked spans in it."""
    plain: list[str] = []
    spans: list[tuple[int, int]] = []
    length = 0
    start: int | None = None
    for part in re.split(f"([{MARK_START}{MARK_STOP}])", text):
        if part == MARK_START:
            start = length
        elif part == MARK_STOP:
            if start is not None and length > start:
                spans.append((start, length))
            start = None
        else:
            plain.append(part)
            length += len(part)
    if start is not None and length > start:
        spans.append((start, length))
    return "".join(plain), spans


def _whole_tokens(text: str, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Each span widened to the token it is part of; spans that then touch are merged."""

    def inside(i: int) -> bool:
        if not 0 <= i < len(text):
            return False
        if text[i].isalnum() or text[i] == "_":
            return True
        return (
            text[i] in _TOKEN_JOINERS
            and 0 < i < len(text) - 1
            and (text[i - 1].isalnum() or text[i - 1] == "_")
            and (text[i + 1].isalnum() or text[i + 1] == "_")
        )

    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        while inside(start - 1):
            start -= 1
        while inside(end):
            end += 1
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def _when(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def _reload_args(hit: AutoContextSearchHit, own_session: str) -> tuple[str, str | None]:
    """The `context_reload` arguments for the message itself and for its offload (if any)."""
    where = {} if hit.session_id == own_session else {"session_id": hit.session_id}
    message = json.dumps({"message_id": hit.message_id, **where})
    offload = (
        json.dumps({"offload": hit.offload_handle, **where})
        if hit.offload_handle is not None
        else json.dumps({"uuid": str(hit.offload_uuid), **where})
        if hit.offload_uuid is not None
        else None
    )
    return message, offload


def render_hit(number: int, hit: AutoContextSearchHit, own_session: str) -> str:
    """One hit as the `context_search` tool answers it: where it is, the snippet, how to reload."""
    session = (
        "this session" if hit.session_id == own_session else f"session {json.dumps(hit.session_id)}"
    )
    head = f"{number}. [{session}, message {hit.message_id}, {hit.role}, {_when(hit.created_at)}]"
    message, offload = _reload_args(hit, own_session)
    if hit.in_working_context and hit.session_id == own_session:
        how = "It is in your working context now."
    elif offload is not None:
        how = (
            f"Reload: context_reload {message} (this message) or {offload} (the part of the "
            "conversation it was compressed with)."
        )
    else:
        how = f"Reload: context_reload {message}."
    return f"{head} {hit.snippet}\n   {how}"


def render_hits(
    hits: Sequence[AutoContextSearchHit],
    *,
    scope: SearchScope,
    own_session: str,
    max_chars: int,
) -> str:
    """The `context_search` answer: the hits, best first, within `max_chars` (so that the
    answer is never large enough for a compression to offload it)."""
    where = "this session" if scope == "session" else "this tenant's sessions"
    if not hits:
        hint = (
            " (search scope 'tenant' looks in earlier sessions too)" if scope == "session" else ""
        )
        return f"No message in {where} matches{hint}. Try other words, an id or a path."
    lines: list[str] = []
    used = 0
    for k, hit in enumerate(hits, start=1):
        entry = render_hit(k, hit, own_session)
        if lines and used + len(entry) + 200 > max_chars:
            lines.append(
                f"[{len(hits) - len(lines)} more hit(s) left out to keep this answer short; "
                "refine the query or lower the limit]"
            )
            break
        lines.append(entry)
        used += len(entry) + 1
    header = f"{len(hits)} hit(s) in {where}, best first (matched words in **bold**):"
    return "\n".join([header, *lines])
