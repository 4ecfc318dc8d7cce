"""How the compressor turns a strategy's edits into replacements (docs/design.md §2, §3, §6):
previews written at once; summaries asked of the summarizer in one batch of requests (one per
range, or several of S5's messages sharing one), each answer checked (in time, a summary,
within its budget), fact-checked, and built into the message that replaces its range; a range
that fails is a `failed` event. `Compressor` (autoctx._compressor), which decides which edits
a pass makes, is built on this; like it, this performs no I/O: it yields effects.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final, TypeGuard

from ._answers import check_answer
from ._compression_state import CallState, SessionState
from ._config import AutoContextConfig, RuntimeOptions
from ._effects import (
    FALLBACK_MODEL,
    CompressionStore,
    Effects,
    LoadMessages,
    RecordEvent,
    Summarize,
    ask,
)
from ._errors import SummarizerError
from ._events import Event
from ._fact_check import Checked, FactChecker, Subject, with_repair_usage
from ._intake import Prepared, count_tokens
from ._messages import Msg
from ._observe import Observer, SummarizerCall
from ._plans import Edit, Snapshot
from ._prompts import (
    build_request,
    build_shared_request,
    clip_for,
    shared_input_bound,
    shares_requests,
)
from ._replacements import NewOffload, Replacement, preview, summarized_payload
from ._shared_requests import group, split_answer
from ._strategies import registry
from ._summary import (
    Summarizer,
    SummaryRequest,
    SummaryResult,
    answers_shared_requests,
)
from ._tags import offload_tag
from ._tokens import TokenCounter

logger = logging.getLogger("autoctx")


class Summarizing:
    """The compressor's parts (its store, config, counter, summarizers, session state,
    observer and options) and the replacements of a pass's edits; `Compressor` adds the loop."""

    def __init__(
        self,
        store: CompressionStore,
        session_id: str,
        config: AutoContextConfig,
        counter: TokenCounter,
        summarizer: Summarizer,
        session: SessionState | None = None,
        observer: Observer | None = None,
        *,
        fallback: Summarizer,
        options: RuntimeOptions | None = None,
    ) -> None:
        #: The session's store: only the drivers use it; the loop yields effects.
        self.store = store
        self.session_id = session_id
        self.config = config
        #: The process's bounds, deadlines and failure policy (not the session's thresholds).
        self.options = options if options is not None else RuntimeOptions()
        self.counter = counter
        self.summarizer = summarizer
        #: The offline summarizer that writes what the bound needs when the configured one
        #: fails or the budget is spent (docs/design.md §2), handed in by the memory.
        self.fallback = fallback
        self.session = session if session is not None else SessionState()
        #: The lifecycle hooks and spans of this call.
        self.observer = observer if observer is not None else Observer(session_id)

    def _requests(
        self, snap: Snapshot, edits: Sequence[Edit], *, fallback: bool = False
    ) -> list[list[int]]:
        """The summarizer requests `edits` (one strategy's LLM edits) go out in, as indices
        into `edits`: one each, but S5's messages share requests as they fit its input bound
        (docs/design.md §3). The first requests taken whole group again the same way
        (`autoctx._shared_requests.group`), so the budget's choice is what is sent.

        The offline fallback keeps one request per message: it calls no LLM, so sharing
        would save nothing, and each of its events then names it (model `offline`)."""
        if (
            fallback
            or not edits
            or not shares_requests(edits[0].strategy, self.config)
            or not answers_shared_requests(self.summarizer)
        ):
            return [[i] for i in range(len(edits))]
        sizes = [sum(snap.messages[k].chars for k in e.member_indices) for e in edits]
        return group(sizes, shared_input_bound(self.config))

    def _out_of_time(self, state: CallState) -> bool:
        """Whether the call's deadline has passed: no summarizer call starts after it; the
        previews and the offline fallback, which need none, still keep the bound."""
        if time.monotonic() < state.deadline:
            return False
        if not state.out_of_time:
            state.out_of_time = True
            logger.info(
                "autoctx: session %r: the compress deadline of %s s passed; no more summarizer "
                "calls in this compress_if_needed()",
                self.session_id,
                self.options.compress_deadline_s,
            )
        return True

    def _request_deadline(self, state: CallState) -> float:
        return min(time.monotonic() + self.options.summarizer_deadline_s, state.deadline)

    def _build(
        self,
        snap: Snapshot,
        edits: Sequence[Edit],
        state: CallState,
        reason: str,
        *,
        fallback: bool = False,
    ) -> Effects[list[Replacement]]:
        """The replacements of `edits` (previews, or summaries: by the offline fallback when
        `fallback`, which is then not counted against the LLM budget)."""
        ids = tuple(i for e in edits for i in e.replaced_ids)
        originals = yield from ask(LoadMessages(ids))
        out: list[Replacement | None] = []
        # The ranges are independent: their requests go out as one batch, and each answer
        # comes back to its own range (or ranges, for a shared request), in edit order.
        summarized: list[tuple[int, Edit, list[Msg], NewOffload]] = []
        for k, edit in enumerate(edits):
            msgs = [originals[i] for i in edit.replaced_ids]
            # The handles of a pass follow the snapshot's counter; one whose range fails
            # leaves a gap, which costs nothing (a handle only has to be unique).
            offload = NewOffload(uuid.uuid4(), snap.next_handle + k)
            if not edit.llm:
                final = snap.messages[edit.start].final
                shown = self._prepare(
                    preview(
                        msgs[0], self.config, offload.handle, edit.preview_chars, edit.fact_chars
                    ),
                    final,
                )
                # A preview near the size floor can cost as many tokens as its original (the
                # tag's own tokens): it would save nothing, and every applied event saves
                # tokens (docs/design.md §3).
                if shown.tokens < edit.replaced_tokens:
                    out.append(Replacement(edit, shown, offload.uuid, offload.handle))
                continue
            out.append(None)
            summarized.append((len(out) - 1, edit, msgs, offload))
        requests: list[_Request] = []
        ranges = [edit for _, edit, _, _ in summarized]
        for members in self._requests(snap, ranges, fallback=fallback):
            if not fallback:
                state.llm_calls += 1  # one call per request, however many ranges share it
            requests.append(self._ask([summarized[i] for i in members], state, fallback))
        if requests:
            batch = Summarize(tuple(r.request for r in requests), fallback=fallback)
            try:
                answers = yield from ask(batch)
            except GeneratorExit:
                for r in requests:
                    r.call.failed("abandoned")  # the call was stopped: its answer is not wanted
                raise
            accepted: list[tuple[int, _Accepted]] = []
            for r, answer in zip(requests, answers, strict=True):
                if not fallback and _unavailable(answer):
                    if state.unavailable:  # said by the batch's first such answer
                        self._not_summarized(r, answer, state)
                        continue
                    state.unavailable = True
                for slot, part, (part_answer, paid) in zip(
                    r.slots, r.parts, self._parts_of(r, answer), strict=True
                ):
                    got = yield from self._accepted(part, part_answer, state, reason, paid)
                    if got is not None:
                        accepted.append((slot, got))
            # The fact check of every accepted summary (docs/design.md §6): one batch of
            # repair requests, then the index lines.
            checked = yield from self._checker().check(
                [a.subject for _, a in accepted], _Budget(self, state)
            )
            for (slot, got), done in zip(accepted, checked, strict=True):
                out[slot] = yield from self._replacement(snap, got, done, state, reason)
        return [r for r in out if r is not None]

    def _checker(self) -> FactChecker:
        return FactChecker(
            summarizer=self.summarizer,
            observer=self.observer,
            count_tokens=self.counter.count,
            margin=_budget_margin,
            repair=self.config.fact_repair,
            index_ratio=self.config.fact_index_ratio,
        )

    def _asked(self, budget: int | None) -> int | None:
        """The token budget a summary (the fold's) is asked for: the edit's, less the share
        its index line may take (`fact_index_ratio`), so that the facts the summary leaves out
        have their room within the budget rather than in its margin; a summary that leaves
        none out is that much shorter (docs/design.md §6). S6's character budget is asked
        whole (measured: reserving there too cost more calls), its line within what is left."""
        if budget is None:
            return None
        return max(1, budget - int(budget * self.config.fact_index_ratio))

    def _ask(
        self,
        ranges: Sequence[tuple[int, Edit, list[Msg], NewOffload]],
        state: CallState,
        fallback: bool,
    ) -> _Request:
        """One request to the summarizer (the configured one, or the fallback): for one range,
        or for several of S5's messages that share it (each range: its slot in the pass's
        replacements, its edit, its messages and its offload's names)."""
        subjects = [self._subject(edit, msgs) for _, edit, msgs, _ in ranges]
        first = ranges[0][1]
        deadline = None if fallback else self._request_deadline(state)
        clip = clip_for(first.strategy, self.config)
        if len(ranges) == 1:
            request = build_request(
                first.strategy,
                subjects[0][1],
                prompts=self.config.prompts,
                char_budget=first.char_budget,
                token_budget=self._asked(first.token_budget),
                plan=state.plan,
                deadline=deadline,
                clip=clip,
                count_tokens=self.counter.count,
            )
        else:
            request = build_shared_request(
                [to_summarize for _, to_summarize in subjects],
                plan=state.plan,
                deadline=deadline,
                clip=clip,
            )
        call = self.observer.summarizer_call(
            self.fallback if fallback else self.summarizer, FALLBACK_MODEL if fallback else None
        )
        parts = tuple(
            _Asking(
                edit,
                msgs,
                summarized,
                offload,
                prefix,
                request,
                call,
                fallback,
                shared=len(ranges) > 1,
                # The call's usage goes on the first range's event only, so that the audit
                # counts it (and the call) once (docs/design.md §3).
                usage=k == 0,
            )
            for k, ((_, edit, msgs, offload), (prefix, summarized)) in enumerate(
                zip(ranges, subjects, strict=True)
            )
        )
        return _Request(tuple(slot for slot, _, _, _ in ranges), parts, request, call)

    def _not_summarized(self, request: _Request, answer: SummarizerError, state: CallState) -> None:
        """A request of the batch that met the same unavailable summarizer as an earlier one:
        its ranges are failed for this call (the fallback may take them) without an event of
        their own, since the first one said why."""
        request.call.failed(answer.reason)
        for part in request.parts:
            state.failed.add(part.edit.replaced_ids)

    def _subject(self, edit: Edit, msgs: list[Msg]) -> tuple[str, list[Msg]]:
        """What of a range is summarized, and the text kept verbatim before its summary."""
        if edit.verbatim_prefix_id is not None:
            # Kept verbatim, its own tag included, so the older originals stay reachable.
            return msgs[0].text.rstrip(), msgs[1:]
        if edit.strategy == registry.LARGE and msgs[0].role == "user":
            # The current user message: its head stays verbatim, the rest is summarized.
            head = msgs[0].text[: self.config.preview_chars]
            return head + "...", [Msg.user(msgs[0].text[len(head) :])]
        return "", msgs

    def _parts_of(
        self, request: _Request, answer: SummaryResult | Exception
    ) -> list[tuple[SummaryResult | Exception, Mapping[str, Any]]]:
        """Each range's answer to `request`, with the usage its `failed` event carries if its
        part of the answer fails (the shared call's usage on the first range, once).

        A request of one range: its answer as it came. A shared one: its answer split per
        range (`autoctx._shared_requests.split_answer`), so that a part that is missing, given
        twice, or fails a check fails only its own range, never writes another's place."""
        if not request.parts[0].shared:
            return [(answer, {})]
        count = len(request.parts)
        if isinstance(answer, Exception):
            return [(answer, {})] * count
        if not request.parts[0].fallback:
            try:
                self._check_in_time(request.request)
            except SummarizerError as exc:
                return [(exc, {})] * count
        request.call.answered(answer)
        usage = _usage_of(answer)
        out: list[tuple[SummaryResult | Exception, Mapping[str, Any]]] = []
        for k, text in enumerate(split_answer(answer.text, count)):
            paid = usage if k == 0 else {}
            if isinstance(text, Exception):
                out.append((text, paid))
            else:
                out.append((replace(answer, text=text), paid))
        return out

    def _accepted(
        self,
        asking: _Asking,
        answer: SummaryResult | Exception,
        state: CallState,
        reason: str,
        paid: Mapping[str, Any] | None = None,
    ) -> Effects[_Accepted | None]:
        """One range's answer once it passed every check an answer passes, or None (and a
        `failed` event) when it is not a summary of the range. `paid`: the usage its `failed`
        event carries when the answer came but fails here (a shared request's, on its first
        range)."""
        edit, call = asking.edit, asking.call
        try:
            if isinstance(answer, Exception):
                raise answer
            result = answer
            if not asking.fallback and not asking.shared:
                # A shared request's answer was checked in time once, before it was split.
                self._check_in_time(asking.request)
            call.answered(result)
            text = check_answer(result.text)
        except SummarizerError as exc:
            call.failed(exc.reason)
            yield from self._fail(edit, state, reason, exc.reason, exc.detail, **(paid or {}))
            return None
        except Exception as exc:  # a caller's summarizer may raise anything
            call.failed("error")
            if self.options.strict:
                raise
            # Only the type: a caller's exception text may quote the transcript.
            yield from self._fail(
                edit, state, reason, "error", f"the summarizer raised {type(exc).__name__}"
            )
            return None
        # Of a shared request, only the first range's event carries the call's model and
        # usage: the others' carry none, so the audit counts the call once.
        usage = _usage_of(result) if asking.usage else {}
        if edit.token_budget is not None:
            answer_tokens = self.counter.count(text)
            allowed = edit.token_budget + _budget_margin(edit.token_budget)
            if answer_tokens > allowed and asking.fallback:
                # The fallback is there to keep the bound: its extract is cut to the budget
                # (it estimates tokens from characters) rather than thrown away.
                text = self.counter.clip(text, edit.token_budget).rstrip()
            elif answer_tokens > allowed:
                yield from self._fail(
                    edit,
                    state,
                    reason,
                    "over_budget",
                    f"the summary has {answer_tokens} tokens; the request allowed "
                    f"{edit.token_budget} (and a margin to {allowed})",
                    **usage,
                )
                return None
        subject = Subject(
            edit=edit,
            msgs=asking.summarized,
            text=text,
            prefix=asking.prefix,
            offload=str(asking.offload.handle),
            fallback=asking.fallback,
            request=asking.request,
        )
        return _Accepted(asking, subject, usage)

    def _replacement(
        self,
        snap: Snapshot,
        accepted: _Accepted,
        checked: Checked,
        state: CallState,
        reason: str,
    ) -> Effects[Replacement | None]:
        """The replacement one range's checked summary makes, or None (and a `failed` event)
        when it would not save tokens."""
        asking = accepted.asking
        edit, msgs, offload = asking.edit, asking.msgs, asking.offload
        usage = with_repair_usage(accepted.usage, checked.repair_usage)
        text = checked.text
        prefix = asking.prefix
        body = f"{prefix}\n\n{text}" if prefix else text
        if edit.strategy == registry.LARGE:
            new_msg = summarized_payload(msgs[0], body, offload.handle)
            final = snap.messages[edit.start].final
        else:
            new_msg = Msg.assistant(f"{body}\n{offload_tag(offload.handle)}", kind=edit.new_kind)
            final = edit.new_kind in ("round_summary", "history_summary")
        new = self._prepare(new_msg, final)
        replaced_tokens = edit.replaced_tokens
        if new.tokens >= replaced_tokens:
            yield from self._fail(
                edit,
                state,
                reason,
                "no_gain",
                f"the summary has {new.tokens} tokens, not fewer than the {replaced_tokens} "
                "it would replace",
                **usage,
            )
            return None
        return Replacement(edit, new, offload.uuid, offload.handle, **usage, facts=checked.facts)

    def _check_in_time(self, request: SummaryRequest) -> None:
        """An answer that came after its deadline is never a summary, whichever summarizer
        wrote it (a caller's may not know about deadlines)."""
        if request.deadline is not None and time.monotonic() > request.deadline:
            cfg = self.options
            raise SummarizerError(
                "deadline",
                f"the summarizer answered after the call's deadline (summarizer_deadline_s="
                f"{cfg.summarizer_deadline_s}, compress_deadline_s={cfg.compress_deadline_s})",
            )

    def _recorded(self, state: CallState, events: Sequence[Event]) -> None:
        """Committed events: the call's, and the hooks' and spans' (after the commit, so that
        a hook sees the session as the event left it)."""
        state.events.extend(events)
        for event in events:
            self.observer.recorded(event)

    def _fail(
        self,
        edit: Edit,
        state: CallState,
        reason: str,
        why: str,
        detail: str,
        **usage: Any,
    ) -> Effects[None]:
        state.failed.add(edit.replaced_ids)
        if self.options.strict:
            raise SummarizerError(why, detail)
        # Backing off was said once, when it began: the events say it for every attempt.
        logger.log(
            logging.DEBUG if why == "backoff" else logging.WARNING,
            "autoctx: session %r strategy %d failed (%s): %s",
            self.session_id,
            edit.strategy,
            why,
            detail,
        )
        event = yield from ask(
            RecordEvent(
                strategy=edit.strategy,
                status="failed",
                reason=reason,
                config=self.config.to_json(),
                replaced_ids=edit.replaced_ids,
                error=f"{why}: {detail}",
                **usage,
            )
        )
        self._recorded(state, [event])

    def _prepare(self, msg: Msg, final: bool) -> Prepared:
        return Prepared(msg, count_tokens(msg, self.counter), msg.payload_chars, final)


@dataclass(frozen=True, slots=True)
class _Asking:
    """One range of a batch, asked of the summarizer: what its answer is checked against and
    built into (`Summarizing._replacement`)."""

    edit: Edit
    msgs: list[Msg]
    #: What of `msgs` the summarizer was given (all of them, but for a verbatim prefix).
    summarized: list[Msg]
    offload: NewOffload
    #: Text kept verbatim before the summary (S6's earlier summary, S5's head of a user message).
    prefix: str
    request: SummaryRequest
    call: SummarizerCall
    fallback: bool
    #: The request is shared with other ranges (S5): its answer is split per range.
    shared: bool = False
    #: This range's event carries the call's model and usage (of a shared request, the first
    #: range's only).
    usage: bool = True


@dataclass(frozen=True, slots=True)
class _Accepted:
    """A range's answer that passed the checks, before the fact check (`_replacement`)."""

    asking: _Asking
    subject: Subject
    #: What its event records of the call that wrote it.
    usage: dict[str, Any]


class _Budget:
    """The call's summarizer budget and deadline, as the fact check's repair takes from it."""

    def __init__(self, compressor: Summarizing, state: CallState) -> None:
        self.compressor = compressor
        self.state = state

    def take_call(self) -> float | None:
        state = self.state
        if state.llm_calls >= self.compressor.options.max_llm_calls:
            return None
        if self.compressor._out_of_time(state):
            return None
        state.llm_calls += 1
        return self.compressor._request_deadline(state)

    def in_time(self, request: SummaryRequest) -> None:
        self.compressor._check_in_time(request)


@dataclass(frozen=True, slots=True)
class _Request:
    """One request of a batch: the ranges it asks for (one, or several of S5's messages), with
    their slots in the pass's replacements."""

    slots: tuple[int, ...]
    parts: tuple[_Asking, ...]
    request: SummaryRequest
    call: SummarizerCall


#: Failures that say the summarizer cannot be used at all for now, whatever it is asked.
_UNAVAILABLE: Final = frozenset({"model_not_found", "auth", "backoff"})


def _unavailable(answer: object) -> TypeGuard[SummarizerError]:
    return isinstance(answer, SummarizerError) and answer.reason in _UNAVAILABLE


def _usage_of(result: SummaryResult) -> dict[str, Any]:
    """What an event records of the call that wrote its answer."""
    return {
        "model": result.model,
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "latency_ms": result.latency_ms,
    }


def _budget_margin(budget: int) -> int:
    """How far over its token budget an answer may go and still count as a summary."""
    return max(16, budget // 10)
