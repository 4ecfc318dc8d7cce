"""No silent overflow (docs/design.md §2 and §8): room for what is not a message
(`reserve_tokens`), a read over the window said once (or raised by a strict memory), and a
re-open with another config that says what it changed."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable

import pytest

from autoctx import (
    AsyncAutoContextMemory,
    AutoContextConfig,
    AutoContextMemory,
    ConfigError,
    ContextOverWindow,
    Msg,
    RuntimeOptions,
)
from autoctx._store.claims import due_sessions
from tests.histories import SMALL, long_task

Open = Callable[..., AutoContextMemory]
CONFIG = dataclasses.replace(SMALL, max_tokens=6000, min_tool_run=10_000)


def _over_window(mem: AutoContextMemory) -> None:
    mem.add(long_task(4, steps=30, big_every=2))
    assert mem.token_count() >= mem.config.max_tokens  # add() never compresses


def _said(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "compress_if_needed()" in r.getMessage()]


# -- a read over the window -------------------------------------------------------------------


def test_a_read_over_the_window_warns_once_naming_compress_if_needed(
    open_memory: Open, caplog: pytest.LogCaptureFixture
) -> None:
    mem = open_memory(config=CONFIG)
    _over_window(mem)
    with caplog.at_level(logging.WARNING, logger="autoctx"):
        sent = mem.to_openai()
        mem.to_anthropic()
        mem.to_openai()
    assert len(sent) == mem.message_count()  # the read still answers
    (warning,) = _said(caplog)
    assert mem.session_id in warning and "6,000" in warning
    assert "long_task" not in warning and "handler_" not in warning  # no content
    caplog.clear()
    mem.compress_if_needed()
    with caplog.at_level(logging.WARNING, logger="autoctx"):
        mem.to_openai()
    assert not _said(caplog)


def test_a_strict_read_over_the_window_raises(open_memory: Open) -> None:
    mem = open_memory(config=CONFIG, options=RuntimeOptions(strict=True))
    _over_window(mem)
    before = (mem.version(), mem.token_count())
    for read in (mem.to_openai, mem.to_anthropic):
        with pytest.raises(ContextOverWindow, match=r"compress_if_needed\(\)") as raised:
            read()
        assert mem.session_id in str(raised.value) and "handler_" not in str(raised.value)
    assert (mem.version(), mem.token_count()) == before  # nothing stored changed
    mem.compress_if_needed()
    assert mem.to_openai()


def test_the_async_reads_check_the_window_too(open_memory: Open) -> None:
    mem = open_memory(config=CONFIG, options=RuntimeOptions(strict=True))
    _over_window(mem)
    amem = AsyncAutoContextMemory(mem)

    async def main() -> None:
        with pytest.raises(ContextOverWindow):
            await amem.to_openai()
        with pytest.raises(ContextOverWindow):
            await amem.to_anthropic()
        await amem.compress_if_needed()
        assert await amem.to_openai()

    asyncio.run(main())


# -- room for what is not a message ------------------------------------------------------------


def test_reserve_tokens_comes_off_the_window_for_every_trigger_and_target() -> None:
    plain = AutoContextConfig(max_tokens=16_000)
    reserved = AutoContextConfig(max_tokens=16_000, reserve_tokens=4_000)
    assert plain.reserve_tokens == 0 and plain.message_window == 16_000
    assert reserved.message_window == 12_000
    assert reserved.token_trigger == int(12_000 * 0.75)
    assert reserved.token_target == int(12_000 * 0.4)
    assert reserved.mask_trigger == int(12_000 * 0.15)
    assert reserved.fold_keep_tokens + reserved.fold_budget_tokens < reserved.token_target
    assert AutoContextConfig.from_json(reserved.to_json()) == reserved
    with pytest.raises(ConfigError, match="reserve_tokens"):
        AutoContextConfig(max_tokens=16_000, reserve_tokens=9_000)
    with pytest.raises(ConfigError, match="reserve_tokens"):
        AutoContextConfig(max_tokens=16_000, reserve_tokens=-1)


def test_the_bound_keeps_the_reserve_free(open_memory: Open) -> None:
    config = dataclasses.replace(CONFIG, reserve_tokens=2_000)
    mem = open_memory(config=config)
    for start in range(0, 120, 6):
        mem.add(long_task(5, steps=60, big_every=2)[start : start + 6])
        mem.compress_if_needed()
        assert mem.token_count() < 4_000, "the working context leaves the reserve free"


def test_a_measured_reserve_is_recorded_and_a_set_one_wins(
    open_memory: Open, session_id: str
) -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": f"tool_{k}",
                "description": "Reads a file of the repository and returns it. " * 8,
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
            },
        }
        for k in range(6)
    ]
    mem = open_memory(config=CONFIG)
    measured = mem.reserve_for(tools, instructions="You are a careful coding agent. " * 20)
    assert 500 < measured < 3_000
    assert mem.config.reserve_tokens == measured
    assert mem.config.token_trigger == int((6000 - measured) * mem.config.token_ratio)
    assert mem.reserve_for(tools, instructions="You are a careful coding agent. " * 20) == measured
    # Recorded with the session: a reopen without config (a worker) keeps it, and so does a
    # reopen with a config that does not set it (until the integration measures again).
    again = open_memory(session_id, config=None)
    assert again.config.reserve_tokens == measured
    assert open_memory(session_id, config=CONFIG).config.reserve_tokens == measured
    # A reserve the caller set is not replaced by a measure.
    fixed = open_memory(
        f"{session_id}-fixed", config=dataclasses.replace(CONFIG, reserve_tokens=100)
    )
    assert fixed.reserve_for(tools) == 100 and fixed.config.reserve_tokens == 100
    with pytest.raises(ConfigError, match="half of max_tokens"):
        mem.reserve_for(tools * 40)


def test_a_worker_finds_a_session_due_by_its_reserved_window(
    open_memory: Open, db_url: str, session_id: str
) -> None:
    config = dataclasses.replace(SMALL, max_tokens=20_000, msg_threshold=10_000)
    plain = open_memory(f"{session_id}-plain", config=config)
    reserved = open_memory(f"{session_id}-reserved", config=config)
    reserved.reserve_for(instructions="word " * 5_000)  # about 5,000 tokens off the window
    for mem in (plain, reserved):
        mem.add(long_task(6, steps=18, big_every=3))
    tokens = plain.token_count()
    assert reserved.config.token_trigger <= tokens < plain.config.token_trigger, tokens
    due = {d.session_id for d in due_sessions(plain.engine, limit=100)}
    assert reserved.session_id in due and plain.session_id not in due


# -- a re-open with another config --------------------------------------------------------------


def test_a_reopen_with_another_config_says_what_changed_and_wins(
    open_memory: Open, session_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    first = AutoContextConfig(max_tokens=16_000, msg_threshold=80)
    open_memory(session_id, config=first).add(Msg.user("hello"))
    with caplog.at_level(logging.WARNING, logger="autoctx"):
        open_memory(session_id, config=first)
        open_memory(session_id, config=None)
    assert not [r for r in caplog.records if "changes the recorded one" in r.getMessage()]
    with caplog.at_level(logging.WARNING, logger="autoctx"):
        mem = open_memory(
            session_id,
            config=AutoContextConfig(max_tokens=64_000, msg_threshold=80, prompts={1: "P"}),
        )
    (warning,) = [
        r.getMessage() for r in caplog.records if "changes the recorded one" in r.getMessage()
    ]
    assert "max_tokens 16000 -> 64000" in warning and "prompts" in warning
    assert "msg_threshold" not in warning and "last_keep" not in warning  # unchanged, derived
    assert "'P'" not in warning  # a prompt is named, never quoted
    assert mem.config.max_tokens == 64_000
    assert open_memory(session_id, config=None).config.max_tokens == 64_000  # the latest wins
