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
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Final

from ._compression_state import CallState
from ._config import AutoContextConfig
from ._drivers import adrive, drive
from ._effects import (
    ApplyReplacements,
    Effects,
    ReadSnapshot,
    ReadTotals,
    ReadUndone,
    RecordEvent,
    SessionTotals,
    Settle,
    ask,
)
from ._events import Event
from ._plans import Edit, PlanContext, Snapshot
from ._replacements import ApplyOutcome
from ._strategies import plan as plan_strategy
from ._strategies import registry
from ._strategies._common import layout_of
from ._summarizing import Summarizing
from ._summary import AsyncSummarizer
from ._tags import TAG_TOKENS
from ._trigger import MaskFloor, is_due, masking_due, trigger_of, under_target, wanted

logger = logging.getLogger("autoctx")

# The rules over rungs, read from their records (`registry`, docs/design.md §3): see there
# what each set means and why.
FOLD: Final = registry.FOLD
MASKING: Final = registry.MASKING
#: Masking alone, under the trigger, runs when the tokens it saves are at least this share of
#: what follows its first masked output (docs/design.md §3, "early masking"): with a prompt
#: cache, that tail is what the next model call pays in full once, while the saving is paid
#: less at every call after it.
MASK_ALONE_PAYS: Final = 0.5
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


class Compressor(Summarizing):
    """The loop of one session's compressions: which rung acts, on which edits, until the
    target or the bound (docs/design.md §2); what it is built on (`Summarizing`, in
    autoctx._summarizing) turns a pass's edits into replacements."""

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

    def wanted(self, info: SessionTotals) -> bool:
        """Whether a call from these totals has anything to do (`autoctx._trigger.wanted`)."""
        return wanted(info, self.config, self.session.mask_floor)

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
            if masking_due(info, cfg, self.session.mask_floor):
                return (yield from self._mask_alone(info, events))
            return [] if events is None else events
        state = CallState(
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
                self.session.mask_floor = MaskFloor(snap.token_count, snap.message_count)
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
        self.session.mask_floor = MaskFloor(final.token_count, final.message_count)
        if not under_target(final.message_count, final.token_count, cfg):
            if final.token_count >= cfg.message_window:
                yield from self._report_over_window(state)  # an event: the version stays
            yield from ask(Settle(final.version))
        return state.events

    # -- one pass -----------------------------------------------------------------------------

    def _allowed(self, strategy: int, snap: Snapshot, state: CallState) -> bool:
        """Which rungs may act at this pressure (docs/design.md §2).

        S1 and S4 shrink the message count and may always act; previews (S2, S3) only save
        tokens, so they act while tokens are over the target; S5 and S6 only while the token
        trigger itself holds.
        """
        if strategy in _TOKENS_ONLY:
            return snap.token_count + state.arriving >= self.config.token_target
        return True  # S5 and S6 check the token trigger themselves (`PlanContext.token_pressure`)

    def _mask_alone(self, info: SessionTotals, events: list[Event] | None) -> Effects[list[Event]]:
        """Masking alone, under the trigger (docs/design.md §3, "early masking"): every
        candidate in one apply when what it saves pays for the prompt cache it breaks
        (`MASK_ALONE_PAYS`); no LLM, no other rung, no settling."""
        state = CallState(plan=info.plan, events=[] if events is None else events)
        snap = yield from ask(ReadSnapshot())
        state.failed.update((yield from ask(ReadUndone())))
        ctx = PlanContext(
            token_pressure=False,
            failed=frozenset(state.failed),
            count_pressure=False,
            layouts=self.session.layouts,
        )
        edits = plan_strategy(MASKING, snap, self.config, ctx)
        if edits and _masking_pays(snap, edits, self.config):
            yield from self._apply(MASKING, snap, edits, state, "tokens")
        final = yield from ask(ReadTotals())
        self.session.mask_floor = MaskFloor(final.token_count, final.message_count)
        return state.events

    def _pass(self, snap: Snapshot, state: CallState) -> Effects[str]:
        """Try S1..S6 in order and apply the first that finds work.

        Returns "progress" when working tokens fell, "conflict" when the apply lost a race,
        "replan" when the fold failed after cheaper rungs gave way to it, "stalled" otherwise.
        """
        cfg = self.config
        # The totals this pass's commit will land in (`CallState.arriving`).
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
            outcome = yield from self._apply(strategy, snap, edits, state, reason)
            if outcome is None:
                if strategy in yielded:
                    # The rung that cheaper ones gave way to failed: they get their turn in a
                    # new pass (the failed range is not planned again in this call).
                    return "replan"
                continue  # every range failed: the ladder moves on
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

    def _apply(
        self,
        strategy: int,
        snap: Snapshot,
        edits: Sequence[Edit],
        state: CallState,
        reason: str,
        *,
        fallback: bool = False,
    ) -> Effects[ApplyOutcome | None]:
        """Build a rung's replacements of `edits` and apply them in one commit, observed as one
        attempt and recorded; None when every range failed to build (nothing was applied)."""
        attempt = self.observer.begin(strategy, reason, snap.token_count, snap.message_count)
        try:
            replacements = yield from self._build(snap, edits, state, reason, fallback=fallback)
            if not replacements:
                return None
            outcome = yield from ask(
                ApplyReplacements(tuple(replacements), reason, self.config.to_json(), snap.version)
            )
            self._recorded(state, outcome.events)
            return outcome
        finally:
            attempt.end()

    def _measure_arrivals(self, snap: Snapshot, first: Event, state: CallState) -> None:
        """What came in between the pass's snapshot and its commit (the commit's first event
        saw the totals as they were then); the call's later passes plan with it already."""
        self.session.record_arrivals(max(0, first.tokens_before - snap.token_count))
        state.arriving = self.session.arriving(self.config)

    def _affordable(
        self, strategy: int, edits: list[Edit], state: CallState, snap: Snapshot
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

    # -- the bound -----------------------------------------------------------------------------

    def _fallback(self, state: CallState) -> Effects[None]:
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
                outcome = yield from self._apply(
                    strategy, snap, edits, state, "fallback", fallback=True
                )
                if outcome is None:
                    continue
                break
            else:
                return

    def _report_over_window(self, state: CallState) -> Effects[None]:
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


def _masking_pays(snap: Snapshot, edits: Sequence[Edit], config: AutoContextConfig) -> bool:
    """Whether masking `edits` alone saves `MASK_ALONE_PAYS` of what follows the first of them
    (a masked output is estimated at its preview and its facts line, about four characters a
    token, and its tag)."""
    preview = (config.mask_preview_chars + config.mask_fact_chars) // 4 + TAG_TOKENS
    gain = sum(max(0, e.replaced_tokens - preview) for e in edits)
    tail = sum(m.tokens for m in snap.messages[edits[0].start :])
    return gain >= MASK_ALONE_PAYS * tail
