"""The compression loop (docs/design.md §2): the only place that loops.

check the trigger (session row) -> snapshot -> strategies in order -> summarizer (no lock held)
-> apply (one transaction) -> re-check, until under the target or no progress.

The loop performs no I/O: `Compressor.steps` is a generator that yields effects (read a
snapshot, load originals, summarize a batch, apply replacements, record an event, read the
totals, settle: `autoctx._effects`) and is sent their results. The drivers of
`autoctx._drivers` execute them against the session's store and the summarizers:
`Compressor.run` from the calling thread, `Compressor.arun` with its database steps in a worker
thread and an `AsyncSummarizer` awaited, so that no thread waits on the LLM; both ask the
summarizer for a batch's requests (the independent ranges of one pass, one request each, or
several of S5's messages sharing one: docs/design.md §3) concurrently, at most
`summarizer_concurrency` at once. The ranges of one pass still commit together, in one
transaction (docs/design.md §2): concurrency only changes when their summaries are written.
The offline summarizer that stands in to keep the bound is the memory's, handed in
(`fallback`).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from typing import Any, Final, TypeGuard

from ._answers import check_answer
from ._config import AutoContextConfig, RuntimeOptions
from ._drivers import adrive, drive
from ._effects import (
    FALLBACK_MODEL,
    ApplyReplacements,
    CompressionStore,
    Effects,
    LoadMessages,
    ReadSnapshot,
    ReadTotals,
    ReadUndone,
    RecordEvent,
    SessionTotals,
    Settle,
    Summarize,
    ask,
)
from ._errors import SummarizerError
from ._events import Event
from ._fact_check import Checked, FactChecker, Subject, with_repair_usage
from ._intake import Prepared, count_tokens
from ._messages import Msg
from ._observe import Observer, SummarizerCall
from ._plans import Edit, PlanContext, Snapshot
from ._prompts import (
    build_request,
    build_shared_request,
    clip_for,
    shared_input_bound,
    shares_requests,
)
from ._replacements import NewOffload, Replacement, preview, summarized_payload
from ._shared_requests import group, split_answer
from ._strategies import plan as plan_strategy
from ._strategies import registry
from ._strategies._common import Layouts, layout_of
from ._summary import (
    AsyncSummarizer,
    Summarizer,
    SummaryRequest,
    SummaryResult,
    answers_shared_requests,
)
from ._tags import offload_tag
from ._tokens import TokenCounter
from ._trigger import is_due, trigger_of, under_target

logger = logging.getLogger("autoctx")

# The rules over rungs, read from their records (`registry`, docs/design.md §3): see there
# what each set means and why.
FOLD: Final = registry.FOLD
#: The order of a pass (docs/design.md §3): the fold (7) before S5 and S6.
STRATEGIES = registry.ORDER
#: The strategies that act on what precedes the current round (the others rewrite only what
#: follows the latest user message, the current user message included).
HISTORY_STRATEGIES = registry.HISTORY_STRATEGIES
#: LLM strategies that summarize several ranges one call each, and how many single-call rungs
#: after them (the fold, S6) they leave a call of the budget for.
_RESERVED_AFTER: Final = registry.RESERVED_AFTER
#: Rungs that give way to the fold when the fold has a range and they would need more than
#: the fold's one call to reach the target: the fold takes their ranges into its one summary
#: anyway, so summarizing them one call each first would pay the summarizer several times for
#: what one call does (and, short of the target, for work the same call then folds away).
_YIELD_TO_FOLD: Final = registry.YIELD_TO_FOLD
#: Rungs that give way to the fold when the fold's range holds some of their messages and
#: the others (in the kept rounds, in a finished current round: near the end) would not reach
#: the target alone (compress rarely, and deeply: docs/design.md §2); when those others do,
#: they go ahead alone and the call needs no summarizer. Previews only shave the history: they
#: land just under the target, so the trigger fires again a few steps later, and each one
#: rewrites the agent's context from its place on, which the agent then pays for again in
#: full on its next call (the prompt cache keeps only the unchanged prefix). The fold takes
#: the same messages into one summary and leaves the history at `fold_keep_tokens +
#: fold_budget_tokens`, far under the target. When the fold fails, the previews get their
#: turn in a new pass, so the bound never waits on the summarizer.
_PREVIEWS_YIELD_TO_FOLD: Final = registry.PREVIEWS_YIELD_TO_FOLD
#: Rungs that give way to S6 when S6's range holds every one of their ranges and their edits
#: would leave the tokens over the target: the call then goes on to S6 anyway (it acts while
#: the token trigger fired and tokens are over the target), which takes their summaries into
#: its own; paying for them first buys nothing (S1 here is the long-task case, whose runs lie
#: in the current round).
_YIELD_TO_S6: Final = registry.YIELD_TO_CURRENT_ROUND
#: The rungs the offline fallback may use, in ladder order (docs/design.md §2).
_FALLBACK_STRATEGIES: Final = registry.FALLBACK_STRATEGIES
#: Rungs that save tokens only (previews): they act while tokens are over the target.
_TOKENS_ONLY: Final = registry.TOKENS_ONLY_STRATEGIES
#: Passes whose arrivals `SessionState.arriving` averages: a few, so that it follows a change
#: of the agent's pace, and more than one, so that one large tool output does not set it.
_ARRIVALS_KEPT: Final = 4


@dataclass
class _CallState:
    """Budgets and memory of one `compress_if_needed()` call."""

    #: The plan attached to the session (for the summaries' plan hint), read once per call.
    plan: Mapping[str, Any] | None = None
    #: The token trigger fired this call: S5 and S6 may then act until the target is reached.
    by_tokens: bool = False
    llm_calls: int = 0
    failed: set[tuple[int, ...]] = field(default_factory=set)
    events: list[Event] = field(default_factory=list)
    #: Whether the token floor was waived when S1 to S4 last planned nothing, if only S5 or S6
    #: have applied since (else None). Those two rewrite only what follows the latest user
    #: message and only lower the totals, which can only take candidates away from S1 to S4
    #: (their ranges end below the current round; S2 and S3 need tokens over the target), so
    #: with the same floor the history strategies would find nothing again: the next pass
    #: skips them.
    history_quiet: bool | None = None
    #: (strategy, replaced ids) the offline fallback already tried in this call.
    fell_back: set[tuple[int, tuple[int, ...]]] = field(default_factory=set)
    #: The `time.monotonic()` instant after which no summarizer call starts (and the one in
    #: flight is cut): `compress_deadline_s` from the start of the call.
    deadline: float = float("inf")
    #: The deadline was found passed (said once in the log).
    out_of_time: bool = False
    #: The call runs beside the caller's appends (`Compressor.steps`).
    beside: bool = False
    #: The summarizer said it cannot be used now (a wrong model, a refused key, a back-off):
    #: the call asks it nothing more, and its failure is one event (docs/design.md §6).
    unavailable: bool = False
    #: Tokens expected to come in while one pass summarizes: 0 unless `beside` (see
    #: `SessionState.arriving`).
    arriving: int = 0


@dataclass
class SessionState:
    """What the compressor keeps about one session between calls, owned by its memory (so that
    nothing of it lives in module globals): the latest layout, the incremental base of the
    next one; and whether the over-window warning was logged (once per memory: it would
    otherwise repeat on every call, since each append moves the session to a new version and
    the ladder tries again)."""

    layouts: Layouts = field(default_factory=Layouts)
    warned_over_window: bool = False
    #: Tokens appended beside the latest passes that ran beside the caller (between a pass's
    #: snapshot and its commit), newest last: see `arriving`. A tuple, replaced whole: the
    #: agent's thread reads it while a background compression records.
    arrivals: tuple[int, ...] = ()

    def arriving(self, config: AutoContextConfig) -> int:
        """Tokens a pass that runs beside the caller should expect to come in before it
        commits: the mean of what came in during the latest such passes.

        A pass plans from a snapshot, and the agent goes on appending while the summarizer
        writes; a pass that aims at the target from its snapshot alone commits over it by
        what came in meanwhile, and the loop then chases the target one summarizer call (and,
        for an agent with a prompt cache, one re-billed context) after another. Planned
        against the target less what will come in, the pass picks a rung that lands under the
        target on its own. Capped at half the target: one burst of large appends must not
        turn a compression into a rewrite of the whole context.
        """
        arrivals = self.arrivals
        if not arrivals:
            return 0
        return min(sum(arrivals) // len(arrivals), config.token_target // 2)

    def record_arrivals(self, tokens: int) -> None:
        self.arrivals = (*self.arrivals, tokens)[-_ARRIVALS_KEPT:]


class Compressor:
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

    def run(
        self,
        info: SessionTotals,
        guard: AbstractContextManager[object] | None = None,
        stop: threading.Event | None = None,
        events: list[Event] | None = None,
    ) -> list[Event]:
        """One `compress_if_needed()` call; the summarizer is called from this thread (a
        batch's ranges from a few more, see `summarizer_concurrency`).

        With `guard` (the memory's lock), each database step runs inside it and the
        summarizer outside it, so that the memory's other calls go on while the LLM writes.
        Once `stop` is set, no further step runs: the loop ends at its next step, with the
        answers in flight discarded (nothing of them is written) and the events committed so
        far returned. `events`, when given, receives each event as it is recorded.
        """
        sink: list[Event] = [] if events is None else events
        drive(
            self.steps(info, sink, beside=guard is not None),
            self.store,
            self.summarizer,
            self.fallback,
            concurrency=self.options.summarizer_concurrency,
            guard=guard,
            stop=stop,
        )
        return sink

    async def arun(
        self,
        info: SessionTotals,
        summarizer: AsyncSummarizer,
        guard: AbstractContextManager[object] | None = None,
        stop: threading.Event | None = None,
        events: list[Event] | None = None,
    ) -> list[Event]:
        """`run` for asyncio: each database step runs in a worker thread (inside `guard`, the
        memory's lock, so that no other call of the memory runs beside a step), and the
        summarizer is awaited on the event loop (bounded by the request's deadline), holding
        no thread and no lock. Cancelled, it lets a database step in progress end (it is one
        transaction either way) and writes nothing of the answers in flight."""
        sink: list[Event] = [] if events is None else events
        await adrive(
            self.steps(info, sink, beside=guard is not None),
            self.store,
            summarizer,
            self.fallback,
            concurrency=self.options.summarizer_concurrency,
            guard=guard,
            stop=stop,
        )
        return sink

    def steps(
        self, info: SessionTotals, events: list[Event] | None = None, *, beside: bool = False
    ) -> Effects[list[Event]]:
        """The loop, as a generator of effects (see the module docstring); it returns the
        events of the call (`events`, when given, is the list they go into).

        `beside`: the caller's appends go on between the loop's steps (a background
        compression, a worker); the call then takes the totals as they will be when each of
        its commits lands, with what comes in while it summarizes (`SessionState.arriving`):
        the rungs it allows and the target it plans for (the trigger stays the trigger: a
        compression that started earlier would land no lower, only more often)."""
        cfg = self.config
        trigger = trigger_of(info.message_count, info.token_count, cfg)
        # Settled: an earlier call at this very version could not reach the target, so there
        # is nothing new to try until the session changes.
        if not is_due(info, cfg):
            return [] if events is None else events
        state = _CallState(
            plan=info.plan,
            by_tokens=trigger.by_tokens,
            events=[] if events is None else events,
            deadline=time.monotonic() + self.options.compress_deadline_s,
            beside=beside,
            arriving=self.session.arriving(cfg) if beside else 0,
        )
        for _ in range(self.options.max_passes):
            snap = yield from ask(ReadSnapshot())
            if under_target(snap.message_count, snap.token_count, cfg, state.arriving):
                return state.events
            # What an undo took back is not planned again, by any rung, in any call: the call
            # chooses again rather than redo it (docs/design.md §7). Read after the snapshot,
            # so that an undo the snapshot shows is in it; the fallback, which keeps the
            # bound, is not held to it.
            state.failed.update((yield from ask(ReadUndone())))
            if snap.token_count >= cfg.token_trigger:
                # Appends that came in while the call summarized (the agent goes on beside a
                # background compression) fired the token trigger: the call is now one it fired.
                state.by_tokens = True
            outcome = yield from self._pass(snap, state)
            if outcome == "conflict":
                state.history_quiet = None  # another writer: nothing known about the new state
                continue  # plan again from a new snapshot
            if outcome == "replan":
                continue
            if outcome == "stalled":
                break
        final = yield from ask(ReadTotals())
        if final.token_count >= cfg.message_window:
            # The bound (docs/design.md §2): whatever stopped the ladder (a failing summarizer,
            # a spent budget), the offline summarizer writes what is left to write.
            yield from self._fallback(state)
            final = yield from ask(ReadTotals())
        if not under_target(final.message_count, final.token_count, cfg):
            if final.token_count >= cfg.message_window:
                yield from self._report_over_window(state)  # an event: the version stays
            yield from ask(Settle(final.version))
        return state.events

    # -- one pass -----------------------------------------------------------------------------

    def _allowed(self, strategy: int, snap: Snapshot, state: _CallState) -> bool:
        """Which rungs may act at this pressure (docs/design.md §2).

        S1 and S4 shrink the message count and may always act; previews (S2, S3) only save
        tokens, so they act while tokens are over the target; S5 and S6 only while the token
        trigger itself holds.
        """
        if strategy in _TOKENS_ONLY:
            return snap.token_count + state.arriving >= self.config.token_target
        return True  # S5 and S6 check the token trigger themselves (`PlanContext.token_pressure`)

    def _pass(self, snap: Snapshot, state: _CallState) -> Effects[str]:
        """Try S1..S6 in order and apply the first that finds work.

        Returns "progress" when working tokens fell, "conflict" when the apply lost a race,
        "replan" when the fold failed after cheaper rungs gave way to it, "stalled" otherwise.
        """
        cfg = self.config
        # The totals this pass's commit will land in (`_CallState.arriving`).
        tokens = snap.token_count + state.arriving
        trig = trigger_of(snap.message_count, tokens, cfg)
        reason = (
            trig.reason if trig.fired else ("tokens" if tokens >= cfg.token_target else "count")
        )
        # Once the token trigger fired, every rung may act until the target is reached
        # (compress rarely, and deeply: docs/design.md §2). Without the token trigger, S1, S4
        # and the fold act without their token floor while the message count is over its
        # target (count pressure); a call that goes on for tokens alone keeps the floor, so
        # that it does not summarize every small round one by one.
        ctx = PlanContext(
            token_pressure=state.by_tokens and tokens >= cfg.token_target,
            failed=frozenset(state.failed),
            count_pressure=cfg.msg_target is not None and snap.message_count >= cfg.msg_target,
            layouts=self.session.layouts,
            arriving=state.arriving,
        )
        skip_history = state.history_quiet == ctx.floor_waived
        history_found = False
        # Planned once a pass: S1 and S4 ask for it before it is the fold's turn.
        planned: dict[int, list[Edit]] = {}

        def planned_by(strategy: int) -> list[Edit]:
            if strategy not in planned:
                planned[strategy] = plan_strategy(strategy, snap, cfg, ctx)
            return planned[strategy]

        yielded: set[int] = set()
        for strategy in STRATEGIES:
            if strategy in HISTORY_STRATEGIES and skip_history:
                continue
            if not self._allowed(strategy, snap, state):
                continue
            edits = self._affordable(strategy, planned_by(strategy), state, snap)
            if not edits:
                continue
            if strategy in HISTORY_STRATEGIES:
                history_found = True
            if (
                strategy in _YIELD_TO_FOLD
                and (len(edits) > 1 or not _reaches_target(snap, edits, cfg, state.arriving))
                and planned_by(FOLD)
            ):
                yielded.add(FOLD)
                continue
            if strategy in _PREVIEWS_YIELD_TO_FOLD and planned_by(FOLD):
                kept = _outside(planned_by(FOLD)[0], edits)
                if len(kept) < len(edits):
                    if not kept or not _reaches_target(snap, kept, cfg, state.arriving):
                        yielded.add(FOLD)
                        continue
                    edits = kept  # near the end, and enough: no summarizer call at all
            if (
                strategy in _YIELD_TO_S6
                and not _lands_deep(snap, edits, cfg, state.arriving)
                and _covered_by(planned_by(registry.CURRENT_ROUND), edits)
            ):
                yielded.add(registry.CURRENT_ROUND)
                continue
            attempt = self.observer.begin(strategy, reason, snap.token_count, snap.message_count)
            try:
                replacements = yield from self._build(snap, edits, state, reason)
                if not replacements:
                    if strategy in yielded:
                        # The rung that cheaper ones gave way to failed: they get their turn
                        # in a new pass (the failed range is not planned again in this call).
                        return "replan"
                    continue  # every range failed: the ladder moves on
                outcome = yield from ask(
                    ApplyReplacements(tuple(replacements), reason, cfg.to_json(), snap.version)
                )
                self._recorded(state, outcome.events)
            finally:
                attempt.end()
            if outcome.conflict:
                return "conflict"
            if state.beside and outcome.events and edits[0].llm:
                # Previews commit at once: what arrives while a summarizer writes is measured
                # on the passes that wait for one.
                self._measure_arrivals(snap, outcome.events[0], state)
            state.history_quiet = None if history_found else ctx.floor_waived
            applied = outcome.events
            fell = bool(applied) and applied[-1].tokens_after < applied[0].tokens_before
            return "progress" if fell else "stalled"
        return "stalled"

    def _measure_arrivals(self, snap: Snapshot, first: Event, state: _CallState) -> None:
        """What came in between the pass's snapshot and its commit (the commit's first event
        saw the totals as they were then); the call's later passes plan with it already."""
        self.session.record_arrivals(max(0, first.tokens_before - snap.token_count))
        state.arriving = self.session.arriving(self.config)

    def _affordable(
        self, strategy: int, edits: list[Edit], state: _CallState, snap: Snapshot
    ) -> list[Edit]:
        """The edits the call's LLM budget pays for: S1, S4 and S5 plan every candidate, and
        leave a call for each single-call rung after them (the fold, S6) while they can. A
        request shared by several of S5's messages is one call (`_requests`)."""
        if not edits or not edits[0].llm:
            return edits  # one strategy's edits are all LLM or all previews
        left = self.options.max_llm_calls - state.llm_calls
        if left <= 0 or state.unavailable or self._out_of_time(state):
            return []
        calls = max(1, left - _RESERVED_AFTER.get(strategy, 0))
        taken = sorted(i for request in self._requests(snap, edits)[:calls] for i in request)
        return [edits[i] for i in taken]

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

    def _out_of_time(self, state: _CallState) -> bool:
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

    def _request_deadline(self, state: _CallState) -> float:
        return min(time.monotonic() + self.options.summarizer_deadline_s, state.deadline)

    def _build(
        self,
        snap: Snapshot,
        edits: Sequence[Edit],
        state: _CallState,
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
                    preview(msgs[0], self.config, offload.handle, edit.preview_chars), final
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

    def _ask(
        self,
        ranges: Sequence[tuple[int, Edit, list[Msg], NewOffload]],
        state: _CallState,
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
                token_budget=first.token_budget,
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
            for k, ((_, edit, msgs, offload), (prefix, _)) in enumerate(
                zip(ranges, subjects, strict=True)
            )
        )
        return _Request(tuple(slot for slot, _, _, _ in ranges), parts, request, call)

    def _not_summarized(
        self, request: _Request, answer: SummarizerError, state: _CallState
    ) -> None:
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
        state: _CallState,
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
            msgs=asking.msgs,
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
        state: _CallState,
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

    # -- the bound -----------------------------------------------------------------------------

    def _fallback(self, state: _CallState) -> Effects[None]:
        """Over the window at the end of a call: the fold, S5 and S6 written by the offline
        summarizer (no network, no LLM budget), recorded with reason 'fallback', until the
        context is under the target or they find nothing more (docs/design.md §2)."""
        cfg = self.config
        for _ in range(2 * len(_FALLBACK_STRATEGIES)):
            snap = yield from ask(ReadSnapshot())
            if snap.token_count < cfg.token_target:
                return
            for strategy in _FALLBACK_STRATEGIES:
                # Ranges that failed with the configured summarizer are exactly what is
                # retried. What the fallback itself tried, a rung before in this pass too, is
                # failed for the planners: S6 then takes a latest step that S5 could not
                # shrink (docs/design.md §3, "the latest step stays last").
                ctx = PlanContext(
                    token_pressure=True,
                    failed=frozenset(ids for _, ids in state.fell_back),
                    count_pressure=False,
                    fallback=True,
                    layouts=self.session.layouts,
                )
                edits = plan_strategy(strategy, snap, cfg, ctx)
                edits = [e for e in edits if (e.strategy, e.replaced_ids) not in state.fell_back]
                if not edits:
                    continue
                state.fell_back.update((e.strategy, e.replaced_ids) for e in edits)
                attempt = self.observer.begin(
                    strategy, "fallback", snap.token_count, snap.message_count
                )
                try:
                    replacements = yield from self._build(
                        snap, edits, state, "fallback", fallback=True
                    )
                    if not replacements:
                        continue
                    outcome = yield from ask(
                        ApplyReplacements(
                            tuple(replacements), "fallback", cfg.to_json(), snap.version
                        )
                    )
                    self._recorded(state, outcome.events)
                finally:
                    attempt.end()
                break
            else:
                return

    def _report_over_window(self, state: _CallState) -> Effects[None]:
        """The one exception to the bound: the protected messages alone fill the window.
        Said in a warning and in a `skipped` event of the fold (docs/design.md §2)."""
        cfg = self.config
        snap = yield from ask(ReadSnapshot())
        lay = layout_of(snap, cfg, self.session.layouts)
        protected = sum(
            m.tokens
            for i, m in enumerate(lay.metas)
            if lay.is_protected(i) or lay.touches_pending(i, i + 1)
        )
        detail = (
            f"over_window: {snap.token_count} working tokens, over the window of "
            f"{cfg.message_window}; the protected messages (system, pinned, the current user "
            f"message, a pending tool call) hold {protected} of them and nothing else is left "
            "to compress: shorten or unpin them"
        )
        if not self.session.warned_over_window:
            self.session.warned_over_window = True
            logger.warning(
                "autoctx: session %r is over its window after compressing: %s (logged once per "
                "memory)",
                self.session_id,
                detail,
            )
        event = yield from ask(
            RecordEvent(
                strategy=FOLD,
                status="skipped",
                reason="tokens",
                config=cfg.to_json(),
                error=detail,
            )
        )
        self._recorded(state, [event])

    def _recorded(self, state: _CallState, events: Sequence[Event]) -> None:
        """Committed events: the call's, and the hooks' and spans' (after the commit, so that
        a hook sees the session as the event left it)."""
        state.events.extend(events)
        for event in events:
            self.observer.recorded(event)

    def _fail(
        self,
        edit: Edit,
        state: _CallState,
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
    built into (`Compressor._replacement`)."""

    edit: Edit
    msgs: list[Msg]
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

    def __init__(self, compressor: Compressor, state: _CallState) -> None:
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


def _reaches_target(
    snap: Snapshot, edits: Sequence[Edit], config: AutoContextConfig, arriving: int
) -> bool:
    """Whether applying `edits` would bring the context under its target, estimating each
    summary at a quarter of what it replaces plus its tag, with `arriving` tokens come in
    before the commit."""
    count = snap.message_count - sum(len(e.replaced_ids) - 1 for e in edits)
    return under_target(count, _tokens_after(snap, edits), config, arriving)


def _lands_deep(
    snap: Snapshot, edits: Sequence[Edit], config: AutoContextConfig, arriving: int
) -> bool:
    """Whether applying `edits` would leave at least `fold_keep_tokens` (a quarter of the token
    target) of room under the token target: what a rung must gain to go ahead of S6, whose one
    summary leaves the round at most `fold_budget_tokens` (docs/design.md §3, give-way rules).
    A rung that lands just under the target leaves the next trigger a few steps away, and each
    of its calls rewrites the agent's context from its first changed message on: fewer, deeper
    edits are cheaper than many shallow ones."""
    room = config.token_target - config.fold_keep_tokens
    return _tokens_after(snap, edits) + arriving < room


def _tokens_after(snap: Snapshot, edits: Sequence[Edit]) -> int:
    return snap.token_count - sum(e.estimated_gain for e in edits)


def _outside(outer: Edit, edits: Sequence[Edit]) -> list[Edit]:
    """The edits of `edits` that replace a message `outer` does not."""
    covering = set(outer.replaced_ids)
    return [e for e in edits if not covering.issuperset(e.replaced_ids)]


def _covered_by(outer: Sequence[Edit], edits: Sequence[Edit]) -> bool:
    """Whether the one edit of `outer` (S6's) replaces every message that `edits` replace."""
    return len(outer) == 1 and not _outside(outer[0], edits)
