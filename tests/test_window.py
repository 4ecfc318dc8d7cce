"""The window policy (autoctx._window), written once for both memories: driven here with plain
answers, no database, no thread. Each test scripts what the memory would answer and checks the
steps the policy asks for (docs/design.md §5)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from autoctx import AutoContextConfig, Event
from autoctx import _window as window
from autoctx._background import BackgroundState
from autoctx._store.rows import SessionInfo

CONFIG = AutoContextConfig(max_tokens=10_000, msg_threshold=1000)
UNDER_TRIGGER = 100
AT_TRIGGER = CONFIG.token_trigger
AT_WINDOW = CONFIG.max_tokens


def _info(tokens: int, *, settled: int | None = None) -> SessionInfo:
    return SessionInfo(
        session_id="s",
        tenant=None,
        version=7,
        message_count=10,
        token_count=tokens,
        model=CONFIG.model,
        encoding="o200k_base",
        config={},
        plan=None,
        settled_version=settled,
    )


EVENTS: list[Event] = []  # what a hand-over returns (its content is the memory's business)


def _drive(policy: window.Policy[Any], answers: list[object]) -> tuple[list[window.Step], Any]:
    """Run `policy`, answering its steps with `answers` in order; the steps and its result."""
    steps: list[window.Step] = []
    script = iter(answers)

    def take(step: window.Step) -> object:
        steps.append(step)
        return next(script)

    result = window.run(policy, take)
    assert next(script, "done") == "done", "the policy asked for fewer steps than scripted"
    return steps, result


NO_CLAIM = window.Compress(over_window=False, claim=False, hand_over=True)
AT_THE_WINDOW = window.Compress(over_window=True, claim=True, hand_over=False)


def test_without_background_a_call_waits_for_a_started_compression_then_compresses_here() -> None:
    handed: list[Event] = []
    steps, result = _drive(
        window.compress_if_needed(False, CONFIG, BackgroundState("s")), [None, handed]
    )
    assert steps == [window.WaitForBackground(), NO_CLAIM]
    assert result is handed, "the call returns the events handed over with its compression"


def test_without_background_a_read_asks_for_nothing() -> None:
    steps, _ = _drive(window.before_read(False, CONFIG, BackgroundState("s")), [])
    assert steps == []


@pytest.mark.parametrize("mode", [True, "worker"])
def test_in_background_mode_a_call_under_the_trigger_starts_nothing_and_waits_for_nothing(
    mode: window.BackgroundMode,
) -> None:
    steps, _ = _drive(
        window.compress_if_needed(mode, CONFIG, BackgroundState("s")),
        [_info(UNDER_TRIGGER), EVENTS],
    )
    assert steps == [window.ReadTotals(), window.TakeEvents()]


def test_at_the_trigger_background_mode_starts_a_compression_and_returns() -> None:
    steps, _ = _drive(
        window.compress_if_needed(True, CONFIG, BackgroundState("s")),
        [_info(AT_TRIGGER), None, EVENTS],
    )
    assert steps == [window.ReadTotals(), window.StartBackground(), window.TakeEvents()]


def test_at_the_mask_trigger_background_mode_starts_masking_alone() -> None:
    """Under the token trigger, at the mask trigger (docs/design.md §3, "early masking"): the
    background compression starts (the memory then checks its floor); without a mask ratio,
    nothing starts."""
    at_mask = CONFIG.mask_trigger
    assert at_mask is not None and UNDER_TRIGGER < at_mask < AT_TRIGGER
    steps, _ = _drive(
        window.compress_if_needed(True, CONFIG, BackgroundState("s")),
        [_info(at_mask), None, EVENTS],
    )
    assert steps == [window.ReadTotals(), window.StartBackground(), window.TakeEvents()]
    no_mask = AutoContextConfig(max_tokens=10_000, msg_threshold=1000, mask_ratio=None)
    steps, _ = _drive(
        window.compress_if_needed(True, no_mask, BackgroundState("s")),
        [_info(at_mask), EVENTS],
    )
    assert steps == [window.ReadTotals(), window.TakeEvents()]


def test_at_the_trigger_worker_mode_leaves_the_compression_to_the_workers() -> None:
    steps, _ = _drive(
        window.compress_if_needed("worker", CONFIG, BackgroundState("s")),
        [_info(AT_TRIGGER), EVENTS],
    )
    assert window.StartBackground() not in steps


def test_a_session_settled_at_its_version_starts_no_compression() -> None:
    steps, _ = _drive(
        window.compress_if_needed(True, CONFIG, BackgroundState("s")),
        [_info(AT_TRIGGER, settled=7), EVENTS],
    )
    assert steps == [window.ReadTotals(), window.TakeEvents()]


def test_a_read_under_the_window_never_starts_a_compression() -> None:
    steps, _ = _drive(window.before_read(True, CONFIG, BackgroundState("s")), [_info(AT_TRIGGER)])
    assert steps == [window.ReadTotals()]


@pytest.mark.parametrize("mode", [True, "worker"])
def test_at_the_window_a_read_waits_only_until_a_commit_brings_it_under(
    mode: window.BackgroundMode,
) -> None:
    background = BackgroundState("s")
    background.steps = 3
    answers: list[object] = [_info(AT_WINDOW), True, _info(AT_WINDOW), None, True]
    answers += [_info(AT_WINDOW - 1)]
    steps, _ = _drive(window.before_read(mode, CONFIG, background), answers)
    assert steps == [
        window.ReadTotals(),
        window.BackgroundRunning(),
        window.ReadTotals(),
        window.WaitForStep(seen=3),
        window.BackgroundRunning(),
        window.ReadTotals(),
    ], "under the window, the read goes on while the compression finishes"


def test_at_the_window_with_nothing_running_the_call_compresses_here_under_the_claim() -> None:
    steps, _ = _drive(
        window.compress_if_needed(True, CONFIG, BackgroundState("s")),
        [_info(AT_WINDOW), False, None, EVENTS],
    )
    assert steps == [
        window.ReadTotals(),
        window.BackgroundRunning(),
        AT_THE_WINDOW,
        window.TakeEvents(),
    ]


def test_a_background_compression_that_ends_over_the_window_is_finished_here() -> None:
    steps, _ = _drive(
        window.before_read(True, CONFIG, BackgroundState("s")),
        [_info(AT_WINDOW + 5), True, _info(AT_WINDOW + 5), None, False, None],
    )
    assert steps[-2:] == [window.BackgroundRunning(), AT_THE_WINDOW]


def test_an_error_of_a_step_reaches_the_caller() -> None:
    def take(step: window.Step) -> object:
        raise RuntimeError("the database went away")

    with pytest.raises(RuntimeError, match="went away"):
        window.run(window.compress_if_needed(True, CONFIG, BackgroundState("s")), take)


#: Scripted answers of the scenarios above, for the async driver.
SCENARIOS: list[tuple[window.BackgroundMode, list[object]]] = [
    (False, [None, EVENTS]),
    (True, [_info(UNDER_TRIGGER), EVENTS]),
    (True, [_info(AT_TRIGGER), None, EVENTS]),
    ("worker", [_info(AT_TRIGGER), EVENTS]),
    (True, [_info(AT_WINDOW), True, _info(AT_WINDOW), None, True, _info(1), EVENTS]),
    (True, [_info(AT_WINDOW), True, _info(AT_WINDOW), None, False, None, EVENTS]),
]


@pytest.mark.parametrize(("mode", "answers"), SCENARIOS)
def test_the_async_driver_asks_for_the_same_steps_as_the_sync_one(
    mode: window.BackgroundMode, answers: list[object]
) -> None:
    sync_steps, sync_result = _drive(
        window.compress_if_needed(mode, CONFIG, BackgroundState("s")), list(answers)
    )
    script = iter(answers)
    async_steps: list[window.Step] = []

    async def take(step: window.Step) -> object:
        async_steps.append(step)
        return next(script)

    async_result = asyncio.run(
        window.arun(window.compress_if_needed(mode, CONFIG, BackgroundState("s")), take)
    )
    assert async_steps == sync_steps
    assert async_result is sync_result is EVENTS
