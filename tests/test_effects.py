"""The sans-I/O compressor (docs/design.md §2): the loop yields effects and is sent their
results; the drivers execute them. Driven here by hand and by the sync driver over the
in-memory store (tests/memory_store.py), with no database and no network."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from autoctx import (
    AutoContextConfig,
    Event,
    Msg,
    OfflineSummarizer,
    SummaryRequest,
    SummaryResult,
    ToolUseBlock,
)
from autoctx._compressor import Compressor
from autoctx._drivers import drive
from autoctx._effects import (
    ApplyReplacements,
    LoadMessages,
    ReadSnapshot,
    ReadTotals,
    ReadUndone,
    Summarize,
)
from autoctx._errors import SessionNotFound
from tests.histories import NO_MASKING, SMALL, multi_round
from tests.memory_store import MemorySession, MemoryStore


class Refusing:
    """A summarizer that must not be called."""

    def summarize(self, request: SummaryRequest) -> SummaryResult:
        raise AssertionError("the summarizer was called")


def over_the_trigger() -> MemorySession:
    session = MemorySession(SMALL, OfflineSummarizer())
    session.add(multi_round(3, rounds=5, steps=8, big_every=10_000))
    assert session.store.token_count >= SMALL.token_trigger or (
        session.store.message_count >= SMALL.msg_threshold
    )
    return session


def compressor(session: MemorySession, summarizer: object | None = None) -> Compressor:
    return Compressor(
        session.store,
        session.store.session_id,
        session.config,
        session.counter,
        summarizer if summarizer is not None else session.summarizer,  # type: ignore[arg-type]
        session.state,
        fallback=OfflineSummarizer(),
    )


def test_the_loop_asks_for_each_read_and_write_as_an_effect() -> None:
    """Driven by hand: each effect is a frozen value; the store changes only when an effect
    that writes is executed; every apply is at the version of the snapshot it was planned on;
    the summarizer is asked for batches, and the loop returns the events it was sent."""
    session = over_the_trigger()
    store = session.store
    steps = compressor(session).steps(store.totals())
    seen: list[type] = []
    recorded: list[Event] = []
    latest_snapshot = None
    result: object = None
    with pytest.raises(StopIteration) as done:
        while True:
            effect = steps.send(result)
            seen.append(type(effect))
            for f in dataclasses.fields(effect)[:1]:
                with pytest.raises(dataclasses.FrozenInstanceError):
                    setattr(effect, f.name, None)
            version, events = store.version, len(store.events)
            if isinstance(effect, ReadSnapshot):
                result = latest_snapshot = store.snapshot()
            elif isinstance(effect, LoadMessages):
                result = store.load_messages(effect.ids)
            elif isinstance(effect, Summarize):
                assert not effect.fallback and effect.requests
                result = [session.summarizer.summarize(r) for r in effect.requests]
            elif isinstance(effect, ApplyReplacements):
                assert latest_snapshot is not None
                assert effect.seen_version == latest_snapshot.version
                result = store.apply(
                    effect.replacements,
                    reason=effect.reason,
                    config=effect.config,
                    seen_version=effect.seen_version,
                )
                recorded.extend(result.events)  # type: ignore[attr-defined]
                continue
            elif isinstance(effect, ReadTotals):
                result = store.totals()
            elif isinstance(effect, ReadUndone):
                result = store.undone_ranges()
            else:
                raise AssertionError(f"unexpected effect {effect!r}")
            assert (store.version, len(store.events)) == (version, events)  # a read
    # Each pass reads a snapshot, then what undos took back (not planned again).
    assert seen[:2] == [ReadSnapshot, ReadUndone] and LoadMessages in seen and Summarize in seen
    assert ApplyReplacements in seen
    assert done.value.value == recorded == store.events
    assert store.token_count < SMALL.token_target


def test_a_call_with_nothing_to_do_reads_only_the_totals_it_was_given() -> None:
    session = MemorySession(AutoContextConfig(), Refusing())  # type: ignore[arg-type]
    session.add(multi_round(1, rounds=1, steps=1))
    steps = compressor(session).steps(session.store.totals())
    with pytest.raises(StopIteration) as done:
        next(steps)
    assert done.value.value == []


def test_the_driver_runs_the_loop_to_the_bound() -> None:
    """The sync driver over the in-memory store: under the target at the end, each event
    recorded by the store; with a summarizer that fails every call, the failures are events
    and the offline fallback the memory hands in keeps the bound."""
    session = over_the_trigger()
    events = session.compress()
    assert events and events == session.store.events
    assert session.store.token_count < SMALL.token_target
    # No output is large: no preview can stand in, the summarizer's rungs must act.
    no_previews = dataclasses.replace(SMALL, large_payload_chars=1_000_000)
    failing = MemorySession(no_previews, Refusing())  # type: ignore[arg-type]
    failing.add(multi_round(3, rounds=12, steps=8, big_every=10_000))
    assert failing.store.token_count >= SMALL.max_tokens  # over the window: the bound acts
    events = failing.compress()
    assert [e for e in events if e.status == "failed"]
    assert [e for e in events if e.status == "applied" and e.reason == "fallback"]
    assert failing.store.token_count < SMALL.max_tokens


def test_a_call_that_cannot_reach_its_target_settles_at_its_version() -> None:
    """System messages alone over the window: the call reports it and settles; the next
    call at the same version does nothing (docs/design.md §2)."""
    config = AutoContextConfig(max_tokens=4_000)
    session = MemorySession(config, OfflineSummarizer())
    session.add([Msg.system(f"rules {k}: " + "keep every rule. " * 600) for k in range(3)])
    session.add([Msg.user("go")])
    events = session.compress()
    assert [e for e in events if e.status == "skipped" and (e.error or "").startswith("over_")]
    assert session.store.settled_version == session.store.version
    assert session.compress() == []


def test_a_store_error_is_raised_inside_the_loop_and_out_of_the_driver() -> None:
    """An effect that raises raises at the `yield` that asked for it (so the loop's own
    cleanup runs, as with a direct call), then out of the driver."""
    session = over_the_trigger()
    cleaned: list[bool] = []

    class Gone(MemoryStore):
        def snapshot(self):  # type: ignore[no-untyped-def]
            raise SessionNotFound("session 'x' does not exist any more")

    gone = Gone(session.store.session_id)
    comp = compressor(session)
    inner = comp.steps(session.store.totals())

    def watched():  # type: ignore[no-untyped-def]
        try:
            return (yield from inner)
        except SessionNotFound:
            cleaned.append(True)
            raise

    with pytest.raises(SessionNotFound):
        drive(watched(), gone, Refusing(), OfflineSummarizer(), concurrency=1)  # type: ignore[arg-type]
    assert cleaned == [True]


def test_a_set_stop_runs_no_step() -> None:
    session = over_the_trigger()
    stop = threading.Event()
    stop.set()
    events: list[Event] = []
    assert compressor(session).run(session.store.totals(), stop=stop, events=events) == []
    assert not session.store.events and session.store.version == 1


def test_a_stop_while_the_summarizer_writes_discards_its_answers() -> None:
    """Set while a batch is out: none of its answers is written, and nothing more runs."""
    session = over_the_trigger()
    stop = threading.Event()
    asked: list[SummaryRequest] = []

    class Stopping:
        def summarize(self, request: SummaryRequest) -> SummaryResult:
            asked.append(request)
            stop.set()
            return OfflineSummarizer().summarize(request)

    events = compressor(session, Stopping()).run(session.store.totals(), stop=stop)
    assert asked
    assert events == session.store.events
    assert not [e for e in session.store.events if e.model is not None]


class _NoGainOnLargeMessages:
    """An offline stand-in whose S5 answers are longer than what they summarize (every one a
    `no_gain` failure), and whose other answers are the offline summarizer's."""

    def __init__(self) -> None:
        self.offline = OfflineSummarizer()

    def summarize(self, request: SummaryRequest) -> SummaryResult:
        if request.strategy == 5:
            return SummaryResult(request.transcript * 2, "no-gain")
        return self.offline.summarize(request)


def test_the_fallback_takes_a_latest_step_it_cannot_shrink() -> None:
    """The latest step (many parallel results) fills the target on its own and the summarizer
    is down: the fallback's S5 tries to shrink the step and gains nothing, so the fallback's
    S6 takes the step with the rest (docs/design.md §3, "the latest step stays last"): the
    bound comes first."""
    # No masking: it would shrink the step without a summarizer (the case of
    # test_masking::test_masking_shrinks_a_latest_step_that_does_not_fit).
    config = AutoContextConfig(max_tokens=4_000, large_payload_chars=100_000, **NO_MASKING)
    session = MemorySession(config, Refusing())
    session.add([Msg.system("Work."), Msg.user("Run every check.")])
    calls = [f"c{k}" for k in range(20)]
    words = " ".join(f"check {k} passed with value {k * 7919}" for k in range(90))
    session.add(
        [
            Msg.assistant("", [ToolUseBlock(c, "check", "{}") for c in calls]),
            *[Msg.tool(c, f"{c}: {words}") for c in calls],
        ]
    )
    assert session.store.token_count >= config.max_tokens
    events = Compressor(
        session.store,
        session.store.session_id,
        config,
        session.counter,
        Refusing(),
        session.state,
        fallback=_NoGainOnLargeMessages(),
    ).run(session.store.totals())
    fell_back = [(e.strategy, e.status, e.error or "") for e in events if e.reason == "fallback"]
    assert any(s == 5 and error.startswith("no_gain") for s, _, error in fell_back), fell_back
    assert [s for s, status, _ in fell_back if status == "applied"] == [6]
    assert session.store.token_count < config.max_tokens
