"""The offline, extractive summarizer: no network, deterministic; it keeps tool calls, errors,
the first and last lines of outputs and the facts (ids, paths, numbers) of a transcript, within a
character budget."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Final

from .._tags import neutralize_tags

if TYPE_CHECKING:
    # The openai package takes about half a second to import; the offline path never needs it.
    pass

from .._shared_requests import join_answers, split_parts
from .._summary import CHARS_PER_BUDGET_TOKEN, SummaryRequest, SummaryResult

_log = logging.getLogger("autoctx")


#: Without a budget, the offline summary aims at a quarter of the input, between these bounds:
#: small enough that a large input always shrinks, large enough to hold the key lines.
OFFLINE_MAX_CHARS: Final = 4000
OFFLINE_MIN_CHARS: Final = 200
OFFLINE_MODEL: Final = "autoctx-offline"
#: Extracts made at most to fit a token budget (each aims 5% under what the last one measured,
#: so two or three suffice in practice).
_TOKEN_FIT_ROUNDS: Final = 8

# An entry of `render_transcript`: a bracketed header naming a role or a tool result.
_ENTRY_RE: Final = re.compile(
    r"^\[(?P<header>(?:system|user|assistant|tool)\b[^\]\n]{0,400}|tool result [^\]\n]{1,400})\]"
    r"(?: |$)",
    re.MULTILINE,
)
_ERROR_RE: Final = re.compile(
    r"error|exception|traceback|fail|fatal|panic|denied|refused|not found|no such|cannot|"
    r"can't|unable|timed? ?out|abort|invalid|\bE\d{3,}\b|exit (?:code|status) [1-9]|"
    r"status(?: code)?[ :=]+[45]\d\d|\b[45]\d\d (?:[A-Z][a-z]+ ?)+",
    re.IGNORECASE,
)
# Tokens worth keeping even when the line around them is dropped or cut.
_FACT_RE: Final = re.compile(
    r"https?://[^\s\"'<>)\]]+"  # URLs
    r"|\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"  # uuids
    r"|(?<![\w/.-])(?:~|\.{1,2})?/?(?:[\w.@-]+/)+[\w.@-]+"  # paths with a slash
    r"|\b[\w-]+\.(?:py|js|ts|tsx|json|ya?ml|toml|ini|cfg|conf|md|txt|sql|sh|log|html|css|go|rs"
    r"|java|c|h|cpp|rb|php|lock|env|csv|xml)\b"  # file names
    r"|\b[\w.-]+=[^\s,;\"']+"  # key=value
    r"|\b(?:id|port|pid|status|code|version|count|size)[\s:=#]+[\w.:/-]+"  # named values
    r"|\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b"  # hex ids and hashes
    r"|\b(?:call|toolu|tool|run|job|task|req|request|msg|session|chatcmpl)[_-][\w-]+",  # ids
    re.IGNORECASE,
)
_NUMBER_RE: Final = re.compile(r"\d")
_LINE_CHARS: Final = 200
_ERROR_LINE_CHARS: Final = 300
_ARGS_CHARS: Final = 400
_FACTS_PER_ENTRY: Final = 12
_ERROR_CONTEXT_LINES: Final = 6
_SCAN_CHARS: Final = 4000
_FACT_SCAN_CHARS: Final = 200_000

# Priorities of the candidate lines, most important first. Tool calls come first, but only
# up to half the budget (`_CALL_SHARE`): the calls beyond it wait behind the errors and the
# first and last lines of the results (`_P_MORE_CALLS`).
_P_CALL, _P_ERROR, _P_EDGE, _P_MORE_CALLS, _P_FACT_LINE, _P_FACTS, _P_NUMBER = range(7)
_CALL_SHARE: Final = 0.5


@dataclass(slots=True)
class _Entry:
    header: str
    lines: list[str]


@dataclass(slots=True)
class _Candidate:
    priority: int
    entry: int
    #: Index of the body line; -1 is the header line (which, for a call, holds its arguments).
    line: int
    text: str
    #: Rank among the candidates of the same priority (and entry): the budget goes round the
    #: entries (every result's first error before any result's second) instead of letting
    #: the first long result eat it all.
    order: int = 0


def _clip(text: str, limit: int) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 6].rstrip() + " [...]"


def _split_entries(transcript: str) -> list[_Entry]:
    starts = list(_ENTRY_RE.finditer(transcript))
    if not starts:
        # Not a transcript of `render_transcript` (a caller may build its own): one body.
        return [_Entry("", transcript.splitlines())]
    entries: list[_Entry] = []
    if transcript[: starts[0].start()].strip():
        entries.append(_Entry("", transcript[: starts[0].start()].splitlines()))
    for i, match in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(transcript)
        entries.append(_Entry(match.group("header"), transcript[match.end() : end].splitlines()))
    return entries


def _dedupe(lines: Iterable[str]) -> list[str]:
    """Non-blank lines, consecutive repeats folded into one line with a count."""
    out: list[str] = []
    previous: str | None = None
    repeats = 0
    for raw in lines:
        line = raw.rstrip()
        if not line.strip():
            continue
        if line == previous:
            repeats += 1
            continue
        if repeats:
            out[-1] += f" (x{repeats + 1})"
        out.append(line)
        previous, repeats = line, 0
    if repeats:
        out[-1] += f" (x{repeats + 1})"
    return out


def _call_candidate(index: int, entry: _Entry, args_chars: int) -> _Candidate:
    # The call itself (tool name, id, exact arguments) on one line: the arguments are JSON,
    # whose line breaks carry nothing.
    args = " ".join(line.strip() for line in entry.lines if line.strip())
    entry.lines = []
    text = f"[{entry.header}] {_clip(args, args_chars)}" if args else f"[{entry.header}]"
    return _Candidate(_P_CALL, index, -1, text)


def _body_candidates(index: int, entry: _Entry) -> list[_Candidate]:
    lines = entry.lines = _dedupe(entry.lines)
    # No candidate for the header alone: it comes with the first of its lines that is kept.
    found: list[_Candidate] = []
    kept_text: list[str] = []
    error_context = 0
    for j, line in enumerate(lines):
        # Classify on the head of a line: a kept line is clipped anyway, and scanning a
        # megabyte of minified JSON for markers costs more than it finds.
        head = line[:_SCAN_CHARS]
        if _ERROR_RE.search(head):
            priority, limit = _P_ERROR, _ERROR_LINE_CHARS
            error_context = _ERROR_CONTEXT_LINES
        elif error_context and line[:1].isspace():
            # The indented lines after an error (traceback frames, details) say where it
            # happened; they count as part of the error.
            priority, limit = _P_ERROR, _ERROR_LINE_CHARS
            error_context -= 1
        else:
            error_context = 0
            if j in (0, len(lines) - 1):
                priority, limit = _P_EDGE, _LINE_CHARS
            elif _FACT_RE.search(head):
                priority, limit = _P_FACT_LINE, _LINE_CHARS
            elif _NUMBER_RE.search(head):
                priority, limit = _P_NUMBER, _LINE_CHARS
            else:
                continue
        text = _clip(line, limit)
        found.append(_Candidate(priority, index, j, text))
        if priority <= _P_EDGE:
            kept_text.append(text)
    # Facts hidden in what the important lines leave out (long JSON, dropped middle lines).
    kept = "\n".join(kept_text)
    facts: list[str] = []
    for match in _FACT_RE.finditer("\n".join(lines)[:_FACT_SCAN_CHARS]):
        fact = _clip(match.group(0).rstrip(".,:"), 120)
        if len(fact) > 2 and fact not in kept and fact not in facts:
            facts.append(fact)
            if len(facts) == _FACTS_PER_ENTRY:
                break
    if facts:
        found.append(_Candidate(_P_FACTS, index, len(lines), "facts: " + ", ".join(facts)))
    ranks: dict[int, int] = {}
    for c in found:
        c.order = ranks.get(c.priority, 0)
        ranks[c.priority] = c.order + 1
    return found


def _sort_key(c: _Candidate, entries: int) -> tuple[int, int, int, int, int]:
    # Within a priority and rank, entries are taken from both ends of the transcript inward:
    # what the work started with and what it came to matter most.
    return (c.priority, c.order, min(c.entry, entries - 1 - c.entry), c.entry, c.line)


def _demote_calls(calls: list[_Candidate], budget: int, entries: int) -> None:
    """Demote the calls beyond the calls' share of the budget (taken from both ends)."""
    used = 0
    for c in sorted(calls, key=lambda c: _sort_key(c, entries)):
        used += len(c.text) + 1
        if used > budget * _CALL_SHARE:
            c.priority = _P_MORE_CALLS


def _gap(count: int, one: str = "line", many: str = "lines") -> str:
    return f"  [... {count} {one if count == 1 else many}]"


def _render(entries: list[_Entry], chosen: Mapping[tuple[int, int], str]) -> str:
    """The chosen lines in transcript order, each entry under its header, gaps marked."""
    by_entry: dict[int, list[int]] = {}
    for entry_index, line_index in chosen:
        by_entry.setdefault(entry_index, []).append(line_index)
    out: list[str] = []
    previous_entry = -1
    for i in sorted(by_entry):
        if i - previous_entry > 1:
            out.append(_gap(i - previous_entry - 1, "entry", "entries"))
        previous_entry = i
        entry = entries[i]
        if (i, -1) in chosen:
            out.append(chosen[(i, -1)])
        elif entry.header:
            out.append(f"[{entry.header}]")
        previous = -1
        for j in sorted(line for line in by_entry[i] if line >= 0):
            # Index len(lines) is the facts line, which stands after the last body line.
            position = min(j, len(entry.lines))
            if position - previous > 1:
                out.append(_gap(position - previous - 1))
            out.append("  " + chosen[(i, j)])
            previous = position
        if len(entry.lines) - previous > 1:
            out.append(_gap(len(entry.lines) - previous - 1))
    if previous_entry >= 0 and len(entries) - previous_entry > 1:
        out.append(_gap(len(entries) - previous_entry - 1, "entry", "entries"))
    return "\n".join(out)


class OfflineSummarizer:
    """An extractive summarizer: deterministic, no network, no model.

    It keeps, in order of importance: the tool calls (name, id, exact arguments; the first
    and the latest first when they do not all fit), every error line with the indented
    lines under it, the first and last line of each message or result, lines that carry
    paths, URLs, ids or key=value settings, a list of such facts found in what it drops, and
    then whatever else holds numbers. Gaps are marked ``[... N lines]``. It stays within the
    request's ``char_budget``, or without one within a quarter of the input (between
    `OFFLINE_MIN_CHARS` and `OFFLINE_MAX_CHARS`), so that a large input always shrinks.
    Offload tags it copies become ``[offloaded context <uuid>]``.

    A request shared by several messages (docs/design.md §3; it knows one by its transcript,
    so that it answers one that came over HTTP too) gets one extract per message, each within
    a quarter of that message as its header states it, under its ``=== SUMMARY k ===`` line:
    each extract is the one a request of that message alone would get.
    """

    answers_shared_requests: ClassVar[bool] = True
    #: Extractive and deterministic: asked again, it would answer the same, so the fact check
    #: asks it no repair and lists what it left out on the index line alone (docs/design.md §6).
    repairs_summaries: ClassVar[bool] = False

    model: str = OFFLINE_MODEL

    def budget_for(self, request: SummaryRequest) -> int:
        """The most characters the summary of `request` may have."""
        if request.char_budget is not None:
            return max(1, request.char_budget)
        if request.token_budget is not None:
            # A quarter of the input, as without a budget, but never over the budget.
            quarter = max(OFFLINE_MIN_CHARS, request.input_chars // 4)
            return max(1, min(quarter, request.token_budget * CHARS_PER_BUDGET_TOKEN))
        return _unbudgeted(request.input_chars)

    def summarize(self, request: SummaryRequest) -> SummaryResult:
        started = time.perf_counter()
        transcript = neutralize_tags(request.transcript)
        parts = split_parts(transcript)
        if parts is not None and request.char_budget is None and request.token_budget is None:
            text = join_answers([_extract(p.transcript, _unbudgeted(p.chars)) for p in parts])
            return SummaryResult(
                text=text, model=self.model, latency_ms=(time.perf_counter() - started) * 1000
            )
        budget = self.budget_for(request)
        text = _extract(transcript, budget)
        count, limit = request.count_tokens, request.token_budget
        if count is not None and limit is not None:
            # Characters only estimate tokens (ids, hashes and numbers take fewer characters a
            # token than prose): measured the way the compressor checks the answer, an extract
            # over the token budget is made again with fewer characters, until it fits.
            for _ in range(_TOKEN_FIT_ROUNDS):
                tokens = count(text)
                if tokens <= limit or budget <= 1:
                    break
                budget = max(1, min(budget - 1, budget * limit * 95 // (tokens * 100)))
                text = _extract(transcript, budget)
        return SummaryResult(
            text=text,
            model=self.model,
            latency_ms=(time.perf_counter() - started) * 1000,
        )


def _unbudgeted(input_chars: int) -> int:
    """The characters of a summary whose request states no budget: a quarter of the input."""
    return min(OFFLINE_MAX_CHARS, max(OFFLINE_MIN_CHARS, input_chars // 4))


def _extract(transcript: str, budget: int) -> str:
    entries = _split_entries(transcript)
    total_lines = sum(len(e.lines) + (1 if e.header else 0) for e in entries)
    is_call = ["-> tool call " in entry.header for entry in entries]
    # Long arguments (a file being written) are clipped harder when many calls share a small
    # budget, so that more calls keep their names and the start of their arguments.
    args_chars = max(80, min(_ARGS_CHARS, budget // (2 * max(1, sum(is_call)))))
    calls: list[_Candidate] = []
    candidates: list[_Candidate] = []
    for i, entry in enumerate(entries):
        if is_call[i]:
            calls.append(_call_candidate(i, entry, args_chars))
        else:
            candidates.extend(_body_candidates(i, entry))
    _demote_calls(calls, budget, len(entries))
    ranked = sorted(calls + candidates, key=lambda c: _sort_key(c, len(entries)))
    # Greedy on an estimate (a line, its indent, the header it drags in, a gap marker); the
    # rendering below settles the truth and drops the least important lines while it
    # overshoots.
    chosen: dict[tuple[int, int], str] = {}
    used = len("[offline extract: 9999 of 99999 lines kept]")
    headed: set[int] = set()
    for c in ranked:
        cost = len(c.text) + 1 if c.line == -1 else len(c.text) + 3 + 12
        if c.entry not in headed and c.line != -1 and entries[c.entry].header:
            cost += len(entries[c.entry].header) + 3
        if used + cost > budget:
            continue
        used += cost
        chosen[(c.entry, c.line)] = c.text
        headed.add(c.entry)
    droppable = [(c.entry, c.line) for c in reversed(ranked) if (c.entry, c.line) in chosen]
    while True:
        head = f"[offline extract: {len(chosen)} of {total_lines} lines kept]"
        body = _render(entries, chosen)
        out = f"{head}\n{body}" if body else head
        if len(out) <= budget or not droppable:
            break
        del chosen[droppable.pop(0)]
    if len(out) > budget:
        # Only when even the note does not fit (a budget of a few characters).
        out = out[:budget]
    out = neutralize_tags(out)
    return out if out.strip() else "(nothing to summarize)"[:budget]
