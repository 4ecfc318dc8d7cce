"""The check after every summary (docs/design.md §6): which facts of the replaced messages the
summary kept, one repair request for the missing ones, and an index line for what is still
missing.

For each summary a pass accepted (S1, S4, S5, S6, the fold), the facts of the messages it
replaces (`autoctx._strategies.facts`) are looked up in it. When some are missing, the
configured summarizer (never the offline one, which would answer the same) is asked once to
revise the summary so that it states them: one more `Summarize` effect the drivers run, a batch
of every range of the pass that needs it, each call counted against the call's `max_llm_calls`
and deadline like any other. The revision replaces the first answer only when it passes every
check an answer passes and keeps more facts. Whatever is still missing goes, best rank first,
onto one line at the end of the summary, which names the facts and the offload to reload them
from, within `fact_index_ratio` of the summary's budget (and, for a rung whose summary has a
token budget, within that budget and its margin: the summary and its line pass the budget
rule together), so that the line never costs the bound.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ._answers import carries_tag, check_answer
from ._effects import Effects, Summarize, ask
from ._errors import SummarizerError
from ._events import FactCheck
from ._messages import Msg
from ._observe import Observer
from ._plans import Edit
from ._prompt_texts import REPAIR_PROMPT
from ._strategies.facts import (
    INDEX_SEPARATOR,
    Fact,
    facts_of,
    index_line_text,
    missing,
)
from ._summary import CHARS_PER_BUDGET_TOKEN, Summarizer, SummaryRequest, SummaryResult
from ._tags import offload_reference

#: How far over its budget an answer may go and still count as a summary (the compressor's
#: rule, `_budget_margin`).
BudgetMargin = Callable[[int], int]
#: How the summary's tokens are counted (the session's encoding).
CountTokens = Callable[[str], int]
#: How an index line is measured against its room: in tokens, or in characters (`len`).
Measure = Callable[[str], int]


@dataclass(frozen=True, slots=True)
class Subject:
    """One accepted answer of a pass, as the check sees it."""

    edit: Edit
    #: The messages the summary stands for (their facts are the ones checked): the range's,
    #: but for what stays verbatim before the summary (`prefix`), whose facts are in view by
    #: construction and would otherwise fill the extractor's bound (an S6 prefix carries the
    #: earlier index line's facts) and leave the newer messages' facts unchecked.
    msgs: Sequence[Msg]
    #: The accepted answer (checked, within its budget).
    text: str
    #: What stays verbatim before the answer (S6's earlier summary, S5's head of a user
    #: message): its facts count as kept.
    prefix: str
    #: The handle of the offload the summary's tag will name (what the index line points at).
    offload: str
    #: Written by the offline summarizer (the fallback): no repair is asked.
    fallback: bool
    #: The request the answer came from.
    request: SummaryRequest


@dataclass(frozen=True, slots=True)
class Checked:
    """A subject after the check: the text to store (the repair's when it won, with the index
    line), what the check found, and the usage of the repair call (added to the event's)."""

    text: str
    facts: FactCheck
    repair_usage: SummaryResult | None = None


class CallBudget(Protocol):
    """What the compression call lends the check: its summarizer-call budget and deadline."""

    def take_call(self) -> float | None:
        """Count one summarizer call and return its deadline (`time.monotonic()`), or None
        when the call's `max_llm_calls` or deadline leave none."""
        ...

    def in_time(self, request: SummaryRequest) -> None:
        """Raise `SummarizerError` ('deadline') when the answer to `request` came too late."""
        ...


def repairs(summarizer: object) -> bool:
    """Whether `summarizer` is asked to repair its summaries: every one but those that declare
    ``repairs_summaries = False`` (the offline summarizer, deterministic: it would answer the
    same)."""
    return getattr(summarizer, "repairs_summaries", True) is not False


class FactChecker:
    """The check of one pass's summaries (see the module docstring)."""

    def __init__(
        self,
        *,
        summarizer: Summarizer,
        observer: Observer,
        count_tokens: CountTokens,
        margin: BudgetMargin,
        repair: bool,
        index_ratio: float,
    ) -> None:
        self.summarizer = summarizer
        self.observer = observer
        self.count_tokens = count_tokens
        self.margin = margin
        self.repair = repair and repairs(summarizer)
        self.index_ratio = index_ratio

    def check(self, subjects: Sequence[Subject], budget: CallBudget) -> Effects[list[Checked]]:
        """Each subject's checked text, in order (see the module docstring)."""
        found = [facts_of(s.msgs) for s in subjects]
        texts = [s.text for s in subjects]
        first_missing = [missing(f, _seen(s, s.text)) for f, s in zip(found, subjects, strict=True)]
        usages: list[SummaryResult | None] = [None] * len(subjects)
        asked: set[int] = set()
        if self.repair:
            asked = yield from self._repair(subjects, first_missing, texts, usages, found, budget)
        out: list[Checked] = []
        for k, subject in enumerate(subjects):
            facts = found[k]
            text = texts[k]
            still = missing(facts, _seen(subject, text))
            first = {f.key for f in first_missing[k]}
            repaired = sum(1 for f in first if f not in {g.key for g in still})
            line, listed = self.index_line(subject, text, still)
            if line:
                text = f"{text}\n{line}"
            dropped = [f for f in still if f not in listed]
            out.append(
                Checked(
                    text,
                    FactCheck(
                        found=len(facts),
                        kept=len(facts) - len(still) - repaired,
                        repaired=repaired,
                        listed=len(listed),
                        dropped=len(dropped),
                        dropped_facts=tuple(f.text for f in dropped),
                        repair_calls=int(k in asked),
                    ),
                    usages[k],
                )
            )
        return out

    # -- the repair ----------------------------------------------------------------------------

    def _repair(
        self,
        subjects: Sequence[Subject],
        first_missing: Sequence[list[Fact]],
        texts: list[str],
        usages: list[SummaryResult | None],
        found: Sequence[tuple[Fact, ...]],
        budget: CallBudget,
    ) -> Effects[set[int]]:
        """Ask for the repairs (one batch); returns which subjects were asked. A revision
        replaces its subject's text in `texts` when it passes and keeps more facts; every
        answer that came has its usage in `usages`, whether it won or not."""
        asked: list[int] = []
        requests: list[SummaryRequest] = []
        for k, subject in enumerate(subjects):
            if subject.fallback or not first_missing[k]:
                continue
            if len(self.index_line(subject, texts[k], first_missing[k])[1]) == len(
                first_missing[k]
            ):
                # The index line lists every fact the summary lacks: they stay in view, and a
                # call to the summarizer would add nothing the agent does not see.
                continue
            deadline = budget.take_call()
            if deadline is None:
                break  # the call's budget is spent: the index line alone
            asked.append(k)
            requests.append(self._request(subject, first_missing[k], deadline))
        if not requests:
            return set()
        calls = [self.observer.summarizer_call(self.summarizer, None) for _ in requests]
        try:
            answers = yield from ask(Summarize(tuple(requests)))
        except GeneratorExit:
            for call in calls:
                call.failed("abandoned")
            raise
        for k, request, call, answer in zip(asked, requests, calls, answers, strict=True):
            subject = subjects[k]
            try:
                if isinstance(answer, Exception):
                    raise answer
                usages[k] = answer  # paid for, whether it wins or not
                budget.in_time(request)
                call.answered(answer)
                text = check_answer(answer.text)
                self._within(subject, text, request)
            except SummarizerError as exc:
                call.failed(exc.reason)
                continue  # the first answer stands
            except Exception as exc:  # a caller's summarizer may raise anything
                call.failed(type(exc).__name__)
                continue
            if len(missing(found[k], _seen(subject, text))) < len(first_missing[k]):
                texts[k] = text
        return set(asked)

    def _request(
        self, subject: Subject, lacking: Sequence[Fact], deadline: float
    ) -> SummaryRequest:
        first = subject.request
        char_budget = first.char_budget
        if first.token_budget is None and char_budget is None:
            # No stated budget: about the first answer's length, plus the facts.
            char_budget = len(subject.text) + sum(len(f.text) + 2 for f in lacking)
        return SummaryRequest(
            strategy=first.strategy,
            prompt=REPAIR_PROMPT,
            transcript=subject.text,
            input_chars=first.input_chars,
            char_budget=char_budget,
            token_budget=first.token_budget,
            deadline=deadline,
            count_tokens=first.count_tokens,
            plan_hint=first.plan_hint,
            missing_facts=tuple(f.text for f in lacking),
        )

    def _within(self, subject: Subject, text: str, request: SummaryRequest) -> None:
        """Raise when the revision is over what the request allowed (the budget and its
        margin; without a token budget, the character budget stated)."""
        tokens = self.count_tokens(text)
        if request.token_budget is not None:
            allowed = request.token_budget + self.margin(request.token_budget)
        else:
            assert request.char_budget is not None
            allowed = -(-request.char_budget // CHARS_PER_BUDGET_TOKEN)
            allowed = max(allowed, self.count_tokens(subject.text)) + self.margin(allowed)
        if tokens > allowed:
            raise SummarizerError(
                "over_budget", f"the revision has {tokens} tokens; {allowed} were allowed"
            )

    # -- the index line ------------------------------------------------------------------------

    def room(self, subject: Subject, text: str) -> tuple[Measure, int]:
        """How the index line is measured, and how much of it the summary `text` leaves:
        `fact_index_ratio` of the summary's budget (the token budget, else the character
        budget, else a quarter of what the range holds, the ladder's own estimate of a
        summary), and within the budget with its margin where there is a token budget. A
        character budget (S6's) is measured in characters, the summary's and the line's
        together: it is what brings the round to the target, converted from the room's tokens
        at the round's own characters per token, so a line measured in tokens at any other
        rate could pass it (docs/design.md §6)."""
        edit = subject.edit
        if edit.char_budget is not None and edit.token_budget is None:
            base = edit.char_budget
            # The line goes on a line of its own: the newline is the summary's.
            return len, max(0, min(int(base * self.index_ratio), base - len(text) - 1))
        if edit.token_budget is None:
            return self.count_tokens, int(edit.replaced_tokens // 4 * self.index_ratio)
        budget = edit.token_budget
        room = budget + self.margin(budget) - self.count_tokens(text)
        return self.count_tokens, max(0, min(int(budget * self.index_ratio), room))

    def index_line(
        self, subject: Subject, text: str, lacking: Sequence[Fact]
    ) -> tuple[str, list[Fact]]:
        """The line and the facts it lists, best rank first while they fit the room (a fact
        that does not fit is passed over for a shorter one after it)."""
        if not lacking:
            return "", []
        measure, cap = self.room(subject, text)
        ref = offload_reference(subject.offload)

        def line_of(facts: Sequence[Fact]) -> str:
            return index_line_text(ref, [f.text for f in facts])

        used = measure(line_of([]))
        sep = measure(INDEX_SEPARATOR)
        listed: list[Fact] = []
        for fact in lacking:
            if carries_tag(fact.text):
                continue  # a summary never carries a tag (docs/design.md §4)
            # Each fact costs about its own measure and the separator's.
            cost = measure(fact.text) + sep
            if used + cost > cap:
                continue
            used += cost
            listed.append(fact)
        line = line_of(listed)
        while listed and measure(line) > cap:
            # The estimate was short (tokens merge differently in context): drop the last.
            listed.pop()
            line = line_of(listed)
        return (line, listed) if listed else ("", [])


def _seen(subject: Subject, text: str) -> str:
    return f"{subject.prefix}\n{text}" if subject.prefix else text


def with_repair_usage(usage: dict[str, Any], repair: SummaryResult | None) -> dict[str, Any]:
    """An event's usage with the repair call's tokens and latency added (the audit's cost
    views then count the check's cost in the session's)."""
    if repair is None:
        return usage
    out = dict(usage)
    for key, value in (
        ("prompt_tokens", repair.prompt_tokens),
        ("completion_tokens", repair.completion_tokens),
    ):
        if value is not None:
            out[key] = (out.get(key) or 0) + value
    out["latency_ms"] = (out.get("latency_ms") or 0.0) + repair.latency_ms
    # The model stays the first answer's (or none, on a shared request's later ranges): the
    # cost view counts an event with a model as one call, and the repair's call on its own
    # (`FactCheck.repair_calls`).
    return out
